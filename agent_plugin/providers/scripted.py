"""A deterministic, local model for tests and demos: no network, no key."""

from __future__ import annotations

import inspect
import itertools
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TypeAlias

from agent_plugin.errors import AgentError
from agent_plugin.messages import (
    JsonValue,
    StopReason,
    TextPart,
    TokenUsage,
    ToolCall,
    ToolCallPart,
)
from agent_plugin.providers.base import (
    ChatRequest,
    ChatResponse,
    StreamDone,
    StreamEvent,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStarted,
)

__all__ = ["Reply", "ScriptedModel", "tool_call"]

Reply: TypeAlias = (
    str
    | ToolCall
    | list[ToolCall]
    | ChatResponse
    | AgentError
    | Callable[[ChatRequest], "Reply | Awaitable[Reply]"]
)
"""What a scripted turn may be: text, one or more tool calls, a whole response, an error to
raise, or a function of the request that returns (or awaits) any of those."""

DEFAULT_USAGE = TokenUsage(input_tokens=10, output_tokens=5)


def tool_call(name: str, arguments: JsonValue = None, *, id: str = "") -> ToolCall:
    """A tool call for a script; an empty ``id`` is filled in as ``call_<n>`` when replayed."""
    return ToolCall(id=id, name=name, arguments={} if arguments is None else arguments)


class ScriptedModel:
    """Pops one scripted reply per call and records the requests it was sent.

    When the script runs out it answers ``default`` (the text ``"default"`` unless set).
    Replies given as text or tool calls report ``usage`` (10 in / 5 out unless set).
    ``requests`` keeps the latest ``keep_requests`` requests (``None``: all of them), so a
    long-lived process that serves on a scripted model does not grow; ``calls`` counts them
    all.
    """

    provider_name = "scripted"

    def __init__(
        self,
        replies: Iterable[Reply] = (),
        *,
        default: Reply = "default",
        usage: TokenUsage = DEFAULT_USAGE,
        models: Iterable[str] = ("scripted",),
        keep_requests: int | None = 1000,
    ) -> None:
        if keep_requests is not None and keep_requests < 0:
            raise AgentError.config(f"keep_requests must be 0 or more, got {keep_requests}")
        self.script: deque[Reply] = deque(replies)
        self.default = default
        self.usage = usage
        self.models = list(models)
        self.keep_requests = keep_requests
        self.requests: list[ChatRequest] = []
        self.calls = 0
        """How many calls the model answered (or raised for), however many are kept."""
        self._ids = itertools.count(1)

    def __repr__(self) -> str:
        return f"ScriptedModel(remaining={len(self.script)}, calls={self.calls})"

    @property
    def model(self) -> str:
        """The model it plays (the first of ``models``): what spans and prices name."""
        return self.models[0] if self.models else "scripted"

    def push(self, *replies: Reply) -> None:
        self.script.extend(replies)

    async def chat(self, request: ChatRequest) -> ChatResponse:
        self.calls += 1
        self.requests.append(request)
        keep = self.keep_requests
        if keep is not None and len(self.requests) > keep:
            del self.requests[: len(self.requests) - keep]
        reply = self.script.popleft() if self.script else self.default
        return await self._resolve(reply, request)

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """The reply of :meth:`chat` as deltas: one per text part, a start and one fragment per
        tool call (numbered among the tool calls), then :class:`StreamDone`."""
        response = await self.chat(request)
        calls = 0
        for part in response.content:
            if isinstance(part, TextPart) and part.text:
                yield TextDelta(part.text)
            elif isinstance(part, ToolCallPart):
                call = part.tool_call
                yield ToolCallStarted(calls, call.id, call.name)
                yield ToolCallArgumentsDelta(
                    calls, call.raw_arguments or json.dumps(call.arguments, ensure_ascii=False)
                )
                calls += 1
        yield StreamDone(response)

    async def list_models(self) -> list[str]:
        return list(self.models)

    async def aclose(self) -> None:
        return None

    async def _resolve(self, reply: Reply, request: ChatRequest) -> ChatResponse:
        while callable(reply):
            produced = reply(request)
            reply = await produced if inspect.isawaitable(produced) else produced
        if isinstance(reply, AgentError):
            raise reply
        if isinstance(reply, ChatResponse):
            return reply
        if isinstance(reply, str):
            return ChatResponse(
                content=[TextPart(text=reply)], stop_reason=StopReason.END_TURN, usage=self.usage
            )
        calls = [reply] if isinstance(reply, ToolCall) else reply
        return ChatResponse(
            content=[
                ToolCallPart(
                    tool_call=call if call.id else call.model_copy(update={"id": self._next_id()})
                )
                for call in calls
            ],
            stop_reason=StopReason.TOOL_USE,
            usage=self.usage,
        )

    def _next_id(self) -> str:
        return f"call_{next(self._ids)}"
