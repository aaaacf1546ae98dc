"""Tools: what a model may call, how a call reaches the code, and how its output comes back.

A tool is anything that fits the small :class:`Tool` protocol. Two ready-made kinds cover most
needs:

* :func:`tool` turns a plain (async or sync) function into a tool. Its name, description and
  JSON Schema come from the signature and the docstring; a :class:`ToolContext` parameter is
  injected rather than shown to the model; mistakes in the declaration fail at decoration time.
* :class:`FnTool` wraps a function that takes the raw JSON arguments, with a hand-written schema.

:class:`ToolRegistry` holds a run's tools and hands out their definitions sorted by name, so the
tool block of a prompt is byte-for-byte the same from call to call and provider caches keep
hitting. :func:`canonical_json`, :func:`truncate_chars` and :func:`error_payload` produce the text
a tool result carries back to the model.

Everything expensive (signature inspection, docstring parsing, schema generation and compiling
the validators) happens once, when a tool is built; a call only validates and runs.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import re
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, Final, Generic, Literal, ParamSpec, Protocol, TypeVar, overload

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, create_model
from pydantic.fields import FieldInfo
from pydantic_core import PydanticSerializationError, to_jsonable_python

from agent_plugin.errors import AgentError, PrefixLocked
from agent_plugin.messages import ToolDefinition

__all__ = [
    "MAX_PROGRESS_MESSAGE",
    "TRUNCATION_MARKER",
    "FnTool",
    "FunctionTool",
    "ProgressSink",
    "Tool",
    "ToolContext",
    "ToolEffect",
    "ToolRegistry",
    "ToolReturn",
    "canonical_json",
    "definition_of",
    "error_payload",
    "tool",
    "truncate_chars",
]

P = ParamSpec("P")
R = TypeVar("R")

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


_TOOL_MEMBERS: Final = ("name", "description", "input_schema", "effect", "sequential",
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


async def _call(fn: Callable[..., Any], is_async: bool, /, *args: Any, **kwargs: Any) -> Any:
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
        _check_name(name, label)
        if not callable(fn):
            raise AgentError.config(f"{label}: fn must be callable, got {type(fn)}")
        self.name = name
        self.description = str(description)
        self.input_schema = _json_schema_copy(schema, label)
        self.effect = _coerce_effect(effect, label)
        self.sequential = bool(sequential)
        self._validator = _compile_schema(self.input_schema, label)
        self._fn = fn
        self._with_context = _takes_context(fn, label)
        self._is_async = _is_async_callable(fn)

    def validate(self, arguments: JsonValue) -> str | None:
        """``"<json path>: <message>"`` of the most relevant schema violation, or None."""
        return self._validator(arguments)

    async def execute(self, arguments: JsonValue, ctx: ToolContext) -> Any:
        if self._with_context:
            return await _call(self._fn, self._is_async, arguments, ctx)
        return await _call(self._fn, self._is_async, arguments)

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


# --- @tool ----------------------------------------------------------------------------------


class FunctionTool(Generic[P, R]):
    """A tool made from a typed function by :func:`tool`. Calling it calls the function.

    Arguments are validated by a pydantic model built from the signature. Validation is *lax*
    (pydantic's default): ``"5"`` is accepted for an ``int`` parameter and ``5`` for a ``float``,
    because models sometimes quote numbers and the conversion is unambiguous; anything pydantic
    cannot convert, unknown argument names and arguments that are not a JSON object are rejected.
    ``null`` arguments count as ``{}``. ``input_schema`` is the generated schema: do not mutate
    it. The function is ``__wrapped__``.
    """

    name: str
    description: str
    input_schema: dict[str, JsonValue]
    effect: ToolEffect
    sequential: bool
    __wrapped__: Callable[P, R]

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        name: str | None = None,
        description: str | None = None,
        effect: ToolEffect = ToolEffect.WRITE,
        sequential: bool = False,
    ) -> None:
        if not callable(fn) or isinstance(fn, type):
            hint = " (use @tool(name=...) to name a tool)" if isinstance(fn, str) else ""
            raise AgentError.config(f"@tool needs a function, got {fn!r}{hint}")
        tool_name = name if name is not None else getattr(fn, "__name__", None)
        if tool_name is None:
            raise AgentError.config(f"@tool {fn!r}: the callable has no __name__; pass name=...")
        label = f"@tool {getattr(fn, '__qualname__', None) or tool_name}"
        _check_name(tool_name, label)
        summary, doc_params = _parse_docstring(getattr(fn, "__doc__", None))
        self._model, schema, self._fields, self._context_param = _arguments_model(
            fn, tool_name, doc_params, label
        )
        self._is_async = _is_async_callable(fn)
        self.__wrapped__ = fn
        self.__doc__ = getattr(fn, "__doc__", None)
        self.name = tool_name
        self.description = (
            description if description is not None else (summary or f"Tool: {tool_name}")
        )
        self.input_schema = schema
        self.effect = _coerce_effect(effect, f"@tool {tool_name!r}")
        self.sequential = bool(sequential)

    def validate(self, arguments: JsonValue) -> str | None:
        """Each problem as ``"<json path>: <message>"``, joined by ``"; "``; None when valid."""
        try:
            self._parse(arguments)
        except AgentError as exc:
            return exc.message
        return None

    async def execute(self, arguments: JsonValue, ctx: ToolContext) -> Any:
        kwargs = self._parse(arguments)
        if self._context_param is not None:
            kwargs[self._context_param] = ctx
        return await _call(self.__wrapped__, self._is_async, **kwargs)

    def _parse(self, arguments: JsonValue) -> dict[str, Any]:
        """The keyword arguments for the function, or an AgentError(tool) saying what is wrong."""
        if arguments is None:
            arguments = {}
        elif not isinstance(arguments, dict):
            raise AgentError.tool(
                f"$: the arguments must be a JSON object, got {_json_type(arguments)}"
            )
        try:
            values = self._model.model_validate(arguments).__dict__
        except ValidationError as exc:
            raise AgentError.tool(
                "; ".join(
                    f"{_json_path(error['loc'])}: {error['msg']}"
                    for error in exc.errors(include_url=False, include_input=False)
                )
            ) from None
        return {param: values[field] for field, param in self._fields}

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.__wrapped__(*args, **kwargs)

    def __repr__(self) -> str:
        return f"FunctionTool(name={self.name!r}, effect={self.effect.value!r})"


@overload
def tool(
    fn: Callable[P, R],
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    effect: ToolEffect = ToolEffect.WRITE,
    sequential: bool = False,
) -> FunctionTool[P, R]: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    effect: ToolEffect = ToolEffect.WRITE,
    sequential: bool = False,
) -> Callable[[Callable[P, R]], FunctionTool[P, R]]: ...


def tool(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    effect: ToolEffect = ToolEffect.WRITE,
    sequential: bool = False,
) -> FunctionTool[P, R] | Callable[[Callable[P, R]], FunctionTool[P, R]]:
    """Make a tool from a typed function; use as ``@tool`` or ``@tool(effect=...)``.

    * name: the function's name unless ``name`` is given;
    * description: ``description``, else the docstring without its parameter section (Google
      ``Args:`` or Sphinx ``:param x:``), else ``"Tool: <name>"``;
    * schema: one property per parameter. A parameter's description comes from
      ``Annotated[T, Field(description=...)]``, ``Annotated[T, "text"]`` or the docstring's
      parameter section, in that order; a parameter with a default is optional.
    * A parameter annotated :class:`ToolContext` (any name) receives the call's context and is
      not shown to the model.

    The function may be sync (it then runs in a worker thread) or async; it returns anything
    :func:`canonical_json` can encode, or a :class:`ToolReturn`. ``*args``, ``**kwargs``,
    positional-only or unannotated parameters, a second :class:`ToolContext` and types pydantic
    cannot describe in JSON Schema are refused here, with an :class:`AgentError` of kind
    ``config`` naming the function and the parameter. For a method, decorate the bound method:
    ``tool(obj.method)``.
    """

    def decorate(function: Callable[P, R]) -> FunctionTool[P, R]:
        return FunctionTool(
            function, name=name, description=description, effect=effect, sequential=sequential
        )

    return decorate if fn is None else decorate(fn)


def _arguments_model(
    fn: Callable[..., Any], tool_name: str, doc_params: Mapping[str, str], label: str
) -> tuple[type[BaseModel], dict[str, JsonValue], tuple[tuple[str, str], ...], str | None]:
    """The pydantic model of ``fn``'s arguments, its JSON Schema, its ``(model field, parameter
    name)`` pairs in signature order, and the parameter that receives the :class:`ToolContext`.

    Model fields are named ``p0``, ``p1``, ... with the parameter name as alias, so parameters
    named like pydantic internals (``json``, ``model_config``) or ``_private`` work.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise AgentError.config(f"{label}: cannot read the signature: {exc}") from None
    hints = _type_hints(fn, label)
    model_fields: dict[str, Any] = {}
    fields: list[tuple[str, str]] = []
    context_param: str | None = None
    for index, param in enumerate(signature.parameters.values()):
        where = f"{label}: parameter {param.name!r}"
        if param.kind is param.VAR_POSITIONAL:
            raise AgentError.config(f"{where}: *args is not allowed; name each argument")
        if param.kind is param.VAR_KEYWORD:
            raise AgentError.config(f"{where}: **kwargs is not allowed; name each argument")
        if param.kind is param.POSITIONAL_ONLY:
            raise AgentError.config(f"{where}: positional-only parameters are not allowed")
        if param.annotation is param.empty:
            hint = ""
            if index == 0 and param.name in ("self", "cls"):
                hint = " (is this an unbound method? decorate the bound one: tool(obj.method))"
            raise AgentError.config(f"{where}: a type annotation is required{hint}")
        annotation = hints.get(param.name, param.annotation)
        role = _context_role(annotation)
        if role == "part":
            raise AgentError.config(
                f"{where}: ToolContext can only be the whole type of a parameter"
            )
        if role == "whole":
            if context_param is not None:
                raise AgentError.config(
                    f"{where}: only one ToolContext parameter is allowed "
                    f"({context_param!r} is one already)"
                )
            context_param = param.name
            continue
        if isinstance(param.default, FieldInfo):  # x: int = Field(5, description=...)
            annotation = Annotated[annotation, param.default]
            param = param.replace(default=param.empty)
        field_key = f"p{len(fields)}"
        model_fields[field_key] = (annotation, _field_for(param, annotation, doc_params, where))
        fields.append((field_key, param.name))

    def build(
        name: str, config: ConfigDict | None, **definitions: Any
    ) -> tuple[type[BaseModel], dict[str, Any]]:
        model: type[BaseModel] = create_model(name, __config__=config, **definitions)
        return model, model.model_json_schema()  # some types validate but have no JSON Schema

    try:
        model, raw_schema = build(
            f"{tool_name}_arguments", ConfigDict(extra="forbid"), **model_fields
        )
    except Exception as exc:  # PydanticSchemaGenerationError, PydanticUserError, TypeError, ...
        where = label
        for field_key, param_name in fields:  # find the parameter to blame
            try:
                build("probe", None, **{field_key: model_fields[field_key]})
            except Exception:
                where = f"{label}: parameter {param_name!r}"
                break
        raise AgentError.config(
            f"{where}: unsupported type (pydantic cannot validate it or describe it in JSON "
            f"Schema): {exc}"
        ) from None
    return model, _object_schema(raw_schema), tuple(fields), context_param


