"""The life of an MCP server's session in a process, against the real tests' server over stdio
and Streamable HTTP: one session for concurrent calls, a crash mid-call and the reconnection, a
changed tool list, a server that is not there (or comes later), shutdown (issue 22)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_plugin.agent import Agent
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.mcp import MCPServer
from agent_plugin.messages import ToolResultPart
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.redaction import redact_text
from agent_plugin.tools import Tool, ToolContext
from agent_plugin.toolsets import LiveToolset
from tests.mcp_harness import TOKEN, HttpMCP, alive, calls, eventually, free_port, stdio_server

CTX = ToolContext.detached("c1")
ENVIRON = {"MCP_TOKEN": TOKEN}


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[HttpMCP]:
    server = HttpMCP(tmp_path / "http.log")
    server.start()
    yield server
    server.stop()


def declared(transport: str, tmp_path: Path, http: HttpMCP | None, **options: Any) -> MCPServer:
    if transport == "stdio":
        return stdio_server("files", log=tmp_path / "stdio.log", **options)
    assert http is not None
    return http.declaration("files", **options)


def tool(live: LiveToolset, name: str) -> Tool:
    [found] = [t for t in live.tools() if t.name == f"files_{name}"]
    return found


async def whoami(live: LiveToolset) -> int:
    return int(await tool(live, "whoami").execute({}, CTX))


@pytest.fixture(params=["stdio", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_one_session_serves_concurrent_calls(
    transport: str, tmp_path: Path, http_server: HttpMCP
) -> None:
    live = await declared(transport, tmp_path, http_server).start(ENVIRON)
    try:
        echo = tool(live, "echo")
        answers = await asyncio.gather(*(echo.execute({"text": f"n{i}"}, CTX) for i in range(12)))
        assert answers == [f"n{i}" for i in range(12)]
        log = tmp_path / "stdio.log" if transport == "stdio" else http_server.log
        assert len({call.pid for call in calls(log, "echo")}) == 1
        assert len(calls(log, "started")) == 1  # one server process
        health = await live.health()
        assert health.up
        assert health.details["connects"] == 1
    finally:
        await live.aclose()


async def test_a_stdio_server_that_crashes_mid_call_is_started_again(tmp_path: Path) -> None:
    live = await declared("stdio", tmp_path, None).start({})
    try:
        first = await whoami(live)
        revision = live.revision
        with pytest.raises(AgentError, match="closed during the call, so whether the tool ran"):
            await tool(live, "crash").execute({}, CTX)
        down = await live.health()
        assert not down.up
        assert down.details["error"] == "the server's process exited or closed its output"
        second = await whoami(live)  # waits for the reconnection under way
        assert second != first
        assert not alive(first)
        assert live.revision == revision  # the same tools: the prompt stays the same
        assert (await live.health()).details["connects"] == 2
    finally:
        await live.aclose()


async def test_a_run_goes_on_after_its_server_crashed_mid_run(tmp_path: Path) -> None:
    live = await declared("stdio", tmp_path, None).start({})
    try:
        before = await whoami(live)
        model = ScriptedModel([tool_call("files_crash"), tool_call("files_whoami"), "done"])
        turn = await Agent(model, tools=live.tools()).run("crash, then say who you are")
        crashed, answered = [
            part.tool_result
            for message in turn.new_messages
            for part in message.content
            if isinstance(part, ToolResultPart)
        ]
        assert crashed.is_error
        assert "whether the tool ran is unknown" in crashed.content
        assert not answered.is_error
        assert int(json.loads(answered.content)) not in (before, 0)  # a new server process
        assert turn.outcome.status == "completed"
    finally:
        await live.aclose()


async def test_an_http_server_that_crashes_is_reconnected_when_it_is_back(
    tmp_path: Path, http_server: HttpMCP
) -> None:
    live = await declared("http", tmp_path, http_server, connect_timeout=1).start(ENVIRON)
    try:
        first = await whoami(live)
        with pytest.raises(AgentError, match=r"MCP server 'files'"):
            await tool(live, "crash").execute({}, CTX)
        down = await live.health()
        assert not down.up
        assert down.details["error"]
        with pytest.raises(AgentError, match="is not connected"):
            await whoami(live)
        http_server.start()
        await eventually(lambda: _up(live), within=30)
        assert await whoami(live) != first
    finally:
        await live.aclose()


async def _up(live: LiveToolset) -> bool:
    return (await live.health()).up


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_a_changed_tool_list_is_fetched_again(
    transport: str, protocol: str, tmp_path: Path, http_server: HttpMCP
) -> None:
    live = await declared(transport, tmp_path, http_server, protocol=protocol).start(ENVIRON)
    try:
        spoken = (await live.health()).details["protocol"]
        assert spoken == ("2026-07-28" if protocol == "auto" else "2025-11-25")
        revision = live.revision
        assert await tool(live, "learn").execute({"name": "newt"}, CTX) == "learned newt"
        await eventually(lambda: live.revision > revision)
        names = [t.name for t in live.tools()]
        assert "files_newt" in names
        assert names == sorted(names)
        assert await tool(live, "newt").execute({}, CTX) == {"result": "I am newt"}
    finally:
        await live.aclose()


@pytest.mark.parametrize(
    ("server", "reason"),
    [
        (
            MCPServer.http("gone", f"http://127.0.0.1:{free_port()}/mcp", connect_timeout=1),
            "ConnectError: All connection attempts failed",
        ),
        (MCPServer.stdio("gone", "no-such-mcp-server", connect_timeout=1), "No such file"),
    ],
)
async def test_an_unreachable_server_is_down_with_its_reason(
    server: MCPServer, reason: str
) -> None:
    live = await server.start({})
    try:
        health = await live.health()
        assert not health.up
        assert reason in str(health.details["error"])
        assert live.tools() == ()
    finally:
        await live.aclose()
    required = server.model_copy(update={"required": True})
    with pytest.raises(AgentError) as caught:
        await required.start({})
    assert caught.value.kind is ErrorKind.UNAVAILABLE
    assert caught.value.message.startswith("the required MCP server 'gone' cannot be reached: ")
    assert reason in caught.value.message


async def test_a_server_that_comes_up_later_gets_connected(tmp_path: Path) -> None:
    later = HttpMCP(tmp_path / "later.log")
    live = await later.declaration("files", connect_timeout=0.5).start(ENVIRON)
    try:
        assert live.tools() == ()
        later.start()
        await eventually(lambda: _up(live), within=30)
        assert await tool(live, "echo").execute({"text": "late"}, CTX) == "late"
    finally:
        await live.aclose()
        later.stop()


async def test_an_http_server_refusing_the_credentials_is_down(http_server: HttpMCP) -> None:
    live = await http_server.declaration("files", connect_timeout=1).start({"MCP_TOKEN": "wrong"})
    try:
        health = await live.health()
        assert not health.up
        assert health.details["error"]
    finally:
        await live.aclose()


async def test_closing_ends_the_subprocess_and_forgets_the_secrets(tmp_path: Path) -> None:
    secret = "quiet-river-plain-words-42"
    server = declared("stdio", tmp_path, None, pass_env=["FILES_SECRET"])
    assert secret in redact_text(f"it is {secret}")
    live = await server.start({"FILES_SECRET": secret})
    assert secret not in redact_text(f"it is {secret}")  # redacted while the server runs
    pid = await whoami(live)
    await live.aclose()
    assert not alive(pid)
    assert secret in redact_text(f"it is {secret}")
    with pytest.raises(AgentError, match="is not connected"):
        await whoami(live)
