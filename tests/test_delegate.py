"""Subagents: AgentTool runs a child agent as one tool [AP-41].

The acceptance cases of reference §1.23 (delegate) ported, plus usage reporting and cancellation.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Iterator
from typing import Any

import pytest

from agent_plugin.agent import Agent
from agent_plugin.cancellation import CancelToken
from agent_plugin.delegate import APPROVAL_NEEDED, STOPPED_EARLY, AgentTool, child_usage_sink
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.hooks import AgentHooks, PauseRun, RunControl
from agent_plugin.messages import ChatMessage, Role, TokenUsage, ToolResultPart
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import BudgetExhausted, Cancelled, Completed, RunInfo
from agent_plugin.policy import ToolRules
from agent_plugin.providers.base import ChatRequest, ChatResponse
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.tools import FnTool, Tool, ToolContext, ToolEffect, canonical_json

CTX = ToolContext(run_id="parent", call_id="call-1")
USAGE = TokenUsage(input_tokens=10, output_tokens=5)


def weather_tool(effect: ToolEffect = ToolEffect.READ_ONLY) -> FnTool:
    return FnTool(
        "get_weather",
        "Weather for a city",
        {"type": "object", "properties": {"city": {"type": "string"}}},
        lambda args: "sunny",
        effect=effect,
    )


def helper(child: Agent, **kwargs: Any) -> AgentTool:
    return AgentTool(child, name="helper", description="Delegate a research task.", **kwargs)


def results_of(message: ChatMessage) -> list[tuple[str, bool]]:
    assert message.role is Role.TOOL
    return [
        (p.tool_result.content, p.tool_result.is_error)
        for p in message.content
        if isinstance(p, ToolResultPart)
    ]


@pytest.fixture
def usage_sink() -> Iterator[list[TokenUsage]]:
    reported: list[TokenUsage] = []
    token = child_usage_sink.set(reported.append)
    yield reported
    child_usage_sink.reset(token)


def test_declaration() -> None:
    tool = helper(Agent(ScriptedModel()))
    assert isinstance(tool, Tool)
    assert tool.name == "helper"
    assert tool.description == "Delegate a research task."
    assert tool.effect is ToolEffect.WRITE
    assert tool.sequential is False
    assert tool.input_schema["required"] == ["task"]
    schema: Any = tool.input_schema
    task = schema["properties"]["task"]
    assert "cannot see this conversation" in task["description"]
    assert helper(Agent(ScriptedModel()), effect="read_only").effect is ToolEffect.READ_ONLY
    for bad in ({"name": "has space"}, {"name": ""}, {"name": "x", "effect": "explosive"}):
        kwargs: dict[str, Any] = {"description": "d", "name": "helper", **bad}
        with pytest.raises(AgentError) as excinfo:
            AgentTool(Agent(ScriptedModel()), **kwargs)
        assert excinfo.value.kind is ErrorKind.CONFIG


async def test_child_answer_comes_back_as_the_tool_result() -> None:
    child_model = ScriptedModel(["The answer is 42."])
    child = Agent(child_model, system_prompt="You are a careful researcher.")
    parent_model = ScriptedModel(
        [tool_call("helper", {"task": "  find the answer  "}, id="h1"), "It is 42."]
    )
    parent = Agent(parent_model, tools=[helper(child)], system_prompt="You are the lead.")

    turn = await parent.run("what is the answer?")

    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "It is 42."
    assert results_of(turn.messages[2]) == [
        (canonical_json({"answer": "The answer is 42.", "tokens": 15}), False)
    ]
    # the child saw exactly its system prompt and the task: none of the parent's conversation
    assert len(child_model.requests) == 1
    assert child_model.requests[0].messages == [
        ChatMessage.system("You are a careful researcher."),
        ChatMessage.user("find the answer"),
    ]
    # and the child's transcript never enters the parent's
    assert len(turn.messages) == 4
    assert all("careful researcher" not in m.model_dump_json() for m in turn.messages)


async def test_bad_input_and_stopped_children_report_errors() -> None:
    tool = helper(Agent(ScriptedModel()))
    bad_inputs: list[Any] = [{}, {"task": "   "}, {"task": 3}, None, "do it"]
    for bad in bad_inputs:
        with pytest.raises(AgentError) as excinfo:
            await tool.execute(bad, CTX)
        assert excinfo.value.kind is ErrorKind.TOOL
        assert excinfo.value.message == "give the `task` to delegate"

    # a child that runs out of steps
    child_model = ScriptedModel([tool_call("get_weather", {}), tool_call("get_weather", {})])
    child = Agent(child_model, tools=[weather_tool()], max_steps=1)
    result = await helper(child).execute({"task": "check twice"}, CTX)
    assert result == {
        "error": STOPPED_EARLY,
        "outcome": {
            "status": "budget_exhausted",
            "reason": "steps",
            "steps_used": 1,
            "usage": {
                "input_tokens": 10,
                "output_tokens": 5,
                "cache_read_tokens": 0,
                "cache_write_tokens": 0,
            },
        },
    }
    assert STOPPED_EARLY == "the helper stopped before it finished"


async def test_a_child_that_needs_approval_reports_it() -> None:
    child_model = ScriptedModel([tool_call("get_weather", {"city": "Oslo"})])
    child = Agent(
        child_model,
        tools=[weather_tool(ToolEffect.WRITE)],
        policy=ToolRules.ask_before_acting(),
    )
    result = await helper(child).execute({"task": "change the weather"}, CTX)
    assert result == {"error": APPROVAL_NEEDED}
    assert APPROVAL_NEEDED == "the helper needs a person to approve an action; do it another way"


async def test_a_paused_child_reports_its_outcome_without_its_transcript() -> None:
    class PauseFirst(AgentHooks):
        async def before_model(self, request: ChatRequest, info: RunInfo) -> RunControl | None:
            return PauseRun("wait for the nightly window")

    child = Agent(ScriptedModel(), hooks=[PauseFirst()])
    result = await helper(child).execute({"task": "secret task text"}, CTX)
    assert result == {
        "error": STOPPED_EARLY,
        "outcome": {"status": "paused", "reason": "wait for the nightly window"},
    }
    assert "secret task text" not in canonical_json(result)


async def test_child_failures_reach_the_parent_model() -> None:
    child_model = ScriptedModel(
        [tool_call("get_weather", {}), AgentError(ErrorKind.PROVIDER, "the helper's model broke")]
    )
    child = Agent(child_model, tools=[weather_tool()])
    parent_model = ScriptedModel([tool_call("helper", {"task": "look it up"}), "Sorry."])
    parent = Agent(parent_model, tools=[helper(child)])

    turn = await parent.run("go")

    assert isinstance(turn.outcome, Completed)
    assert results_of(turn.messages[2]) == [
        (canonical_json({"error": "the helper's model broke"}), True)
    ]
    # the tokens the failed child spent before it broke still count for the parent run
    assert turn.outcome.usage == USAGE + USAGE + USAGE


async def test_the_child_usage_is_reported_to_the_sink(usage_sink: list[TokenUsage]) -> None:
    child = Agent(ScriptedModel([tool_call("get_weather", {}), "sunny"]), tools=[weather_tool()])
    result = await helper(child).execute({"task": "weather?"}, CTX)
    assert result == {"answer": "sunny", "tokens": 30}
    assert usage_sink == [USAGE + USAGE]

    # no sink set: nothing to report to, and nothing fails
    reported_before = list(usage_sink)
    result = await contextvars.Context().run(
        asyncio.ensure_future, helper(Agent(ScriptedModel(["ok"]))).execute({"task": "t"}, CTX)
    )
    assert result == {"answer": "ok", "tokens": 15}
    assert usage_sink == reported_before


async def test_a_grandchild_reports_to_its_own_parent() -> None:
    grandchild = Agent(ScriptedModel(["deep answer"]))
    child_model = ScriptedModel([tool_call("helper", {"task": "go deeper"}), "relayed"])
    child = Agent(child_model, tools=[helper(grandchild)])
    parent_model = ScriptedModel([tool_call("helper", {"task": "ask around"}), "done"])
    parent = Agent(parent_model, tools=[helper(child)])

    turn = await parent.run("go")

    assert isinstance(turn.outcome, Completed)
    # the grandchild (1 reply) counts for the child (2 replies), the child for the parent (2)
    assert turn.outcome.usage == USAGE + USAGE + USAGE + USAGE + USAGE
    assert child_usage_sink.get() is None  # every round restored the sink it found


async def test_cancelling_the_parent_cancels_the_child() -> None:
    child_started = asyncio.Event()
    child_cancelled = asyncio.Event()

    async def slow_reply(request: ChatRequest) -> str:
        child_started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            child_cancelled.set()
            raise
        return "too late"

    child_model = ScriptedModel([slow_reply])
    child = Agent(child_model)
    parent_model = ScriptedModel([tool_call("helper", {"task": "take your time"}), "unused"])
    parent = Agent(parent_model, tools=[helper(child)])
    token = CancelToken()

    run = asyncio.create_task(parent.run("go", options=RunOptions(cancel=token)))
    await asyncio.wait_for(child_started.wait(), 5)
    token.cancel("the user left")
    outcome = (await asyncio.wait_for(run, 5)).outcome

    assert isinstance(outcome, Cancelled)
    assert outcome.reason == "the user left"
    assert child_cancelled.is_set()
    assert len(child_model.requests) == 1
    assert len(parent_model.requests) == 1  # the parent never asked the model again
    assert outcome.usage == USAGE  # the child got no response, so it spent nothing


async def test_parallel_helpers_run_together() -> None:
    running = 0
    most = 0

    async def reply(request: ChatRequest) -> str:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.05)
        running -= 1
        return "ok"

    child = Agent(ScriptedModel(default=reply))
    parent_model = ScriptedModel(
        [[tool_call("helper", {"task": "a"}), tool_call("helper", {"task": "b"})], "both done"]
    )
    parent = Agent(parent_model, tools=[helper(child)])
    outcome = (await parent.run("go")).outcome
    assert isinstance(outcome, Completed)
    assert most == 2
    assert outcome.usage == USAGE + USAGE + USAGE + USAGE


async def test_the_child_usage_counts_against_the_parent_budget() -> None:
    big = ChatResponse.model_validate(
        {"content": [{"text": "long research"}], "usage": {"input_tokens": 31_000}}
    )
    child = Agent(ScriptedModel([big]))
    parent_model = ScriptedModel([tool_call("helper", {"task": "research"}), "never asked"])
    parent = Agent(parent_model, tools=[helper(child)], max_tokens=31_500)
    outcome = (await parent.run("go")).outcome
    assert isinstance(outcome, BudgetExhausted)
    assert outcome.reason == "tokens"
    assert len(parent_model.requests) == 1