def _type_hints(fn: Callable[..., Any], label: str) -> dict[str, Any]:
    target: Any = fn
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)):
        target = type(fn).__call__  # a callable object: its __call__'s hints
    try:
        return typing.get_type_hints(target, include_extras=True)
    except Exception as exc:  # NameError for unresolvable strings, TypeError for odd objects
        raise AgentError.config(f"{label}: cannot resolve the type annotations: {exc}") from None


def _field_for(
    param: inspect.Parameter, annotation: Any, doc_params: Mapping[str, str], where: str
) -> FieldInfo:
    """The pydantic field for ``param``: its alias, default and description.

    A ``Field``'s own description wins (pydantic merges it), then the first string in
    ``Annotated``, then the docstring's text.
    """
    metadata = annotation.__metadata__ if typing.get_origin(annotation) is Annotated else ()
    fields = [meta for meta in metadata if isinstance(meta, FieldInfo)]
    if any(f.alias or f.validation_alias or f.serialization_alias for f in fields):
        raise AgentError.config(
            f"{where}: Field aliases are not supported; the parameter name is used"
        )
    kwargs: dict[str, Any] = {"alias": param.name}
    if all(f.description is None for f in fields):
        texts = [meta for meta in metadata if isinstance(meta, str)]
        description = texts[0] if texts else doc_params.get(param.name)
        if description is not None:
            kwargs["description"] = description
    if param.default is not param.empty:
        kwargs["default"] = param.default
    field: FieldInfo = Field(**kwargs)
    return field


