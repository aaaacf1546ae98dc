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
a tool result carries back to the model [AP-23, AP-24].

Everything expensive (signature inspection, docstring parsing, schema generation and compiling
the validators) happens once, when a tool is built; a call only validates and runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Final, Generic, ParamSpec, Protocol, TypeVar, overload

import fastjsonschema
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, create_model
from pydantic.fields import FieldInfo
from pydantic_core import PydanticSerializationError, to_jsonable_python

from agent_plugin.errors import AgentError
from agent_plugin.messages import ToolDefinition

__all__ = [
    "TRUNCATION_MARKER",
    "FnTool",
    "FunctionTool",
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
"""Appended to a tool output cut at the per-tool output limit [AP-24]."""

_NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""Tool names both OpenAI-compatible servers and Anthropic accept."""


# --- effects, context, return values -------------------------------------------------------


class ToolEffect(StrEnum):
    """How much a tool can change the world, ordered least to most impact [AP-17].

    ``<``, ``<=``, ``>``, ``>=`` compare by impact (``READ_ONLY < INTERNAL < WRITE < EXTERNAL``),
    also against the plain string values. A tool that says nothing is :attr:`WRITE`: it is
    trusted with less only when it says so.
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
    def rank(self) -> int:
        """The position in the impact order, 0 for :attr:`READ_ONLY`."""
        return _RANK[self]

    @property
    def unattended_safe(self) -> bool:
        """Whether a run nobody watches (a heartbeat, a background job) may use it."""
        return _RANK[self] <= _RANK[ToolEffect.INTERNAL]

    def __lt__(self, other: object) -> bool:
        rank = _rank_of(other)
        return NotImplemented if rank is None else _RANK[self] < rank

    def __le__(self, other: object) -> bool:
        rank = _rank_of(other)
        return NotImplemented if rank is None else _RANK[self] <= rank

    def __gt__(self, other: object) -> bool:
        rank = _rank_of(other)
        return NotImplemented if rank is None else _RANK[self] > rank

    def __ge__(self, other: object) -> bool:
        rank = _rank_of(other)
        return NotImplemented if rank is None else _RANK[self] >= rank


_RANK: Final[dict[str, int]] = {effect.value: rank for rank, effect in enumerate(ToolEffect)}


def _rank_of(value: object) -> int | None:
    # ToolEffect members hash and compare like their string values, so WRITE and "write" both
    # find the same entry.
    return _RANK.get(value) if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool learns about the call it is serving.

    ``run_id + call_id`` is a good idempotency key for side effects: a retried background job
    re-runs the loop with the same run id. ``step`` is the 0-based tool round that issued the call.
    """

    run_id: str
    call_id: str
    session_id: str | None = None
    step: int = 0

    @classmethod
    def detached(cls, call_id: str) -> ToolContext:
        """A context for a call made outside any run: run id ``"detached"``, no session, step 0."""
        return cls(run_id="detached", call_id=call_id)


@dataclass(frozen=True, slots=True)
class ToolReturn:
    """A tool's value plus instructions for the loop.

    ``terminate=True`` asks the loop to end the run after this round; it does so only when every
    result of the round asks for it [OP-08].
    """

    value: Any
    terminate: bool = False


# --- the protocol ---------------------------------------------------------------------------


@typing.runtime_checkable
class Tool(Protocol):
    """Anything the agent can call. A user's own class fits without inheriting.

    :meth:`validate` is called before :meth:`execute`; arguments it rejects never reach the tool
    and the model gets an error payload instead [OP-04]. :meth:`execute` returns a JSON-able
    value or a :class:`ToolReturn`, and raises (an :class:`AgentError` of kind ``tool``, or any
    exception) to report a failure; the model then sees the error's message.
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


def definition_of(tool: Tool) -> ToolDefinition:
    """What the provider is told about ``tool``."""
    return ToolDefinition(
        name=tool.name, description=tool.description, input_schema=tool.input_schema
    )


# --- output ---------------------------------------------------------------------------------


def canonical_json(value: Any) -> str:
    """Compact JSON with sorted keys and raw Unicode, the way serde_json prints a value.

    pydantic models and dataclasses inside ``value`` are dumped in JSON mode; anything else that
    is not JSON (a set, an arbitrary object, NaN) raises an :class:`AgentError` of kind ``tool``.
    """
    try:
        return _CANONICAL.encode(value)
    except (TypeError, ValueError, RecursionError, PydanticSerializationError) as exc:
        raise AgentError.tool(f"the tool returned a value that is not JSON: {exc}") from None


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable_python(value, by_alias=False)
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_CANONICAL: Final = json.JSONEncoder(
    sort_keys=True,
    separators=(",", ":"),
    ensure_ascii=False,
    allow_nan=False,
    default=_json_default,
)
"""Built once: ``json.dumps`` with options would build an encoder on every call."""


def truncate_chars(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its first ``limit`` and a marker."""
    if len(text) <= limit:
        return text
    return text[: max(limit, 0)] + TRUNCATION_MARKER


def error_payload(message: str) -> str:
    """The tool-result text for a failed call: ``{"error":"<message>"}`` [AP-23]."""
    return canonical_json({"error": message})


def _to_json_value(value: Any) -> Any:
    """Make a tool's return value plain JSON data, the way FastAPI encodes a response.

    Strings, numbers, booleans and None pass through untouched. A pydantic model becomes
    ``model_dump(mode="json")``; containers and dataclasses are converted by pydantic's JSON-mode
    encoder, so models, enums, datetimes and tuples inside them become JSON too. A value pydantic
    cannot encode raises an :class:`AgentError` of kind ``tool``.
    """
    if value is None or isinstance(value, str | int | float):
        return value
    if isinstance(value, ToolReturn):
        inner = _to_json_value(value.value)
        return value if inner is value.value else ToolReturn(inner, value.terminate)
    try:
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json")
        return to_jsonable_python(value, by_alias=False)
    except PydanticSerializationError as exc:
        raise AgentError.tool(f"the tool returned a value that is not JSON: {exc}") from None


# --- FnTool ---------------------------------------------------------------------------------


class FnTool:
    """A tool from a function of the raw JSON arguments and a hand-written JSON Schema.

    ``fn(arguments)`` or ``fn(arguments, ctx)`` (a second positional parameter receives the
    :class:`ToolContext`), sync or async; a sync ``fn`` runs in a worker thread. ``schema`` is
    checked against JSON Schema Draft 2020-12 here, and its validator is compiled once.
    """

    __slots__ = ("_description", "_effect", "_fn", "_is_async", "_name", "_schema", "_sequential",
                 "_validator", "_with_context")  # fmt: skip

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
        _check_name(name, f"FnTool {name!r}")
        if not callable(fn):
            raise AgentError.config(f"FnTool {name!r}: fn must be callable, got {type(fn)}")
        self._name = name
        self._description = str(description)
        self._schema = _json_schema_copy(schema, f"FnTool {name!r}")
        self._validator = _compile_schema(self._schema, name)
        self._fn = fn
        self._with_context = _takes_context(fn, name)
        self._is_async = _is_async_callable(fn)
        self._effect = _coerce_effect(effect, f"FnTool {name!r}")
        self._sequential = bool(sequential)

    @property
    def name(self) -> str:
        return self._name

    @property
    def description(self) -> str:
        return self._description

    @property
    def input_schema(self) -> dict[str, JsonValue]:
        """The schema as given (a private copy). Do not mutate it."""
        return self._schema

    @property
    def effect(self) -> ToolEffect:
        return self._effect

    @property
    def sequential(self) -> bool:
        return self._sequential

    def validate(self, arguments: JsonValue) -> str | None:
        """``"<json path>: <message>"`` of the most relevant schema violation, or None."""
        try:
            self._validator(arguments)
        except fastjsonschema.JsonSchemaValueException as error:
            # fastjsonschema names the value "data", "data.xs[1]", ...: print it as a JSON path
            name = error.name or "data"
            rule = error.message.removeprefix(name).strip()
            return f"${name.removeprefix('data')}: {rule}"
        return None

    async def execute(self, arguments: JsonValue, ctx: ToolContext) -> Any:
        args: tuple[Any, ...] = (arguments, ctx) if self._with_context else (arguments,)
        if self._is_async:
            result = await self._fn(*args)
        else:
            result = await asyncio.to_thread(self._fn, *args)
            if inspect.isawaitable(result):
                result = await result
        return _to_json_value(result)

    def __repr__(self) -> str:
        return f"FnTool(name={self._name!r}, effect={self._effect.value!r})"


def _takes_context(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` wants the context as a second positional argument."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as exc:
        raise AgentError.config(f"FnTool {name!r}: cannot read fn's signature: {exc}") from None
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    required_keyword = [
        p.name
        for p in params
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
    ]
    required = [p for p in positional if p.default is inspect.Parameter.empty]
    if not positional or len(required) > 2 or required_keyword:
        raise AgentError.config(
            f"FnTool {name!r}: fn must take (arguments) or (arguments, ctx) positionally"
        )
    return len(positional) >= 2


# --- @tool ----------------------------------------------------------------------------------


class FunctionTool(Generic[P, R]):
    """A tool made from a typed function by :func:`tool`. Calling it calls the function.

    Arguments are validated by a pydantic model built from the signature. Validation is *lax*
    (pydantic's default): ``"5"`` is accepted for an ``int`` parameter and ``5`` for a ``float``,
    because models sometimes quote numbers and the conversion is unambiguous; anything pydantic
    cannot convert, unknown argument names and arguments that are not a JSON object are rejected.
    ``null`` arguments count as ``{}``.
    """

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
        spec = _FunctionSpec.build(fn, name=name, description=description)
        self.__wrapped__ = fn
        self.__doc__ = getattr(fn, "__doc__", None)
        self._fn = fn
        self._spec = spec
        self._effect = _coerce_effect(effect, f"@tool {spec.name!r}")
        self._sequential = bool(sequential)

    @property
    def name(self) -> str:
        return self._spec.name

    @property
    def description(self) -> str:
        return self._spec.description

    @property
    def input_schema(self) -> dict[str, JsonValue]:
        """The generated schema. Do not mutate it."""
        return self._spec.schema

    @property
    def effect(self) -> ToolEffect:
        return self._effect

    @property
    def sequential(self) -> bool:
        return self._sequential

    @property
    def fn(self) -> Callable[P, R]:
        """The decorated function."""
        return self._fn

    def validate(self, arguments: JsonValue) -> str | None:
        """Each problem as ``"<json path>: <message>"``, joined by ``"; "``; None when valid."""
        try:
            self._spec.parse(arguments)
        except AgentError as exc:
            return exc.message
        return None

    async def execute(self, arguments: JsonValue, ctx: ToolContext) -> Any:
        spec = self._spec
        kwargs = spec.parse(arguments)
        if spec.context_param is not None:
            kwargs[spec.context_param] = ctx
        fn: Callable[..., Any] = self._fn
        if spec.is_async:
            result = await fn(**kwargs)
        else:
            result = await asyncio.to_thread(fn, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        return _to_json_value(result)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"FunctionTool(name={self._spec.name!r}, effect={self._effect.value!r})"


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
    * description: ``description``, else the docstring without its parameter section
      (Google ``Args:``, NumPy ``Parameters`` or Sphinx ``:param x:``), else ``"Tool: <name>"``;
    * schema: one property per parameter. A parameter's description comes from
      ``Annotated[T, Field(description=...)]``, ``Annotated[T, "text"]`` or the docstring's
      parameter section, in that order; a parameter with a default is optional.
    * A parameter annotated :class:`ToolContext` (any name) receives the call's context and is
      not shown to the model.

    The function may be sync (it then runs in a worker thread) or async. ``*args``, ``**kwargs``,
    positional-only or unannotated parameters, a second :class:`ToolContext` and types pydantic
    cannot describe in JSON Schema are refused here, with an :class:`AgentError` of kind
    ``config`` naming the function and the parameter. For a method, decorate the bound method:
    ``tool(obj.method)``.
    """

    def decorate(function: Callable[P, R]) -> FunctionTool[P, R]:
        return FunctionTool(
            function, name=name, description=description, effect=effect, sequential=sequential
        )

    if fn is None:
        return decorate
    return decorate(fn)


@dataclass(frozen=True, slots=True)
class _FunctionSpec:
    """Everything about a decorated function that is worked out once, at decoration time."""

    name: str
    description: str
    schema: dict[str, JsonValue]
    model: type[BaseModel]
    fields: tuple[tuple[str, str], ...]  # (model field, parameter name), in signature order
    context_param: str | None
    is_async: bool

    def parse(self, arguments: JsonValue) -> dict[str, Any]:
        """The keyword arguments for the function, or an AgentError(tool) saying what is wrong."""
        if arguments is None:
            arguments = {}
        elif not isinstance(arguments, dict):
            raise AgentError.tool(
                f"$: the arguments must be a JSON object, got {_json_type(arguments)}"
            )
        try:
            values = self.model.model_validate(arguments).__dict__
        except ValidationError as exc:
            raise AgentError.tool(
                "; ".join(
                    f"{_json_path(error['loc'])}: {error['msg']}"
                    for error in exc.errors(include_url=False, include_input=False)
                )
            ) from None
        return {param: values[field] for field, param in self.fields}

    @classmethod
    def build(
        cls, fn: Callable[..., Any], *, name: str | None, description: str | None
    ) -> _FunctionSpec:
        if not callable(fn) or isinstance(fn, type):
            hint = " (use @tool(name=...) to name a tool)" if isinstance(fn, str) else ""
            raise AgentError.config(f"@tool needs a function, got {fn!r}{hint}")
        fn_label = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
        tool_name = name if name is not None else getattr(fn, "__name__", None)
        if tool_name is None:
            raise AgentError.config(f"@tool {fn!r}: the callable has no __name__; pass name=...")
        label = f"@tool {fn_label or tool_name}"
        _check_name(tool_name, label)

        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError) as exc:
            raise AgentError.config(f"{label}: cannot read the signature: {exc}") from None
        hints = _type_hints(fn, label)
        summary, doc_params = _parse_docstring(getattr(fn, "__doc__", None))

        model_fields: dict[str, Any] = {}
        fields: list[tuple[str, str]] = []
        context_param: str | None = None
        for param in signature.parameters.values():
            where = f"{label}: parameter {param.name!r}"
            if param.kind is inspect.Parameter.VAR_POSITIONAL:
                raise AgentError.config(f"{where}: *args is not allowed; name each argument")
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                raise AgentError.config(f"{where}: **kwargs is not allowed; name each argument")
            if param.kind is inspect.Parameter.POSITIONAL_ONLY:
                raise AgentError.config(f"{where}: positional-only parameters are not allowed")
            if param.annotation is inspect.Parameter.empty:
                raise AgentError.config(f"{where}: a type annotation is required")
            annotation = hints.get(param.name, param.annotation)
            if _is_context(annotation):
                if context_param is not None:
                    raise AgentError.config(
                        f"{where}: only one ToolContext parameter is allowed "
                        f"({context_param!r} is one already)"
                    )
                context_param = param.name
                continue
            if _mentions_context(annotation):
                raise AgentError.config(
                    f"{where}: ToolContext can only be the whole type of a parameter"
                )
            if isinstance(param.default, FieldInfo):  # x: int = Field(5, description=...)
                annotation = _with_metadata(annotation, param.default)
                param = param.replace(default=inspect.Parameter.empty)
            field_key = f"p{len(fields)}"
            model_fields[field_key] = (
                annotation,
                _field_for(param, annotation, doc_params.get(param.name), where),
            )
            fields.append((field_key, param.name))

        model = _arguments_model(tool_name, model_fields, fields, label)
        try:
            raw_schema = model.model_json_schema()
        except Exception as exc:  # pydantic raises several types for undescribable types
            culprit = _find_bad_parameter(fields, model_fields)
            where = f"{label}: parameter {culprit!r}" if culprit else label
            raise AgentError.config(f"{where}: no JSON Schema for this type: {exc}") from None
        return cls(
            name=tool_name,
            description=description
            if description is not None
            else (summary or f"Tool: {tool_name}"),
            schema=_object_schema(raw_schema),
            model=model,
            fields=tuple(fields),
            context_param=context_param,
            is_async=_is_async_callable(fn),
        )


def _type_hints(fn: Callable[..., Any], label: str) -> dict[str, Any]:
    target: Any = fn
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)):
        target = type(fn).__call__  # a callable object: its __call__'s hints
    try:
        return typing.get_type_hints(target, include_extras=True)
    except Exception as exc:  # NameError for unresolvable strings, TypeError for odd objects
        raise AgentError.config(f"{label}: cannot resolve the type annotations: {exc}") from None


