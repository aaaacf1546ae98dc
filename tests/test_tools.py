"""Tools: effects, contexts, FnTool, the @tool decorator, the registry and tool output text."""

import asyncio
import dataclasses
import datetime
import enum
import inspect
import json
import threading
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal, Optional

import fastjsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, Field, JsonValue, ValidationError

from agent_plugin.agent import Agent
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.hooks import AgentHooks
from agent_plugin.messages import ToolDefinition
from agent_plugin.outcomes import Completed, RunInfo
from agent_plugin.providers.base import ChatRequest
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.tools import (
    TRUNCATION_MARKER,
    FnTool,
    FunctionTool,
    Tool,
    ToolContext,
    ToolEffect,
    ToolRegistry,
    ToolReturn,
    canonical_json,
    definition_of,
    error_payload,
    tool,
    truncate_chars,
)
from agent_plugin.tools import base as tools_base
from agent_plugin.tools import functions as tools_functions

CTX = ToolContext(run_id="job-42", call_id="c1", session_id="s-1", step=3)
OBJECT_OF_NOTHING = {
    "type": "object",
    "properties": {},
    "required": [],
    "additionalProperties": False,
}


def config_error(excinfo: pytest.ExceptionInfo[AgentError]) -> str:
    assert excinfo.value.kind is ErrorKind.CONFIG
    return excinfo.value.message


# --- effects and contexts ---------------------------------------------------------------------


def test_effects_are_ordered_by_impact_not_by_spelling() -> None:
    assert ToolEffect.READ_ONLY < ToolEffect.INTERNAL < ToolEffect.WRITE < ToolEffect.EXTERNAL
    assert ToolEffect.EXTERNAL > ToolEffect.WRITE >= ToolEffect.WRITE > ToolEffect.INTERNAL
    assert ToolEffect.INTERNAL <= ToolEffect.INTERNAL
    assert not ToolEffect.WRITE < ToolEffect.INTERNAL  # "internal" < "write" as strings, too
    assert not ToolEffect.INTERNAL < ToolEffect.READ_ONLY  # but "internal" < "read_only" is
    shuffled = [ToolEffect.EXTERNAL, ToolEffect.READ_ONLY, ToolEffect.WRITE, ToolEffect.INTERNAL]
    assert sorted(shuffled) == list(ToolEffect)
    assert (
        max(ToolEffect.INTERNAL, ToolEffect.EXTERNAL, ToolEffect.READ_ONLY) is ToolEffect.EXTERNAL
    )


def test_effects_compare_with_their_string_values_and_serialise_snake_case() -> None:
    assert ToolEffect.READ_ONLY < "internal"
    assert ToolEffect.EXTERNAL > "write"
    assert [e.value for e in ToolEffect] == ["read_only", "internal", "write", "external"]
    assert "write" < ToolEffect.EXTERNAL  # noqa: SIM300 - the reflected operator
    assert ToolEffect("read_only") is ToolEffect.READ_ONLY
    with pytest.raises(TypeError):
        _ = ToolEffect.WRITE < 3
    with pytest.raises(TypeError):
        _ = 3 > ToolEffect.WRITE  # noqa: SIM300 - the reflected operator


@pytest.mark.parametrize(
    "compare",
    [
        lambda: ToolEffect.WRITE < "zzz",  # "write" < "zzz" alphabetically
        lambda: ToolEffect.WRITE >= "",
        lambda: "zzz" > ToolEffect.WRITE,  # noqa: SIM300 - the reflected operator
        lambda: "READ_ONLY" <= ToolEffect.WRITE,  # noqa: SIM300 - the reflected operator
    ],
)
def test_effects_refuse_strings_that_are_not_effects(compare: Callable[[], bool]) -> None:
    with pytest.raises(ValueError, match="is not a valid ToolEffect"):
        compare()


def test_only_read_only_and_internal_are_safe_unattended() -> None:
    assert [e.unattended_safe for e in ToolEffect] == [True, True, False, False]


def test_effect_defaults_to_write() -> None:
    @tool
    def ping() -> str:
        return "pong"

    assert FnTool("f", "d", {}, lambda args: args).effect is ToolEffect.WRITE
    assert ping.effect is ToolEffect.WRITE
    assert ping.sequential is False
    assert tool(effect=ToolEffect.READ_ONLY)(ping.__wrapped__).effect is ToolEffect.READ_ONLY


