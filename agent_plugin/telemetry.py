"""OpenTelemetry traces and metrics of runs, after the GenAI semantic conventions, and the cost
of each model call.

:class:`Telemetry` is an agent's (``Agent(telemetry=...)``; the runtime builds one from the
settings): the tracer and meter providers (the global ones by default), whether message
contents go on spans (off by default, always redacted) and the :class:`~agent_plugin.pricing.
Prices`. :meth:`Telemetry.run` gives a run's loop a :class:`RunTelemetry`, whose wrappers make
the ``invoke_agent``, ``chat {model}``, ``execute_tool {name}`` and approval spans and record the
metrics. ``opentelemetry-api`` (the ``[otel]`` extra) is imported on the first run, and only
there; without it, or without an SDK configured, nothing is made but the cost.

A background run carries its enqueueing request's context in its arguments
(:func:`trace_carrier`); the worker runs it inside :func:`job_scope`, so its spans join that
trace. A paused run's state carries its own span's context, and its resume links to it.
The docs page ``guide/observability.md`` lists every span, attribute and metric.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from agent_plugin.errors import AgentError
from agent_plugin.messages import ChatMessage, Role, TokenUsage, ToolCall
from agent_plugin.outcomes import (
    AgentOutcome,
    AgentTurn,
    AwaitingApproval,
    Finished,
    NeedsApproval,
    Paused,
    PendingCall,
    Rejected,
)
from agent_plugin.pricing import Prices
from agent_plugin.redaction import redact_deep, redact_message

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.metrics import Counter, Histogram, MeterProvider
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from agent_plugin.hooks import ToolOutput
    from agent_plugin.providers.base import ChatRequest, ChatResponse, FallbackNotice, LlmClient
    from agent_plugin.providers.retry import RetryNotice

__all__ = [
    "CONTENT_ENV",
    "DIRECT_ORIGIN",
    "RunTelemetry",
    "Telemetry",
    "default_telemetry",
    "job_scope",
    "trace_carrier",
]

CONTENT_ENV: Final = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The convention's switch for message contents on spans (``true``), read when a
:class:`Telemetry` is made without ``record_content``."""
DIRECT_ORIGIN: Final = "direct"
"""The origin of a run started in-process (not a background run)."""
SCOPE: Final = "agent_plugin"

_origin: ContextVar[str] = ContextVar("agent_plugin_run_origin", default=DIRECT_ORIGIN)


# --- the optional dependency ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Instruments:
    tracer: Tracer
    runs_started: Counter
    runs_finished: Counter
    model_duration: Histogram
    model_tokens: Histogram
    model_cost: Counter
    tool_duration: Histogram
    tool_errors: Counter
    queue_wait: Histogram
    retries: Counter
    heartbeat_ticks: Counter


def _otel_installed() -> bool:
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return False
    return True


