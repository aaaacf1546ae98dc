"""Live runs: event streams on the real Redis (127.0.0.1), SSE through a real uvicorn server,
cancel and steer across processes, redaction of what is published, and the console page."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import shutil
import socket
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
import redis.asyncio as aioredis
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent_plugin.agent import Agent
from agent_plugin.cancellation import CancelToken
from agent_plugin.errors import AgentError
from agent_plugin.events import (
    AgentEvent,
    ModelResponded,
    OutcomeSummary,
    PendingApproval,
    RunEnded,
    RunStarted,
    TextDeltaEvent,
    ThinkingDeltaEvent,
    ToolFinished,
    ToolStarted,
    TurnEnded,
    TurnStarted,
)
from agent_plugin.live import (
    ControlWatcher,
    DeltaGuard,
    RunControlChannel,
    RunEventStream,
    StreamWriter,
    caught_up_with_end,
    open_events,
    parse_event_id,
    public_json,
    public_jsons,
    public_payload,
    read_events,
    stream_key,
    watch,
)
from agent_plugin.live.publishing import _TURN_MAX, _WRITE_BATCH
from agent_plugin.messages import ChatMessage, Role, StopReason, TextPart, TokenUsage
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import Cancelled, Completed
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.redaction import REDACTED
from agent_plugin.steering import Steering
from agent_plugin.tools import FnTool
from agent_plugin.web.console import CONSOLE_HEADERS, CONSOLE_SCRIPT, console_page
from agent_plugin.web.sse import sse_response
from tests.services import REDIS_URL

CANARY_KEY = "sk-ant-" + "Q7f2Lm9XcV4bN8pR3tY6wZ1kA9b3C7"
CANARY_PASSWORD = "Canary-Pw-7f3e91d2"

assert len(CANARY_KEY) == len("sk-ant-") + 30


@pytest.fixture
def prefix() -> str:
    return f"agent-test-live-{uuid.uuid4().hex[:12]}:"


@pytest.fixture
async def redis(prefix: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        yield client
    finally:
        keys = [key async for key in client.scan_iter(match=prefix + "*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


def usage() -> TokenUsage:
    return TokenUsage(input_tokens=3, output_tokens=2)


def end(run_id: str, status: str = "completed", **fields: Any) -> RunEnded:
    summary = OutcomeSummary(status=status, steps_used=1, usage=usage(), **fields)
    return RunEnded(run_id=run_id, summary=summary)


def script_events(run_id: str, steps: int = 3) -> list[AgentEvent]:
    """A plausible run: start, ``steps`` tool rounds, a final answer, end."""
    events: list[AgentEvent] = [RunStarted(run_id=run_id)]
    for step in range(1, steps + 1):
        events += [
            TurnStarted(run_id=run_id, step=step),
            ToolStarted(run_id=run_id, call_id=f"c{step}", name="echo", arguments={"n": step}),
            ToolFinished(run_id=run_id, call_id=f"c{step}", name="echo", content=f"n={step}"),
            TurnEnded(run_id=run_id, step=step),
        ]
    events.append(end(run_id, text="all done"))
    return events


async def collect(
    redis: aioredis.Redis, run_id: str, prefix: str, **kwargs: Any
) -> list[tuple[str, dict[str, Any]]]:
    return [
        item async for item in read_events(redis, run_id, prefix=prefix, block_ms=1000, **kwargs)
    ]


def id_order(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


# --- publishing and reading ------------------------------------------------------------------


async def test_events_are_read_back_in_order_and_the_reading_ends_after_run_end(
    redis: aioredis.Redis, prefix: str
) -> None:
    stream = RunEventStream(redis, "r1", prefix=prefix)
    events = script_events("r1")
    for event in events:
        await stream.publish(event)
    await stream.publish(TurnStarted(run_id="r1", step=99))  # after the end: not read
    read = await collect(redis, "r1", prefix)
    assert [e["type"] for _, e in read] == [e.type for e in events]
    assert read[-1][1]["summary"]["text"] == "all done"
    assert read[3][1] == {
        "run_id": "r1",
        "type": "tool_end",
        "call_id": "c1",
        "name": "echo",
        "content": "n=1",
        "is_error": False,
        "terminate": False,
    }
    ids = [entry_id for entry_id, _ in read]
    assert ids == sorted(ids, key=id_order)
    assert len(set(ids)) == len(ids)


async def test_reading_waits_for_a_run_that_has_not_started_yet(
    redis: aioredis.Redis, prefix: str
) -> None:
    reader = asyncio.ensure_future(collect(redis, "later", prefix))
    await asyncio.sleep(0.2)
    assert not reader.done()  # queued: no stream yet, the reader waits
    stream = RunEventStream(redis, "later", prefix=prefix)
    for event in script_events("later", steps=1):
        await stream.publish(event)
    read = await asyncio.wait_for(reader, 5)
    assert next(e["type"] for _, e in read) == "run_start"
    assert read[-1][1]["type"] == "run_end"


async def test_last_event_id_resumes_without_gaps_or_duplicates(
    redis: aioredis.Redis, prefix: str
) -> None:
    stream = RunEventStream(redis, "r2", prefix=prefix)
    events = script_events("r2", steps=5)
    first_half = events[:9]
    for event in first_half:
        await stream.publish(event)
    seen: list[tuple[str, dict[str, Any]]] = []
    async for item in read_events(redis, "r2", prefix=prefix, block_ms=1000):
        seen.append(item)
        if len(seen) == 7:
            break  # the client drops the connection mid-run
    publisher = asyncio.ensure_future(_publish_slowly(stream, events[9:]))
    rest = await collect(redis, "r2", prefix, last_event_id=seen[-1][0])
    await publisher
    everything = await collect(redis, "r2", prefix)
    assert seen + rest == everything
    assert [e["type"] for _, e in everything] == [e.type for e in events]


async def _publish_slowly(stream: RunEventStream, events: list[AgentEvent]) -> None:
    for event in events:
        await asyncio.sleep(0.01)
        await stream.publish(event)


async def test_a_finished_run_replays_and_a_reader_past_its_end_gets_nothing(
    redis: aioredis.Redis, prefix: str
) -> None:
    stream = RunEventStream(redis, "done", prefix=prefix)
    for event in script_events("done", steps=2):
        await stream.publish(event)
    replay = await collect(redis, "done", prefix)
    assert replay[-1][1]["type"] == "run_end"
    again = await collect(redis, "done", prefix)
    assert again == replay
    last = replay[-1][0]
    assert await caught_up_with_end(redis, "done", last, prefix=prefix)
    assert not await caught_up_with_end(redis, "done", replay[-2][0], prefix=prefix)
    # No waiting for events that never come (a reader that waited would sit there for good).
    past_end = collect(redis, "done", prefix, last_event_id=last)
    assert await asyncio.wait_for(past_end, 10) == []
    tail = await collect(redis, "done", prefix, last_event_id=replay[-3][0])
    assert tail == replay[-2:]


async def test_a_pause_ends_a_reading_and_follow_goes_on_through_the_resume(
    redis: aioredis.Redis, prefix: str
) -> None:
    stream = RunEventStream(redis, "p", prefix=prefix)
    pending = PendingApproval(call_id="c1", name="delete", arguments={"id": 7}, reason="risky")
    await stream.publish(RunStarted(run_id="p"))
    await stream.publish(end("p", "awaiting_approval", awaiting=[pending]))
    first = await collect(redis, "p", prefix)
    assert [e["type"] for _, e in first] == ["run_start", "run_end"]
    assert first[-1][1]["summary"]["awaiting"][0]["call_id"] == "c1"
    assert not await caught_up_with_end(redis, "p", first[-1][0], prefix=prefix)

    follower = asyncio.ensure_future(collect(redis, "p", prefix, follow=True))
    after_pause = asyncio.ensure_future(collect(redis, "p", prefix, last_event_id=first[-1][0]))
    await asyncio.sleep(0.2)
    assert not follower.done()
    assert not after_pause.done()
    await stream.publish(RunStarted(run_id="p", resumed=True))
    await stream.publish(end("p", text="deleted"))
    followed = await asyncio.wait_for(follower, 5)
    assert [e["type"] for _, e in followed] == ["run_start", "run_end", "run_start", "run_end"]
    resumed = await asyncio.wait_for(after_pause, 5)
    assert resumed == followed[2:]


async def test_the_stream_expires_after_the_end_and_a_resume_keeps_it(
    redis: aioredis.Redis, prefix: str
) -> None:
    stream = RunEventStream(redis, "ttl", prefix=prefix, ttl_after_end=120, ttl_after_pause=900)
    key = stream_key("ttl", prefix)
    await stream.publish(RunStarted(run_id="ttl"))
    assert await redis.ttl(key) == -1  # no expiry while the run goes on
    await stream.publish(end("ttl", "awaiting_approval"))
    assert 890 < await redis.ttl(key) <= 900
    await stream.publish(RunStarted(run_id="ttl", resumed=True))
    assert await redis.ttl(key) == -1  # the resume removed the expiry
    await stream.publish(end("ttl"))
    assert 110 < await redis.ttl(key) <= 120


async def test_the_stream_is_bounded(redis: aioredis.Redis, prefix: str) -> None:
    stream = RunEventStream(redis, "long", prefix=prefix, maxlen=200)
    batch: list[AgentEvent] = [TurnStarted(run_id="long", step=i) for i in range(2000)]
    for start in range(0, len(batch), 250):
        await stream.write(batch[start : start + 250])
    length = await redis.xlen(stream_key("long", prefix))
    assert 200 <= length <= 300  # MAXLEN ~ trims whole nodes of 100 entries
    newest = await redis.xrevrange(stream_key("long", prefix), count=1)
    assert json.loads(newest[0][1][b"data"])["step"] == 1999


async def test_a_bad_last_event_id_is_refused() -> None:
    assert parse_event_id("1700000000000-3") == "1700000000000-3"
    assert parse_event_id(" 17 ") == "17-0"
    assert parse_event_id("abc") is None
    assert parse_event_id("1-2-3") is None
    assert parse_event_id(None) is None


# --- the publisher: never blocking the loop --------------------------------------------------


class GatedRedis:
    """The real client, whose event writes wait for ``gate`` before they run (a stuck Redis)."""

    def __init__(self, real: aioredis.Redis) -> None:
        self.real = real
        self.gate = asyncio.Event()
        self.writes = 0

    async def evalsha(self, *args: Any) -> Any:
        await self.gate.wait()
        self.writes += 1
        return await self.real.evalsha(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


async def test_a_stuck_redis_never_holds_up_the_sink_or_the_loop(
    redis: aioredis.Redis, prefix: str
) -> None:
    # No clock here: what the sink costs per event is measured in benchmarks/, never asserted.
    gated = GatedRedis(redis)
    stream = RunEventStream(gated, "slow", prefix=prefix)  # type: ignore[arg-type]
    sink = stream.publisher(capacity=10_000)
    ticks = 0

    async def ticker() -> None:  # another task of the loop, the app's own work
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    running = asyncio.create_task(ticker())
    assert sink(RunStarted(run_id="slow")) is None  # a plain call: nothing to await
    for _ in range(1000):  # the writer lingers a few ms for more events, then takes them
        if sink.waiting == 0:
            break
        await asyncio.sleep(0.001)
    assert sink.waiting == 0  # the writer took run_start and is stuck in Redis now
    assert gated.writes == 0

    words = [f"w{i} " for i in range(5000)]
    for i, word in enumerate(words):
        sink(TextDeltaEvent(run_id="slow", text=word))
        if i % 1000 == 999:
            sink(ToolStarted(run_id="slow", call_id=f"c{i}", name="t", arguments={}))
        if i % 500 == 0:
            await asyncio.sleep(0)
    sink(end("slow"))
    # Every event was taken while Redis had taken none: the sink never waited for it.
    assert gated.writes == 0
    before = ticks
    for _ in range(20):
        await asyncio.sleep(0)
    assert ticks > before  # the loop keeps turning while Redis is stuck
    assert sink.waiting <= 12  # consecutive deltas were merged while they waited
    running.cancel()

    gated.gate.set()
    await sink.aclose()
    read = await collect(redis, "slow", prefix)
    kinds = [e["type"] for _, e in read]
    assert kinds[0] == "run_start"
    assert kinds[-1] == "run_end"
    assert kinds.count("tool_start") == 5
    text = "".join(e["text"] for _, e in read if e["type"] == "text_delta")
    assert text == "".join(words)
    assert sink.dropped == 0


async def test_a_full_buffer_drops_the_oldest_deltas_and_keeps_every_other_event(
    redis: aioredis.Redis, prefix: str
) -> None:
    gated = GatedRedis(redis)
    stream = RunEventStream(gated, "full", prefix=prefix)  # type: ignore[arg-type]
    sink = stream.publisher(capacity=3)
    events: list[AgentEvent] = [
        RunStarted(run_id="full"),
        TextDeltaEvent(run_id="full", text="one "),
        ToolStarted(run_id="full", call_id="a", name="t", arguments={}),
        TextDeltaEvent(run_id="full", text="two "),
        ToolFinished(run_id="full", call_id="a", name="t", content="ok"),
        TextDeltaEvent(run_id="full", text="three "),
        end("full"),
    ]
    for event in events:
        sink(event)
    gated.gate.set()
    await sink.aclose()
    read = await collect(redis, "full", prefix)
    assert [e["type"] for _, e in read] == ["run_start", "tool_start", "tool_end", "run_end"]
    assert sink.dropped == 3


class CountingRedis(GatedRedis):
    """A :class:`GatedRedis` that is open from the start and counts the event writes."""

    def __init__(self, real: aioredis.Redis) -> None:
        super().__init__(real)
        self.gate.set()


async def test_one_writer_writes_the_streams_of_many_runs_in_one_call_each_in_order(
    redis: aioredis.Redis, prefix: str
) -> None:
    counting = CountingRedis(redis)
    writer = StreamWriter(counting, linger=0.05)  # type: ignore[arg-type]
    runs = [f"many{i}" for i in range(5)]
    sinks = [
        RunEventStream(counting, run_id, prefix=prefix).publisher(writer=writer)  # type: ignore[arg-type]
        for run_id in runs
    ]
    for sink, run_id in zip(sinks, runs, strict=True):
        for event in script_events(run_id, steps=2):
            sink(event)
    for _ in range(200):  # the first turn takes every run's events (they came within the linger)
        if counting.writes:
            break
        await asyncio.sleep(0.005)
    for sink in sinks:
        await sink.aclose()
    assert counting.writes == 1
    for run_id in runs:
        read = await collect(redis, run_id, prefix)
        assert [e["type"] for _, e in read] == [e.type for e in script_events(run_id, steps=2)]
        assert all(e["run_id"] == run_id for _, e in read)
    assert await redis.ttl(stream_key(runs[0], prefix)) > 0  # the end set the expiry
    await writer.aclose()


async def test_a_stream_redis_refuses_fails_alone_and_nothing_is_written_twice(
    redis: aioredis.Redis, prefix: str
) -> None:
    writer = StreamWriter(redis, linger=0.05)
    await redis.set(stream_key("broken", prefix), "not a stream")  # XADD: WRONGTYPE
    runs = ["before", "broken", "after"]
    sinks = [RunEventStream(redis, run, prefix=prefix).publisher(writer=writer) for run in runs]
    for sink, run in zip(sinks, runs, strict=True):
        for event in script_events(run, steps=1):
            sink(event)
    for sink in sinks:
        await sink.aclose()
    expected = [e.type for e in script_events("x", steps=1)]
    for sink, run in zip(sinks, runs, strict=True):
        if run == "broken":
            assert sink.dropped == len(expected)
            assert await redis.get(stream_key(run, prefix)) == b"not a stream"
        else:
            assert sink.dropped == 0
            assert [e["type"] for _, e in await collect(redis, run, prefix)] == expected
    await writer.aclose()


async def test_text_that_is_not_unicode_is_published_escaped_beside_other_runs(
    redis: aioredis.Redis, prefix: str
) -> None:
    # a tool's output decoded with surrogateescape: one run's odd string costs nobody events
    writer = StreamWriter(redis, linger=0.05)
    odd = ToolFinished(run_id="odd", call_id="c", name="n", content="x\udcff y password: hunter22")
    sinks = {
        run: RunEventStream(redis, run, prefix=prefix).publisher(writer=writer)
        for run in ("odd", "fine")
    }
    sinks["odd"](odd)
    sinks["fine"](TurnStarted(run_id="fine", step=1))
    for sink in sinks.values():
        await sink.aclose()
    assert [sink.dropped for sink in sinks.values()] == [0, 0]
    entries = await redis.xrange(stream_key("odd", prefix))
    assert len(entries) == 1
    published = json.loads(entries[0][1][b"data"])
    assert published["content"] == f"x\udcff y password: {REDACTED}"
    (entry,) = await redis.xrange(stream_key("fine", prefix))
    assert entry[1][b"type"] == b"turn_start"
    await writer.aclose()


def test_numbers_json_cannot_hold_are_null_whichever_way_an_event_is_written() -> None:
    for note in ("plain", "password: hunter22"):  # as written, and cleaned
        event = ToolStarted(
            run_id="r", call_id="c", name="n", arguments={"x": float("inf"), "n": note}
        )
        assert json.loads(public_json(event), parse_constant=pytest.fail)["arguments"]["x"] is None


async def test_closing_a_publisher_writes_at_once_without_the_linger(
    redis: aioredis.Redis, prefix: str
) -> None:
    counting = CountingRedis(redis)
    writer = StreamWriter(counting, linger=3600.0)  # type: ignore[arg-type]
    sink = RunEventStream(counting, "quick", prefix=prefix).publisher(writer=writer)  # type: ignore[arg-type]
    for event in script_events("quick", steps=1):
        sink(event)
    async with asyncio.timeout(5):
        await sink.aclose()
    assert [e["type"] for _, e in await collect(redis, "quick", prefix)][-1] == "run_end"
    assert sink.dropped == 0
    await writer.aclose()


async def test_events_that_arrive_while_a_turn_is_written_wait_for_the_next_linger(
    redis: aioredis.Redis, prefix: str
) -> None:
    # a worker's runs publish all the time: a turn of their own for whatever arrived during
    # the last write would make every turn two round trips
    gated = GatedRedis(redis)
    writer = StreamWriter(gated, linger=3600.0)  # type: ignore[arg-type]
    first, second = (
        RunEventStream(gated, run, prefix=prefix).publisher(writer=writer)  # type: ignore[arg-type]
        for run in ("first", "second")
    )
    first(RunStarted(run_id="first"))
    closing = asyncio.ensure_future(first.aclose())  # a turn at once, stuck in Redis
    await asyncio.sleep(0.05)
    second(RunStarted(run_id="second"))  # arrives while that turn is written
    gated.gate.set()
    async with asyncio.timeout(5):
        await closing
    await asyncio.sleep(0.2)
    assert gated.writes == 1  # the second run's event waits for the linger (or its close)
    assert second.waiting == 1
    async with asyncio.timeout(5):
        await second.aclose()
    assert gated.writes == 2
    (entry,) = await redis.xrange(stream_key("second", prefix))
    assert entry[1][b"type"] == b"run_start"
    await writer.aclose()


async def test_a_turn_filled_to_the_brim_leaves_no_run_waiting(
    redis: aioredis.Redis, prefix: str
) -> None:
    # the turn's bound is reached exactly by publishers that gave all they held: the runs it
    # left out still go next, with no other event to wake the writer
    writer = StreamWriter(redis, linger=0.02)
    full = [
        RunEventStream(redis, f"brim{i}", prefix=prefix).publisher(writer=writer)
        for i in range(_TURN_MAX // _WRITE_BATCH)
    ]
    late = RunEventStream(redis, "late", prefix=prefix).publisher(writer=writer)
    for i, sink in enumerate(full):
        for step in range(_WRITE_BATCH):
            sink(TurnStarted(run_id=f"brim{i}", step=step + 1))
    late(TurnStarted(run_id="late", step=1))
    for _ in range(500):  # a turn, then the next one at once
        if await redis.exists(stream_key("late", prefix)):
            break
        await asyncio.sleep(0.01)
    assert late.waiting == 0
    for sink in [*full, late]:
        await sink.aclose()
    await writer.aclose()


def test_a_writer_and_its_publishers_share_one_redis(redis: aioredis.Redis) -> None:
    other = aioredis.Redis.from_url("redis://127.0.0.1:1/0")
    with pytest.raises(AgentError, match="writer must write on its stream's Redis"):
        RunEventStream(other, "r").publisher(writer=StreamWriter(redis))


def test_public_json_is_the_public_payload_as_text() -> None:
    message = ChatMessage(role=Role.ASSISTANT, content=[TextPart(text="The answer is 42.")])
    for event in [
        *script_events("r"),
        ModelResponded(
            run_id="r", step=1, message=message, stop_reason=StopReason.END_TURN, usage=usage()
        ),
        ToolFinished(run_id="r", call_id="c", name="n", content='{"password":"hunter2-x"}'),
        ToolStarted(run_id="r", call_id="c", name="n", arguments={"api_key": "abc", "n": 1}),
        TextDeltaEvent(run_id="r", text=f"key {CANARY_KEY} and a lone \ud800 surrogate"[:40]),
    ]:
        assert json.loads(public_json(event)) == public_payload(event)


def test_a_turn_is_written_as_each_event_alone_would_be() -> None:
    """One look at a whole turn decides what goes out as written; an event with something
    to redact is cleaned by itself and the rest of the turn still goes out as written."""
    clean = [
        *script_events("r"),
        ToolFinished(run_id="r", call_id="c", name="n", content='{"ok":true,"n":[1,2]}'),
    ]
    dirty = ToolFinished(run_id="r", call_id="d", name="n", content='{"password":"hunter2-x"}')
    for turn in (clean, [*clean, dirty], [dirty]):
        written = public_jsons(turn)
        assert written == [public_json(event) for event in turn]
        assert "hunter2" not in "".join(written)
    assert public_jsons(clean) == [event.model_dump_json() for event in clean]
    assert public_jsons([]) == []


async def test_an_unreachable_redis_loses_events_but_never_the_run() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0")
    stream = RunEventStream(client, "down")
    async with stream.publisher() as sink:
        sink.writer.retry_delays = (0.01,)
        outcome = (
            await Agent(ScriptedModel(["fine"])).run(
                "go", options=RunOptions(run_id="down", on_event=sink)
            )
        ).outcome
    assert isinstance(outcome, Completed)
    assert sink.dropped >= 3
    await client.aclose()


# --- redaction ---------------------------------------------------------------------------------


def test_ordinary_events_are_published_unchanged() -> None:
    message = ChatMessage(role=Role.ASSISTANT, content=[TextPart(text="The answer is 42.")])
    for event in [
        *script_events("r"),
        ModelResponded(
            run_id="r", step=1, message=message, stop_reason=StopReason.END_TURN, usage=usage()
        ),
        ToolFinished(run_id="r", call_id="c", name="n", content='{"tokens":3,"b":[1,"x"]}'),
    ]:
        assert public_payload(event) == event.model_dump(mode="json")


def test_secrets_in_results_text_and_json_strings_are_redacted() -> None:
    content = json.dumps({"password": CANARY_PASSWORD, "note": f"key {CANARY_KEY}", "n": 1})
    payload = public_payload(ToolFinished(run_id="r", call_id="c", name="n", content=content))
    assert json.loads(str(payload["content"])) == {
        "password": REDACTED,
        "note": f"key {REDACTED}",
        "n": 1,
    }
    text = f"logged in with password: {CANARY_PASSWORD} (api_key={CANARY_KEY})"
    payload = public_payload(ToolFinished(run_id="r", call_id="c", name="n", content=text))
    assert payload["content"] == f"logged in with password: {REDACTED} (api_key={REDACTED})"


@pytest.mark.parametrize("size", [1, 2, 3, 5, 11])
async def test_a_secret_split_over_text_deltas_is_never_published(
    redis: aioredis.Redis, prefix: str, size: int
) -> None:
    text = (
        f"Your key is {CANARY_KEY} and the password = {CANARY_PASSWORD} and the header was "
        f"Authorization: Bearer {'t0k3n' * 6} so that is all for now"
    )
    run_id = f"split{size}"
    stream = RunEventStream(redis, run_id, prefix=prefix)
    async with stream.publisher() as sink:
        sink(RunStarted(run_id=run_id))
        for i in range(0, len(text), size):
            sink(TextDeltaEvent(run_id=run_id, text=text[i : i + size]))
            await asyncio.sleep(0)  # the writer sends pieces while more arrive
        sink(end(run_id))
    read = await collect(redis, run_id, prefix)
    raw = json.dumps(read)
    assert CANARY_KEY[:12] not in raw
    assert CANARY_PASSWORD[:8] not in raw
    assert "t0k3nt0k3n" not in raw
    published = "".join(e["text"] for _, e in read if e["type"] == "text_delta")
    assert published == (
        f"Your key is {REDACTED} and the password = {REDACTED} and the header was "
        f"Authorization: {REDACTED} so that is all for now"
    )


def test_held_text_is_cut_at_word_starts_outside_any_secret() -> None:
    def published(text: str) -> str:
        out = DeltaGuard().feed(TextDeltaEvent(run_id="r", text=text))
        return "".join(e.text for e in out if isinstance(e, TextDeltaEvent))

    assert published("one two") == ""
    assert published("one two three four") == "one "
    assert published("alpha password = hunt") == "alpha "  # before the assignment
    assert published("x Bearer abcdefghijklmnop y z") == "x "
    long = "a" * 10_000
    assert 0 < len(published(long)) < len(long)


def test_held_text_keeps_the_order_of_text_and_thinking() -> None:
    guard = DeltaGuard()
    out = guard.feed(ThinkingDeltaEvent(run_id="r", text="let me think"))
    out += guard.feed(TextDeltaEvent(run_id="r", text="The answer"))
    out += guard.feed(TextDeltaEvent(run_id="r", text=" is 42 as you see"))
    out += guard.feed(TurnEnded(run_id="r", step=1))
    pieces = [(e.type, getattr(e, "text", "")) for e in out]
    assert pieces == [
        ("thinking_delta", "let me think"),
        ("text_delta", "The answer is 42 "),
        ("text_delta", "as you see"),
        ("turn_end", ""),
    ]


async def test_canary_key_and_password_in_tool_arguments_and_results_never_reach_redis(
    redis: aioredis.Redis, prefix: str
) -> None:
    def login(args: Any) -> Any:
        return {"session": "s-1", "password": CANARY_PASSWORD, "echo": f"key {CANARY_KEY}"}

    def status(args: Any) -> str:
        return f"ok; password: {CANARY_PASSWORD}; key={CANARY_KEY}"

    model = ScriptedModel(
        [
            [
                tool_call(
                    "login",
                    {
                        "user": "bob",
                        "password": CANARY_PASSWORD,
                        "hint": f"use {CANARY_KEY}",
                        "note": f"password={CANARY_PASSWORD}",
                    },
                ),
                tool_call("status", {"query": f"password: {CANARY_PASSWORD}"}),
            ],
            f"Logged in. Your key is {CANARY_KEY}, password: {CANARY_PASSWORD}",
        ]
    )
    tools = [
        FnTool("login", "logs in", {"type": "object"}, login),
        FnTool("status", "status", {"type": "object"}, status),
    ]
    seen: list[AgentEvent] = []
    stream = RunEventStream(redis, "canary", prefix=prefix)
    async with stream.publisher() as publish:

        def sink(event: AgentEvent) -> None:
            seen.append(event)
            publish(event)

        turn = await Agent(model, tools=tools).run(
            "log in", options=RunOptions(run_id="canary", on_event=sink, stream=True)
        )
    assert isinstance(turn.outcome, Completed)
    in_process = "".join(e.model_dump_json() for e in seen)
    assert CANARY_PASSWORD in in_process
    assert CANARY_KEY in in_process
    keys = [key async for key in redis.scan_iter(match=prefix + "*")]
    assert keys == [stream_key("canary", prefix).encode()]
    entries = await redis.xrange(keys[0])
    published = [fields[b"type"].decode() for _, fields in entries]
    assert [t for t in published if t != "text_delta"] == [
        e.type for e in seen if e.type != "text_delta"
    ]
    raw = b"".join(b"".join(k + v for k, v in fields.items()) for _, fields in entries)
    assert CANARY_KEY.encode() not in raw
    assert CANARY_PASSWORD.encode() not in raw
    assert CANARY_KEY[:16].encode() not in raw
    assert CANARY_PASSWORD[:10].encode() not in raw
    assert REDACTED.encode() in raw


# --- Server-Sent Events through a real uvicorn -------------------------------------------------


def events_app(redis: aioredis.Redis, prefix: str, *, keepalive: float = 0.2) -> Starlette:
    """The events route as the plugin is meant to serve it."""

    async def events(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        last = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
        follow = request.query_params.get("follow") in ("1", "true")
        if last is not None and parse_event_id(last) is None:
            return Response(status_code=400)
        events = await open_events(
            redis,
            run_id,
            ended=None,
            last_event_id=last,
            follow=follow,
            block_ms=500,
            prefix=prefix,
        )
        if events is None:
            return Response(status_code=204)
        return sse_response(events, keepalive=keepalive)

    async def expired(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        ended = end(run_id, text=f"the key was {CANARY_KEY}")
        events = await open_events(redis, run_id, ended=ended, prefix=prefix)
        assert events is not None
        return sse_response(events, retry_ms=None)

    return Starlette(
        routes=[
            Route("/runs/{run_id}/events", events),
            Route("/expired/{run_id}/events", expired),
        ]
    )


@asynccontextmanager
async def serve(app: Starlette, *, lifespan: Literal["on", "off"] = "off") -> AsyncIterator[str]:
    """``app`` served by a real uvicorn on a free port of 127.0.0.1; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", lifespan=lifespan, timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        for _ in range(500):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@dataclass
