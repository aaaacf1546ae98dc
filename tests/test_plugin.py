"""The FastAPI plugin through HTTP (httpx's ASGI transport): builder, startup, routes, errors,
health [AP-07, AP-08, AP-50, AP-51, reference §1.20, §1.23 plugin and health cases]."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import httpx
import pytest
from fastapi import Depends, FastAPI, Header, HTTPException
from pydantic import BaseModel

from agent_plugin.config import AgentSettings
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.options import AgentOverrides
from agent_plugin.outcomes import ApprovalDecision, AwaitingApproval, Completed, RunState
from agent_plugin.policy import ToolRules
from agent_plugin.providers.base import ChatRequest, LlmClient
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.runtime import AgentRuntime
from agent_plugin.sessions import InMemorySessionStore
from agent_plugin.tools import ToolEffect, tool
from agent_plugin.web import PROBLEM_TYPE_PREFIX, AgentHandle, AgentPlugin
from agent_plugin.web.handle import NOT_INSTALLED
from agent_plugin.web.health import NOT_STARTED, AgentHealth, ComponentHealth
from tests.httpserver import Hang, HttpServer, reply_json

SCRIPTED = '[agent]\nprovider = "scripted"\n'


@tool(effect=ToolEffect.READ_ONLY)
def get_weather(city: str) -> dict[str, str]:
    """The weather in a city."""
    return {"city": city, "sky": "sunny"}


@tool(effect=ToolEffect.EXTERNAL)
def send_message(to: str, text: str) -> str:
    """Send a message."""
    return f"sent to {to}"


class TrackedModel(ScriptedModel):
    """A scripted model that counts model listings and closes."""

    def __init__(self, *replies: Any, models: tuple[str, ...] = ("m1", "m2")) -> None:
        super().__init__(replies, models=models)
        self.listed = 0
        self.closed = 0

    async def list_models(self) -> list[str]:
        self.listed += 1
        return await super().list_models()

    async def aclose(self) -> None:
        self.closed += 1


def config(tmp_path: Path, text: str = SCRIPTED) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text, encoding="utf-8")
    return path


def make_plugin(tmp_path: Path, text: str = SCRIPTED, **options: Any) -> AgentPlugin:
    """A plugin reading ``text`` as its config file, an empty environment, in-memory sessions."""
    options.setdefault("environ", {})
    options.setdefault("session_store", InMemorySessionStore())
    return AgentPlugin(config_file=config(tmp_path, text), **options)


class Prompt(BaseModel):
    prompt: str


class ResumeBody(BaseModel):
    state: RunState
    decisions: list[ApprovalDecision] = []


def running(app: FastAPI) -> AgentRuntime:
    """The runtime the app's plugin started."""
    runtime = app.state.agent_plugin.runtime(app)
    assert runtime is not None
    return runtime


def make_app(plugin: AgentPlugin | None, **install: Any) -> FastAPI:
    """An app with one route per handle method (this test app trusts a client's RunState)."""
    app = FastAPI()
    if plugin is not None:
        plugin.install(app, **install)

    @app.post("/run")
    async def run(body: Prompt, agent: AgentHandle) -> dict[str, Any]:
        return (await agent.run(body.prompt)).outcome.model_dump(mode="json")

    @app.post("/chat/{session}")
    async def chat(session: str, body: Prompt, agent: AgentHandle) -> dict[str, Any]:
        return (await agent.chat(session, body.prompt)).outcome.model_dump(mode="json")

    @app.post("/chat-as/{scope}/{session}")
    async def chat_as(scope: str, session: str, body: Prompt, agent: AgentHandle) -> Any:
        turn = await agent.chat(session, body.prompt, scope=scope)
        return turn.outcome.model_dump(mode="json")

    @app.post("/resume")
    async def resume(body: ResumeBody, agent: AgentHandle) -> dict[str, Any]:
        return (await agent.resume(body.state, body.decisions)).outcome.model_dump(mode="json")

    @app.post("/resume-as/{scope}")
    async def resume_as(scope: str, body: ResumeBody, agent: AgentHandle) -> dict[str, Any]:
        turn = await agent.resume(body.state, body.decisions, scope=scope)
        return turn.outcome.model_dump(mode="json")

    @app.get("/tool-names")
    async def tool_names(agent: AgentHandle) -> list[str]:
        return agent.tool_names()

    @app.post("/stream")
    async def stream(body: Prompt, agent: AgentHandle) -> Any:
        return agent.stream(body.prompt)

    @app.post("/stream/{session}")
    async def stream_in(session: str, body: Prompt, agent: AgentHandle, branch: int) -> Any:
        return agent.stream(body.prompt, session=session, branch=branch)

    @app.get("/fail/{kind}")
    async def fail(kind: ErrorKind, retry_after: float | None = None) -> None:
        raise AgentError(kind, f"{kind.value} went wrong", provider="p", retry_after=retry_after)

    return app


