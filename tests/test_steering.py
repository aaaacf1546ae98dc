"""Messages for a running run by mode: ``steer`` joins before the next model call,
``followup`` one at a time when the run would end, ``collect`` all at once then, ``interrupt``
at once, abandoning the model call in flight [OP-11]; the bound on queued messages; the
follow-up on both wires through the real clients."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent_plugin.agent import Agent
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import AgentEvent, Steered
from agent_plugin.hooks import AgentHooks, TurnInfo
from agent_plugin.messages import ChatMessage
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import Completed
from agent_plugin.providers.base import ChatRequest
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.steering import Steering
from agent_plugin.tools import FnTool
from tests.wire_agent import WIRES, Recorder, Wire, client, text_reply, tool_reply


def steered(events: list[AgentEvent]) -> list[tuple[str, list[str]]]:
    return [(e.mode, e.messages) for e in events if isinstance(e, Steered)]


async def run(agent: Agent, steering: Steering) -> tuple[Any, list[AgentEvent]]:
    events: list[AgentEvent] = []
    turn = await agent.run("go", options=RunOptions(steering=steering, on_event=events.append))
    return turn, events


async def test_op11_a_followup_continues_a_run_that_would_end() -> None:
    steering = Steering()

    def look(args: Any) -> str:
        steering.send("then Bergen", "followup")
        steering.send("then Tromsø", "followup")
        return "sunny"

    model = ScriptedModel([tool_call("look", {}), "Oslo: sunny", "Bergen: rain", "Tromsø: snow"])
    agent = Agent(model, tools=[FnTool("look", "looks", {"type": "object"}, look)])
    turn, events = await run(agent, steering)
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "Tromsø: snow"
    # not before the next model call (that one runs on the tool's result alone)
    assert model.requests[1].messages[-1].role.value == "tool"
    assert [m.text for m in model.requests[2].messages][-2:] == ["Oslo: sunny", "then Bergen"]
    assert [m.text for m in model.requests[3].messages][-2:] == ["Bergen: rain", "then Tromsø"]
    assert steered(events) == [("followup", ["then Bergen"]), ("followup", ["then Tromsø"])]


async def test_op11_steering_wins_over_a_followup() -> None:
    steering = Steering()

    async def answer(request: ChatRequest) -> str:
        steering.send("the follow-up", "followup")
        steering.send("the steer", "steer")
        return "first"

    model = ScriptedModel([answer, "second", "third"])
    turn, events = await run(Agent(model), steering)
    assert [m.text for m in turn.messages] == [
        "go",
        "first",
        "the steer",
        "second",
        "the follow-up",
        "third",
    ]
    assert steered(events) == [("steer", ["the steer"]), ("followup", ["the follow-up"])]


async def test_op11_collected_messages_join_as_one_follow_up() -> None:
    steering = Steering()

    async def answer(request: ChatRequest) -> str:
        for text in ("one", "two", "three"):
            steering.send(text, "collect")
        return "first"

    model = ScriptedModel([answer, "second"])
    turn, events = await run(Agent(model), steering)
    assert [m.text for m in turn.messages] == ["go", "first", "one\n\ntwo\n\nthree", "second"]
    assert steered(events) == [("followup", ["one\n\ntwo\n\nthree"])]


async def test_op11_a_followup_is_not_delivered_when_a_hook_stops_the_run() -> None:
    class Stop(AgentHooks):
        async def should_stop_after_turn(self, turn: TurnInfo) -> bool:
            return True

    steering = Steering()
    steering.send("later", "followup")
    model = ScriptedModel(["done"])
    turn, events = await run(Agent(model, hooks=[Stop()]), steering)
    assert isinstance(turn.outcome, Completed)
    assert steered(events) == []
    assert steering.following


async def test_op11_an_interrupt_abandons_the_model_call_in_flight() -> None:
    steering = Steering()
    started = asyncio.Event()

    async def slow(request: ChatRequest) -> str:
        started.set()
        await asyncio.sleep(30)
        return "never seen"

    model = ScriptedModel([slow, "about Bergen then"])

    async def interrupt() -> None:
        await started.wait()
        steering.send("forget Oslo, Bergen please", "interrupt")

    sender = asyncio.ensure_future(interrupt())
    turn, events = await run(Agent(model), steering)
    await sender
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "about Bergen then"
    assert [m.text for m in turn.messages] == [
        "go",
        "forget Oslo, Bergen please",
        "about Bergen then",
    ]
    assert "never seen" not in [m.text for m in turn.messages]
    assert steered(events) == [("steer", ["forget Oslo, Bergen please"])]


async def test_op11_the_default_mode_and_the_bound_on_queued_messages() -> None:
    steering = Steering(default_mode="followup", max_queued=2)
    steering.send("a")
    steering.send(ChatMessage.user("b"))
    assert steering.following
    assert not steering.pending
    with pytest.raises(AgentError) as caught:
        steering.send("c")
    assert caught.value.kind is ErrorKind.CONFLICT
    assert "2 messages" in caught.value.message
    assert [m.text for m in steering.take_followup()] == ["a"]
    steering.send("c", "steer")  # room again
    with pytest.raises(AgentError):
        steering.send("d", "shout")  # type: ignore[arg-type]
    with pytest.raises(AgentError):
        Steering(max_queued=0)


@pytest.mark.parametrize("wire", WIRES)
async def test_op11_a_followup_joins_the_request_after_the_answer(wire: Wire) -> None:
    steering = Steering()
    sent = Recorder()

    def look(args: Any) -> str:
        steering.send("and tomorrow?", "followup")
        return "sunny"

    replies = [
        tool_reply(wire, "look", {}, "call_1"),
        text_reply(wire, "Sunny today."),
        text_reply(wire, "Sunny tomorrow too."),
    ]
    agent = Agent(
        client(wire, replies, sent), tools=[FnTool("look", "l", {"type": "object"}, look)]
    )
    turn, _ = await run(agent, steering)
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "Sunny tomorrow too."
    last = sent.json(2)["messages"]
    assert last[-2]["role"] == "assistant"
    tail = last[-1]
    assert tail["role"] == "user"
    content = tail["content"]
    text = content if isinstance(content, str) else "".join(b["text"] for b in content)
    assert text == "and tomorrow?"
