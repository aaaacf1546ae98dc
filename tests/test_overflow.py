"""Compaction on context overflow, on request and before a session's run: when it happens
[OP-25] and what it leaves, on both wires through the real clients (the model's context
error is a recorded body), with one ``compaction`` event for every compaction."""

from __future__ import annotations

from typing import Any

import pytest

from agent_plugin import sessions
from agent_plugin.agent import Agent
from agent_plugin.compaction import SUMMARY_PREFIX, Compaction
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import AgentEvent, Compacted, event_adapter
from agent_plugin.messages import ChatMessage
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import ApprovalDecision, Approve, AwaitingApproval, Completed, RunState
from agent_plugin.policy import ToolRules
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.sessions import CompactionEntry, InMemorySessionStore, MessageEntry
from agent_plugin.tools import FnTool, ToolEffect
from tests.wire_agent import (
    TOO_LONG,
    WIRES,
    Recorder,
    Wire,
    client,
    recorded,
    text_reply,
)

HISTORY = [
    ChatMessage.user("first question about the Oslo office"),
    ChatMessage.assistant("first answer: the Oslo office opens at nine"),
    ChatMessage.user("second question about the Bergen office"),
    ChatMessage.assistant("second answer: the Bergen office opens at ten"),
]
NEVER_BY_SIZE = Compaction(trigger_tokens=1_000_000, keep_recent_tokens=1)


async def seeded(history: list[ChatMessage] = HISTORY) -> InMemorySessionStore:
    store = InMemorySessionStore()
    await store.append("s1", history, expected_version=0)
    return store


def sent_texts(wire: Wire, body: dict[str, Any]) -> list[str]:
    """The texts of a request's messages (not the system prompt), in order."""
    out: list[str] = []
    for message in body["messages"]:
        if message.get("role") in ("system", "developer"):
            continue
        content = message["content"]
        if isinstance(content, str):
            out.append(content)
        else:
            out.append("".join(b.get("text", "") for b in content if isinstance(b, dict)))
    return out


def compactions(events: list[AgentEvent]) -> list[Compacted]:
    return [e for e in events if isinstance(e, Compacted)]


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("wire", WIRES)
async def test_op25_a_context_overflow_folds_the_history_and_asks_once_more(
    wire: Wire, streamed: bool
) -> None:
    store = await seeded()
    sent = Recorder()
    replies = [
        recorded(TOO_LONG[wire]),
        text_reply(wire, "Offices: Oslo opens at nine, Bergen at ten."),  # the summary call
        text_reply(wire, "Stavanger opens at eight."),
    ]
    agent = Agent(client(wire, replies, sent), compaction=NEVER_BY_SIZE)
    events: list[AgentEvent] = []
    options = RunOptions(on_event=events.append, stream=streamed)
    turn = await sessions.run(agent, "and Stavanger?", session="s1", store=store, options=options)
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "Stavanger opens at eight."
    (event,) = compactions(events)
    assert (event.reason, event.summarized_messages) == ("overflow", 4)
    assert event.run_id == events[0].run_id
    assert event.session_id == "s1"
    assert event.tokens_after < event.tokens_before
    order = [e.type for e in events]
    assert order.index("model_request") < order.index("compaction") < order.index("model_response")
    assert order.count("model_request") == 1  # the same call, asked once more
    # the summary call saw the history; the call asked again carries the summary instead
    summary_request = "\n".join(sent_texts(wire, sent.json(1)))
    assert "first question about the Oslo office" in summary_request
    assert sent_texts(wire, sent.json(2)) == [
        SUMMARY_PREFIX + "Offices: Oslo opens at nine, Bergen at ten.",
        "and Stavanger?",
    ]
    assert sent.json(2)["messages"][-1] == sent.json(0)["messages"][-1]
    # the session keeps every message and says where the view begins
    entries = await store.entries("s1")
    kinds = [e.kind for e in entries]
    assert kinds == ["message"] * 6 + ["compaction"]
    compaction = entries[6]
    assert isinstance(compaction, CompactionEntry)
    assert compaction.first_kept_seq == 5  # the turn's prompt
    view = await store.load("s1")
    assert [m.text for m in view.messages] == [
        SUMMARY_PREFIX + "Offices: Oslo opens at nine, Bergen at ten.",
        "and Stavanger?",
        "Stavanger opens at eight.",
    ]
    assert turn.folded is not None
    assert turn.folded.report.summarized_messages == 4
    assert turn.session_version == view.version == 7