@asynccontextmanager
async def serve(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """Run the app's lifespan and talk to it over httpx's ASGI transport."""
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client,
    ):
        yield client


def client_of(app: FastAPI) -> httpx.AsyncClient:
    """A client for an app whose lifespan is not run (the plugin has not started)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app")


async def start_error(plugin: AgentPlugin) -> AgentError:
    app = FastAPI()
    plugin.install(app)
    with pytest.raises(AgentError) as caught:
        async with app.router.lifespan_context(app):
            pass
    return caught.value


def sse_frames(text: str) -> list[dict[str, str]]:
    frames = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        frames.append(fields)
    return frames


# --- builder [reference §1.23 plugin] ---------------------------------------------------------


def test_builder_defaults(tmp_path: Path) -> None:
    path = config(tmp_path, "")
    plugin = AgentPlugin(environ={}, config_file=path)
    assert plugin.registered_tools == []
    assert plugin.registered_hooks == []
    assert plugin.policy is None
    assert plugin.model is None
    assert plugin.session_store is None
    assert plugin.memory_store is None
    assert plugin.auto_migrate is None
    assert plugin.overrides == {}
    assert isinstance(plugin.health, AgentHealth)
    assert plugin.load_settings() == AgentSettings.load(environ={}, config_file=path)


def test_configure_tunes_config(tmp_path: Path) -> None:
    plugin = make_plugin(tmp_path)
    assert plugin.configure(max_steps=3, system_prompt="Be brief.") is plugin
    assert plugin.configure(lambda s: {"max_tokens": s.max_tokens * 2}) is plugin
    settings = plugin.load_settings()
    assert (settings.max_steps, settings.system_prompt, settings.max_tokens) == (
        3,
        "Be brief.",
        64000,
    )
    assert settings.provider == "scripted"


def test_apply_overrides_prefers_explicit_values(tmp_path: Path) -> None:
    plugin = make_plugin(tmp_path, SCRIPTED + "max_steps = 7\nmax_tokens = 5000\n")
    plugin.configure(max_steps=3)
    settings = plugin.load_settings()
    assert settings.max_steps == 3
    assert settings.max_tokens == 5000


def test_apply_overrides_keeps_loaded_when_builder_is_default(tmp_path: Path) -> None:
    text = SCRIPTED + 'max_steps = 7\nsystem_prompt = "from the file"\n'
    assert make_plugin(tmp_path, text).load_settings().max_steps == 7
    # our rule: an override that is *set* wins, even when it equals the default (10)
    settings = make_plugin(tmp_path, text).configure(max_steps=10).load_settings()
    assert settings.max_steps == 10
    assert settings.system_prompt == "from the file"


def test_env_sits_between_the_file_and_code(tmp_path: Path) -> None:
    plugin = make_plugin(tmp_path, SCRIPTED + "max_steps = 7\n", environ={"AGENT_MAX_STEPS": "8"})
    assert plugin.load_settings().max_steps == 8
    assert plugin.configure(max_steps=9).load_settings().max_steps == 9


def test_given_settings_are_used_without_reading_file_or_environment() -> None:
    given = AgentSettings.load({"provider": "scripted", "max_steps": 4}, environ={})
    plugin = AgentPlugin(settings=given, environ={"AGENT_MAX_STEPS": "99"})
    assert plugin.load_settings() is given
    assert plugin.configure(max_tokens=2000).load_settings().max_tokens == 2000
    with pytest.raises(AgentError, match="max_steps"):
        AgentPlugin(settings=given).configure(max_steps=0).load_settings()


async def test_tool_registration_collects_tools(tmp_path: Path) -> None:
    @tool
    def third() -> str:
        """A third tool."""
        return "3"

    plugin = make_plugin(tmp_path, tools=[get_weather]).tool(send_message).tools([third])
    assert [t.name for t in plugin.registered_tools] == ["get_weather", "send_message", "third"]
    async with serve(make_app(plugin)) as client:
        assert (await client.get("/tool-names")).json() == ["get_weather", "send_message", "third"]
        listed = (await client.get("/agent/tools")).json()
    assert [t["name"] for t in listed] == ["get_weather", "send_message", "third"]
    assert listed[0]["effect"] == "read_only"
    assert listed[0]["input_schema"]["properties"]["city"]["type"] == "string"

    duplicate = make_plugin(tmp_path, tools=[get_weather, get_weather])
    error = await start_error(duplicate)
    assert "get_weather" in error.message
    assert "already registered" in error.message


# --- startup fails fast [AP-07] ---------------------------------------------------------------


async def test_missing_key_for_a_public_host_fails_startup(tmp_path: Path) -> None:
    plugin = make_plugin(tmp_path, '[agent]\nprovider = "openai"\n')
    error = await start_error(plugin)
    assert error.kind is ErrorKind.CONFIG
    assert "could not start" in error.message
    assert "AGENT_API_KEY" in error.message
    assert "api.openai.com" in error.message

    keyed = make_plugin(
        tmp_path, '[agent]\nprovider = "anthropic"\n', environ={"AGENT_API_KEY": "sk-ant-x1"}
    )
    app = make_app(keyed)
    async with serve(app):
        runtime = running(app)
        assert runtime.client.provider_name == "anthropic"
        assert "sk-ant-x1" not in repr(runtime) + repr(runtime.client)


async def test_a_local_server_needs_no_key(tmp_path: Path) -> None:
    text = '[agent]\nprovider = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
    app = make_app(make_plugin(tmp_path, text))
    async with serve(app):
        assert running(app).client.provider_name == "openai-compatible"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (SCRIPTED + 'api_key = "sk-live"\n', ["AGENT_API_KEY", "agent.toml"]),
        (SCRIPTED + "max_stepz = 3\n", ["max_stepz", "did you mean 'max_steps'"]),
        ('[agent]\nprovider = "openai"\nbase_url = "ftp://models.local"\n', ["base_url", "http"]),
        (SCRIPTED + 'database_url = "not a url"\n', ["database_url", "SQLAlchemy URL"]),
        ('[agent]\nprovider = "gemini"\n', ["gemini", "accepted"]),
        ('agent = "scripted"\n', ["must be a table"]),
    ],
    ids=[
        "api-key-in-file",
        "unknown-key",
        "bad-url",
        "bad-database-url",
        "bad-provider",
        "no-table",
    ],
)
async def test_bad_config_fails_startup_naming_the_key(
    tmp_path: Path, text: str, expected: list[str]
) -> None:
    error = await start_error(make_plugin(tmp_path, text))
    assert error.kind is ErrorKind.CONFIG
    for fragment in expected:
        assert fragment in error.message
    assert "sk-live" not in error.message


async def test_bad_override_and_bad_env_name_their_source(tmp_path: Path) -> None:
    error = await start_error(make_plugin(tmp_path).configure(max_steps=0))
    assert "code override 'max_steps'" in error.message
    error = await start_error(make_plugin(tmp_path, environ={"AGENT_MAX_STEPS": "lots"}))
    assert "AGENT_MAX_STEPS" in error.message


async def test_unreachable_database_fails_startup_without_the_password(tmp_path: Path) -> None:
    environ = {
        "AGENT_DATABASE_URL": "postgresql+asyncpg://nobody:s3cret-pw@127.0.0.1:1/x",
        "AGENT_STARTUP_WAIT_SECS": "0",  # no waiting for it to come (tests/test_jobs_outages)
    }
    model = TrackedModel()
    plugin = make_plugin(tmp_path, environ=environ, session_store=None, model=lambda s: model)
    error = await start_error(plugin)
    assert "127.0.0.1:1" in error.message
    assert "nobody" in error.message
    assert "s3cret-pw" not in error.message
    assert model.closed == 1  # what startup had built is released


async def test_sqlite_is_migrated_at_startup_and_sessions_persist(tmp_path: Path) -> None:
    environ = {"AGENT_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'agent.db'}"}
    model = TrackedModel()
    model.default = lambda request: f"seen {len(request.messages)}"

    def plugin() -> AgentPlugin:
        return make_plugin(tmp_path, environ=environ, session_store=None, model=model)

    async with serve(make_app(plugin())) as client:
        first = await client.post("/chat/s1", json={"prompt": "hello"})
        assert first.json()["text"] == "seen 1"
    async with serve(make_app(plugin())) as client:  # a restart: the session is in the file
        second = await client.post("/chat/s1", json={"prompt": "again"})
        assert second.json()["text"] == "seen 3"
    assert model.closed == 0  # a client handed to the plugin is the app's to close


async def test_without_auto_migrate_an_old_schema_names_the_command(tmp_path: Path) -> None:
    environ = {"AGENT_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'agent.db'}"}
    plugin = make_plugin(tmp_path, environ=environ, session_store=None, auto_migrate=False)
    error = await start_error(plugin)
    assert "python -m agent_plugin migrate" in error.message
    assert "at migration none" in error.message

    from agent_plugin.storage import Database

    database = Database(environ["AGENT_DATABASE_URL"])
    await database.migrate()
    await database.dispose()
    plugin = make_plugin(tmp_path, environ=environ, session_store=None, auto_migrate=False)
    async with serve(make_app(plugin)) as client:
        assert (await client.post("/chat/s", json={"prompt": "hi"})).status_code == 200


# --- the handle [AP-50] -----------------------------------------------------------------------


async def test_503_without_the_plugin() -> None:
    async with client_of(make_app(None)) as client:
        for response in (
            await client.post("/run", json={"prompt": "hi"}),
            await client.get("/tool-names"),
        ):
            assert response.status_code == 503
            assert response.json() == {"detail": NOT_INSTALLED}
            assert "has not started" in NOT_INSTALLED


async def test_503_before_the_plugin_started(tmp_path: Path) -> None:
    async with client_of(make_app(make_plugin(tmp_path))) as client:
        response = await client.post("/run", json={"prompt": "hi"})
        assert response.status_code == 503
        assert (await client.get("/agent/tools")).status_code == 503


async def test_run_goes_through_a_tool_call(tmp_path: Path) -> None:
    model = TrackedModel(tool_call("get_weather", {"city": "Oslo"}), "Oslo is sunny.")
    plugin = make_plugin(tmp_path, SCRIPTED + "max_steps = 3\n", tools=[get_weather], model=model)
    async with serve(make_app(plugin)) as client:
        response = await client.post("/run", json={"prompt": "Weather in Oslo?"})
    assert response.status_code == 200
    assert response.json()["status"] == "completed"
    assert response.json()["text"] == "Oslo is sunny."
    assert response.json()["steps_used"] == 1
    results = model.requests[1].messages[-1].content
    assert "sunny" in results[0].tool_result.content  # type: ignore[union-attr]


async def test_runtime_agent_follows_the_settings(tmp_path: Path) -> None:
    text = SCRIPTED + 'max_steps = 4\nmax_tokens = 5000\nsystem_prompt = "Hi"\nmax_run_secs = 30\n'
    policy = ToolRules.read_only()
    app = make_app(make_plugin(tmp_path, text, tools=[get_weather], policy=policy))
    async with serve(app):
        runtime: AgentRuntime = running(app)
        agent = runtime.agent_for()
        assert agent is runtime.agent_for()  # the default scope's agent is built once
        assert (agent.budget.max_steps, agent.budget.max_tokens) == (4, 5000)
        assert (agent.system_prompt, agent.max_duration, agent.policy) == ("Hi", 30, policy)
        assert agent.model is runtime.client
        assert runtime.agent_for(AgentOverrides(memory_scope="alice")) is not agent


async def test_chat_keeps_the_session(tmp_path: Path) -> None:
    model = TrackedModel()
    model.default = lambda request: f"{len(request.messages)} messages"
    plugin = make_plugin(tmp_path, model=model)
    async with serve(make_app(plugin)) as client:
        assert (await client.post("/chat/a", json={"prompt": "one"})).json()["text"] == "1 messages"
        assert (await client.post("/chat/a", json={"prompt": "two"})).json()["text"] == "3 messages"
        assert (await client.post("/chat/b", json={"prompt": "x"})).json()["text"] == "1 messages"
        other = await client.post("/chat-as/alice/a", json={"prompt": "three"})
        assert other.json()["text"] == "5 messages"
    history = await plugin.session_store.load("a")  # type: ignore[union-attr]
    assert [m.text for m in history.messages][::2] == ["one", "two", "three"]


async def test_op25_the_handle_compacts_a_session_on_request(tmp_path: Path) -> None:
    model = TrackedModel()
    model.default = "answer"
    plugin = make_plugin(tmp_path, model=model)
    app = make_app(plugin)

    @app.post("/compact/{session}")
    async def compact(session: str, agent: AgentHandle) -> dict[str, Any]:
        report = await agent.compact(session)
        return {"folded": report.summarized_messages if report is not None else 0}

    async with serve(app) as client:
        for prompt in ("one", "two", "three"):
            await client.post("/chat/a", json={"prompt": prompt})
        model.default = "the summary"
        # the defaults keep the newest messages that fit in 8000 tokens, from a user message
        # on, and never the first: here everything after the first exchange
        assert (await client.post("/compact/a")).json() == {"folded": 2}
    view = await plugin.session_store.load("a")  # type: ignore[union-attr]
    assert view.messages[0].text.endswith("the summary")
    assert [m.text for m in view.messages[1:]] == ["two", "answer", "three", "answer"]


async def test_memory_scopes_and_skills_reach_the_agent(tmp_path: Path) -> None:
    skill = tmp_path / "skills" / "digest"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        "---\nname: digest\ndescription: How to write the digest.\n---\nBe short.\n"
    )
    environ = {"AGENT_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'agent.db'}"}
    note = {"action": "add", "block": "user", "text": "name is Mark"}
    model = TrackedModel(tool_call("memory", note), "Noted.", "Hello Mark.")
    plugin = make_plugin(
        tmp_path, environ=environ, model=model, memory_store="sql", skills=tmp_path / "skills"
    )
    app = make_app(plugin)
    async with serve(app) as client:
        assert (await client.get("/tool-names")).json() == ["load_skill", "memory"]
        first = await client.post("/chat-as/mark/s", json={"prompt": "I am Mark"})
        assert first.json()["text"] == "Noted."
        second = await client.post("/chat-as/mark/s", json={"prompt": "who am I?"})
        assert second.json()["text"] == "Hello Mark."
        store = running(app).memory_store
        assert type(store).__name__ == "SqlMemoryStore"
        (user,) = [b for b in await store.load("mark") if b.label == "user"]
        assert user.entries == ["name is Mark"]
        assert all(not b.entries for b in await store.load("agent"))
    system = model.requests[-1].messages[0].text
    assert "name is Mark" in system
    assert "digest" in system
    assert "name is Mark" not in model.requests[0].messages[0].text  # frozen snapshot


async def test_resume_approves_and_saves_to_the_session(tmp_path: Path) -> None:
    model = TrackedModel(tool_call("send_message", {"to": "Al", "text": "hi"}), "Sent.")
    plugin = make_plugin(
        tmp_path, tools=[send_message], policy=ToolRules.ask_before_acting(), model=model
    )
    async with serve(make_app(plugin)) as client:
        paused = (await client.post("/chat/s", json={"prompt": "tell Al hi"})).json()
        assert paused["status"] == "awaiting_approval"
        state = paused["state"]
        call_id = state["pending"][0]["call"]["id"]
        decisions = [ApprovalDecision.approve(call_id).model_dump(mode="json")]
        done = await client.post("/resume", json={"state": state, "decisions": decisions})
        assert done.json()["status"] == "completed"
        assert done.json()["text"] == "Sent."
        again = await client.post("/resume", json={"state": state, "decisions": decisions})
        assert again.status_code == 409  # the session moved on: a replay cannot be saved
        assert again.json()["kind"] == "conflict"
    saved = await plugin.session_store.load("s")  # type: ignore[union-attr]
    assert [m.role.value for m in saved.messages] == ["user", "assistant", "tool", "assistant"]
    assert "sent to Al" in saved.messages[2].content[0].tool_result.content  # type: ignore[union-attr]


async def test_resume_as_outside_a_session_keeps_the_run_id(tmp_path: Path) -> None:
    model = TrackedModel(tool_call("send_message", {"to": "Al", "text": "hi"}), "Not sent.")
    plugin = make_plugin(
        tmp_path, tools=[send_message], policy=ToolRules.ask_before_acting(), model=model
    )
    async with serve(make_app(plugin)) as client:
        paused = (await client.post("/run", json={"prompt": "tell Al hi"})).json()
        state = paused["state"]
        call_id = state["pending"][0]["call"]["id"]
        reject = ApprovalDecision.reject(call_id, "not now").model_dump(mode="json")
        done = await client.post("/resume-as/alice", json={"state": state, "decisions": [reject]})
    assert done.json()["status"] == "completed"
    tool_message = model.requests[-1].messages[-1]
    assert "not now" in tool_message.content[0].tool_result.content  # type: ignore[union-attr]
    outcome = AwaitingApproval.model_validate(paused)
    assert outcome.state.run_id == state["run_id"]


async def test_stream_sends_server_sent_events(tmp_path: Path) -> None:
    model = TrackedModel(tool_call("get_weather", {"city": "Oslo"}), "Sunny.")
    plugin = make_plugin(tmp_path, tools=[get_weather], model=model)
    async with serve(make_app(plugin)) as client:
        response = await client.post("/stream", json={"prompt": "weather?"})
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = sse_frames(response.text)
    assert [f["id"] for f in frames] == [str(i) for i in range(1, len(frames) + 1)]
    events = [f["event"] for f in frames]
    assert events[0] == "run_start"
    assert events[-1] == "run_end"
    assert "tool_end" in events
    assert "text_delta" in events
    assert all(json.loads(f["data"])["type"] == f["event"] for f in frames)


async def test_stream_continues_the_session_branch_it_names(tmp_path: Path) -> None:
    model = TrackedModel("a1", "a2", "b2")
    plugin = make_plugin(tmp_path, model=model)
    async with serve(make_app(plugin)) as client:
        for text in ("q1", "q2"):
            await client.post("/chat/s", json={"prompt": text})
        response = await client.post("/stream/s?branch=2", json={"prompt": "other q2"})
    assert sse_frames(response.text)[-1]["event"] == "run_end"
    sent = [m.text for m in model.requests[-1].messages if m.role.value != "system"]
    assert sent == ["q1", "a1", "other q2"]  # the branch after entry 2, not the head's path


async def test_stream_reports_an_error_before_the_run_starts(tmp_path: Path) -> None:
    class BrokenStore(InMemorySessionStore):
        async def load(self, session_id: str, *, leaf: int | None = None) -> Any:
            raise AgentError(ErrorKind.UNAVAILABLE, "the store is down")

    app = make_app(make_plugin(tmp_path, session_store=BrokenStore()))
    async with serve(app):
        handle = app.state.agent_plugin.agent(app)
        response = handle.stream("hi", session="s")
        text = "".join([str(chunk) async for chunk in response.body_iterator])
    (frame,) = sse_frames(text)
    assert frame["event"] == "error"
    assert json.loads(frame["data"])["message"] == "the store is down"


class Gate:
    """A model reply that waits until the test opens the gate."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.open = asyncio.Event()

    async def __call__(self, request: ChatRequest) -> str:
        self.entered.set()
        await self.open.wait()
        return "finished"