class Frame:
    id: str | None = None
    event: str | None = None
    data: str | None = None
    retry: str | None = None
    comments: list[str] = field(default_factory=list)


async def sse_frames(
    client: httpx.AsyncClient,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    on_frame: Callable[[Frame], None] | None = None,
) -> tuple[httpx.Response, list[Frame]]:
    frames: list[Frame] = []
    async with client.stream("GET", url, headers=headers) as response:
        current = Frame()
        async for line in response.aiter_lines():
            if line == "":
                frames.append(current)
                if on_frame is not None:
                    on_frame(current)
                current = Frame()
            elif line.startswith(":"):
                current.comments.append(line[1:].strip())
            else:
                name, _, value = line.partition(": ")
                setattr(current, name, value)
    return response, frames


async def test_sse_frames_keep_alives_and_last_event_id_over_uvicorn(
    redis: aioredis.Redis, prefix: str
) -> None:
    stream = RunEventStream(redis, "sse", prefix=prefix)
    events = script_events("sse", steps=2)
    async with serve(events_app(redis, prefix)) as base, httpx.AsyncClient(timeout=10) as client:

        async def run() -> None:
            await stream.publish(events[0])
            await stream.publish(events[1])
            await asyncio.sleep(0.9)  # a slow tool: keep-alives while nothing happens
            for event in events[2:]:
                await stream.publish(event)

        worker = asyncio.ensure_future(run())
        response, frames = await sse_frames(client, f"{base}/runs/sse/events")
        await worker
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert frames[0].retry == "2000"
        keepalives = [f for f in frames if f.comments == ["keep-alive"]]
        assert len(keepalives) >= 2
        data = [f for f in frames if f.data is not None]
        assert [f.event for f in data] == [e.type for e in events]
        assert [json.loads(f.data or "")["type"] for f in data] == [e.type for e in events]
        ids = [f.id for f in data]
        assert all(parse_event_id(i) == i for i in ids)

        # a reconnect with Last-Event-ID resumes right after it
        _, resumed = await sse_frames(
            client, f"{base}/runs/sse/events", headers={"last-event-id": str(ids[2])}
        )
        assert [f.id for f in resumed if f.data is not None] == ids[3:]
        # past the final end: 204, which stops an EventSource for good
        gone, _ = await sse_frames(
            client, f"{base}/runs/sse/events", headers={"last-event-id": str(ids[-1])}
        )
        assert gone.status_code == 204
        replayed, frames = await sse_frames(client, f"{base}/expired/old/events")
        assert replayed.status_code == 200
        assert [(f.id, f.event) for f in frames] == [("0-1", "run_end")]
        assert json.loads(frames[0].data or "")["summary"]["text"] == f"the key was {REDACTED}"
        bad, _ = await sse_frames(
            client, f"{base}/runs/sse/events", headers={"last-event-id": "nonsense"}
        )
        assert bad.status_code == 400


