"""The demo app served by a real uvicorn on 127.0.0.1, used the way its docstring says."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from openapi_spec_validator import validate

from agent_plugin.config import AgentSettings
from agent_plugin.messages import ChatMessage
from agent_plugin.providers.base import ChatRequest
from agent_plugin.providers.scripted import tool_call
from example_app import main
from example_app.main import OUTBOX, app, demo_reply


@pytest.fixture
async def base_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    """The demo served by uvicorn on a free port, with its database in a temporary folder."""
    monkeypatch.setenv("AGENT_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path / 'agent.db'}")
    monkeypatch.delenv("AGENT_PROVIDER", raising=False)
    OUTBOX.clear()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        # startup opens the stores and the model client, whose libraries load then (not with
        # the import): a loaded machine takes seconds
        for _ in range(3000):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@pytest.fixture
async def http(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        yield client


async def test_ask_answers_through_a_tool_call(http: httpx.AsyncClient) -> None:
    response = await http.post("/ask", json={"prompt": "What is the weather in Paris?"})
    assert response.status_code == 200
    assert response.json() == {
        "status": "completed",
        "answer": "In Paris it is 18 °C and cloudy (from get_weather).",
        "run_id": None,
        "awaiting": [],
        "steps_used": 1,
    }
    other = await http.post("/ask", json={"prompt": "hello there"})
    assert other.json()["status"] == "completed"
    assert "(from get_time)" in other.json()["answer"]
    assert (await http.post("/ask", json={"prompt": ""})).status_code == 422


async def test_an_approval_round_trip(http: httpx.AsyncClient) -> None:
    paused = await http.post("/ask", json={"prompt": "Tell Alice the weather in Oslo"})
    body = paused.json()
    assert body["status"] == "awaiting_approval"
    assert body["steps_used"] == 2  # get_weather ran; send_message waits
    (call,) = body["awaiting"]
    assert call["name"] == "send_message"
    assert call["arguments"] == {"to": "Alice", "text": "In Oslo it is 9 °C and snowing."}
    assert (await http.get("/outbox")).json() == []

    done = await http.post(f"/approvals/{body['run_id']}", json={"approve": True})
    assert done.json()["status"] == "completed"
    assert done.json()["answer"] == (
        "In Oslo it is 9 °C and snowing (from get_weather). "
        "I sent your message to Alice (with send_message)."
    )
    (sent,) = (await http.get("/outbox")).json()
    assert (sent["to"], sent["text"]) == ("Alice", "In Oslo it is 9 °C and snowing.")

    replay = await http.post(f"/approvals/{body['run_id']}", json={"approve": True})
    assert replay.status_code == 404
    assert replay.headers["content-type"] == "application/problem+json"
    assert replay.json()["title"] == "NotFound"
    assert len((await http.get("/outbox")).json()) == 1


async def test_a_rejected_call_never_runs(http: httpx.AsyncClient) -> None:
    paused = (await http.post("/ask", json={"prompt": "tell Bob that lunch is at noon"})).json()
    assert paused["awaiting"][0]["arguments"] == {"to": "Bob", "text": "lunch is at noon"}
    done = await http.post(
        f"/approvals/{paused['run_id']}", json={"approve": False, "reason": "not today"}
    )
    assert done.json()["answer"] == (
        "I did not send the message: a reviewer rejected this call: not today."
    )
    assert (await http.get("/outbox")).json() == []


async def test_chat_keeps_a_session(http: httpx.AsyncClient) -> None:
    first = (await http.post("/chat/s1", json={"message": "weather in Tokyo?"})).json()
    assert first["answer"] == "In Tokyo it is 22 °C and clear (from get_weather)."
    second = (await http.post("/chat/s1", json={"message": "and in Berlin?"})).json()
    assert second["answer"] == (
        "In Berlin it is 16 °C and sunny (from get_weather). This is message 2 of our conversation."
    )
    paused = (await http.post("/chat/s1", json={"message": "tell Carol hi"})).json()
    done = (await http.post(f"/approvals/{paused['run_id']}", json={"approve": True})).json()
    assert done["answer"] == (
        "I sent your message to Carol (with send_message). This is message 3 of our conversation."
    )
    fourth = (await http.post("/chat/s1", json={"message": "thanks"})).json()
    assert fourth["answer"].endswith("This is message 4 of our conversation.")
    fresh = (await http.post("/chat/s2", json={"message": "thanks"})).json()
    assert "This is message" not in fresh["answer"]


async def test_stream_sends_the_runs_events(http: httpx.AsyncClient) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    async with http.stream("POST", "/ask/stream", json={"prompt": "weather in Oslo"}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        event = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((event, json.loads(line.removeprefix("data: "))))
    names = [name for name, _ in events]
    assert names[0] == "run_start"
    assert names[-1] == "run_end"
    assert ("tool_end", "get_weather") in [(n, d.get("name")) for n, d in events]
    text = "".join(d["text"] for n, d in events if n == "text_delta")
    assert text == "In Oslo it is 9 °C and snowing (from get_weather)."


async def test_health_tools_and_openapi(http: httpx.AsyncClient) -> None:
    health = await http.get("/health")
    notes = {"transport": "stdio", "tools": 2, "connects": 1, "protocol": "2026-07-28"}
    assert health.json() == {
        "status": "UP",
        "components": {
            "agent": {"status": "UP", "details": {"provider": "scripted", "models": 1}},
            "mcp:notes": {"status": "UP", "details": notes},
        },
    }
    ready = (await http.get("/health/ready")).json()
    assert ready["status"] == "UP"
    assert {name: c["status"] for name, c in ready["components"].items()} == {
        "database": "UP",
        "redis": "UP",
    }
    tools = {t["name"]: t["effect"] for t in (await http.get("/agent/tools")).json()}
    assert tools == {
        "get_time": "read_only",
        "get_weather": "read_only",
        "notes_add_note": "write",
        "notes_list_notes": "read_only",
        "send_message": "external",
    }

    schema = (await http.get("/openapi.json")).json()
    validate(schema)
    paths = schema["paths"]
    for path, method in [
        ("/ask", "post"),
        ("/ask/stream", "post"),
        ("/chat/{session_id}", "post"),
        ("/approvals/{run_id}", "post"),
        ("/outbox", "get"),
        ("/agent/tools", "get"),
        ("/health", "get"),
        ("/health/ready", "get"),
    ]:
        assert method in paths[path], path
    assert "agent" in paths["/agent/tools"]["get"]["tags"]
    assert "503" in paths["/agent/tools"]["get"]["responses"]
    assert "text/event-stream" in paths["/ask/stream"]["post"]["responses"]["200"]["content"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_the_documented_curl_command(base_url: str) -> None:
    process = await asyncio.create_subprocess_exec(
        "curl",
        "-s",
        f"{base_url}/ask",
        "-H",
        "content-type: application/json",
        "-d",
        '{"prompt": "What is the weather in Paris?"}',
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await process.communicate()
    assert json.loads(out)["answer"] == "In Paris it is 18 °C and cloudy (from get_weather)."


def test_the_demo_model_is_scripted_only_when_configured(tmp_path: Path) -> None:
    empty = tmp_path / "agent.toml"
    empty.write_text("")
    scripted = AgentSettings.load(environ={}, config_file=main.CONFIG_FILE)
    assert scripted.provider == "scripted"
    assert main.demo_model(scripted) is not None
    anthropic = AgentSettings.load({"provider": "anthropic"}, environ={}, config_file=empty)
    assert main.demo_model(anthropic) is None


def test_the_demo_reply_plans_from_the_prompt() -> None:
    def first(prompt: str) -> Any:
        return demo_reply(ChatRequest(messages=[ChatMessage.user(prompt)]))

    assert first("weather in new york please") == tool_call("get_weather", {"city": "New York"})
    assert first("How warm is it in Reykjavik?") == tool_call("get_weather", {"city": "Reykjavik"})
    assert first("message dave: the build is green") == tool_call(
        "send_message", {"to": "Dave", "text": "the build is green"}
    )
    assert first("what can you do?") == tool_call("get_time")
    assert first("Remember that the demo speaks MCP.") == tool_call(
        "notes_add_note", {"text": "the demo speaks MCP"}
    )
    assert first("What are my notes?") == tool_call("notes_list_notes")


async def test_notes_from_the_mcp_server_the_demo_starts(http: httpx.AsyncClient) -> None:
    paused = (await http.post("/ask", json={"prompt": "Remember that MCP works"})).json()
    assert paused["status"] == "awaiting_approval"
    assert [call["name"] for call in paused["awaiting"]] == ["notes_add_note"]
    approved = await http.post(f"/approvals/{paused['run_id']}", json={"approve": True})
    assert approved.json()["answer"] == "I wrote it down (with notes_add_note): noted (1 notes)"
    listed = (await http.post("/ask", json={"prompt": "What are my notes?"})).json()
    assert listed["status"] == "completed"  # reading needs no approval
    assert listed["answer"] == "Your notes (with notes_list_notes): - MCP works"