async def first_frame(response: Any) -> str:
    iterator = response.body_iterator
    return str(await iterator.__anext__())


async def test_stream_disconnect_cancels_or_continues(tmp_path: Path) -> None:
    gate = Gate()
    store = InMemorySessionStore()
    app = make_app(make_plugin(tmp_path, model=TrackedModel(), session_store=store))
    async with serve(app):
        runtime: AgentRuntime = running(app)
        runtime.client.default = gate  # type: ignore[attr-defined]
        handle = app.state.agent_plugin.agent(app)

        cancelled = handle.stream("hi", session="cancel")
        assert "run_start" in await first_frame(cancelled)
        await gate.entered.wait()
        await cancelled.body_iterator.aclose()  # type: ignore[attr-defined]
        await asyncio.sleep(0)
        gate.entered.clear()

        kept = handle.stream("hi", session="keep", on_disconnect="continue")
        assert "run_start" in await first_frame(kept)
        await gate.entered.wait()
        await kept.body_iterator.aclose()  # type: ignore[attr-defined]
        gate.open.set()
        for _ in range(50):
            if (await store.load("keep")).messages:
                break
            await asyncio.sleep(0.01)
        assert [m.text for m in (await store.load("keep")).messages] == ["hi", "finished"]
        assert (await store.load("cancel")).messages == []


