"""Pacing model calls (issue 23 item 5): the buckets in the process and in Redis, the
providers' rate-limit headers, the wait as an event and a span bounded by the deadline, and a
fleet held under a provider's limit that answers 429 above it."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_plugin.agent import Agent
from agent_plugin.config import AgentSettings
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import AgentEvent, PacingWait, event_adapter
from agent_plugin.live.pacing import RedisPacer
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import BudgetExhausted, Completed
from agent_plugin.pacing import (
    LocalPacer,
    PaceLimits,
    Pacer,
    PacingConfig,
    read_rate_headers,
)
from agent_plugin.providers.anthropic import AnthropicClient
from agent_plugin.providers.base import LlmClient
from agent_plugin.providers.openai import OpenAICompatibleClient
from agent_plugin.providers.retry import RetryPolicy
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.runtime import pacer_for
from agent_plugin.telemetry import Telemetry
from agent_plugin.tools import tool
from tests.httpserver import HttpServer, RecordedRequest, Reply, Stream, reply_json
from tests.services import REDIS_URL
from tests.wire import anthropic_stream, load, openai_stream

MODEL = "paced-model"


def config(
    requests: float | None = None, tokens: float | None = None, per: float = 1.0
) -> PacingConfig:
    return PacingConfig(PaceLimits(requests, tokens, per))


PacerOf = Callable[[PacingConfig], Pacer]


@pytest.fixture(params=["local", "redis"])
async def pacer_of(request: pytest.FixtureRequest) -> AsyncIterator[PacerOf]:
    """Makes pacers of one kind; the Redis ones share a key prefix of this test's own."""
    prefix = f"test:pacing:{uuid.uuid4().hex}:"
    made: list[Pacer] = []

    def make(limits: PacingConfig) -> Pacer:
        pacer: Pacer
        if request.param == "local":
            pacer = LocalPacer(limits)
        else:
            pacer = RedisPacer.from_url(REDIS_URL, limits, prefix=prefix)
        made.append(pacer)
        return pacer

    yield make
    for pacer in made:
        await pacer.aclose()
    if request.param == "redis":
        redis = aioredis.Redis.from_url(REDIS_URL)
        keys = [key async for key in redis.scan_iter(match=prefix + "*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


# --- the buckets -----------------------------------------------------------------------------


async def test_a_full_bucket_lets_the_limit_through_then_spaces_calls_out(
    pacer_of: PacerOf,
) -> None:
    pacer = pacer_of(config(requests=4, per=1.0))
    waits = [await pacer.acquire("openai", MODEL, 10) for _ in range(6)]
    assert [w.seconds for w in waits[:4]] == [0.0] * 4
    assert all(w.limit is None for w in waits[:4])
    # the fifth waits for a quarter second of refill, the sixth for half a second: reserved
    assert waits[4].limit == waits[5].limit == "requests"
    assert waits[4].seconds == pytest.approx(0.25, abs=0.1)
    assert waits[5].seconds == pytest.approx(0.5, abs=0.1)


async def test_the_bucket_refills_with_time(pacer_of: PacerOf) -> None:
    pacer = pacer_of(config(requests=5, per=5.0))  # one back a second
    for _ in range(5):
        assert (await pacer.acquire("openai", MODEL, 1)).seconds == 0.0
    await asyncio.sleep(1.5)  # one and a half back
    assert (await pacer.acquire("openai", MODEL, 1)).seconds == 0.0
    second = await pacer.acquire("openai", MODEL, 1)
    assert second.limit == "requests"
    assert 0.0 < second.seconds <= 0.5  # the half that is missing (less if the sleep overran)


async def test_tokens_are_paced_by_the_estimate_and_one_call_never_needs_more_than_the_limit(
    pacer_of: PacerOf,
) -> None:
    pacer = pacer_of(config(requests=100, tokens=1000, per=1.0))
    assert (await pacer.acquire("openai", MODEL, 800)).seconds == 0.0
    second = await pacer.acquire("openai", MODEL, 500)  # 200 left: 300 more needed
    assert second.limit == "tokens"
    assert second.seconds == pytest.approx(0.3, abs=0.1)
    # a call estimated past the whole limit waits for a full bucket, not forever
    huge = await pacer.acquire("openai", MODEL, 50_000)
    assert huge.limit == "tokens"
    assert huge.seconds == pytest.approx(0.3 + 1.0, abs=0.1)


async def test_tokens_a_call_did_not_use_come_back(pacer_of: PacerOf) -> None:
    pacer = pacer_of(config(requests=100, tokens=1000, per=60.0))
    assert (await pacer.acquire("openai", MODEL, 800)).seconds == 0.0
    await pacer.observe("openai", MODEL, None, unused_tokens=600)  # it used 200
    assert (await pacer.acquire("openai", MODEL, 700)).seconds == 0.0
    # never past the limit
    await pacer.observe("openai", MODEL, None, unused_tokens=50_000)
    assert (await pacer.acquire("openai", MODEL, 1000)).seconds == 0.0
    assert (await pacer.acquire("openai", MODEL, 60)).seconds == pytest.approx(3.6, abs=0.1)


async def test_a_wait_past_max_wait_takes_nothing(pacer_of: PacerOf) -> None:
    pacer = pacer_of(config(requests=1, per=10.0))
    assert (await pacer.acquire("openai", MODEL, 1)).seconds == 0.0
    refused = await pacer.acquire("openai", MODEL, 1, max_wait=1.0)
    assert not refused.granted
    assert refused.seconds == pytest.approx(10.0, abs=0.1)
    again = await pacer.acquire("openai", MODEL, 1)  # nothing was reserved by the refusal
    assert again.granted
    assert again.seconds == pytest.approx(10.0, abs=0.1)


async def test_models_and_providers_have_buckets_of_their_own(pacer_of: PacerOf) -> None:
    limits = PacingConfig(
        PaceLimits(requests=1, per=10.0), {"big": PaceLimits(requests=3, per=10.0)}
    )
    pacer = pacer_of(limits)
    assert (await pacer.acquire("openai", MODEL, 1)).seconds == 0.0
    assert (await pacer.acquire("openai", MODEL, 1)).seconds > 0
    assert (await pacer.acquire("anthropic", MODEL, 1)).seconds == 0.0
    assert [(await pacer.acquire("openai", "big", 1)).seconds for _ in range(3)] == [0.0] * 3
    assert (await pacer.acquire("openai", "big", 1)).seconds > 0


async def test_pacers_on_one_redis_share_their_buckets() -> None:
    prefix = f"test:pacing:{uuid.uuid4().hex}:"
    first = RedisPacer.from_url(REDIS_URL, config(requests=2, per=10.0), prefix=prefix)
    second = RedisPacer.from_url(REDIS_URL, config(requests=2, per=10.0), prefix=prefix)
    try:
        assert (await first.acquire("openai", MODEL, 1)).seconds == 0.0
        assert (await second.acquire("openai", MODEL, 1)).seconds == 0.0
        assert (await first.acquire("openai", MODEL, 1)).seconds == pytest.approx(5.0, abs=0.1)
        assert (await second.acquire("openai", MODEL, 1)).seconds == pytest.approx(10.0, abs=0.1)
        ttl = await first.redis.pttl(first.keys("openai", MODEL)[0])
        assert 0 < ttl <= 21_000  # gone once it would be full again
    finally:
        await first.redis.delete(*first.keys("openai", MODEL))
        await first.aclose()
        await second.aclose()


async def test_an_unreachable_redis_holds_no_call_back(caplog: pytest.LogCaptureFixture) -> None:
    pacer = RedisPacer.from_url("redis://127.0.0.1:1/0", config(requests=1, per=60.0))
    try:
        for _ in range(3):
            wait = await pacer.acquire("openai", MODEL, 1)
            assert wait.granted
            assert wait.seconds == 0.0
        await pacer.observe("openai", MODEL, {"x-ratelimit-remaining-requests": "0"})
    finally:
        await pacer.aclose()
    assert "not waiting" in caplog.text


# --- the providers' headers ------------------------------------------------------------------


def recorded_headers(name: str) -> dict[str, str]:
    headers: dict[str, str] = load(name)["response"]["headers"]
    return {k: v for k, v in headers.items() if "ratelimit" in k}


def test_openai_headers_are_read_as_recorded() -> None:
    headers = recorded_headers("openai-compatible__tool_call_single__mirascope")
    heard = read_rate_headers(headers)
    assert heard is not None
    assert heard.requests_remaining == 4999
    assert heard.tokens_remaining == 799979
    assert heard.requests_reset == pytest.approx(0.012)
    assert heard.tokens_reset == pytest.approx(0.001)
    upper = read_rate_headers({k.upper(): v for k, v in headers.items()})
    assert upper == heard


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0s", 0.0),
        ("10.332999999s", 10.332999999),
        ("6m0s", 360.0),
        ("1h2m3s", 3723.0),
        ("20ms", 0.02),
        ("1.5", 1.5),
        ("soon", None),
    ],
)
def test_openai_reset_durations(text: str, seconds: float | None) -> None:
    heard = read_rate_headers(
        {"x-ratelimit-reset-requests": text, "x-ratelimit-remaining-requests": "1"}
    )
    assert heard is not None
    assert heard.requests_reset == (None if seconds is None else pytest.approx(seconds))


