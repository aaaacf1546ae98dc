"""Typed results in an app: ``AgentHandle.run(prompt, output_type=T)`` in a route, sessions
and resumes through the handle, streamed partials over SSE, and outputs registered on the
plugin by name."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.options import AgentOverrides
from agent_plugin.outcomes import ApprovalDecision, AwaitingApproval, Completed, RunState
from agent_plugin.output import Output
from agent_plugin.policy import ASK, ToolRules
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.sessions import InMemorySessionStore
from agent_plugin.tools import ToolEffect, tool
from agent_plugin.web import AgentHandle, AgentPlugin


class Ticket(BaseModel):
    """A support ticket."""

    title: str
    priority: int


TICKET = {"title": "Printer on fire", "priority": 5}


@tool(effect=ToolEffect.EXTERNAL)
def page(who: str) -> str:
    """Page someone."""
    return f"paged {who}"


class Ask(BaseModel):
    prompt: str


def plugin_of(model: ScriptedModel, **options: Any) -> AgentPlugin:
    return AgentPlugin(
        model=model,
        session_store=InMemorySessionStore(),
        environ={},
        jobs=False,
        **options,
    )


def app_of(plugin: AgentPlugin) -> FastAPI:
    app = FastAPI()
    plugin.install(app, allow_anonymous=True)

    @app.post("/tickets")
    async def file_ticket(body: Ask, agent: AgentHandle) -> Ticket:
        turn = await agent.run(body.prompt, output_type=Ticket)
        assert isinstance(turn.outcome, Completed)
        return turn.outcome.output

    @app.post("/tickets/stream")
    async def stream_ticket(body: Ask, agent: AgentHandle) -> Any:
        return agent.stream(body.prompt, output_type=Ticket)

    return app


@asynccontextmanager
async def serve(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client,
    ):
        yield client


def frames(body: str) -> list[tuple[str, Any]]:
    found = []
    for block in body.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            found.append((fields["event"], json.loads(fields["data"])))
    return found


async def test_a_route_gets_a_typed_value_from_the_handle() -> None:
    model = ScriptedModel([tool_call("final_result", TICKET)])
    async with serve(app_of(plugin_of(model))) as client:
        response = await client.post("/tickets", json={"prompt": "The printer is on fire"})
    assert response.status_code == 200, response.text
    assert response.json() == TICKET
    assert [t.name for t in model.requests[0].tools] == ["final_result"]


async def test_a_streamed_route_sends_the_output_as_it_grows_then_the_value() -> None:
    model = ScriptedModel([tool_call("final_result", TICKET)])
    async with serve(app_of(plugin_of(model))) as client:
        response = await client.post("/tickets/stream", json={"prompt": "go"})
    events = frames(response.text)
    kinds = [kind for kind, _ in events]
    assert "output_delta" in kinds
    assert kinds.index("output_delta") < kinds.index("model_response")
    delta = next(data for kind, data in events if kind == "output_delta")
    assert delta["choice"] == "Ticket"
    assert delta["partial"] == TICKET
    end = events[-1]
    assert end[0] == "run_end"
    assert end[1]["summary"]["output"] == TICKET


async def test_chat_keeps_the_output_in_the_session_and_resume_keeps_the_type() -> None:
    model = ScriptedModel(
        [
            tool_call("final_result", TICKET),
            lambda request: f"{len([m for m in request.messages if m.tool_calls])} calls seen",
            [tool_call("page", {"who": "ops"}), tool_call("final_result", TICKET)],
        ]
    )
    plugin = plugin_of(model, policy=ToolRules().for_tool("page", ASK), tools=[page])
    app = app_of(plugin)
    async with serve(app):
        agent = plugin.agent(app)
        first = await agent.chat("s1", "file it", output_type=Ticket)
        assert isinstance(first.outcome, Completed)
        assert first.outcome.output == Ticket(**TICKET)
        second = await agent.chat("s1", "what did you do?")
        assert isinstance(second.outcome, Completed)
        assert second.outcome.output == "1 calls seen"

        paused = await agent.run("page ops and file it", output_type=Ticket)
        assert isinstance(paused.outcome, AwaitingApproval)
        state = RunState.model_validate_json(paused.outcome.state.model_dump_json())
        approve = [ApprovalDecision.approve(state.awaiting()[0].call.id)]
        with pytest.raises(AgentError) as caught:
            await agent.resume(state, approve)  # as text: not what the run must produce
        assert caught.value.kind is ErrorKind.CONFIG
        turn = await agent.resume(state, approve, output_type=Ticket)
        assert isinstance(turn.outcome, Completed)
        assert turn.outcome.output.priority == 5


def test_outputs_are_registered_by_name_and_checked_at_once() -> None:
    plugin = AgentPlugin(outputs={"ticket": Ticket}, environ={})
    plugin.output("urgent", Output(Ticket, mode="native", retries=1))
    registered = plugin.registered_outputs
    assert sorted(registered) == ["ticket", "urgent"]
    assert (registered["urgent"].mode, registered["urgent"].retries) == ("native", 1)
    assert plugin.spec().outputs == registered
    for name, output_type, message in [
        ("9lives", Ticket, "an output name must be a letter"),
        ("ticket", Ticket, "registered already"),
        ("text", str, "is plain text"),
        ("odd", object(), "output 'odd':"),
    ]:
        with pytest.raises(AgentError) as caught:
            plugin.output(name, output_type)
        assert caught.value.kind is ErrorKind.CONFIG
        assert message in caught.value.message


async def test_a_run_named_output_builds_its_agent_once() -> None:
    plugin = plugin_of(ScriptedModel(), outputs={"ticket": Ticket})
    app = app_of(plugin)
    async with serve(app):
        runtime = plugin.runtime(app)
        assert runtime is not None
        named = runtime.agent_for(AgentOverrides(output="ticket"))
        assert named is runtime.agent_for(AgentOverrides(output="ticket"))
        assert named.output_label == "Ticket"
        assert runtime.agent_for(output=Ticket) is runtime.agent_for(output=Ticket)
        assert runtime.agent_for().output is None
        with pytest.raises(AgentError) as caught:
            runtime.agent_for(AgentOverrides(output="invoice"))
        assert caught.value.kind is ErrorKind.INVALID
