"""Live runs across processes: events on Redis Streams served as SSE, cancel and steer.

A worker executing a run publishes its events to one Redis Stream per run
(:class:`RunEventStream`); any web worker serves them as Server-Sent Events
(:func:`read_events` + :func:`sse_response`), from the start or from ``Last-Event-ID``. Cancel
and steering requests reach the worker that runs the run through :class:`RunControlChannel`
and :class:`ControlWatcher` (one pub/sub connection per process) or :func:`watch` (one run).
Redis keys, with the default prefix ``agent:run:``::

    agent:run:<run_id>:events    the stream; entries {type, data}; EXPIRE set at every run_end
    agent:run:<run_id>:cancel    the reason of a cancel request (with a TTL)
    agent:run:<run_id>:steer     a list of steering messages not yet taken (with a TTL)
    agent:run:<run_id>:control   the pub/sub channel that wakes the worker up

Nothing leaves the process unredacted: every string of a published event goes through the
credential patterns of :mod:`agent_plugin.redaction` [OP-35], JSON held in strings (tool
results) is redacted by field name too, ``password: value`` style assignments in text lose their
value, and a secret split across text deltas is caught before any part of it is published.

This module is an adapter (it needs ``redis`` and ``starlette``); the core never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

from pydantic import JsonValue
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException
from starlette.responses import StreamingResponse

from agent_plugin.cancellation import CancelToken, stop_task
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import AgentEvent, RunEnded, TextDeltaEvent, ThinkingDeltaEvent
from agent_plugin.redaction import ASSIGNED_SECRET, redact_deep, redact_text
from agent_plugin.steering import Steering

__all__ = [
    "DEFAULT_PREFIX",
    "ControlWatcher",
    "EventPublisher",
    "RunControlChannel",
    "RunEventStream",
    "caught_up_with_end",
    "parse_event_id",
    "public_payload",
    "read_events",
    "replay_response",
    "run_events_response",
    "sse_response",
    "stream_key",
    "watch",
]

logger = logging.getLogger("agent_plugin.live")

DEFAULT_PREFIX: Final = "agent:run:"
"""Prefix of every live-run key: ``<prefix><run_id>:events`` and so on."""

_PAUSES: Final = frozenset({"awaiting_approval", "paused"})
"""Outcome statuses after which the same run goes on later (a resume publishes more events)."""

_WRITE_BATCH: Final = 100
_WRITE_RETRIES: Final = (0.2, 0.5, 1.0, 2.0)

Delta = TextDeltaEvent | ThinkingDeltaEvent


def stream_key(run_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The Redis key of the event stream of ``run_id``."""
    return f"{prefix}{run_id}:events"


# --- redaction of what is published ---------------------------------------------------------


def public_payload(event: AgentEvent) -> dict[str, JsonValue]:
    """The JSON of ``event`` as it may leave the process [OP-35].

    Secret-named fields and credential-looking strings become ``[REDACTED]`` everywhere, tool
    results and assistant text included; JSON inside a string (a tool result) is redacted by
    field name as well; ``name: value`` assignments of secret names lose their value. A
    ``run_end`` carries its summary, never the in-process outcome.
    """
    cleaned = redact_deep(event.model_dump(mode="json"))
    assert isinstance(cleaned, dict)
    return cleaned


_WORD_BREAK: Final = re.compile(r"\s+")
_WORD: Final = re.compile(r"\S+")
_INTRODUCED_SECRET: Final = re.compile(r"(?i)\b(?:bearer|basic)\s+\S+")
_HELD_WORDS: Final = 3
_MAX_HELD: Final = 4096


