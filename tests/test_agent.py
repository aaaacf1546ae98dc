"""The agent loop: the acceptance cases of reference §1.23 (autumn-plugin-agent), ported."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_plugin import sessions
from agent_plugin.agent import Agent
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.hooks import AgentHooks, Block, Modify, ToolHookResult, ToolOutput
from agent_plugin.loop_guard import LoopGuard
from agent_plugin.memory import InMemoryMemoryStore
from agent_plugin.messages import (
    ChatMessage,
    Role,
    TokenUsage,
    ToolCall,
    ToolResultPart,
    repair_transcript,
)
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import (
    AgentOutcome,
    ApprovalDecision,
    AwaitingApproval,
    BudgetExhausted,
    Completed,
    LoopDetected,
    RunInfo,
    RunState,
    outcome_adapter,
)
from agent_plugin.policy import ToolRules
from agent_plugin.providers.base import ChatRequest, ChatResponse
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.sessions import InMemorySessionStore
from agent_plugin.skills import Skill
from agent_plugin.tools import FnTool, ToolContext, ToolEffect, tool

WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
}


def weather_tool(effect: ToolEffect = ToolEffect.READ_ONLY) -> FnTool:
    async def get_weather(args: Any) -> Any:
        return f"sunny in {args.get('city', 'nowhere')}"

    return FnTool("get_weather", "Weather for a city", WEATHER_SCHEMA, get_weather, effect=effect)


def tool_results(message: ChatMessage) -> list[str]:
    assert message.role is Role.TOOL
    return [p.tool_result.content for p in message.content if isinstance(p, ToolResultPart)]


def completed(outcome: AgentOutcome) -> Completed:
    assert isinstance(outcome, Completed), outcome
    return outcome


async def test_tool_call_round_trip_completes() -> None:
    model = ScriptedModel([tool_call("get_weather", {"city": "Oslo"}), "It is sunny."])
    agent = Agent(model, tools=[weather_tool()])
    outcome = completed((await agent.run("Weather in Oslo?")).outcome)
    assert outcome.text == "It is sunny."
    assert outcome.steps_used == 1
    assert outcome.usage.input_tokens == 20
    assert len(model.requests) == 2
    second = model.requests[1].messages
    assert [m.role for m in second] == [Role.USER, Role.ASSISTANT, Role.TOOL]
    assert tool_results(second[2]) == ['"sunny in Oslo"']


async def test_a_direct_answer_uses_no_step() -> None:
    outcome = completed((await Agent(ScriptedModel(["hi"])).run("hello")).outcome)
    assert outcome.steps_used == 0


async def test_step_budget_exhausts() -> None:
    model = ScriptedModel([tool_call("get_weather"), tool_call("get_weather")])
    agent = Agent(model, tools=[weather_tool()], max_steps=1)
    outcome = (await agent.run("go")).outcome
    assert isinstance(outcome, BudgetExhausted)
    assert (outcome.reason, outcome.steps_used) == ("steps", 1)
    assert len(model.requests) == 1


async def test_token_budget_exhausts() -> None:
    model = ScriptedModel([tool_call("get_weather", {"city": str(i)}) for i in range(100)])
    agent = Agent(
        model,
        tools=[weather_tool()],
        max_tokens=600,
        max_steps=1000,
        loop_guard=LoopGuard.disabled(),
    )
    outcome = (await agent.run("go")).outcome
    assert isinstance(outcome, BudgetExhausted)
    assert outcome.reason == "tokens"
    assert outcome.usage.total() <= 600


async def test_token_overshoot_on_final_answer_exhausts() -> None:
    usage = TokenUsage(input_tokens=900, output_tokens=200)
    model = ScriptedModel(
        [ChatResponse.model_validate({"content": [{"text": "long"}], "usage": usage})]
    )
    turn = await Agent(model, max_tokens=1000).run("go")
    assert isinstance(turn.outcome, BudgetExhausted)
    assert turn.outcome.reason == "tokens"
    assert turn.outcome.usage.total() == 1100
    assert turn.messages[-1].text == "long"  # recorded, but reported as exhaustion


async def test_overshooting_tool_calls_are_not_recorded() -> None:
    usage = TokenUsage(input_tokens=900, output_tokens=200)
    reply = ChatResponse.model_validate(
        {
            "content": [{"tool_call": {"id": "c1", "name": "get_weather", "arguments": {}}}],
            "stop_reason": "tool_use",
            "usage": usage,
        }
    )
    turn = await Agent(ScriptedModel([reply]), tools=[weather_tool()], max_tokens=1000).run("go")
    assert isinstance(turn.outcome, BudgetExhausted)
    assert [m.role for m in turn.messages] == [Role.USER]


async def test_every_request_reserves_the_history_and_caps_the_output() -> None:
    model = ScriptedModel([tool_call("get_weather"), "done"])
    await Agent(model, tools=[weather_tool()], max_tokens=5000, system_prompt="sys").run("go")
    first, second = model.requests
    assert first.max_tokens == 4096  # min(remaining - history, 4096)
    assert second.max_tokens is not None
    assert second.max_tokens <= 5000 - 15 - 1


async def test_unknown_tool_reaches_the_model() -> None:
    model = ScriptedModel([tool_call("teleport"), "sorry"])
    turn = await Agent(model).run("go")
    assert completed(turn.outcome).text == "sorry"
    assert tool_results(turn.messages[2]) == ['{"error":"unknown tool \\"teleport\\""}']


async def test_tool_failure_reaches_the_model() -> None:
    def explode(args: Any) -> Any:
        raise AgentError(ErrorKind.TOOL, "kaput")

    broken = FnTool("broken", "fails", {"type": "object"}, explode)
    turn = await Agent(ScriptedModel([tool_call("broken"), "ok"]), tools=[broken]).run("go")
    content = tool_results(turn.messages[2])[0]
    assert json.loads(content) == {"error": "kaput"}
    assert turn.messages[2].content[0].tool_result.is_error  # type: ignore[union-attr]


async def test_tool_output_truncation_applies() -> None:
    long = FnTool("long", "long output", {"type": "object"}, lambda args: "x" * 100)
    agent = Agent(ScriptedModel([tool_call("long"), "ok"]), tools=[long], per_tool_output_limit=10)
    turn = await agent.run("go")
    content = tool_results(turn.messages[2])[0]
    assert "[truncated]" in content
    assert len(content) <= 40


async def test_invalid_argument_json_never_reaches_the_tool() -> None:
    seen: list[Any] = []
    permissive = FnTool("any", "accepts anything", {}, lambda args: seen.append(args) or "ran")
    bad = ToolCall(id="c1", name="any", raw_arguments='{"city": ')
    turn = await Agent(ScriptedModel([[bad], "ok"]), tools=[permissive]).run("go")
    content = json.loads(tool_results(turn.messages[2])[0])
    assert content["error"].startswith("tool arguments were not valid JSON: ")
    assert seen == []
    assert completed(turn.outcome).text == "ok"


async def test_schema_violations_never_reach_the_tool() -> None:
    calls: list[Any] = []

    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        calls.append((a, b))
        return a + b

    model = ScriptedModel([tool_call("add", {"a": 1}), tool_call("add", {"a": 1, "b": 2}), "3"])
    turn = await Agent(model, tools=[add]).run("go")
    first = json.loads(tool_results(turn.messages[2])[0])
    assert first["error"].startswith("schema validation failed: ")
    assert tool_results(turn.messages[4]) == ["3"]
    assert calls == [(1, 2)]


async def test_a_run_continues_a_transcript() -> None:
    model = ScriptedModel(["first answer", "second answer"])
    agent = Agent(model, system_prompt="be brief")
    first = await agent.run("one")
    second = await agent.run("two", history=first.messages)
    assert [m.role for m in model.requests[1].messages] == [
        Role.SYSTEM,
        Role.USER,
        Role.ASSISTANT,
        Role.USER,
    ]
    assert all(m.role is not Role.SYSTEM for m in second.messages)
    assert [m.text for m in second.messages] == [
        "one",
        "first answer",
        "two",
        "second answer",
    ]


async def test_a_broken_history_is_repaired_before_the_request() -> None:
    dangling = ChatMessage(
        role=Role.ASSISTANT,
        content=[{"tool_call": {"id": "x", "name": "get_weather"}}],  # type: ignore[list-item]
    )
    model = ScriptedModel(["fine"])
    await Agent(model).run("again", history=[ChatMessage.user("hi"), dangling])
    sent = model.requests[0].messages
    assert [m.role for m in sent] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.USER]


async def test_run_id_reaches_tools_and_hooks() -> None:
    seen: list[str] = []

    def whoami(args: Any, ctx: ToolContext) -> Any:
        return {"run": ctx.run_id, "call": ctx.call_id, "step": ctx.step}

    class Spy(AgentHooks):
        async def before_model(self, request: ChatRequest, info: RunInfo) -> None:
            seen.append(info.run_id)

    model = ScriptedModel([tool_call("whoami", id="c1"), "done"])
    agent = Agent(model, tools=[FnTool("whoami", "ids", {"type": "object"}, whoami)], hooks=[Spy()])
    turn = await agent.run("go", options=RunOptions(run_id="job-42"))
    assert tool_results(turn.messages[2]) == ['{"call":"c1","run":"job-42","step":0}']
    assert seen == ["job-42", "job-42"]


async def test_outcomes_round_trip_through_json() -> None:
    outcome = (await Agent(ScriptedModel(["hi"])).run("hello")).outcome
    data = outcome_adapter.dump_json(outcome)
    assert json.loads(data)["status"] == "completed"
    assert outcome_adapter.validate_json(data) == outcome


# --- approvals -----------------------------------------------------------------------------


def acting_tools(ran: list[Any]) -> list[FnTool]:
    def act(args: Any) -> Any:
        ran.append(args)
        return f"did {args.get('city')}"

    return [
        FnTool("act", "acts", WEATHER_SCHEMA, act, effect=ToolEffect.WRITE),
        FnTool("read", "reads", WEATHER_SCHEMA, lambda args: "data", effect=ToolEffect.READ_ONLY),
    ]


async def test_approval_pauses_then_resumes_on_approve() -> None:
    ran: list[Any] = []
    model = ScriptedModel([tool_call("act", {"city": "Oslo"}, id="a"), "Done"])
    agent = Agent(model, tools=acting_tools(ran), policy=ToolRules.ask_before_acting())
    outcome = (await agent.run("act now")).outcome
    assert isinstance(outcome, AwaitingApproval)
    assert ran == []
    assert outcome.state.steps_used == 1
    assert [p.call.id for p in outcome.state.awaiting()] == ["a"]

    state = RunState.model_validate_json(outcome.state.model_dump_json())
    assert state == outcome.state
    turn = await agent.resume(state, [ApprovalDecision.approve("a")])
    done = completed(turn.outcome)
    assert done.text == "Done"
    assert done.steps_used == 1
    assert ran == [{"city": "Oslo"}]
    assert turn.messages[-1].role is Role.ASSISTANT


async def test_rejected_edited_and_undecided_calls() -> None:
    ran: list[Any] = []
    model = ScriptedModel(
        [
            [
                tool_call("act", {"city": "Paris"}, id="a"),
                tool_call("act", {"city": "Rome"}, id="b"),
                tool_call("act", {"city": "Nice"}, id="c"),
                tool_call("read", {}, id="d"),
            ],
            "ok",
        ]
    )
    agent = Agent(model, tools=acting_tools(ran), policy=ToolRules.ask_before_acting())
    outcome = (await agent.run("go")).outcome
    assert isinstance(outcome, AwaitingApproval)
    assert len(outcome.state.awaiting()) == 3
    turn = await agent.resume(
        outcome.state,
        [ApprovalDecision.reject("a", "not today"), ApprovalDecision.edit("b", {"city": "Oslo"})],
    )
    assert ran == [{"city": "Oslo"}]
    results = tool_results(turn.messages[2])
    assert "rejected this call: not today" in results[0]
    assert "Oslo" in results[1]
    assert "no decision was given" in results[2]
    assert results[3] == '"data"'


async def test_resume_rejects_unknown_call_ids() -> None:
    model = ScriptedModel([tool_call("act", {"city": "x"}, id="a")])
    agent = Agent(model, tools=acting_tools([]), policy=ToolRules.ask_before_acting())
    outcome = (await agent.run("go")).outcome
    assert isinstance(outcome, AwaitingApproval)
    with pytest.raises(AgentError) as caught:
        await agent.resume(outcome.state, [ApprovalDecision.approve("nope")])
    assert caught.value.kind is ErrorKind.CONFIG


async def test_denied_calls_report_the_reason_and_the_run_continues() -> None:
    model = ScriptedModel([tool_call("act", {"city": "x"}), "gave up"])
    agent = Agent(model, tools=acting_tools([]), policy=ToolRules.read_only())
    turn = await agent.run("go")
    assert completed(turn.outcome).text == "gave up"
    assert "denied by policy" in tool_results(turn.messages[2])[0]


def test_a_paused_run_resumes_in_another_process() -> None:
    """The RunState survives json.dumps/loads in a different interpreter."""
    script = textwrap.dedent(
        """
        import asyncio, json, sys
        from agent_plugin.agent import Agent
        from agent_plugin.outcomes import ApprovalDecision, RunState
        from agent_plugin.policy import ToolRules
        from agent_plugin.providers.scripted import ScriptedModel, tool_call
        from agent_plugin.tools import FnTool, ToolEffect

        act = FnTool("act", "acts", {"type": "object"}, lambda a: "acted", effect=ToolEffect.WRITE)

        async def main():
            if sys.argv[1] == "pause":
                model = ScriptedModel([tool_call("act", {"n": 1}, id="a")])
                agent = Agent(model, tools=[act], policy=ToolRules.ask_before_acting())
                outcome = (await agent.run("go")).outcome
                print(json.dumps(outcome.state.model_dump(mode="json")))
            else:
                state = RunState.model_validate(json.loads(sys.stdin.read()))
                policy = ToolRules.ask_before_acting()
                agent = Agent(ScriptedModel(["finished"]), tools=[act], policy=policy)
                turn = await agent.resume(state, [ApprovalDecision.approve("a")])
                print(turn.outcome.model_dump_json())

        asyncio.run(main())
        """
    )
    paused = subprocess.run(
        [sys.executable, "-c", script, "pause"], capture_output=True, text=True, check=True
    )
    resumed = subprocess.run(
        [sys.executable, "-c", script, "resume"],
        input=paused.stdout,
        capture_output=True,
        text=True,
        check=True,
    )
    outcome = json.loads(resumed.stdout)
    assert outcome["status"] == "completed"
    assert outcome["text"] == "finished"
    assert outcome["steps_used"] == 1


# --- hooks and the loop guard --------------------------------------------------------------


async def test_hooks_observe_block_and_rewrite() -> None:
    events: list[str] = []
    seen_args: list[Any] = []

    class Recorder(AgentHooks):
        async def before_model(self, request: ChatRequest, info: RunInfo) -> None:
            request.temperature = 0.25
            events.append(f"model:{info.steps_used}")

        async def before_tool(self, call: ToolCall, ctx: ToolContext) -> ToolHookResult | None:
            events.append(f"before:{call.id}")
            if call.id == "blocked":
                return Block("not allowed here")
            return Modify({"city": "Bergen"})

        async def after_tool(self, call: ToolCall, output: ToolOutput, ctx: ToolContext) -> None:
            events.append(f"after:{call.id}:{str(output.is_error).lower()}")

        async def on_outcome(self, outcome: AgentOutcome, info: RunInfo) -> None:
            events.append(f"outcome:{str(outcome.is_completed()).lower()}")

    def weather(args: Any) -> Any:
        seen_args.append(args)
        return "ok"

    model = ScriptedModel(
        [
            [
                tool_call("get_weather", {"city": "Oslo"}, id="blocked"),
                tool_call("get_weather", {"city": "Oslo"}, id="rewritten"),
            ],
            "done",
        ]
    )
    agent = Agent(
        model,
        tools=[FnTool("get_weather", "w", WEATHER_SCHEMA, weather)],
        hooks=[Recorder()],
        parallel_tool_calls=False,
    )
    turn = await agent.run("go")
    assert events == [
        "model:0",
        "before:blocked",
        "after:blocked:true",
        "before:rewritten",
        "after:rewritten:false",
        "model:1",
        "outcome:true",
    ]
    assert seen_args == [{"city": "Bergen"}]
    assert "blocked by hook: not allowed here" in tool_results(turn.messages[2])[0]
    assert all(r.temperature == 0.25 for r in model.requests)


async def test_repeated_identical_calls_warn_then_stop() -> None:
    model = ScriptedModel([tool_call("get_weather", {"city": "Oslo"}) for _ in range(10)])
    turn = await Agent(model, tools=[weather_tool()], max_steps=50).run("go")
    outcome = turn.outcome
    assert isinstance(outcome, LoopDetected)
    assert (outcome.tool, outcome.repeats, outcome.steps_used) == ("get_weather", 5, 5)
    results = [tool_results(m)[0] for m in turn.messages if m.role is Role.TOOL]
    assert "[harness]" not in results[1]
    assert "[harness] You called get_weather 3 times" in results[2]


async def test_loop_guard_memory_survives_a_pause() -> None:
    model = ScriptedModel([tool_call("act", {"city": "x"}) for _ in range(3)])
    agent = Agent(model, tools=acting_tools([]), policy=ToolRules.ask_before_acting())
    outcome = (await agent.run("go")).outcome
    for _ in range(2):
        assert isinstance(outcome, AwaitingApproval)
        call_id = outcome.state.awaiting()[0].call.id
        outcome = (await agent.resume(outcome.state, [ApprovalDecision.approve(call_id)])).outcome
    assert isinstance(outcome, AwaitingApproval)
    assert len(outcome.state.recent_calls) == 2


# --- time ----------------------------------------------------------------------------------


@pytest.mark.looptime
async def test_deadline_stops_a_slow_model() -> None:
    async def never(request: ChatRequest) -> str:
        await asyncio.sleep(3600)
        return "too late"

    loop = asyncio.get_running_loop()
    start = loop.time()
    outcome = (await Agent(ScriptedModel([never]), max_duration=5).run("go")).outcome
    assert isinstance(outcome, BudgetExhausted)
    assert outcome.reason == "deadline"
    assert 5 <= loop.time() - start < 6


@pytest.mark.looptime
async def test_deadline_cuts_off_a_slow_tool() -> None:
    async def slow(args: Any) -> Any:
        await asyncio.sleep(3600)
        return "never"

    model = ScriptedModel([tool_call("slow")])
    agent = Agent(model, tools=[FnTool("slow", "slow", {"type": "object"}, slow)], max_duration=5)
    turn = await agent.run("go")
    assert isinstance(turn.outcome, BudgetExhausted)
    assert turn.outcome.reason == "deadline"
    assert turn.messages[-1].role is Role.TOOL
    assert "did not finish" in tool_results(turn.messages[-1])[0]


@pytest.mark.looptime
async def test_resume_restarts_the_deadline() -> None:
    async def slow_answer(request: ChatRequest) -> str:
        await asyncio.sleep(4)
        return "done"

    model = ScriptedModel([tool_call("act", {"city": "x"}, id="a"), slow_answer])
    agent = Agent(
        model, tools=acting_tools([]), policy=ToolRules.ask_before_acting(), max_duration=5
    )
    outcome = (await agent.run("go")).outcome
    assert isinstance(outcome, AwaitingApproval)
    await asyncio.sleep(60)  # the reviewer takes a minute
    turn = await agent.resume(outcome.state, [ApprovalDecision.approve("a")])
    assert completed(turn.outcome).text == "done"


@pytest.mark.looptime
async def test_parallel_calls_overlap_and_keep_order() -> None:
    async def nap(args: Any) -> Any:
        await asyncio.sleep(args["seconds"])
        return args["name"]

    napper = FnTool("nap", "sleeps", {"type": "object"}, nap)
    loop = asyncio.get_running_loop()
    for parallel, expected in ((True, 10), (False, 15)):
        model = ScriptedModel(
            [
                [
                    tool_call("nap", {"seconds": 10, "name": "ten"}),
                    tool_call("nap", {"seconds": 5, "name": "five"}),
                ],
                "rested",
            ]
        )
        start = loop.time()
        turn = await Agent(model, tools=[napper], parallel_tool_calls=parallel).run("go")
        assert round(loop.time() - start) == expected
        assert tool_results(turn.messages[2]) == ['"ten"', '"five"']


async def test_calls_without_distinct_ids_get_their_own() -> None:
    """Gemini's OpenAI-compatible endpoint sends id "" for every call."""
    reply = ChatResponse.model_validate(
        {
            "content": [
                {"tool_call": {"id": "", "name": "get_weather", "arguments": {"city": "Oslo"}}},
                {"tool_call": {"id": "", "name": "get_weather", "arguments": {"city": "Rome"}}},
            ],
            "stop_reason": "tool_use",
        }
    )
    model = ScriptedModel([reply, "ok"])
    turn = await Agent(model, tools=[weather_tool()]).run("go")
    ids = [c.id for c in turn.messages[1].tool_calls]
    assert all(ids)
    assert len(set(ids)) == 2
    answered = [p.tool_result.tool_call_id for p in turn.messages[2].content]  # type: ignore[union-attr]
    assert answered == ids
    assert tool_results(turn.messages[2]) == ['"sunny in Oslo"', '"sunny in Rome"']


