"""What a finished run leaves behind: nothing of the library's in a reference cycle, so a run's
state (its loop, the transcript it held, its tool round) is freed with its last reference
rather than at a later full garbage collection (issue 20)."""

from __future__ import annotations

import gc
from collections.abc import Awaitable, Callable

import pytest

from agent_plugin import Agent, CancelToken, Completed, FnTool, RunOptions, ScriptedModel, tool
from agent_plugin.providers.scripted import tool_call


@tool
def add(a: int, b: int) -> int:
    """Adds two numbers."""
    return a + b


@tool
async def add_async(a: int, b: int) -> int:
    """Adds two numbers, asynchronously."""
    return a + b


async def cyclic_garbage(work: Callable[[], Awaitable[None]]) -> list[str]:
    """The library's types among the objects that only the cycle collector frees after
    ``work``."""
    gc.collect()
    gc.disable()
    try:
        await work()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    names = {f"{type(o).__module__}.{type(o).__qualname__}" for o in found}
    return sorted(name for name in names if name.startswith(("agent_plugin.", "tests.")))


@pytest.mark.parametrize("name", ["add", "add_async"])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_finished_run_leaves_no_reference_cycle(name: str, stream: bool) -> None:
    model = ScriptedModel()
    agent = Agent(model, tools=[add, add_async])

    async def runs() -> None:
        for _ in range(3):  # a cancel token is watched around the model calls and the tools
            model.push(tool_call(name, {"a": 1, "b": 2}), tool_call(name, {"a": 3, "b": 4}), "ok")
            options = RunOptions(stream=stream, cancel=CancelToken())
            turn = await agent.run("add numbers", options=options)
            assert isinstance(turn.outcome, Completed)

    await runs()  # first use: imports and caches
    assert await cyclic_garbage(runs) == []


async def test_the_check_sees_a_cycle() -> None:
    """The check above can fail: a cycle of the library's objects made here is reported."""

    async def cycle() -> None:
        held: list[object] = []
        held.append(FnTool("held", "Holds itself.", {"type": "object"}, lambda _: held))

    assert await cyclic_garbage(cycle) == ["agent_plugin.tools.base.FnTool"]
