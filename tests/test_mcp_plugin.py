"""MCP servers in a FastAPI app through :class:`AgentPlugin`: their tools in routes, approvals,
health components, required servers, name clashes, servers from the config file, a changed
tool list, shutdown; against the real tests' server over stdio and Streamable HTTP (issue 22)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.mcp import MCPServer
from agent_plugin.outcomes import ApprovalDecision, AwaitingApproval, NeedsApproval, RunState
from agent_plugin.policy import ToolRules
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.sessions import InMemorySessionStore
from agent_plugin.tools import ToolEffect, tool
from agent_plugin.web import AgentHandle, AgentPlugin
from tests.mcp_harness import (
    SERVER,
    TOKEN,
    HttpMCP,
    alive,
    calls,
    eventually,
    free_port,
    stdio_server,
)

SCRIPTED = '[agent]\nprovider = "scripted"\n'


class Prompt(BaseModel):
    prompt: str


class Resume(BaseModel):
    state: RunState
    approve: bool


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[HttpMCP]:
    server = HttpMCP(tmp_path / "http.log")
    server.start()
    yield server
    server.stop()


def plugin(tmp_path: Path, *replies: Any, text: str = SCRIPTED, **options: Any) -> AgentPlugin:
    config = tmp_path / "agent.toml"
    config.write_text(text, encoding="utf-8")
    options.setdefault("environ", {"MCP_TOKEN": TOKEN})
    return AgentPlugin(
        config_file=config,
        model=ScriptedModel(list(replies)),
        session_store=InMemorySessionStore(),
        **options,
    )


def app_of(agent_plugin: AgentPlugin) -> FastAPI:
    app = FastAPI()
    agent_plugin.install(app)

    @app.post("/run")
    async def run(body: Prompt, agent: AgentHandle) -> dict[str, Any]:
        return (await agent.run(body.prompt)).outcome.model_dump(mode="json")

    @app.post("/resume")
    async def resume(body: Resume, agent: AgentHandle) -> dict[str, Any]:
        [waiting] = body.state.awaiting()
        decision = (
            ApprovalDecision.approve(waiting.call.id)
            if body.approve
            else ApprovalDecision.reject(waiting.call.id, "no")
        )
        return (await agent.resume(body.state, [decision])).outcome.model_dump(mode="json")

    return app


@asynccontextmanager
async def serve(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client,
    ):
        yield client


async def tool_names(client: httpx.AsyncClient) -> list[str]:
    response = await client.get("/agent/tools")
    assert response.status_code == 200
    return [item["name"] for item in response.json()]


async def test_mcp_tools_are_the_agents_tools_in_routes(
    tmp_path: Path, http_server: HttpMCP
) -> None:
    log = tmp_path / "stdio.log"
    replies = [
        [
            tool_call("files_echo", {"text": "from stdio"}),
            tool_call("web_echo", {"text": "from http"}),
        ],
        "both answered",
    ]
    agent_plugin = plugin(
        tmp_path,
        *replies,
        toolsets=[stdio_server("files", log=log), http_server.declaration("web")],
    )
    async with serve(app_of(agent_plugin)) as client:
        names = await tool_names(client)
        assert {"files_echo", "files_forecast", "web_echo", "web_forecast"} <= set(names)
        assert names == sorted(names)
        outcome = (await client.post("/run", json={"prompt": "echo twice"})).json()
    assert outcome["status"] == "completed"
    assert [c.argument for c in calls(log, "echo")] == ["from stdio"]
    assert [c.argument for c in calls(http_server.log, "echo")] == ["from http"]


async def test_ask_before_acting_pauses_before_an_mcp_call_until_it_is_approved(
    tmp_path: Path,
) -> None:
    log = tmp_path / "stdio.log"
    agent_plugin = plugin(
        tmp_path,
        tool_call("files_append", {"path": "notes.txt", "line": "approved"}),
        "appended",
        toolsets=[stdio_server("files", log=log)],
        policy=ToolRules.ask_before_acting(),
    )
    async with serve(app_of(agent_plugin)) as client:
        paused = (await client.post("/run", json={"prompt": "append a line"})).json()
        assert paused["status"] == "awaiting_approval"
        state = AwaitingApproval.model_validate(paused).state
        [waiting] = state.awaiting()
        assert waiting.call.name == "files_append"
        assert isinstance(waiting.status, NeedsApproval)
        assert waiting.status.reason == "files_append needs approval before it runs"
        assert calls(log, "append") == []  # nothing reached the server
        done = await client.post("/resume", json={"state": paused["state"], "approve": True})
        assert done.json()["status"] == "completed"
    assert [c.argument for c in calls(log, "append")] == ["notes.txt"]


async def test_each_server_is_a_health_component_and_an_unreachable_one_is_down(
    tmp_path: Path,
) -> None:
    gone = MCPServer.http("gone", f"http://127.0.0.1:{free_port()}/mcp", connect_timeout=0.5)
    agent_plugin = plugin(tmp_path, toolsets=[stdio_server("files"), gone])
    async with serve(app_of(agent_plugin)) as client:  # the app starts without "gone"
        health = await client.get("/health")
        ready = await client.get("/health/ready")
        names = await tool_names(client)
    assert health.status_code == 503
    components = health.json()["components"]
    assert components["agent"]["status"] == "UP"
    assert components["mcp:files"]["status"] == "UP"
    assert components["mcp:files"]["details"]["transport"] == "stdio"
    assert components["mcp:gone"]["status"] == "DOWN"
    assert "All connection attempts failed" in components["mcp:gone"]["details"]["error"]
    assert ready.status_code == 200
    assert "files_echo" in names
    assert not any(name.startswith("gone_") for name in names)


async def test_a_required_server_that_cannot_be_reached_stops_the_app(tmp_path: Path) -> None:
    gone = MCPServer.stdio("gone", "no-such-mcp-server", required=True, connect_timeout=0.5)
    app = app_of(plugin(tmp_path, toolsets=[gone]))
    with pytest.raises(AgentError) as caught:
        async with serve(app):
            pass
    assert caught.value.kind is ErrorKind.UNAVAILABLE
    assert caught.value.message.startswith(
        "the agent plugin could not start: the required MCP server 'gone' cannot be reached"
    )


@tool(effect=ToolEffect.READ_ONLY)
def files_echo(text: str) -> str:
    """The app's own tool, named like an MCP tool."""
    return text