@settings(max_examples=60, deadline=None)
@given(
    script=st.lists(
        st.one_of(
            st.text(max_size=20),
            st.lists(st.sampled_from(["get_weather", "teleport"]), min_size=1, max_size=3),
        ),
        max_size=15,
    ),
    max_steps=st.integers(min_value=1, max_value=8),
    parallel=st.booleans(),
)
async def test_loop_never_exceeds_step_budget(
    script: list[str | list[str]], max_steps: int, parallel: bool
) -> None:
    replies: list[Any] = [
        step if isinstance(step, str) else [tool_call(n, {"city": "x"}) for n in step]
        for step in script
    ]
    model = ScriptedModel(replies)
    agent = Agent(model, tools=[weather_tool()], max_steps=max_steps, parallel_tool_calls=parallel)
    turn = await agent.run("go")
    steps = getattr(turn.outcome, "steps_used", 0)
    assert steps <= max_steps
    assert len(model.requests) <= max_steps + 1
    assert repair_transcript(turn.messages) == turn.messages  # always a valid transcript


# --- memory and skills in the prompt -------------------------------------------------------


def system_text(request: ChatRequest) -> str:
    first = request.messages[0]
    assert first.role is Role.SYSTEM
    return first.text


async def test_memory_is_a_frozen_snapshot_plus_a_tool() -> None:
    store = InMemoryMemoryStore()
    remember = tool_call(
        "memory", {"action": "add", "block": "user", "text": "name is Mark"}, id="m1"
    )
    model = ScriptedModel([remember, "noted", "Hi Mark"])
    agent = Agent(model, system_prompt="Be kind.", memory=store, memory_scope="u1")

    first = await agent.run("I am Mark")
    assert json.loads(tool_results(first.messages[2])[0]) == {
        "ok": True,
        "block": "user",
        "used": 12,
        "limit": 1375,
    }
    before, during = (system_text(r) for r in model.requests[:2])
    assert before.startswith("Be kind.\n\n## Memory")
    assert "name is Mark" not in during  # written at once, shown from the next run
    await agent.run("Who am I?")
    assert "- name is Mark" in system_text(model.requests[2])
    other_scope = Agent(ScriptedModel(), memory=store, memory_scope="u2")
    assert "name is Mark" not in (await other_scope.system_message() or ChatMessage.user("")).text