def test_detached_context() -> None:
    ctx = ToolContext.detached("call-9")
    assert ctx == ToolContext(run_id="detached", call_id="call-9", session_id=None, step=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.step = 1  # type: ignore[misc]


def test_tools_fit_the_protocol_and_define_themselves() -> None:
    @tool
    def ping() -> str:
        """Answer pong."""
        return "pong"

    fn_tool = FnTool("echo", "Echo it.", {"type": "object"}, lambda args: args)
    assert isinstance(ping, Tool)
    assert isinstance(fn_tool, Tool)
    assert definition_of(fn_tool) == ToolDefinition(
        name="echo", description="Echo it.", input_schema={"type": "object"}
    )
    assert definition_of(ping) == ToolDefinition(
        name="ping", description="Answer pong.", input_schema=OBJECT_OF_NOTHING
    )


# --- FnTool ----------------------------------------------------------------------------------

ADD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


async def test_fn_tool_runs_a_sync_function_in_another_thread() -> None:
    seen: dict[str, Any] = {}

    def add(args: Any) -> int:
        seen["thread"] = threading.get_ident()
        return int(args["a"]) + int(args["b"])

    add_tool = FnTool("add", "Add.", ADD_SCHEMA, add)
    assert await add_tool.execute({"a": 2, "b": 3}, CTX) == 5
    assert seen["thread"] != threading.get_ident()


async def test_fn_tool_passes_the_context_to_a_two_parameter_async_function() -> None:
    async def whoami(args: JsonValue, ctx: ToolContext) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"run": ctx.run_id, "call": ctx.call_id, "session": ctx.session_id, "step": ctx.step}

    result = await FnTool("whoami", "Who.", {}, whoami).execute({}, CTX)
    assert result == {"run": "job-42", "call": "c1", "session": "s-1", "step": 3}


async def test_fn_tool_with_a_sync_context_function_and_a_tool_return() -> None:
    def stop(args: Any, ctx: ToolContext) -> ToolReturn:
        return ToolReturn({"done": ctx.call_id}, terminate=True)

    result = await FnTool("stop", "Stop.", {}, stop).execute({}, CTX)
    assert result == ToolReturn({"done": "c1"}, terminate=True)


async def test_fn_tool_returns_the_functions_value_as_it_is() -> None:
    class Point(BaseModel):
        x: int
        y: int

    result = await FnTool("pt", "P.", {}, lambda args: Point(x=1, y=2)).execute({}, CTX)
    assert result == Point(x=1, y=2)
    assert canonical_json(result) == '{"x":1,"y":2}'


def test_fn_tool_checks_the_schema_at_construction() -> None:
    with pytest.raises(AgentError) as excinfo:
        FnTool("bad", "d", {"type": "integr"}, lambda args: args)
    message = config_error(excinfo)
    assert "'bad'" in message
    assert "invalid JSON Schema" in message
    with pytest.raises(AgentError) as excinfo:
        FnTool("bad", "d", {"properties": {"a": {"minimum": "one"}}}, lambda args: args)
    assert "minimum must be a number" in config_error(excinfo)
    with pytest.raises(AgentError) as excinfo:
        FnTool("bad", "d", {"default": {1, 2}}, lambda args: args)
    assert "not JSON" in config_error(excinfo)


@pytest.mark.parametrize(
    "dialect",
    [
        "https://json-schema.org/draft/2020-12/schema",
        "https://json-schema.org/draft/2019-09/schema#",
    ],
)
def test_fn_tool_refuses_json_schema_dialects_it_cannot_validate(dialect: str) -> None:
    schema = {"$schema": dialect, "type": "array", "prefixItems": [{"type": "integer"}]}
    with pytest.raises(AgentError) as excinfo:
        FnTool("newer", "d", schema, lambda args: args)
    message = config_error(excinfo)
    assert "'newer'" in message
    assert dialect in message
    assert "Draft 7" in message


def test_fn_tool_validates_draft_7_and_never_writes_defaults() -> None:
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"n": {"type": "integer", "default": 5}},
        "if": {"required": ["n"]},
        "then": {"properties": {"n": {"minimum": 1}}},
    }
    draft7 = FnTool("d7", "d", schema, lambda args: args)
    assert draft7.validate({"n": 0}) == "$.n: must be bigger than or equal to 1"
    arguments: dict[str, JsonValue] = {}
    assert draft7.validate(arguments) is None
    assert arguments == {}  # use_default=False


def test_fn_tool_refuses_bad_names_and_functions() -> None:
    for name in ("", "has space", "dot.ted", "x" * 65):
        with pytest.raises(AgentError) as excinfo:
            FnTool(name, "d", {}, lambda args: args)
        assert "tool name" in config_error(excinfo)
    with pytest.raises(AgentError) as excinfo:
        FnTool("f", "d", {}, lambda: None)
    assert "(arguments) or (arguments, ctx)" in config_error(excinfo)
    with pytest.raises(AgentError):
        FnTool("f", "d", {}, lambda a, b, c: None)
    with pytest.raises(AgentError):
        FnTool("f", "d", {}, "not callable")  # type: ignore[arg-type]


def test_fn_tool_validates_with_json_paths() -> None:
    add_tool = FnTool("add", "Add.", ADD_SCHEMA, lambda args: args)
    assert add_tool.validate({"a": 1, "b": 2}) is None
    assert add_tool.validate({"a": 1}) == "$: must contain ['b'] properties"
    assert add_tool.validate({"a": 1, "b": "two"}) == "$.b: must be integer"
    assert add_tool.validate([1, 2]) == "$: must be object"
    items = FnTool(
        "items",
        "d",
        {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "string"}}}},
        lambda args: args,
    )
    assert items.validate({"xs": ["a", 3]}) == "$.xs[1]: must be string"
    everything = FnTool("any", "d", {}, lambda args: args)
    assert everything.validate({"whatever": [1, {"x": None}]}) is None