class _DeltaGuard:
    """Holds back the tail of streamed text until no secret can straddle what is published.

    A key may arrive split over several deltas (``sk-an`` + ``t-api03...``); each piece alone
    matches no pattern. The guard publishes text only up to the start of its last three words
    (a secret with its introducer, ``password = value`` or ``Bearer token``, spans at most three),
    and never through the middle of a match; the rest waits for more text or for the next
    non-delta event, which flushes it.
    """

    def __init__(self) -> None:
        self._held: dict[str, Delta] = {}

    def feed(self, event: AgentEvent) -> list[AgentEvent]:
        """The events to publish for ``event``, in order (possibly none)."""
        if not isinstance(event, TextDeltaEvent | ThinkingDeltaEvent):
            return [*self.flush(), event]
        held = self._held.pop(event.type, None)
        out: list[AgentEvent] = self.flush()  # text of the other kind, ended by this one
        text = event.text if held is None else held.text + event.text
        cut = _safe_cut(text)
        if cut < len(text):
            self._held[event.type] = event.model_copy(update={"text": text[cut:]})
        if cut > 0:
            out.append(event.model_copy(update={"text": text[:cut]}))
        return out

    def flush(self) -> list[AgentEvent]:
        """Whatever is held, as deltas; the guard is empty afterwards."""
        held, self._held = list(self._held.values()), {}
        return list(held)


def _safe_cut(text: str) -> int:
    """How much of ``text`` can be published now without cutting a possible secret."""
    words = [0, *(m.end() for m in _WORD_BREAK.finditer(text) if m.end() < len(text))]
    cut = 0 if len(words) <= _HELD_WORDS else words[-_HELD_WORDS]
    moved = True
    while moved:  # moving back out of one match may land inside another
        moved = False
        for pattern in (ASSIGNED_SECRET, _INTRODUCED_SECRET, _WORD):
            for m in pattern.finditer(text):
                if m.start() < cut < m.end():
                    cut, moved = m.start(), True
    if len(text) - cut > _MAX_HELD:  # one enormous "word": publish all but a long tail
        cut = len(text) - _MAX_HELD // 2
    return cut


# --- publishing ------------------------------------------------------------------------------


def _is_pause(event: RunEnded) -> bool:
    return event.summary is not None and event.summary.status in _PAUSES


