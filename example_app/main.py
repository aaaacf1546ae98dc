"""The demo: a FastAPI app whose agent looks up the weather, sends messages (with approval) and
keeps notes in a local MCP server it starts (``example_app/notes_server.py``).

Start it from the repository root, with no API key::

    pip install -e '.[demo]' && uvicorn example_app.main:app

and ask it something::

    curl -s localhost:8000/ask -H 'content-type: application/json' \\
         -d '{"prompt": "What is the weather in Paris?"}'
    {"status":"completed","answer":"In Paris it is 18 °C and cloudy (from get_weather).", ...}

Routes (all documented at ``/docs``):

* ``POST /ask`` runs one task; ``POST /ask/stream`` streams its events (Server-Sent Events);
* ``POST /chat/{session_id}`` continues a conversation kept in the session store;
* a prompt that asks to tell someone something (``"Tell Alice the weather in Oslo"``) pauses
  before ``send_message`` runs: the answer has ``status: "awaiting_approval"`` and a ``run_id``;
  ``POST /approvals/{run_id}`` with ``{"approve": true}`` (or ``false`` and a ``reason``)
  resumes it. The paused run's state stays on the server; the client only names it;
* notes come from an MCP server the plugin starts as a subprocess (and each worker starts its
  own, so notes are per process): ``"Remember that the demo speaks MCP"`` pauses before
  ``notes_add_note`` (a write), ``"What are my notes?"`` runs ``notes_list_notes`` (read only);
* ``GET /outbox`` shows the messages sent; ``GET /agent/tools`` lists the tools;
  ``GET /health`` reports the model provider and the notes server, ``GET /health/ready``
  readiness;
* background runs (with Redis and a worker, ``arq example_app.worker.WorkerSettings``):
  ``POST /agent/runs`` with ``{"prompt": ...}`` queues a run and answers 202 with its
  ``status_path``; ``GET /agent/runs/{run_id}`` reports it; a run that waits for approval is
  resumed with ``POST /agent/runs/{run_id}/decisions``.

By default the model is scripted (``provider = "scripted"`` in ``example_app/agent.toml``): its
replies are a function of the conversation, so any prompt leads to a tool call and an answer
built from the tool's result. To use a real model, change that one line to
``provider = "openai-compatible"`` (or ``"anthropic"``) and export ``AGENT_API_KEY``; a local
server such as Ollama needs ``base_url`` instead of a key. ``AGENT_CONFIG_FILE`` points the demo
at another config file, and ``AGENT_*`` variables override single keys
(``AGENT_DATABASE_URL``, ``AGENT_PROVIDER``, ...).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Final

from fastapi import Depends, FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field, JsonValue

from agent_plugin import (
    AgentError,
    AgentOutcome,
    ApprovalDecision,
    AwaitingApproval,
    ChatMessage,
    ChatRequest,
    Completed,
    ErrorKind,
    LlmClient,
    Paused,
    Role,
    RunState,
    ScriptedModel,
    ToolCall,
    ToolContext,
    ToolEffect,
    ToolRules,
    tool,
)
from agent_plugin.config import AgentSettings
from agent_plugin.mcp import MCPServer
from agent_plugin.messages import ToolResultPart
from agent_plugin.outcomes import NeedsApproval
from agent_plugin.providers.scripted import Reply, tool_call
from agent_plugin.web import AgentHandle, AgentPlugin

__all__ = [
    "NOTES_SERVER",
    "app",
    "demo_model",
    "demo_reply",
    "get_time",
    "get_weather",
    "plugin",
    "send_message",
]

CONFIG_FILE: Final = os.environ.get("AGENT_CONFIG_FILE") or Path(__file__).with_name("agent.toml")


# --- tools ------------------------------------------------------------------------------------

_WEATHER: Final[dict[str, tuple[int, str]]] = {
    "paris": (18, "cloudy"),
    "london": (14, "raining"),
    "berlin": (16, "sunny"),
    "oslo": (9, "snowing"),
    "tokyo": (22, "clear"),
    "new york": (20, "windy"),
    "sydney": (25, "sunny"),
    "madrid": (27, "hot and dry"),
}
_CONDITIONS: Final = ("sunny", "cloudy", "raining", "windy", "foggy", "clear")


@tool(effect=ToolEffect.READ_ONLY)
def get_weather(city: Annotated[str, "The city, for example Paris"]) -> dict[str, JsonValue]:
    """Current weather for a city (demo data: made up, but the same for the same city)."""
    name = " ".join(city.split()).title()
    known = _WEATHER.get(name.lower())
    if known is None:
        digest = hashlib.sha256(name.lower().encode()).digest()
        known = (digest[0] % 30, _CONDITIONS[digest[1] % len(_CONDITIONS)])
    temperature, conditions = known
    return {"city": name, "temperature_c": temperature, "conditions": conditions}


@tool(effect=ToolEffect.READ_ONLY)
def get_time() -> dict[str, JsonValue]:
    """The current date and time in UTC."""
    return {"utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M")}


class SentMessage(BaseModel):
    id: str
    to: str
    text: str


OUTBOX: Final[deque[SentMessage]] = deque(maxlen=100)
"""What ``send_message`` sent (the last 100): the demo's stand-in for an email or chat API."""