def test_fn_tool_keeps_a_private_copy_of_its_schema_and_hides_its_function() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    t = FnTool("t", "d", schema, lambda args: args, effect=ToolEffect.EXTERNAL, sequential=True)
    schema["required"] = []
    assert t.input_schema["required"] == ["a"]
    assert t.validate({}) == "$: must contain ['a'] properties"
    assert repr(t) == "FnTool(name='t', effect='external')"
    assert t.sequential is True


# --- @tool: schemas --------------------------------------------------------------------------


def test_simple_parameters_with_defaults() -> None:
    @tool
    def greet(name: str, times: int = 1, loud: bool = False, ratio: float | None = None) -> str:
        """Greet someone."""
        return name

    assert greet.name == "greet"
    assert greet.description == "Greet someone."
    assert greet.input_schema == {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "times": {"type": "integer", "default": 1},
            "loud": {"type": "boolean", "default": False},
            "ratio": {"anyOf": [{"type": "number"}, {"type": "null"}], "default": None},
        },
        "required": ["name"],
        "additionalProperties": False,
    }
    assert list(greet.input_schema) == ["type", "properties", "required", "additionalProperties"]


def test_annotated_string_and_field_descriptions() -> None:
    @tool
    def find(
        query: Annotated[str, "what to look for"],
        limit: Annotated[int, Field(description="most hits to return", ge=1, le=50)] = 10,
    ) -> list[str]:
        return []

    props = find.input_schema["properties"]
    assert props == {
        "query": {"type": "string", "description": "what to look for"},
        "limit": {
            "type": "integer",
            "description": "most hits to return",
            "minimum": 1,
            "maximum": 50,
            "default": 10,
        },
    }


def test_a_field_as_the_default_value() -> None:
    @tool
    def page(
        size: int = Field(20, description="rows per page", ge=1),
        cursor: str = Field(description="where to continue"),
    ) -> None: ...

    assert page.input_schema["properties"] == {
        "size": {"type": "integer", "description": "rows per page", "minimum": 1, "default": 20},
        "cursor": {"type": "string", "description": "where to continue"},
    }
    assert page.input_schema["required"] == ["cursor"]
    assert page.validate({"cursor": "c", "size": 0}) == (
        "$.size: Input should be greater than or equal to 1"
    )


def test_google_docstring_args_describe_parameters_and_leave_the_description() -> None:
    @tool
    def transfer(source: str, target: str, amount: int, memo: str = "") -> str:
        """Move money between accounts.

        Both accounts must belong to the caller.

        Args:
            source (str): Account to take the money from.
            target: Account to put it in,
                checked before anything moves.
            amount: In cents.

        Returns:
            A receipt id.
        """
        return "r-1"

    assert transfer.description == (
        "Move money between accounts.\n\n"
        "Both accounts must belong to the caller.\n\n"
        "Returns:\n    A receipt id."
    )
    props = transfer.input_schema["properties"]
    assert isinstance(props, dict)
    assert props["source"] == {"type": "string", "description": "Account to take the money from."}
    assert props["target"] == {
        "type": "string",
        "description": "Account to put it in, checked before anything moves.",
    }
    assert props["amount"] == {"type": "integer", "description": "In cents."}
    assert props["memo"] == {"type": "string", "default": ""}


def test_sphinx_docstrings() -> None:
    @tool
    def sphinx_style(a: int, b: str) -> None:
        """Do it the Sphinx way.

        :param a: The first,
            wrapped.
        :type a: int
        :param str b: The second.
        :returns: nothing.
        """

    assert sphinx_style.description == "Do it the Sphinx way.\n\n:returns: nothing."
    assert sphinx_style.input_schema["properties"] == {
        "a": {"type": "integer", "description": "The first, wrapped."},
        "b": {"type": "string", "description": "The second."},
    }


def test_other_docstring_styles_stay_in_the_description() -> None:
    @tool
    def numpy_style(a: int) -> None:
        """Do it the NumPy way.

        Parameters
        ----------
        a : int
            The first.
        """

    assert numpy_style.description == (
        "Do it the NumPy way.\n\nParameters\n----------\na : int\n    The first."
    )
    assert numpy_style.input_schema["properties"] == {"a": {"type": "integer"}}


def test_google_sections_end_where_the_indentation_does() -> None:
    @tool
    def keyed(first: str, second: str = "") -> None:
        """Summary.

        Keyword Args:
            second (str, optional): The second.

        Args:
            first: The first:
                it has a colon.
        More text after the section.
        """

    assert keyed.description == "Summary.\n\nMore text after the section."
    assert keyed.input_schema["properties"] == {
        "first": {"type": "string", "description": "The first: it has a colon."},
        "second": {"type": "string", "description": "The second.", "default": ""},
    }


