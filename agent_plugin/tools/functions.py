"""Tools from typed functions: :func:`tool` reads a function's signature and docstring once,
at decoration time, into a name, a description, a JSON Schema and a pydantic model that
validates the arguments of every call.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Final, Generic, Literal, ParamSpec, TypeVar, overload

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, create_model
from pydantic.fields import FieldInfo

from agent_plugin.errors import AgentError
from agent_plugin.tools.base import (
    ToolContext,
    ToolEffect,
    call_function,
    check_name,
    coerce_effect,
    is_async_callable,
)

__all__ = ["FunctionTool", "tool"]

P = ParamSpec("P")
R = TypeVar("R")


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
        check_name(tool_name, label)
        summary, doc_params = _parse_docstring(getattr(fn, "__doc__", None))
        self._model, schema, self._fields, self._context_param = _arguments_model(
            fn, tool_name, doc_params, label
        )
        self._is_async = is_async_callable(fn)
        self.__wrapped__ = fn
        self.__doc__ = getattr(fn, "__doc__", None)
        self.name = tool_name
        self.description = (
            description if description is not None else (summary or f"Tool: {tool_name}")
        )
        self.input_schema = schema
        self.effect = coerce_effect(effect, f"@tool {tool_name!r}")
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
        return await call_function(self.__wrapped__, self._is_async, **kwargs)

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