@tool(effect=ToolEffect.EXTERNAL)
async def send_message(
    to: Annotated[str, "Who gets the message, for example Alice"],
    text: Annotated[str, "The message"],
    ctx: ToolContext,
) -> dict[str, JsonValue]:
    """Send a message to someone. Reaches outside the app, so it needs approval."""
    message_id = f"{ctx.run_id}:{ctx.call_id}"  # a retried call does not send twice
    if not any(sent.id == message_id for sent in OUTBOX):
        OUTBOX.append(SentMessage(id=message_id, to=to, text=text))
    return {"sent": True, "to": to, "id": message_id}


NOTES_SERVER: Final = MCPServer.stdio(
    "notes", sys.executable, [str(Path(__file__).with_name("notes_server.py"))], trusted=True
)
"""The notes MCP server, started with the app (and with each worker). Trusted: its annotations
make ``notes_list_notes`` read only and ``notes_add_note`` a write, which needs approval."""


# --- the scripted model -----------------------------------------------------------------------

_RECIPIENT: Final = re.compile(
    r"\b(?i:tell|message|text|notify|send)\s+(?:(?i:a message to|a note to|to)\s+)?([A-Za-z][\w-]*)"
)
_CITY: Final = re.compile(r"\b(?i:in|for|at)\s+([A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)*)")
_NOT_NAMES: Final = frozenset({"me", "us", "the", "a", "an", "him", "her", "them", "about"})
_NOTE: Final = re.compile(r"\b(?i:remember|note down)\s+(?:(?i:that)\s+)?(?P<text>\S.*)")
_NOTES: Final = re.compile(r"\b(?i:notes)\b")


def _find_city(prompt: str) -> str | None:
    lowered = prompt.lower()
    for city in _WEATHER:
        if re.search(rf"\b{re.escape(city)}\b", lowered):
            return city.title()
    match = _CITY.search(prompt)
    return match.group(1) if match else None


def _find_recipient(prompt: str) -> tuple[str, str] | None:
    """Who to tell, and what (the words after the name, without a leading "that")."""
    match = _RECIPIENT.search(prompt)
    if match is None or match.group(1).lower() in _NOT_NAMES:
        return None
    rest = prompt[match.end() :].strip(" .,:;!?")
    rest = re.sub(r"^(?i:that)\s+", "", rest)
    return match.group(1).title(), rest


def _result_data(content: str) -> dict[str, JsonValue]:
    try:
        value = json.loads(content)
    except ValueError:
        return {"error": content}
    return value if isinstance(value, dict) else {"value": value}


def _weather_sentence(data: dict[str, JsonValue]) -> str:
    return f"In {data['city']} it is {data['temperature_c']} °C and {data['conditions']}"


