"""A registered secret streamed to a client over SSE, split across text deltas, must not be
published whole in pieces: the deltas a client joins are what it reads."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import FastAPI
from pydantic import BaseModel

from agent_plugin import AgentPlugin
from agent_plugin.config import AgentSettings
from agent_plugin.messages import TextPart
from agent_plugin.providers.base import ChatResponse
from agent_plugin.providers.scripted import ScriptedModel
from agent_plugin.sessions import InMemorySessionStore
from agent_plugin.web import AgentHandle
from tests.test_live_routes import frames

PASSPHRASE = "correct horse battery staple"
"""A tool's passphrase, registered with AgentPlugin(secrets=...): four words."""


class Question(BaseModel):
    prompt: str


async def streamed_text(pieces: list[str]) -> tuple[str, str]:
    """The text deltas of a foreground stream whose model answers ``pieces`` (one delta
    each), joined, and the whole SSE body."""
    reply = ChatResponse(content=[TextPart(text=piece) for piece in pieces])
    plugin = AgentPlugin(
        model=ScriptedModel([reply]),
        session_store=InMemorySessionStore(),
        settings=AgentSettings(provider="scripted"),
        secrets=[PASSPHRASE],
    )
    app = FastAPI()
    plugin.install(app, allow_anonymous=True)

    @app.post("/ask/stream")
    async def ask_stream(question: Question, agent: AgentHandle) -> Any:
        return agent.stream(question.prompt)

    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://app") as client,
    ):
        response = await client.post("/ask/stream", json={"prompt": "the passphrase?"})
    assert response.status_code == 200, response.text
    deltas = [f["data"]["text"] for f in frames(response.text) if f["event"] == "text_delta"]
    return "".join(deltas), response.text


async def test_a_registered_secret_in_one_delta_is_redacted() -> None:
    text, body = await streamed_text([f"It is {PASSPHRASE}, keep it safe."])
    assert PASSPHRASE not in text
    assert PASSPHRASE not in body
    assert "[REDACTED]" in text


async def test_a_registered_secret_of_four_words_split_across_deltas_is_redacted() -> None:
    pieces = ["Your passphrase is ", "correct ", "horse ", "battery ", "staple", " and that is it"]
    text, _ = await streamed_text(pieces)
    assert "and that is it" in text
    assert PASSPHRASE not in text


async def test_a_delta_cut_never_lands_inside_a_registered_secret() -> None:
    # the secret's words come in one delta with more text: holding back the last four words
    # would cut the passphrase after "battery", publishing a clean prefix and a clean rest
    pieces = ["It is correct horse battery staple x y", " z and that is it"]
    text, _ = await streamed_text(pieces)
    assert "and that is it" in text
    assert PASSPHRASE not in text
    assert "correct horse battery" not in text
