"""Redis for background runs: connection settings that ride out restarts, the serializer,
the plugin's own keys, and :class:`SessionLock` (one writer per session)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final, Literal, TypeVar, cast

from arq.connections import ArqRedis, RedisSettings
from arq.jobs import SerializationError, deserialize_job_raw
from redis.asyncio.retry import Retry as RedisRetry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from agent_plugin.config import mask_url
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.redaction import scrub

logger = logging.getLogger("agent_plugin.jobs")

T = TypeVar("T")

__all__ = [
    "OUTAGE_LOG_EVERY",
    "RETRIED",
    "OutageRetry",
    "SessionLock",
    "dumps",
    "heartbeat_key",
    "job_function",
    "loads",
    "lock_key",
    "ms",
    "now_ms",
    "quietly",
    "reaching_redis",
    "redis_error",
    "redis_settings",
    "session_busy",
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


_CLAIM: Final = """
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 2
end
if holder then return 0 end
redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
_RENEW: Final = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE: Final = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


class SessionLock:
    """One writer per session: a Redis key holding the id of the run that owns the session.

    ``claim`` takes a free lock or renews one the same run already holds (a retried or
    re-delivered run gets its own lock back at once); every hold expires after ``ttl``
    seconds unless renewed, so a dead worker never blocks a session for long.
    """

    def __init__(self, redis: ArqRedis, session_id: str, run_id: str, *, prefix: str) -> None:
        self.redis = redis
        self.key = lock_key(prefix, session_id)
        self.session_id = session_id
        self.run_id = run_id
        self.held = False
        self.taken = False
        """This holder took the lock when it was free (not a renewal of the same run's hold)."""

    def __repr__(self) -> str:
        return f"SessionLock(session={self.session_id!r}, run={self.run_id!r}, held={self.held})"

    async def claim(self, ttl: float) -> Literal[0, 1, 2]:
        """0: another run holds it; 1: taken now; 2: this run held it already (renewed)."""
        result = await self._eval(_CLAIM, str(ms(ttl)))
        self.held = self.held or result != 0
        self.taken = self.taken or result == 1
        return 1 if result == 1 else 2 if result == 2 else 0

    async def renew(self, ttl: float) -> bool:
        """Extend a held lock; ``False`` if the lock is no longer this run's."""
        kept = bool(await self._eval(_RENEW, str(ms(ttl))))
        self.held = kept
        return kept

    async def release(self) -> None:
        """Give the lock up (only if this run holds it)."""
        await self._eval(_RELEASE)
        self.held = False

    async def holder(self) -> str | None:
        """The run that holds the lock now, if any."""
        value = await self.redis.get(self.key)
        return value.decode() if isinstance(value, bytes) else value

    async def _eval(self, script: str, *args: str) -> int:
        reply = self.redis.eval(script, 1, self.key, self.run_id, *args)
        return int(await cast(Awaitable[Any], reply))

    async def wait(
        self,
        ttl: float,
        *,
        free: Callable[[], Awaitable[bool]] | None = None,
        poll_cap: float = 1.0,
    ) -> None:
        """Claim the lock, waiting with backoff while another run holds it.

        ``free`` is asked before a claim: while it answers ``False`` the lock is not taken even
        if nobody holds it (the run queue uses it to let a crashed run finish first). Bounded by
        the caller's time limit (the job timeout); cancellation-safe.
        """
        delay = 0.05
        while not ((free is None or await free()) and await self.claim(ttl)):
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, poll_cap)


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


def lock_key(prefix: str, session: str) -> str:
    """The key of a session's lock."""
    return f"{prefix}session-lock:{session}"


def idempotency_key(prefix: str, key: str) -> str:
    """The key that remembers what an ``Idempotency-Key`` was first used for (by its hash:
    the client's key itself is never stored)."""
    return f"{prefix}idempotency:{hashlib.sha256(key.encode('utf-8')).hexdigest()}"


def heartbeat_key(prefix: str) -> str:
    """The hash that counts the heartbeat's ticks across every worker."""
    return f"{prefix}heartbeat"


def session_busy(session: str | None) -> AgentError:
    """The error for a run refused because its session is busy (``session_lock = reject``)."""
    return AgentError(
        ErrorKind.CONFLICT,
        f"session {session!r} already has an active background run; try again when it has "
        "finished (session_lock = reject)",
    )


@asynccontextmanager
async def reaching_redis(url: str) -> AsyncIterator[None]:
    """Turn a Redis failure inside into an ``unavailable`` :class:`AgentError` naming ``url``
    (its password hidden)."""
    try:
        yield
    except (TimeoutError, RedisError, OSError) as error:
        raise redis_error(url, error) from None


async def quietly(work: Awaitable[Any]) -> None:
    """Best-effort clean-up (a lock released, a record put back): log a failure instead of
    hiding the error being handled."""
    try:
        await work
    except Exception as error:
        logger.warning("clean-up failed: %s", error)