def demo_reply(request: ChatRequest) -> Reply:
    """The demo model's next reply, worked out from the conversation.

    For the latest user message it plans tool calls (``get_weather`` for a city it names,
    ``send_message`` when it asks to tell someone, ``get_time`` otherwise), makes the next call
    that has no result yet, and once all have answered replies with a sentence built from the
    results.
    """
    messages = [m for m in request.messages if m.role is not Role.SYSTEM]
    start = max((i for i, m in enumerate(messages) if m.role is Role.USER), default=0)
    prompt = messages[start].text if messages else ""
    calls: dict[str, ToolCall] = {}
    results: dict[str, dict[str, JsonValue]] = {}
    for message in messages[start + 1 :]:
        for call in message.tool_calls:
            calls[call.id] = call
        for part in message.content:
            if isinstance(part, ToolResultPart):
                answered = calls.get(part.tool_result.tool_call_id)
                if answered is not None:
                    results[answered.name] = _result_data(part.tool_result.content)

    note = _NOTE.search(prompt)
    if note is not None:
        if "notes_add_note" not in results:
            return tool_call("notes_add_note", {"text": note["text"].strip(" .!")})
        return _answer(results, _user_turns(messages))
    if _NOTES.search(prompt):
        if "notes_list_notes" not in results:
            return tool_call("notes_list_notes")
        return _answer(results, _user_turns(messages))
    city = _find_city(prompt)
    recipient = _find_recipient(prompt)
    if city is not None and "get_weather" not in results:
        return tool_call("get_weather", {"city": city})
    if recipient is not None and "send_message" not in results:
        to, text = recipient
        weather = results.get("get_weather")
        if weather is not None and "error" not in weather:
            text = _weather_sentence(weather) + "."
        return tool_call("send_message", {"to": to, "text": text or prompt})
    if city is None and recipient is None and "get_time" not in results:
        return tool_call("get_time")
    return _answer(results, _user_turns(messages))


def _user_turns(messages: list[ChatMessage]) -> int:
    return sum(1 for m in messages if m.role is Role.USER and not m.tool_calls and m.text.strip())


def _answer(results: dict[str, dict[str, JsonValue]], turns: int) -> str:
    sentences: list[str] = []
    weather = results.get("get_weather")
    if weather is not None:
        if "error" in weather:
            sentences.append(f"I could not get the weather: {weather['error']}.")
        else:
            sentences.append(_weather_sentence(weather) + " (from get_weather).")
    sent = results.get("send_message")
    if sent is not None:
        if "error" in sent:
            sentences.append(f"I did not send the message: {sent['error']}.")
        else:
            sentences.append(f"I sent your message to {sent['to']} (with send_message).")
    now = results.get("get_time")
    if now is not None:
        sentences.append(
            f"It is {now.get('utc')} UTC (from get_time). Ask me about the weather in a city, "
            "or to tell someone something."
        )
    for name, done in (("notes_add_note", "I wrote it down"), ("notes_list_notes", "Your notes")):
        result = results.get(name)
        if result is not None and "error" in result:
            sentences.append(f"{name} did not run: {result['error']}.")
        elif result is not None:
            sentences.append(f"{done} (with {name}): {result.get('value')}")
    if turns > 1:
        sentences.append(f"This is message {turns} of our conversation.")
    return " ".join(sentences)


class DemoModel(ScriptedModel):
    """The scripted model with :func:`demo_reply` as its only reply; keeps no request log
    (a server runs for long)."""

    def __init__(self) -> None:
        super().__init__(default=demo_reply, models=("scripted-demo",), keep_requests=0)


def demo_model(settings: AgentSettings) -> LlmClient | None:
    """The demo model when ``provider = "scripted"``; otherwise the configured provider."""
    return DemoModel() if settings.provider == "scripted" else None


# --- the app ----------------------------------------------------------------------------------


class ApprovalDesk:
    """Paused runs waiting for a reviewer, by run id; kept on the server, never sent out."""

    def __init__(self, capacity: int = 1000) -> None:
        self.capacity = capacity
        self._states: dict[str, RunState] = {}

    def park(self, state: RunState) -> None:
        if len(self._states) >= self.capacity:
            self._states.pop(next(iter(self._states)))
        self._states[state.run_id] = state

    def take(self, run_id: str) -> RunState:
        state = self._states.pop(run_id, None)
        if state is None:
            raise AgentError(ErrorKind.NOT_FOUND, f"no run {run_id!r} is waiting for approval")
        return state

    def __len__(self) -> int:
        return len(self._states)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The app's own startup and shutdown; the plugin wraps it (it starts first)."""
    app.state.approvals = ApprovalDesk()
    yield
    app.state.approvals = None


def get_desk(request: Request) -> ApprovalDesk:
    desk = getattr(request.app.state, "approvals", None)
    if not isinstance(desk, ApprovalDesk):
        raise AgentError(ErrorKind.UNAVAILABLE, "the app has not started")
    return desk