def _field_for(
    param: inspect.Parameter, annotation: Any, doc_description: str | None, where: str
) -> FieldInfo:
    """The pydantic field for ``param``: its alias, default and description."""
    string_description: str | None = None
    has_field_description = False
    if typing.get_origin(annotation) is Annotated:
        for meta in annotation.__metadata__:
            if isinstance(meta, str) and string_description is None:
                string_description = meta
            elif isinstance(meta, FieldInfo):
                if meta.description is not None:
                    has_field_description = True
                if meta.alias or meta.validation_alias or meta.serialization_alias:
                    raise AgentError.config(
                        f"{where}: Field aliases are not supported; the parameter name is used"
                    )
    kwargs: dict[str, Any] = {"alias": param.name}
    if not has_field_description:
        text = string_description if string_description is not None else doc_description
        if text is not None:
            kwargs["description"] = text
    if param.default is not inspect.Parameter.empty:
        kwargs["default"] = param.default
    field: FieldInfo = Field(**kwargs)
    return field


def _with_metadata(annotation: Any, field: FieldInfo) -> Any:
    """``Annotated[annotation, field]``, built at run time."""
    return Annotated.__class_getitem__((annotation, field))  # type: ignore[attr-defined]


def _arguments_model(
    tool_name: str,
    model_fields: dict[str, Any],
    fields: list[tuple[str, str]],
    label: str,
) -> type[BaseModel]:
    try:
        model: type[BaseModel] = create_model(
            f"{tool_name}_arguments",
            __config__=ConfigDict(extra="forbid"),
            **model_fields,
        )
    except Exception as exc:  # PydanticSchemaGenerationError, PydanticUserError, TypeError
        culprit = _find_bad_parameter(fields, model_fields)
        where = f"{label}: parameter {culprit!r}" if culprit else label
        raise AgentError.config(f"{where}: unsupported type: {exc}") from None
    return model


