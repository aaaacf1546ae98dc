"""``agent_plugin.testing``: scripted and function models, reply builders, and one model for an
app and its worker processes through the ``model_client`` setting."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_plugin import Agent, AgentError, Completed, ErrorKind, RunOptions
from agent_plugin.config import AgentSettings
from agent_plugin.events import AgentEvent, TextDeltaEvent
from agent_plugin.messages import ChatMessage, Role, StopReason, TextPart, ThinkingPart
from agent_plugin.options import DEFAULT_OVERRIDES
from agent_plugin.providers.base import ChatRequest
from agent_plugin.runtime import RuntimeSpec, open_runtime
from agent_plugin.sessions import InMemorySessionStore
from agent_plugin.testing import FunctionModel, ModelCall, Reply, ScriptedModel, reply, tool_call
from agent_plugin.tools import ToolEffect, tool
from tests.jobs_app import REDIS_URL, ROOT

calls_seen: list[ModelCall] = []


@tool(effect=ToolEffect.READ_ONLY)
def lookup(key: str) -> dict[str, str]:
    """Look a key up."""
    return {"key": key, "value": key.upper()}


def echo_model(messages: list[ChatMessage], call: ModelCall) -> Reply:
    calls_seen.append(call)
    if not call.results:
        return tool_call("lookup", {"key": messages[-1].text})
    return f"found {call.results[0].content}"


# --- FunctionModel ---------------------------------------------------------------------------


async def test_a_function_model_answers_every_call_from_the_conversation() -> None:
    calls_seen.clear()
    model = FunctionModel(echo_model)
    agent = Agent(model, tools=[lookup], system_prompt="Be brief.")
    turn = await agent.run("abc")
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == 'found {"key":"abc","value":"ABC"}'
    assert [c.index for c in calls_seen] == [0, 1]
    assert calls_seen[0].tool_names == ["lookup"]
    assert calls_seen[0].system == "Be brief."
    assert calls_seen[0].results == []
    assert [r.content for r in calls_seen[1].results] == ['{"key":"abc","value":"ABC"}']
    assert len(model.requests) == 2
    assert "FunctionModel(echo_model" in repr(model)


async def test_a_function_model_may_be_async_raise_and_stream() -> None:
    async def slow(messages: list[ChatMessage], call: ModelCall) -> Reply:
        await asyncio.sleep(0)
        if call.index == 0:
            return AgentError(ErrorKind.RATE_LIMITED, "slow down")
        return "streamed answer"

    model = FunctionModel(slow)
    agent = Agent(model)
    with pytest.raises(AgentError) as caught:
        await model.chat(ChatRequest(messages=[ChatMessage.user("hi")]))
    assert caught.value.kind is ErrorKind.RATE_LIMITED
    events: list[AgentEvent] = []
    turn = await agent.run("hi", options=RunOptions(stream=True, on_event=events.append))
    assert isinstance(turn.outcome, Completed)
    assert [e.text for e in events if isinstance(e, TextDeltaEvent)] == ["streamed answer"]
    with pytest.raises(TypeError, match="needs a function"):
        FunctionModel("not a function")  # type: ignore[arg-type]


# --- reply() ---------------------------------------------------------------------------------


def test_reply_builds_a_whole_response() -> None:
    built = reply("Let me look.", tool_call("lookup", {"key": "k"}, id="c1"), thinking="hmm")
    assert [type(p) for p in built.content][:2] == [ThinkingPart, TextPart]
    assert built.tool_calls[0].id == "c1"
    assert built.stop_reason is StopReason.TOOL_USE
    assert reply("done").stop_reason is StopReason.END_TURN
    truncated = reply("cut", stop_reason=StopReason.MAX_TOKENS)
    assert truncated.stop_reason is StopReason.MAX_TOKENS
    with pytest.raises(ValueError, match="needs an id"):
        reply(None, tool_call("lookup"))
    with pytest.raises(ValueError, match="needs text"):
        reply()


async def test_a_scripted_model_replays_a_built_reply_in_a_run() -> None:
    model = ScriptedModel([reply("checking", tool_call("lookup", {"key": "x"}, id="c1")), "ok"])
    turn = await Agent(model, tools=[lookup]).run("go")
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "ok"
    assert model.requests[1].messages[-1].role is Role.TOOL


# --- model_client ----------------------------------------------------------------------------

shared_model = ScriptedModel(default="from the shared model")
closed: list[str] = []


class ClosingModel(ScriptedModel):
    async def aclose(self) -> None:
        closed.append("closed")


def make_model(settings: AgentSettings) -> ClosingModel:
    return ClosingModel(default=f"made for max_steps={settings.max_steps}")


def not_a_model(settings: AgentSettings) -> str:
    return "nope"


async def answer_of(model_client: str, spec: RuntimeSpec | None = None) -> str:
    settings = AgentSettings.load(
        {"model_client": model_client, "provider": "openai-compatible"}, environ={}
    )
    spec = spec or RuntimeSpec(session_store=InMemorySessionStore())
    runtime = await open_runtime(spec, settings)
    try:
        turn = await runtime.agent_for(DEFAULT_OVERRIDES).run("hi")
    finally:
        await runtime.aclose()
    assert isinstance(turn.outcome, Completed)
    return turn.outcome.text


async def test_model_client_names_a_model_or_a_factory_instead_of_the_provider() -> None:
    # The public OpenAI host would need a key: the named model replaces the provider.
    assert await answer_of("tests.test_testing:shared_model") == "from the shared model"
    assert await answer_of("tests.test_testing:shared_model") == "from the shared model"
    closed.clear()
    assert await answer_of("tests.test_testing:make_model") == "made for max_steps=10"
    assert closed == ["closed"]  # a factory's client is the runtime's to close


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.no_such_module:model", "cannot import tests.no_such_module"),
        ("tests.test_testing:missing", "tests.test_testing has no missing"),
        ("tests.test_testing:calls_seen", "is a list: name an LlmClient"),
        ("tests.test_testing:not_a_model", "the factory returned str, not an LlmClient"),
    ],
)
async def test_a_bad_model_client_is_a_config_error(path: str, message: str) -> None:
    with pytest.raises(AgentError) as caught:
        await answer_of(path)
    assert caught.value.kind is ErrorKind.CONFIG
    assert f"model_client {path!r}" in str(caught.value)
    assert message in str(caught.value)


def test_model_client_must_be_an_import_path() -> None:
    with pytest.raises(AgentError, match=r"AGENT_MODEL_CLIENT: must read package\.module:name"):
        AgentSettings.load(environ={"AGENT_MODEL_CLIENT": "tests/models.py"})


async def test_code_wins_over_model_client() -> None:
    in_code = ScriptedModel(default="from code")
    spec = RuntimeSpec(model=in_code, session_store=InMemorySessionStore())
    assert await answer_of("tests.test_testing:shared_model", spec) == "from code"


# --- one model for the app and its worker ----------------------------------------------------


@pytest.fixture
def weather_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment the README's test gives the app (here) and its worker (a process)."""
    environ = {
        "AGENT_MODEL_CLIENT": "tests.weather_models:weather",
        "AGENT_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'weather.db'}",
        "AGENT_REDIS_URL": REDIS_URL,
        "AGENT_CONFIG_FILE": str(tmp_path / "agent.toml"),
        "WEATHER_QUEUE": f"weather-{uuid.uuid4().hex[:8]}:queue",
    }
    (tmp_path / "agent.toml").write_text("[agent]\n", encoding="utf-8")
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    return environ


