"""Step checkpoints: a crashed run continues from its journal without repeating work [HV-01]."""

from __future__ import annotations

from typing import Any

import pytest

from agent_plugin.agent import Agent
from agent_plugin.journal import InMemoryJournal, journal_entry_adapter, recover
from agent_plugin.messages import Role, ToolResultPart
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import Allowed, Completed, Finished
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.tools import FnTool


class Crash(BaseException):
    """Stands in for the process dying: nothing in the loop catches it."""


class Counter:
    def __init__(self, crash_on: str | None = None) -> None:
        self.calls: list[str] = []
        self.crash_on = crash_on

    def tool(self) -> FnTool:
        def count(args: Any) -> Any:
            name = args["name"]
            if name == self.crash_on:
                self.crash_on = None  # the worker dies once, the retry succeeds
                raise Crash
            self.calls.append(name)
            return f"did {name}"

        return FnTool("count", "counts executions", {"type": "object"}, count)


def script() -> list[Any]:
    return [
        [tool_call("count", {"name": "a"}, id="a"), tool_call("count", {"name": "b"}, id="b")],
        tool_call("count", {"name": "c"}, id="c"),
        "all done",
    ]


async def test_a_crash_mid_round_reruns_only_the_call_in_flight() -> None:
    counter = Counter(crash_on="b")
    journal = InMemoryJournal()
    model = ScriptedModel(script())
    agent = Agent(model, tools=[counter.tool()], parallel_tool_calls=False)
    with pytest.raises(Crash):
        await agent.run("go", options=RunOptions(run_id="r1", journal=journal))
    assert counter.calls == ["a"]

    state = recover(journal.entries)
    assert state is not None
    assert state.run_id == "r1"
    assert [type(p.status) for p in state.pending] == [Finished, Allowed]

    # a new process: the remaining replies, no memory of the first attempt
    retry_model = ScriptedModel(script()[1:])
    retry = Agent(retry_model, tools=[counter.tool()], parallel_tool_calls=False)
    turn = await retry.resume(state, options=RunOptions(journal=journal))
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "all done"
    assert counter.calls == ["a", "b", "c"]  # a ran once; b, in flight at the crash, once more
    assert len(retry_model.requests) == 2  # the first reply was not asked for again
    results = [
        p.tool_result.content
        for m in turn.messages
        if m.role is Role.TOOL
        for p in m.content
        if isinstance(p, ToolResultPart)
    ]
    assert results == ['"did a"', '"did b"', '"did c"']


async def test_a_crash_between_steps_asks_the_model_for_the_next_reply_only() -> None:
    counter = Counter()
    journal = InMemoryJournal()
    replies = script()

    async def die(request: Any) -> Any:
        raise Crash

    agent = Agent(ScriptedModel([replies[0], die]), tools=[counter.tool()])
    with pytest.raises(Crash):
        await agent.run("go", options=RunOptions(run_id="r2", journal=journal))
    state = recover(journal.entries)
    assert state is not None
    assert state.pending == []
    assert state.steps_used == 1
    retry_model = ScriptedModel(replies[1:])
    turn = await Agent(retry_model, tools=[counter.tool()]).resume(
        state, options=RunOptions(journal=journal)
    )
    assert isinstance(turn.outcome, Completed)
    assert counter.calls == ["a", "b", "c"]
    assert turn.outcome.steps_used == 2


async def test_a_run_recovered_after_its_answer_completes_without_a_model_call() -> None:
    journal = InMemoryJournal()
    counter = Counter()
    await Agent(ScriptedModel(script()), tools=[counter.tool()]).run(
        "go", options=RunOptions(journal=journal)
    )
    state = recover(journal.entries)
    assert state is not None
    model = ScriptedModel()
    turn = await Agent(model, tools=[counter.tool()]).resume(state)
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "all done"
    assert model.requests == []
    assert counter.calls == ["a", "b", "c"]


async def test_journal_entries_round_trip_as_json() -> None:
    journal = InMemoryJournal()
    await Agent(ScriptedModel(script()), tools=[Counter().tool()]).run(
        "go", options=RunOptions(journal=journal)
    )
    kinds = [e.kind for e in journal.entries]
    assert kinds[0] == "started"
    assert kinds.count("tool_done") == 3
    assert kinds.count("round_done") == 2
    for entry in journal.entries:
        again = journal_entry_adapter.validate_json(journal_entry_adapter.dump_json(entry))
        assert again == entry
    assert recover(
        journal_entry_adapter.validate_json(journal_entry_adapter.dump_json(e))
        for e in journal.entries
    ) == recover(journal.entries)


def test_an_empty_journal_recovers_nothing() -> None:
    assert recover([]) is None