def test_anthropic_headers_are_read_as_recorded() -> None:
    headers = recorded_headers("anthropic__stream_tool_result_followup__mirascope")
    reset = datetime.fromisoformat(headers["anthropic-ratelimit-requests-reset"]).timestamp()
    heard = read_rate_headers(headers, now=reset - 7.5)
    assert heard is not None
    assert heard.requests_remaining == 3999
    assert heard.tokens_remaining == 2_400_000
    assert heard.requests_reset == pytest.approx(7.5)
    assert heard.tokens_reset == pytest.approx(7.5)
    assert read_rate_headers(headers, now=reset + 60).requests_reset == 0.0  # type: ignore[union-attr]


def test_answers_without_rate_limit_headers_say_nothing() -> None:
    assert read_rate_headers({"content-type": "application/json"}) is None
    assert read_rate_headers({"x-ratelimit-remaining-requests": "lots"}) is None


def openai_says(remaining: int, reset: str) -> dict[str, str]:
    headers = recorded_headers("openai-compatible__tool_call_single__mirascope")
    return {
        **headers,
        "x-ratelimit-remaining-requests": str(remaining),
        "x-ratelimit-reset-requests": reset,
    }


def anthropic_says(remaining: int, reset_in: float) -> dict[str, str]:
    headers = recorded_headers("anthropic__stream_tool_result_followup__mirascope")
    when = datetime.fromtimestamp(math.ceil(time.time() + reset_in), UTC)
    return {
        **headers,
        "anthropic-ratelimit-requests-remaining": str(remaining),
        "anthropic-ratelimit-requests-reset": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


@pytest.mark.parametrize(
    "says",
    [lambda: openai_says(2, "20ms"), lambda: anthropic_says(2, 0.0)],
    ids=["openai", "anthropic"],
)
async def test_fewer_remaining_than_the_bucket_holds_lowers_it(
    pacer_of: PacerOf, says: Callable[[], dict[str, str]]
) -> None:
    pacer = pacer_of(config(requests=100, per=60.0))
    await pacer.observe("openai", MODEL, says())
    waits = [await pacer.acquire("openai", MODEL, 1) for _ in range(3)]
    assert [w.seconds for w in waits[:2]] == [0.0, 0.0]
    assert waits[2].limit == "requests"
    assert waits[2].seconds == pytest.approx(0.6, abs=0.1)  # one request: 60 s / 100


@pytest.mark.parametrize(
    "says",
    [lambda: openai_says(0, "2m0s"), lambda: anthropic_says(0, 120.0)],
    ids=["openai", "anthropic"],
)
async def test_a_reset_later_than_the_bucket_would_refill_holds_it_back(
    pacer_of: PacerOf, says: Callable[[], dict[str, str]]
) -> None:
    # the bucket (10 a minute) would be whole in one minute; the provider says two
    pacer = pacer_of(config(requests=10, per=60.0))
    await pacer.observe("openai", MODEL, says())
    wait = await pacer.acquire("openai", MODEL, 1, max_wait=0)
    assert not wait.granted
    assert wait.seconds == pytest.approx(66.0, abs=1.5)  # whole at 120 s: one token at 66 s


async def test_a_reset_hours_away_holds_the_bucket_back_two_windows_at_most(
    pacer_of: PacerOf,
) -> None:
    # a daily limit's reset (23 h) against a bucket of 10 a minute: not a stall for hours
    pacer = pacer_of(config(requests=10, per=60.0))
    await pacer.observe("openai", MODEL, openai_says(0, "23h0m0s"))
    wait = await pacer.acquire("openai", MODEL, 1, max_wait=0)
    assert not wait.granted
    assert wait.seconds == pytest.approx(66.0, abs=1.5)  # from minus one bucket: 11 tokens


async def test_more_remaining_than_the_bucket_holds_changes_nothing(pacer_of: PacerOf) -> None:
    pacer = pacer_of(config(requests=2, per=10.0))
    await pacer.acquire("openai", MODEL, 1)
    await pacer.observe("openai", MODEL, openai_says(4000, "1ms"))
    assert (await pacer.acquire("openai", MODEL, 1)).seconds == 0.0
    assert (await pacer.acquire("openai", MODEL, 1)).seconds > 0


# --- a run that waits ------------------------------------------------------------------------


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


def two_calls() -> ScriptedModel:
    return ScriptedModel([[tool_call("lookup", {"city": "Oslo"})], "done"], models=(MODEL,))


async def test_a_wait_is_an_event_and_a_span_of_the_run() -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    telemetry = Telemetry(tracer_provider=provider)
    pacer = LocalPacer(config(requests=1, per=1.0))
    agent = Agent(two_calls(), tools=[lookup], pacer=pacer, telemetry=telemetry)
    events: list[AgentEvent] = []
    started = time.monotonic()
    turn = await agent.run("weather?", options=RunOptions(on_event=events.append))
    assert isinstance(turn.outcome, Completed)
    assert time.monotonic() - started >= 0.99
    waits = [e for e in events if isinstance(e, PacingWait)]
    assert len(waits) == 1
    (wait,) = waits
    assert wait.limit == "requests"
    assert wait.provider == "scripted"
    assert wait.model == MODEL
    assert 0 < wait.wait_seconds <= 1.0  # the second call goes a second after the first
    assert event_adapter.validate_json(event_adapter.dump_json(wait)) == wait
    types = [e.type for e in events]
    assert types.index("pacing_wait") < types.index("model_response", types.index("tool_end"))
    finished = {s.name: s for s in spans.get_finished_spans()}
    span = finished["pacing_wait"]
    assert span.attributes is not None
    assert span.attributes["agent_plugin.pacing.limit"] == "requests"
    assert span.attributes["gen_ai.request.model"] == MODEL
    assert span.parent is not None
    assert span.parent.span_id == finished["invoke_agent"].context.span_id
    assert (span.end_time or 0) - (span.start_time or 0) >= (wait.wait_seconds - 0.01) * 1e9


async def test_a_wait_past_the_deadline_ends_the_run_as_the_deadline_does() -> None:
    pacer = LocalPacer(config(requests=1, per=30.0))
    agent = Agent(two_calls(), tools=[lookup], pacer=pacer, max_duration=2.0)
    events: list[AgentEvent] = []
    started = time.monotonic()
    turn = await agent.run("weather?", options=RunOptions(on_event=events.append))
    assert time.monotonic() - started < 1.0  # not waited for in vain
    assert isinstance(turn.outcome, BudgetExhausted)
    assert turn.outcome.reason == "deadline"
    assert not [e for e in events if isinstance(e, PacingWait)]
    # the refused call took nothing: the bucket is as the first call left it
    assert (await pacer.acquire("scripted", MODEL, 1, max_wait=0)).seconds == pytest.approx(
        30.0, abs=1.5
    )


async def test_a_run_keeps_only_the_tokens_its_calls_used() -> None:
    # each request may ask for up to 32000 tokens: reserved before the call, given back after
    pacer = LocalPacer(config(tokens=100_000, per=60.0))
    turn = await Agent(two_calls(), tools=[lookup], pacer=pacer).run("weather?")
    assert isinstance(turn.outcome, Completed)
    used = turn.outcome.usage.total()
    assert 0 < used < 1000
    left = await pacer.acquire("scripted", MODEL, 100_000 - used - 10, max_wait=0)
    assert left.granted
    assert left.seconds == 0.0


async def test_a_failed_call_gives_its_tokens_back() -> None:
    pacer = LocalPacer(config(tokens=100_000, per=60.0))
    failing = ScriptedModel([AgentError(ErrorKind.INVALID, "bad request")], models=(MODEL,))
    with pytest.raises(AgentError):
        await Agent(failing, pacer=pacer).run("hi")
    assert (await pacer.acquire("scripted", MODEL, 100_000, max_wait=0)).seconds == 0.0


async def test_without_a_pacer_nothing_waits() -> None:
    events: list[AgentEvent] = []
    turn = await Agent(two_calls(), tools=[lookup]).run(
        "weather?", options=RunOptions(on_event=events.append)
    )
    assert isinstance(turn.outcome, Completed)
    assert not [e for e in events if isinstance(e, PacingWait)]


# --- the headers of real answers reach the pacer ---------------------------------------------


def openai_body(text: str = "ok") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }


ANTHROPIC_BODY: dict[str, Any] = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": MODEL,
    "content": [{"type": "text", "text": "ok"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 5, "output_tokens": 1},
}


def exhausted_openai() -> dict[str, str]:
    return openai_says(0, "2m0s")


@pytest.mark.parametrize("kind", ["openai", "openai-stream", "anthropic", "anthropic-stream"])
async def test_a_providers_headers_lower_the_bucket_after_its_answer(kind: str) -> None:
    if kind == "anthropic":
        reply: Any = reply_json(ANTHROPIC_BODY, headers=anthropic_says(0, 120.0))
    elif kind == "anthropic-stream":
        headers = {"content-type": "text/event-stream", **anthropic_says(0, 120.0)}
        reply = Stream([anthropic_stream(ANTHROPIC_BODY)], headers=headers)
    elif kind == "openai":
        reply = reply_json(openai_body(), headers=exhausted_openai())
    else:
        headers = {"content-type": "text/event-stream", **exhausted_openai()}
        reply = Stream([openai_stream(openai_body())], headers=headers)
    async with HttpServer(default=reply) as server:
        client: LlmClient
        if kind.startswith("anthropic"):
            client = AnthropicClient(model=MODEL, base_url=server.url, api_key="sk-test")
        else:
            client = OpenAICompatibleClient(model=MODEL, base_url=server.url + "/v1")
        pacer = LocalPacer(config(requests=100, per=60.0))
        try:
            agent = Agent(client, pacer=pacer)
            turn = await agent.run("hi", options=RunOptions(stream=kind.endswith("stream")))
            assert isinstance(turn.outcome, Completed)
        finally:
            await client.aclose()
    provider = client.provider_name
    wait = await pacer.acquire(provider, MODEL, 1, max_wait=0)
    assert not wait.granted
    assert wait.seconds >= 30  # without the headers, 99 requests would still be free