class RunEventStream:
    """The event stream of one run in Redis: ``XADD`` of redacted events, bounded and expiring.

    ``maxlen`` bounds the stream (approximately, as ``MAXLEN ~``: Redis trims whole nodes); a
    late reader of a very long run sees its most recent events. After a ``run_end`` the key
    expires in ``ttl_after_end`` seconds, or ``ttl_after_pause`` when the run paused for approval
    (its resume publishes to the same stream and removes the expiry at its ``run_start``).
    """

    def __init__(
        self,
        redis: Redis,
        run_id: str,
        *,
        maxlen: int = 1000,
        ttl_after_end: int = 3600,
        ttl_after_pause: int = 7 * 86_400,
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        if maxlen < 1:
            raise AgentError.config(f"maxlen must be at least 1, got {maxlen}")
        self.redis = redis
        self.run_id = run_id
        self.maxlen = maxlen
        self.ttl_after_end = ttl_after_end
        self.ttl_after_pause = ttl_after_pause
        self.prefix = prefix
        self.key = stream_key(run_id, prefix)
        self._guard = _DeltaGuard()

    def __repr__(self) -> str:
        return f"RunEventStream(key={self.key!r}, maxlen={self.maxlen})"

    async def publish(self, event: AgentEvent) -> list[str]:
        """Publish one event now; the ids of the entries written (held text may come first,
        a text delta may be held back and write nothing yet)."""
        return await self.write(self._guard.feed(event))

    async def write(self, events: list[AgentEvent]) -> list[str]:
        """``XADD`` ``events`` in one round trip, in order; their entry ids.

        A ``run_start`` removes a pending expiry (a resumed run), a ``run_end`` sets one.
        Events go out as given: use :meth:`publish` or :meth:`publisher`, which hold back
        text that might be part of a split secret.
        """
        if not events:
            return []
        pipe = self.redis.pipeline(transaction=False)
        adds: list[int] = []
        for event in events:
            if event.type == "run_start":
                pipe.persist(self.key)
            data = json.dumps(public_payload(event), ensure_ascii=False, separators=(",", ":"))
            adds.append(len(pipe))
            pipe.xadd(
                self.key, {"type": event.type, "data": data}, maxlen=self.maxlen, approximate=True
            )
            if isinstance(event, RunEnded):
                ttl = self.ttl_after_pause if _is_pause(event) else self.ttl_after_end
                pipe.expire(self.key, ttl)
        results = await pipe.execute()
        return [_text(results[i]) for i in adds]

    def publisher(self, *, capacity: int = 1000, flush_timeout: float = 10.0) -> EventPublisher:
        """A synchronous event sink for ``Agent(on_event=...)`` that never blocks the loop."""
        return EventPublisher(self, capacity=capacity, flush_timeout=flush_timeout)


def _is_delta(event: AgentEvent) -> bool:
    return isinstance(event, TextDeltaEvent | ThinkingDeltaEvent)


class EventPublisher:
    """Buffers a run's events and writes them to its stream from one task, in order.

    Calling it (the sink) only appends to a buffer: a slow or unreachable Redis never slows the
    run. Consecutive text (or thinking) deltas that are still waiting are merged into one. When
    ``capacity`` events wait, the oldest waiting delta is dropped to make room (the full text
    still arrives in ``model_response``); every other event is kept, ``run_end`` always. A write
    that fails is retried a few times, then dropped with a warning. ``await aclose()`` (or
    leaving ``async with``) flushes what is left.
    """

    def __init__(
        self, stream: RunEventStream, *, capacity: int = 1000, flush_timeout: float = 10.0
    ) -> None:
        if capacity < 1:
            raise AgentError.config(f"capacity must be at least 1, got {capacity}")
        self.stream = stream
        self.capacity = capacity
        self.flush_timeout = flush_timeout
        self.retry_delays: tuple[float, ...] = _WRITE_RETRIES
        """Seconds between the attempts of a write that failed; then its events are dropped."""
        self.dropped = 0
        """Events dropped so far (deltas when the buffer was full, or writes that failed)."""
        self._buffer: deque[AgentEvent] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def __repr__(self) -> str:
        return (
            f"EventPublisher(key={self.stream.key!r}, waiting={len(self._buffer)}, "
            f"dropped={self.dropped})"
        )

    @property
    def waiting(self) -> int:
        """Events buffered and not yet written."""
        return len(self._buffer)

    def __call__(self, event: AgentEvent) -> None:
        if self._closing:
            logger.warning("run %s: event %s after the publisher closed", event.run_id, event.type)
            return
        for item in self.stream._guard.feed(event):
            self._add(item)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain())
        self._wake.set()

    def _add(self, event: AgentEvent) -> None:
        buffer = self._buffer
        if isinstance(event, TextDeltaEvent | ThinkingDeltaEvent) and buffer:
            last = buffer[-1]
            if type(last) is type(event) and isinstance(last, TextDeltaEvent | ThinkingDeltaEvent):
                buffer[-1] = last.model_copy(update={"text": last.text + event.text})
                return
        if len(buffer) >= self.capacity:
            oldest = next((i for i, item in enumerate(buffer) if _is_delta(item)), None)
            if oldest is not None:
                del buffer[oldest]
                self.dropped += 1
            elif _is_delta(event):
                self.dropped += 1
                return
        buffer.append(event)

    async def _drain(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._buffer:
                count = min(len(self._buffer), _WRITE_BATCH)
                batch = [self._buffer.popleft() for _ in range(count)]
                await self._send(batch)
            if self._closing:
                return

    async def _send(self, batch: list[AgentEvent]) -> None:
        for delay in (*self.retry_delays, None):
            try:
                await self.stream.write(batch)
                return
            except Exception as error:
                if delay is None or not isinstance(error, RedisError | OSError | TimeoutError):
                    self.dropped += len(batch)
                    logger.warning(
                        "run %s: %d events not published: %s",
                        self.stream.run_id,
                        len(batch),
                        error,
                    )
                    return
                await asyncio.sleep(delay)

    async def aclose(self) -> None:
        """Publish held text and every waiting event (up to ``flush_timeout`` seconds), then
        stop."""
        if self._closing:
            return
        for item in self.stream._guard.flush():
            self._add(item)
        self._closing = True
        if self._task is None:
            if not self._buffer:
                return
            self._task = asyncio.get_running_loop().create_task(self._drain())
        self._wake.set()
        task = self._task
        try:
            async with asyncio.timeout(self.flush_timeout):
                await asyncio.shield(task)
        except TimeoutError:
            lost = len(self._buffer)
            await stop_task(task)
            self.dropped += lost
            logger.warning("run %s: %d events not published in time", self.stream.run_id, lost)

    async def __aenter__(self) -> EventPublisher:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()


# --- reading ---------------------------------------------------------------------------------

_EVENT_ID: Final = re.compile(r"^(\d{1,20})(?:-(\d{1,20}))?$")


def parse_event_id(text: str | None) -> str | None:
    """A stream entry id (``<ms>-<seq>``) from a ``Last-Event-ID``, or None if it is not one."""
    if text is None:
        return None
    m = _EVENT_ID.match(text.strip())
    if m is None:
        return None
    return f"{int(m.group(1))}-{int(m.group(2) or 0)}"


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _decode(fields: Mapping[Any, Any]) -> dict[str, Any]:
    raw = {_text(k): _text(v) for k, v in fields.items()}
    try:
        data = json.loads(raw.get("data", "{}"))
    except ValueError:
        data = None
    if not isinstance(data, dict):
        data = {"type": raw.get("type", "unknown")}
    return data


def _is_final_end(event: Mapping[str, Any]) -> bool:
    if event.get("type") != "run_end":
        return False
    summary = event.get("summary")
    return not (isinstance(summary, dict) and summary.get("status") in _PAUSES)


def _ends(event: Mapping[str, Any], follow: bool) -> bool:
    return _is_final_end(event) if follow else event.get("type") == "run_end"


def _checked_id(last_event_id: str | None) -> str:
    if last_event_id is None:
        return "0-0"
    parsed = parse_event_id(last_event_id)
    if parsed is None:
        raise AgentError.config(f"{last_event_id!r} is not a stream entry id")
    return parsed


async def caught_up_with_end(
    redis: Redis,
    run_id: str,
    last_event_id: str | None,
    *,
    prefix: str = DEFAULT_PREFIX,
    finished: bool = False,
) -> bool:
    """Whether the reader at ``last_event_id`` has seen the run's final ``run_end`` already.

    A final end is a ``run_end`` that is not a pause. A route answers such a reconnect with
    ``204 No Content``, which stops an ``EventSource`` from reconnecting. ``finished``: the
    run's record says it finished; then a reader past the stream's last entry has had the
    end :func:`read_events` sends in place of a missing one (its id is past the stream's).
    """
    if last_event_id is None:
        return False
    cursor = _checked_id(last_event_id)
    latest = await redis.xrevrange(stream_key(run_id, prefix), count=1)
    if not latest:
        return False
    entry_id, fields = latest[0]
    seen = _id_key(_text(entry_id))
    if finished and seen < _id_key(cursor):
        return True
    return seen <= _id_key(cursor) and _is_final_end(_decode(fields))


RecordedEnd = Callable[[], Awaitable[RunEnded | None]]
"""How a run ended as its record says (its ``run_end``), or None while it has not ended."""

_END_GRACE_MS: Final = 1000
"""How long a reader waits for the ``run_end`` of a run whose record says it ended (a worker
records the end first, then publishes it) before it sends one built from the record."""


async def _end_from_record(
    redis: Redis,
    key: str,
    cursor: str,
    recorded_end: RecordedEnd,
    *,
    follow: bool,
    page: int,
) -> tuple[Any, tuple[str, dict[str, Any]] | None]:
    """What a reader at ``cursor`` that waited for nothing gets once it asked the run's record:
    the ``XREAD`` reply of entries that came meanwhile, or the ``(id, end)`` to send in place of
    a ``run_end`` the stream lacks (or neither)."""
    ended = await recorded_end()
    end = None if ended is None else public_payload(ended)
    if end is None or not _ends(end, follow):
        return None, None
    # the worker records the end before it publishes it: the event may be on its way
    reply = await redis.xread({key: cursor}, count=page, block=_END_GRACE_MS)
    if reply:
        return reply, None
    end_id = await _missing_end_id(redis, key, cursor, end)
    if end_id is None:
        return None, None
    return None, (end_id, end)


async def _missing_end_id(
    redis: Redis, key: str, cursor: str, end: Mapping[str, Any]
) -> str | None:
    """The id to send ``end`` (built from the run's record) with, or None when the reader must
    not get it: the stream's last entry is that end already (a reader that reconnected after a
    pause), or the reader is not at the stream's last entry (more to read, or it is past it:
    it had the end this sends already).

    The end goes right after the stream's last entry (``0-1`` without a stream, as in
    :func:`replay_response`), where no entry of the run will ever be: entries that come later
    have later ids, and a reader that reconnects from there has seen it.
    """
    latest = await redis.xrevrange(key, count=1)
    last_id = _text(latest[0][0]) if latest else "0-0"
    if _id_key(cursor) != _id_key(last_id):
        return None
    if latest:
        last = _decode(latest[0][1])
        if last.get("type") == "run_end" and _is_final_end(last) == _is_final_end(end):
            return None
    ms, seq = _id_key(last_id)
    return f"{ms}-{seq + 1}"


async def read_events(
    redis: Redis,
    run_id: str,
    *,
    last_event_id: str | None = None,
    block_ms: int = 15_000,
    page: int = 100,
    follow: bool = False,
    prefix: str = DEFAULT_PREFIX,
    recorded_end: RecordedEnd | None = None,
    check_every: float = 15.0,
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The run's events as ``(entry id, event JSON)``, after ``last_event_id`` (exclusive).

    Replays what the stream holds, then waits (``XREAD BLOCK``, ``block_ms`` at a time) for
    more; ends after a ``run_end``. With ``follow`` it goes on through a pause for approval
    and ends after the run's final ``run_end`` only. A reader that has seen the final end
    already (see :func:`caught_up_with_end`) gets nothing. At most ``page`` entries are held at
    a time. The Redis client's socket timeout must be longer than ``block_ms``.

    A worker records a run's end before it publishes its ``run_end``, and a Redis error at that
    instant loses the event: the stream would never end. So with ``recorded_end`` (the run's
    end as its record says), a reader that waited ``check_every`` seconds for nothing asks the
    record; when the run ended there and the event has not arrived a second later either
    (``_END_GRACE_MS``), it gets the end built from the record (one past the stream's last
    entry, see :func:`_missing_end_id`) and the reading ends. The record is read only while
    nothing arrives, at most every ``check_every`` seconds.
    """
    key = stream_key(run_id, prefix)
    cursor = _checked_id(last_event_id)
    if last_event_id is not None and await caught_up_with_end(redis, run_id, cursor, prefix=prefix):
        return
    wait = block_ms
    if recorded_end is not None:
        check_ms = max(round(check_every * 1000), 1)
        wait = check_ms if block_ms <= 0 else min(block_ms, check_ms)
    loop = asyncio.get_running_loop()
    next_check = loop.time()
    while True:
        reply = await redis.xread({key: cursor}, count=page, block=wait)
        if not reply and recorded_end is not None and loop.time() >= next_check:
            next_check = loop.time() + check_every
            reply, missing = await _end_from_record(
                redis, key, cursor, recorded_end, follow=follow, page=page
            )
            if missing is not None:
                logger.info("run %s: its stream lacks its end; sent from its record", run_id)
                yield missing
                return
        for _stream, entries in reply or ():
            for entry_id, fields in entries:
                cursor = _text(entry_id)
                event = _decode(fields)
                yield cursor, event
                if _ends(event, follow):
                    return


# --- Server-Sent Events ----------------------------------------------------------------------

_SSE_HEADERS: Final = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def _frame(entry_id: str, event: Mapping[str, Any]) -> str:
    kind = str(event.get("type", "message")).replace("\n", " ").replace("\r", " ")
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"id: {entry_id}\nevent: {kind}\ndata: {data}\n\n"


def _error_frame(error: BaseException) -> str:
    if isinstance(error, AgentError):
        info = {"kind": error.kind.value, "message": error.message}
    else:
        info = {"kind": ErrorKind.UNAVAILABLE.value, "message": redact_text(str(error))}
    return f"event: error\ndata: {json.dumps(info, ensure_ascii=False)}\n\n"


_DONE: Final = object()


def sse_response(
    events: AsyncIterator[tuple[str, Mapping[str, Any]]],
    *,
    keepalive: float = 15.0,
    retry_ms: int | None = 2000,
    buffer: int = 16,
) -> StreamingResponse:
    """Serve ``(id, event)`` pairs as Server-Sent Events.

    Each event is ``id: <entry id>``, ``event: <type>``, ``data: <json>``; a ``: keep-alive``
    comment goes out whenever nothing was sent for ``keepalive`` seconds; ``retry`` tells the
    browser how soon to reconnect. At most ``buffer`` frames wait for a slow client (the reading
    then waits too: memory per connection is bounded, and the worker, which only writes to
    Redis, never waits for a client). If reading fails, one ``error`` event ends the stream.
    """

    async def frames() -> AsyncIterator[str]:
        queue: asyncio.Queue[object] = asyncio.Queue(maxsize=buffer)

        async def pump() -> None:
            try:
                async for entry_id, event in events:
                    await queue.put(_frame(entry_id, event))
            except Exception as error:
                if not isinstance(error, AgentError | RedisError | OSError | TimeoutError):
                    logger.exception("reading run events failed")
                await queue.put(error)
            else:
                await queue.put(_DONE)

        task = asyncio.ensure_future(pump())
        getter: asyncio.Future[object] | None = None
        try:
            if retry_ms is not None:
                yield f"retry: {retry_ms}\n\n"
            while True:
                if getter is None:
                    getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter}, timeout=keepalive)
                if not done:  # the same getter waits on: nothing is lost to the timeout
                    yield ": keep-alive\n\n"
                    continue
                item = getter.result()
                getter = None
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    yield _error_frame(item)
                    return
                assert isinstance(item, str)
                yield item
        finally:
            if getter is not None:
                getter.cancel()
            await stop_task(task)
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    return StreamingResponse(frames(), media_type="text/event-stream", headers=_SSE_HEADERS)


def run_events_response(
    redis: Redis,
    run_id: str,
    *,
    last_event_id: str | None = None,
    follow: bool = False,
    keepalive: float = 15.0,
    block_ms: int = 15_000,
    prefix: str = DEFAULT_PREFIX,
    recorded_end: RecordedEnd | None = None,
    check_every: float = 15.0,
) -> StreamingResponse:
    """What ``GET {prefix}/runs/{run_id}/events`` answers: the run's events as SSE.

    ``last_event_id`` is the ``Last-Event-ID`` header (or a query parameter); one that is not a
    stream entry id is a 400. Check :func:`caught_up_with_end` first to answer 204 instead.
    ``recorded_end`` and ``check_every``: an end the stream lacks comes from the run's record
    (see :func:`read_events`).
    """
    if last_event_id is not None and parse_event_id(last_event_id) is None:
        raise HTTPException(status_code=400, detail="Last-Event-ID is not an event id")
    events = read_events(
        redis,
        run_id,
        last_event_id=last_event_id,
        block_ms=block_ms,
        follow=follow,
        prefix=prefix,
        recorded_end=recorded_end,
        check_every=check_every,
    )
    return sse_response(events, keepalive=keepalive)


def replay_response(events: Sequence[AgentEvent]) -> StreamingResponse:
    """SSE of ``events`` that are not in Redis, redacted like published ones, with ids
    ``0-1``, ``0-2``, ...: for a finished run whose stream has expired, the ``run_end`` built
    from its record."""

    async def pairs() -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        for number, event in enumerate(events, start=1):
            yield f"0-{number}", public_payload(event)

    return sse_response(pairs(), retry_ms=None)


# --- cancel and steer across workers ---------------------------------------------------------


class RunControlChannel:
    """Cancel and steering requests for one run, from any process to the one running it.

    Requests are stored in Redis (so a worker that starts later still sees them) and announced
    on a pub/sub channel (so the running worker reacts at once). Keys live ``ttl`` seconds.
    """

    def __init__(
        self, redis: Redis, run_id: str, *, prefix: str = DEFAULT_PREFIX, ttl: int = 86_400
    ) -> None:
        self.redis = redis
        self.run_id = run_id
        self.ttl = ttl
        self.cancel_key = f"{prefix}{run_id}:cancel"
        self.steer_key = f"{prefix}{run_id}:steer"
        self.channel = f"{prefix}{run_id}:control"

    def __repr__(self) -> str:
        return f"RunControlChannel(run_id={self.run_id!r})"

    async def request_cancel(self, reason: str = "cancelled") -> None:
        """Ask the run to stop; it ends ``cancelled`` with ``reason`` at its next boundary."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(self.cancel_key, reason, ex=self.ttl)
        pipe.publish(self.channel, "cancel")
        await pipe.execute()

    async def send_steering(self, text: str) -> None:
        """Queue a user message that joins the run before its next model call [OP-11]."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.rpush(self.steer_key, text)
        pipe.expire(self.steer_key, self.ttl)
        pipe.publish(self.channel, "steer")
        await pipe.execute()

    async def cancel_requested(self) -> str | None:
        """The reason of a pending cancel request, if there is one."""
        value = await self.redis.get(self.cancel_key)
        return None if value is None else _text(value)

    async def take_steering(self) -> list[str]:
        """Every queued steering message, oldest first; they are gone from Redis afterwards."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.lrange(self.steer_key, 0, -1)
        pipe.delete(self.steer_key)
        taken, _ = await pipe.execute()
        return [_text(item) for item in taken]

    async def apply(self, cancel: CancelToken, steering: Steering | None) -> None:
        """Carry pending requests over to a local token and steering queue, in one round trip
        (the cancel request read, the steering messages taken)."""
        ask_cancel = not cancel.cancelled
        if not ask_cancel and steering is None:
            return
        pipe = self.redis.pipeline(transaction=True)
        if ask_cancel:
            pipe.get(self.cancel_key)
        if steering is not None:
            pipe.lrange(self.steer_key, 0, -1)
            pipe.delete(self.steer_key)
        replies = await pipe.execute()
        if ask_cancel and replies[0] is not None:
            cancel.cancel(_text(replies[0]))
        if steering is not None:
            for text in replies[-2]:
                steering.send(_text(text))


@dataclass(frozen=True, slots=True)
class _Watched:
    """One run a :class:`ControlWatcher` carries requests to."""

    channel: RunControlChannel
    cancel: CancelToken
    steering: Steering | None

    async def apply(self) -> None:
        await self.channel.apply(self.cancel, self.steering)


class ControlWatcher:
    """Cancel and steering requests for every run one process runs, over one pub/sub
    connection.

    A worker runs many runs at once: a connection, a ``SUBSCRIBE`` and an ``UNSUBSCRIBE`` per
    run would cost more than the requests they wait for (which are rare). The watcher
    subscribes once to the pattern of every run's control channel (``<prefix>*:control``),
    carries each notice to the runs of this process it names, and checks Redis for each of
    them every ``poll`` seconds anyway (a notice lost with a dropped connection is not a lost
    request). Redis trouble is logged and never ends a run. Start it (or let the first
    :meth:`watch` start it) and :meth:`aclose` it when the process stops.
    """

    def __init__(self, redis: Redis, *, prefix: str = DEFAULT_PREFIX, poll: float = 1.0) -> None:
        self.redis = redis
        self.prefix = prefix
        self.poll = poll
        self.pattern = _GLOB_SPECIAL.sub(r"\\\g<0>", prefix) + "*" + _CONTROL_SUFFIX
        self._runs: dict[str, list[_Watched]] = {}
        self._pubsub: PubSub | None = None
        self._task: asyncio.Task[None] | None = None
        self._starting = asyncio.Lock()

    def __repr__(self) -> str:
        return f"ControlWatcher(pattern={self.pattern!r}, runs={len(self._runs)})"

    async def start(self) -> None:
        """Subscribe (once) and start carrying notices; Redis errors propagate."""
        async with self._starting:
            if self._task is not None:
                return
            pubsub = self.redis.pubsub()
            try:
                await pubsub.psubscribe(self.pattern)
                # the subscription is in place before any run takes its first look
                await pubsub.get_message(timeout=_SUBSCRIBE_WAIT)
            except BaseException:
                await _close_pubsub(pubsub)
                raise
            self._pubsub = pubsub
            self._task = asyncio.ensure_future(self._listen(pubsub))

    @asynccontextmanager
    async def watch(
        self, run_id: str, cancel: CancelToken, steering: Steering | None = None
    ) -> AsyncIterator[RunControlChannel]:
        """While inside, cancel and steering requests for ``run_id`` reach ``cancel`` and
        ``steering``: what was requested before is taken first (a cancel that came before the
        worker started), then each request as its notice arrives."""
        await self.start()
        watched = _Watched(
            RunControlChannel(self.redis, run_id, prefix=self.prefix), cancel, steering
        )
        self._runs.setdefault(run_id, []).append(watched)
        try:
            await watched.apply()
            yield watched.channel
        finally:
            others = [w for w in self._runs.pop(run_id, []) if w is not watched]
            if others:
                self._runs[run_id] = others

    async def aclose(self) -> None:
        """Stop carrying notices and close the pub/sub connection."""
        task, self._task = self._task, None
        if task is not None:
            await stop_task(task)
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                await pubsub.punsubscribe(self.pattern)
            await _close_pubsub(pubsub)

    async def _listen(self, pubsub: PubSub) -> None:
        loop = asyncio.get_running_loop()
        next_check = loop.time() + self.poll
        failing = False
        while True:
            try:
                wait = max(next_check - loop.time(), 0.0)
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=wait)
                if message is not None:
                    targets = self._runs.get(self._run_of(message.get("channel")), [])
                else:
                    targets = [w for watched in self._runs.values() for w in watched]
                    next_check = loop.time() + self.poll
                for watched in targets:
                    await watched.apply()
                failing = False
            except (RedisError, OSError, TimeoutError) as error:
                if not failing:
                    logger.warning("control channels (%s): trouble: %s", self.pattern, error)
                failing = True
                await asyncio.sleep(self.poll)

    def _run_of(self, channel: object) -> str:
        name = _text(channel) if isinstance(channel, bytes | str) else ""
        if name.startswith(self.prefix) and name.endswith(_CONTROL_SUFFIX):
            return name[len(self.prefix) : -len(_CONTROL_SUFFIX)]
        return ""


_CONTROL_SUFFIX: Final = ":control"
_GLOB_SPECIAL: Final = re.compile(r"[*?\[\]\\]")
_SUBSCRIBE_WAIT: Final = 5.0


async def _close_pubsub(pubsub: PubSub) -> None:
    close: Callable[[], Awaitable[None]] = pubsub.aclose  # untyped in redis-py
    await close()


@asynccontextmanager
async def watch(
    redis: Redis,
    run_id: str,
    cancel: CancelToken,
    steering: Steering | None = None,
    *,
    prefix: str = DEFAULT_PREFIX,
    poll: float = 1.0,
) -> AsyncIterator[RunControlChannel]:
    """While inside, cancel and steering requests for ``run_id`` reach ``cancel`` and
    ``steering``: :meth:`ControlWatcher.watch` with a watcher (and a pub/sub connection) of
    its own. A process that runs many runs at once shares one :class:`ControlWatcher`.
    """
    watcher = ControlWatcher(redis, prefix=prefix, poll=poll)
    try:
        async with watcher.watch(run_id, cancel, steering) as channel:
            yield channel
    finally:
        await watcher.aclose()
