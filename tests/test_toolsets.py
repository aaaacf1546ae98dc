"""Toolsets: a user's own toolset class, starting several, merging their tools, and a runtime
that starts them, offers their current tools and closes them (issue 22)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest

from agent_plugin.config import AgentSettings
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.memory import InMemoryMemoryStore
from agent_plugin.providers.scripted import ScriptedModel
from agent_plugin.runtime import AgentRuntime, RuntimeSpec, open_runtime
from agent_plugin.sessions import InMemorySessionStore
from agent_plugin.tools import FnTool, Tool, ToolEffect
from agent_plugin.toolsets import (
    LiveToolset,
    Toolset,
    ToolsetHealth,
    close_toolsets,
    gather_tools,
    start_toolsets,
)
from agent_plugin.web.health import AgentHealth


def fn_tool(name: str) -> FnTool:
    return FnTool(name, "a tool", {"type": "object"}, lambda _: name, effect=ToolEffect.READ_ONLY)


class Box:
    """A toolset of fixed tools; started and closed boxes are recorded in ``log``."""

    def __init__(self, name: str, tools: Sequence[Tool], log: list[str], fail: bool = False):
        self.name = name
        self.offered = tuple(tools)
        self.log = log
        self.fail = fail
        self.revision = 1

    async def start(self, environ: Mapping[str, str]) -> LiveToolset:
        if self.fail:
            raise AgentError(ErrorKind.UNAVAILABLE, f"{self.name} is not there")
        self.log.append(f"start {self.name} {environ.get('WHO', '-')}")
        return self

    def tools(self) -> Sequence[Tool]:
        return self.offered

    async def health(self) -> ToolsetHealth:
        return ToolsetHealth(True)

    async def aclose(self) -> None:
        self.log.append(f"close {self.name}")


def test_a_plain_class_is_a_toolset() -> None:
    box = Box("box", [], [])
    assert isinstance(box, Toolset)
    assert isinstance(box, LiveToolset)
    assert not isinstance(fn_tool("x"), Toolset)


async def test_toolsets_start_with_the_environment() -> None:
    log: list[str] = []
    live = await start_toolsets([Box("a", [], log), Box("b", [], log)], {"WHO": "app"})
    assert [toolset.name for toolset in live] == ["a", "b"]
    assert sorted(log) == ["start a app", "start b app"]
    await close_toolsets(live)
    assert log[-2:] == ["close a", "close b"]


async def test_when_one_toolset_fails_to_start_the_started_ones_are_closed() -> None:
    log: list[str] = []
    boxes = [Box("a", [], log), Box("down", [], log, fail=True), Box("c", [], log)]
    with pytest.raises(AgentError, match="down is not there"):
        await start_toolsets(boxes, {})
    assert sorted(line for line in log if line.startswith("close")) == ["close a", "close c"]


async def test_two_toolsets_with_one_name_and_a_non_toolset_are_refused() -> None:
    with pytest.raises(AgentError, match="two toolsets are named 'a'"):
        await start_toolsets([Box("a", [], []), Box("a", [], [])], {})
    with pytest.raises(AgentError, match="is not a toolset"):
        await start_toolsets([fn_tool("x")], {})  # type: ignore[list-item]


def test_gather_keeps_the_own_tools_first_then_each_toolset_in_order() -> None:
    own = [fn_tool("own")]
    first = Box("first", [fn_tool("a_one"), fn_tool("a_two")], [])
    second = Box("second", [fn_tool("b_one")], [])
    names = [tool.name for tool in gather_tools(own, [first, second], strict=True)]
    assert names == ["own", "a_one", "a_two", "b_one"]


@pytest.mark.parametrize(
    ("own", "reserved", "holder"),
    [
        (["clash"], (), "the app's own tools"),
        ([], ("clash",), "the agent's built-in tools"),
    ],
)
def test_a_taken_name_is_a_startup_error_and_later_a_warning(
    own: list[str], reserved: tuple[str, ...], holder: str, caplog: pytest.LogCaptureFixture
) -> None:
    box = Box("box", [fn_tool("clash"), fn_tool("fine")], [])
    with pytest.raises(
        AgentError, match=f"'clash' of toolset box has the name of a tool of {holder}"
    ):
        gather_tools([fn_tool(n) for n in own], [box], reserved=reserved, strict=True)
    with caplog.at_level(logging.WARNING, logger="agent_plugin"):
        tools = gather_tools([fn_tool(n) for n in own], [box], reserved=reserved, strict=False)
    assert [tool.name for tool in tools] == [*own, "fine"]
    assert "it is left out" in caplog.text


def test_the_first_toolset_keeps_a_name_both_offer() -> None:
    first = Box("first", [fn_tool("same")], [])
    second = Box("second", [fn_tool("same"), fn_tool("other")], [])
    with pytest.raises(
        AgentError, match="of toolset second has the name of a tool of toolset first"
    ):
        gather_tools([], [first, second], strict=True)
    kept = gather_tools([], [first, second], strict=False)
    assert [(tool.name, tool is first.tools()[0]) for tool in kept] == [
        ("same", True),
        ("other", False),
    ]


# --- in a runtime -----------------------------------------------------------------------------


def spec(*toolsets: Toolset, tools: Sequence[Tool] = ()) -> RuntimeSpec:
    return RuntimeSpec(
        tools=tuple(tools),
        toolsets=toolsets,
        model=ScriptedModel(),
        session_store=InMemorySessionStore(),
    )


SETTINGS = AgentSettings(provider="scripted")


async def test_a_runtime_starts_its_toolsets_offers_their_tools_and_closes_them() -> None:
    log: list[str] = []
    box = Box("box", [fn_tool("box_b"), fn_tool("box_a")], log)
    runtime = await open_runtime(spec(box, tools=[fn_tool("own")]), SETTINGS)
    assert runtime.toolsets == (box,)
    assert runtime.tool_names() == ["box_a", "box_b", "own"]
    await runtime.aclose()
    assert log == ["start box -", "close box"]


async def test_agents_built_after_a_toolset_changed_get_its_new_tools() -> None:
    box = Box("box", [fn_tool("box_a")], [])
    runtime = await open_runtime(spec(box), SETTINGS)
    try:
        before = runtime.agent_for()
        assert runtime.agent_for() is before  # cached while nothing changed
        box.offered = (fn_tool("box_a"), fn_tool("box_new"))
        box.revision += 1
        after = runtime.agent_for()
        assert after.tools.names() == ["box_a", "box_new"]
        assert before.tools.names() == ["box_a"]  # an agent already running keeps its tools
    finally:
        await runtime.aclose()


@pytest.mark.parametrize("taken", ["own", "memory"])
async def test_a_toolset_tool_named_like_another_tool_stops_the_runtime_from_opening(
    taken: str,
) -> None:
    log: list[str] = []
    box = Box("box", [fn_tool(taken)], log)
    opened = replace(spec(box, tools=[fn_tool("own")]), memory_store=InMemoryMemoryStore())
    with pytest.raises(AgentError, match=f"the tool '{taken}' of toolset box has the name"):
        await open_runtime(opened, SETTINGS)
    assert log == ["start box -", "close box"]


# --- in the health report -------------------------------------------------------------------


class Sick(Box):
    async def health(self) -> ToolsetHealth:
        return ToolsetHealth(False, {"error": "the line is cut"})


class Stuck(Box):
    async def health(self) -> ToolsetHealth:
        await asyncio.sleep(10)
        return ToolsetHealth(True)


async def test_each_toolset_is_a_health_component_bounded_in_time() -> None:
    health = AgentHealth(timeout_secs=0.2)
    toolsets = [Box("fine", [], []), Sick("sick", [], []), Stuck("stuck", [], [])]
    settings = AgentSettings.load({"provider": "scripted"}, environ={})
    runtime = AgentRuntime(
        settings=settings,
        client=ScriptedModel(),
        session_store=InMemorySessionStore(),
        toolsets=toolsets,
    )
    health.attach(runtime)
    report = await health.report()
    assert report.status == "DOWN"
    assert {name: c.status for name, c in report.components.items()} == {
        "agent": "UP",
        "fine": "UP",
        "sick": "DOWN",
        "stuck": "DOWN",
    }
    assert report.components["sick"].details == {"error": "the line is cut"}
    assert report.components["stuck"].details == {"error": "stuck did not answer within 0.2 s"}
    health.detach(runtime)
    assert list((await health.report()).components) == ["agent"]
