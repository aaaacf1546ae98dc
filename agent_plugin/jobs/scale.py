"""What the queue costs in Redis when a worker runs hundreds of runs.

:func:`enqueue_job` is arq's ``enqueue_job`` (same job, keys and expiry) in one script instead of
a ``WATCH`` transaction of three round trips. :func:`read_startable_jobs` makes a worker's poll
read only the due jobs nobody runs (arq reads running ones too and checks each in a transaction
of its own, which with hundreds of runs per worker costs thousands of round trips a second).
:func:`bound_connections` gives a client a blocking pool of at most ``limit`` connections
(:class:`BoundedPool`: a command that finds one free takes it without the pool's wait).
Sizing a worker: ``docs/operations/deployment.md``."""

from __future__ import annotations

import functools
import logging
import weakref
from typing import Any, Final

from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix, job_key_prefix, result_key_prefix
from arq.jobs import serialize_job
from arq.utils import timestamp_ms
from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.connection import AbstractConnection
from redis.commands.core import AsyncScript

__all__ = ["BoundedPool", "bound_connections", "enqueue_job", "read_startable_jobs"]

logger = logging.getLogger("agent_plugin.jobs")

_ENQUEUE: Final = """
if redis.call('exists', KEYS[1], KEYS[2]) > 0 then return 0 end
redis.call('psetex', KEYS[1], ARGV[1], ARGV[2])
redis.call('zadd', KEYS[3], ARGV[3], ARGV[4])
return 1
"""
"""Put the job ``ARGV[2]`` at ``KEYS[1]`` (expiring in ``ARGV[1]`` ms) and its id ``ARGV[4]``
on the queue ``KEYS[3]`` with the score ``ARGV[3]``, unless the job or its result (``KEYS[2]``)
exists: arq's enqueue, atomic as its ``WATCH`` transaction is."""

_ENQUEUE_SCRIPTS: Final[weakref.WeakKeyDictionary[Redis, AsyncScript]] = weakref.WeakKeyDictionary()
"""The enqueue script of each client (:func:`enqueue_job`)."""

_STARTABLE: Final = """
local found = {}
local want = tonumber(ARGV[2])
local page = 500
local offset = 0
while #found < want do
  local ids = redis.call('zrangebyscore', KEYS[1], '-inf', ARGV[1], 'LIMIT', offset, page)
  if #ids == 0 then break end
  for _, id in ipairs(ids) do
    if redis.call('exists', ARGV[3] .. id) == 0 then
      found[#found + 1] = id
      if #found >= want then break end
    end
  end
  offset = offset + page
end
return found
"""
"""The due job ids of the queue ``KEYS[1]`` (score at most ``ARGV[1]``), oldest first, up to
``ARGV[2]`` of them, leaving out those with an in-progress key (prefix ``ARGV[3]``)."""


async def enqueue_job(
    redis: ArqRedis,
    function: str,
    *args: Any,
    job_id: str,
    queue_name: str,
    defer_by: float | None = None,
) -> bool:
    """Enqueue the arq job ``function(*args)`` as ``job_id`` on ``queue_name``, ``defer_by``
    seconds from now; ``False`` (nothing done) when that job, or its result, exists."""
    now = timestamp_ms()
    score = now + round(defer_by * 1000) if defer_by else now
    expires = score - now + redis.expires_extra_ms
    job = serialize_job(function, args, {}, None, now, serializer=redis.job_serializer)
    keys = [job_key_prefix + job_id, result_key_prefix + job_id, queue_name]
    script = _ENQUEUE_SCRIPTS.get(redis)
    if script is None:  # EVALSHA, loaded on first use; its digest computed once per client
        script = _ENQUEUE_SCRIPTS[redis] = redis.register_script(_ENQUEUE)
    return bool(await script(keys=keys, args=[expires, job, score, job_id]))