def _context_role(annotation: Any) -> Literal["whole", "part"] | None:
    """Where :class:`ToolContext` is in a parameter's type: the ``"whole"`` of it (also inside
    ``Annotated`` or ``| None``), a ``"part"`` of it (which is refused), or nowhere (None)."""
    if annotation is ToolContext:
        return "whole"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return _context_role(args[0])
    members = [arg for arg in args if arg is not type(None)]
    if origin in (typing.Union, types.UnionType) and len(members) == 1:  # Optional[X]
        return _context_role(members[0])
    return "part" if any(_context_role(arg) for arg in args) else None


def _object_schema(raw: dict[str, Any]) -> dict[str, JsonValue]:
    """The model's schema without titles, in a fixed key order, always with ``required``."""
    stripped = _strip_titles(raw)
    schema: dict[str, JsonValue] = {
        "type": "object",
        "properties": stripped.get("properties", {}),
        "required": stripped.get("required", []),
        "additionalProperties": False,
    }
    if "$defs" in stripped:
        schema["$defs"] = stripped["$defs"]
    return schema


_SCHEMA_MAPS: Final = frozenset({"properties", "$defs", "definitions", "patternProperties",
                                 "dependentSchemas"})  # fmt: skip
_DATA_KEYWORDS: Final = frozenset({"default", "const", "enum", "examples"})


