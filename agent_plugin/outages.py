"""Riding out an outage of Redis or the database: try an operation again with backoff.

:func:`keep_trying` runs an operation until it succeeds, retrying while it fails with an
``unavailable`` :class:`~agent_plugin.errors.AgentError` (and while ``go_on`` allows), with a
log line per failed try, and up to a bound in seconds when one is given. The start-up wait
of apps and workers (``startup_wait_secs``) and the durable writes of a running background
run use it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from agent_plugin.errors import AgentError, ErrorKind

__all__ = ["keep_trying", "waiting_for_services"]

T = TypeVar("T")

logger = logging.getLogger("agent_plugin")


def _out_of_reach(error: BaseException) -> bool:
    return isinstance(error, AgentError) and error.kind is ErrorKind.UNAVAILABLE


async def keep_trying(
    what: str,
    operation: Callable[[], Awaitable[T]],
    *,
    bound: float | None = None,
    go_on: Callable[[], bool] | None = None,
    first_delay: float = 0.1,
    max_delay: float = 2.0,
    log: logging.Logger | None = None,
) -> T:
    """``await operation()`` until it succeeds; the same error again when it fails with
    anything but ``unavailable``, when ``go_on()`` says no, or once ``bound`` seconds have
    passed (``None``: no bound but the caller's own timeout).

    Each failed try logs a warning naming ``what``, the try and the wait before the next
    (doubling from ``first_delay`` up to ``max_delay``, with jitter)."""
    log = log or logger
    started = time.monotonic()
    delay = first_delay
    tries = 0
    while True:
        try:
            return await operation()
        except AgentError as error:
            if not _out_of_reach(error) or (go_on is not None and not go_on()):
                raise
            tries += 1
            waited = time.monotonic() - started
            pause = delay * random.uniform(0.8, 1.2)
            if bound is not None and waited + pause > bound:
                log.error(
                    "%s: gave up after %d tries in %.1f s (the bound is %g s): %s",
                    what,
                    tries,
                    waited,
                    bound,
                    error.message,
                )
                raise
            log.warning(
                "%s: try %d failed after %.1f s (%s); trying again in %.2f s",
                what,
                tries,
                waited,
                error.message,
                pause,
            )
        await asyncio.sleep(pause)
        delay = min(delay * 2, max_delay)


async def waiting_for_services(what: str, operation: Callable[[], Awaitable[T]], bound: float) -> T:
    """:func:`keep_trying` for a process's start-up: waits up to ``bound`` seconds for a
    service that is down, then fails with an ``unavailable`` error saying how long it waited
    (``startup_wait_secs``)."""
    try:
        return await keep_trying(what, operation, bound=bound, first_delay=0.2, max_delay=5.0)
    except AgentError as error:
        if not _out_of_reach(error) or bound <= 0:
            raise
        raise AgentError(
            ErrorKind.UNAVAILABLE,
            f"{error.message} (still out of reach after waiting {bound:g} s: startup_wait_secs)",
        ) from error
