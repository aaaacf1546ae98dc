"""Redis for background runs: connection settings that ride out restarts, the serializer and
the plugin's own keys. (One run of a session at a time is the database's to say: see
:mod:`agent_plugin.storage.session_turns`.)"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final, TypeVar

from arq.connections import RedisSettings
from arq.jobs import SerializationError, deserialize_job_raw
from redis.asyncio.retry import Retry as RedisRetry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.redaction import mask_url, scrub

logger = logging.getLogger("agent_plugin.jobs")

T = TypeVar("T")

__all__ = [
    "OUTAGE_LOG_EVERY",
    "RETRIED",
    "OutageRetry",
    "dumps",
    "heartbeat_key",
    "job_function",
    "loads",
    "ms",
    "now_ms",
    "quietly",
    "reaching_redis",
    "redis_error",
    "redis_settings",
]


def dumps(value: Any) -> bytes:
    """arq's job serializer here: JSON (job payloads are run ids and small results)."""
    return json.dumps(value, separators=(",", ":"), default=str).encode()


def loads(data: bytes) -> Any:
    """arq's job deserializer here."""
    return json.loads(data)


def redis_settings(url: str, *, worker: bool, startup_wait: float = 30.0) -> RedisSettings:
    """arq's connection settings for ``url``.

    A worker rides out a Redis outage of any length (an :class:`OutageRetry`: at start-up it
    waits ``startup_wait`` seconds at most); an app gives up after a few fast tries, so a
    request fails quickly with a clear error instead. The tries cover connecting too: while
    Redis restarts, a new connection (or one found closed and opened again) is refused with a
    plain ``OSError``, which redis-py does not retry by default, and arq's worker loop dies of
    the first one it meets.
    """
    settings = RedisSettings.from_dsn(url)
    if worker:
        outage = OutageRetry(url, startup_wait=startup_wait)
        return dataclasses.replace(
            settings, retry=outage, retry_on_error=list(RETRIED), conn_retries=0
        )
    retry = RedisRetry(ExponentialBackoff(cap=0.2, base=0.05), 2)
    return dataclasses.replace(settings, retry=retry, retry_on_error=list(RETRIED), conn_retries=0)


RETRIED: Final = (RedisConnectionError, RedisTimeoutError, OSError)
RETRIED_REDIS: Final = (RedisConnectionError, RedisTimeoutError)
"""The errors a Redis command is tried again on: a lost connection, a timeout, and a refused
connection while Redis restarts (a plain ``OSError``). redis-py retries only the errors listed
in ``retry_on_error`` (a ``retry`` policy alone retries nothing), and arq's own commands (taking
a job, recording its result) must ride through a restart, or the worker process dies."""


class OutageRetry(RedisRetry):
    """How a worker's Redis commands ride out an outage: tried again with backoff (up to a
    second apart) for as long as Redis stays away, so arq's poll loop never dies of it.

    Until :meth:`ride_out` (the end of the worker's start-up) a command gives up after
    ``startup_wait`` seconds, logging each try, and the worker exits with a clear error;
    from then on it waits for good, logging the outage when it begins and every
    :data:`OUTAGE_LOG_EVERY` seconds. One object serves every connection of the pool (a copy
    is itself), so the switch reaches them all.
    """

    __slots__ = ("_riding", "startup_wait", "url")

    def __init__(self, url: str, *, startup_wait: float) -> None:
        super().__init__(ExponentialBackoff(cap=1.0, base=0.05), -1, tuple(RETRIED_REDIS))
        self.url = mask_url(url)
        self.startup_wait = startup_wait
        self._riding = False

    def __deepcopy__(self, memo: dict[int, Any]) -> OutageRetry:
        return self

    def ride_out(self) -> None:
        """Start-up is over: wait for Redis however long it is away."""
        self._riding = True

    async def call_with_retry(
        self, do: Callable[[], Awaitable[T]], fail: Callable[[RedisError], Any]
    ) -> T:
        self._backoff.reset()  # type: ignore[no-untyped-call]
        failures = 0
        started = time.monotonic()
        logged = 0.0
        while True:
            try:
                return await do()
            except self._supported_errors as error:
                failures += 1
                await fail(error)
                waited = time.monotonic() - started
                if not self._riding:
                    if waited >= self.startup_wait:
                        logger.error(
                            "cannot reach Redis at %s: gave up after %.1f s (startup_wait_secs "
                            "= %g): %s",
                            self.url,
                            waited,
                            self.startup_wait,
                            error,
                        )
                        raise
                    logger.warning(
                        "waiting for Redis at %s (try %d, %.1f s of %g): %s",
                        self.url,
                        failures,
                        waited,
                        self.startup_wait,
                        error,
                    )
                elif failures == 1 or waited - logged >= OUTAGE_LOG_EVERY:
                    logged = waited
                    logger.warning(
                        "Redis at %s is out of reach for %.0f s; the worker waits for it: %s",
                        self.url,
                        waited,
                        error,
                    )
                await asyncio.sleep(self._backoff.compute(failures))


OUTAGE_LOG_EVERY: Final = 30.0
"""Seconds between two log lines of a worker waiting for Redis to come back."""


def redis_error(url: str, error: BaseException) -> AgentError:
    password = RedisSettings.from_dsn(url).password
    detail = scrub(f"{type(error).__name__}: {error}", password)
    return AgentError(
        ErrorKind.UNAVAILABLE,
        f"cannot reach Redis at {mask_url(url)} for background runs: {detail}",
    )


def now_ms() -> int:
    return int(time.time() * 1000)


def job_function(data: bytes) -> str | None:
    """The function an arq job calls, from its stored data (None when it cannot be read)."""
    try:
        return deserialize_job_raw(data, deserializer=loads)[0]
    except SerializationError:
        return None


def ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def idempotency_key(prefix: str, key: str) -> str:
    """The key that remembers what an ``Idempotency-Key`` was first used for (by its hash:
    the client's key itself is never stored)."""
    return f"{prefix}idempotency:{hashlib.sha256(key.encode('utf-8')).hexdigest()}"


def heartbeat_key(prefix: str) -> str:
    """The hash that counts the heartbeat's ticks across every worker."""
    return f"{prefix}heartbeat"


@asynccontextmanager
async def reaching_redis(url: str) -> AsyncIterator[None]:
    """Turn a Redis failure inside into an ``unavailable`` :class:`AgentError` naming ``url``
    (its password hidden)."""
    try:
        yield
    except (TimeoutError, RedisError, OSError) as error:
        raise redis_error(url, error) from None


async def quietly(work: Awaitable[Any]) -> None:
    """Best-effort clean-up (a key deleted, a record put back): log a failure instead of
    hiding the error being handled."""
    try:
        await work
    except Exception as error:
        logger.warning("clean-up failed: %s", error)