@pytest.mark.parametrize("clash", ["two servers, one prefix", "an app tool"])
async def test_a_tool_name_clash_stops_the_app_and_ends_the_servers(
    clash: str, tmp_path: Path
) -> None:
    log = tmp_path / "stdio.log"
    servers = [stdio_server("files", log=log)]
    options: dict[str, Any] = {}
    if clash == "an app tool":
        options["tools"] = [files_echo]
        problem = "'files_echo' of toolset mcp:files has the name of a tool of the app's own tools"
    else:
        servers.append(stdio_server("more", log=log, tool_prefix="files_"))
        problem = "'files_append' of toolset mcp:more has the name of a tool of toolset mcp:files"
    app = app_of(plugin(tmp_path, toolsets=servers, **options))
    with pytest.raises(AgentError, match=problem):
        async with serve(app):
            pass
    started = calls(log, "started")
    assert len(started) == len(servers)
    assert not any(alive(call.pid) for call in started)


async def test_servers_of_the_config_file_start_and_stop_with_the_app(tmp_path: Path) -> None:
    log = tmp_path / "stdio.log"
    text = SCRIPTED + (
        "\n[[agent.mcp_servers]]\n"
        'name = "notes"\n'
        f"command = {sys.executable!r}\n"
        f"args = [{str(SERVER)!r}, 'stdio', '--log', {str(log)!r}]\n"
        'effect = "read_only"\n'
    ).replace("'", '"')
    agent_plugin = plugin(tmp_path, tool_call("notes_whoami"), "done", text=text)
    app = app_of(agent_plugin)
    async with serve(app) as client:
        assert "notes_whoami" in await tool_names(client)
        runtime = agent_plugin.runtime(app)
        assert runtime is not None
        notes = [tool for tool in runtime.agent_for().tools if tool.name.startswith("notes_")]
        assert {tool.effect for tool in notes} == {ToolEffect.READ_ONLY}
        outcome = (await client.post("/run", json={"prompt": "who are you"})).json()
        assert outcome["status"] == "completed"
    [started] = calls(log, "started")
    assert [call.pid for call in calls(log, "whoami")] == [started.pid]
    assert not alive(started.pid)  # the app's shutdown ended the server


async def test_a_changed_tool_list_reaches_the_agents_built_later(
    tmp_path: Path, http_server: HttpMCP
) -> None:
    agent_plugin = plugin(
        tmp_path,
        tool_call("web_learn", {"name": "newt"}),
        "learned",
        toolsets=[http_server.declaration("web")],
    )
    async with serve(app_of(agent_plugin)) as client:
        before = await tool_names(client)
        assert "web_newt" not in before
        assert (await client.post("/run", json={"prompt": "learn"})).json()["status"] == "completed"

        async def learned() -> bool:
            return "web_newt" in await tool_names(client)

        await eventually(learned)
        after = await tool_names(client)
    assert after == sorted([*before, "web_newt"])
