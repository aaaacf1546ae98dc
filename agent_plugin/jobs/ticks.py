"""Heartbeat ticks on arq's scheduler: the cron job of a heartbeat and what one tick does.

A tick only *enqueues* the check-in as a background run (origin ``heartbeat``, delivery on),
with a run id derived from the tick's arq job id, so a fleet tick that two workers enqueue is
one run. A tick is skipped while a run of the heartbeat's session is active; every tick is
counted in Redis (:meth:`~agent_plugin.jobs.queue.RunQueue.heartbeat_stats`).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any, Final

from arq.cron import CronJob, cron
from arq.typing import WorkerCoroutine
from redis.exceptions import RedisError

from agent_plugin.errors import AgentError, ErrorKind, describe
from agent_plugin.jobs.args import RunArgs, RunHandle, tick_run_id
from agent_plugin.jobs.queue import RunQueue
from agent_plugin.jobs.redis import heartbeat_key
from agent_plugin.proactive import HEARTBEAT_TASK, Heartbeat, TickResult, TickStatus, heartbeat_tick

__all__ = ["AGENT_HEARTBEAT", "heartbeat_cron", "tick"]

logger = logging.getLogger("agent_plugin.jobs")

AGENT_HEARTBEAT: Final = HEARTBEAT_TASK
"""The arq cron job name of a heartbeat tick."""

_FAILED: Final = "failed"
_TICK_TIMEOUT: Final = 60.0
"""Seconds one heartbeat tick may take (a precheck and an enqueue)."""
_TICK_KEEP_RESULT: Final = 60.0
"""Seconds arq keeps a fleet tick's result, so a worker that enqueues the same tick late finds
it done (arq's enqueue is a no-op while the job or its result exists)."""


async def tick(queue: RunQueue, state: Any, heartbeat: Heartbeat, tick_id: str) -> dict[str, Any]:
    """One heartbeat tick: skip it while the session is busy or the precheck (given
    ``state``, the worker's runtime) says no, else enqueue the check-in.

    The check-in's run id derives from ``tick_id``: the same tick enqueued twice is one run.
    A session taken under ``session_lock = "reject"`` is a busy skip too. Never raises: a
    failing precheck or an unreachable Redis or database is logged and counted as
    ``failed``. Answers the status (``started``, ``skipped_busy``, ``skipped_precheck``,
    ``failed``) and the run id.
    """
    run_id = tick_run_id(queue.options.queue_name, tick_id)

    async def start_run(
        prompt: str, session: str | None, memory_scope: str | None, read_only: bool
    ) -> RunHandle:
        args = RunArgs.checked(
            prompt,
            overrides={"session": session, "memory_scope": memory_scope, "read_only": read_only},
            deliver=True,
            origin="heartbeat",
        )
        return await queue.enqueue(run_id, args)

    try:
        result = await heartbeat_tick(heartbeat, state, start_run, is_busy=queue.session_active)
    except AgentError as error:
        if error.kind is not ErrorKind.CONFLICT:
            return await _failed(queue, error.message)
        logger.info("heartbeat tick skipped: %s", error.message)
        result = TickResult(TickStatus.SKIPPED_BUSY)
    except Exception as error:  # a database or Redis failure, a bug in a precheck
        return await _failed(queue, describe(error))
    started = result.run.run_id if isinstance(result.run, RunHandle) else None
    if started is not None:
        logger.info("heartbeat tick started run %s", started)
    await _count(queue, result.status.value, started)
    return {"status": result.status.value, "run_id": started}


async def _failed(queue: RunQueue, message: str) -> dict[str, Any]:
    logger.warning("heartbeat tick failed: %s", message)
    await _count(queue, _FAILED, None)
    return {"status": _FAILED, "error": message}


async def _count(queue: RunQueue, status: str, run_id: str | None) -> None:
    """Count the tick in the Redis hash ``heartbeat_stats`` reads (best effort)."""
    key = heartbeat_key(queue.options.key_prefix)
    try:
        redis = await queue.redis()
        async with redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(key, status, 1)
            pipe.hset(
                key,
                mapping={
                    "last_tick_at": datetime.now(UTC).isoformat(),
                    "last_status": status,
                    "last_run_id": run_id or "",
                },
            )
            await pipe.execute()
    except (AgentError, RedisError, OSError, TimeoutError) as error:
        logger.warning("heartbeat tick (%s) not counted: %s", status, error)


def heartbeat_cron(heartbeat: Heartbeat, job: WorkerCoroutine) -> CronJob:
    """The arq cron job of ``heartbeat``: ``job`` named ``agent_heartbeat`` on the heartbeat's
    schedule, unique across workers unless ``per_replica``.

    ``run_at_startup=False``: a worker that starts (after downtime too) waits for the next
    scheduled time, so ticks missed while no worker ran are not replayed (a running worker
    that stalled catches up, one tick per poll). Evaluate it in a worker whose ``timezone``
    is :meth:`Heartbeat.tzinfo <agent_plugin.proactive.Heartbeat.tzinfo>`.
    """
    return cron(
        job,
        name=AGENT_HEARTBEAT,
        unique=heartbeat.fleet,
        run_at_startup=False,
        timeout=_TICK_TIMEOUT,
        keep_result=_TICK_KEEP_RESULT if heartbeat.fleet else 0,
        max_tries=1,
        **heartbeat.cron_fields(),
    )
