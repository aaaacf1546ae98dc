"""The worker of ``tests/test_spend_jobs.py``: the background-run tests' worker
(:mod:`tests.jobs_app`) on a model whose every call costs the most it may, the prompt's
estimated tokens in and the whole output cap out, so a ledger that let two calls into one
window's last room would show it. A wrap-up call (``tool_choice`` none) is answered in text.

Each call logs ``priced_call <tag> <tokens> <wrap_up>`` (``1`` for a wrap-up) to the log.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from agent_plugin.budget import estimate_messages, estimate_tokens
from agent_plugin.messages import Role, TextPart, TokenUsage
from agent_plugin.providers.base import (
    ChatRequest,
    ChatResponse,
    LlmClient,
    StreamDone,
    StreamEvent,
)
from agent_plugin.providers.scripted import ScriptedModel
from tests import jobs_app


class MostExpensive:
    """``inner``'s replies, each reporting the most a call of its request may use."""

    def __init__(self, inner: LlmClient) -> None:
        self.inner = inner
        self.model = "scripted"

    @property
    def provider_name(self) -> str:
        return self.inner.provider_name

    async def chat(self, request: ChatRequest) -> ChatResponse:
        wrap_up = request.tool_choice == "none"
        if wrap_up:
            reply = ChatResponse(content=[TextPart(text="wrapped up")])
        else:
            reply = await self.inner.chat(request)
        schemas = [t.model_dump(mode="json") for t in request.tools]
        prompt = estimate_messages(request.messages)
        prompt += estimate_tokens(json.dumps(schemas, separators=(",", ":"))) if schemas else 0
        usage = TokenUsage(input_tokens=prompt, output_tokens=request.max_tokens or 0)
        jobs_app.log("priced_call", _tag(request), usage.total(), int(wrap_up))
        return reply.model_copy(update={"usage": usage})

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        yield StreamDone(response=await self.chat(request))

    async def list_models(self) -> list[str]:
        return ["scripted"]

    async def aclose(self) -> None:
        await self.inner.aclose()


def _tag(request: ChatRequest) -> str:
    for message in request.messages:
        if message.role is Role.USER:
            try:
                plan: dict[str, Any] = json.loads(message.text)
            except ValueError:
                continue
            return str(plan.get("tag", "-"))
    return "-"


def __getattr__(name: str) -> Any:
    """``WorkerSettings`` is built when the worker asks for it (not when a test imports)."""
    if name == "WorkerSettings":
        make_plugin = jobs_app.make_plugin

        def expensive(*args: Any, **kwargs: Any) -> Any:
            plugin = make_plugin(*args, **kwargs)
            assert isinstance(plugin.model, ScriptedModel)
            plugin.model = MostExpensive(plugin.model)
            return plugin

        jobs_app.make_plugin = expensive  # what jobs_app.worker_settings builds from
        return jobs_app.worker_settings()
    raise AttributeError(name)
