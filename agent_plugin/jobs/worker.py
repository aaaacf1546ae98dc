"""The execution side: arq's job functions (``agent_run``, ``agent_resume``, the heartbeat's
``agent_heartbeat``) and :func:`worker_settings`, the ``WorkerSettings`` the arq CLI runs.

A worker opens its runtime with the callable it is given (the app's own plugin, so tools,
policy, model and stores are the same) and keeps it, its queue and its control watcher in
arq's context; each job reads them from there.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from arq.cron import CronJob
from arq.worker import Retry, func

from agent_plugin.config import AgentSettings
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.jobs.attempt import Attempt, Done, Superseded, Verdict
from agent_plugin.jobs.options import JobOptions
from agent_plugin.jobs.queue import AGENT_RESUME, AGENT_RUN, RunQueue
from agent_plugin.jobs.redis import OutageRetry, dumps, loads, redis_settings
from agent_plugin.jobs.scale import bound_connections, read_startable_jobs
from agent_plugin.jobs.ticks import heartbeat_cron, tick
from agent_plugin.jobs.upkeep import Upkeep
from agent_plugin.live import ControlWatcher, StreamWriter
from agent_plugin.proactive import DEFAULT_DELIVERY_TIMEOUT, Heartbeat
from agent_plugin.runtime import AgentRuntime

__all__ = [
    "OpenRuntime",
    "agent_heartbeat",
    "agent_resume",
    "agent_run",
    "runtime_of",
    "start_worker",
    "stop_worker",
    "worker_settings",
]

logger = logging.getLogger("agent_plugin.jobs")

OpenRuntime = Callable[[], Awaitable[AgentRuntime]]
"""Opens the runtime a worker runs agents with (``AgentPlugin.start``)."""

_WORKER_KEY: Final = "agent_worker"

_ARQ_MAX_TRIES: Final = 1_000_000
"""arq's own bound on the tries of an agent job: never reached, because arq drops a job past
it without calling the job, which would leave its run ``queued`` or ``in_progress`` for good.
A delivery that cannot reach Redis or the database is tried again each lease until it can;
:attr:`JobOptions.max_deliveries` bounds the deliveries that start the run."""


@dataclass(frozen=True, slots=True)
class _Worker:
    """What one worker process holds while it runs: kept in arq's context."""

    runtime: AgentRuntime
    queue: RunQueue
    watcher: ControlWatcher
    events: StreamWriter
    """Writes the event streams of every run of the worker, in one round trip per turn."""
    upkeep: Upkeep

    async def aclose(self) -> None:
        await self.upkeep.aclose()
        await self.watcher.aclose()
        await self.events.aclose()
        await self.queue.aclose()
        await self.runtime.aclose()


def _worker_of(ctx: dict[str, Any]) -> _Worker:
    worker = ctx.get(_WORKER_KEY)
    if not isinstance(worker, _Worker):
        raise AgentError(
            ErrorKind.UNAVAILABLE,
            "agent plugin is not installed in this worker: run it with the WorkerSettings "
            "from AgentPlugin.worker_settings()",
        )
    return worker


def runtime_of(ctx: dict[str, Any]) -> AgentRuntime:
    """The runtime a worker's agent jobs run with, from arq's job context: for your own jobs
    and cron jobs in the same worker. ``unavailable`` before the worker's startup ran."""
    return _worker_of(ctx).runtime


def _answer(run_id: str, verdict: Verdict) -> dict[str, Any]:
    """arq's answer to a delivery's verdict: the job's result (the run id and its status;
    never the outcome or a secret), or ``Retry``: the one place a delivery's verdict becomes
    arq's exception."""
    if isinstance(verdict, Done):
        return {"run_id": run_id, "status": str(verdict.status)}
    if isinstance(verdict, Superseded) and verdict.seconds is None:
        return {"run_id": run_id, "status": "superseded"}
    raise Retry(defer=verdict.seconds)


