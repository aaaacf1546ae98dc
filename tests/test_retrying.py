"""Every retry of a model call ends in an event: ``retry_succeeded`` or ``retry_exhausted``,
with the attempts and the time spent [OP-14], on both wires, whole and streamed; recorded
error bodies answer through the real clients."""

from __future__ import annotations

from typing import Any

import pytest

from agent_plugin.agent import Agent
from agent_plugin.cancellation import CancelToken
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import AgentEvent, RetryExhausted, RetryScheduled, RetrySucceeded, RunEnded
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import Cancelled, Completed
from agent_plugin.providers.retry import RetryPolicy
from agent_plugin.tools import FnTool
from tests.wire_agent import (
    RATE_LIMITED,
    UNAUTHORISED,
    UNAVAILABLE,
    WIRES,
    Recorder,
    Wire,
    client,
    recorded,
    text_reply,
    tool_reply,
)

FAST = RetryPolicy(max_attempts=3, base_delay=0.0, max_delay=0.0)


def kinds(events: list[AgentEvent]) -> list[str]:
    return [e.type for e in events]


async def run(agent: Agent, streamed: bool, **options: Any) -> tuple[Any, list[AgentEvent]]:
    events: list[AgentEvent] = []
    opts = RunOptions(on_event=events.append, **options)
    if streamed:
        async for _ in agent.stream("go", options=opts):
            pass
        end = events[-1]
        assert isinstance(end, RunEnded)
        return end.outcome, events
    return (await agent.run("go", options=opts)).outcome, events


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("wire", WIRES)
async def test_op14_a_call_that_succeeds_after_retries_ends_them_with_retry_succeeded(
    wire: Wire, streamed: bool
) -> None:
    sent = Recorder()
    replies = [
        recorded(RATE_LIMITED[wire], **{"retry-after": "0"}),
        recorded(UNAVAILABLE[wire]),
        text_reply(wire, "fine"),
    ]
    agent = Agent(client(wire, replies, sent, retry=FAST))
    outcome, events = await run(agent, streamed)
    assert isinstance(outcome, Completed)
    assert outcome.text == "fine"
    retries = [e for e in events if isinstance(e, RetryScheduled)]
    assert [(r.attempt, r.max_attempts) for r in retries] == [(1, 3), (2, 3)]
    assert [r.error.kind for r in retries] == [ErrorKind.RATE_LIMITED, ErrorKind.UNAVAILABLE]
    (end,) = [e for e in events if isinstance(e, RetrySucceeded)]
    assert end.attempts == 3 == len(sent.bodies)
    assert end.elapsed_seconds >= 0.0
    order = kinds(events)
    assert order.index("retry") < order.index("retry_succeeded") < order.index("model_response")
    assert "retry_exhausted" not in order


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("wire", WIRES)
async def test_op14_retries_that_run_out_end_with_retry_exhausted_and_the_error(
    wire: Wire, streamed: bool
) -> None:
    sent = Recorder()
    replies = [recorded(UNAVAILABLE[wire]) for _ in range(3)]
    agent = Agent(client(wire, replies, sent, retry=FAST))
    events: list[AgentEvent] = []
    with pytest.raises(AgentError) as caught:
        await _failing(agent, streamed, events)
    assert caught.value.kind is ErrorKind.UNAVAILABLE
    assert kinds(events).count("retry") == 2
    (end,) = [e for e in events if isinstance(e, RetryExhausted)]
    assert (end.attempts, end.reason) == (3, "error")
    assert end.error is not None
    assert end.error.kind is ErrorKind.UNAVAILABLE
    assert kinds(events)[-2:] == ["retry_exhausted", "run_end"]
    assert "retry_succeeded" not in kinds(events)


async def _failing(agent: Agent, streamed: bool, events: list[AgentEvent]) -> None:
    opts = RunOptions(on_event=events.append)
    if streamed:
        async for _ in agent.stream("go", options=opts):
            pass
    else:
        await agent.run("go", options=opts)


@pytest.mark.parametrize("wire", WIRES)
async def test_op14_a_retry_that_meets_an_error_not_worth_retrying_is_exhausted(wire: Wire) -> None:
    replies = [recorded(UNAVAILABLE[wire]), recorded(UNAUTHORISED[wire])]
    agent = Agent(client(wire, replies, Recorder(), retry=FAST))
    events: list[AgentEvent] = []
    with pytest.raises(AgentError) as caught:
        await _failing(agent, False, events)
    assert caught.value.kind is ErrorKind.AUTHENTICATION
    (end,) = [e for e in events if isinstance(e, RetryExhausted)]
    assert end.attempts == 2
    assert end.error is not None
    assert end.error.kind is ErrorKind.AUTHENTICATION


@pytest.mark.parametrize("wire", WIRES)
async def test_op14_a_call_that_never_retried_has_no_retry_events(wire: Wire) -> None:
    agent = Agent(client(wire, [recorded(UNAUTHORISED[wire])], Recorder(), retry=FAST))
    events: list[AgentEvent] = []
    with pytest.raises(AgentError):
        await _failing(agent, False, events)
    assert not {"retry", "retry_succeeded", "retry_exhausted"} & set(kinds(events))


@pytest.mark.parametrize("wire", WIRES)
async def test_op14_a_run_cancelled_during_the_backoff_ends_its_retries(wire: Wire) -> None:
    token = CancelToken()
    events: list[AgentEvent] = []

    def sink(event: AgentEvent) -> None:
        events.append(event)
        if isinstance(event, RetryScheduled):
            token.cancel("enough")

    # the server asks for a wait of 30 s: the run is cancelled while it waits
    replies = [recorded(RATE_LIMITED[wire], **{"retry-after": "30"})]
    agent = Agent(client(wire, replies, Recorder(), retry=FAST))
    outcome = (await agent.run("go", options=RunOptions(on_event=sink, cancel=token))).outcome
    assert isinstance(outcome, Cancelled)
    (end,) = [e for e in events if isinstance(e, RetryExhausted)]
    assert (end.attempts, end.reason, end.error) == (1, "cancelled", None)
    assert kinds(events)[-2:] == ["retry_exhausted", "run_end"]


async def test_op14_each_call_of_a_run_has_its_own_retries() -> None:
    wire: Wire = "openai"
    replies = [
        recorded(UNAVAILABLE[wire]),
        tool_reply(wire, "echo", {"x": 1}, "call_1"),
        recorded(UNAVAILABLE[wire]),
        recorded(UNAVAILABLE[wire]),
        text_reply(wire, "done"),
    ]
    echo = FnTool("echo", "echoes", {"type": "object"}, lambda args: args)
    agent = Agent(client(wire, replies, Recorder(), retry=FAST), tools=[echo])
    outcome, events = await run(agent, False)
    assert isinstance(outcome, Completed)
    ends = [e for e in events if isinstance(e, RetrySucceeded)]
    assert [e.attempts for e in ends] == [2, 3]
    assert [k for k in kinds(events) if k.startswith("retry")] == [
        "retry",
        "retry_succeeded",
        "retry",
        "retry",
        "retry_succeeded",
    ]
