"""The retries of a run's model calls, as events: each ``retry`` and then how they ended.

:class:`CallRetries` hears the wire client's retry notices for one model call at a time and
turns them into ``retry`` events; once the call is over it closes them with exactly one
``retry_succeeded`` or ``retry_exhausted`` (attempts made, seconds since the first attempt).
A call that never retried emits nothing and costs nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

from agent_plugin.errors import AgentError
from agent_plugin.events import AgentEvent, RetryExhausted, RetryScheduled, RetrySucceeded
from agent_plugin.providers.retry import RetryNotice

__all__ = ["CallRetries"]


class CallRetries:
    """The retries of the model call in flight (one at a time) of run ``run_id``."""

    __slots__ = ("emit", "first", "last", "run_id")

    def __init__(self, run_id: str, emit: Callable[[AgentEvent], None]) -> None:
        self.run_id = run_id
        self.emit = emit
        self.first = 0.0
        """Event-loop time when the retried call's first attempt began."""
        self.last: RetryNotice | None = None
        """The latest notice of the call in flight (``None``: it has not retried)."""

    def scheduled(self, notice: RetryNotice) -> None:
        """A retry of the call in flight: emit its ``retry`` event."""
        if self.last is None:
            self.first = asyncio.get_running_loop().time() - notice.elapsed
        self.last = notice
        self.emit(
            RetryScheduled(
                run_id=self.run_id,
                attempt=notice.attempt,
                max_attempts=notice.max_attempts,
                wait_seconds=notice.wait,
                error=notice.error.info(),
            )
        )

    def succeeded(self) -> None:
        """The call answered: close its retries (if it had any)."""
        last = self.last
        if last is None:
            return
        self.last = None
        self.emit(
            RetrySucceeded(
                run_id=self.run_id, attempts=last.attempt + 1, elapsed_seconds=self._elapsed()
            )
        )

    def failed(
        self,
        error: AgentError | None,
        reason: Literal["error", "cancelled", "deadline"] = "error",
    ) -> None:
        """The call ended without an answer: close its retries (if it had any).

        ``error`` is what the last attempt raised (``None`` when the run was cancelled or ran
        out of time, which may happen while waiting for the next attempt)."""
        last = self.last
        if last is None:
            return
        self.last = None
        # an attempt that failed raised after its notice's attempt; a wait cut short did not
        attempts = last.attempt + 1 if error is not None else last.attempt
        self.emit(
            RetryExhausted(
                run_id=self.run_id,
                attempts=attempts,
                elapsed_seconds=self._elapsed(),
                reason=reason,
                error=error.info() if error is not None else None,
            )
        )

    def _elapsed(self) -> float:
        return max(asyncio.get_running_loop().time() - self.first, 0.0)