# --- a fleet under a provider's limit --------------------------------------------------------


class LimitedProvider:
    """An OpenAI-shaped server allowing ``limit`` requests per ``per`` seconds (a token
    bucket, as OpenAI's limits replenish), answering 429 above it and telling what remains."""

    def __init__(self, limit: float, per: float) -> None:
        self.capacity = limit
        self.rate = limit / per
        self.level = limit
        self.at = time.monotonic()
        self.answered = 0
        self.refused = 0

    def __call__(self, request: RecordedRequest) -> Reply:
        now = time.monotonic()
        self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
        self.at = now
        if self.level < 1:
            self.refused += 1
            body = {
                "error": {
                    "message": "Rate limit reached",
                    "type": "requests",
                    "code": "rate_limit_exceeded",
                }
            }
            return reply_json(body, status=429, headers=self.headers())
        self.level -= 1
        self.answered += 1
        return reply_json(openai_body(), headers=self.headers())

    def headers(self) -> dict[str, str]:
        reset = (self.capacity - self.level) / self.rate
        return {
            "x-ratelimit-limit-requests": str(int(self.capacity)),
            "x-ratelimit-remaining-requests": str(max(int(self.level), 0)),
            "x-ratelimit-reset-requests": f"{reset:.3f}s",
        }


async def fleet(server: HttpServer, pacers: list[Pacer | None], runs: int) -> list[object]:
    """``runs`` concurrent runs spread over one agent per pacer (as over that many workers)."""
    client = OpenAICompatibleClient(
        model=MODEL, base_url=server.url + "/v1", retry=RetryPolicy(max_attempts=1)
    )
    agents = [Agent(client, pacer=pacer) for pacer in pacers]

    async def one(index: int) -> object:
        try:
            return (await agents[index % len(agents)].run(f"task {index}")).outcome
        except AgentError as error:
            return error

    try:
        return await asyncio.gather(*(one(i) for i in range(runs)))
    finally:
        await client.aclose()


