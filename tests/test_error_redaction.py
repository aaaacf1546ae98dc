"""What a provider answered reaches HTTP error responses and health reports redacted by the
rules of what is published (``password: ...``, ``"api_key": "..."``), not only by the
credential patterns: the log line of the same error was redacted, the answers were not."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from agent_plugin import AgentPlugin
from agent_plugin.config import AgentSettings
from agent_plugin.errors import AgentError, ErrorKind, describe
from agent_plugin.sessions import InMemorySessionStore
from agent_plugin.web import AgentHandle
from agent_plugin.web.sse import _error_frame
from tests.httpserver import HttpServer, Reply

PASSWORD = "Hunter2-Prov-77aa"  # no familiar shape: only the name it is given betrays it

ANSWERS = {
    "assignment": f"upstream says: password: {PASSWORD}",
    "json field": json.dumps({"error": {"message": "no", "api_key": PASSWORD}}),
}


class Question(BaseModel):
    prompt: str


@pytest.fixture(params=sorted(ANSWERS))
async def client(request: pytest.FixtureRequest) -> AsyncIterator[httpx.AsyncClient]:
    async with HttpServer() as server:
        server.default = Reply(400, {"content-type": "application/json"}, ANSWERS[request.param])
        plugin = AgentPlugin(
            session_store=InMemorySessionStore(),
            settings=AgentSettings(provider="openai", base_url=server.url + "/v1", model="m"),
        )
        app = FastAPI()
        plugin.install(app, allow_anonymous=True)

        @app.post("/ask")
        async def ask(question: Question, agent: AgentHandle) -> Any:
            return (await agent.run(question.prompt)).text

        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://app") as http,
        ):
            yield http


async def test_a_provider_error_in_a_problem_response_is_redacted(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    response = await client.post("/ask", json={"prompt": "hi"})
    assert response.status_code == 502, response.text
    assert response.json()["kind"] == "provider"
    assert "[REDACTED]" in response.json()["detail"]
    assert PASSWORD not in response.text
    assert "POST /ask failed" in caplog.text
    assert PASSWORD not in caplog.text


async def test_a_provider_error_in_the_health_report_is_redacted(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/health")
    assert response.status_code == 503, response.text
    error = response.json()["components"]["agent"]["details"]["error"]
    assert "answered 400" in error
    assert PASSWORD not in response.text


@pytest.mark.parametrize(
    "error",
    [
        AgentError(ErrorKind.TOOL, f"login refused, password: {PASSWORD}"),
        RuntimeError(f"login refused, password: {PASSWORD}"),
        OSError(f"login refused, password: {PASSWORD}"),
    ],
    ids=["agent error", "other", "outage"],
)
def test_describe_and_the_sse_error_frame_redact_assignments(error: Exception) -> None:
    assert PASSWORD not in describe(error)
    assert PASSWORD not in _error_frame(error)