def _find_bad_parameter(fields: list[tuple[str, str]], model_fields: dict[str, Any]) -> str | None:
    """The first parameter that pydantic cannot validate or describe on its own."""
    for field_key, param_name in fields:
        try:
            create_model("probe", **{field_key: model_fields[field_key]}).model_json_schema()
        except Exception:  # any failure marks the culprit
            return param_name
    return None


def _is_context(annotation: Any) -> bool:
    """``ToolContext``, possibly inside ``Annotated`` or ``| None``."""
    if annotation is ToolContext:
        return True
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _is_context(annotation.__origin__)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return len(members) == 1 and _is_context(members[0])
    return False


def _mentions_context(annotation: Any) -> bool:
    if annotation is ToolContext:
        return True
    if typing.get_origin(annotation) is Annotated:
        return _mentions_context(annotation.__origin__)
    return any(_mentions_context(arg) for arg in typing.get_args(annotation))


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

_GOOGLE_HEADERS: Final = frozenset({"args:", "arguments:", "parameters:", "params:",
                                    "keyword args:", "keyword arguments:"})  # fmt: skip
_NUMPY_HEADERS: Final = frozenset({"parameters", "other parameters"})
_GOOGLE_ENTRY: Final = re.compile(r"\*{0,2}(?P<name>\w+)\s*(?:\([^)]*\))?\s*:\s*(?P<text>.*)")
_NUMPY_ENTRY: Final = re.compile(r"(?P<name>\w+)\s*(?::.*)?")
_SPHINX_PARAM: Final = re.compile(r":param\s+(?:[^:]*\s)?(?P<name>\w+)\s*:\s*(?P<text>.*)")


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into its description and its per-parameter texts.

    Understands Google (``Args:``), NumPy (``Parameters`` over a dashed rule) and Sphinx
    (``:param name: text``) parameter sections; the section is left out of the description.
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    params: dict[str, str] = {}
    kept: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if stripped.lower() in _GOOGLE_HEADERS:
            i = _google_section(lines, i + 1, indent, params)
        elif stripped.lower() in _NUMPY_HEADERS and i + 1 < len(lines) and _is_rule(lines[i + 1]):
            i = _numpy_section(lines, i + 2, indent, params)
        elif stripped.startswith((":param ", ":type ")):
            i = _sphinx_field(lines, i, indent, params)
        else:
            kept.append(line.rstrip())
            i += 1
    return _join_paragraphs(kept), params


