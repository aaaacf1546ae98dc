"""Server-Sent Events: the one encoder every event stream of the plugin goes through.

:func:`sse_response` serves ``(id, event JSON)`` pairs; the JSON it sends is always the
redacted :func:`~agent_plugin.live.public_payload` of an event, whether the pairs come from a
run's Redis stream (published redacted) or from a run in this process (:func:`local_events`,
which redacts here, holding back text that may be part of a split secret).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final

from starlette.responses import StreamingResponse

from agent_plugin.cancellation import stop_task
from agent_plugin.errors import AgentError, ErrorKind, describe
from agent_plugin.events import AgentEvent
from agent_plugin.live import DeltaGuard, public_payload
from agent_plugin.redaction import redact_message

__all__ = ["local_events", "sse_response"]

logger = logging.getLogger("agent_plugin.live")

SSE_HEADERS: Final = {"cache-control": "no-cache", "x-accel-buffering": "no"}

_DONE: Final = object()


def _frame(entry_id: str, event: Mapping[str, Any]) -> str:
    kind = str(event.get("type", "message")).replace("\n", " ").replace("\r", " ")
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"id: {entry_id}\nevent: {kind}\ndata: {data}\n\n"


def _unavailable(error: BaseException) -> bool:
    """Whether ``error`` is an outage (Redis, the network, a timeout) rather than a bug. A
    ``RedisError`` exists only once Redis's client is loaded, so runs that stay in the process
    never import it."""
    if isinstance(error, OSError | TimeoutError):
        return True
    exceptions = sys.modules.get("redis.exceptions")
    return exceptions is not None and isinstance(error, exceptions.RedisError)


def _error_frame(error: BaseException) -> str:
    if isinstance(error, AgentError):
        info = {"kind": error.kind.value, "message": redact_message(error.message)}
    elif _unavailable(error):
        info = {"kind": ErrorKind.UNAVAILABLE.value, "message": redact_message(str(error))}
    else:
        info = {"kind": ErrorKind.INTERNAL.value, "message": describe(error)}
    return f"event: error\ndata: {json.dumps(info, ensure_ascii=False)}\n\n"


async def local_events(
    events: AsyncIterator[AgentEvent | BaseException],
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """Events of a run in this process as ``(id, redacted JSON)`` pairs, numbered ``1, 2, ...``.

    Streamed text passes a :class:`~agent_plugin.live.DeltaGuard`, so a secret split across
    deltas is redacted whole. An exception in ``events`` is raised (the encoder sends it as
    one ``error`` event).
    """
    guard = DeltaGuard()
    number = 0
    async for item in events:
        if isinstance(item, BaseException):
            for held in guard.flush():
                number += 1
                yield str(number), public_payload(held)
            raise item
        for event in guard.feed(item):
            number += 1
            yield str(number), public_payload(event)
    for held in guard.flush():
        number += 1
        yield str(number), public_payload(held)


def sse_response(
    events: AsyncIterator[tuple[str, Mapping[str, Any]]],
    *,
    keepalive: float = 15.0,
    retry_ms: int | None = 2000,
    buffer: int = 16,
) -> StreamingResponse:
    """Serve ``(id, event)`` pairs as Server-Sent Events.

    Each event is ``id: <id>``, ``event: <type>``, ``data: <json>``; a ``: keep-alive``
    comment goes out whenever nothing was sent for ``keepalive`` seconds; ``retry`` tells the
    browser how soon to reconnect (``None``: not sent). At most ``buffer`` frames wait for a
    slow client (the reading then waits too: memory per connection is bounded). If reading
    fails, one ``error`` event ends the stream. Leaving (the client went away) closes
    ``events``.
    """

    async def frames() -> AsyncIterator[str]:
        queue: asyncio.Queue[object] = asyncio.Queue(maxsize=buffer)

        async def pump() -> None:
            try:
                async for entry_id, event in events:
                    await queue.put(_frame(entry_id, event))
            except Exception as error:
                if not isinstance(error, AgentError) and not _unavailable(error):
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

    return StreamingResponse(frames(), media_type="text/event-stream", headers=SSE_HEADERS)
