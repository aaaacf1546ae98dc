"""Traces, metrics and cost of foreground runs, with the OpenTelemetry SDK's in-memory exporter
and reader: the span tree of a run, a paused-and-resumed run, retries, fallback and contents."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_plugin.agent import Agent
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.messages import ChatMessage, StopReason, TextPart, TokenUsage
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import ApprovalDecision, AwaitingApproval, Completed
from agent_plugin.policy import ASK, ToolRules
from agent_plugin.pricing import ModelPrice, Prices
from agent_plugin.providers.base import ChatRequest, ChatResponse
from agent_plugin.providers.retry import RetryNotice
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.redaction import REDACTED
from agent_plugin.telemetry import Telemetry
from agent_plugin.tools import tool


@tool
def lookup(city: str) -> dict[str, str]:
    """Look a city up."""
    return {"city": city, "weather": "sunny"}


@tool
def broken(city: str) -> str:
    """Always fails."""
    raise RuntimeError("the service is down")


class Recorder:
    def __init__(self, **options: Any) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.telemetry = Telemetry(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **options
        )

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.finished() if s.name == name]

    def points(self, metric: str) -> list[tuple[dict[str, Any], Any]]:
        data = self.reader.get_metrics_data()
        found: list[tuple[dict[str, Any], Any]] = []
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name == metric:
                        found.extend((dict(p.attributes or {}), p) for p in m.data.data_points)
        return found


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    yield rec
    rec.tracer_provider.shutdown()
    rec.meter_provider.shutdown()


def _priced(model: str = "scripted") -> Prices:
    return Prices({model: ModelPrice(input=2.0, output=10.0, cache_read=0.2, cache_write=2.5)})


async def test_span_tree_of_a_run_with_a_tool(recorder: Recorder) -> None:
    model = ScriptedModel([tool_call("lookup", {"city": "Oslo"}, id="c1"), "It is sunny."])
    recorder.telemetry.prices = _priced()
    agent = Agent(model, tools=[lookup], telemetry=recorder.telemetry)
    turn = await agent.run("Weather in Oslo?", session_id="s-1")
    assert isinstance(turn.outcome, Completed)

    (run,) = recorder.named("invoke_agent")
    chats = recorder.named("chat scripted")
    (tool_span,) = recorder.named("execute_tool lookup")
    assert len(chats) == 2
    assert run.parent is None
    assert all(_parent(c) == run.context.span_id for c in chats)
    assert _parent(tool_span) == run.context.span_id
    assert {s.context.trace_id for s in recorder.finished()} == {run.context.trace_id}
    # in order: model call, tool, model call
    ordered = sorted([*chats, tool_span], key=lambda s: s.start_time or 0)
    assert [s.name for s in ordered] == ["chat scripted", "execute_tool lookup", "chat scripted"]

    attrs = dict(run.attributes or {})
    assert attrs["gen_ai.operation.name"] == "invoke_agent"
    assert str(attrs["agent_plugin.run.id"]).startswith("run_")
    assert attrs["gen_ai.conversation.id"] == "s-1"
    assert attrs["agent_plugin.run.origin"] == "direct"
    assert attrs["agent_plugin.run.status"] == "completed"
    assert attrs["gen_ai.usage.input_tokens"] == 20
    assert attrs["gen_ai.usage.output_tokens"] == 10
    first = dict(ordered[0].attributes or {})
    assert first["gen_ai.operation.name"] == "chat"
    assert first["gen_ai.system"] == "scripted"
    assert first["gen_ai.usage.input_tokens"] == 10
    assert first["gen_ai.usage.output_tokens"] == 5
    assert first["gen_ai.response.finish_reasons"] == ("tool_use",)
    assert first["agent_plugin.cost_usd"] == pytest.approx((10 * 2.0 + 5 * 10.0) / 1e6)
    assert "gen_ai.input.messages" not in first  # contents are off by default
    tool_attrs = dict(tool_span.attributes or {})
    assert tool_attrs["gen_ai.tool.name"] == "lookup"
    assert tool_attrs["gen_ai.tool.call.id"] == "c1"
    assert "gen_ai.tool.call.arguments" not in tool_attrs
    # the cost reaches the outcome's usage
    assert turn.outcome.usage.cost_usd == pytest.approx(2 * (10 * 2.0 + 5 * 10.0) / 1e6)
    assert attrs["agent_plugin.cost_usd"] == pytest.approx(turn.outcome.usage.cost_usd)


async def test_metrics_of_a_run(recorder: Recorder) -> None:
    model = ScriptedModel(
        [tool_call("lookup", {"city": "Oslo"}), tool_call("broken", {"city": "Oslo"}), "done"]
    )
    recorder.telemetry.prices = _priced()
    agent = Agent(model, tools=[lookup, broken], telemetry=recorder.telemetry)
    await agent.run("go")

    started = recorder.points("agent_plugin.runs.started")
    assert [(a, p.value) for a, p in started] == [
        ({"agent_plugin.run.origin": "direct", "agent_plugin.run.resumed": False}, 1)
    ]
    (finished,) = recorder.points("agent_plugin.runs.finished")
    assert finished[0]["agent_plugin.run.status"] == "completed"
    assert finished[1].value == 1
    (duration,) = recorder.points("gen_ai.client.operation.duration")
    assert duration[0] == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "scripted",
        "gen_ai.request.model": "scripted",
    }
    assert duration[1].count == 3
    token_points = recorder.points("gen_ai.client.token.usage")
    tokens = {a["gen_ai.token.type"]: p.sum for a, p in token_points}
    assert tokens == {"input": 30, "output": 15}
    (cost,) = recorder.points("agent_plugin.model.cost")
    assert cost[1].value == pytest.approx(3 * 70 / 1e6)
    tool_points = recorder.points("agent_plugin.tool.duration")
    tools = {a["gen_ai.tool.name"]: p.count for a, p in tool_points}
    assert tools == {"lookup": 1, "broken": 1}
    errors = [(a, p.value) for a, p in recorder.points("agent_plugin.tool.errors")]
    assert errors == [({"gen_ai.tool.name": "broken"}, 1)]
    (failed_tool,) = recorder.named("execute_tool broken")
    assert failed_tool.status.status_code is trace.StatusCode.ERROR


async def test_paused_and_resumed_run_links_to_the_paused_trace(recorder: Recorder) -> None:
    model = ScriptedModel([tool_call("lookup", {"city": "Oslo"}, id="c1"), "sunny"])
    policy = ToolRules().for_tool("lookup", ASK)
    agent = Agent(model, tools=[lookup], policy=policy, telemetry=recorder.telemetry)
    paused = (await agent.run("Weather?")).outcome
    assert isinstance(paused, AwaitingApproval)
    assert "traceparent" in paused.state.trace
    # the state crosses a process boundary as JSON with its trace
    state = type(paused.state).model_validate_json(paused.state.model_dump_json())

    (first_run,) = recorder.named("invoke_agent")
    (pause,) = recorder.named("await_approval")
    assert _parent(pause) == first_run.context.span_id
    assert dict(pause.attributes or {})["agent_plugin.approval.tools"] == ("lookup",)
    assert dict(first_run.attributes or {})["agent_plugin.run.status"] == "awaiting_approval"
    recorder.spans.clear()

    turn = await agent.resume(state, [ApprovalDecision.approve("c1")])
    assert isinstance(turn.outcome, Completed)
    (resumed,) = recorder.named("invoke_agent")
    assert dict(resumed.attributes or {})["agent_plugin.run.resumed"] is True
    assert resumed.context.trace_id != first_run.context.trace_id
    (link,) = resumed.links
    assert link.context.trace_id == first_run.context.trace_id
    assert link.context.span_id == first_run.context.span_id
    (decisions,) = recorder.named("resume_approval")
    assert dict(decisions.attributes or {})["agent_plugin.approval.approved"] == 1
    assert _parent(decisions) == resumed.context.span_id
    (tool_span,) = recorder.named("execute_tool lookup")
    assert tool_span.context.trace_id == resumed.context.trace_id
    resumes = [
        (a, p.value)
        for a, p in recorder.points("agent_plugin.runs.started")
        if a["agent_plugin.run.resumed"]
    ]
    assert resumes == [({"agent_plugin.run.origin": "direct", "agent_plugin.run.resumed": True}, 1)]


async def test_a_run_joins_the_callers_trace(recorder: Recorder) -> None:
    agent = Agent(ScriptedModel(["hi"]), telemetry=recorder.telemetry)
    tracer = recorder.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("request") as outer:
        await agent.run("hello")
    (run,) = recorder.named("invoke_agent")
    assert _parent(run) == outer.get_span_context().span_id


async def test_contents_are_recorded_only_when_enabled_and_redacted() -> None:
    secret = "sk-" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4"
    rec = Recorder(record_content=True)
    model = ScriptedModel([tool_call("lookup", {"city": f"Oslo {secret}"}), "done"])
    agent = Agent(model, tools=[lookup], telemetry=rec.telemetry)
    await agent.run(f"Use the key {secret} please")
    chat = min(rec.named("chat scripted"), key=lambda s: s.start_time or 0)
    attrs = dict(chat.attributes or {})
    sent = json.loads(str(attrs["gen_ai.input.messages"]))
    assert "Use the key" in json.dumps(sent)
    assert "gen_ai.output.messages" in attrs
    (tool_span,) = rec.named("execute_tool lookup")
    tool_attrs = dict(tool_span.attributes or {})
    assert json.loads(str(tool_attrs["gen_ai.tool.call.arguments"]))["city"].startswith("Oslo")
    assert "sunny" in str(tool_attrs["gen_ai.tool.call.result"])
    everything = json.dumps([dict(s.attributes or {}) for s in rec.finished()], default=str)
    assert secret not in everything
    assert REDACTED in everything


_TOOL_PASSWORD = "Hunter2-Tele-7f3a"  # no familiar shape: caught by its field's name only


@tool
def sign_in(user: str) -> dict[str, str]:
    """Sign a user in."""
    return {"user": user, "password": _TOOL_PASSWORD}


@tool
def refuse(user: str) -> str:
    """Refuse, naming the password."""
    raise RuntimeError(f"sign-in refused, password: {_TOOL_PASSWORD}")


async def test_spans_are_redacted_like_events_field_names_and_assignments_too() -> None:
    """A tool's ``{"password": ...}`` result and a ``password: ...`` error are redacted in
    events and records; spans with contents on must not carry them either (they were cleaned
    by the credential patterns only)."""
    rec = Recorder(record_content=True)
    model = ScriptedModel(
        [tool_call("sign_in", {"user": "ann"}), tool_call("refuse", {"user": "bob"}), "done"]
    )
    agent = Agent(model, tools=[sign_in, refuse], telemetry=rec.telemetry)
    await agent.run("go")
    spans = rec.finished()
    everything = json.dumps(
        [[dict(s.attributes or {}), s.status.description] for s in spans], default=str
    )
    assert "sign_in" in everything
    assert _TOOL_PASSWORD not in everything
    assert REDACTED in everything


async def test_a_failed_model_call_marks_its_spans(recorder: Recorder) -> None:
    failure = AgentError(ErrorKind.AUTHENTICATION, "bad key", provider="scripted", status=401)
    agent = Agent(ScriptedModel([failure]), telemetry=recorder.telemetry)
    with pytest.raises(AgentError):
        await agent.run("hello")
    (chat,) = recorder.named("chat scripted")
    (run,) = recorder.named("invoke_agent")
    for span in (chat, run):
        assert span.status.status_code is trace.StatusCode.ERROR
        assert dict(span.attributes or {})["error.type"] == "authentication"
    (finished,) = recorder.points("agent_plugin.runs.finished")
    assert finished[0]["agent_plugin.run.status"] == "authentication"
    (duration,) = recorder.points("gen_ai.client.operation.duration")
    assert duration[0]["error.type"] == "authentication"


class _RetryingModel(ScriptedModel):
    """Reports one retry through the request's ``on_retry`` before answering."""

    async def chat(self, request: ChatRequest) -> ChatResponse:
        if request.on_retry is not None:
            error = AgentError(ErrorKind.RATE_LIMITED, "slow down", status=429)
            request.on_retry(RetryNotice(attempt=1, max_attempts=3, wait=0.0, error=error))
        return await super().chat(request)