def _google_section(lines: list[str], start: int, header_indent: int, out: dict[str, str]) -> int:
    entry_indent: int | None = None
    current_name: str | None = None
    current: list[str] = []
    i = start
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        indent = len(line) - len(line.lstrip())
        if indent <= header_indent:
            break
        if entry_indent is None:
            entry_indent = indent
        match = _GOOGLE_ENTRY.fullmatch(line.strip()) if indent <= entry_indent else None
        if match:
            current_name, current = match["name"], [match["text"].strip()]
            _store(out, current_name, current)
        elif current_name is not None:
            current.append(line.strip())
            _store(out, current_name, current)
        i += 1
    return i


def _numpy_section(lines: list[str], start: int, header_indent: int, out: dict[str, str]) -> int:
    name: str | None = None
    text: list[str] = []
    i = start
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if i + 1 < len(lines) and stripped and _is_rule(lines[i + 1]):
            break  # the next section's header
        if not stripped:
            i += 1
            continue
        if indent <= header_indent:
            match = _NUMPY_ENTRY.fullmatch(stripped)
            if match is None:
                break
            name, text = match["name"], []
            _store(out, name, text)
        elif name is not None:
            text.append(stripped)
            _store(out, name, text)
        i += 1
    return i


def _sphinx_field(lines: list[str], start: int, indent: int, out: dict[str, str]) -> int:
    match = _SPHINX_PARAM.fullmatch(lines[start].strip())
    text = [match["text"].strip()] if match else []
    i = start + 1
    while i < len(lines):
        line = lines[i]
        if not line.strip() or len(line) - len(line.lstrip()) <= indent:
            break
        text.append(line.strip())
        i += 1
    if match:
        _store(out, match["name"], text)
    return i


