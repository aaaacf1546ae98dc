"""The worker of the fleet pacing test (``tests/test_pacing_workers.py``).

``python -m arq tests.pacing_app.WorkerSettings``: the plugin of ``tests/jobs_app.py``'s
environment (its queue, key prefix and log), whose model is an OpenAI-compatible client of
``PACING_TEST_URL`` (no retries: a 429 is seen, not hidden), paced at ``PACING_TEST_LIMIT``
(``<requests>/<seconds>``) through Redis. Each model call logs ``model_call``.
"""

from __future__ import annotations

import os
from typing import Any

from agent_plugin.config import AgentSettings
from agent_plugin.hooks import AgentHooks, RunControl
from agent_plugin.outcomes import RunInfo
from agent_plugin.pacing import PaceLimits, PacingConfig
from agent_plugin.providers.base import ChatRequest, LlmClient
from agent_plugin.providers.openai import OpenAICompatibleClient
from agent_plugin.providers.retry import RetryPolicy
from agent_plugin.web import AgentPlugin
from tests.jobs_app import log, options_from_env

MODEL = "paced-model"


def paced_client(settings: AgentSettings) -> LlmClient:
    return OpenAICompatibleClient(
        model=MODEL, base_url=os.environ["PACING_TEST_URL"], retry=RetryPolicy(max_attempts=1)
    )


class LogCalls(AgentHooks):
    async def before_model(self, request: ChatRequest, info: RunInfo) -> RunControl | None:
        log("model_call")
        return None


def make_plugin() -> AgentPlugin:
    requests, _, seconds = os.environ["PACING_TEST_LIMIT"].partition("/")
    limits = PacingConfig(PaceLimits(float(requests), per=float(seconds)))
    return AgentPlugin(
        model=paced_client, hooks=[LogCalls()], jobs=options_from_env(), pacing=limits
    )


def worker_settings() -> type[Any]:
    settings = make_plugin().worker_settings()
    startup = settings.on_startup

    async def on_startup(ctx: dict[str, Any]) -> None:
        await startup(ctx)
        log("worker_ready", os.getpid())

    settings.on_startup = on_startup
    return settings


def __getattr__(name: str) -> Any:
    """``WorkerSettings`` is built when the worker asks for it (not when a test imports)."""
    if name == "WorkerSettings":
        return worker_settings()
    raise AttributeError(name)