def _strip_titles(schema: Any) -> Any:
    """Drop the ``title`` keywords pydantic adds, leaving properties named ``title`` alone."""
    if isinstance(schema, list):
        return [_strip_titles(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _DATA_KEYWORDS:
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _strip_titles(sub) for name, sub in value.items()}
        else:
            out[key] = _strip_titles(value)
    return out


# --- docstrings -----------------------------------------------------------------------------

_ARGS_HEADERS: Final = frozenset({"args:", "arguments:", "parameters:", "params:",
                                  "keyword args:", "keyword arguments:"})  # fmt: skip
_GOOGLE_ENTRY: Final = re.compile(r"\*{0,2}(?P<name>\w+)\s*(?:\([^)]*\))?\s*:\s*(?P<text>.*)")
_SPHINX_FIELD: Final = re.compile(
    r":(?P<kind>param|type)\s+(?:[^:]*\s)?(?P<name>\w+)\s*:(?P<text>.*)"
)


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into its description and its per-parameter texts.

    Understands a Google parameter section (``Args:`` and its indented ``name (type): text``
    entries) and Sphinx fields (``:param name: text``, ``:type name: ...``); both are left out
    of the description, and so are their deeper-indented continuation lines. Other sections
    (``Returns:``, ...) stay in the description.
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    kept: list[str] = []
    texts: dict[str, list[str]] = {}  # parameter name -> its lines
    i = 0
    while i < len(lines):
        line, i = lines[i], i + 1
        field = _SPHINX_FIELD.fullmatch(line.strip())
        if field is None and line.strip().lower() not in _ARGS_HEADERS:
            kept.append(line.rstrip())
            continue
        # the block under the header or field: blank lines and lines indented deeper than it
        start = i
        while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > _indent(line)):
            i += 1
        block = [text for text in lines[start:i] if text.strip()]
        if field is not None:
            if field["kind"] == "param":
                texts[field["name"]] = [field["text"], *block]
            continue
        entry_indent = min((_indent(text) for text in block), default=0)
        name: str | None = None
        for text in block:
            entry = _GOOGLE_ENTRY.fullmatch(text.strip()) if _indent(text) == entry_indent else None
            if entry is not None:
                name = entry["name"]
                texts[name] = [entry["text"]]
            elif name is not None:
                texts[name].append(text)
    description = re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip()
    params = {
        name: " ".join(t.strip() for t in parts if t.strip()) for name, parts in texts.items()
    }
    return description, params


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


