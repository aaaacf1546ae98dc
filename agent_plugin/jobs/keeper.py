"""What a running delivery holds, kept alive while it runs: arq's claim on the job and the
run's lease in the database."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix
from redis.exceptions import RedisError

from agent_plugin.cancellation import stop_task
from agent_plugin.errors import AgentError
from agent_plugin.jobs.redis import ms

__all__ = ["Keeper"]

logger = logging.getLogger("agent_plugin.jobs")


class Keeper:
    """Renews what a running job holds: arq's in-progress key of the job, and the run's lease
    in the database once the delivery has started the run.

    The two are renewed by separate tasks, so a Redis outage (whose commands a worker retries
    for about 15 s) does not let the database lease lapse, which would let another worker take
    the run over when Redis is back, and a database outage does not cost the claim in Redis.
    """

    def __init__(
        self, redis: ArqRedis, job_id: str, lease: float, run_lease: Callable[[], Awaitable[None]]
    ) -> None:
        self.redis = redis
        self.key = in_progress_key_prefix + job_id
        self.lease = lease
        self.run_lease = run_lease
        """Renews the run's lease in the database (a no-op until the delivery started it)."""
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Keeper:
        await self._renew_claim()
        self._tasks = [
            asyncio.create_task(self._every_third_of_lease(self._renew_claim), name=self.key),
            asyncio.create_task(self._every_third_of_lease(self.run_lease), name=self.key),
        ]
        return self

    async def __aexit__(self, *_exc: object) -> None:
        for task in self._tasks:
            await stop_task(task)

    async def _every_third_of_lease(self, renew: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                await renew()
            except (AgentError, TimeoutError, RedisError, OSError) as error:
                logger.warning("cannot renew the lease of %s: %s", self.key, error)

    async def _renew_claim(self) -> None:
        # SET, not PEXPIRE: a claim deleted while this delivery lives (a superseded delivery of
        # the same job ended, a Redis restart lost it) comes back, so the job stays protected
        await self.redis.set(self.key, b"1", px=ms(self.lease))
