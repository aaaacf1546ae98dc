"""Typed results: what a run must produce, how the model is asked for it, how a reply is checked.

:class:`Output` is built once from ``output_type`` (a pydantic model, dataclass, TypedDict,
primitive, ``list[...]`` or a union of them) and a mode: ``"tool"`` (a final-result tool per
choice), ``"native"`` (a :class:`~agent_plugin.providers.base.ResponseFormat` on the request)
or ``"prompted"`` (the schema in the system prompt). A reply that fails validation goes back to
the model at most ``retries`` times, then the run ends ``output_invalid``. :class:`OutputRun` is
one run's side of this, :class:`OutputStream` turns a streamed reply into partial values; the
story is ``docs/guide/typed-results.md``."""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Generic, Literal, TypeAlias

from pydantic import JsonValue, TypeAdapter, ValidationError
from pydantic_core import from_json, to_json
from typing_extensions import TypeForm, TypeVar

from agent_plugin.errors import AgentError
from agent_plugin.messages import (
    ChatMessage,
    Role,
    TokenUsage,
    ToolCall,
    ToolDefinition,
    ToolResultPart,
)
from agent_plugin.providers.base import ResponseFormat
from agent_plugin.tools import canonical_json, error_payload

__all__ = [
    "ACCEPTED",
    "OUTPUT_MODES",
    "OUTPUT_TOOL",
    "Invalid",
    "ModelRetry",
    "Output",
    "OutputContext",
    "OutputMode",
    "OutputRun",
    "OutputStream",
    "OutputType",
    "OutputValidator",
    "Valid",
    "Verdict",
]

T = TypeVar("T", default=Any)

OutputMode: TypeAlias = Literal["tool", "native", "prompted"]
"""How the model is asked for a typed result (see the module docstring)."""

OUTPUT_MODES: Final[tuple[OutputMode, ...]] = ("tool", "native", "prompted")

OutputType: TypeAlias = type[T] | Sequence[type[T]] | TypeForm[T]
"""What ``output_type=`` takes: a type, a union (``A | B``), or a list of types (``[A, B]``).

A type checker infers the run's output from a single type (``Agent(model, output_type=Ticket)``
is an ``Agent[Ticket]``); for a union, annotate: ``agent: Agent[A | B] = Agent(model,
output_type=A | B)``."""

OUTPUT_TOOL: Final = "final_result"
"""The name of the final-result tool (``final_result_<Type>`` for each choice of a union)."""

ACCEPTED: Final = canonical_json("the final result was accepted")
"""The tool result of a final-result call that validated."""

