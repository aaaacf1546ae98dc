"""Retrying provider calls: full-jitter exponential backoff that honours ``Retry-After``.

:func:`retry_call` retries one awaitable (:func:`retry_failed` once its first attempt has
failed); :func:`retry_stream` retries a stream attempt that
failed before it produced anything, and :func:`interrupted` is the error of one that failed
after (its output was shown, so it is not retried here).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TypeVar

from agent_plugin.errors import AgentError, ErrorKind

__all__ = [
    "RetryNotice",
    "RetryPolicy",
    "interrupted",
    "parse_retry_after",
    "retry_call",
    "retry_failed",
    "retry_stream",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently a failed call is tried again.

    ``max_attempts`` counts every attempt, the first included. The wait before retry ``n``
    (0-based) is the server's ``Retry-After`` when it sent one, else a random time in
    ``[0, min(base_delay * 2**n, max_delay)]``. A ``Retry-After`` longer than
    ``max_retry_after`` is not retried at all: the error is raised at once, since asking again
    sooner than the server said would only be refused again. Only retryable kinds
    (:attr:`AgentError.retryable`) are retried, and never past the caller's deadline.
    """

    max_attempts: int = 4
    base_delay: float = 0.5
    max_delay: float = 10.0
    max_retry_after: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise AgentError.config("RetryPolicy.max_attempts must be at least 1")
        for delay in (self.base_delay, self.max_delay, self.max_retry_after):
            if not (math.isfinite(delay) and delay >= 0):
                raise AgentError.config("RetryPolicy delays must be finite and not negative")

    @classmethod
    def never(cls) -> RetryPolicy:
        """A policy that makes one attempt and never retries."""
        return cls(max_attempts=1)

    def wait_before(self, retry: int, error: AgentError) -> float | None:
        """Seconds to wait before retry ``retry`` (0-based) after ``error``.

        None when the server asked for a wait longer than ``max_retry_after``: do not retry.
        """
        retry_after = error.retry_after
        if retry_after is not None and not math.isnan(retry_after):
            return None if retry_after > self.max_retry_after else max(retry_after, 0.0)
        # 2**64 times any positive delay is past every sensible cap; bounding the exponent keeps
        # the float arithmetic from overflowing for huge attempt counts.
        ceiling = min(self.base_delay * 2.0 ** min(max(retry, 0), 64), self.max_delay)
        return random.uniform(0.0, ceiling)


@dataclass(frozen=True, slots=True)
class RetryNotice:
    """Reported before each retry: which attempt failed, how long we wait, and why.

    ``attempt`` is the 1-based number of the attempt that failed, ``wait`` the seconds slept
    before the next one, ``elapsed`` the seconds since the first attempt started. The HTTP
    status, when there was one, is ``error.status``.
    """

    attempt: int
    max_attempts: int
    wait: float
    error: AgentError
    elapsed: float = 0.0


async def retry_call(
    op: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    deadline: float | None = None,
    on_retry: Callable[[RetryNotice], None] | None = None,
) -> T:
    """Run ``op`` until it succeeds, fails for good, or retrying would pass ``deadline``.

    Only an :class:`AgentError` of a retryable kind is retried, at most until
    ``policy.max_attempts`` attempts were made; the last error is raised unchanged. When the
    server's ``Retry-After`` exceeds ``policy.max_retry_after``, or the wait before the next
    attempt would end at or after ``deadline`` (event-loop time, ``loop.time()``), the error is
    raised at once instead of sleeping. ``on_retry`` hears of each retry before its wait.
    """
    started = asyncio.get_running_loop().time()
    try:
        return await op()
    except AgentError as error:
        return await retry_failed(
            error, op, policy, started=started, deadline=deadline, on_retry=on_retry
        )