# --- errors map to statuses with a problem body [AP-08] ----------------------------------------


async def test_every_error_kind_maps_to_its_status_with_a_problem_body(tmp_path: Path) -> None:
    async with serve(make_app(make_plugin(tmp_path))) as client:
        for kind in ErrorKind:
            response = await client.get(f"/fail/{kind.value}")
            assert response.status_code == kind.http_status
            assert not 200 <= response.status_code < 300
            assert response.headers["content-type"] == "application/problem+json"
            assert response.json() == {
                "type": PROBLEM_TYPE_PREFIX + kind.value,
                "title": kind.display_name,
                "status": kind.http_status,
                "detail": f"{kind.value} went wrong",
                "kind": kind.value,
                "provider": "p",
            }
            assert "retry-after" not in response.headers
        limited = await client.get("/fail/rate_limited", params={"retry_after": 2.5})
    assert limited.status_code == 429
    assert limited.headers["retry-after"] == "3"
    assert limited.json()["retry_after"] == 2.5


async def test_a_provider_error_reaches_the_client_without_the_key(tmp_path: Path) -> None:
    key = "sk-test-very-secret-key-123"
    async with HttpServer() as server:
        server.queue(
            reply_json({"error": {"message": f"Incorrect API key provided: {key}"}}, status=401)
        )
        text = f'[agent]\nprovider = "openai"\nbase_url = "{server.url}/v1"\n'
        plugin = make_plugin(tmp_path, text, environ={"AGENT_API_KEY": key})
        async with serve(make_app(plugin)) as client:
            response = await client.post("/run", json={"prompt": "hi"})
        assert server.requests[0].headers["authorization"] == f"Bearer {key}"
    assert response.status_code == 502
    assert response.json()["kind"] == "authentication"
    assert response.json()["provider"] == "openai-compatible"
    assert "401" in response.json()["detail"]
    assert key not in response.text