async def test_model_call_retries_are_span_events_and_counted(recorder: Recorder) -> None:
    agent = Agent(_RetryingModel(["ok"]), telemetry=recorder.telemetry)
    await agent.run("hello")  # no event sink: the retry still reaches the telemetry
    (chat,) = recorder.named("chat scripted")
    (event,) = [e for e in chat.events if e.name == "retry"]
    assert dict(event.attributes or {})["error.type"] == "rate_limited"
    retries = [(a, p.value) for a, p in recorder.points("agent_plugin.retries")]
    scope = {"agent_plugin.retry.scope": "model_call", "error.type": "rate_limited"}
    assert retries == [(scope, 1)]


async def test_cache_tokens_and_model_on_the_chat_span(recorder: Recorder) -> None:
    usage = TokenUsage(
        input_tokens=1000, output_tokens=100, cache_read_tokens=600, cache_write_tokens=200
    )
    reply = ChatResponse(
        content=[TextPart(text="ok")],
        stop_reason=StopReason.END_TURN,
        usage=usage,
        model="my-private-model",
        id="resp-1",
        raw_stop_reason="stop",
    )
    recorder.telemetry.prices = _priced("my-private-model")
    agent = Agent(ScriptedModel([reply]), telemetry=recorder.telemetry)
    turn = await agent.run("hi")
    (chat,) = recorder.named("chat scripted")
    attrs = dict(chat.attributes or {})
    assert attrs["gen_ai.response.model"] == "my-private-model"
    assert attrs["gen_ai.response.id"] == "resp-1"
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == 600
    assert attrs["gen_ai.usage.cache_creation.input_tokens"] == 200
    expected = (200 * 2.0 + 600 * 0.2 + 200 * 2.5 + 100 * 10.0) / 1e6
    assert attrs["agent_plugin.cost_usd"] == pytest.approx(expected)
    assert turn.outcome.usage.cost_usd == pytest.approx(expected)
    kinds = {a["gen_ai.token.type"] for a, _ in recorder.points("gen_ai.client.token.usage")}
    assert kinds == {"input", "output", "cache_read", "cache_write"}