async def test_a_hundred_clients_on_one_run_all_get_every_event(
    redis: aioredis.Redis, prefix: str
) -> None:
    server_redis = aioredis.Redis.from_url(REDIS_URL, max_connections=200)
    worker_redis = aioredis.Redis.from_url(REDIS_URL)
    stream = RunEventStream(worker_redis, "crowd", prefix=prefix)
    events = script_events("crowd", steps=6)
    limits = httpx.Limits(max_connections=150, max_keepalive_connections=150)
    try:
        async with (
            serve(events_app(server_redis, prefix, keepalive=1.0)) as base,
            httpx.AsyncClient(timeout=20, limits=limits) as client,
        ):
            connected = asyncio.Semaphore(0)

            async def reader() -> list[str | None]:
                def first(frame: Frame) -> None:
                    if frame.retry is not None:
                        connected.release()

                _, frames = await sse_frames(client, f"{base}/runs/crowd/events", on_frame=first)
                return [f.id for f in frames if f.data is not None]

            readers = [asyncio.ensure_future(reader()) for _ in range(100)]
            for _ in range(100):
                await asyncio.wait_for(connected.acquire(), 10)
            async with stream.publisher() as sink:
                for event in events:
                    sink(event)
                    await asyncio.sleep(0.005)
            results = await asyncio.wait_for(asyncio.gather(*readers), 20)
        everything = [i for i, _ in await collect(redis, "crowd", prefix)]
        assert len(everything) == len(events)
        assert all(result == everything for result in results)
    finally:
        await server_redis.aclose()
        await worker_redis.aclose()