def test_explicit_descriptions_win_over_the_docstring() -> None:
    @tool(name="lookup", description="Look a thing up.")
    def find(
        a: Annotated[str, "from Annotated"],
        b: Annotated[str, Field(description="from Field")],
        c: str,
    ) -> None:
        """Ignored summary.

        Args:
            a: from the docstring
            b: from the docstring
            c: from the docstring
        """

    assert find.name == "lookup"
    assert find.description == "Look a thing up."
    assert find.input_schema["properties"] == {
        "a": {"type": "string", "description": "from Annotated"},
        "b": {"type": "string", "description": "from Field"},
        "c": {"type": "string", "description": "from the docstring"},
    }


class Priority(enum.Enum):
    LOW = "low"
    HIGH = "high"


class Address(BaseModel):
    """Where a parcel goes."""

    street: str
    title: str | None = None  # a property called "title" survives title stripping


class Parcel(BaseModel):
    to: Address
    weight_grams: int


def test_optional_list_enum_literal_and_nested_model_parameters() -> None:
    @tool
    def ship(
        parcels: list[Parcel],
        priority: Priority,
        carrier: Literal["post", "courier"] = "post",
        tags: Optional[list[str]] = None,  # noqa: UP045 - Optional is what this test is about
    ) -> str:
        """Ship parcels."""
        return "ok"

    assert ship.input_schema == {
        "type": "object",
        "properties": {
            "parcels": {"type": "array", "items": {"$ref": "#/$defs/Parcel"}},
            "priority": {"$ref": "#/$defs/Priority"},
            "carrier": {"type": "string", "enum": ["post", "courier"], "default": "post"},
            "tags": {
                "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                "default": None,
            },
        },
        "required": ["parcels", "priority"],
        "additionalProperties": False,
        "$defs": {
            "Address": {
                "type": "object",
                "description": "Where a parcel goes.",
                "properties": {
                    "street": {"type": "string"},
                    "title": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
                },
                "required": ["street"],
            },
            "Parcel": {
                "type": "object",
                "properties": {
                    "to": {"$ref": "#/$defs/Address"},
                    "weight_grams": {"type": "integer"},
                },
                "required": ["to", "weight_grams"],
            },
            "Priority": {"type": "string", "enum": ["low", "high"]},
        },
    }


def test_no_parameters_and_no_docstring() -> None:
    @tool
    def heartbeat() -> str:
        return "ok"

    assert heartbeat.description == "Tool: heartbeat"
    assert heartbeat.input_schema == OBJECT_OF_NOTHING


def test_parameters_named_like_pydantic_internals_and_private_names() -> None:
    @tool
    def odd(json: str, model_config: int, _hidden: bool = False) -> str:
        return json

    assert odd.input_schema["properties"] == {
        "json": {"type": "string"},
        "model_config": {"type": "integer"},
        "_hidden": {"type": "boolean", "default": False},
    }
    assert odd.validate({"json": "x", "model_config": 1, "_hidden": True}) is None


def test_string_annotations_are_resolved() -> None:
    def late(count: "int", ctx: "ToolContext") -> "str":
        return str(count)

    late_tool = tool(late)
    assert late_tool.input_schema["properties"] == {"count": {"type": "integer"}}
    assert late_tool.input_schema["required"] == ["count"]


# --- @tool: the context, execution and validation ---------------------------------------------


async def test_a_tool_context_parameter_is_injected_and_not_in_the_schema() -> None:
    @tool
    async def record(note: str, context: ToolContext) -> dict[str, Any]:
        return {"note": note, "run": context.run_id, "call": context.call_id, "step": context.step}

    assert record.input_schema["properties"] == {"note": {"type": "string"}}
    assert record.input_schema["required"] == ["note"]
    assert await record.execute({"note": "hi"}, CTX) == {
        "note": "hi",
        "run": "job-42",
        "call": "c1",
        "step": 3,
    }
    assert record.validate({"note": "hi", "context": {}}) == (
        "$.context: Extra inputs are not permitted"
    )


async def test_a_sync_tool_runs_in_another_thread_with_its_context() -> None:
    @tool
    def where(ctx: ToolContext, label: str = "x") -> list[Any]:
        return [label, ctx.call_id, threading.get_ident()]

    label, call_id, thread = await where.execute({}, CTX)
    assert (label, call_id) == ("x", "c1")
    assert thread != threading.get_ident()


async def test_execute_with_valid_arguments_returns_the_value() -> None:
    @tool
    async def add(a: int, b: int = 10) -> int:
        return a + b

    assert await add.execute({"a": 1, "b": 2}, CTX) == 3
    assert await add.execute({"a": 1}, CTX) == 11
    assert await add.execute({"a": "5"}, CTX) == 15  # lax mode: an unambiguous quoted number


async def test_nested_model_arguments_arrive_as_models() -> None:
    @tool
    def weigh(parcels: list[Parcel], priority: Priority) -> list[Any]:
        assert all(isinstance(p, Parcel) for p in parcels)
        assert isinstance(priority, Priority)
        return [sum(p.weight_grams for p in parcels), priority]

    arguments: dict[str, JsonValue] = {
        "parcels": [
            {"to": {"street": "Main 1"}, "weight_grams": 300},
            {"to": {"street": "Side 2", "title": "Dr"}, "weight_grams": 200},
        ],
        "priority": "high",
    }
    assert await weigh.execute(arguments, CTX) == [500, Priority.HIGH]


