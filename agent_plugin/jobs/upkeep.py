"""Upkeep a worker does for the whole fleet: claims of workers that died are cut to the lease,
and runs whose job vanished from Redis get it back.

arq claims a job with an in-progress key that lives as long as the job may take; a running
attempt cuts it to the lease and renews it. A worker killed between the two leaves a claim
nobody renews: :meth:`Upkeep.release_abandoned_claims` cuts it, so another worker continues
the run within the lease. A run queued or in progress in the database whose job Redis lost (a
restart without persistence, arq's one-day expiry, an app that died between recording a run
and enqueueing it) is found by :meth:`Upkeep.reconcile` and queued again under its job id.

Each tick also gives the C heap's free pages back to the system (:func:`trim_native_heap`). A
worker's live memory stays flat over thousands of runs, but glibc keeps the pages its runs freed
(what CPython's own allocator does not serve: blocks over 512 bytes, such as buffers and long
strings) in its main heap, and the worker's RSS grew by about 2 MB per 1,000 runs until it gave
them back (S8: ``docs/operations/deployment.md``).
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import time
from collections.abc import Callable
from typing import Final

from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix, job_key_prefix, result_key_prefix
from redis.exceptions import RedisError

from agent_plugin.cancellation import stop_task
from agent_plugin.errors import AgentError
from agent_plugin.jobs.options import JobOptions
from agent_plugin.jobs.queue import AGENT_RESUME, AGENT_RUN
from agent_plugin.jobs.redis import job_function, ms, now_ms
from agent_plugin.storage import SqlRunStore
from agent_plugin.storage.runs import StalledRun

__all__ = ["RECONCILE_PAGE", "SWEEP_LIMIT", "Upkeep", "trim_native_heap"]

logger = logging.getLogger("agent_plugin.jobs")

SWEEP_LIMIT: Final = 1000
"""How many due jobs from the front of the queue each sweep for abandoned claims looks at."""

RECONCILE_PAGE: Final = 500
"""How many stalled runs a reconciliation reads and checks at a time."""


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or ``None`` on a C library without it (musl, macOS)."""
    try:  # the process's own symbols, the C library's among them
        trim = ctypes.CDLL(None).malloc_trim
    except Exception:  # no such call (OSError, AttributeError; TypeError where CDLL(None) is not)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def trim_native_heap() -> bool:
    """Give the free pages of the C heap back to the system: glibc's ``malloc_trim(0)``,
    which releases free memory inside the heap too, not only at its top (half a millisecond
    for a worker's heap). ``False`` where there is no such call, or nothing was released."""
    trim = _malloc_trim()
    if trim is None:
        return False
    try:
        return bool(trim(0))
    except Exception as error:  # never the upkeep's end
        logger.warning("cannot give the C heap's free pages back: %s", error)
        return False


