"""A run's events on a Redis Stream: published redacted by the worker that runs it
(:class:`RunEventStream`, :class:`EventPublisher`), read by any process from the start or after
a ``Last-Event-ID`` (:func:`open_events`), with an end built from the run's record when the
stream lost it. Keys (default prefix ``agent:run:``): ``<prefix><run_id>:events``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from pydantic import JsonValue

from agent_plugin.cancellation import stop_task
from agent_plugin.errors import AgentError
from agent_plugin.events import AgentEvent, RunEnded, TextDeltaEvent, ThinkingDeltaEvent
from agent_plugin.redaction import ASSIGNED_SECRET, redact_deep

if TYPE_CHECKING:
    from redis.asyncio import Redis

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
    """The JSON of ``event`` as it may leave the process.

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


class DeltaGuard:
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
        self._guard = DeltaGuard()

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
                from redis.exceptions import RedisError  # loaded by now: the stream writes on it

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
    :func:`open_events`), where no entry of the run will ever be: entries that come later
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


async def _replayed(events: Sequence[AgentEvent]) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """``events`` that are not in Redis, redacted like published ones, with ids ``0-1``,
    ``0-2``, ...: for a finished run whose stream has expired, its end from its record."""
    for number, event in enumerate(events, start=1):
        yield f"0-{number}", public_payload(event)


async def open_events(
    redis: Redis,
    run_id: str,
    *,
    ended: RunEnded | None,
    last_event_id: str | None = None,
    follow: bool = False,
    prefix: str = DEFAULT_PREFIX,
    recorded_end: RecordedEnd | None = None,
    block_ms: int = 15_000,
    check_every: float = 15.0,
) -> AsyncIterator[tuple[str, dict[str, Any]]] | None:
    """What a reader of the run's events gets: ``None`` when it has seen the run's end
    already (a route answers 204, which stops an ``EventSource``), else the events as
    ``(entry id, event JSON)`` pairs.

    ``ended`` is the run's final ``run_end`` as its record says (``None`` while the run has
    not finished). A finished run whose stream expired replays that end alone. Otherwise the
    events come from the stream (:func:`read_events`, with ``recorded_end`` for an end the
    stream lacks). ``last_event_id`` must be a stream entry id (a ``config`` error if not).
    """
    cursor = _checked_id(last_event_id)
    finished = ended is not None
    if await caught_up_with_end(redis, run_id, last_event_id, prefix=prefix, finished=finished):
        return None
    if ended is not None and not await redis.exists(stream_key(run_id, prefix)):
        if last_event_id is not None:
            return None
        return _replayed([ended])
    return read_events(
        redis,
        run_id,
        last_event_id=cursor if last_event_id is not None else None,
        block_ms=block_ms,
        follow=follow,
        prefix=prefix,
        recorded_end=recorded_end,
        check_every=check_every,
    )
