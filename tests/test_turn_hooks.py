"""Turn-level hooks: ``should_stop_after_turn`` ends a run after a turn [OP-09],
``prepare_next_turn`` adds messages that force another turn and changes the next requests
[OP-10], in the documented order and across a pause and its resume; the settings are checked
in the request bodies of both wires."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from agent_plugin.agent import Agent
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import AgentEvent
from agent_plugin.hooks import (
    AgentHooks,
    NextTurn,
    RunControl,
    ToolHookResult,
    ToolOutput,
    TurnInfo,
)
from agent_plugin.messages import (
    ChatMessage,
    Role,
    StopReason,
    TextPart,
    TokenUsage,
    ToolCall,
    ToolCallPart,
)
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import (
    AgentOutcome,
    ApprovalDecision,
    Approve,
    AwaitingApproval,
    Completed,
    OutputInvalid,
    RunInfo,
    RunState,
)
from agent_plugin.policy import ToolRules
from agent_plugin.providers.base import ChatRequest, ChatResponse
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.steering import Steering
from agent_plugin.tools import FnTool, ToolContext, ToolEffect
from tests.wire_agent import WIRES, Recorder, Wire, client, text_reply, tool_reply

ECHO = FnTool("echo", "echoes", {"type": "object"}, lambda args: args)
OTHER = FnTool("other", "another tool", {"type": "object"}, lambda args: "other")


class StopAfter(AgentHooks):
    """Stops the run after turn ``step``; records what it was told."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.turns: list[TurnInfo] = []
        self.prepared = 0

    async def should_stop_after_turn(self, turn: TurnInfo) -> bool:
        self.turns.append(turn)
        return turn.step >= self.step

    async def prepare_next_turn(self, turn: TurnInfo) -> NextTurn | None:
        self.prepared += 1
        return None


class AddOnce(AgentHooks):
    def __init__(self, text: str) -> None:
        self.text = text
        self.done = False

    async def prepare_next_turn(self, turn: TurnInfo) -> NextTurn | None:
        if self.done:
            return None
        self.done = True
        return NextTurn(messages=[self.text])


# --- should_stop_after_turn [OP-09] ---------------------------------------------------------


async def test_op09_a_true_after_a_tool_turn_ends_the_run_and_skips_the_rest() -> None:
    steering = Steering()

    def act(args: Any) -> str:
        steering.send("a message queued while the tool ran")
        return "acted"

    tool = FnTool("act", "acts", {"type": "object"}, act)
    reply = ChatResponse(
        content=[
            TextPart(text="working on it"),
            ToolCallPart(tool_call=ToolCall(id="call_1", name="act", arguments={})),
        ],
        stop_reason=StopReason.TOOL_USE,
        usage=TokenUsage(input_tokens=10, output_tokens=5),
    )
    model = ScriptedModel([reply, "never"])
    hook = StopAfter(0)
    events: list[AgentEvent] = []
    turn = await Agent(model, tools=[tool], hooks=[hook]).run(
        "go", options=RunOptions(steering=steering, on_event=events.append)
    )
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "working on it"
    assert len(model.requests) == 1
    assert hook.prepared == 0  # prepare_next_turn is skipped
    assert "steered" not in [e.type for e in events]  # the queued message is not delivered
    assert steering.pending
    (seen,) = hook.turns
    assert [m.role for m in seen.messages] == [Role.ASSISTANT, Role.TOOL]
    assert seen.usage == TokenUsage(input_tokens=10, output_tokens=5)
    assert seen.run.steps_used == 1
    assert [e.type for e in events][-3:] == ["tool_end", "turn_end", "run_end"]


async def test_op09_false_lets_the_run_go_on() -> None:
    model = ScriptedModel([tool_call("echo", {"x": 1}), "done"])
    hook = StopAfter(99)
    turn = await Agent(model, tools=[ECHO], hooks=[hook]).run("go")
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "done"
    assert [t.step for t in hook.turns] == [0, 1]
    assert hook.prepared == 2
    assert [m.role for m in hook.turns[1].messages] == [Role.ASSISTANT]  # this turn's only


