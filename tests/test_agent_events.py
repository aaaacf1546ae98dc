"""Run events, streaming, cancellation, terminate, and hooks that pause or cancel a run."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agent_plugin import sessions
from agent_plugin.agent import Agent
from agent_plugin.cancellation import CancelToken
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import AgentEvent, RunEnded, event_adapter
from agent_plugin.hooks import AgentHooks, CancelRun, PauseRun, RunControl, ToolHookResult
from agent_plugin.messages import ChatMessage, Role, ToolCall, ToolResultPart
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import (
    AwaitingApproval,
    Cancelled,
    Completed,
    Paused,
    RunInfo,
    RunState,
)
from agent_plugin.policy import ToolRules
from agent_plugin.providers.base import ChatRequest, ChatResponse
from agent_plugin.providers.retry import RetryNotice
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.steering import Steering
from agent_plugin.tools import FnTool, ToolContext, ToolEffect, ToolReturn

ECHO = FnTool("echo", "echoes", {"type": "object"}, lambda args: args)


def types(events: list[AgentEvent]) -> list[str]:
    return [e.type for e in events]


async def collect(agent: Agent, prompt: str, **kwargs: Any) -> tuple[list[AgentEvent], Any]:
    events: list[AgentEvent] = []
    turn = await agent.run(prompt, options=RunOptions(on_event=events.append, **kwargs))
    return events, turn


def results_of(message: ChatMessage) -> list[str]:
    return [p.tool_result.content for p in message.content if isinstance(p, ToolResultPart)]


# --- event order [OP-01, OP-02] ------------------------------------------------------------


async def test_event_order_without_tools() -> None:
    events, _ = await collect(Agent(ScriptedModel(["hi"])), "hello")
    assert types(events) == [
        "run_start",
        "turn_start",
        "model_request",
        "model_response",
        "run_end",
    ]


async def test_event_order_with_one_tool_round() -> None:
    model = ScriptedModel([tool_call("echo", {"x": 1}), "done"])
    events, _ = await collect(Agent(model, tools=[ECHO]), "go")
    assert types(events) == [
        "run_start",
        "turn_start",
        "model_request",
        "model_response",
        "tool_start",
        "tool_end",
        "turn_end",
        "turn_start",
        "model_request",
        "model_response",
        "run_end",
    ]
    end = events[-1]
    assert isinstance(end, RunEnded)
    assert isinstance(end.outcome, Completed)


async def test_parallel_round_starts_every_call_before_any_ends() -> None:
    model = ScriptedModel([[tool_call("echo", {"n": 1}), tool_call("echo", {"n": 2})], "done"])
    events, _ = await collect(Agent(model, tools=[ECHO]), "go")
    tool_events = [e.type for e in events if e.type in ("tool_start", "tool_end")]
    assert tool_events == ["tool_start", "tool_start", "tool_end", "tool_end"]


async def test_exactly_one_run_end_when_the_provider_fails() -> None:
    model = ScriptedModel([AgentError(ErrorKind.AUTHENTICATION, "bad key")])
    events: list[AgentEvent] = []
    with pytest.raises(AgentError):
        await Agent(model).run("go", options=RunOptions(on_event=events.append))
    ends = [e for e in events if isinstance(e, RunEnded)]
    assert len(ends) == 1
    assert ends[0].error is not None
    assert ends[0].error.kind is ErrorKind.AUTHENTICATION
    assert events[-1] is ends[0]


async def test_exactly_one_run_end_on_a_pause_and_on_its_resume() -> None:
    model = ScriptedModel([tool_call("act", id="a"), "ok"])
    act = FnTool("act", "acts", {"type": "object"}, lambda a: "acted", effect=ToolEffect.WRITE)
    agent = Agent(model, tools=[act], policy=ToolRules.ask_before_acting())
    events, turn = await collect(agent, "go")
    assert types(events)[-3:] == ["approval_required", "turn_end", "run_end"]
    assert isinstance(turn.outcome, AwaitingApproval)
    resumed: list[AgentEvent] = []
    from agent_plugin.outcomes import ApprovalDecision

    await agent.resume(
        turn.outcome.state,
        [ApprovalDecision.approve("a")],
        options=RunOptions(on_event=resumed.append),
    )
    assert types(resumed)[0] == "run_start"
    assert resumed[0].resumed  # type: ignore[union-attr]
    assert types(resumed).count("run_end") == 1


async def test_events_round_trip_as_json_tagged_by_type() -> None:
    model = ScriptedModel([tool_call("echo", {"x": 1}), "done"])
    events, _ = await collect(Agent(model, tools=[ECHO]), "go")
    for event in events:
        data = event.model_dump_json()
        assert json.loads(data)["type"] == event.type
        assert event_adapter.validate_json(data).model_dump() == event.model_dump()
    end = events[-1]
    assert isinstance(end, RunEnded)
    assert end.outcome is not None  # in process: the whole outcome
    assert "outcome" not in json.loads(end.model_dump_json())  # across processes: the summary
    assert end.summary is not None
    assert end.summary.text == "done"


async def test_tool_arguments_are_redacted_in_events_but_not_for_the_tool() -> None:
    secret = "sk-ant-" + "a" * 30
    seen: list[Any] = []
    login = FnTool("login", "logs in", {"type": "object"}, lambda a: seen.append(a) or "ok")
    model = ScriptedModel(
        [tool_call("login", {"user": "kari", "password": "hunter2", "note": secret}), "in"]
    )
    events, turn = await collect(Agent(model, tools=[login]), "go")
    dumped = "".join(e.model_dump_json() for e in events)
    assert "hunter2" not in dumped
    assert secret not in dumped
    assert seen == [{"user": "kari", "password": "hunter2", "note": secret}]
    assert "hunter2" in turn.messages[1].model_dump_json()  # the transcript is untouched


async def test_a_paused_run_end_event_carries_no_transcript_or_secret() -> None:
    send = FnTool("send", "sends", {"type": "object"}, lambda a: "sent", effect=ToolEffect.WRITE)
    model = ScriptedModel([tool_call("send", {"to": "kari", "password": "hunter2"}, id="s1")])
    agent = Agent(model, tools=[send], policy=ToolRules.ask_before_acting())
    events, turn = await collect(agent, "go")
    assert isinstance(turn.outcome, AwaitingApproval)
    published = "".join(e.model_dump_json() for e in events)
    assert "hunter2" not in published
    end = events[-1]
    assert isinstance(end, RunEnded)
    assert end.summary is not None
    assert [a.call_id for a in end.summary.awaiting] == ["s1"]
    assert end.outcome == turn.outcome


# --- streaming -----------------------------------------------------------------------------


async def test_stream_yields_text_deltas_and_ends_with_the_outcome() -> None:
    model = ScriptedModel([tool_call("echo", {"x": 1}), "all done"])
    events = [e async for e in Agent(model, tools=[ECHO]).stream("go")]
    assert "text_delta" in types(events)
    assert "".join(e.text for e in events if e.type == "text_delta") == "all done"  # type: ignore[union-attr]
    assert "tool_call_delta" in types(events)
    last = events[-1]
    assert isinstance(last, RunEnded)
    assert isinstance(last.outcome, Completed)


async def test_leaving_a_stream_early_cancels_the_run() -> None:
    started = asyncio.Event()
    stopped = asyncio.Event()

    async def slow(args: Any) -> Any:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.set()
        return "never"

    model = ScriptedModel([tool_call("slow")])
    agent = Agent(model, tools=[FnTool("slow", "s", {"type": "object"}, slow)])
    stream = agent.stream("go")
    async for event in stream:
        if event.type == "tool_start":
            break
    await started.wait()
    await stream.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(stopped.wait(), 1)


async def test_retries_are_events() -> None:
    events: list[AgentEvent] = []

    class RetryingModel(ScriptedModel):
        async def chat(self, request: ChatRequest) -> ChatResponse:
            assert request.on_retry is not None
            error = AgentError(ErrorKind.RATE_LIMITED, "slow down", retry_after=0.0)
            request.on_retry(RetryNotice(1, 4, 0.0, error))
            return await super().chat(request)

    await Agent(RetryingModel(["ok"])).run("go", options=RunOptions(on_event=events.append))
    retry = next(e for e in events if e.type == "retry")
    assert retry.attempt == 1  # type: ignore[union-attr]
    assert retry.error.kind is ErrorKind.RATE_LIMITED  # type: ignore[union-attr]
    assert types(events).index("retry") < types(events).index("model_response")


# --- cancellation [OP-15, AG-12] -----------------------------------------------------------


async def test_cancel_before_the_first_turn() -> None:
    token = CancelToken()
    token.cancel("user left")
    model = ScriptedModel(["never"])
    events, turn = await collect(Agent(model), "go", cancel=token)
    assert isinstance(turn.outcome, Cancelled)
    assert turn.outcome.reason == "user left"
    assert model.requests == []
    assert types(events) == ["run_start", "run_end"]


async def test_cancel_while_the_model_streams_records_no_partial_message() -> None:
    token = CancelToken()

    async def hang(request: ChatRequest) -> str:
        token.cancel()
        await asyncio.sleep(3600)
        return "never"

    agent = Agent(ScriptedModel([tool_call("echo", {"x": 1}), hang]), tools=[ECHO])
    turn = await agent.run("go", options=RunOptions(cancel=token, stream=True))
    assert isinstance(turn.outcome, Cancelled)
    assert [m.role for m in turn.messages] == [Role.USER, Role.ASSISTANT, Role.TOOL]


async def test_cancel_during_a_round_gives_unfinished_calls_an_unknown_outcome() -> None:
    token = CancelToken()

    async def slow(args: Any) -> Any:
        token.cancel()
        await asyncio.sleep(3600)
        return "never"

    model = ScriptedModel([[tool_call("echo", {"x": 1}, id="fast"), tool_call("slow", id="slow")]])
    agent = Agent(model, tools=[ECHO, FnTool("slow", "s", {"type": "object"}, slow)])
    turn = await agent.run("go", options=RunOptions(cancel=token))
    assert isinstance(turn.outcome, Cancelled)
    results = results_of(turn.messages[-1])
    assert results[0] == '{"x":1}'
    assert "unknown" in json.loads(results[1])["error"]
    assert turn.outcome.steps_used == 1


async def test_cancel_during_a_sequential_round_answers_the_rest() -> None:
    token = CancelToken()

    async def slow(args: Any) -> Any:
        token.cancel()
        await asyncio.sleep(3600)

    model = ScriptedModel([[tool_call("slow", id="a"), tool_call("echo", {"x": 1}, id="b")]])
    agent = Agent(
        model,
        tools=[ECHO, FnTool("slow", "s", {"type": "object"}, slow)],
        parallel_tool_calls=False,
    )
    turn = await agent.run("go", options=RunOptions(cancel=token))
    assert isinstance(turn.outcome, Cancelled)
    results = [json.loads(r)["error"] for r in results_of(turn.messages[-1])]
    assert "unknown" in results[0]
    assert "before this call ran" in results[1]


# --- terminate [OP-08] ---------------------------------------------------------------------


async def test_a_round_whose_every_result_terminates_ends_the_run() -> None:
    final = FnTool(
        "final", "answers", {"type": "object"}, lambda a: ToolReturn(a["answer"], terminate=True)
    )
    model = ScriptedModel([tool_call("final", {"answer": "42"}), "never asked"])
    turn = await Agent(model, tools=[final]).run("go")
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "42"
    assert len(model.requests) == 1


async def test_one_non_terminating_result_continues() -> None:
    final = FnTool(
        "final", "answers", {"type": "object"}, lambda a: ToolReturn("x", terminate=True)
    )
    model = ScriptedModel([[tool_call("final"), tool_call("echo", {})], "went on"])
    turn = await Agent(model, tools=[final, ECHO]).run("go")
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "went on"


# --- hooks at the boundaries [AG-03, AG-05..AG-07] -----------------------------------------


class StopOnce(AgentHooks):
    def __init__(self, where: str, control: RunControl) -> None:
        self.where = where
        self.control = control
        self.fired = False

    def once(self, where: str) -> RunControl | None:
        if where == self.where and not self.fired:
            self.fired = True
            return self.control
        return None

    async def before_model(self, request: ChatRequest, info: RunInfo) -> RunControl | None:
        return self.once("before_model")

    async def after_model(self, response: ChatResponse, info: RunInfo) -> RunControl | None:
        return self.once("after_model")

    async def before_tool(self, call: ToolCall, ctx: ToolContext) -> ToolHookResult | None:
        return self.once("before_tool")


@pytest.mark.parametrize("where", ["before_model", "after_model", "before_tool"])
@pytest.mark.parametrize("parallel", [True, False])
async def test_a_hook_pause_resumes_without_a_new_user_message(where: str, parallel: bool) -> None:
    ran: list[Any] = []
    counter = FnTool("count", "counts", {"type": "object"}, lambda a: ran.append(a) or len(ran))
    model = ScriptedModel([[tool_call("count", {"n": 1}), tool_call("count", {"n": 2})], "done"])
    agent = Agent(
        model,
        tools=[counter],
        hooks=[StopOnce(where, PauseRun("wait for the operator"))],
        parallel_tool_calls=parallel,
    )
    outcome = (await agent.run("go")).outcome
    assert isinstance(outcome, Paused)
    assert outcome.reason == "wait for the operator"
    state = RunState.model_validate_json(outcome.state.model_dump_json())
    if where == "before_model":
        assert model.requests == []
    turn = await agent.resume(state)
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "done"
    assert sorted(a["n"] for a in ran) == [1, 2]  # every call ran exactly once
    assert [m.role for m in turn.messages] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]


async def test_a_sequential_pause_mid_round_keeps_finished_results() -> None:
    ran: list[Any] = []

    class PauseSecond(AgentHooks):
        paused = False

        async def before_tool(self, call: ToolCall, ctx: ToolContext) -> ToolHookResult | None:
            if call.id == "b" and not self.paused:
                self.paused = True
                return PauseRun("check b")
            return None

    counter = FnTool("count", "counts", {"type": "object"}, lambda a: ran.append(a) or len(ran))
    model = ScriptedModel(
        [[tool_call("count", {"n": 1}, id="a"), tool_call("count", {"n": 2}, id="b")], "done"]
    )
    agent = Agent(model, tools=[counter], hooks=[PauseSecond()], parallel_tool_calls=False)
    outcome = (await agent.run("go")).outcome
    assert isinstance(outcome, Paused)
    assert ran == [{"n": 1}]
    turn = await agent.resume(outcome.state)
    assert ran == [{"n": 1}, {"n": 2}]
    assert results_of(turn.messages[2]) == ["1", "2"]


@pytest.mark.parametrize("where", ["before_model", "after_model", "before_tool"])
async def test_a_hook_can_cancel_at_each_boundary(where: str) -> None:
    model = ScriptedModel([tool_call("echo", {"x": 1}), "done"])
    agent = Agent(model, tools=[ECHO], hooks=[StopOnce(where, CancelRun("stop now"))])
    turn = await agent.run("go")
    assert isinstance(turn.outcome, Cancelled)
    assert turn.outcome.reason == "stop now"
    # the transcript stays valid: every recorded call has a result
    roles = [m.role for m in turn.messages]
    if where == "before_model":
        assert roles == [Role.USER]
    else:
        assert roles == [Role.USER, Role.ASSISTANT, Role.TOOL]
        assert "before this call ran" in results_of(turn.messages[2])[0]


# --- steering [OP-11] ----------------------------------------------------------------------


async def test_a_steering_message_joins_before_the_next_model_request() -> None:
    steering = Steering()

    def slow_lookup(args: Any) -> Any:
        steering.send("also check Bergen")
        return "sunny"

    model = ScriptedModel([tool_call("look", {"city": "Oslo"}), "Oslo sunny; Bergen too"])
    agent = Agent(model, tools=[FnTool("look", "looks", {"type": "object"}, slow_lookup)])
    events, turn = await collect(agent, "Weather in Oslo?", steering=steering)
    second = model.requests[1].messages
    assert [m.role for m in second] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.USER]
    assert second[-1].text == "also check Bergen"
    steered = [e for e in events if e.type == "steered"]
    assert [e.messages for e in steered] == [["also check Bergen"]]  # type: ignore[union-attr]
    assert isinstance(turn.outcome, Completed)


async def test_steering_that_arrives_during_the_answer_wins() -> None:
    steering = Steering()

    async def answer_while_steered(request: ChatRequest) -> str:
        steering.send("wait, in Celsius please")
        return "It is 70 °F."

    model = ScriptedModel([answer_while_steered, "It is 21 °C."])
    turn = await Agent(model).run("Weather?", options=RunOptions(steering=steering))
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "It is 21 °C."
    assert [m.text for m in turn.messages] == [
        "Weather?",
        "It is 70 °F.",
        "wait, in Celsius please",
        "It is 21 °C.",
    ]


async def test_steered_messages_are_journaled() -> None:
    from agent_plugin.journal import InMemoryJournal, recover

    steering = Steering()
    steering.send("be brief")
    journal = InMemoryJournal()
    turn = await Agent(ScriptedModel(["ok"])).run(
        "hi", options=RunOptions(steering=steering, journal=journal)
    )
    state = recover(journal.entries)
    assert state is not None
    assert state.messages == turn.messages


async def test_a_session_run_takes_steering_and_saves_it() -> None:
    from agent_plugin.sessions import InMemorySessionStore

    steering = Steering()
    store = InMemorySessionStore()

    def lookup(args: Any) -> Any:
        steering.send("and tomorrow?")
        return "sunny"

    model = ScriptedModel([tool_call("look", {}), "Sunny today and tomorrow."])
    agent = Agent(model, tools=[FnTool("look", "looks", {"type": "object"}, lookup)])
    await sessions.run(
        agent, "Weather?", session="s1", store=store, options=RunOptions(steering=steering)
    )
    saved = [m.text for m in (await store.load("s1")).messages if m.role is Role.USER]
    assert saved == ["Weather?", "and tomorrow?"]