async def test_op25_the_kept_tail_of_the_history_stays() -> None:
    store = await seeded()
    model = ScriptedModel([AgentError(ErrorKind.CONTEXT_TOO_LONG, "too long"), "sum", "ok"])
    compaction = Compaction(trigger_tokens=1_000_000, keep_recent_tokens=40)
    turn = await sessions.run(
        Agent(model, compaction=compaction), "third", session="s1", store=store
    )
    assert turn.folded is not None
    assert turn.folded.report.summarized_messages == 2  # the second exchange fits in the tail
    retried = model.requests[-1].messages
    assert [m.text for m in retried] == [
        SUMMARY_PREFIX + "sum",
        "second question about the Bergen office",
        "second answer: the Bergen office opens at ten",
        "third",
    ]
    (compaction_entry,) = [e for e in await store.entries("s1") if e.kind == "compaction"]
    assert isinstance(compaction_entry, CompactionEntry)
    assert compaction_entry.first_kept_seq == 3


@pytest.mark.parametrize("wire", WIRES)
async def test_op25_a_second_overflow_of_the_same_call_is_raised(wire: Wire) -> None:
    store = await seeded()
    sent = Recorder()
    replies = [recorded(TOO_LONG[wire]), text_reply(wire, "summary"), recorded(TOO_LONG[wire])]
    agent = Agent(client(wire, replies, sent), compaction=NEVER_BY_SIZE)
    events: list[AgentEvent] = []
    with pytest.raises(AgentError) as caught:
        await sessions.run(
            agent, "go", session="s1", store=store, options=RunOptions(on_event=events.append)
        )
    assert caught.value.kind is ErrorKind.CONTEXT_TOO_LONG
    assert len(sent.bodies) == 3
    assert len(compactions(events)) == 1
    assert events[-1].type == "run_end"
    assert [e.kind for e in await store.entries("s1")] == ["message"] * 4  # nothing saved


@pytest.mark.parametrize("wire", WIRES)
async def test_op25_without_compaction_settings_an_overflow_is_raised_at_once(wire: Wire) -> None:
    store = await seeded()
    sent = Recorder()
    agent = Agent(client(wire, [recorded(TOO_LONG[wire])], sent))
    with pytest.raises(AgentError) as caught:
        await sessions.run(agent, "go", session="s1", store=store)
    assert caught.value.kind is ErrorKind.CONTEXT_TOO_LONG
    assert len(sent.bodies) == 1  # no summary call


@pytest.mark.parametrize("wire", WIRES)
async def test_op25_a_run_local_compaction_recovers_a_plain_run(wire: Wire) -> None:
    sent = Recorder()
    replies = [recorded(TOO_LONG[wire]), text_reply(wire, "summary"), text_reply(wire, "answer")]
    agent = Agent(client(wire, replies, sent))
    turn = await agent.run("go", history=HISTORY, options=RunOptions(compaction=NEVER_BY_SIZE))
    assert isinstance(turn.outcome, Completed)
    assert [m.text for m in turn.messages] == [SUMMARY_PREFIX + "summary", "go", "answer"]
    assert turn.history_length == 1
    assert [m.text for m in turn.new_messages] == ["go", "answer"]


async def test_op25_a_run_with_no_history_has_nothing_to_fold() -> None:
    model = ScriptedModel([AgentError(ErrorKind.CONTEXT_TOO_LONG, "too long")])
    agent = Agent(model, compaction=NEVER_BY_SIZE)
    with pytest.raises(AgentError) as caught:
        await agent.run("a very long task")
    assert caught.value.kind is ErrorKind.CONTEXT_TOO_LONG
    assert len(model.requests) == 1  # the run's own messages are never folded


async def test_op25_a_summary_call_that_fails_raises_the_overflow() -> None:
    store = await seeded()
    model = ScriptedModel(
        [
            AgentError(ErrorKind.CONTEXT_TOO_LONG, "too long"),
            AgentError(ErrorKind.UNAVAILABLE, "down"),
        ]
    )
    with pytest.raises(AgentError) as caught:
        await sessions.run(Agent(model, compaction=NEVER_BY_SIZE), "go", session="s1", store=store)
    assert caught.value.kind is ErrorKind.CONTEXT_TOO_LONG