async def test_pacing_holds_a_fleet_under_the_providers_limit() -> None:
    limited = LimitedProvider(limit=5, per=1.0)
    prefix = f"test:pacing:{uuid.uuid4().hex}:"
    limits = config(requests=4, per=1.0)  # a little under the provider's limit
    pacers: list[Pacer | None] = [
        RedisPacer.from_url(REDIS_URL, limits, prefix=prefix) for _ in range(2)
    ]
    started = time.monotonic()
    try:
        async with HttpServer(default=limited) as server:
            outcomes = await fleet(server, pacers, runs=14)
    finally:
        for pacer in pacers:
            assert pacer is not None
            await pacer.aclose()
    elapsed = time.monotonic() - started
    assert limited.refused == 0
    assert limited.answered == 14
    assert all(isinstance(o, Completed) for o in outcomes)
    assert elapsed >= 2.0  # 4 at once, then 10 more at 4 a second


async def test_the_same_load_without_pacing_gets_429s() -> None:
    limited = LimitedProvider(limit=5, per=1.0)
    async with HttpServer(default=limited) as server:
        outcomes = await fleet(server, [None, None], runs=14)
    assert limited.refused > 0
    assert any(isinstance(o, AgentError) and o.kind.value == "rate_limited" for o in outcomes)


