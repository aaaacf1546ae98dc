"""What a worker's poll of the queue costs: it reads only jobs no worker runs yet, and every
Redis connection of a process comes from one bounded pool.

arq keeps a running job in the queue until it ends, and each poll of a worker with a free slot
reads the oldest due job ids (running ones first) and checks each in a Redis transaction of
its own (four round trips) before it starts the first new one. With hundreds of model-bound
runs per worker that is thousands of round trips a second spent on jobs already running, and
once the fleet runs more jobs than a poll reads (``queue_read_limit``), a poll finds no new job
at all. :func:`read_startable_jobs` makes the worker's read answer only the due jobs that
nobody runs (one script in Redis, one round trip); arq's own checks then run only for those.

:func:`bound_connections` gives a client a blocking pool of at most ``limit`` connections: a
command waits for a free connection instead of opening one more (redis-py's default pool
opens one per concurrent command, without bound).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Final

from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix
from redis.asyncio import BlockingConnectionPool, Redis

__all__ = ["bound_connections", "read_startable_jobs"]

logger = logging.getLogger("agent_plugin.jobs")

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


def read_startable_jobs(redis: ArqRedis, queue_name: str) -> None:
    """Make arq's poll of ``queue_name`` through ``redis`` read only the due jobs that no
    worker runs yet (arq still checks and claims each one it starts, as before).

    arq reads the queue with ``zrangebyscore(queue, min=-inf, start=offset, num=count,
    max=now)``; exactly that read (from the head of this queue) is answered by the script,
    every other call goes to Redis unchanged.
    """
    script = redis.register_script(_STARTABLE)
    plain = redis.zrangebyscore

    @functools.wraps(plain)
    async def zrangebyscore(name: Any, min: Any, max: Any, *args: Any, **kwargs: Any) -> Any:
        name_text = name.decode() if isinstance(name, bytes) else name
        count = kwargs.get("num")
        reading_head = (
            name_text == queue_name
            and min == float("-inf")
            and not args
            and kwargs.get("start") == 0
            and isinstance(count, int)
            and set(kwargs) <= {"start", "num"}
        )
        if not reading_head:
            return await plain(name, min, max, *args, **kwargs)
        return await script(
            keys=[queue_name], args=[str(max), int(count or 0), in_progress_key_prefix]
        )

    redis.zrangebyscore = zrangebyscore  # type: ignore[method-assign]


async def bound_connections(redis: Redis, limit: int, *, wait: int = 20) -> None:
    """Give ``redis`` a blocking pool of at most ``limit`` connections (the same connection
    settings), so its concurrent commands share them: a command waits up to ``wait``
    seconds for a free one. The connections of the pool it had are closed."""
    old = redis.connection_pool
    if isinstance(old, BlockingConnectionPool) and old.max_connections == limit:
        return
    redis.connection_pool = BlockingConnectionPool(
        max_connections=limit,
        timeout=wait,
        connection_class=old.connection_class,
        **old.connection_kwargs,
    )
    await old.disconnect()