async def _deliver(
    ctx: dict[str, Any], run_id: str, *, resume: bool, trace: dict[str, str] | None = None
) -> dict[str, Any]:
    worker = _worker_of(ctx)
    run_id = run_id.strip()
    attempt = Attempt(
        worker.runtime,
        worker.queue,
        ctx["redis"],
        worker.watcher,
        run_id,
        events=worker.events,
        job_id=str(ctx.get("job_id", run_id)),
        resume=resume,
        trace=trace,
    )
    return _answer(run_id, await attempt.run())


async def agent_run(ctx: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The arq job of a background run: ``run_id`` names the run, whose record holds its
    arguments. Records the outcome or the typed error and answers ``{"run_id", "status"}``;
    a retryable failure is retried with backoff until the attempts are used up."""
    return await _deliver(ctx, run_id, resume=False)


async def agent_resume(
    ctx: dict[str, Any], run_id: str, trace: dict[str, str] | None = None
) -> dict[str, Any]:
    """The arq job that resumes a paused run with the decisions its record holds (``trace``:
    the resume request's trace context, which the resume's spans join).

    Errors are never retried (approved calls may act on the world); a worker that died is
    replaced, and its successor continues from the checkpoints without repeating a call.
    """
    return await _deliver(ctx, run_id, resume=True, trace=trace)


async def agent_heartbeat(ctx: dict[str, Any]) -> dict[str, Any]:
    """The arq cron job ``agent_heartbeat``: one tick of the plugin's heartbeat.

    In a worker where the plugin has not started (or that has no heartbeat) it does nothing
    but log a warning: a tick is never an error. A cron schedule with both a day and a weekday
    is given to arq as every day; the tick of a date that matches neither does nothing.
    """
    worker = ctx.get(_WORKER_KEY)
    heartbeat = worker.runtime.heartbeat if isinstance(worker, _Worker) else None
    if not isinstance(worker, _Worker) or not isinstance(heartbeat, Heartbeat):
        logger.warning(
            "agent_heartbeat: the agent plugin has not started in this worker (or has no "
            "heartbeat); the tick does nothing"
        )
        return {"status": "not_started"}
    score = ctx.get("score")
    if isinstance(score, int | float) and not heartbeat.fires_at(
        datetime.fromtimestamp(score / 1000, UTC)
    ):
        logger.debug("agent_heartbeat: %s does not fire on this date", heartbeat.description())
        return {"status": "not_scheduled"}
    tick_id = str(ctx.get("job_id") or uuid.uuid4().hex)
    ticked = await tick(worker.queue, worker.runtime, heartbeat, tick_id)
    worker.runtime.telemetry.heartbeat_ticked(str(ticked.get("status")))
    return ticked


async def start_worker(
    ctx: dict[str, Any],
    runtime: AgentRuntime,
    options: JobOptions,
    *,
    upkeep: bool = True,
    sources: str | None = None,
) -> None:
    """Make arq's context ``ctx`` (with its ``redis``) run agent jobs with ``runtime``: what
    the worker's startup does. ``upkeep``: this worker also does the fleet's upkeep (cutting
    abandoned claims, queueing lost runs again); at least one worker of a fleet must. The
    worker owns ``runtime`` from now on: :func:`stop_worker` closes it. ``sources``: where the
    settings came from, for the start-up log line."""
    if runtime.runs is None:
        await runtime.aclose()
        raise AgentError.config("background runs are off for this plugin: pass jobs=True")
    redis = ctx["redis"]
    await bound_connections(redis, options.max_redis_connections)
    read_startable_jobs(redis, options.queue_name)
    queue = RunQueue(runtime.settings, runtime.runs, options)
    queue.attach(redis)
    upkeep_task = Upkeep(redis, runtime.runs, options)
    upkeep_task.start(fleet=upkeep)  # (every worker gives its heap's free pages back)
    watcher = ControlWatcher(redis, prefix=options.live_prefix)
    ctx[_WORKER_KEY] = _Worker(runtime, queue, watcher, StreamWriter(redis), upkeep_task)
    logger.info(
        "agent worker started: %s queue=%s upkeep=%s%s",
        runtime.describe(),
        options.queue_name,
        "on" if upkeep else "off",
        f" settings={sources}" if sources else "",
    )
    if runtime.heartbeat is not None:
        logger.info("agent heartbeat: %s", runtime.heartbeat.description())


async def stop_worker(ctx: dict[str, Any]) -> None:
    """Undo :func:`start_worker`: stop the upkeep and the control watcher, close the runtime."""
    worker = ctx.pop(_WORKER_KEY, None)
    if isinstance(worker, _Worker):
        await worker.aclose()


def worker_settings(
    open_runtime: OpenRuntime,
    settings: AgentSettings,
    options: JobOptions,
    *,
    heartbeat: Heartbeat | None = None,
    sources: str | None = None,
    **overrides: Any,
) -> type[Any]:
    """arq ``WorkerSettings`` that run background runs with the runtime ``open_runtime``
    opens (``settings`` give Redis and the job timeout; ``options`` the queue and limits).

    With a ``heartbeat``, the cron job ``agent_heartbeat`` runs on its schedule and the
    worker's ``timezone`` is the heartbeat's (``cron_jobs`` given in ``overrides`` are kept
    beside it). ``overrides`` set any other arq worker setting.
    """
    timeout = options.timeout_for(settings.max_run_secs)
    # the run's own limit, then its report (bounded by the delivery limit), then a margin
    job_timeout = timeout + DEFAULT_DELIVERY_TIMEOUT + 5

    redis = redis_settings(
        settings.redis_url, worker=True, startup_wait=float(settings.startup_wait_secs)
    )

    async def on_startup(ctx: dict[str, Any]) -> None:
        runtime = await open_runtime()  # waits for the database (startup_wait_secs)
        await start_worker(ctx, runtime, options, sources=sources)
        if isinstance(redis.retry, OutageRetry):  # from now on, ride out any Redis outage
            redis.retry.ride_out()

    async def on_shutdown(ctx: dict[str, Any]) -> None:
        await stop_worker(ctx)

    functions = [
        func(agent_run, name=AGENT_RUN, timeout=job_timeout, max_tries=_ARQ_MAX_TRIES),
        func(agent_resume, name=AGENT_RESUME, timeout=job_timeout, max_tries=_ARQ_MAX_TRIES),
    ]
    cron_jobs: list[CronJob] = list(overrides.pop("cron_jobs", None) or ())
    if heartbeat is not None:
        zone = heartbeat.tzinfo()
        given = overrides.setdefault("timezone", zone)
        if given != zone:
            raise AgentError.config(
                f"the worker's timezone override {given!r} differs from the heartbeat's "
                f"({heartbeat.timezone}); arq evaluates every cron job in the worker's timezone, "
                "so leave it out (or give the heartbeat the same timezone)"
            )
        cron_jobs.insert(0, heartbeat_cron(heartbeat, agent_heartbeat))
        logger.debug("heartbeat registered: %s", heartbeat.description())
    attributes: dict[str, Any] = {
        "__doc__": "arq worker settings built by AgentPlugin.worker_settings().",
        "functions": functions,
        "redis_settings": redis,
        "queue_name": options.queue_name,
        "on_startup": on_startup,
        "on_shutdown": on_shutdown,
        "cron_jobs": cron_jobs,
        "job_timeout": job_timeout,
        "max_tries": _ARQ_MAX_TRIES,
        "keep_result": options.keep_result,
        "max_jobs": options.max_jobs,
        "poll_delay": options.poll_delay,
        "job_serializer": dumps,
        "job_deserializer": loads,
        "health_check_interval": 60,
        **overrides,
    }
    return type("WorkerSettings", (), attributes)