async def test_a_model_failure_inside_a_route_is_mapped(tmp_path: Path) -> None:
    model = TrackedModel(AgentError(ErrorKind.BUDGET, "context too long", provider="scripted"))
    async with serve(make_app(make_plugin(tmp_path, model=model))) as client:
        response = await client.post("/run", json={"prompt": "hi"})
    assert response.status_code == 413
    assert response.json()["title"] == "Budget"


# --- install, lifespan composition, auth --------------------------------------------------


async def test_the_apps_own_lifespan_runs_inside_the_plugins(tmp_path: Path) -> None:
    log: list[str] = []

    class Model(TrackedModel):
        async def aclose(self) -> None:
            log.append("plugin closed its client")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        runtime = running(app)
        log.append(f"app startup sees {runtime.client.provider_name}")
        yield {"token": 1}
        log.append(f"app shutdown sees {running(app) is runtime}")

    app = FastAPI(lifespan=lifespan)
    make_plugin(tmp_path, model=lambda s: Model()).install(app)
    async with app.router.lifespan_context(app) as state:
        log.append("serving")
        assert state == {"token": 1}
    assert log == [
        "app startup sees scripted",
        "serving",
        "app shutdown sees True",
        "plugin closed its client",
    ]
    assert app.state.agent_plugin.runtime(app) is None


