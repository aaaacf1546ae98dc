"""What a running delivery holds, kept alive while it runs: arq's claim on the job and the
run's lease in the database."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from agent_plugin.cancellation import stop_task
from agent_plugin.errors import AgentError
from agent_plugin.jobs.redis import ms

__all__ = ["Keeper"]

logger = logging.getLogger("agent_plugin.jobs")

Renewal = Callable[[], Awaitable[None]]


class Keeper:
    """Renews what a running job holds: arq's in-progress key of the job, and the run's lease
    in the database once the delivery has started the run.

    Each is renewed every third of the lease by a renewal of its own, started by a timer: a
    Redis outage (whose commands a worker retries for as long as it lasts) does not let the
    database lease lapse, which would let another worker take the run over when Redis is
    back, and a database outage does not cost the claim in Redis. A renewal still under way
    when the next is due is left to finish instead. (A timer costs a run nothing until it
    fires: most runs end before the first.)

    arq's claim lives as long as the job may take; the keeper cuts it to the lease as it
    enters, or, with ``claim_at_once=False``, leaves the cut to a round trip the delivery
    makes anyway (:meth:`cut_claim`, queued on the run's first look at its control channel),
    and to the first renewal for a delivery that never gets there (one waiting for its
    session's turn). Until then a claim whose worker died is one the upkeep cuts
    (:meth:`~agent_plugin.jobs.upkeep.Upkeep.release_abandoned_claims`), as it cuts one
    left between arq's claim and the keeper's.
    """

    def __init__(
        self,
        redis: ArqRedis,
        job_id: str,
        lease: float,
        run_lease: Callable[[], Awaitable[None]],
        *,
        claim_at_once: bool = True,
    ) -> None:
        self.redis = redis
        self.key = in_progress_key_prefix + job_id
        self.lease = lease
        self.run_lease = run_lease
        """Renews the run's lease in the database (a no-op until the delivery started it)."""
        self.claim_at_once = claim_at_once
        self._timers: dict[Renewal, asyncio.TimerHandle] = {}
        self._renewing: dict[Renewal, asyncio.Task[None]] = {}

    async def __aenter__(self) -> Keeper:
        if self.claim_at_once:
            await self._renew_claim()
        for renew in (self._renew_claim, self.run_lease):
            self._schedule(renew)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        timers, self._timers = self._timers, {}
        for timer in timers.values():
            timer.cancel()
        renewing, self._renewing = self._renewing, {}
        for task in renewing.values():
            await stop_task(task)

    def _schedule(self, renew: Renewal) -> None:
        loop = asyncio.get_running_loop()
        self._timers[renew] = loop.call_later(self.lease / 3, self._due, renew)

    def _due(self, renew: Renewal) -> None:
        under_way = self._renewing.get(renew)
        if under_way is None or under_way.done():
            self._renewing[renew] = asyncio.ensure_future(self._renewed(renew))
        self._schedule(renew)

    async def _renewed(self, renew: Renewal) -> None:
        try:
            await renew()
        except (AgentError, TimeoutError, RedisError, OSError) as error:
            logger.warning("cannot renew the lease of %s: %s", self.key, error)

    def cut_claim(self, pipe: Pipeline) -> None:
        """Queue the claim's cut to the lease on ``pipe``: the first renewal, riding on a
        round trip of the delivery's own (see the class)."""
        pipe.set(self.key, b"1", px=ms(self.lease))

    async def _renew_claim(self) -> None:
        # SET, not PEXPIRE: a claim deleted while this delivery lives (a superseded delivery of
        # the same job ended, a Redis restart lost it) comes back, so the job stays protected
        await self.redis.set(self.key, b"1", px=ms(self.lease))