# --- settings --------------------------------------------------------------------------------


async def test_settings_make_a_pacer_per_model(tmp_path: Path) -> None:
    toml = tmp_path / "agent.toml"
    toml.write_text(
        '[agent]\npacing_rpm = 500\n[agent.pacing."gpt-4o"]\nrpm = 60\n', encoding="utf-8"
    )
    environ = {"AGENT_CONFIG_FILE": str(toml), "AGENT_PACING_TPM": "90000"}
    settings = AgentSettings.load(environ=environ)
    limits = settings.pacing_config()
    assert limits.limits_for("gpt-4o-mini") == PaceLimits(500, 90_000)
    assert limits.limits_for("gpt-4o") == PaceLimits(60, None)
    local = pacer_for(settings, None)
    assert isinstance(local, LocalPacer)
    shared = pacer_for(settings, "agent:")
    assert isinstance(shared, RedisPacer)
    assert shared.prefix == "agent:pacing:"
    await shared.aclose()
    assert pacer_for(AgentSettings.load(environ={}), "agent:") is None
    given = pacer_for(AgentSettings.load(environ={}), None, config(requests=3, per=1.0))
    assert isinstance(given, LocalPacer)
    assert given.config.limits_for("any") == PaceLimits(3, per=1.0)


@pytest.mark.parametrize(
    "table", [{"gpt-4o": {"rpm": 0}}, {"gpt-4o": {"rps": 5}}, {"gpt-4o": {"rpm": "many"}}]
)
def test_bad_pacing_tables_are_refused(table: Mapping[str, Any]) -> None:
    with pytest.raises(AgentError, match="pacing"):
        AgentSettings.load({"pacing": table}, environ={})