async def test_op09_a_typed_run_stopped_without_its_output_is_output_invalid() -> None:
    class Ticket(BaseModel):
        title: str

    model = ScriptedModel([tool_call("echo", {"x": 1})])
    turn = await Agent(model, tools=[ECHO], hooks=[StopAfter(0)], output_type=Ticket).run("go")
    assert isinstance(turn.outcome, OutputInvalid)
    assert "stopped" in turn.outcome.message


# --- prepare_next_turn [OP-10] --------------------------------------------------------------


async def test_op10_messages_force_another_turn_even_after_a_final_answer() -> None:
    model = ScriptedModel(["first answer", "second answer"])
    turn = await Agent(model, hooks=[AddOnce("and one more thing")]).run("go")
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "second answer"
    assert len(model.requests) == 2
    assert [m.text for m in model.requests[1].messages] == [
        "go",
        "first answer",
        "and one more thing",
    ]
    assert [m.text for m in turn.new_messages] == [
        "go",
        "first answer",
        "and one more thing",
        "second answer",
    ]


async def test_op10_messages_of_several_hooks_join_in_registration_order() -> None:
    model = ScriptedModel(["first", "second"])
    turn = await Agent(model, hooks=[AddOnce("one"), AddOnce("two")]).run("go")
    assert [m.text for m in model.requests[1].messages][-2:] == ["one", "two"]
    assert isinstance(turn.outcome, Completed)


async def test_op10_only_user_messages_may_be_added() -> None:
    class Bad(AgentHooks):
        async def prepare_next_turn(self, turn: TurnInfo) -> NextTurn | None:
            return NextTurn(messages=[ChatMessage.assistant("I said this")])

    with pytest.raises(AgentError) as caught:
        await Agent(ScriptedModel(["x"]), hooks=[Bad()]).run("go")
    assert caught.value.kind is ErrorKind.CONFIG


# --- the order of the hooks -----------------------------------------------------------------