@dataclasses.dataclass
class Receipt:
    id: str
    priority: Priority


async def test_execute_returns_the_value_and_canonical_json_encodes_it() -> None:
    @tool
    def address() -> Address:
        return Address(street="Main 1")

    @tool
    async def parcels() -> list[Parcel]:
        return [Parcel(to=Address(street="A"), weight_grams=1)]

    @tool
    def receipt() -> Receipt:
        return Receipt(id="r-1", priority=Priority.LOW)

    @tool
    def finish() -> ToolReturn:
        return ToolReturn(Address(street="End"), terminate=True)

    assert await address.execute({}, CTX) == Address(street="Main 1")
    assert canonical_json(await address.execute({}, CTX)) == '{"street":"Main 1","title":null}'
    assert canonical_json(await parcels.execute({}, CTX)) == (
        '[{"to":{"street":"A","title":null},"weight_grams":1}]'
    )
    assert canonical_json(await receipt.execute({}, CTX)) == '{"id":"r-1","priority":"low"}'
    assert await finish.execute({}, CTX) == ToolReturn(Address(street="End"), terminate=True)


RICH_VALUE = {
    "when": datetime.date(2024, 5, 17),
    "at": datetime.datetime(2024, 5, 17, 9, 30, tzinfo=datetime.UTC),
    "tags": {"only"},
    "pair": (1, "b"),
    "priority": Priority.HIGH,
    "receipt": Receipt(id="r-2", priority=Priority.LOW),
    "nested": [Address(street="x")],
}
RICH_TEXT = (
    '{"at":"2024-05-17T09:30:00Z","nested":[{"street":"x","title":null}],"pair":[1,"b"],'
    '"priority":"high","receipt":{"id":"r-2","priority":"low"},"tags":["only"],'
    '"when":"2024-05-17"}'
)


async def test_both_kinds_of_tool_return_rich_values_the_same_way() -> None:
    """One conversion for every tool: dates, sets, tuples, enums, dataclasses and models."""

    @tool
    def rich() -> dict[str, Any]:
        return RICH_VALUE

    fn_tool = FnTool("rich", "d", {}, lambda args: RICH_VALUE)
    assert canonical_json(await rich.execute({}, CTX)) == RICH_TEXT
    assert canonical_json(await fn_tool.execute({}, CTX)) == RICH_TEXT


async def test_a_value_that_cannot_be_json_is_a_tool_error() -> None:
    @tool
    def opaque() -> object:
        return {"x": object()}

    fn_tool = FnTool("opaque", "d", {}, lambda args: {"x": object()})
    for value in (await opaque.execute({}, CTX), await fn_tool.execute({}, CTX)):
        with pytest.raises(AgentError) as excinfo:
            canonical_json(value)
        assert excinfo.value.kind is ErrorKind.TOOL
        assert excinfo.value.message.startswith("the tool returned a value that is not JSON: ")
        assert "object" in excinfo.value.message


async def test_exceptions_from_the_function_propagate() -> None:
    @tool
    async def fail(reason: str) -> None:
        raise AgentError.tool(reason)

    with pytest.raises(AgentError, match="card declined"):
        await fail.execute({"reason": "card declined"}, CTX)


async def test_validation_failures_list_every_problem() -> None:
    @tool
    def book(room: int, guests: list[str], note: str = "") -> str:
        return "ok"

    assert book.validate({"room": 1, "guests": ["a"]}) is None
    assert book.validate({"guests": ["a", 7], "extra": True}) == (
        "$.room: Field required; "
        "$.guests[1]: Input should be a valid string; "
        "$.extra: Extra inputs are not permitted"
    )
    assert book.validate({"room": 1.5, "guests": []}) == (
        "$.room: Input should be a valid integer, got a number with a fractional part"
    )
    assert book.validate(["room"]) == "$: the arguments must be a JSON object, got an array"
    assert book.validate("x") == "$: the arguments must be a JSON object, got a string"
    assert book.validate(None) == "$.room: Field required; $.guests: Field required"
    with pytest.raises(AgentError) as excinfo:
        await book.execute({"room": "one", "guests": []}, CTX)
    assert excinfo.value.kind is ErrorKind.TOOL
    assert (
        excinfo.value.message
        == "$.room: Input should be a valid integer, unable to parse string as an integer"
    )


async def test_null_arguments_count_as_an_empty_object() -> None:
    @tool
    def now() -> str:
        return "noon"

    assert now.validate(None) is None
    assert await now.execute(None, CTX) == "noon"
    assert now.validate({"x": 1}) == "$.x: Extra inputs are not permitted"


def test_the_decorated_object_still_calls_the_function() -> None:
    @tool(effect=ToolEffect.READ_ONLY, sequential=True)
    def double(x: int) -> int:
        """Double x."""
        return 2 * x

    assert isinstance(double, FunctionTool)
    assert double(21) == 42
    assert double.__wrapped__(x=2) == 4
    assert double.sequential is True
    assert repr(double) == "FunctionTool(name='double', effect='read_only')"
    assert double.__doc__ == "Double x."
    assert list(inspect.signature(double).parameters) == ["x"]


