"""Background runs on arq, cut as arq cuts a queue: :mod:`~agent_plugin.jobs.args` (what a run
runs), :mod:`~agent_plugin.jobs.options`, :mod:`~agent_plugin.jobs.redis` (keys, the session
lock), :mod:`~agent_plugin.jobs.queue` (the enqueue side), :mod:`~agent_plugin.jobs.upkeep`
(claims, the reconciler), :mod:`~agent_plugin.jobs.attempt` (one delivery, one verdict),
:mod:`~agent_plugin.jobs.progress` (what the record says of how far a run is),
:mod:`~agent_plugin.jobs.ticks` (heartbeats) and :mod:`~agent_plugin.jobs.worker` (arq's
``WorkerSettings``). ``docs/guide/background-runs.md`` tells what survives what.
"""

from agent_plugin.jobs.args import RunArgs, RunHandle, RunOrigin, tick_run_id
from agent_plugin.jobs.options import JobOptions
from agent_plugin.jobs.progress import progress_of
from agent_plugin.jobs.queue import AGENT_RESUME, AGENT_RUN, HeartbeatStats, RunQueue
from agent_plugin.jobs.redis import SessionLock
from agent_plugin.jobs.ticks import AGENT_HEARTBEAT, heartbeat_cron
from agent_plugin.jobs.worker import (
    agent_heartbeat,
    agent_resume,
    agent_run,
    runtime_of,
    start_worker,
    stop_worker,
    worker_settings,
)

__all__ = [
    "AGENT_HEARTBEAT",
    "AGENT_RESUME",
    "AGENT_RUN",
    "HeartbeatStats",
    "JobOptions",
    "RunArgs",
    "RunHandle",
    "RunOrigin",
    "RunQueue",
    "SessionLock",
    "agent_heartbeat",
    "agent_resume",
    "agent_run",
    "heartbeat_cron",
    "progress_of",
    "runtime_of",
    "start_worker",
    "stop_worker",
    "tick_run_id",
    "worker_settings",
]