async def test_skills_are_listed_and_loadable() -> None:
    deploy = Skill(name="deploy", description="How to ship a release", body="1. tag\n2. push")
    model = ScriptedModel([tool_call("load_skill", {"name": "deploy"}), "shipped"])
    turn = await Agent(model, skills=[deploy]).run("ship it")
    prompt = system_text(model.requests[0])
    assert "## Skills" in prompt
    assert "- deploy: How to ship a release" in prompt
    assert "1. tag" not in prompt  # bodies load on demand
    assert json.loads(tool_results(turn.messages[2])[0]) == {
        "name": "deploy",
        "instructions": "1. tag\n2. push",
    }


async def test_the_agent_runs_and_resumes_in_a_session() -> None:
    store = InMemorySessionStore()
    model = ScriptedModel(["Hi!", tool_call("act", {"city": "x"}, id="a"), "Done."])
    agent = Agent(model, tools=acting_tools([]), policy=ToolRules.ask_before_acting())
    await sessions.run(agent, "hello", session="s1", store=store)
    paused = await sessions.run(agent, "act now", session="s1", store=store)
    assert isinstance(paused.outcome, AwaitingApproval)
    assert len((await store.load("s1")).messages) == 2  # a pause saves nothing
    done = await sessions.resume(
        agent, paused.outcome.state, [ApprovalDecision.approve("a")], store=store
    )
    assert completed(done.outcome).text == "Done."
    saved = (await store.load("s1")).messages
    assert [m.role for m in saved] == [
        Role.USER,
        Role.ASSISTANT,
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
    ]