async def test_lifespan_given_to_fastapi_and_install_start_once(tmp_path: Path) -> None:
    built: list[LlmClient] = []

    def factory(settings: AgentSettings) -> LlmClient:
        built.append(TrackedModel())
        return built[-1]

    plugin = make_plugin(tmp_path, model=factory)
    app = FastAPI(lifespan=plugin.lifespan)
    plugin.install(app)
    async with serve(app) as client:
        assert (await client.get("/agent/tools")).status_code == 200
        assert plugin.runtime(app) is plugin.agent(app).runtime
    assert len(built) == 1
    assert plugin.runtime(app) is None


async def test_lifespan_alone_gives_routes_the_agent(tmp_path: Path) -> None:
    plugin = make_plugin(tmp_path, model=ScriptedModel(default="hello"))
    app = FastAPI(lifespan=plugin.lifespan)

    @app.get("/hi")
    async def hi(agent: AgentHandle) -> str:
        outcome = (await agent.run("hi")).outcome
        assert isinstance(outcome, Completed)
        return outcome.text

    async with serve(app) as client:
        assert (await client.get("/hi")).json() == "hello"


async def test_install_twice_is_refused(tmp_path: Path) -> None:
    app = make_app(make_plugin(tmp_path))
    with pytest.raises(AgentError, match="already installed"):
        make_plugin(tmp_path).install(app)


