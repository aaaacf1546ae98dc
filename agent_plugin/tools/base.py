"""The tool protocol and what every tool shares: its effect, the context of a call, the text its
output carries back to the model, and :class:`FnTool` (a function of the raw JSON arguments with a
hand-written schema).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Protocol

from pydantic import JsonValue
from pydantic_core import PydanticSerializationError, to_jsonable_python

from agent_plugin.errors import AgentError
from agent_plugin.messages import ToolDefinition

__all__ = [
    "MAX_PROGRESS_MESSAGE",
    "TOOL_MEMBERS",
    "TRUNCATION_MARKER",
    "FnTool",
    "ProgressSink",
    "Tool",
    "ToolContext",
    "ToolEffect",
    "ToolReturn",
    "call_function",
    "canonical_json",
    "check_name",
    "coerce_effect",
    "definition_of",
    "error_payload",
    "is_async_callable",
    "truncate_chars",
]

TRUNCATION_MARKER: Final = "…[truncated]"
"""Appended to a tool output cut at the per-tool output limit."""

MAX_PROGRESS_MESSAGE: Final = 500
"""Characters of a progress message that are kept (the rest is cut with the marker)."""

ProgressSink = Callable[[float, "str | None"], None]
"""Receives a tool call's progress reports: ``(fraction, message)``."""

_NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""Tool names both OpenAI-compatible servers and Anthropic accept."""


# --- effects, context, return values -------------------------------------------------------


class ToolEffect(StrEnum):
    """How much a tool can change the world, ordered least to most impact.

    ``<``, ``<=``, ``>``, ``>=`` compare by impact (``READ_ONLY < INTERNAL < WRITE < EXTERNAL``),
    also against the plain string values; a string that names no effect raises ``ValueError``.
    A tool that says nothing is :attr:`WRITE`: it is trusted with less only when it says so.
    """

    READ_ONLY = "read_only"
    """Reads, never changes anything."""
    INTERNAL = "internal"
    """Changes only the agent's own state (memory, notes, its schedule)."""
    WRITE = "write"
    """Changes the application's data."""
    EXTERNAL = "external"
    """Reaches outside the application: mail, payments, third-party APIs."""

    @property
    def unattended_safe(self) -> bool:
        """Whether a run nobody watches (a heartbeat, a background job) may use it."""
        return self <= ToolEffect.INTERNAL

    def __lt__(self, other: object) -> bool:
        return _RANK[self] < _rank(other)

    def __le__(self, other: object) -> bool:
        return _RANK[self] <= _rank(other)

    def __gt__(self, other: object) -> bool:
        return _RANK[self] > _rank(other)

    def __ge__(self, other: object) -> bool:
        return _RANK[self] >= _rank(other)


_RANK: Final[dict[ToolEffect, int]] = {effect: rank for rank, effect in enumerate(ToolEffect)}