async def retry_failed(
    error: AgentError,
    op: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    started: float,
    deadline: float | None = None,
    on_retry: Callable[[RetryNotice], None] | None = None,
) -> T:
    """:func:`retry_call` for a call whose first attempt, begun at ``started`` (event-loop
    time), failed with ``error``: the caller makes the first attempt itself, so a call that
    succeeds at once (nearly every one) builds nothing for its retries."""
    retries = _Retries(policy, deadline, on_retry, started)
    while True:
        await retries.wait_or_raise(error)
        try:
            return await op()
        except AgentError as again:
            error = again


async def retry_stream(
    attempt: Callable[[], AsyncIterator[T]],
    policy: RetryPolicy,
    *,
    deadline: float | None = None,
    on_retry: Callable[[RetryNotice], None] | None = None,
) -> AsyncGenerator[T, None]:
    """The items of ``attempt()``, made again when it fails before its first item.

    An attempt that raised before yielding anything has shown nothing, so it is retried like
    :func:`retry_call` (same policy, deadline and notices). Once an item was yielded, an error
    is raised unchanged: a retry would repeat what the caller already has (see
    :func:`interrupted`). Each attempt's iterator is closed when it ends, fails or is left.
    """
    retries = _Retries(policy, deadline, on_retry, asyncio.get_running_loop().time())
    while True:
        started = False
        try:
            async with contextlib.aclosing(_closable(attempt())) as items:
                async for item in items:
                    started = True
                    yield item
            return
        except AgentError as error:
            if started:
                raise
            await retries.wait_or_raise(error)


def interrupted(error: AgentError) -> AgentError:
    """The error for a stream that broke off with ``error`` after part of it was delivered.

    Its kind is :attr:`ErrorKind.STREAM_INTERRUPTED` when ``error`` was worth retrying (the
    whole call may be made again, by the caller); any other error is returned as it is.
    """
    if not error.retryable or error.kind is ErrorKind.STREAM_INTERRUPTED:
        return error
    where = error.provider or "the provider"
    return AgentError(
        ErrorKind.STREAM_INTERRUPTED,
        f"the {where} stream broke off after part of the reply was delivered; that part was "
        f"discarded ({error})",
        provider=error.provider,
        status=error.status,
        retry_after=error.retry_after,
        body=error.body,
    )


async def _closable(items: AsyncIterator[T]) -> AsyncGenerator[T, None]:
    """``items`` as an async generator that closes ``items`` when it is closed."""
    try:
        async for item in items:
            yield item
    finally:
        close = getattr(items, "aclose", None)
        if close is not None:
            await close()


class _Retries:
    """The attempts of one call so far, and the decision after each failure."""

    def __init__(
        self,
        policy: RetryPolicy,
        deadline: float | None,
        on_retry: Callable[[RetryNotice], None] | None,
        started: float,
    ) -> None:
        self.policy = policy
        self.deadline = deadline
        self.on_retry = on_retry
        self.loop = asyncio.get_running_loop()
        self.started = started
        self.attempt = 1

    async def wait_or_raise(self, error: AgentError) -> None:
        """Sleep before the next attempt, or raise ``error`` when there is none to make."""
        policy = self.policy
        if not error.retryable or self.attempt >= policy.max_attempts:
            raise error
        wait = policy.wait_before(self.attempt - 1, error)
        now = self.loop.time()
        if wait is None or (self.deadline is not None and now + wait >= self.deadline):
            raise error
        if self.on_retry is not None:
            self.on_retry(
                RetryNotice(self.attempt, policy.max_attempts, wait, error, now - self.started)
            )
        await asyncio.sleep(wait)
        self.attempt += 1


def parse_retry_after(headers: Mapping[str, str], *, now: datetime | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms``, or ``retry-after`` (seconds or an HTTP date).

    Header names match in any case. A valid ``retry-after-ms`` wins over ``retry-after``; a
    date in the past means no wait (0.0); a value that is neither a non-negative finite number
    nor an HTTP date counts as absent (None).
    """
    lowered = {name.lower(): value for name, value in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        millis = _seconds(raw_ms)
        if millis is not None:
            return millis / 1000.0
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    seconds = _seconds(raw)
    if seconds is not None:
        return seconds
    try:
        when = parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)


def _seconds(raw: str) -> float | None:
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None