async def test_auth_dependencies_guard_the_agent_routes_not_health(tmp_path: Path) -> None:
    def require_token(x_token: Annotated[str | None, Header()] = None) -> None:
        if x_token != "let-me-in":
            raise HTTPException(status_code=401, detail="no token")

    app = make_app(make_plugin(tmp_path), dependencies=[Depends(require_token)])
    async with serve(app) as client:
        assert (await client.get("/agent/tools")).status_code == 401
        allowed = await client.get("/agent/tools", headers={"x-token": "let-me-in"})
        assert allowed.status_code == 200
        assert (await client.get("/health")).status_code == 200


async def test_route_prefix_and_health_path_come_from_the_settings(tmp_path: Path) -> None:
    text = SCRIPTED + 'route_prefix = "/api/ai"\nhealth_path = "/status"\n'
    async with serve(make_app(make_plugin(tmp_path, text))) as client:
        assert (await client.get("/api/ai/tools")).status_code == 200
        assert (await client.get("/agent/tools")).status_code == 404
        assert (await client.get("/status")).json()["status"] == "UP"
        assert (await client.get("/status/ready")).status_code == 200


# --- health [AP-51, reference §1.23 health] ----------------------------------------------------


def test_group_is_health_only() -> None:
    assert AgentHealth.group == "health"
    assert AgentHealth.name == "agent"


async def test_readiness_leaves_the_agent_out(tmp_path: Path) -> None:
    model = TrackedModel()
    model.list_models = _failing_list  # type: ignore[method-assign]
    async with serve(make_app(make_plugin(tmp_path, model=model))) as client:
        health = await client.get("/health")
        ready = await client.get("/health/ready")
    assert health.status_code == 503
    assert ready.status_code == 200
    assert ready.json() == {"status": "UP", "components": {}}


async def _failing_list() -> list[str]:
    raise AgentError(ErrorKind.UNAVAILABLE, "models are down")


async def test_uninitialized_reports_down(tmp_path: Path) -> None:
    plugin = make_plugin(tmp_path)
    async with client_of(make_app(plugin)) as client:
        response = await client.get("/health")
        ready = await client.get("/health/ready")
    assert response.status_code == 503
    assert response.json() == {
        "status": "DOWN",
        "components": {"agent": {"status": "DOWN", "details": {"error": NOT_STARTED}}},
    }
    assert ready.status_code == 503
    assert (await plugin.health.check()).details == {"error": NOT_STARTED}


async def test_up_when_models_list(tmp_path: Path) -> None:
    model = TrackedModel(models=("a", "b", "c"))
    async with serve(make_app(make_plugin(tmp_path, model=model))) as client:
        response = await client.get("/health")
    assert response.status_code == 200
    assert response.json() == {
        "status": "UP",
        "components": {"agent": {"status": "UP", "details": {"provider": "scripted", "models": 3}}},
    }


async def test_down_when_provider_errors(tmp_path: Path) -> None:
    async with HttpServer(default=reply_json({"error": {"message": "bad key"}}, status=401)) as srv:
        text = f'[agent]\nprovider = "openai"\nbase_url = "{srv.url}/v1"\n'
        plugin = make_plugin(tmp_path, text, environ={"AGENT_API_KEY": "sk-x"})
        async with serve(make_app(plugin)) as client:
            response = await client.get("/health")
        assert srv.requests[0].path == "/v1/models"
    assert response.status_code == 503
    component = response.json()["components"]["agent"]
    assert component["status"] == "DOWN"
    assert component["details"]["provider"] == "openai-compatible"
    assert "401" in component["details"]["error"]
    assert "sk-x" not in response.text


async def test_check_uses_the_shared_runtime(tmp_path: Path) -> None:
    now = [100.0]
    health = AgentHealth(cache_secs=5, clock=lambda: now[0])
    model = TrackedModel()
    plugin = make_plugin(tmp_path, model=model, health=health)
    app = make_app(plugin)
    async with serve(app) as client:
        runtime: AgentRuntime = running(app)
        assert health.client is runtime.client is runtime.agent_for().model is model
        await asyncio.gather(*(client.get("/health") for _ in range(5)))
        assert model.listed == 1  # concurrent requests share one check; the answer is cached
        now[0] += 4.9
        await client.get("/health")
        assert model.listed == 1
        now[0] += 0.2
        await client.get("/health")
        assert model.listed == 2
    assert not health.started
    assert (await health.check()).details == {"error": NOT_STARTED}