def _configured(tracer_provider: object, meter_provider: object) -> bool:
    """Whether the global providers are an SDK's (the API's proxies and no-ops record nothing)."""
    from opentelemetry import metrics, trace

    tracing = not isinstance(tracer_provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    metering = not isinstance(meter_provider, metrics.NoOpMeterProvider) and (
        type(meter_provider).__name__ != "_ProxyMeterProvider"
    )
    return tracing or metering


# --- the app's telemetry -------------------------------------------------------------------


class Telemetry:
    """What runs report and how their model calls are priced; one per app, shared by runs.

    * ``tracer_provider``, ``meter_provider``: where spans and metrics go (default: the global
      providers, once an SDK sets them; until then nothing is recorded);
    * ``record_content``: put the messages, tool arguments and tool results on spans, redacted
      (default: the ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` variable, else off);
    * ``prices``: the prices of model calls (default: ``genai-prices`` where it is installed).
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        record_content: bool | None = None,
        prices: Prices | None = None,
    ) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        if record_content is None:
            record_content = os.environ.get(CONTENT_ENV, "").strip().lower() == "true"
        self.record_content = record_content
        self.prices = prices if prices is not None else Prices()
        self._instruments: _Instruments | None = None
        self._installed: bool | None = None
        self._can_price: bool | None = None

    def __repr__(self) -> str:
        return f"Telemetry(record_content={self.record_content}, prices={self.prices!r})"

    def instruments(self) -> _Instruments | None:
        """The tracer and the metric instruments, or ``None`` while nothing would record."""
        if self._instruments is not None:
            return self._instruments
        if self._installed is None:
            self._installed = _otel_installed()
        if not self._installed:
            return None
        from opentelemetry import metrics, trace

        tracer_provider = self.tracer_provider or trace.get_tracer_provider()
        meter_provider = self.meter_provider or metrics.get_meter_provider()
        explicit = self.tracer_provider is not None or self.meter_provider is not None
        if not explicit and not _configured(tracer_provider, meter_provider):
            return None
        self._instruments = _make_instruments(tracer_provider, meter_provider)
        return self._instruments

    @property
    def active(self) -> bool:
        """Whether spans and metrics are recorded."""
        return self.instruments() is not None

    def run(
        self,
        *,
        run_id: str,
        session_id: str | None,
        client: LlmClient,
    ) -> RunTelemetry:
        """The telemetry of one run (or resume) of an agent on ``client``."""
        if self._can_price is None:
            self._can_price = self.prices.can_price
        return RunTelemetry(
            self,
            self.instruments(),
            run_id=run_id,
            session_id=session_id,
            client=client,
            pricing=self._can_price,
        )

    # --- what the service layer reports --------------------------------------------------

    def queue_waited(self, seconds: float, origin: str) -> None:
        """A background run started ``seconds`` after it was enqueued (or became due)."""
        instruments = self.instruments()
        if instruments is not None:
            instruments.queue_wait.record(max(seconds, 0.0), {"agent_plugin.run.origin": origin})

    def run_retried(self, error: AgentError) -> None:
        """A background run failed and will be delivered again."""
        instruments = self.instruments()
        if instruments is not None:
            instruments.retries.add(
                1, {"agent_plugin.retry.scope": "run", "error.type": error.kind.value}
            )

    def heartbeat_ticked(self, result: str) -> None:
        """A heartbeat tick ended: ``started``, ``skipped_busy``, ``skipped_precheck``,
        ``failed``."""
        instruments = self.instruments()
        if instruments is not None:
            instruments.heartbeat_ticks.add(1, {"agent_plugin.heartbeat.result": result})


def _make_instruments(tracer_provider: Any, meter_provider: Any) -> _Instruments:
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("fastapi-agent-plugin")
    except PackageNotFoundError:  # pragma: no cover - a checkout run without installing
        release = None
    tracer = tracer_provider.get_tracer(SCOPE, release)
    meter = meter_provider.get_meter(SCOPE, release)
    return _Instruments(
        tracer=tracer,
        runs_started=meter.create_counter(
            "agent_plugin.runs.started", unit="{run}", description="Runs and resumes started"
        ),
        runs_finished=meter.create_counter(
            "agent_plugin.runs.finished", unit="{run}", description="Runs ended, by status"
        ),
        model_duration=meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        ),
        model_tokens=meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
        ),
        model_cost=meter.create_counter(
            "agent_plugin.model.cost", unit="USD", description="What model calls cost"
        ),
        tool_duration=meter.create_histogram(
            "agent_plugin.tool.duration",
            unit="s",
            description="Tool execution time",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        ),
        tool_errors=meter.create_counter(
            "agent_plugin.tool.errors", unit="{call}", description="Tool calls that failed"
        ),
        queue_wait=meter.create_histogram(
            "agent_plugin.run.queue_wait",
            unit="s",
            description="From enqueueing a background run to its start",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        ),
        retries=meter.create_counter(
            "agent_plugin.retries", unit="{retry}", description="Model call and run retries"
        ),
        heartbeat_ticks=meter.create_counter(
            "agent_plugin.heartbeat.ticks", unit="{tick}", description="Heartbeat ticks"
        ),
    )


_DURATION_BUCKETS: Final = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                            20.48, 40.96, 81.92]  # fmt: skip
"""The convention's advice for ``gen_ai.client.operation.duration``."""
_TOKEN_BUCKETS: Final = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576,
                         4194304, 16777216, 67108864]  # fmt: skip


# --- one run -------------------------------------------------------------------------------