async def test_bound_methods_and_callable_objects_can_be_tools() -> None:
    class Counter:
        def __init__(self) -> None:
            self.total = 0

        async def bump(self, by: int = 1) -> int:
            """Bump the counter."""
            self.total += by
            return self.total

    class Shout:
        __name__ = "shout"

        def __call__(self, text: str) -> str:
            return text.upper()

    counter = Counter()
    bump = tool(counter.bump)
    assert bump.name == "bump"
    assert bump.input_schema["properties"] == {"by": {"type": "integer", "default": 1}}
    assert await bump.execute({"by": 5}, CTX) == 5
    shout = tool(Shout())
    assert await shout.execute({"text": "hi"}, CTX) == "HI"


# --- @tool: declaration errors ----------------------------------------------------------------


def decoration_error(fn: Callable[..., Any]) -> str:
    with pytest.raises(AgentError) as excinfo:
        tool(fn)
    return config_error(excinfo)


def test_var_positional_and_var_keyword_are_refused() -> None:
    def star(*items: str) -> None: ...

    def double_star(first: int, **options: str) -> None: ...

    message = decoration_error(star)
    assert "star" in message
    assert "'items'" in message
    assert "*args" in message
    message = decoration_error(double_star)
    assert "double_star" in message
    assert "'options'" in message
    assert "**kwargs" in message


def test_positional_only_and_unannotated_parameters_are_refused() -> None:
    def positional(a: int, /, b: int) -> None: ...

    def bare(a, b: int) -> None:  # type: ignore[no-untyped-def]
        ...

    message = decoration_error(positional)
    assert "positional" in message
    assert "'a'" in message
    message = decoration_error(bare)
    assert "bare" in message
    assert "'a'" in message
    assert "annotation" in message


def test_an_unbound_method_gets_a_hint() -> None:
    class Shop:
        def price(self, item: str) -> int:
            return 3

    message = decoration_error(Shop.price)
    assert "'self'" in message
    assert "tool(obj.method)" in message
    assert tool(Shop().price).input_schema["properties"] == {"item": {"type": "string"}}


def test_a_second_tool_context_is_refused() -> None:
    def two(first: ToolContext, second: ToolContext) -> None: ...

    def nested(contexts: list[ToolContext]) -> None: ...

    message = decoration_error(two)
    assert "two" in message
    assert "'second'" in message
    assert "ToolContext" in message
    assert "'contexts'" in decoration_error(nested)


def test_types_without_a_json_schema_are_refused() -> None:
    class Opaque:
        pass

    def opaque(name: str, thing: Opaque) -> None: ...

    def callback(name: str, then: Callable[[int], int]) -> None: ...

    message = decoration_error(opaque)
    assert "opaque" in message
    assert "'thing'" in message
    message = decoration_error(callback)
    assert "callback" in message
    assert "'then'" in message


def test_non_callables_unresolvable_annotations_and_bad_options_are_refused() -> None:
    with pytest.raises(AgentError) as excinfo:
        tool(42)  # type: ignore[call-overload]
    assert "needs a function" in config_error(excinfo)
    with pytest.raises(AgentError) as excinfo:
        tool("search")  # type: ignore[call-overload]
    assert "@tool(name=...)" in config_error(excinfo)

    def unresolved(x: "NoSuchType") -> None:  # type: ignore[name-defined]  # noqa: F821
        ...

    assert "unresolved" in decoration_error(unresolved)

    def fine(x: int) -> None: ...

    with pytest.raises(AgentError) as excinfo:
        tool(name="no spaces please")(fine)
    assert "tool name" in config_error(excinfo)
    with pytest.raises(AgentError) as excinfo:
        tool(effect="dangerous")(fine)  # type: ignore[call-overload]
    assert "effect must be one of" in config_error(excinfo)

    def aliased(x: Annotated[int, Field(alias="y")]) -> None: ...

    assert "'x'" in decoration_error(aliased)


async def test_nothing_is_inspected_or_compiled_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    @tool
    def area(width: float, height: float = 1.0) -> float:
        return width * height

    fn_tool = FnTool("echo", "d", ADD_SCHEMA, lambda args: args)

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("called at call time")

    monkeypatch.setattr(inspect, "signature", forbidden)
    monkeypatch.setattr(typing, "get_type_hints", forbidden)
    monkeypatch.setattr(tools_functions, "create_model", forbidden)
    monkeypatch.setattr(fastjsonschema, "compile", forbidden)
    monkeypatch.setattr(inspect, "cleandoc", forbidden)
    for _ in range(3):
        assert area.validate({"width": 2}) is None
        assert await area.execute({"width": 2, "height": 3}, CTX) == 6
        assert fn_tool.validate({"a": 1}) == "$: must contain ['b'] properties"
        assert await fn_tool.execute({"a": 1, "b": 2}, CTX) == {"a": 1, "b": 2}


# --- the registry ----------------------------------------------------------------------------


def make_tool(name: str, description: str = "d") -> FnTool:
    return FnTool(name, description, {"type": "object"}, lambda args: args)