class OrderLog(AgentHooks):
    """Records the order its methods are called in."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def before_model(self, request: ChatRequest, info: RunInfo) -> RunControl | None:
        self.calls.append("before_model")
        return None

    async def after_model(self, response: ChatResponse, info: RunInfo) -> RunControl | None:
        self.calls.append("after_model")
        return None

    async def before_tool(self, call: ToolCall, ctx: ToolContext) -> ToolHookResult | None:
        self.calls.append("before_tool")
        return None

    async def after_tool(self, call: ToolCall, output: ToolOutput, ctx: ToolContext) -> None:
        self.calls.append("after_tool")

    async def should_stop_after_turn(self, turn: TurnInfo) -> bool:
        self.calls.append("should_stop_after_turn")
        return False

    async def prepare_next_turn(self, turn: TurnInfo) -> NextTurn | None:
        self.calls.append("prepare_next_turn")
        return None

    async def on_outcome(self, outcome: AgentOutcome, info: RunInfo) -> None:
        self.calls.append("on_outcome")


async def test_hooks_run_in_the_documented_order() -> None:
    hook = OrderLog()
    model = ScriptedModel([tool_call("echo", {"x": 1}), "done"])
    await Agent(model, tools=[ECHO], hooks=[hook]).run("go")
    turn = ["before_model", "after_model"]
    ends = ["should_stop_after_turn", "prepare_next_turn"]
    assert hook.calls == [
        *turn,
        "before_tool",
        "after_tool",
        *ends,
        *turn,
        *ends,
        "on_outcome",
    ]


# --- what the next requests carry, on both wires ---------------------------------------------


class Switch(AgentHooks):
    async def prepare_next_turn(self, turn: TurnInfo) -> NextTurn | None:
        if turn.step != 0:
            return None
        return NextTurn(
            model="the-other-model",
            tools=["other"],
            system_prompt_addition="Answer in one line.",
            extra_body={"metadata_tag": "turn-2"},
        )


def offered(wire: Wire, body: dict[str, Any]) -> list[str]:
    if wire == "openai":
        return [t["function"]["name"] for t in body.get("tools", [])]
    return [t["name"] for t in body.get("tools", [])]


def system_of(wire: Wire, body: dict[str, Any]) -> str:
    if wire == "openai":
        return str(body["messages"][0]["content"])
    system = body["system"]
    return system if isinstance(system, str) else "".join(b["text"] for b in system)


@pytest.mark.parametrize("wire", WIRES)
async def test_op10_the_next_turns_model_tools_system_prompt_and_body_fields(wire: Wire) -> None:
    sent = Recorder()
    replies = [tool_reply(wire, "echo", {"x": 1}, "call_1"), text_reply(wire, "done")]
    agent = Agent(
        client(wire, replies, sent),
        tools=[ECHO, OTHER],
        system_prompt="You help.",
        hooks=[Switch()],
    )
    turn = await agent.run("go")
    assert isinstance(turn.outcome, Completed)
    first, second = sent.json(0), sent.json(1)
    assert offered(wire, first) == ["echo", "other"]
    assert offered(wire, second) == ["other"]
    assert first["model"] != "the-other-model"
    assert second["model"] == "the-other-model"
    assert system_of(wire, first) == "You help."
    assert system_of(wire, second) == "You help.\n\nAnswer in one line."
    assert "metadata_tag" not in first
    assert second["metadata_tag"] == "turn-2"


@pytest.mark.parametrize("wire", WIRES)
async def test_op10_the_settings_and_the_hooks_hold_across_a_pause_and_its_resume(
    wire: Wire,
) -> None:
    act = FnTool("act", "acts", {"type": "object"}, lambda args: "acted", effect=ToolEffect.WRITE)
    look = FnTool("echo", "echoes", {"type": "object"}, lambda a: a, effect=ToolEffect.READ_ONLY)
    sent = Recorder()
    stopper = StopAfter(99)

    def agent(*replies: dict[str, Any]) -> Agent:
        """A fresh agent: what the resume knows of the settings is in the state alone."""
        return Agent(
            client(wire, list(replies), sent),
            tools=[look, OTHER, act],
            system_prompt="You help.",
            policy=ToolRules.ask_before_acting(),
            hooks=[Switch(), stopper],
        )

    turn = await agent(
        tool_reply(wire, "echo", {"x": 1}, "call_1"), tool_reply(wire, "act", {}, "call_2")
    ).run("go")
    assert isinstance(turn.outcome, AwaitingApproval)
    state = RunState.model_validate_json(turn.outcome.state.model_dump_json())
    assert state.turn_settings is not None
    assert state.turn_settings.model == "the-other-model"
    call_id = state.awaiting()[0].call.id
    approve = [ApprovalDecision(call_id=call_id, approval=Approve())]
    resumed = await agent(text_reply(wire, "done")).resume(state, approve)
    assert isinstance(resumed.outcome, Completed)
    last = sent.json(2)  # the request after the resume
    assert last["model"] == "the-other-model"
    assert offered(wire, last) == ["other"]
    assert system_of(wire, last) == "You help.\n\nAnswer in one line."
    assert last["metadata_tag"] == "turn-2"
    assert [t.step for t in stopper.turns] == [0, 1, 2]  # the resumed round is a turn too


async def test_an_empty_addition_removes_it_and_tools_none_keeps_them() -> None:
    class Toggle(AgentHooks):
        async def prepare_next_turn(self, turn: TurnInfo) -> NextTurn | None:
            if turn.step == 0:
                return NextTurn(system_prompt_addition="extra", tools=["echo"])
            if turn.step == 1:
                return NextTurn(system_prompt_addition="", tools=None)
            return None

    model = ScriptedModel([tool_call("echo", {}), tool_call("echo", {}), "done"])
    await Agent(model, tools=[ECHO, OTHER], system_prompt="base", hooks=[Toggle()]).run("go")
    systems = [r.messages[0].text for r in model.requests]
    assert systems == ["base", "base\n\nextra", "base"]
    tools = [[d.name for d in r.tools] for r in model.requests]
    assert tools == [["echo", "other"], ["echo"], ["echo"]]


async def test_op10_the_settings_are_journaled_so_a_recovered_run_keeps_them() -> None:
    from agent_plugin.journal import InMemoryJournal, recover

    journal = InMemoryJournal()
    model = ScriptedModel([tool_call("echo", {"x": 1}), "done"])
    agent = Agent(model, tools=[ECHO, OTHER], hooks=[Switch()])
    turn = await agent.run("go", options=RunOptions(journal=journal))
    assert isinstance(turn.outcome, Completed)
    state = recover(journal.entries)
    assert state is not None
    assert state.turn_settings is not None
    assert state.turn_settings.model == "the-other-model"
    assert state.turn_settings.tools == ["other"]
    assert state.messages == turn.messages