async def test_runs_with_the_same_system_prompt_share_one_message() -> None:
    # the rendered message is frozen: runs whose prompt renders the same text share it, and a
    # prompt that changed (here the memory snapshot) is rendered anew
    store = InMemoryMemoryStore()
    remember = tool_call("memory", {"action": "add", "block": "user", "text": "likes tea"})
    model = ScriptedModel(["one", "two", remember, "noted", "four"])
    agent = Agent(model, system_prompt="Be kind.", memory=store, memory_scope="u1")
    await agent.run("a")
    await agent.run("b")
    first, second = (r.messages[0] for r in model.requests[:2])
    assert first is second
    await agent.run("c")  # writes memory: the next run's prompt differs
    await agent.run("d")
    fourth = model.requests[4].messages[0]
    assert fourth is not first
    assert "likes tea" in fourth.text
    assert "likes tea" not in first.text


async def test_a_run_leaves_no_reference_cycle_behind() -> None:
    # everything a run builds is freed by reference counting as it ends: a cycle (the run's
    # model caller holding the run, say) leaves the whole run to the cyclic collector, and in
    # a busy worker, whose runs outlive young collections, to full collections of the heap
    import gc

    from agent_plugin.journal import InMemoryJournal

    @tool
    async def lookup(city: str) -> str:
        """Look a city up."""
        return f"{city}: sunny"

    events: list[object] = []
    model = ScriptedModel(keep_requests=0)
    agent = Agent(model, tools=[lookup], system_prompt="Be brief.")
    model.script.extend([tool_call("lookup", {"city": "Bergen"}), "Rain."])
    await agent.run("Weather in Bergen?")  # the first run imports what runs need
    for stream in (False, True):
        model.script.extend([tool_call("lookup", {"city": "Oslo"}), "It is sunny."])
        options = RunOptions(journal=InMemoryJournal(), on_event=events.append, stream=stream)
        gc.collect()
        gc.disable()
        try:
            turn = await agent.run("Weather in Oslo?", options=options)
            del options
            found = gc.collect()
        finally:
            gc.enable()
        assert isinstance(turn.outcome, Completed)
        assert found == 0, f"a run (stream={stream}) left {found} objects in reference cycles"
