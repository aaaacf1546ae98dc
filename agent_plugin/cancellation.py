"""Cooperative cancellation of a run from outside it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
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
        self.reason = "cancelled"

    def __repr__(self) -> str:
        return f"CancelToken(cancelled={self.cancelled})"

    def cancel(self, reason: str = "cancelled") -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()


class RunCancelled(Exception):
    """Raised by :func:`until_cancelled` when the token fired first."""


async def until_cancelled(awaitable: Awaitable[T], token: CancelToken | None) -> T:
    """Await ``awaitable`` unless ``token`` fires first; then cancel it and raise."""
    if token is None:
        return await awaitable
    if token.cancelled:
        if asyncio.iscoroutine(awaitable):
            awaitable.close()
        raise RunCancelled
    task = asyncio.ensure_future(awaitable)
    waiter = asyncio.ensure_future(token.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    if task.cancelled():
        raise RunCancelled
    return task.result()


async def stop_task(task: asyncio.Task[object]) -> None:
    """Cancel a helper task and wait until it has ended (its cancellation is not raised)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