def _rank(other: object) -> int:
    # Never fall back to str's alphabetical order: an unknown string raises ValueError.
    if not isinstance(other, str):
        raise TypeError(f"cannot compare a ToolEffect with {type(other).__name__}")
    return _RANK[ToolEffect(other)]


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool learns about the call it is serving, and how it reports progress.

    ``run_id + call_id`` is a good idempotency key for side effects: a retried background job
    re-runs the loop with the same run id. ``step`` is the 0-based tool round that issued the call.
    """

    run_id: str
    call_id: str
    session_id: str | None = None
    step: int = 0
    progress: ProgressSink | None = field(default=None, repr=False, compare=False)
    """Where :meth:`report_progress` goes (set by the loop; ``None``: nowhere)."""

    @classmethod
    def detached(cls, call_id: str) -> ToolContext:
        """A context for a call made outside any run: run id ``"detached"``, no session, step 0."""
        return cls(run_id="detached", call_id=call_id)

    async def report_progress(self, fraction: float, message: str | None = None) -> None:
        """Say how far the call is: ``fraction`` from 0 to 1 (kept in range), and a short
        message (at most :data:`MAX_PROGRESS_MESSAGE` characters are kept).

        The run's stream gets a ``tool_progress`` event; a background run's record shows it
        too (written at most a few times a second). A call outside a run reports nowhere.
        Raises ``ValueError`` for a ``fraction`` that is not a finite number.
        """
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise ValueError(f"fraction must be a number from 0 to 1, got {fraction!r}")
        if not math.isfinite(fraction):
            raise ValueError(f"fraction must be a finite number from 0 to 1, got {fraction!r}")
        if message is not None and not isinstance(message, str):
            raise ValueError(f"message must be text or None, got {type(message).__name__}")
        if self.progress is not None:
            text = None if message is None else truncate_chars(message, MAX_PROGRESS_MESSAGE)
            self.progress(min(max(float(fraction), 0.0), 1.0), text)


@dataclass(frozen=True, slots=True)
class ToolReturn:
    """A tool's value plus instructions for the loop.

    ``terminate=True`` asks the loop to end the run after this round; it does so only when every
    result of the round asks for it.
    """

    value: Any
    terminate: bool = False


# --- the protocol ---------------------------------------------------------------------------


@typing.runtime_checkable
class Tool(Protocol):
    """Anything the agent can call. A user's own class fits without inheriting.

    The five data members may be plain attributes or read-only properties. :meth:`validate` is
    called before :meth:`execute`; arguments it rejects never reach the tool and the model gets
    an error payload instead. :meth:`execute` returns anything :func:`canonical_json`
    can encode, or a :class:`ToolReturn`, and raises (an :class:`AgentError` of kind ``tool``,
    or any exception) to report a failure; the model then sees the error's message.
    """

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def input_schema(self) -> dict[str, JsonValue]: ...

    @property
    def effect(self) -> ToolEffect: ...

    @property
    def sequential(self) -> bool:
        """True when a round that calls this tool must run its calls one after another."""
        ...

    def validate(self, arguments: JsonValue) -> str | None:
        """None when ``arguments`` are acceptable, otherwise a message for the model."""
        ...

    async def execute(self, arguments: JsonValue, ctx: ToolContext) -> Any: ...


TOOL_MEMBERS: Final = ("name", "description", "input_schema", "effect", "sequential",
                        "validate", "execute")  # fmt: skip


def definition_of(tool: Tool) -> ToolDefinition:
    """What the provider is told about ``tool``."""
    return ToolDefinition(
        name=tool.name, description=tool.description, input_schema=tool.input_schema
    )


# --- output ---------------------------------------------------------------------------------


def canonical_json(value: Any, *, allow_nan: bool = False) -> str:
    """Compact JSON with sorted keys and raw Unicode, the way serde_json prints a value.

    What the :mod:`json` module cannot encode itself goes through pydantic's JSON mode, the way
    FastAPI encodes a response: models and dataclasses become objects (field names, not aliases),
    enums their values, dates and times ISO strings, sets and tuples arrays, bytes UTF-8 text.
    Anything else, and NaN or Infinity unless ``allow_nan`` (then written ``NaN``/``Infinity``,
    as Python's decoder reads them), raises an :class:`AgentError` of kind ``tool``.
    """
    try:
        return _ENCODERS[allow_nan].encode(value)
    except (TypeError, ValueError, RecursionError, PydanticSerializationError) as exc:
        raise AgentError.tool(f"the tool returned a value that is not JSON: {exc}") from None


def _jsonable(value: Any) -> Any:
    return to_jsonable_python(value, by_alias=False)


_ENCODERS: Final = {
    allow_nan: json.JSONEncoder(
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=allow_nan,
        default=_jsonable,
    )
    for allow_nan in (False, True)
}
"""Built once: ``json.dumps`` with options would build an encoder on every call."""


def truncate_chars(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its first ``limit`` and a marker."""
    if len(text) <= limit:
        return text
    return text[: max(limit, 0)] + TRUNCATION_MARKER


def error_payload(message: str) -> str:
    """The tool-result text for a failed call: ``{"error":"<message>"}``."""
    return canonical_json({"error": message})


async def call_function(
    fn: Callable[..., Any], is_async: bool, /, *args: Any, **kwargs: Any
) -> Any:
    """Await an async ``fn``; run a sync one in a worker thread (awaiting what it returns, if
    that is awaitable)."""
    if is_async:
        return await fn(*args, **kwargs)
    result = await asyncio.to_thread(fn, *args, **kwargs)
    return await result if inspect.isawaitable(result) else result


# --- FnTool ---------------------------------------------------------------------------------


class FnTool:
    """A tool from a function of the raw JSON arguments and a hand-written JSON Schema.

    ``fn(arguments)`` or ``fn(arguments, ctx)`` (a second positional parameter receives the
    :class:`ToolContext`), sync or async; a sync ``fn`` runs in a worker thread. ``schema`` is
    JSON Schema Draft 7 (Drafts 4 and 6 work too, selected by ``$schema``; 2019-09 and 2020-12
    are refused); it is checked here and its validator is compiled once. ``input_schema`` is a
    private copy of it: do not mutate it.
    """

    __slots__ = ("_fn", "_is_async", "_validator", "_with_context", "description", "effect",
                 "input_schema", "name", "sequential")  # fmt: skip

    name: str
    description: str
    input_schema: dict[str, JsonValue]
    effect: ToolEffect
    sequential: bool

    def __init__(
        self,
        name: str,
        description: str,
        schema: Mapping[str, Any],
        fn: Callable[..., Any],
        *,
        effect: ToolEffect = ToolEffect.WRITE,
        sequential: bool = False,
    ) -> None:
        label = f"FnTool {name!r}"
        check_name(name, label)
        if not callable(fn):
            raise AgentError.config(f"{label}: fn must be callable, got {type(fn)}")
        self.name = name
        self.description = str(description)
        self.input_schema = _json_schema_copy(schema, label)
        self.effect = coerce_effect(effect, label)
        self.sequential = bool(sequential)
        self._validator = _compile_schema(self.input_schema, label)
        self._fn = fn
        self._with_context = _takes_context(fn, label)
        self._is_async = is_async_callable(fn)

    def validate(self, arguments: JsonValue) -> str | None:
        """``"<json path>: <message>"`` of the most relevant schema violation, or None."""
        return self._validator(arguments)

    async def execute(self, arguments: JsonValue, ctx: ToolContext) -> Any:
        if self._with_context:
            return await call_function(self._fn, self._is_async, arguments, ctx)
        return await call_function(self._fn, self._is_async, arguments)

    def __repr__(self) -> str:
        return f"FnTool(name={self.name!r}, effect={self.effect.value!r})"


def _takes_context(fn: Callable[..., Any], label: str) -> bool:
    """Whether ``fn`` wants the context as a second positional argument."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as exc:
        raise AgentError.config(f"{label}: cannot read fn's signature: {exc}") from None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    required_keyword = any(p.kind is p.KEYWORD_ONLY and p.default is p.empty for p in params)
    if not positional or len(required) > 2 or required_keyword:
        raise AgentError.config(
            f"{label}: fn must take (arguments) or (arguments, ctx) positionally"
        )
    return len(positional) >= 2


_UNSUPPORTED_DIALECTS: Final = ("2019-09", "2020-12")


def _compile_schema(schema: dict[str, JsonValue], label: str) -> Callable[[Any], str | None]:
    """A fast validator (compiled once to Python code) for a tool's JSON Schema: it answers
    ``"<json path>: <message>"`` of the most relevant violation, or None.

    ``use_default=False``: validating never writes defaults into the model's arguments.
    fastjsonschema loads here, with the first :class:`FnTool`, not with the core.
    """
    import fastjsonschema

    dialect = schema.get("$schema")
    if isinstance(dialect, str) and any(d in dialect for d in _UNSUPPORTED_DIALECTS):
        raise AgentError.config(
            f"{label}: JSON Schema dialect {dialect!r} is not supported; write Draft 7 "
            "(drop $schema or set it to 'http://json-schema.org/draft-07/schema#')"
        )
    try:
        compiled = fastjsonschema.compile(schema, use_default=False)
    except (fastjsonschema.JsonSchemaDefinitionException, TypeError, ValueError) as exc:
        raise AgentError.config(f"{label}: invalid JSON Schema: {exc}") from None

    def violation(arguments: Any) -> str | None:
        try:
            compiled(arguments)
        except fastjsonschema.JsonSchemaValueException as error:
            # fastjsonschema names the value "data", "data.xs[1]", ...: print it as a JSON path
            name = error.name or "data"
            rule = error.message.removeprefix(name).strip()
            return f"${name.removeprefix('data')}: {rule}"
        return None

    return violation


# --- small shared checks --------------------------------------------------------------------


def check_name(name: object, label: str) -> None:
    if not isinstance(name, str) or _NAME_PATTERN.fullmatch(name) is None:
        raise AgentError.config(
            f"{label}: a tool name must be 1-64 letters, digits, '_' or '-', got {name!r}"
        )


def coerce_effect(effect: ToolEffect | str, label: str) -> ToolEffect:
    try:
        return ToolEffect(effect)
    except ValueError:
        choices = ", ".join(e.value for e in ToolEffect)
        raise AgentError.config(
            f"{label}: effect must be one of {choices}, got {effect!r}"
        ) from None


def _json_schema_copy(schema: Mapping[str, Any], label: str) -> dict[str, JsonValue]:
    """A private deep copy of ``schema``, which must be a JSON object."""
    if not isinstance(schema, Mapping):
        raise AgentError.config(f"{label}: the schema must be a JSON object, got {type(schema)}")
    try:
        copied: dict[str, JsonValue] = json.loads(json.dumps(schema, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise AgentError.config(f"{label}: the schema is not JSON: {exc}") from None
    return copied


def is_async_callable(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    # an object with an async __call__
    return not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)
