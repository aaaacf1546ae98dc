"""Publishing a run's events to its Redis Stream: :class:`RunEventStream` (one run's stream),
:class:`EventPublisher` (the run's non-blocking sink) and :class:`StreamWriter` (one task that
writes the streams of many runs, a worker's, in one round trip per turn). Every event is
published redacted (:func:`~agent_plugin.live.public.public_jsons`)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Final

from agent_plugin.cancellation import stop_task
from agent_plugin.errors import AgentError
from agent_plugin.events import AgentEvent, RunEnded, TextDeltaEvent, ThinkingDeltaEvent
from agent_plugin.live.public import DeltaGuard, public_jsons
from agent_plugin.live.streams import DEFAULT_PREFIX, PAUSES, stream_key

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.commands.core import AsyncScript

__all__ = ["EventPublisher", "RunEventStream", "StreamWriter"]

logger = logging.getLogger("agent_plugin.live")

_WRITE_BATCH: Final = 100
"""The most events of one run a turn of the writer takes (the rest go in the next turn)."""
_TURN_MAX: Final = 1000
"""The most events a turn writes (a turn is one script call: Redis runs nothing else meanwhile)."""
_WRITE_RETRIES: Final = (0.2, 0.5, 1.0, 2.0)
LINGER: Final = 0.02
"""Seconds a writer waits after the first event of a turn for more (of any run) to join it."""


_ADD_EVENTS: Final = """
-- KEYS: event streams; ARGV[k]: what to add to KEYS[k], fields joined by the unit separator
-- (a character JSON text never holds): the stream's MAXLEN, then for each event its type,
-- its JSON and what else it does: 'p' (PERSIST first: a resumed run's start), a TTL in
-- seconds (EXPIRE after: an end), or ''. Answers, for each stream, the ids of its entries in
-- order, or the error that stopped it (a key of another type, say): the others go on.
local answers = {}
for k = 1, #KEYS do
  local key, fields, ids = KEYS[k], {}, {}
  for field in string.gmatch(ARGV[k] .. '\\31', '(.-)\\31') do
    fields[#fields + 1] = field
  end
  for i = 2, #fields, 3 do
    local also = fields[i + 2]
    if also == 'p' then redis.pcall('PERSIST', key) end
    local id = redis.pcall(
      'XADD', key, 'MAXLEN', '~', fields[1], '*', 'type', fields[i], 'data', fields[i + 1])
    if type(id) == 'table' and id.err then
      ids = id.err
      break
    end
    ids[#ids + 1] = id
    if also ~= '' and also ~= 'p' then redis.pcall('EXPIRE', key, also) end
  end
  answers[k] = ids
end
return answers
"""
"""Adds the events of many streams in one command, one argument per stream: a command per
event, or an argument per field, costs the writer microseconds each to pack."""
_SEPARATOR: Final = "\x1f"
"""The unit separator: a control character, which JSON text holds only escaped."""


def _is_pause(event: RunEnded) -> bool:
    return event.summary is not None and event.summary.status in PAUSES


def _is_delta(event: AgentEvent) -> bool:
    return isinstance(event, TextDeltaEvent | ThinkingDeltaEvent)


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
        self.guard = DeltaGuard()
        """Holds back streamed text that may be the start of a split secret (see
        :class:`~agent_plugin.live.public.DeltaGuard`)."""
        self._script: AsyncScript | None = None

    def __repr__(self) -> str:
        return f"RunEventStream(key={self.key!r}, maxlen={self.maxlen})"

    async def publish(self, event: AgentEvent) -> list[str]:
        """Publish one event now; the ids of the entries written (held text may come first,
        a text delta may be held back and write nothing yet)."""
        return await self.write(self.guard.feed(event))

    async def write(self, events: list[AgentEvent]) -> list[str]:
        """Add ``events`` to the stream in one command, in order; their entry ids.

        Events go out as given: use :meth:`publish` or :meth:`publisher`, which hold back
        text that might be part of a split secret.
        """
        if not events:
            return []
        if self._script is None:
            self._script = self.redis.register_script(_ADD_EVENTS)
        (answer,) = await self._script(
            keys=[self.key], args=[self.packed(events)], client=self.redis
        )
        if not isinstance(answer, list):
            from redis.exceptions import ResponseError

            raise ResponseError(_text(answer))
        return [_text(entry_id) for entry_id in answer]

    def packed(self, events: list[AgentEvent]) -> str:
        """What the script adds to this stream for ``events``: redacted JSON each; a
        ``run_start`` removes a pending expiry (a resumed run), a ``run_end`` sets one."""
        fields = [str(self.maxlen)]
        for event, written in zip(events, public_jsons(events), strict=True):
            also = ""
            if event.type == "run_start":
                also = "p"
            elif isinstance(event, RunEnded):
                also = str(self.ttl_after_pause if _is_pause(event) else self.ttl_after_end)
            fields += (event.type, written, also)
        return _SEPARATOR.join(fields)

    def publisher(
        self,
        *,
        capacity: int = 1000,
        flush_timeout: float = 10.0,
        writer: StreamWriter | None = None,
    ) -> EventPublisher:
        """A synchronous event sink for ``Agent(on_event=...)`` that never blocks the loop;
        ``writer``: the :class:`StreamWriter` it shares with other runs (default one of its
        own)."""
        return EventPublisher(self, capacity=capacity, flush_timeout=flush_timeout, writer=writer)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class StreamWriter:
    """Writes the event streams of many runs from one task, in order per run.

    A turn starts ``linger`` seconds after the first event that waits (at once when a
    publisher closes), takes what every waiting publisher holds (up to 100 events of each,
    1000 in all) and adds it all in one script call: a worker running many runs at once makes
    one round trip for all of them, not one per run and step. Events that arrive while a turn
    is written wait for the next linger too (what a turn's bounds left behind does not). A
    write that fails is retried a few times (:attr:`retry_delays`), then its events are
    dropped with a warning, counted by each publisher. Every publisher of a writer publishes
    on its :attr:`redis` (a single Redis or a primary: the streams of a turn are written by
    one script).
    """

    def __init__(self, redis: Redis, *, linger: float = LINGER) -> None:
        self.redis = redis
        self.linger = linger
        self.retry_delays: tuple[float, ...] = _WRITE_RETRIES
        """Seconds between the attempts of a write that failed; then its events are dropped."""
        self._waiting: dict[EventPublisher, None] = {}  # publishers with events, in order
        self._wake = asyncio.Event()  # a publisher has events
        self._now = asyncio.Event()  # the linger is over, or a publisher is closing
        self._task: asyncio.Task[None] | None = None
        self._script: AsyncScript | None = None

    def __repr__(self) -> str:
        return f"StreamWriter(waiting={len(self._waiting)})"

    def wants(self, publisher: EventPublisher, *, now: bool = False) -> None:
        """``publisher`` has events to write: write them in the next turn (``now``: at once,
        without the linger)."""
        self._waiting[publisher] = None
        if self._task is None or self._task.done():  # (a task that died is replaced)
            self._task = asyncio.get_running_loop().create_task(self._drain())
        self._wake.set()
        if now:
            self._now.set()

    def forget(self, publisher: EventPublisher) -> None:
        """Take ``publisher`` out of the next turn (it gave up on what it holds)."""
        self._waiting.pop(publisher, None)

    async def aclose(self) -> None:
        """Stop the writer's task (what its publishers still hold is not written)."""
        task, self._task = self._task, None
        if task is not None:
            await stop_task(task)

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            if self.linger > 0 and not self._now.is_set():
                timer = loop.call_later(self.linger, self._now.set)
                await self._now.wait()
                timer.cancel()
            self._wake.clear()
            self._now.clear()
            turn = self._take_turn()
            if self._waiting:  # a turn's bounds left events behind: they go next, at once
                self._wake.set()  # (the publishers left out may have nothing else to wake it)
                self._now.set()
            written = await self._send(turn)
            for (publisher, events), done in zip(turn, written, strict=True):
                publisher.taken_back(len(events), done)

    def _take_turn(self) -> list[tuple[EventPublisher, list[AgentEvent]]]:
        turn: list[tuple[EventPublisher, list[AgentEvent]]] = []
        room = _TURN_MAX
        for publisher in list(self._waiting):
            if room <= 0:
                break
            del self._waiting[publisher]
            events = publisher.take(min(_WRITE_BATCH, room))
            room -= len(events)
            turn.append((publisher, events))
        return turn

    async def _send(self, turn: list[tuple[EventPublisher, list[AgentEvent]]]) -> list[bool]:
        """Write ``turn``; whether each publisher's events were written.

        Each stream stands alone: one whose events cannot be encoded, or that Redis refuses
        (a key of another type), fails by itself. What an outage stopped (a lost connection,
        a timeout) or a passing refusal (Redis out of memory, loading, a replica during a
        failover) is tried again, for the streams not written yet. A reply lost after Redis
        added the events makes the next try add them again: events are written at least
        once.
        """
        from redis.exceptions import ConnectionError as Lost  # loaded by now: streams use it
        from redis.exceptions import TimeoutError as TimedOut

        if self._script is None:
            self._script = self.redis.register_script(_ADD_EVENTS)
        outcome: list[object] = [None] * len(turn)  # True, or why not
        pending: dict[int, tuple[str, bytes]] = {}
        for i, (publisher, events) in enumerate(turn):
            try:
                pending[i] = (publisher.stream.key, publisher.stream.packed(events).encode())
            except Exception as error:  # (public_jsons never raises; an event type might)
                outcome[i] = error
        for delay in (*self.retry_delays, None):
            if not pending:
                break
            tried = list(pending)
            try:
                answers = await self._script(
                    keys=[pending[i][0] for i in tried],
                    args=[pending[i][1] for i in tried],
                    client=self.redis,
                )
            except (Lost, TimedOut, OSError, TimeoutError) as error:
                answers = [error] * len(tried)
            except Exception as error:  # a refusal of the whole call: not tried again
                for i in tried:
                    outcome[i] = error
                break
            for i, answer in zip(tried, answers, strict=True):
                if isinstance(answer, list):
                    outcome[i] = True
                elif isinstance(answer, Exception) or _passing(answer):
                    outcome[i] = answer
                    continue  # tried again, if there is another try
                else:
                    outcome[i] = _text(answer)
                del pending[i]
            if delay is not None and pending:
                await asyncio.sleep(delay)
        written = [result is True for result in outcome]
        for (publisher, events), result in zip(turn, outcome, strict=True):
            if result is not True:
                why = _text(result) if isinstance(result, bytes) else result
                logger.warning(
                    "run %s: %d events not published: %s",
                    publisher.stream.run_id,
                    len(events),
                    why,
                )
        return written


_PASSING: Final = (b"OOM", b"READONLY", b"LOADING", b"BUSY", b"TRYAGAIN", b"MASTERDOWN")
"""Refusals that pass: the same write may succeed a moment later."""


def _passing(refusal: object) -> bool:
    text = refusal if isinstance(refusal, bytes) else str(refusal).encode()
    return text.startswith(_PASSING)


class EventPublisher:
    """Buffers a run's events and has its :class:`StreamWriter` write them, in order.

    Calling it (the sink) only appends to a buffer: a slow or unreachable Redis never slows the
    run. Consecutive text (or thinking) deltas that are still waiting are merged into one. When
    ``capacity`` events wait, the oldest waiting delta is dropped to make room (the full text
    still arrives in ``model_response``); every other event is kept, ``run_end`` always.
    ``await aclose()`` (or leaving ``async with``) flushes what is left.
    """

    def __init__(
        self,
        stream: RunEventStream,
        *,
        capacity: int = 1000,
        flush_timeout: float = 10.0,
        writer: StreamWriter | None = None,
    ) -> None:
        if capacity < 1:
            raise AgentError.config(f"capacity must be at least 1, got {capacity}")
        if writer is not None and writer.redis is not stream.redis:
            raise AgentError.config("a publisher's writer must write on its stream's Redis")
        self.stream = stream
        self.capacity = capacity
        self.flush_timeout = flush_timeout
        self.writer = writer or StreamWriter(stream.redis)
        self._own_writer = writer is None
        self.dropped = 0
        """Events dropped so far (deltas when the buffer was full, or writes that failed)."""
        self._buffer: deque[AgentEvent] = deque()
        self._in_flight = 0
        self._gave_up = False  # the writer may still hold some: they are counted already
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False

    def __repr__(self) -> str:
        return (
            f"EventPublisher(key={self.stream.key!r}, waiting={len(self._buffer)}, "
            f"dropped={self.dropped})"
        )

    @property
    def waiting(self) -> int:
        """Events buffered and not yet taken by the writer."""
        return len(self._buffer)

    def __call__(self, event: AgentEvent) -> None:
        if self._closing:
            logger.warning("run %s: event %s after the publisher closed", event.run_id, event.type)
            return
        for item in self.stream.guard.feed(event):
            self._add(item)
        if self._buffer:
            self.writer.wants(self)

    def _add(self, event: AgentEvent) -> None:
        buffer = self._buffer
        self._idle.clear()
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

    def take(self, count: int) -> list[AgentEvent]:
        """The writer takes up to ``count`` of the oldest waiting events to write."""
        taken = [self._buffer.popleft() for _ in range(min(count, len(self._buffer)))]
        self._in_flight += len(taken)
        if self._buffer:
            self.writer.wants(self)
        return taken

    def taken_back(self, count: int, written: bool) -> None:
        """The writer is done with ``count`` taken events: ``written``, or dropped."""
        if self._gave_up:
            return
        self._in_flight -= count
        if not written:
            self.dropped += count
        if not self._buffer and not self._in_flight:
            self._idle.set()

    async def aclose(self) -> None:
        """Publish held text and every waiting event (up to ``flush_timeout`` seconds), then
        stop."""
        if self._closing:
            return
        for item in self.stream.guard.flush():
            self._add(item)
        self._closing = True
        if self._buffer:
            self.writer.wants(self, now=True)
        try:
            async with asyncio.timeout(self.flush_timeout):
                await self._idle.wait()
        except TimeoutError:
            lost = len(self._buffer) + self._in_flight
            self._buffer.clear()
            self._gave_up = True
            self.writer.forget(self)
            self.dropped += lost
            logger.warning("run %s: %d events not published in time", self.stream.run_id, lost)
        finally:
            if self._own_writer:
                await self.writer.aclose()

    async def __aenter__(self) -> EventPublisher:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()