# --- cancel and steer across workers -----------------------------------------------------------

WORKER = textwrap.dedent(
    """
    import asyncio, json, sys
    import redis.asyncio as aioredis
    from agent_plugin.agent import Agent
    from agent_plugin.cancellation import CancelToken
    from agent_plugin.live import RunEventStream, watch
    from agent_plugin.options import RunOptions
    from agent_plugin.providers.scripted import ScriptedModel, tool_call
    from agent_plugin.steering import Steering
    from agent_plugin.tools import FnTool

    async def main(run_id: str, prefix: str, url: str) -> None:
        redis = aioredis.Redis.from_url(url)

        async def slow(args):
            await asyncio.sleep(3600)
            return "finished"

        model = ScriptedModel([tool_call("slow", {"minutes": 60}, id="long"), "never"])
        agent = Agent(model, tools=[FnTool("slow", "takes an hour", {"type": "object"}, slow)])
        token, steering = CancelToken(), Steering()
        stream = RunEventStream(redis, run_id, prefix=prefix)
        async with stream.publisher() as sink, watch(
            redis, run_id, token, steering, prefix=prefix, poll=30
        ):
            options = RunOptions(run_id=run_id, cancel=token, on_event=sink)
            turn = await agent.run("go", options=options)
        results = [
            p.tool_result.content for m in turn.messages for p in m.content
            if hasattr(p, "tool_result")
        ]
        print(json.dumps({"outcome": turn.outcome.model_dump(mode="json"), "results": results}))
        await redis.aclose()

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
    """
)