async def test_a_hanging_provider_never_makes_health_slow(tmp_path: Path) -> None:
    health = AgentHealth(timeout_secs=0.3, cache_secs=60)
    async with HttpServer(default=Hang()) as server:
        text = f'[agent]\nprovider = "openai"\nbase_url = "{server.url}/v1"\n'
        plugin = make_plugin(tmp_path, text, health=health)
        async with serve(make_app(plugin)) as client:
            started = time.monotonic()
            first = await client.get("/health")
            elapsed = time.monotonic() - started
            started = time.monotonic()
            cached = await client.get("/health")
            cached_elapsed = time.monotonic() - started
    assert 0.25 <= elapsed < 1.5
    assert cached_elapsed < 0.2
    assert first.status_code == cached.status_code == 503
    details = first.json()["components"]["agent"]["details"]
    assert details == {
        "provider": "openai-compatible",
        "error": "openai-compatible did not answer within 0.3 s",
    }


async def test_an_app_with_its_own_health_route_includes_the_component(tmp_path: Path) -> None:
    plugin = make_plugin(tmp_path, model=TrackedModel(models=("x",)))
    app = FastAPI()

    @app.get("/health")
    async def health(
        agent: ComponentHealth = Depends(plugin.health.check),  # noqa: B008 - FastAPI's idiom
    ) -> Mapping[str, Any]:
        return {"mine": True, "agent": agent.model_dump()}

    plugin.install(app)
    assert sum(getattr(r, "path", None) == "/health" for r in app.router.routes) == 1
    async with serve(app) as client:
        body = (await client.get("/health")).json()
    assert body == {
        "mine": True,
        "agent": {"status": "UP", "details": {"provider": "scripted", "models": 1}},
    }


async def test_the_provider_client_uses_the_apps_http_transport(tmp_path: Path) -> None:
    made: list[httpx.AsyncBaseTransport] = []
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=chat_completion("from the app's transport"))

    def transport() -> httpx.AsyncBaseTransport:
        made.append(httpx.MockTransport(answer))
        return made[-1]

    text = '[agent]\nprovider = "openai"\nbase_url = "http://llm.internal/v1"\n'
    plugin = make_plugin(
        tmp_path, text, environ={"AGENT_API_KEY": "sk-x"}, http_transport=transport
    )
    for _ in range(2):  # one transport per start: a closed one is never reused
        async with serve(make_app(plugin)) as client:
            response = await client.post("/run", json={"prompt": "hi"})
        assert response.json()["text"] == "from the app's transport"
    assert len(made) == 2
    assert [str(r.url) for r in seen] == ["http://llm.internal/v1/chat/completions"] * 2
    assert seen[0].headers["authorization"] == "Bearer sk-x"


async def test_http_transport_serves_the_configured_provider(tmp_path: Path) -> None:
    async with HttpServer() as model_server:
        model_server.queue(*(reply_json(chat_completion(f"answer {n}")) for n in range(3)))
        text = f'[agent]\nprovider = "openai"\nbase_url = "{model_server.url}/v1"\n'
        plugin = make_plugin(  # httpx's own transport instead of the default engine
            tmp_path,
            text,
            environ={"AGENT_API_KEY": "sk-x"},
            http_transport=httpx.AsyncHTTPTransport,
        )
        async with serve(make_app(plugin)) as client:
            answers = [
                (await client.post("/run", json={"prompt": "hi"})).json()["text"] for _ in range(3)
            ]
        assert answers == ["answer 0", "answer 1", "answer 2"]
        requests = model_server.requests
        assert [r.path for r in requests] == ["/v1/chat/completions"] * 3
        assert {r.connection for r in requests} == {1}  # one kept-alive connection
        assert requests[0].headers["authorization"] == "Bearer sk-x"


def chat_completion(text: str) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


# --- open by accident ----------------------------------------------------------------------


def open_routes_warnings(caplog: pytest.LogCaptureFixture, **install: Any) -> list[str]:
    plugin = AgentPlugin(model=ScriptedModel(), session_store=InMemorySessionStore(), environ={})
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agent_plugin"):
        plugin.install(FastAPI(), **install)
    return [r.getMessage() for r in caplog.records if "without dependencies" in r.getMessage()]


def test_routes_installed_without_dependencies_warn_unless_anonymous_is_meant(
    caplog: pytest.LogCaptureFixture,
) -> None:
    [warning] = open_routes_warnings(caplog, runs_route=True)
    assert "/agent" in warning
    assert "start" in warning
    assert "allow_anonymous=True" in warning
    assert open_routes_warnings(caplog, allow_anonymous=True) == []
    guarded = open_routes_warnings(caplog, dependencies=[Depends(lambda: None)])
    assert guarded == []
