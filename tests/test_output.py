"""Typed results in the loop (``agent_plugin.output``): every mode, retries, validators,
unions, approvals, sessions, recovery and streamed partials, with scripted models."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypedDict

from agent_plugin import sessions
from agent_plugin.agent import Agent
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import AgentEvent, OutcomeSummary, OutputDelta, RunEnded
from agent_plugin.journal import InMemoryJournal, recover
from agent_plugin.loop_guard import LoopGuard
from agent_plugin.messages import ChatMessage, Role, ToolResultPart
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import (
    AgentOutcome,
    ApprovalDecision,
    AwaitingApproval,
    BudgetExhausted,
    Completed,
    LoopDetected,
    OutputInvalid,
    RunState,
    outcome_adapter,
)
from agent_plugin.output import ModelRetry, Output, OutputContext
from agent_plugin.policy import ASK, ToolRules
from agent_plugin.providers.base import (
    ChatRequest,
    StreamEvent,
    TextDelta,
    ToolCallArgumentsDelta,
)
from agent_plugin.sessions import InMemorySessionStore
from agent_plugin.testing import FunctionModel, ModelCall, ScriptedModel, reply, tool_call
from agent_plugin.tools import ToolEffect, ToolReturn, tool


class Ticket(BaseModel):
    """A support ticket to file."""

    title: str
    priority: Literal["low", "normal", "high"]
    tags: list[str] = Field(default_factory=list)


class Refund(BaseModel):
    """A refund to pay."""

    order: str
    amount: float


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Span(TypedDict):
    start: int
    end: int


TICKET = {"title": "Printer on fire", "priority": "high"}


def completed(outcome: AgentOutcome) -> Completed:
    assert isinstance(outcome, Completed), outcome
    return outcome


def results(message: ChatMessage) -> list[tuple[str, str, bool]]:
    assert message.role is Role.TOOL
    return [
        (p.tool_result.tool_call_id, p.tool_result.content, p.tool_result.is_error)
        for p in message.content
        if isinstance(p, ToolResultPart)
    ]


@tool(effect=ToolEffect.READ_ONLY)
def lookup(order: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order": order, "paid": 12.5}


@tool(effect=ToolEffect.EXTERNAL)
def notify(who: str) -> str:
    """Tell someone."""
    return f"told {who}"


# --- tool mode -------------------------------------------------------------------------------


async def test_a_final_result_call_ends_the_run_with_a_validated_value() -> None:
    model = ScriptedModel([tool_call("final_result", TICKET)])
    agent = Agent(model, output_type=Ticket)
    turn = await agent.run("The printer is on fire")
    done = completed(turn.outcome)
    assert done.output == Ticket(title="Printer on fire", priority="high")
    assert isinstance(done.output, Ticket)
    assert json.loads(done.text) == {**TICKET, "tags": []}
    assert done.steps_used == 0  # a final answer alone is free, as in text
    (offered,) = model.requests[0].tools
    assert offered.name == "final_result"
    assert offered.description == "Give the final answer: A support ticket to file."
    assert offered.input_schema["required"] == ["title", "priority"]
    assert results(turn.messages[-1]) == [("call_1", '"the final result was accepted"', False)]


async def test_other_calls_of_the_final_reply_still_get_their_results() -> None:
    model = ScriptedModel(
        [[tool_call("lookup", {"order": "A1"}), tool_call("final_result", TICKET)]]
    )
    turn = await Agent(model, tools=[lookup], output_type=Ticket).run("go")
    assert completed(turn.outcome).output.title == "Printer on fire"
    assert turn.outcome.steps_used == 1  # the round ran a tool: a step
    assert [content for _, content, _ in results(turn.messages[-1])] == [
        '{"order":"A1","paid":12.5}',
        '"the final result was accepted"',
    ]
    assert len(model.requests) == 1


async def test_a_reply_that_does_not_validate_goes_back_naming_the_errors() -> None:
    model = ScriptedModel(
        [
            tool_call("final_result", {"title": "x", "priority": "urgent"}),
            tool_call("final_result", {"title": "x", "priority": "low"}),
        ]
    )
    turn = await Agent(model, output_type=Ticket).run("go")
    assert completed(turn.outcome).output.priority == "low"
    (_, content, is_error) = results(turn.messages[2])[0]
    assert is_error
    problem = json.loads(content)["error"]
    assert "priority: Input should be 'low', 'normal' or 'high' (got \"urgent\")" in problem
    assert "call final_result again" in problem
    assert turn.outcome.steps_used == 1  # the retry is a step
    assert model.requests[1].messages[-1].role is Role.TOOL


async def test_out_of_retries_the_run_ends_output_invalid() -> None:
    bad = tool_call("final_result", {"title": "x"})
    model = ScriptedModel([bad, bad, bad, bad])
    turn = await Agent(model, output_type=Ticket).run("go")
    outcome = turn.outcome
    assert isinstance(outcome, OutputInvalid)
    assert outcome.retries == 2
    assert "- priority: Field required" in outcome.message
    assert len(model.requests) == 3  # the first try and two retries
    assert outcome.steps_used == 2
    summary = OutcomeSummary.of(outcome)
    assert (summary.status, summary.output, summary.reason) == (
        "output_invalid",
        None,
        outcome.message,
    )


async def test_output_retries_zero_fails_at_the_first_bad_reply() -> None:
    model = ScriptedModel([tool_call("final_result", {"nothing": 1})])
    turn = await Agent(model, output_type=Ticket, output_retries=0).run("go")
    assert isinstance(turn.outcome, OutputInvalid)
    assert turn.outcome.retries == 0
    assert len(model.requests) == 1


async def test_plain_text_is_no_answer_in_tool_mode() -> None:
    model = ScriptedModel(["It is a high-priority ticket.", tool_call("final_result", TICKET)])
    turn = await Agent(model, output_type=Ticket).run("go")
    assert completed(turn.outcome).output.priority == "high"
    nudge = model.requests[1].messages[-1]
    assert nudge.role is Role.USER
    assert "give your final answer by calling final_result" in nudge.text


async def test_a_second_final_result_in_the_same_reply_is_not_used() -> None:
    other = {"title": "Second", "priority": "low"}
    model = ScriptedModel([[tool_call("final_result", TICKET), tool_call("final_result", other)]])
    turn = await Agent(model, output_type=Ticket).run("go")
    assert completed(turn.outcome).output.title == "Printer on fire"
    assert [content for _, content, _ in results(turn.messages[-1])] == [
        '"the final result was accepted"',
        '"not used: a final result was given already"',
    ]


# --- types -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output_type", "arguments", "expected"),
    [
        (int, {"response": 42}, 42),
        (bool, {"response": True}, True),
        (list[int], {"response": [1, 2, 3]}, [1, 2, 3]),
        (list[Ticket], {"response": [TICKET]}, [Ticket(title="Printer on fire", priority="high")]),
        (Point, {"x": 1, "y": 2}, Point(1, 2)),
        (Span, {"start": 3, "end": 5}, {"start": 3, "end": 5}),
        (int | None, {"response": None}, None),
    ],
    ids=["int", "bool", "list-int", "list-model", "dataclass", "typeddict", "optional"],
)
async def test_every_kind_of_output_type(
    output_type: Any, arguments: dict[str, Any], expected: Any
) -> None:
    model = ScriptedModel([tool_call("final_result", arguments)])
    agent: Agent[Any] = Agent(model, output_type=output_type)
    done = completed((await agent.run("go")).outcome)
    assert done.output == expected
    schema = model.requests[0].tools[0].input_schema
    assert schema["type"] == "object"
    if "response" in arguments:
        assert schema["required"] == ["response"]


async def test_each_union_member_is_its_own_choice() -> None:
    model = ScriptedModel([tool_call("final_result_Refund", {"order": "A1", "amount": 9.5})])
    agent: Agent[Ticket | Refund] = Agent(model, output_type=Ticket | Refund)
    done = completed((await agent.run("go")).outcome)
    assert done.output == Refund(order="A1", amount=9.5)
    assert [t.name for t in model.requests[0].tools] == [
        "final_result_Ticket",
        "final_result_Refund",
    ]
    assert model.requests[0].tools[1].description == "Give the final answer: A refund to pay."


async def test_a_list_of_types_is_a_union_too() -> None:
    model = ScriptedModel([tool_call("final_result_int", {"response": 7})])
    agent: Agent[Ticket | int] = Agent(model, output_type=[Ticket, int])
    assert completed((await agent.run("go")).outcome).output == 7


async def test_str_in_a_union_lets_the_model_answer_in_text() -> None:
    model = ScriptedModel(["No ticket needed."])
    agent: Agent[Ticket | str] = Agent(model, output_type=Ticket | str)
    done = completed((await agent.run("go")).outcome)
    assert done.output == "No ticket needed." == done.text
    assert [t.name for t in model.requests[0].tools] == ["final_result"]


async def test_a_text_agent_is_unchanged() -> None:
    model = ScriptedModel(["hello"])
    agent = Agent(model)
    assert agent.output is None
    done = completed((await agent.run("hi")).outcome)
    assert (done.output, done.text) == ("hello", "hello")
    assert OutcomeSummary.of(done).output is None  # the text is the answer: no copy of it
    assert outcome_adapter.dump_python(done, mode="json") == {
        "status": "completed",
        "text": "hello",
        "steps_used": 0,
        "usage": done.usage.model_dump(),
    }
    assert model.requests[0].tools == ()
    assert model.requests[0].response_format is None


# --- prompted and native modes -----------------------------------------------------------


async def test_prompted_mode_puts_the_schema_in_the_instructions_and_reads_the_text() -> None:
    model = ScriptedModel(["```json\n" + json.dumps(TICKET) + "\n```"])
    agent = Agent(
        model, system_prompt="You file tickets.", output_type=Ticket, output_mode="prompted"
    )
    done = completed((await agent.run("go")).outcome)
    assert done.output.title == "Printer on fire"
    request = model.requests[0]
    system = request.messages[0]
    assert system.role is Role.SYSTEM
    assert system.text.startswith("You file tickets.\n\nGive your final answer as one JSON value")
    assert '"priority": {"enum": ["low", "normal", "high"]' in system.text
    assert request.tools == ()
    assert request.response_format is None


async def test_prompted_mode_retries_text_that_is_not_json() -> None:
    model = ScriptedModel(["Sure! Here it is.", json.dumps(TICKET)])
    agent = Agent(model, output_type=Ticket, output_mode="prompted")
    turn = await agent.run("go")
    assert completed(turn.outcome).output.priority == "high"
    retry = turn.messages[2]
    assert retry.role is Role.USER
    assert retry.text.startswith("Your answer was not accepted:\n- the reply is not JSON")
    assert turn.outcome.steps_used == 1


async def test_native_mode_asks_for_a_json_schema_response_format() -> None:
    model = ScriptedModel([json.dumps(TICKET)])
    agent = Agent(model, output_type=Ticket, output_mode="native")
    done = completed((await agent.run("go")).outcome)
    assert done.output.title == "Printer on fire"
    request = model.requests[0]
    assert request.tools == ()
    fmt = request.response_format
    assert fmt is not None
    assert fmt.name == "Ticket"
    assert fmt.schema["required"] == ["title", "priority"]
    assert fmt.strict is False  # tags has a default and the object is open: not strict as is


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str
    country: str


async def test_native_mode_asks_for_strict_only_when_the_schema_is_strict_as_it_is() -> None:
    model = ScriptedModel(['{"city": "Paris", "country": "France"}'])
    agent = Agent(model, output_type=Closed, output_mode="native")
    assert completed((await agent.run("go")).outcome).output.city == "Paris"
    fmt = model.requests[0].response_format
    assert fmt is not None
    assert fmt.strict is True


@pytest.mark.parametrize("mode", ["native", "prompted"])
async def test_a_union_in_a_text_mode_is_told_apart_by_kind(mode: Any) -> None:
    answer = {"result": {"kind": "Refund", "data": {"order": "A1", "amount": 3}}}
    model = ScriptedModel(
        [json.dumps({"result": {"kind": "Nope", "data": {}}}), json.dumps(answer)]
    )
    agent: Agent[Ticket | Refund] = Agent(model, output_type=[Ticket, Refund], output_mode=mode)
    turn = await agent.run("go")
    assert completed(turn.outcome).output == Refund(order="A1", amount=3)
    assert "kind 'Nope' is none of Ticket, Refund" in turn.messages[2].text
    if mode == "native":
        fmt = model.requests[0].response_format
        assert fmt is not None
        variants = fmt.schema["properties"]["result"]["anyOf"]
        assert [v["properties"]["kind"]["const"] for v in variants] == ["Ticket", "Refund"]
        assert set(fmt.schema["$defs"]) == {"Ticket", "Refund"}


async def test_a_primitive_in_a_text_mode_is_wrapped() -> None:
    model = ScriptedModel(['{"response": [3, 1]}'])
    agent = Agent(model, output_type=list[int], output_mode="native")
    assert completed((await agent.run("go")).outcome).output == [3, 1]


# --- validators --------------------------------------------------------------------------


async def test_a_validator_may_send_the_value_back_with_a_message() -> None:
    seen: list[OutputContext] = []

    def only_tagged(ctx: OutputContext, ticket: Ticket) -> Ticket:
        seen.append(ctx)
        if not ticket.tags:
            raise ModelRetry("add at least one tag")
        return ticket.model_copy(update={"title": ticket.title.upper()})

    model = ScriptedModel(
        [tool_call("final_result", TICKET), tool_call("final_result", {**TICKET, "tags": ["hw"]})]
    )
    agent = Agent(model, output_type=Ticket, output_validators=[only_tagged])
    turn = await agent.run("go", options=RunOptions(run_id="run_v"))
    done = completed(turn.outcome)
    assert done.output.title == "PRINTER ON FIRE"  # validators may change the value
    assert json.loads(done.text)["title"] == "PRINTER ON FIRE"
    assert "- add at least one tag" in json.loads(results(turn.messages[2])[0][1])["error"]
    assert [(c.run_id, c.retries) for c in seen] == [("run_v", 0), ("run_v", 1)]
    assert seen[0].messages[-1].tool_calls[0].name == "final_result"


async def test_async_validators_and_plain_text_outputs() -> None:
    async def polite(ctx: OutputContext, text: str) -> str:
        if "please" not in text:
            raise ModelRetry("say please")
        return text

    model = ScriptedModel(["no", "yes please"])
    turn = await Agent(model, output_validators=[polite]).run("go")
    assert completed(turn.outcome).output == "yes please"
    assert turn.messages[2].text == (
        "Your answer was not accepted:\n- say please\nFix this and answer again."
    )


async def test_an_output_carries_its_mode_retries_and_validators() -> None:
    def never(ctx: OutputContext, ticket: Ticket) -> Ticket:
        raise ModelRetry("never")

    output = Output(Ticket, mode="prompted", retries=1, validators=[never])
    model = ScriptedModel(default=json.dumps(TICKET))
    turn = await Agent(model, output_type=output).run("go")
    assert isinstance(turn.outcome, OutputInvalid)
    assert (turn.outcome.retries, turn.outcome.message) == (1, "- never")
    assert len(model.requests) == 2


# --- budgets, the loop guard, tools that end the run -------------------------------------


async def test_retries_count_against_the_step_budget() -> None:
    model = ScriptedModel(default=tool_call("final_result", {"bad": 1}))
    turn = await Agent(model, output_type=Ticket, output_retries=10, max_steps=3).run("go")
    assert isinstance(turn.outcome, BudgetExhausted)
    assert (turn.outcome.reason, turn.outcome.steps_used) == ("steps", 3)


async def test_the_loop_guard_sees_the_same_rejected_answer() -> None:
    model = ScriptedModel(default="not json")
    agent = Agent(
        model,
        output_type=Ticket,
        output_mode="prompted",
        output_retries=10,
        loop_guard=LoopGuard(warn_after=2, stop_after=3),
    )
    turn = await agent.run("go")
    assert isinstance(turn.outcome, LoopDetected)
    assert turn.outcome.repeats == 3
    assert "[harness] You gave this same answer 2 times" in turn.messages[4].text


async def test_the_loop_guard_sees_the_same_rejected_final_result() -> None:
    model = ScriptedModel(default=tool_call("final_result", {"title": "x"}))
    guard = LoopGuard(warn_after=2, stop_after=3)
    turn = await Agent(model, output_type=Ticket, output_retries=10, loop_guard=guard).run("go")
    assert isinstance(turn.outcome, LoopDetected)
    assert (turn.outcome.tool, turn.outcome.repeats) == ("final_result", 3)


async def test_the_final_result_tool_never_needs_approval() -> None:
    model = ScriptedModel([tool_call("final_result", TICKET)])
    policy = ToolRules().for_tool("final_result", ASK)  # asks about a tool of that name
    turn = await Agent(model, output_type=Ticket, policy=policy).run("go")
    assert completed(turn.outcome).output.title == "Printer on fire"


async def test_a_tool_that_ends_the_run_gives_the_output() -> None:
    @tool(effect=ToolEffect.READ_ONLY)
    def file_it(title: str) -> ToolReturn:
        """File the ticket."""
        return ToolReturn({"title": title, "priority": "normal"}, terminate=True)

    model = ScriptedModel([tool_call("file_it", {"title": "Jam"})])
    turn = await Agent(model, tools=[file_it], output_type=Ticket).run("go")
    assert completed(turn.outcome).output == Ticket(title="Jam", priority="normal")

    model = ScriptedModel([tool_call("file_it", {"title": "Jam"})])
    agent = Agent(model, tools=[file_it], output_type=Refund)
    assert isinstance((await agent.run("go")).outcome, OutputInvalid)


# --- approvals, resumes, recovery, sessions ----------------------------------------------


async def test_approval_pauses_keep_the_final_result_for_the_resume() -> None:
    model = ScriptedModel(
        [[tool_call("notify", {"who": "ops"}), tool_call("final_result", TICKET)]]
    )
    policy = ToolRules().for_tool("notify", ASK)
    agent = Agent(model, tools=[notify], output_type=Ticket, policy=policy)
    paused = await agent.run("go")
    outcome = paused.outcome
    assert isinstance(outcome, AwaitingApproval)
    assert [p.call.name for p in outcome.state.awaiting()] == ["notify"]
    state = RunState.model_validate_json(outcome.state.model_dump_json())  # another process
    assert state.output == "Ticket"
    fresh = Agent(ScriptedModel(), tools=[notify], output_type=Ticket, policy=policy)
    turn = await fresh.resume(state, [ApprovalDecision.approve("call_1")])
    assert completed(turn.outcome).output.title == "Printer on fire"
    assert [content for _, content, _ in results(turn.messages[-1])] == [
        '"told ops"',
        '"the final result was accepted"',
    ]
    with pytest.raises(AgentError) as caught:
        await Agent(ScriptedModel(), tools=[notify], policy=policy).resume(state)
    assert caught.value.kind is ErrorKind.CONFIG
    assert "must produce Ticket" in caught.value.message


async def test_retries_survive_a_pause() -> None:
    bad = tool_call("final_result", {"title": "x"})
    model = ScriptedModel([bad, [tool_call("notify", {"who": "a"}), bad]])
    policy = ToolRules().for_tool("notify", ASK)
    agent = Agent(model, tools=[notify], output_type=Ticket, policy=policy, output_retries=1)
    paused = (await agent.run("go")).outcome
    assert isinstance(paused, AwaitingApproval)
    assert paused.state.output_retries == 1
    call_id = paused.state.awaiting()[0].call.id
    turn = await agent.resume(paused.state, [ApprovalDecision.approve(call_id)])
    assert isinstance(turn.outcome, OutputInvalid)  # the second bad reply was the last allowed


async def test_a_run_recovered_after_its_final_result_completes_without_a_model_call() -> None:
    journal = InMemoryJournal()
    model = ScriptedModel([tool_call("final_result", TICKET)])
    agent = Agent(model, output_type=Ticket)
    await agent.run("go", options=RunOptions(journal=journal))
    state = recover(journal.entries)
    assert state is not None
    assert state.messages[-1].role is Role.TOOL
    again = Agent(ScriptedModel(default=AgentError.config("no model call")), output_type=Ticket)
    turn = await again.resume(state)
    assert completed(turn.outcome).output.title == "Printer on fire"


async def test_a_run_recovered_after_a_text_answer_judges_it_again() -> None:
    journal = InMemoryJournal()
    model = ScriptedModel([json.dumps(TICKET)])
    agent = Agent(model, output_type=Ticket, output_mode="prompted")
    await agent.run("go", options=RunOptions(journal=journal))
    state = recover(journal.entries)
    assert state is not None
    again = Agent(ScriptedModel(), output_type=Ticket, output_mode="prompted")
    assert completed((await again.resume(state)).outcome).output.priority == "high"


async def test_a_session_keeps_the_final_output_for_the_next_turn() -> None:
    store = InMemorySessionStore()
    first = Agent(ScriptedModel([tool_call("final_result", TICKET)]), output_type=Ticket)
    turn = await sessions.run(first, "file it", session="s1", store=store)
    assert completed(turn.outcome).output.priority == "high"

    def answer(messages: list[ChatMessage], call: ModelCall) -> str:
        earlier = [c for m in messages for c in m.tool_calls if c.name == "final_result"]
        return f"You filed {earlier[0].arguments['title']!r}"

    second = Agent(FunctionModel(answer))
    turn = await sessions.run(second, "what did you file?", session="s1", store=store)
    assert completed(turn.outcome).output == "You filed 'Printer on fire'"


# --- streaming ---------------------------------------------------------------------------


class Chunked(ScriptedModel):
    """A scripted model whose streamed replies come three characters at a time."""

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        async for event in super().stream(request):
            if isinstance(event, ToolCallArgumentsDelta):
                text = event.fragment
                for i in range(0, len(text), 3):
                    yield ToolCallArgumentsDelta(event.index, text[i : i + 3])
            elif isinstance(event, TextDelta):
                for i in range(0, len(event.text), 3):
                    yield TextDelta(event.text[i : i + 3])
            else:
                yield event


@pytest.mark.parametrize("mode", ["tool", "prompted", "native"])
async def test_streaming_emits_the_output_as_it_grows(mode: Any) -> None:
    answer = {"title": "Printer on fire", "priority": "high", "tags": ["hw"]}
    script: Any = tool_call("final_result", answer) if mode == "tool" else json.dumps(answer)
    agent = Agent(Chunked([script]), output_type=Ticket, output_mode=mode)
    events: list[AgentEvent] = [e async for e in agent.stream("go")]
    partials = [e.partial for e in events if isinstance(e, OutputDelta)]
    assert len(partials) > 5
    assert partials[-1] == answer
    assert {"title": "Printer on fire"} in partials  # a field complete, the next to come
    titles = [p.get("title") for p in partials if isinstance(p, dict)]
    assert any(t and t != answer["title"] and answer["title"].startswith(t) for t in titles)
    assert all(
        isinstance(e, OutputDelta) and e.choice == "Ticket"
        for e in events
        if e.type == "output_delta"
    )
    end = events[-1]
    assert isinstance(end, RunEnded)
    assert end.summary is not None
    assert end.summary.output == answer  # the validated value, as JSON
    assert end.outcome is not None
    assert isinstance(end.outcome, Completed)
    assert end.outcome.output == Ticket(**answer)


async def test_streaming_a_union_names_the_choice_being_written() -> None:
    agent: Agent[Ticket | Refund] = Agent(
        Chunked([tool_call("final_result_Refund", {"order": "A1", "amount": 2})]),
        output_type=Ticket | Refund,
    )
    events = [e async for e in agent.stream("go")]
    deltas = [e for e in events if isinstance(e, OutputDelta)]
    assert {d.choice for d in deltas} == {"Refund"}
    assert deltas[-1].partial == {"order": "A1", "amount": 2}


# --- configuration -----------------------------------------------------------------------


class Opaque:
    """No schema: pydantic cannot validate it."""


def test_mistakes_in_the_output_fail_when_the_agent_is_built() -> None:
    model = ScriptedModel()

    @tool
    def final_result(x: int) -> int:
        """Clash."""
        return x

    cases: list[tuple[dict[str, Any], str]] = [
        ({"tools": [final_result], "output_type": Ticket}, "would hide the final-result tool"),
        ({"output_mode": "native"}, "needs an output_type other than str"),
        ({"output_type": Ticket, "output_mode": "json"}, "mode must be one of"),
        ({"output_type": Ticket | str, "output_mode": "native"}, "works in tool mode only"),
        ({"output_type": Opaque}, "Opaque cannot be an output type"),
        ({"output_type": Ticket, "output_retries": -1}, "retries must be 0 or more"),
        ({"output_type": Output(Ticket), "output_retries": 1}, "give its mode, retries"),
        ({"output_type": []}, "empty list"),
    ]
    for kwargs, message in cases:
        with pytest.raises(AgentError) as caught:
            Agent(model, **kwargs)
        assert caught.value.kind is ErrorKind.CONFIG
        assert message in caught.value.message, (kwargs, caught.value.message)


def test_a_completed_outcome_with_an_output_round_trips_as_json() -> None:
    class Aliased(BaseModel):
        model_config = ConfigDict(populate_by_name=True)
        order_id: str = Field(alias="orderId")

    outcome = Completed(
        text='{"orderId":"A1"}', output=Aliased(order_id="A1"), steps_used=1, usage=reply("x").usage
    )
    data = json.loads(outcome_adapter.dump_json(outcome))
    assert data["output"] == {"orderId": "A1"}  # by alias: the type validates it back
    assert Aliased.model_validate(data["output"]).order_id == "A1"
    assert OutcomeSummary.of(outcome).output == {"orderId": "A1"}
    back = outcome_adapter.validate_json(json.dumps(data))
    assert isinstance(back, Completed)
    assert back.output == {"orderId": "A1"}