async def test_op25_a_folded_run_that_pauses_saves_its_compaction_when_resumed() -> None:
    store = await seeded()
    act = FnTool("act", "acts", {"type": "object"}, lambda args: "acted", effect=ToolEffect.WRITE)
    model = ScriptedModel(
        [
            AgentError(ErrorKind.CONTEXT_TOO_LONG, "too long"),
            "summary",
            tool_call("act", {}),
            "done",
        ]
    )
    agent = Agent(
        model, tools=[act], policy=ToolRules.ask_before_acting(), compaction=NEVER_BY_SIZE
    )
    turn = await sessions.run(agent, "do it", session="s1", store=store)
    outcome = turn.outcome
    assert isinstance(outcome, AwaitingApproval)
    state = RunState.model_validate_json(outcome.state.model_dump_json())  # as a worker keeps it
    assert state.folded is not None
    assert [e.kind for e in await store.entries("s1")] == ["message"] * 4  # a pause saves nothing
    call_id = state.awaiting()[0].call.id
    resumed = await sessions.resume(
        agent, state, [ApprovalDecision(call_id=call_id, approval=Approve())], store=store
    )
    assert isinstance(resumed.outcome, Completed)
    entries = await store.entries("s1")
    assert [e.kind for e in entries][4:] == ["message"] * 4 + ["compaction"]
    view = await store.load("s1")
    assert view.messages[0].text == SUMMARY_PREFIX + "summary"
    assert view.messages[1].text == "do it"
    assert isinstance(entries[-2], MessageEntry)
    assert entries[-2].message.text == "done"
    assert view.messages[-1].text == "done"


# --- the other two triggers -----------------------------------------------------------------


async def test_op25_a_session_past_its_trigger_is_compacted_before_the_run_with_an_event() -> None:
    long_history = [ChatMessage.user("x" * 400), ChatMessage.assistant("y" * 400)] * 3
    store = await seeded(long_history)
    model = ScriptedModel(["the summary", "answer"])
    agent = Agent(model, compaction=Compaction(trigger_tokens=300, keep_recent_tokens=250))
    events: list[AgentEvent] = []
    turn = await sessions.run(
        agent, "go", session="s1", store=store, options=RunOptions(on_event=events.append)
    )
    assert isinstance(turn.outcome, Completed)
    assert isinstance(turn, sessions.SessionTurn)
    assert turn.compaction is not None
    (event,) = compactions(events)
    assert event.reason == "threshold"
    assert event.summarized_messages == turn.compaction.summarized_messages
    assert [e.type for e in events][:2] == ["compaction", "run_start"]
    assert event.run_id == events[1].run_id  # named after the run it came before


async def test_op25_a_session_within_its_trigger_is_not_compacted() -> None:
    store = await seeded()
    model = ScriptedModel(["answer"])
    events: list[AgentEvent] = []
    await sessions.run(
        Agent(model, compaction=NEVER_BY_SIZE),
        "go",
        session="s1",
        store=store,
        options=RunOptions(on_event=events.append),
    )
    assert compactions(events) == []
    assert len(model.requests) == 1


async def test_op25_manual_compaction_ignores_the_trigger_and_reports_an_event() -> None:
    store = await seeded()
    model = ScriptedModel(["the summary"])
    agent = Agent(model, compaction=Compaction(trigger_tokens=1_000_000, keep_recent_tokens=30))
    events: list[AgentEvent] = []
    report = await sessions.compact(agent, "s1", store=store, on_event=events.append)
    assert report is not None
    (event,) = compactions(events)
    assert (event.reason, event.run_id, event.session_id) == ("manual", None, "s1")
    assert event.summarized_messages == report.summarized_messages == 2
    view = await store.load("s1")
    assert view.messages[0].text == SUMMARY_PREFIX + "the summary"
    # not forced, the trigger decides: nothing to do
    assert await sessions.compact(agent, "s1", store=store, force=False) is None


async def test_op25_the_compaction_event_round_trips_as_json() -> None:
    event = Compacted(
        run_id=None,
        session_id="s1",
        reason="manual",
        summarized_messages=2,
        tokens_before=40,
        tokens_after=12,
    )
    assert event_adapter.validate_json(event_adapter.dump_json(event)) == event