def read_startable_jobs(redis: ArqRedis, queue_name: str) -> None:
    """Make arq's poll of ``queue_name`` through ``redis`` read only the due jobs that no
    worker runs yet (arq still checks and claims each one it starts, as before).

    arq reads the queue with ``zrangebyscore(queue, min=-inf, start=offset, num=count,
    max=now)``, all four as keywords; exactly that read (from the head of this queue) is
    answered by the script, every other call goes to Redis unchanged (the upkeep's sweep of
    the claimed jobs passes its bounds by position, and must see the running jobs).
    """
    script = redis.register_script(_STARTABLE)
    plain = redis.zrangebyscore

    @functools.wraps(plain)
    async def zrangebyscore(name: Any, *args: Any, **kwargs: Any) -> Any:
        # arq's poll is the one call that names all four as keywords; every other read
        # (the upkeep's sweep of the claimed jobs, with positional bounds) goes to Redis
        name_text = name.decode() if isinstance(name, bytes) else name
        count = kwargs.get("num")
        reading_head = (
            name_text == queue_name
            and not args
            and set(kwargs) == {"min", "max", "start", "num"}
            and kwargs["min"] == float("-inf")
            and kwargs["start"] == 0
            and isinstance(count, int)
        )
        if not reading_head:
            return await plain(name, *args, **kwargs)
        return await script(
            keys=[queue_name], args=[str(kwargs["max"]), int(count or 0), in_progress_key_prefix]
        )

    redis.zrangebyscore = zrangebyscore  # type: ignore[method-assign]


_CAN_TAKE_AT_ONCE: Final = all(
    hasattr(BlockingConnectionPool, name)
    for name in ("can_get_connection", "get_available_connection", "ensure_connection")
)
"""Whether redis-py's pools take connections as :class:`BoundedPool` expects (redis 5.0.1 and
later): on an older one every command goes through the blocking pool's wait."""


class BoundedPool(BlockingConnectionPool):
    """redis-py's blocking pool, with a way around its wait when there is nothing to wait for.

    redis-py's pool takes every connection, and gives every one back, under a condition
    variable and a timeout (a timer scheduled and cancelled), a dozen microseconds per
    command, although a worker's commands almost always find a connection free. Here a
    command that finds one free while no other command waits takes it at once (the look and
    the take have no ``await`` between them, so no other task comes between either); while
    commands wait, every command goes through the blocking pool, and a connection given back
    wakes one of them, as before. That pool is not strictly first come, first served (a command
    asking as a connection comes back may take it before the woken one), and this fast path
    keeps it no worse: it takes nothing while anyone waits.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting = 0

    async def get_connection(self, *args: Any, **kwargs: Any) -> AbstractConnection:
        if not _CAN_TAKE_AT_ONCE or self._waiting or not self.can_get_connection():
            self._waiting += 1
            try:
                waited: AbstractConnection = await super().get_connection(*args, **kwargs)
                return waited
            finally:
                self._waiting -= 1
        connection: AbstractConnection = self.get_available_connection()  # type: ignore[no-untyped-call]
        try:
            await self.ensure_connection(connection)
        except BaseException:
            await self.release(connection)
            raise
        return connection

    async def release(self, connection: AbstractConnection) -> None:
        if not _CAN_TAKE_AT_ONCE or self._waiting:  # under the condition, waking a waiter
            await super().release(connection)
        else:
            await ConnectionPool.release(self, connection)


async def bound_connections(redis: Redis, limit: int, *, wait: int = 20) -> None:
    """Give ``redis`` a :class:`BoundedPool` of at most ``limit`` connections (the same
    connection settings), so its concurrent commands share them: a command waits up to
    ``wait`` seconds for a free one. The connections of the pool it had are closed."""
    old = redis.connection_pool
    if isinstance(old, BoundedPool) and old.max_connections == limit:
        return
    redis.connection_pool = BoundedPool(
        max_connections=limit,
        timeout=wait,
        connection_class=old.connection_class,
        **old.connection_kwargs,
    )
    await old.disconnect()
