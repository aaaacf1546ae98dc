"""A run's events on a Redis Stream, read: by any process, from the start or after a
``Last-Event-ID`` (:func:`open_events`), with an end built from the run's record when the
stream lost it. The worker that runs it publishes them (:mod:`agent_plugin.live.publishing`).
Keys (default prefix ``agent:run:``): ``<prefix><run_id>:events``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from agent_plugin.errors import AgentError
from agent_plugin.events import AgentEvent, RunEnded
from agent_plugin.live.public import public_payload

if TYPE_CHECKING:
    from redis.asyncio import Redis

logger = logging.getLogger("agent_plugin.live")

DEFAULT_PREFIX: Final = "agent:run:"
"""Prefix of every live-run key: ``<prefix><run_id>:events`` and so on."""

PAUSES: Final = frozenset({"awaiting_approval", "paused"})
"""Outcome statuses after which the same run goes on later (a resume publishes more events)."""


def stream_key(run_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The Redis key of the event stream of ``run_id``."""
    return f"{prefix}{run_id}:events"


# --- reading ---------------------------------------------------------------------------------

_EVENT_ID: Final = re.compile(r"^(\d{1,20})(?:-(\d{1,20}))?$")


_MAX_ID_PART: Final = 2**64 - 1
"""The largest part of a stream entry id (each is an unsigned 64-bit number)."""


def parse_event_id(text: str | None) -> str | None:
    """A stream entry id (``<ms>-<seq>``) from a ``Last-Event-ID``, or None if it is not one.

    A part past what Redis holds (20 digits may be) is the largest id there is, which is the
    same place, after every entry: Redis would refuse it, and the reader would get an
    outage's error for an id that is only late."""
    if text is None:
        return None
    m = _EVENT_ID.match(text.strip())
    if m is None:
        return None
    ms, seq = int(m.group(1)), int(m.group(2) or 0)
    if ms > _MAX_ID_PART:
        return f"{_MAX_ID_PART}-{_MAX_ID_PART}"
    return f"{ms}-{min(seq, _MAX_ID_PART)}"


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
    return not (isinstance(summary, dict) and summary.get("status") in PAUSES)


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
) -> tuple[Any, tuple[str, dict[str, Any]] | None, bool]:
    """What a reader at ``cursor`` that waited for nothing gets once it asked the run's record:
    the ``XREAD`` reply of entries that came meanwhile, or the ``(id, end)`` to send in place of
    a ``run_end`` the stream lacks (or neither); and whether the reading is over: the end is
    sent, or the record says the run ended for good and nothing came after the reader's place
    within the grace (a reader past the stream's last entry would otherwise wait for ever; one
    past a pause's end waits for the resume's entries, which come after it)."""
    ended = await recorded_end()
    end = None if ended is None else public_payload(ended)
    if end is None or not _ends(end, follow):
        return None, None, False
    # the worker records the end before it publishes it: the event may be on its way
    reply = await redis.xread({key: cursor}, count=page, block=_END_GRACE_MS)
    if reply:
        return reply, None, False
    end_id = await _missing_end_id(redis, key, cursor, end)
    if end_id is None:
        return None, None, _is_final_end(end)
    return None, (end_id, end), True


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
            reply, missing, over = await _end_from_record(
                redis, key, cursor, recorded_end, follow=follow, page=page
            )
            if missing is not None:
                logger.info("run %s: its stream lacks its end; sent from its record", run_id)
                yield missing
            if over:
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