# --- the registry ---------------------------------------------------------------------------


class ToolRegistry:
    """The tools of a run, by name.

    :meth:`definitions` is sorted by name and cached until the next change, so calling it every
    step costs nothing and the prompt's tool block stays identical between calls. A
    :meth:`lock` ed registry refuses changes (:class:`~agent_plugin.errors.PrefixLocked`).
    """

    __slots__ = ("_definitions", "_locked", "_tools")

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._definitions: tuple[ToolDefinition, ...] | None = None
        self._locked = False
        for item in tools:
            self.add(item)

    @property
    def locked(self) -> bool:
        return self._locked

    def lock(self) -> None:
        """Refuse every change from now on (the definitions are made now, once)."""
        self.definitions()
        self._locked = True

    def unlock(self) -> None:
        self._locked = False

    def _check_unlocked(self, change: str) -> None:
        if self._locked:
            raise PrefixLocked(change)

    def add(self, tool: Tool) -> None:
        """Register ``tool``; a second tool with the same name is an error."""
        self._check_unlocked("adding a tool")
        name = _checked_tool(tool).name
        if name in self._tools:
            raise AgentError.config(f"a tool named {name!r} is already registered")
        self._tools[name] = tool
        self._definitions = None

    def remove(self, name: str) -> Tool:
        """Unregister and return the tool called ``name``; it must exist."""
        self._check_unlocked("removing a tool")
        try:
            removed = self._tools.pop(name)
        except KeyError:
            raise AgentError.config(f"no tool named {name!r} is registered") from None
        self._definitions = None
        return removed

    def replace(self, tool: Tool) -> Tool:
        """Swap in ``tool`` for the registered tool of the same name; return the old one."""
        self._check_unlocked("replacing a tool")
        name = _checked_tool(tool).name
        old = self._tools.get(name)
        if old is None:
            raise AgentError.config(f"no tool named {name!r} is registered to replace")
        self._tools[name] = tool
        self._definitions = None
        return old

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._tools)

    def definitions(self) -> tuple[ToolDefinition, ...]:
        """The tool definitions sorted by name: the same tuple until the next change.

        A tuple of frozen definitions, so a hook that edits ``request.tools`` cannot change it.
        """
        if self._definitions is None:
            self._definitions = tuple(definition_of(tool) for tool in self)
        return self._definitions

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        """The tools, sorted by name."""
        return iter([self._tools[name] for name in sorted(self._tools)])

    def __repr__(self) -> str:
        return f"ToolRegistry({self.names()!r})"


# --- small shared checks --------------------------------------------------------------------


def _checked_tool(value: object) -> Tool:
    if not isinstance(value, Tool):
        missing = [member for member in _TOOL_MEMBERS if not hasattr(value, member)]
        raise AgentError.config(f"{value!r} is not a Tool: missing {', '.join(missing)}")
    _check_name(value.name, f"tool {value.name!r}")
    return value


def _check_name(name: object, label: str) -> None:
    if not isinstance(name, str) or _NAME_PATTERN.fullmatch(name) is None:
        raise AgentError.config(
            f"{label}: a tool name must be 1-64 letters, digits, '_' or '-', got {name!r}"
        )


def _coerce_effect(effect: ToolEffect | str, label: str) -> ToolEffect:
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


def _is_async_callable(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    # an object with an async __call__
    return not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)


def _json_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a JSON path, the way jsonschema prints one."""
    path = "$"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__