def test_registry_add_remove_replace() -> None:
    b, a, c = make_tool("b"), make_tool("a"), make_tool("c")
    registry = ToolRegistry([b, a])
    assert len(registry) == 2
    assert "a" in registry
    assert "c" not in registry
    assert registry.get("a") is a
    assert registry.get("c") is None
    registry.add(c)
    assert registry.names() == ["a", "b", "c"]
    assert list(registry) == [a, b, c]

    with pytest.raises(AgentError) as excinfo:
        registry.add(make_tool("a"))
    assert "'a'" in config_error(excinfo)
    assert "already registered" in excinfo.value.message

    assert registry.remove("b") is b
    assert registry.names() == ["a", "c"]
    with pytest.raises(AgentError) as excinfo:
        registry.remove("b")
    assert "'b'" in config_error(excinfo)

    new_a = make_tool("a", "newer")
    assert registry.replace(new_a) is a
    assert registry.get("a") is new_a
    with pytest.raises(AgentError) as excinfo:
        registry.replace(make_tool("zzz"))
    assert "'zzz'" in config_error(excinfo)
    assert repr(registry) == "ToolRegistry(['a', 'c'])"


def test_registry_refuses_things_that_are_not_tools_and_lists_what_is_missing() -> None:
    with pytest.raises(AgentError) as excinfo:
        ToolRegistry([object()])  # type: ignore[list-item]
    assert config_error(excinfo).endswith(
        "is not a Tool: missing name, description, input_schema, effect, sequential, "
        "validate, execute"
    )

    class HalfDone:
        name = "half"
        description = "d"
        input_schema: dict[str, JsonValue] = {}  # noqa: RUF012

        async def execute(self, arguments: JsonValue, ctx: ToolContext) -> Any:
            return None

    with pytest.raises(AgentError) as excinfo:
        ToolRegistry().add(HalfDone())  # type: ignore[arg-type]
    assert config_error(excinfo).endswith("is not a Tool: missing effect, sequential, validate")


def test_the_member_list_matches_the_protocol() -> None:
    declared = {name for name in vars(Tool) if not name.startswith("_")}
    assert set(tools_base.TOOL_MEMBERS) == declared


def test_definitions_are_sorted_and_cached_until_a_change() -> None:
    @tool(effect=ToolEffect.READ_ONLY)
    def zeta(x: int) -> int:
        """Last by name."""
        return x

    registry = ToolRegistry([zeta, make_tool("mid"), make_tool("alpha")])
    first = registry.definitions()
    assert [d.name for d in first] == ["alpha", "mid", "zeta"]
    assert first[2] == definition_of(zeta)
    assert registry.definitions() is first

    registry.add(make_tool("beta"))
    second = registry.definitions()
    assert second is not first
    assert [d.name for d in second] == ["alpha", "beta", "mid", "zeta"]
    assert registry.definitions() is second

    registry.replace(make_tool("beta", "changed"))
    third = registry.definitions()
    assert third is not second
    assert third[1].description == "changed"
    registry.remove("beta")
    assert registry.definitions() is not third
    assert [d.name for d in registry.definitions()] == ["alpha", "mid", "zeta"]


def test_a_users_own_class_fits_the_registry() -> None:
    class Clock:
        name = "clock"
        description = "What time is it?"
        input_schema: dict[str, JsonValue] = {"type": "object"}  # noqa: RUF012
        effect = ToolEffect.READ_ONLY
        sequential = False

        def validate(self, arguments: JsonValue) -> str | None:
            return None

        async def execute(self, arguments: JsonValue, ctx: ToolContext) -> Any:
            return "noon"

    registry = ToolRegistry([Clock()])
    assert registry.definitions() == (
        ToolDefinition(
            name="clock", description="What time is it?", input_schema={"type": "object"}
        ),
    )


async def test_a_hook_editing_request_tools_cannot_change_the_registry() -> None:
    """definitions() is a tuple of frozen definitions, shared by every request of a run."""

    class ToolEditor(AgentHooks):
        failures: list[str] = []  # noqa: RUF012

        async def before_model(self, request: ChatRequest, info: RunInfo) -> None:
            try:
                request.tools.append(  # type: ignore[attr-defined]
                    ToolDefinition(name="sneaky", description="x", input_schema={})
                )
            except AttributeError:
                self.failures.append("append")
            try:
                request.tools[0].description = "edited"  # type: ignore[misc]
            except ValidationError:
                self.failures.append("edit")
            # replacing the list changes this request only
            request.tools = [ToolDefinition(name="other", description="o", input_schema={})]

    editor = ToolEditor()
    model = ScriptedModel([tool_call("echo", {}), "done"])
    agent = Agent(model, tools=[make_tool("echo")], hooks=[editor])
    before = agent.tools.definitions()
    assert isinstance((await agent.run("go")).outcome, Completed)
    assert editor.failures == ["append", "edit", "append", "edit"]
    assert [[d.name for d in request.tools] for request in model.requests] == [["other"]] * 2
    assert agent.tools.definitions() is before
    assert before == (
        ToolDefinition(name="echo", description="d", input_schema={"type": "object"}),
    )


# --- output text -----------------------------------------------------------------------------


