"""The app and the worker of S8 (:mod:`benchmarks.bench_load`), as people deploy them.

``uvicorn benchmarks.load_app:app`` serves the plugin's routes (``POST /agent/runs`` on);
``arq benchmarks.load_app.WorkerSettings`` runs the background runs. Both build the same
plugin from the environment: the ``AGENT_*`` settings (the benchmark's model server as an
OpenAI-compatible endpoint, its PostgreSQL database and Redis) and ``LOAD_QUEUE`` (the queue
and key prefix of one benchmark run). Every other job option is the library's default, unless
``LOAD_MAX_JOBS`` says otherwise. The one tool, ``lookup``, is what the model server calls.
A worker's startup writes its pid to the file ``LOAD_READY`` names (one line per worker).
"""

from __future__ import annotations

import os
from typing import Any

from fastapi import FastAPI

from agent_plugin.jobs import JobOptions
from agent_plugin.tools import tool
from agent_plugin.web import AgentPlugin

__all__ = ["app", "make_plugin"]


@tool
async def lookup(i: int) -> dict[str, int]:
    """Look the number up."""
    return {"i": i, "square": i * i}


def make_plugin() -> AgentPlugin:
    queue = os.environ.get("LOAD_QUEUE", "bench-load")
    options: dict[str, Any] = {"queue_name": f"{queue}:queue", "key_prefix": f"{queue}:"}
    if os.environ.get("LOAD_MAX_JOBS"):
        options["max_jobs"] = int(os.environ["LOAD_MAX_JOBS"])
    return AgentPlugin(tools=[lookup], jobs=JobOptions(**options))


plugin = make_plugin()
app = FastAPI()
plugin.install(app, runs_route=True)


def _worker_settings() -> type[Any]:
    settings = plugin.worker_settings()
    startup = settings.on_startup
    ready = os.environ.get("LOAD_READY")

    async def on_startup(ctx: dict[str, Any]) -> None:
        await startup(ctx)
        if ready:
            fd = os.open(ready, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{os.getpid()}\n".encode())
            finally:
                os.close(fd)

    settings.on_startup = on_startup
    return settings


def __getattr__(name: str) -> Any:
    """``WorkerSettings`` is built when arq asks for it."""
    if name == "WorkerSettings":
        return _worker_settings()
    raise AttributeError(name)