async def test_no_sdk_no_spans_but_still_a_cost() -> None:
    """Without providers of its own and no SDK set globally, a run records nothing and
    still prices its calls."""
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    telemetry = Telemetry(prices=_priced())
    assert not telemetry.active
    agent = Agent(ScriptedModel(["hi"]), telemetry=telemetry)
    turn = await agent.run("hello")
    assert turn.outcome.usage.cost_usd == pytest.approx(70 / 1e6)
    events: list[Any] = []
    turn = await agent.run("hello", options=RunOptions(on_event=events.append))
    responded = [e for e in events if e.type == "model_response"]
    assert responded[0].usage.cost_usd == pytest.approx(70 / 1e6)


async def test_an_unpriced_model_has_no_cost(recorder: Recorder) -> None:
    recorder.telemetry.prices = Prices(table=False)
    agent = Agent(ScriptedModel(["hi"]), telemetry=recorder.telemetry)
    turn = await agent.run("hello")
    assert turn.outcome.usage.cost_usd is None
    assert "cost_usd" not in turn.outcome.usage.model_dump()
    assert "agent_plugin.cost_usd" not in dict(recorder.named("chat scripted")[0].attributes or {})
    assert ChatMessage.user("x")  # transcript types untouched


async def test_a_streamed_run_has_the_same_spans(recorder: Recorder) -> None:
    model = ScriptedModel([tool_call("lookup", {"city": "Oslo"}), "sunny"])
    agent = Agent(model, tools=[lookup], telemetry=recorder.telemetry)
    events = [e async for e in agent.stream("Weather?")]
    assert events[-1].type == "run_end"
    names = sorted(s.name for s in recorder.finished())
    assert names == ["chat scripted", "chat scripted", "execute_tool lookup", "invoke_agent"]
    chat = recorder.named("chat scripted")[0]
    assert dict(chat.attributes or {})["gen_ai.usage.output_tokens"] == 5


def test_without_opentelemetry_installed_a_run_works_and_is_priced() -> None:
    """With the API missing (the ``otel`` extra not installed), nothing is imported or
    recorded, and calls are still priced."""
    script = textwrap.dedent(
        """
        import asyncio, sys
        for name in ("opentelemetry", "opentelemetry.trace", "opentelemetry.metrics"):
            sys.modules[name] = None  # import fails, as when it is not installed
        from agent_plugin.agent import Agent
        from agent_plugin.pricing import ModelPrice, Prices
        from agent_plugin.providers.scripted import ScriptedModel
        from agent_plugin.telemetry import Telemetry, trace_carrier

        telemetry = Telemetry(prices=Prices({"scripted": ModelPrice(input=1, output=1)}))
        assert not telemetry.active
        assert trace_carrier() == {}
        turn = asyncio.run(Agent(ScriptedModel(["hi"]), telemetry=telemetry).run("go"))
        print(turn.outcome.status, round(turn.outcome.usage.cost_usd * 1e6))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["completed", "15"]