class RunTelemetry:
    """The spans and metrics of one run (or resume), and the pricing of its model calls.

    Every wrapper gives back what it was given when there is nothing to record, so a run
    without telemetry pays an attribute check per call and no more.
    """

    def __init__(
        self,
        telemetry: Telemetry,
        instruments: _Instruments | None,
        *,
        run_id: str,
        session_id: str | None,
        client: LlmClient,
        pricing: bool,
    ) -> None:
        self.telemetry = telemetry
        self.instruments = instruments
        self.active = instruments is not None
        """Whether spans and metrics are recorded (the loop asks before wrapping)."""
        self.pricing = pricing
        self.run_id = run_id
        self.session_id = session_id
        self.client = client
        self.provider = client.provider_name
        self.model: str | None = getattr(client, "model", None)
        self.base_url: str | None = getattr(client, "base_url", None)
        self.origin = _origin.get()
        self.span: Span | None = None
        self.switched: FallbackNotice | None = None
        """The current call's latest move to a fallback model (it is priced as that one's)."""

    # --- the run -------------------------------------------------------------------------

    def carrier(self) -> dict[str, str]:
        """The run span's context as W3C headers (kept in a paused state; empty: no span)."""
        if self.span is None:
            return {}
        from opentelemetry import propagate, trace

        headers: dict[str, str] = {}
        propagate.inject(headers, context=trace.set_span_in_context(self.span))
        return headers

    def run(
        self,
        body: Awaitable[AgentTurn[Any]],
        *,
        resumed: bool,
        pending: Sequence[PendingCall] = (),
        paused_trace: Mapping[str, str] | None = None,
    ) -> Awaitable[AgentTurn[Any]]:
        """``body`` (the whole run) inside its ``invoke_agent`` span; a resume's span links to
        ``paused_trace`` (the paused run's span) and holds a span of the decisions."""
        if not self.active and not self.pricing:
            return body
        return self._run(body, resumed, pending, paused_trace)

    async def _run(
        self,
        body: Awaitable[AgentTurn[Any]],
        resumed: bool,
        pending: Sequence[PendingCall],
        paused_trace: Mapping[str, str] | None,
    ) -> AgentTurn[Any]:
        if self.pricing:
            await self.telemetry.prices.load()
        instruments = self.instruments
        if instruments is None:
            return await body
        from opentelemetry import trace

        labels: dict[str, Any] = {
            "agent_plugin.run.origin": self.origin,
            "agent_plugin.run.resumed": resumed,
        }
        instruments.runs_started.add(1, labels)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.provider.name": self.provider,
            "gen_ai.system": self.provider,
            "agent_plugin.run.id": self.run_id,
            "agent_plugin.run.origin": self.origin,
            "agent_plugin.run.resumed": resumed,
        }
        if self.model:
            attributes["gen_ai.request.model"] = self.model
        if self.session_id is not None:
            attributes["gen_ai.conversation.id"] = self.session_id
            attributes["agent_plugin.session.id"] = self.session_id
        links = _links(paused_trace)
        status = "error"
        with instruments.tracer.start_as_current_span(
            "invoke_agent",
            kind=trace.SpanKind.INTERNAL,
            attributes=attributes,
            links=links,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            self.span = span
            try:
                if resumed and pending:
                    self._decisions(pending)
                turn = await body
                outcome = turn.outcome
                status = outcome.status
            except BaseException as error:
                status = _failed(span, error)
                raise
            finally:
                instruments.runs_finished.add(1, {**labels, "agent_plugin.run.status": status})
            span.set_attribute("agent_plugin.run.status", status)
            _set_usage(span, _usage_of(outcome))
            if isinstance(outcome, AwaitingApproval | Paused):
                self._paused(outcome)
            return turn

    def _decisions(self, pending: Sequence[PendingCall]) -> None:
        """A ``resume_approval`` span: what reviewers decided of the paused calls."""
        assert self.instruments is not None
        rejected = [p.call.name for p in pending if isinstance(p.status, Rejected)]
        decided = [p.call.name for p in pending if not isinstance(p.status, Finished)]
        with self.instruments.tracer.start_as_current_span(
            "resume_approval",
            attributes={
                "agent_plugin.run.id": self.run_id,
                "agent_plugin.approval.tools": decided,
                "agent_plugin.approval.approved": len(decided) - len(rejected),
                "agent_plugin.approval.rejected": len(rejected),
            },
        ):
            pass

    def _paused(self, outcome: AwaitingApproval | Paused) -> None:
        """An ``await_approval`` span: the calls the run paused on."""
        assert self.instruments is not None
        pending = outcome.state.pending
        waiting = [p.call.name for p in pending if isinstance(p.status, NeedsApproval)]
        attributes: dict[str, Any] = {
            "agent_plugin.run.id": self.run_id,
            "agent_plugin.approval.tools": waiting,
        }
        if isinstance(outcome, Paused):
            attributes["agent_plugin.approval.reason"] = redact_message(outcome.reason)
        with self.instruments.tracer.start_as_current_span("await_approval", attributes=attributes):
            pass

    # --- model calls ---------------------------------------------------------------------

    def chat(self, call: Awaitable[ChatResponse], request: ChatRequest) -> Awaitable[ChatResponse]:
        """The model call inside its ``chat {model}`` span, its response priced."""
        if not self.active and not self.pricing:
            return call
        return self._chat(call, request)

    async def _chat(self, call: Awaitable[ChatResponse], request: ChatRequest) -> ChatResponse:
        self.switched = None
        instruments = self.instruments
        if instruments is None:
            return self.priced(await call)
        from opentelemetry import trace

        model = request.model or self.model
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self.provider,
            "gen_ai.system": self.provider,
            "agent_plugin.run.id": self.run_id,
        }
        if model:
            attributes["gen_ai.request.model"] = model
        if request.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = request.max_tokens
        if request.temperature is not None:
            attributes["gen_ai.request.temperature"] = request.temperature
        if self.telemetry.record_content:
            attributes["gen_ai.input.messages"] = _messages_json(request.messages)
        labels: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self.provider,
        }
        if model:
            labels["gen_ai.request.model"] = model
        started = time.perf_counter()
        with instruments.tracer.start_as_current_span(
            f"chat {model}" if model else "chat",
            kind=trace.SpanKind.CLIENT,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                response = self.priced(await call)
            except BaseException as error:
                labels["error.type"] = _failed(span, error)
                instruments.model_duration.record(time.perf_counter() - started, labels)
                raise
            if response.model:
                span.set_attribute("gen_ai.response.model", response.model)
                labels["gen_ai.response.model"] = response.model
            if response.id:
                span.set_attribute("gen_ai.response.id", response.id)
            span.set_attribute(
                "gen_ai.response.finish_reasons",
                [response.raw_stop_reason or response.stop_reason.value],
            )
            _set_usage(span, response.usage)
            if self.telemetry.record_content:
                output = ChatMessage(role=Role.ASSISTANT, content=response.content)
                span.set_attribute("gen_ai.output.messages", _messages_json([output]))
            instruments.model_duration.record(time.perf_counter() - started, labels)
            usage = response.usage
            for kind, count in (
                ("input", usage.input_tokens),
                ("output", usage.output_tokens),
                ("cache_read", usage.cache_read_tokens),
                ("cache_write", usage.cache_write_tokens),
            ):
                if count or kind in ("input", "output"):
                    instruments.model_tokens.record(count, {**labels, "gen_ai.token.type": kind})
            if usage.cost_usd is not None:
                instruments.model_cost.add(usage.cost_usd, labels)
            return response

    def priced(self, response: ChatResponse) -> ChatResponse:
        """``response`` with its usage's cost, where its model has a price."""
        if not self.pricing or response.usage.cost_usd is not None:
            return response
        switched = self.switched
        cost = self.telemetry.prices.cost(
            response.usage,
            model=response.model or (switched.to_model if switched else self.model),
            provider=switched.to_provider if switched else self.provider,
            base_url=switched.to_base_url if switched else self.base_url,
        )
        if cost is None:
            return response
        usage = response.usage.model_copy(update={"cost_usd": cost})
        return response.model_copy(update={"usage": usage})

    def cost_of(self, usage: TokenUsage, model: str | None = None) -> float | None:
        """What ``usage`` would cost on ``model`` (default: the run's), where it has a price."""
        return self.telemetry.prices.cost(
            usage, model=model or self.model, provider=self.provider, base_url=self.base_url
        )

    def retried(self, notice: RetryNotice) -> None:
        """The model call failed and is tried again: an event on its span, a retry counted."""
        instruments = self.instruments
        if instruments is None:
            return
        from opentelemetry import trace

        kind = notice.error.kind.value
        trace.get_current_span().add_event(
            "retry",
            {
                "agent_plugin.retry.attempt": notice.attempt,
                "agent_plugin.retry.wait_seconds": notice.wait,
                "error.type": kind,
            },
        )
        instruments.retries.add(1, {"agent_plugin.retry.scope": "model_call", "error.type": kind})

    def fell_back(self, notice: FallbackNotice) -> None:
        """The model call moved to the next model: an event on its span."""
        self.switched = notice
        if self.instruments is None:
            return
        from opentelemetry import trace

        span = trace.get_current_span()
        span.add_event(
            "model_fallback",
            {
                "agent_plugin.fallback.from_model": notice.from_model,
                "agent_plugin.fallback.to_model": notice.to_model,
                "error.type": notice.error.kind.value,
            },
        )
        span.set_attribute("agent_plugin.fallback.model", notice.to_model)

    def paced(
        self, seconds: float, limit: str, model: str
    ) -> contextlib.AbstractContextManager[object]:
        """A ``pacing_wait`` span around the wait before a model call (nothing when inactive)."""
        if self.instruments is None:
            return contextlib.nullcontext()
        return self.instruments.tracer.start_as_current_span(
            "pacing_wait",
            attributes={
                "agent_plugin.run.id": self.run_id,
                "agent_plugin.pacing.wait_seconds": seconds,
                "agent_plugin.pacing.limit": limit,
                "gen_ai.provider.name": self.provider,
                "gen_ai.request.model": model,
            },
        )

    # --- tool calls ----------------------------------------------------------------------

    async def tool(self, call: ToolCall, execution: Awaitable[ToolOutput]) -> ToolOutput:
        """A tool's execution inside its ``execute_tool {name}`` span (the loop calls this
        only when :attr:`active`)."""
        instruments = self.instruments
        if instruments is None:
            return await execution
        from opentelemetry import trace

        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
            "gen_ai.tool.type": "function",
            "agent_plugin.run.id": self.run_id,
        }
        if self.telemetry.record_content:
            attributes["gen_ai.tool.call.arguments"] = json.dumps(redact_deep(call.arguments))
        labels: dict[str, Any] = {"gen_ai.tool.name": call.name}
        started = time.perf_counter()
        with instruments.tracer.start_as_current_span(
            f"execute_tool {call.name}",
            kind=trace.SpanKind.INTERNAL,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                output = await execution
            except BaseException as error:
                labels["error.type"] = _failed(span, error)
                instruments.tool_duration.record(time.perf_counter() - started, labels)
                raise
            if output.is_error:
                labels["error.type"] = "tool_error"
                span.set_attribute("error.type", "tool_error")
                span.set_status(trace.StatusCode.ERROR)
                instruments.tool_errors.add(1, {"gen_ai.tool.name": call.name})
            if self.telemetry.record_content:
                span.set_attribute("gen_ai.tool.call.result", redact_message(output.content))
            instruments.tool_duration.record(time.perf_counter() - started, labels)
            return output


_DEFAULT: list[Telemetry] = []


def default_telemetry() -> Telemetry:
    """The telemetry of agents given none: the global providers, the default prices (one
    value shared by such agents, so their instruments are made once)."""
    if not _DEFAULT:
        _DEFAULT.append(Telemetry())
    return _DEFAULT[0]


# --- crossing the queue --------------------------------------------------------------------


def trace_carrier() -> dict[str, str]:
    """The current trace context as W3C headers (``traceparent``), to travel with a
    background run; empty without ``opentelemetry-api`` or outside a recording span."""
    if not _otel_installed():
        return {}
    from opentelemetry import propagate, trace

    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers


@contextlib.contextmanager
def job_scope(carrier: Mapping[str, str] | None, *, origin: str) -> Iterator[None]:
    """Run a background run's delivery in the context ``carrier`` holds (its spans join
    the enqueueing request's trace) and under its ``origin``."""
    token = _origin.set(origin)
    detach = None
    try:
        if carrier and _otel_installed():
            from opentelemetry import context, propagate

            detach = context.attach(propagate.extract(dict(carrier)))
        yield
    finally:
        if detach is not None:
            from opentelemetry import context

            context.detach(detach)
        _origin.reset(token)


# --- helpers -------------------------------------------------------------------------------


def _links(carrier: Mapping[str, str] | None) -> list[Any]:
    if not carrier:
        return []
    from opentelemetry import propagate, trace

    extracted: Context = propagate.extract(dict(carrier))
    span_context = trace.get_current_span(extracted).get_span_context()
    if not span_context.is_valid:
        return []
    return [trace.Link(span_context, {"agent_plugin.link": "paused_run"})]


def _failed(span: Span, error: BaseException) -> str:
    """Mark ``span`` failed by ``error``; answers its ``error.type``."""
    from opentelemetry import trace

    kind = error.kind.value if isinstance(error, AgentError) else type(error).__name__
    span.set_attribute("error.type", kind)
    message = error.message if isinstance(error, AgentError) else str(error)
    span.set_status(trace.StatusCode.ERROR, redact_message(message)[:500])
    return kind


def _set_usage(span: Span, usage: TokenUsage | None) -> None:
    if usage is None:
        return
    span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
    span.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cache_read_tokens)
    span.set_attribute("gen_ai.usage.cache_creation.input_tokens", usage.cache_write_tokens)
    if usage.cost_usd is not None:
        span.set_attribute("agent_plugin.cost_usd", usage.cost_usd)


def _usage_of(outcome: AgentOutcome[Any]) -> TokenUsage | None:
    usage = getattr(outcome, "usage", None)
    if isinstance(usage, TokenUsage):
        return usage
    state = getattr(outcome, "state", None)
    return getattr(state, "usage", None)


def _messages_json(messages: Sequence[ChatMessage]) -> str:
    """The messages as JSON, redacted: what ``gen_ai.*.messages`` hold when contents are on."""
    return json.dumps(redact_deep([m.model_dump(mode="json") for m in messages]))