async def test_the_app_and_its_worker_run_the_same_scripted_model(
    weather_env: dict[str, str], tmp_path: Path
) -> None:
    from tests.weather_app import app

    output = tmp_path / "worker.out"
    worker = start_worker(weather_env, output)
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c,
        ):
            answered = await c.post("/ask", json={"prompt": "Weather in Oslo?"})
            assert answered.status_code == 200, answered.text
            assert answered.json()["text"] == "Oslo: 21 °C"

            queued = await c.post("/agent/runs", json={"prompt": "Weather in Paris?"})
            assert queued.status_code == 202, queued.text
            record = await finished(c, queued.json()["status_path"], worker, output)
    finally:
        worker.terminate()
        worker.wait(20)
    assert record["status"] == "complete", record
    assert record["outcome"]["text"] == "Paris: 21 °C"


def start_worker(environ: dict[str, str], output: Path) -> subprocess.Popen[bytes]:
    """``arq tests.weather_worker.WorkerSettings``, as a user's worker is started."""
    with output.open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "arq", "tests.weather_worker.WorkerSettings"],
            cwd=ROOT,
            env={**os.environ, **environ},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


async def finished(
    client: httpx.AsyncClient, path: str, worker: subprocess.Popen[bytes], output: Path
) -> Any:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        record = (await client.get(path)).json()
        if record["status"] not in ("queued", "in_progress"):
            return record
        if worker.poll() is not None:
            raise AssertionError(f"the worker exited: {tail(output)}")
        await asyncio.sleep(0.1)
    raise AssertionError(f"the run did not finish: {tail(output)}")


def tail(output: Path) -> str:
    return output.read_text(errors="replace")[-3000:]


async def test_a_scripted_model_keeps_only_its_latest_requests() -> None:
    model = ScriptedModel(default="ok", keep_requests=3)
    agent = Agent(model)
    for _ in range(10):
        await agent.run("hi")
    assert model.calls == 10
    assert len(model.requests) == 3
    assert "calls=10" in repr(model)
    silent = FunctionModel(lambda messages, call: f"call {call.index}", keep_requests=0)
    for _ in range(3):
        turn = await Agent(silent).run("hi")
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "call 2"  # the index counts every call, kept or not
    assert silent.requests == []
    with pytest.raises(AgentError):
        ScriptedModel(keep_requests=-1)
