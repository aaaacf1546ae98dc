"""Cooperative cancellation of a run from outside it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["CancelToken", "RunCancelled", "stop_task", "until_cancelled"]

T = TypeVar("T")


class CancelToken:
    """Cancels a run from outside: ``token.cancel()``; the run ends ``cancelled``.

    The loop checks the token before every model request and races it against model calls
    and tool rounds. A cancelled run never records a partial assistant message, and every
    call it started gets a result, so the transcript stays valid.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._watchers: list[Callable[[], None]] = []
        self.reason = "cancelled"

    def __repr__(self) -> str:
        return f"CancelToken(cancelled={self.cancelled})"

    def cancel(self, reason: str = "cancelled") -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()
            for watcher in list(self._watchers):
                watcher()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()


class RunCancelled(Exception):
    """Raised by :func:`until_cancelled` when the token fired first."""


async def until_cancelled(awaitable: Awaitable[T], token: CancelToken | None) -> T:
    """Await ``awaitable`` unless ``token`` fires first; then cancel it and raise.

    The awaitable runs in the calling task, and the token cancels that task when it fires (as
    :func:`asyncio.timeout` does), so watching costs no task and no waiter of its own. A
    cancellation from anywhere else stays a :class:`asyncio.CancelledError`; a failure of the
    awaitable while it is being cancelled is part of the cancellation.
    """
    if token is None:
        return await awaitable
    if token.cancelled:
        if asyncio.iscoroutine(awaitable):
            awaitable.close()
        raise RunCancelled
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("until_cancelled needs a running task")
    fired = False

    def stop() -> None:
        nonlocal fired
        fired = True
        task.cancel()

    token._watchers.append(stop)
    try:
        result = await awaitable
    except asyncio.CancelledError:
        if fired and task.uncancel() == 0:  # the token's cancellation, and nobody else's
            raise RunCancelled from None
        raise
    except Exception:
        if fired and task.uncancel() == 0:
            raise RunCancelled from None
        raise
    finally:
        token._watchers.remove(stop)
    if fired:  # the awaitable finished anyway (it caught the cancellation): its result stands
        task.uncancel()
    return result


async def stop_task(task: asyncio.Task[object]) -> None:
    """Cancel a helper task and wait until it has ended (its cancellation is not raised)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
