"""Background runs on arq, cut as arq cuts a queue: :mod:`~agent_plugin.jobs.args` (what a run
runs), :mod:`~agent_plugin.jobs.options`, :mod:`~agent_plugin.jobs.redis` (connections,
keys), :mod:`~agent_plugin.jobs.queue` (the enqueue side), :mod:`~agent_plugin.jobs.upkeep`
(claims, the reconciler), :mod:`~agent_plugin.jobs.attempt` (one delivery, one verdict),
:mod:`~agent_plugin.jobs.progress` (what the record says of how far a run is),
:mod:`~agent_plugin.jobs.ticks` (heartbeats) and :mod:`~agent_plugin.jobs.worker` (arq's
``WorkerSettings``). ``docs/guide/background-runs.md`` tells what survives what.

The names that need arq, Redis or SQLAlchemy load on first use, so an app that runs no
background runs (and ``import agent_plugin.web``) never imports them.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from agent_plugin.jobs.args import RunArgs, RunHandle, RunOrigin, tick_run_id
from agent_plugin.jobs.options import JobOptions

if TYPE_CHECKING:
    from agent_plugin.jobs.progress import progress_of
    from agent_plugin.jobs.queue import AGENT_RESUME, AGENT_RUN, HeartbeatStats, RunQueue
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

_LAZY = {
    "AGENT_HEARTBEAT": "ticks",
    "AGENT_RESUME": "queue",
    "AGENT_RUN": "queue",
    "HeartbeatStats": "queue",
    "RunQueue": "queue",
    "agent_heartbeat": "worker",
    "agent_resume": "worker",
    "agent_run": "worker",
    "heartbeat_cron": "ticks",
    "progress_of": "progress",
    "runtime_of": "worker",
    "start_worker": "worker",
    "stop_worker": "worker",
    "worker_settings": "worker",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agent_plugin.jobs' has no attribute {name!r}")
    return getattr(import_module(f"agent_plugin.jobs.{module}"), name)


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