def _store(out: dict[str, str], name: str, text: list[str]) -> None:
    out[name] = " ".join(part for part in text if part)


def _is_rule(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and set(stripped) == {"-"}


def _join_paragraphs(lines: list[str]) -> str:
    """Join lines, with at most one blank line in a row and none at either end."""
    out: list[str] = []
    for line in lines:
        if not line and (not out or not out[-1]):
            continue
        out.append(line)
    return "\n".join(out).strip()


# --- the registry ---------------------------------------------------------------------------


class ToolRegistry:
    """The tools of a run, by name.

    :meth:`definitions` is sorted by name and cached until the next change, so calling it every
    step costs nothing and the prompt's tool block stays identical between calls [AG-02, AG-16].
    """

    __slots__ = ("_definitions", "_sorted", "_tools")

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._sorted: list[Tool] | None = None
        self._definitions: list[ToolDefinition] | None = None
        for item in tools:
            self.add(item)

    def add(self, tool: Tool) -> None:
        """Register ``tool``; a second tool with the same name is an error."""
        name = _checked_tool(tool).name
        if name in self._tools:
            raise AgentError.config(f"a tool named {name!r} is already registered")
        self._tools[name] = tool
        self._changed()

    def remove(self, name: str) -> Tool:
        """Unregister and return the tool called ``name``; it must exist."""
        try:
            removed = self._tools.pop(name)
        except KeyError:
            raise AgentError.config(f"no tool named {name!r} is registered") from None
        self._changed()
        return removed

    def replace(self, tool: Tool) -> Tool:
        """Swap in ``tool`` for the registered tool of the same name; return the old one."""
        name = _checked_tool(tool).name
        old = self._tools.get(name)
        if old is None:
            raise AgentError.config(f"no tool named {name!r} is registered to replace")
        self._tools[name] = tool
        self._changed()
        return old

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._tools)

    def definitions(self) -> list[ToolDefinition]:
        """The tool definitions sorted by name: the same list object until the next change.

        Treat it as read-only; it is shared between callers.
        """
        if self._definitions is None:
            self._definitions = [definition_of(t) for t in self._sorted_tools()]
        return self._definitions

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._sorted_tools())

    def __repr__(self) -> str:
        return f"ToolRegistry({self.names()!r})"

    def _sorted_tools(self) -> list[Tool]:
        if self._sorted is None:
            self._sorted = [self._tools[name] for name in sorted(self._tools)]
        return self._sorted

    def _changed(self) -> None:
        self._sorted = None
        self._definitions = None


# --- small shared checks --------------------------------------------------------------------


def _checked_tool(value: object) -> Tool:
    if not isinstance(value, Tool):
        raise AgentError.config(f"{value!r} is not a Tool")
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


def _compile_schema(schema: Mapping[str, Any], name: str) -> Callable[[Any], Any]:
    """A fast validator (compiled once to Python code) for a tool's JSON Schema.

    ``use_default=False``: validating never writes defaults into the model's arguments.
    """
    try:
        return fastjsonschema.compile(dict(schema), use_default=False)
    except (fastjsonschema.JsonSchemaDefinitionException, TypeError, ValueError) as exc:
        raise AgentError.config(f"FnTool {name!r}: invalid JSON Schema: {exc}") from None


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