def test_canonical_json_matches_serde_compact_sorted_output() -> None:
    assert canonical_json({"step": 0, "run": "job-42", "call": "c1"}) == (
        '{"call":"c1","run":"job-42","step":0}'
    )
    assert canonical_json("data") == '"data"'
    assert canonical_json({"b": [1, 2.5, None, True], "a": {"z": "é", "y": "日本"}}) == (
        '{"a":{"y":"日本","z":"é"},"b":[1,2.5,null,true]}'
    )
    assert canonical_json([Address(street="x")]) == '[{"street":"x","title":null}]'


class NanModel(BaseModel):
    x: float


@pytest.mark.parametrize(
    "value",
    [
        object(),
        {"x": float("nan")},
        [float("inf")],
        NanModel(x=float("-inf")),
        b"\xff",  # bytes become UTF-8 text, when they are UTF-8
        {"a": 1, 2: "mixed key types cannot be sorted"},
    ],
)
def test_canonical_json_refuses_values_that_are_not_json(value: Any) -> None:
    with pytest.raises(AgentError) as excinfo:
        canonical_json(value)
    assert excinfo.value.kind is ErrorKind.TOOL
    assert excinfo.value.message.startswith("the tool returned a value that is not JSON: ")


def test_canonical_json_names_the_offending_type() -> None:
    class Opaque:
        pass

    with pytest.raises(AgentError, match="Opaque"):
        canonical_json({"thing": Opaque()})


def test_canonical_json_converts_what_pydantic_can() -> None:
    assert canonical_json(RICH_VALUE) == RICH_TEXT
    assert canonical_json({"tags": frozenset({"a"}), "raw": b"bytes"}) == (
        '{"raw":"bytes","tags":["a"]}'
    )
    assert canonical_json(Receipt(id="r", priority=Priority.HIGH)) == (
        '{"id":"r","priority":"high"}'
    )


def test_canonical_json_writes_nan_only_when_allowed() -> None:
    value = {"b": float("nan"), "a": [float("inf"), float("-inf")]}
    assert canonical_json(value, allow_nan=True) == '{"a":[Infinity,-Infinity],"b":NaN}'
    assert json.loads(canonical_json(value, allow_nan=True))["a"] == [
        float("inf"),
        float("-inf"),
    ]
    with pytest.raises(AgentError):
        canonical_json(value)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_canonical_json_round_trips_and_is_a_fixed_point(value: Any) -> None:
    text = canonical_json(value)
    assert json.loads(text) == value
    assert canonical_json(json.loads(text)) == text


def test_truncate_chars_examples() -> None:
    assert truncate_chars("abcdef", 3) == "abc…[truncated]"
    assert truncate_chars("abc", 3) == "abc"
    assert truncate_chars("", 0) == ""
    assert truncate_chars("日本語のテキスト", 2) == "日本" + TRUNCATION_MARKER


@given(st.text(), st.integers(min_value=0, max_value=50))
def test_truncate_chars_bounds(text: str, limit: int) -> None:
    result = truncate_chars(text, limit)
    assert len(result) <= limit + len(TRUNCATION_MARKER)
    if len(text) <= limit:
        assert result == text
    else:
        assert result == text[:limit] + TRUNCATION_MARKER


def test_error_payload_is_canonical_json() -> None:
    payload = error_payload('x "y"')
    assert payload == '{"error":"x \\"y\\""}'
    assert json.loads(payload) == {"error": 'x "y"'}


@given(st.text())
def test_error_payload_round_trips(message: str) -> None:
    assert json.loads(error_payload(message)) == {"error": message}


@pytest.mark.parametrize("parallel", [False, True], ids=["one call", "two calls at once"])
async def test_a_tools_own_cancelled_error_is_a_tool_error_not_a_cancelled_run(
    parallel: bool,
) -> None:
    """A CancelledError out of a tool whose task nobody cancels (an inner task of the tool was
    cancelled) ended the whole run as if it had been cancelled, its turn lost."""

    @tool
    async def fetch(url: str) -> str:
        """Fetch a page with an inner task that gets cancelled."""
        inner = asyncio.ensure_future(asyncio.sleep(10))
        inner.cancel()
        return str(await inner)

    @tool
    def other(url: str) -> str:
        """Answer at once."""
        return "fine"

    calls = [tool_call("fetch", {"url": "a"}, id="c1")]
    if parallel:
        calls.append(tool_call("other", {"url": "b"}, id="c2"))
    model = ScriptedModel([calls, "done"])
    turn = await Agent(model, tools=[fetch, other]).run("go")
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "done"
    sent = json.dumps([m.model_dump(mode="json") for m in model.requests[-1].messages])
    assert "CancelledError" in sent


async def test_cancelling_the_caller_of_a_run_still_cancels_it_mid_tool() -> None:
    started = asyncio.Event()

    @tool
    async def slow(url: str) -> str:
        """Wait long."""
        started.set()
        await asyncio.sleep(30)
        return "late"

    model = ScriptedModel([tool_call("slow", {"url": "a"}), "done"])
    task = asyncio.ensure_future(Agent(model, tools=[slow]).run("go"))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