class Upkeep:
    """The fleet-wide upkeep one worker runs on its own arq connection (see the module)."""

    def __init__(self, redis: ArqRedis, store: SqlRunStore, options: JobOptions) -> None:
        self.redis = redis
        self.store = store
        self.options = options
        self._task: asyncio.Task[None] | None = None

    async def release_abandoned_claims(self) -> list[str]:
        """Cut arq's claim on agent jobs whose worker died before renewing it; their job ids.

        arq claims a job with an in-progress key that lives as long as the job may take (the
        job timeout, 30 minutes by default); a running delivery cuts it to the lease as it
        starts the run (with its first look at the run's control channel, or at its first
        renewal, a third of a lease in) and renews it. A worker killed between the two leaves
        a claim nobody renews, and the run would wait out the whole timeout. Such a claim is
        the only one to outlive twice the lease: cutting it to the lease frees the job for
        another worker within the lease, and a delivery just starting renews it anyway. Only
        due jobs of this queue that call ``agent_run`` or ``agent_resume`` are touched (the
        oldest 1000; claimed jobs are due and sit near the front).
        """
        lease = ms(self.options.lease)
        ids = await self.redis.zrangebyscore(
            self.options.queue_name, "-inf", now_ms(), start=0, num=SWEEP_LIMIT
        )
        if not ids:
            return []
        names = [in_progress_key_prefix + job_id.decode() for job_id in ids]
        async with self.redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.pttl(name)
            ttls = await pipe.execute()
        long_held = [name for name, ttl in zip(names, ttls, strict=True) if ttl > 2 * lease]
        released: list[str] = []
        for name in long_held:
            job_id = name.removeprefix(in_progress_key_prefix)
            data = await self.redis.get(job_key_prefix + job_id)
            if data is None or job_function(data) not in (AGENT_RUN, AGENT_RESUME):
                continue
            if await self.redis.pexpire(name, lease):
                released.append(job_id)
        if released:
            logger.warning(
                "claims of %d job(s) outlived their worker and now expire within %.0f s: %s",
                len(released),
                self.options.lease,
                ", ".join(released),
            )
        return released

    async def reconcile(self) -> list[str]:
        """Enqueue again the job of every run that should have one in Redis and has none;
        their run ids.

        A run is queued or in progress in the database while its job is gone when the app
        died between recording the run and enqueueing it, when Redis lost its data (a
        restart without persistence, a failover), or when arq dropped the job as expired
        (it waited longer than a day). Such a run would wait for good, its session blocked.
        The runs :meth:`SqlRunStore.stalled` finds (queued, due and unchanged for
        ``reconcile_every`` seconds, or in progress under a lease that ran out that long ago)
        get their job back, due at once and under the same job id, when Redis holds neither
        the job nor a claim on it. A delivery of a job that was not
        lost after all is refused by the run's lease or job id, so a reconciliation that
        races one does no harm.
        """
        restored: list[str] = []
        async for page in self.store.stalled(self.options.reconcile_every, page=RECONCILE_PAGE):
            async with self.redis.pipeline(transaction=False) as pipe:
                for run in page:
                    pipe.exists(job_key_prefix + run.job_id, in_progress_key_prefix + run.job_id)
                present = await pipe.execute()
            for run, held in zip(page, present, strict=True):
                if not held and await self._restore_job(run):
                    restored.append(run.run_id)
        if restored:
            logger.warning(
                "%d run(s) had lost their job and were queued again: %s",
                len(restored),
                ", ".join(restored),
            )
        return restored

    async def _restore_job(self, run: StalledRun) -> bool:
        """Put the run's job back on the queue (Redis holds neither the job nor a claim on it).

        arq refuses to enqueue a job id while it keeps a result for it, so a result left by an
        earlier delivery of the job (one that ended without moving the run on) goes first.
        """
        job_id = run.job_id
        await self.redis.delete(result_key_prefix + job_id)
        job = await self.redis.enqueue_job(
            AGENT_RESUME if run.resume else AGENT_RUN,
            run.run_id,
            _job_id=job_id,
            _queue_name=self.options.queue_name,
        )
        return job is not None

    def start(self, *, fleet: bool = True) -> None:
        """Until :meth:`aclose`, give the C heap's free pages back every lease and, with
        ``fleet`` (this worker does the fleet's upkeep), release abandoned claims every lease
        and reconcile every ``reconcile_every`` seconds (one worker of the fleet at a time,
        under a Redis lock)."""
        if self._task is None:
            self._task = asyncio.create_task(self._maintain(fleet), name="agent job upkeep")

    async def aclose(self) -> None:
        """Stop the upkeep."""
        task, self._task = self._task, None
        if task is not None:
            await stop_task(task)

    async def _maintain(self, fleet: bool) -> None:
        every = self.options.reconcile_every
        reconciled = time.monotonic() - every  # once at startup too
        while True:
            if fleet:
                reconciled = await self._fleet_upkeep(reconciled)
            trim_native_heap()
            await asyncio.sleep(min(self.options.lease, every))

    async def _fleet_upkeep(self, reconciled: float) -> float:
        """Release abandoned claims, and reconcile when ``reconcile_every`` has passed since
        ``reconciled``; when it last reconciled."""
        every = self.options.reconcile_every
        try:
            await self.release_abandoned_claims()
        except (TimeoutError, RedisError, OSError) as error:
            logger.warning("cannot check for abandoned job claims: %s", error)
        if time.monotonic() - reconciled >= every:
            reconciled = time.monotonic()
            try:
                key = f"{self.options.key_prefix}reconciling"
                if await self.redis.set(key, b"1", nx=True, px=ms(every)):
                    await self.reconcile()
            except (AgentError, TimeoutError, RedisError, OSError) as error:
                logger.warning("cannot check for runs whose job was lost: %s", error)
        return reconciled