_NOT_USED: Final = canonical_json("not used: a final result was given already")
_NAME: Final = re.compile(r"[^A-Za-z0-9_-]+")
_MAX_PROBLEMS: Final = 12
_MAX_INPUT: Final = 80
_FENCE: Final = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*(```\s*)?$", re.DOTALL)


class ModelRetry(Exception):
    """Raise from an output validator to reject a value: ``message`` goes back to the model,
    which tries again (within the output's ``retries``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class OutputContext:
    """What an output validator learns about the run whose answer it checks."""

    run_id: str
    session_id: str | None
    steps_used: int
    usage: TokenUsage
    retries: int
    """Output retries used so far in this run."""
    messages: tuple[ChatMessage, ...]
    """The transcript so far (the reply being checked included, the system prompt not)."""


OutputValidator: TypeAlias = Callable[[OutputContext, T], "T | Awaitable[T]"]
"""``validator(ctx, value) -> value``, sync or async: return the value (changed or not), or
raise :class:`ModelRetry` with a message for the model."""


# --- verdicts --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Valid(Generic[T]):
    """The reply gave the output: ``value`` (validated), ``text`` (its JSON; the text itself
    for a ``str``)."""

    value: T
    text: str
    accepted: ClassVar[Literal[True]] = True


@dataclass(frozen=True, slots=True)
class Invalid:
    """The reply did not give a valid output: ``problems`` (for the model, and for the
    ``output_invalid`` outcome); ``final`` when no retry is left."""

    problems: str
    final: bool
    accepted: ClassVar[Literal[False]] = False


Verdict: TypeAlias = Valid[Any] | Invalid


# --- choices ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Choice:
    """One member of an output type: how the model names it and how it is validated."""

    label: str
    tool: str
    adapter: TypeAdapter[Any]
    schema: dict[str, JsonValue]
    """The member's own JSON Schema (``$defs`` inside)."""
    wrapped: bool
    """Not a JSON object: the tool's arguments (and a text reply) are ``{"response": value}``."""
    description: str

    def tool_schema(self) -> dict[str, JsonValue]:
        return _wrapped(self.schema) if self.wrapped else self.schema

    def validate(self, value: JsonValue) -> Any:
        """The member's value from decoded JSON, validated as JSON (dates from strings...)."""
        return self.adapter.validate_json(json.dumps(value))


def _members(output_type: Any, label: str) -> list[Any]:
    """The choices of ``output_type``: a union's or a list's members, in order, without
    duplicates; ``X | None`` stays one choice."""
    if isinstance(output_type, list | tuple):
        if not output_type:
            raise AgentError.config(f"{label}: output_type is an empty list")
        found = [m for item in output_type for m in _members(item, label)]
    else:
        origin = typing.get_origin(output_type)
        if origin is typing.Union or origin is types.UnionType:
            args = typing.get_args(output_type)
            others = [a for a in args if a is not type(None)]
            if len(others) == 1:
                return [output_type]
            found = [m for a in others for m in _members(a, label)]
            if len(others) < len(args):
                found.append(type(None))
        else:
            found = [output_type]
    unique: list[Any] = []
    for member in found:
        if member not in unique:
            unique.append(member)
    return unique


def _label(tp: Any) -> str:
    """A short name for a type: ``Ticket``, ``int``, ``list[Ticket]``, ``None``."""
    if tp is type(None) or tp is None:
        return "None"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return _label(args[0])
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(_label(a) for a in args)
    if origin is typing.Literal:
        return "Literal[" + ", ".join(repr(a) for a in args) + "]"
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_label(a) for a in args)}]" if args else name
    return str(getattr(tp, "__name__", repr(tp)))


def _tool_names(labels: list[str]) -> list[str]:
    if len(labels) == 1:
        return [OUTPUT_TOOL]
    names: list[str] = []
    for label in labels:
        base = f"{OUTPUT_TOOL}_{_NAME.sub('_', label).strip('_') or 'value'}"[:60]
        name, n = base, 2
        while name in names:
            name, n = f"{base}_{n}", n + 1
        names.append(name)
    return names


def _choice(tp: Any, tool: str, label: str, where: str) -> _Choice:
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(tp)
        schema: dict[str, Any] = adapter.json_schema()
    except Exception as exc:  # PydanticSchemaGenerationError, PydanticUserError, TypeError...
        raise AgentError.config(
            f"{where}: {label} cannot be an output type (pydantic cannot validate it or "
            f"describe it in JSON Schema): {exc}"
        ) from None
    doc = schema.pop("description", None)
    schema.pop("title", None)
    description = f"Give the final answer: {doc.strip()}" if isinstance(doc, str) else ""
    return _Choice(
        label=label,
        tool=tool,
        adapter=adapter,
        schema=schema,
        wrapped=schema.get("type") != "object",
        description=description or f"Give the final answer (a {label}); this ends your turn.",
    )


def _wrapped(schema: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """``{"response": <schema>}`` as an object schema, the ``$defs`` moved to its root."""
    inner = dict(schema)
    defs = inner.pop("$defs", None)
    wrapped: dict[str, JsonValue] = {
        "type": "object",
        "properties": {"response": inner},
        "required": ["response"],
        "additionalProperties": False,
    }
    if defs is not None:
        wrapped["$defs"] = defs
    return wrapped


def _strict(schema: JsonValue) -> bool:
    """Whether OpenAI's strict mode takes ``schema`` as it is: every object closed, with every
    property required."""
    if isinstance(schema, list):
        return all(_strict(item) for item in schema)
    if not isinstance(schema, dict):
        return True
    if schema.get("type") == "object" or "properties" in schema:
        properties = schema.get("properties")
        names = set(properties) if isinstance(properties, dict) else set()
        required = schema.get("required")
        if schema.get("additionalProperties") is not False:
            return False
        if not isinstance(required, list) or names != {r for r in required if isinstance(r, str)}:
            return False
    return all(_strict(v) for k, v in schema.items() if k not in ("enum", "const", "default"))


# --- the output ------------------------------------------------------------------------------


class Output(Generic[T]):
    """What a run must produce, and how it is asked for: ``Output(Ticket, mode="native")``.

    ``output_type`` as :data:`OutputType` says; ``mode`` is ``"tool"`` (default),
    ``"native"`` or ``"prompted"``; ``retries`` bounds how often a reply that does not
    validate goes back to the model (default 2); ``validators`` run in order on each value
    that validated (see :data:`OutputValidator`). ``str`` alone is plain text (validators
    still apply); ``str`` in a union lets the model answer in text, in tool mode only.
    Everything is checked here: a type pydantic cannot validate or describe is a ``config``
    :class:`AgentError` now, not at the first run.
    """

    __slots__ = (
        "_envelope",
        "_instructions",
        "_response_format",
        "_tools",
        "choices",
        "label",
        "mode",
        "output_type",
        "retries",
        "text",
        "validators",
    )

    def __init__(
        self,
        output_type: OutputType[T],
        *,
        mode: OutputMode = "tool",
        retries: int = 2,
        validators: Iterable[OutputValidator[T]] = (),
    ) -> None:
        where = "output"
        if mode not in OUTPUT_MODES:
            raise AgentError.config(
                f"{where}: mode must be one of {', '.join(OUTPUT_MODES)}, got {mode!r}"
            )
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise AgentError.config(f"{where}: retries must be 0 or more, got {retries!r}")
        self.output_type = output_type
        self.mode: OutputMode = mode
        self.retries = retries
        self.validators: tuple[OutputValidator[T], ...] = tuple(validators)
        for validator in self.validators:
            if not callable(validator):
                raise AgentError.config(f"{where}: a validator must be callable: {validator!r}")
        members = _members(output_type, where)
        self.text = str in members
        typed = [m for m in members if m is not str]
        self.label = " | ".join(_label(m) for m in members)
        if self.text and typed and mode != "tool":
            raise AgentError.config(
                f"{where}: str in a union (plain text as one choice) works in tool mode only, "
                f"not {mode}"
            )
        labels = [_label(m) for m in typed]
        self.choices = tuple(
            _choice(m, tool, label, where)
            for m, tool, label in zip(typed, _tool_names(labels), labels, strict=True)
        )
        self._tools = tuple(
            ToolDefinition(name=c.tool, description=c.description, input_schema=c.tool_schema())
            for c in self.choices
        )
        self._envelope = self._text_schema(typed) if self.choices else None
        self._response_format = None
        self._instructions = None
        if self._envelope is not None and mode == "native":
            self._response_format = ResponseFormat(
                name=_NAME.sub("_", self.label).strip("_")[:64] or "output",
                schema=self._envelope,
                description=self.choices[0].description if len(self.choices) == 1 else None,
                strict=_strict(self._envelope),
            )
        if self._envelope is not None and mode == "prompted":
            self._instructions = (
                "Give your final answer as one JSON value, with no text or Markdown fence "
                "before or after it, that matches this JSON Schema:\n\n"
                + json.dumps(self._envelope, ensure_ascii=False)
            )

    def __repr__(self) -> str:
        return f"Output({self.label}, mode={self.mode!r}, retries={self.retries})"

    @classmethod
    def of(
        cls,
        output_type: OutputType[T] | Output[T] | None,
        mode: OutputMode | None = None,
        retries: int | None = None,
        validators: Iterable[OutputValidator[T]] = (),
    ) -> Output[T] | None:
        """The output of an agent's ``output_*`` arguments; ``None`` for plain text without
        validators (the loop then has nothing to check)."""
        validators = tuple(validators)
        if isinstance(output_type, Output):
            if mode is not None or retries is not None or validators:
                raise AgentError.config(
                    "output_type is an Output: give its mode, retries and validators there"
                )
            return output_type
        if output_type is None or output_type is str:
            if mode is not None:
                raise AgentError.config(f"output_mode {mode!r} needs an output_type other than str")
            if retries is None and not validators:
                return None
        return cls(
            str if output_type is None else output_type,  # type: ignore[arg-type]
            mode=mode or "tool",
            retries=2 if retries is None else retries,
            validators=validators,
        )

    @property
    def typed(self) -> bool:
        """Whether the run must produce something other than plain text."""
        return bool(self.choices)

    @property
    def tool_definitions(self) -> tuple[ToolDefinition, ...]:
        """The final-result tools offered to the model (tool mode; empty otherwise)."""
        return self._tools if self.mode == "tool" else ()

    @property
    def response_format(self) -> ResponseFormat | None:
        """What a native-mode request asks the server for (``None`` in the other modes)."""
        return self._response_format

    @property
    def instructions(self) -> str | None:
        """The system-prompt section of prompted mode (``None`` in the other modes)."""
        return self._instructions

    def tool_names(self) -> frozenset[str]:
        """The names of the final-result tools offered to the model (tool mode)."""
        return frozenset(definition.name for definition in self.tool_definitions)

    def json_schema(self) -> dict[str, JsonValue] | None:
        """The JSON Schema of the value the run produces, or ``None`` for plain text."""
        if not self.choices:
            return None
        if len(self.choices) == 1:
            return self.choices[0].schema
        return {"anyOf": [c.schema for c in self.choices]}

    def _text_schema(self, typed: list[Any]) -> dict[str, JsonValue]:
        """What a native or prompted reply's JSON must be: the one object type itself,
        ``{"response": value}`` for anything else, ``{"result": {"kind", "data"}}`` for a
        union."""
        if len(self.choices) == 1:
            return self.choices[0].tool_schema()
        union: dict[str, Any] = TypeAdapter(
            typing.Union[tuple(typed)]  # noqa: UP007 - built from values
        ).json_schema()
        schemas = union.get("anyOf") or union.get("oneOf") or [c.schema for c in self.choices]
        variants: list[JsonValue] = [
            {
                "type": "object",
                "properties": {"kind": {"type": "string", "const": c.label}, "data": schema},
                "required": ["kind", "data"],
                "additionalProperties": False,
            }
            for c, schema in zip(self.choices, schemas, strict=False)
        ]
        envelope: dict[str, JsonValue] = {
            "type": "object",
            "properties": {"result": {"anyOf": variants}},
            "required": ["result"],
            "additionalProperties": False,
        }
        if "$defs" in union:
            envelope["$defs"] = union["$defs"]
        return envelope

    # --- reading replies ---------------------------------------------------------------------

    def value_of_call(self, call: ToolCall) -> Any:
        """The value a final-result call gives; raises :class:`_Problem` naming what is wrong."""
        choice = next((c for c in self.choices if c.tool == call.name), None)
        if choice is None:
            raise _Problem(f"- {call.name} is not a final-result tool")
        if call.raw_arguments is not None:
            raise _Problem("- the arguments were not valid JSON")
        arguments = call.arguments
        if choice.wrapped:
            if not isinstance(arguments, dict) or "response" not in arguments:
                raise _Problem('- the arguments must be an object {"response": <the answer>}')
            arguments = arguments["response"]
        return _validated(choice, arguments)

    def value_of_text(self, text: str) -> Any:
        """The value a text reply gives (native and prompted mode, or a terminating tool's
        result); raises :class:`_Problem`."""
        try:
            data: JsonValue = json.loads(_unfenced(text))
        except ValueError as error:
            raise _Problem(f"- the reply is not JSON: {error}") from None
        if len(self.choices) == 1:
            choice = self.choices[0]
            if choice.wrapped:
                if not isinstance(data, dict) or "response" not in data:
                    raise _Problem('- the reply must be a JSON object {"response": <the answer>}')
                data = data["response"]
            return _validated(choice, data)
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, dict) or "kind" not in result or "data" not in result:
            raise _Problem(
                '- the reply must be a JSON object {"result": {"kind": <one of '
                f'{", ".join(c.label for c in self.choices)}>, "data": <the answer>}}}}'
            )
        kind = next((c for c in self.choices if c.label == result["kind"]), None)
        if kind is None:
            raise _Problem(
                f"- kind {result['kind']!r} is none of {', '.join(c.label for c in self.choices)}"
            )
        return _validated(kind, result["data"])

    def value_of_result(self, text: str) -> Any:
        """The value a terminating tool's result gives: its JSON, as any of the choices."""
        try:
            data: JsonValue = json.loads(text)
        except ValueError:
            data = text
        problems: list[str] = []
        for choice in self.choices:
            try:
                return _validated(choice, data)
            except _Problem as problem:
                problems.append(str(problem))
        raise _Problem("\n".join(problems) or "no output type to validate against")

    def as_text(self, value: Any) -> str:
        """The text of an outcome that gave ``value``: the string itself, or its JSON."""
        return value if isinstance(value, str) else to_json(value, by_alias=True).decode()


class _Problem(Exception):
    """A reply that does not give a valid output; the message is for the model."""


def _validated(choice: _Choice, data: JsonValue) -> Any:
    try:
        return choice.validate(data)
    except ValidationError as error:
        raise _Problem(_problems(error)) from None


def _problems(error: ValidationError) -> str:
    """The validation errors, one line each: ``- <where>: <message> (got <input>)``."""
    lines = []
    for item in error.errors(include_url=False)[:_MAX_PROBLEMS]:
        where = ".".join(str(part) for part in item["loc"]) or "the value"
        line = f"- {where}: {item['msg']}"
        if item["type"] not in ("missing", "json_invalid"):
            shown = to_json(item.get("input"), fallback=repr).decode()
            if len(shown) > _MAX_INPUT:
                shown = shown[:_MAX_INPUT] + "…"
            line += f" (got {shown})"
        lines.append(line)
    more = error.error_count() - _MAX_PROBLEMS
    if more > 0:
        lines.append(f"- and {more} more")
    return "\n".join(lines)


def _unfenced(text: str) -> str:
    """The text without a Markdown code fence around it (models add one despite being told)."""
    match = _FENCE.match(text)
    return match.group(1) if match is not None else text


# --- one run's side ----------------------------------------------------------------------------


class OutputRun:
    """One run's (or resume's) side of an :class:`Output`: its retries so far and the verdict
    on each reply. ``retries_used`` continues from the run's state."""

    __slots__ = ("output", "retries_used")

    def __init__(self, output: Output[Any], retries_used: int = 0) -> None:
        self.output = output
        self.retries_used = retries_used

    def owns(self, name: str) -> bool:
        """Whether a call of ``name`` is a final-result call (tool mode)."""
        return self.output.mode == "tool" and any(c.tool == name for c in self.output.choices)

    def only_final(self, calls: Sequence[ToolCall]) -> bool:
        """Whether every one of a reply's calls is a final-result call."""
        return bool(calls) and all(self.owns(call.name) for call in calls)

    async def check_text(self, text: str, ctx: OutputContext) -> Verdict:
        """The verdict on a reply without tool calls."""
        output = self.output
        if not output.typed or output.text:
            return await self._validators(text, ctx)
        if output.mode == "tool":
            names = ", ".join(c.tool for c in output.choices)
            return self._reject(
                f"- plain text does not end the run: give your final answer by calling "
                f"{'one of ' if len(output.choices) > 1 else ''}{names}"
            )
        try:
            value = output.value_of_text(text)
        except _Problem as problem:
            return self._reject(str(problem))
        return await self._validators(value, ctx)

    async def check_calls(
        self, calls: Sequence[ToolCall], ctx: OutputContext
    ) -> tuple[Verdict, dict[str, tuple[str, bool]]]:
        """The verdict on a reply's final-result calls and each call's tool result
        (``content, is_error``): the first call that validates gives the output, later ones
        are not used; if none does, each says what is wrong."""
        answers: dict[str, tuple[str, bool]] = {}
        accepted: Valid[Any] | None = None
        problems: list[str] = []
        for call in calls:
            if accepted is not None:
                answers[call.id] = (_NOT_USED, False)
                continue
            try:
                value = self.output.value_of_call(call)
            except _Problem as problem:
                problems.append(str(problem))
                answers[call.id] = (self._retry_payload(call.name, str(problem)), True)
                continue
            verdict = await self._validators(value, ctx, count=False)
            if isinstance(verdict, Valid):
                accepted = verdict
                answers[call.id] = (ACCEPTED, False)
            else:
                problems.append(verdict.problems)
                answers[call.id] = (self._retry_payload(call.name, verdict.problems), True)
        if accepted is not None:
            return accepted, answers
        return self._reject("\n".join(problems)), answers

    def check_result(self, text: str) -> Verdict:
        """The verdict on the result of a tool that ended the run (no retry: the model did not
        write it)."""
        if not self.output.typed or self.output.text:
            return Valid(text, text)
        try:
            value = self.output.value_of_result(text)
        except _Problem as problem:
            return Invalid(f"a tool ended the run with no valid output:\n{problem}", final=True)
        return Valid(value, self.output.as_text(value))

    def replay_call(self, call: ToolCall) -> Valid[Any] | None:
        """The value of a final-result call accepted before (a run recovered after it), or
        ``None`` when it no longer validates."""
        try:
            value = self.output.value_of_call(call)
        except _Problem:
            return None
        return Valid(value, self.output.as_text(value))

    def accepted(self, messages: Sequence[ChatMessage]) -> Valid[Any] | None:
        """The output a transcript's last round accepted (a run recovered after that round
        was recorded), or ``None``."""
        if len(messages) < 2 or messages[-1].role is not Role.TOOL:
            return None
        ok = {
            p.tool_result.tool_call_id
            for p in messages[-1].content
            if isinstance(p, ToolResultPart) and p.tool_result.content == ACCEPTED
        }
        for call in messages[-2].tool_calls:
            if call.id in ok and self.owns(call.name):
                return self.replay_call(call)
        return None

    def retry_message(self, problems: str, *, repeats: int | None = None) -> ChatMessage:
        """The user message a rejected text reply is answered with (``repeats``: the loop
        guard saw this answer rejected so often)."""
        text = f"Your answer was not accepted:\n{problems}\nFix this and answer again."
        if repeats is not None:
            text += (
                f"\n[harness] You gave this same answer {repeats} times and it was rejected "
                "the same way each time: change it."
            )
        return ChatMessage.user(text)

    def _retry_payload(self, tool: str, problems: str) -> str:
        return error_payload(f"the final result was not accepted:\n{problems}\nFix this and "
                             f"call {tool} again.")  # fmt: skip

    def _reject(self, problems: str) -> Invalid:
        if self.retries_used >= self.output.retries:
            return Invalid(problems, final=True)
        self.retries_used += 1
        return Invalid(problems, final=False)

    async def _validators(self, value: Any, ctx: OutputContext, *, count: bool = True) -> Verdict:
        for validator in self.output.validators:
            try:
                produced = validator(ctx, value)
                value = await produced if inspect.isawaitable(produced) else produced
            except ModelRetry as retry:
                problem = f"- {retry.message}"
                if not count:
                    return Invalid(problem, final=False)
                return self._reject(problem)
        return Valid(value, self.output.as_text(value))


# --- partial values while a reply streams --------------------------------------------------


class _Unset:
    pass


UNSET: Final = _Unset()


class OutputStream:
    """The partial output of one streamed reply: fed the reply's deltas, it answers the value
    parsed so far (not validated) whenever it changes, or :data:`UNSET`."""

    __slots__ = ("_calls", "_last", "_text", "output")

    def __init__(self, output: Output[Any]) -> None:
        self.output = output
        self._calls: dict[int, tuple[_Choice, list[str]]] = {}
        self._text: list[str] = []
        self._last: Any = UNSET

    def call_started(self, index: int, name: str) -> None:
        if self.output.mode != "tool":
            return
        choice = next((c for c in self.output.choices if c.tool == name), None)
        if choice is not None:
            self._calls[index] = (choice, [])

    def call_fragment(self, index: int, fragment: str) -> tuple[str, JsonValue] | _Unset:
        """``(choice label, partial value)`` after a fragment of a final-result call."""
        found = self._calls.get(index)
        if found is None:
            return UNSET
        choice, parts = found
        parts.append(fragment)
        value = _partial("".join(parts))
        if choice.wrapped:
            value = value.get("response", UNSET) if isinstance(value, dict) else UNSET
        return self._changed(choice.label, value)

    def text_fragment(self, text: str) -> tuple[str, JsonValue] | _Unset:
        """``(choice label, partial value)`` after a piece of a native or prompted reply."""
        output = self.output
        if output.mode == "tool" or not output.typed:
            return UNSET
        self._text.append(text)
        value = _partial(_unfenced("".join(self._text)).lstrip().removeprefix("```json"))
        label = output.label
        if len(output.choices) == 1:
            if output.choices[0].wrapped:
                value = value.get("response", UNSET) if isinstance(value, dict) else UNSET
        else:
            result = value.get("result") if isinstance(value, dict) else None
            if not isinstance(result, dict) or "data" not in result:
                return UNSET
            label = str(result.get("kind", label))
            value = result["data"]
        return self._changed(label, value)

    def _changed(self, label: str, value: Any) -> tuple[str, JsonValue] | _Unset:
        if isinstance(value, _Unset) or value == self._last:
            return UNSET
        self._last = value
        return label, value


def _partial(text: str) -> Any:
    try:
        return from_json(text, allow_partial="trailing-strings")
    except ValueError:
        return UNSET