async def test_a_run_in_another_process_is_cancelled_mid_tool(
    redis: aioredis.Redis, prefix: str
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        WORKER,
        "far",
        prefix,
        REDIS_URL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        read: list[dict[str, Any]] = []
        async for _, event in read_events(redis, "far", prefix=prefix, block_ms=1000):
            read.append(event)
            if event["type"] == "tool_start":
                await RunControlChannel(redis, "far", prefix=prefix).request_cancel(
                    "stopped from the web"
                )
        out, err = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()
    reported = json.loads(out.decode().strip().splitlines()[-1])
    assert reported["outcome"]["status"] == "cancelled"
    assert reported["outcome"]["reason"] == "stopped from the web"
    assert "unknown" in json.loads(reported["results"][0])["error"]
    assert read[-1]["type"] == "run_end"
    assert read[-1]["summary"]["status"] == "cancelled"
    assert read[-1]["summary"]["reason"] == "stopped from the web"
    tool_end = next(e for e in read if e["type"] == "tool_end")
    assert tool_end["call_id"] == "long"
    assert tool_end["is_error"]
    assert "unknown" in tool_end["content"]


async def test_a_cancel_requested_before_the_worker_starts_is_seen_at_once(
    redis: aioredis.Redis, prefix: str
) -> None:
    await RunControlChannel(redis, "early", prefix=prefix).request_cancel("too late")
    token = CancelToken()
    model = ScriptedModel(["never"])
    async with watch(redis, "early", token, prefix=prefix, poll=30):
        assert token.cancelled
        assert token.reason == "too late"
        outcome = (await Agent(model).run("go", options=RunOptions(cancel=token))).outcome
    assert isinstance(outcome, Cancelled)
    assert outcome.reason == "too late"
    assert model.requests == []


async def test_a_steering_message_joins_before_the_next_model_call(
    redis: aioredis.Redis, prefix: str
) -> None:
    worker_redis = aioredis.Redis.from_url(REDIS_URL)
    token, steering = CancelToken(), Steering()

    async def wait_for_news(args: Any) -> str:
        for _ in range(300):
            if steering.pending:
                return "news arrived"
            await asyncio.sleep(0.01)
        return "no news"

    model = ScriptedModel([tool_call("wait", {}), "noted"])
    agent = Agent(model, tools=[FnTool("wait", "waits", {"type": "object"}, wait_for_news)])
    stream = RunEventStream(worker_redis, "steer", prefix=prefix)

    async def worker() -> Any:
        async with (
            stream.publisher() as sink,
            watch(worker_redis, "steer", token, steering, prefix=prefix, poll=30),
        ):
            return (
                await agent.run(
                    "go",
                    options=RunOptions(
                        run_id="steer", cancel=token, steering=steering, on_event=sink
                    ),
                )
            ).outcome

    task = asyncio.ensure_future(worker())
    try:
        read: list[dict[str, Any]] = []
        async for _, event in read_events(redis, "steer", prefix=prefix, block_ms=1000):
            read.append(event)
            if event["type"] == "tool_start":
                channel = RunControlChannel(redis, "steer", prefix=prefix)
                await channel.send_steering("also mention the moon")
        outcome = await asyncio.wait_for(task, 10)
    finally:
        await worker_redis.aclose()
    assert isinstance(outcome, Completed)
    assert outcome.text == "noted"
    tool_end = next(e for e in read if e["type"] == "tool_end")
    # pub/sub woke the worker, not its 30 s poll
    assert json.loads(tool_end["content"]) == "news arrived"
    steered = next(e for e in read if e["type"] == "steered")
    assert steered["messages"] == ["also mention the moon"]
    second = model.requests[1].messages
    assert second[-1].role is Role.USER
    assert second[-1].text == "also mention the moon"
    assert second[-2].role is Role.TOOL
    assert await redis.exists(f"{prefix}steer:steer") == 0  # taken, not left behind


async def test_one_watcher_carries_each_request_to_its_own_run(redis: aioredis.Redis) -> None:
    prefix = f"agent-test-live-{uuid.uuid4().hex[:8]}[*?]:"  # glob characters match themselves
    worker_redis = aioredis.Redis.from_url(REDIS_URL)
    watcher = ControlWatcher(worker_redis, prefix=prefix, poll=30)
    tokens = {name: CancelToken() for name in ("a", "b", "c")}
    steering = Steering()
    try:
        async with contextlib.AsyncExitStack() as runs:
            for name, token in tokens.items():
                await runs.enter_async_context(
                    watcher.watch(name, token, steering if name == "c" else None)
                )
            await RunControlChannel(redis, "b", prefix=prefix).request_cancel("only b")
            await RunControlChannel(redis, "c", prefix=prefix).send_steering("to c")
            await RunControlChannel(redis, "a-other", prefix=prefix).request_cancel("not a")
            await RunControlChannel(redis, "a", prefix=prefix[:-1] + "x:").request_cancel("no")
            for _ in range(200):  # pub/sub, not the 30 s poll
                if tokens["b"].cancelled and steering.pending:
                    break
                await asyncio.sleep(0.01)
            assert tokens["b"].reason == "only b"
            assert steering.drain()[0].text == "to c"
            assert not tokens["a"].cancelled
            assert not tokens["c"].cancelled
    finally:
        await watcher.aclose()
        keys = [key async for key in redis.scan_iter(match=prefix.replace("[", "[[]") + "*")]
        if keys:
            await redis.delete(*keys)
        await worker_redis.aclose()


# --- the console page ----------------------------------------------------------------------------


def test_the_console_page_escapes_what_it_is_given() -> None:
    run_id = '"><script>alert(1)</script>'
    page = console_page(run_id, prefix="/agent/")
    assert "<script>alert(1)" not in page
    assert 'data-run-id="&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"' in page
    assert 'data-prefix="/agent"' in page
    assert page.count("<script>") == 1


def test_the_console_headers_allow_exactly_the_page_script_and_style() -> None:
    page = console_page("run-1")
    policy = CONSOLE_HEADERS["content-security-policy"]
    for tag in ("script", "style"):
        inline = page.split(f"<{tag}>")[1].split(f"</{tag}>")[0]
        digest = base64.b64encode(hashlib.sha256(inline.encode()).digest()).decode()
        assert f"{tag}-src 'sha256-{digest}'" in policy
    assert "default-src 'none'" in policy
    assert "connect-src 'self'" in policy


def test_the_console_script_uses_no_html_sinks() -> None:
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in CONSOLE_SCRIPT
    assert "textContent" in CONSOLE_SCRIPT
    assert '"/events?follow=true"' in CONSOLE_SCRIPT
    assert '"/decisions"' in CONSOLE_SCRIPT


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_console_script_parses(tmp_path: Path) -> None:
    script = tmp_path / "console.js"
    script.write_text(CONSOLE_SCRIPT)
    result = subprocess.run(
        ["node", "--check", str(script)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


FAKE_BROWSER = r"""
const vm = require("vm");
const fs = require("fs");
const assert = require("assert");

class Text {
  constructor(text) { this.data = text; }
  appendData(text) { this.data += text; }
  get textContent() { return this.data; }
}
class El {
  constructor(tag) {
    this.tagName = tag.toUpperCase(); this.children = []; this.dataset = {}; this.className = "";
    this.hidden = false; this.disabled = false; this.listeners = {}; this.classes = new Set();
    this.classList = {add: (c) => this.classes.add(c)};
  }
  set textContent(text) { this.children = [new Text(String(text))]; }
  get textContent() { return this.children.map((c) => c.textContent).join(""); }
  append(...nodes) { for (const n of nodes) this.children.push(n); }
  replaceChildren(...nodes) { this.children = []; this.append(...nodes); }
  get lastChild() { return this.children[this.children.length - 1]; }
  addEventListener(type, fn) { (this.listeners[type] ||= []).push(fn); }
  click() { for (const fn of this.listeners.click || []) fn(); }
  scrollIntoView() {}
  querySelectorAll(selector) {
    const tags = selector.split(",").map((s) => s.trim().toUpperCase());
    const found = [];
    const walk = (node) => {
      for (const c of node.children) if (c instanceof El) {
        if (tags.includes(c.tagName)) found.push(c);
        walk(c);
      }
    };
    walk(this);
    return found;
  }
}
const ids = {};
for (const id of ["status", "log", "approvals", "outcome"]) ids[id] = new El("div");
const body = new El("body");
body.dataset = {runId: "run/1", prefix: "/agent"};
globalThis.document = {
  body,
  getElementById: (id) => ids[id],
  createElement: (tag) => new El(tag),
  createTextNode: (text) => new Text(text),
};
const sources = [];
globalThis.EventSource = class {
  static CONNECTING = 0; static OPEN = 1; static CLOSED = 2;
  constructor(url) { this.url = url; this.readyState = 1; this.listeners = {}; sources.push(this); }
  addEventListener(type, fn) { (this.listeners[type] ||= []).push(fn); }
  close() { this.readyState = 2; }
  emit(type, data) {
    for (const fn of this.listeners[type] || []) fn({data: JSON.stringify(data)});
  }
};
const posts = [];
globalThis.fetch = async (url, init) => {
  posts.push({url, init});
  return {ok: true, status: 202, statusText: "Accepted", json: async () => ({})};
};

vm.runInThisContext(fs.readFileSync(process.argv[2], "utf8"));
(async () => {
  const source = sources[0];
  assert.strictEqual(source.url, "/agent/runs/run%2F1/events?follow=true");
  source.emit("run_start", {type: "run_start", resumed: false});
  source.emit("turn_start", {type: "turn_start", step: 1});
  source.emit("model_request", {type: "model_request"});
  source.emit("text_delta", {type: "text_delta", text: "<img src=x onerror=alert(1)>Hel"});
  source.emit("text_delta", {type: "text_delta", text: "lo"});
  source.emit("model_response", {type: "model_response", message: {content: []}});
  source.emit("tool_start", {type: "tool_start", name: "delete", arguments: {id: 7}});
  const pause = {type: "run_end", summary: {status: "awaiting_approval", awaiting: [
    {call_id: "c1", name: "delete", arguments: {id: 7}, reason: "needs approval"},
    {call_id: "c2", name: "drop", arguments: {}, reason: "needs approval"}]}};
  source.emit("run_end", pause);
  assert.strictEqual(ids.status.textContent, "awaiting approval");
  assert.strictEqual(ids.approvals.hidden, false);
  assert.ok(ids.log.textContent.includes("<img src=x onerror=alert(1)>Hello"));
  const buttons = ids.approvals.querySelectorAll("button");
  assert.deepStrictEqual(
    buttons.map((b) => b.textContent), ["Approve", "Reject", "Approve", "Reject"]);
  buttons[0].click();
  assert.strictEqual(posts.length, 0);  // waits for a decision on every call
  buttons[3].click();
  await new Promise((resolve) => setTimeout(resolve, 0));
  assert.strictEqual(posts.length, 1);
  assert.strictEqual(posts[0].url, "/agent/runs/run%2F1/decisions");
  assert.strictEqual(posts[0].init.method, "POST");
  assert.deepStrictEqual(JSON.parse(posts[0].init.body), [
    {call_id: "c1", approval: {verdict: "approve"}},
    {call_id: "c2", approval: {verdict: "reject", reason: "rejected in the console"}}]);
  assert.strictEqual(ids.status.textContent, "resuming\u2026");
  assert.strictEqual(ids.approvals.hidden, true);
  assert.strictEqual(source.readyState, 1);  // still following the run
  source.emit("run_start", {type: "run_start", resumed: true});
  source.emit("tool_end", {type: "tool_end", name: "delete", content: "deleted", is_error: false});
  source.emit("run_end", {type: "run_end", summary: {status: "completed", text: "<b>done</b>"}});
  assert.strictEqual(ids.status.textContent, "completed");
  assert.strictEqual(ids.outcome.textContent, "<b>done</b>");
  assert.strictEqual(source.readyState, 2);
  console.log("ok");
})().catch((error) => { console.error(error); process.exit(1); });
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_console_script_follows_a_run_and_posts_decisions(tmp_path: Path) -> None:
    """The script against a small fake DOM in node: the browser test proper runs in CI."""
    script = tmp_path / "console.js"
    script.write_text(CONSOLE_SCRIPT)
    harness = tmp_path / "harness.js"
    harness.write_text(FAKE_BROWSER)
    result = subprocess.run(
        ["node", str(harness), str(script)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
