"""An MCP server's tools as the agent's tools, against the real tests' server over stdio and
Streamable HTTP: names, schemas, effects, argument checks, results, errors, the output limit and
the per-call timeout (issue 22)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from agent_plugin.agent import Agent
from agent_plugin.errors import AgentError
from agent_plugin.mcp import MCPServer
from agent_plugin.messages import Role, ToolResult, ToolResultPart
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.tools import TRUNCATION_MARKER, Tool, ToolContext, ToolEffect
from agent_plugin.toolsets import LiveToolset
from tests.mcp_harness import TOKEN, HttpMCP, calls, stdio_server

pytestmark = pytest.mark.asyncio(loop_scope="module")

CTX = ToolContext.detached("c1")
ECHO_SCHEMA = {
    "type": "object",
    "properties": {"text": {"title": "Text", "type": "string"}},
    "required": ["text"],
    "title": "echoArguments",
}


@dataclass
class Served:
    """A started server and the log of the process that serves it."""

    live: LiveToolset
    log: Path
    prefix: str

    def tool(self, name: str) -> Tool:
        [found] = [tool for tool in self.live.tools() if tool.name == self.prefix + name]
        return found

    def served(self, tool: str) -> list[str]:
        return [call.argument for call in calls(self.log, tool)]


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpMCP]:
    server = HttpMCP(tmp_path_factory.mktemp("mcp-http") / "calls.log")
    server.start()
    yield server
    server.stop()


async def start(declared: MCPServer, environ: dict[str, str] | None = None) -> LiveToolset:
    return await declared.start(environ if environ is not None else {"MCP_TOKEN": TOKEN})


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["stdio", "http"])
async def served(
    request: pytest.FixtureRequest, http_server: HttpMCP, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Served]:
    if request.param == "stdio":
        log = tmp_path_factory.mktemp("mcp-stdio") / "calls.log"
        declared = stdio_server("files", log=log, timeout=1.5)
    else:
        log = http_server.log
        declared = http_server.declaration("web", timeout=1.5)
    live = await start(declared)
    yield Served(live, log, declared.prefix)
    await live.aclose()


def results(turn: Any) -> list[ToolResult]:
    return [
        part.tool_result
        for message in turn.new_messages
        if message.role is Role.TOOL
        for part in message.content
        if isinstance(part, ToolResultPart)
    ]


async def test_tools_are_prefixed_sorted_with_the_servers_schemas(served: Served) -> None:
    names = [tool.name for tool in served.live.tools()]
    expected = ["append", "crash", "echo", "erase", "fail", "forecast", "learn", "notes_read"]
    expected += ["picture", "shout", "slow", "whoami"]
    assert names == [served.prefix + name for name in expected]  # sorted, "." written "_"
    echo = served.tool("echo")
    assert echo.input_schema == ECHO_SCHEMA  # as the server gave it, titles and all
    assert echo.description == "Repeat the text."
    assert {tool.effect for tool in served.live.tools()} == {ToolEffect.EXTERNAL}


async def test_arguments_are_checked_against_the_schema_before_the_call(served: Served) -> None:
    echo = served.tool("echo")
    assert echo.validate({"text": 5}) == "$.text: 5 is not of type 'string'"
    assert echo.validate({}) == "$: 'text' is a required property"
    assert echo.validate(["x"]) == "$: the arguments must be a JSON object"
    assert echo.validate({"text": "fine"}) is None
    model = ScriptedModel([tool_call(echo.name, {"text": 7}), "done"])
    turn = await Agent(model, tools=served.live.tools()).run("echo a number")
    [result] = results(turn)
    assert result.is_error
    assert "schema validation failed: $.text: 7 is not of type 'string'" in result.content
    assert "7" not in served.served("echo")


async def test_text_structured_and_image_results(served: Served) -> None:
    assert await served.tool("echo").execute({"text": "hi there"}, CTX) == "hi there"
    forecast = await served.tool("forecast").execute({"city": "Oslo", "days": 2}, CTX)
    assert forecast == {"city": "Oslo", "celsius": 16, "sky": "cloudy"}
    picture = await served.tool("picture").execute({}, CTX)
    assert picture == ["a red dot", {"type": "image", "mime_type": "image/png", "bytes": 69}]


async def test_an_error_result_is_a_tool_error_the_model_reads(served: Served) -> None:
    with pytest.raises(AgentError, match="Error executing tool fail: disk full"):
        await served.tool("fail").execute({"message": "disk full"}, CTX)
    model = ScriptedModel([tool_call(served.prefix + "fail", {"message": "no paper"}), "sorry"])
    turn = await Agent(model, tools=served.live.tools()).run("print it")
    [result] = results(turn)
    assert result.is_error
    assert json.loads(result.content) == {"error": "Error executing tool fail: no paper"}
    assert turn.outcome.status == "completed"


async def test_the_agents_output_limit_cuts_a_long_result(served: Served) -> None:
    model = ScriptedModel([tool_call(served.prefix + "shout", {"text": "hey"}), "loud"])
    agent = Agent(model, tools=served.live.tools(), per_tool_output_limit=50)
    [result] = results(await agent.run("shout"))
    assert result.content == '"' + "HEY" * 16 + "H" + TRUNCATION_MARKER
    assert not result.is_error


async def test_a_call_longer_than_the_timeout_fails_and_the_session_goes_on(
    served: Served,
) -> None:
    slow = served.tool("slow")
    with pytest.raises(AgentError, match=r"did not answer within 1\.5 s"):
        await slow.execute({"seconds": 4}, CTX)
    assert await served.tool("echo").execute({"text": "still here"}, CTX) == "still here"
    assert await slow.execute({"seconds": 0.1}, CTX) == "slept 0.1"


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_annotations_set_effects_only_for_a_trusted_server(
    transport: str, http_server: HttpMCP, tmp_path: Path
) -> None:
    options: dict[str, Any] = {"trusted": True, "tool_effects": {"echo": "internal"}}
    if transport == "stdio":
        declared = stdio_server("trusted", **options)
    else:
        declared = http_server.declaration("trusted", **options)
    live = await start(declared)
    try:
        effects = {tool.name.removeprefix("trusted_"): tool.effect for tool in live.tools()}
    finally:
        await live.aclose()
    assert effects["forecast"] is ToolEffect.READ_ONLY  # readOnlyHint
    assert effects["append"] is ToolEffect.WRITE  # destructiveHint false
    assert effects["erase"] is ToolEffect.EXTERNAL  # destructiveHint true
    assert effects["echo"] is ToolEffect.INTERNAL  # the per-tool override
    assert effects["whoami"] is ToolEffect.EXTERNAL  # no hints: the server's effect


async def test_names_a_provider_refuses_are_rewritten_and_the_prefix_may_be_empty(
    http_server: HttpMCP,
) -> None:
    live = await start(http_server.declaration("bare", tool_prefix=""))
    try:
        names = {tool.name: tool for tool in live.tools()}
        assert {"echo", "forecast", "whoami", "notes_read"} <= set(names)
        assert await names["notes_read"].execute({}, CTX) == "buy milk"
    finally:
        await live.aclose()
