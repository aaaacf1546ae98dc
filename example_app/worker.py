"""The demo's background worker: runs the agent's queued runs and resumes.

Start it beside the app, from the repository root (it reads the same ``example_app/agent.toml``
and ``AGENT_*`` variables, so it uses the same database and Redis)::

    arq example_app.worker.WorkerSettings

then queue a run over HTTP and poll it::

    curl -s localhost:8000/agent/runs -H 'content-type: application/json' \\
         -d '{"prompt": "Tell Alice the weather in Oslo"}'
    {"run_id":"run_…","status_path":"/agent/runs/run_…"}
    curl -s localhost:8000/agent/runs/run_…
"""

from __future__ import annotations

from example_app.main import plugin

__all__ = ["WorkerSettings"]

WorkerSettings = plugin.worker_settings()
"""arq's worker settings, built from the app's own plugin (same tools, policy, model, stores)."""