Desk = Annotated[ApprovalDesk, Depends(get_desk)]


class AskBody(BaseModel):
    prompt: str = Field(min_length=1, max_length=4000, examples=["What is the weather in Paris?"])


class ChatBody(BaseModel):
    message: str = Field(min_length=1, max_length=4000, examples=["Tell Alice it will rain"])


class DecisionBody(BaseModel):
    approve: bool
    reason: str = Field(default="declined by the reviewer", max_length=500)


class PendingCallView(BaseModel):
    call_id: str
    name: str
    arguments: JsonValue
    reason: str


class Answer(BaseModel):
    """How a run ended: the answer, or the calls that wait for approval under ``run_id``."""

    status: str = Field(examples=["completed"])
    answer: str | None = None
    run_id: str | None = None
    awaiting: list[PendingCallView] = []
    steps_used: int = 0


def _answer_of(outcome: AgentOutcome, desk: ApprovalDesk) -> Answer:
    if isinstance(outcome, AwaitingApproval | Paused):
        desk.park(outcome.state)
        awaiting = [
            PendingCallView(
                call_id=p.call.id,
                name=p.call.name,
                arguments=p.call.arguments,
                reason=p.status.reason,
            )
            for p in outcome.state.awaiting()
            if isinstance(p.status, NeedsApproval)
        ]
        return Answer(
            status=outcome.status,
            run_id=outcome.state.run_id,
            awaiting=awaiting,
            steps_used=outcome.steps_used,
        )
    text = outcome.text if isinstance(outcome, Completed) else None
    return Answer(status=outcome.status, answer=text, steps_used=outcome.steps_used)


plugin = AgentPlugin(
    tools=[get_weather, get_time, send_message],
    toolsets=[NOTES_SERVER],
    policy=ToolRules.ask_before_acting(),
    model=demo_model,
    config_file=CONFIG_FILE,
)

app = FastAPI(
    title="fastapi-agent-plugin demo",
    summary="An agent with a weather tool, a message tool that needs approval, and notes kept "
    "by an MCP server.",
    lifespan=lifespan,
)
plugin.install(app, runs_route=True, allow_anonymous=True)  # a demo: no users to keep apart


@app.post("/ask", response_model=Answer, tags=["demo"])
async def ask(body: AskBody, agent: AgentHandle, desk: Desk) -> Answer:
    """Run one task; the answer is built from the tools the agent called."""
    return _answer_of((await agent.run(body.prompt)).outcome, desk)


@app.post(
    "/ask/stream",
    response_class=StreamingResponse,
    tags=["demo"],
    responses={200: {"content": {"text/event-stream": {}}, "description": "The run's events"}},
)
async def ask_stream(body: AskBody, agent: AgentHandle) -> StreamingResponse:
    """Run one task and stream its events as Server-Sent Events (``run_end`` comes last)."""
    return agent.stream(body.prompt)


@app.post("/chat/{session_id}", response_model=Answer, tags=["demo"])
async def chat(session_id: str, body: ChatBody, agent: AgentHandle, desk: Desk) -> Answer:
    """Continue the conversation ``session_id`` (kept in the session store)."""
    return _answer_of((await agent.chat(session_id, body.message)).outcome, desk)


@app.post("/approvals/{run_id}", response_model=Answer, tags=["demo"])
async def decide(run_id: str, body: DecisionBody, agent: AgentHandle, desk: Desk) -> Answer:
    """Approve or reject every call the paused run ``run_id`` waits for, and resume it."""
    state = desk.take(run_id)
    decisions = [
        ApprovalDecision.approve(p.call.id)
        if body.approve
        else ApprovalDecision.reject(p.call.id, body.reason)
        for p in state.awaiting()
    ]
    try:
        turn = await agent.resume(state, decisions)
    except AgentError as error:
        if error.retryable:  # the provider had a bad moment: the reviewer may try again
            desk.park(state)
        raise
    return _answer_of(turn.outcome, desk)


@app.get("/outbox", response_model=list[SentMessage], tags=["demo"])
async def outbox() -> list[SentMessage]:
    """The messages ``send_message`` sent, oldest first."""
    return list(OUTBOX)
