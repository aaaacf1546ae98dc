"""Testing an agent without a key or a network: models you script, and builders of replies.

* :class:`ScriptedModel` pops one scripted reply per call (text, tool calls, a whole response,
  an error to raise, or a function of the request) and records every request;
* :class:`FunctionModel` is a function of the conversation: ``fn(messages, info)`` answers each
  call, like pydantic-ai's ``FunctionModel``;
* :func:`tool_call` and :func:`reply` build replies: one tool call, or a response with text,
  reasoning, tool calls, a stop reason and usage.

Give the app and its worker processes the same model with the ``model_client`` setting: the
import path of a model or of a function that makes one (``AGENT_MODEL_CLIENT=tests.models:bot``),
so background runs are scripted in a test too.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from agent_plugin.messages import (
    ChatMessage,
    ContentPart,
    Role,
    StopReason,
    TextPart,
    Thinking,
    ThinkingPart,
    TokenUsage,
    ToolCall,
    ToolCallPart,
    ToolDefinition,
    ToolResult,
    ToolResultPart,
)
from agent_plugin.providers.base import ChatRequest, ChatResponse
from agent_plugin.providers.scripted import DEFAULT_USAGE, Reply, ScriptedModel, tool_call

__all__ = [
    "DEFAULT_USAGE",
    "FunctionModel",
    "ModelCall",
    "ModelFunction",
    "Reply",
    "ScriptedModel",
    "reply",
    "tool_call",
]


@dataclass(frozen=True, slots=True)
class ModelCall:
    """What a :class:`FunctionModel`'s function learns about the call besides the messages."""

    index: int
    """The call's number, from 0: how many calls the model answered before this one."""
    tools: Sequence[ToolDefinition]
    """The tools the agent offers on this call."""
    request: ChatRequest
    """The whole request (output cap, options, ...)."""

    @property
    def tool_names(self) -> list[str]:
        return [definition.name for definition in self.tools]

    @property
    def results(self) -> list[ToolResult]:
        """The tool results this call answers: the last message's, when it is the tools'
        reply to the model's calls (``[]`` otherwise)."""
        last = self.request.messages[-1] if self.request.messages else None
        if last is None or last.role is not Role.TOOL:
            return []
        return [part.tool_result for part in last.content if isinstance(part, ToolResultPart)]

    @property
    def system(self) -> str | None:
        """The system prompt, when the agent has one."""
        for message in self.request.messages:
            if message.role is Role.SYSTEM:
                return message.text
        return None


ModelFunction: TypeAlias = Callable[[list[ChatMessage], ModelCall], "Reply | Awaitable[Reply]"]
"""``fn(messages, call)``: the reply to one call, or an awaitable of it."""


class FunctionModel(ScriptedModel):
    """A model whose every reply is ``fn(messages, call)``: text, tool calls, a response built
    with :func:`reply`, an :class:`~agent_plugin.errors.AgentError` to raise, or an awaitable
    of one of those. ``requests`` records what it was sent; ``stream`` replays each reply as
    deltas, as :class:`ScriptedModel` does.
    """

    def __init__(
        self,
        fn: ModelFunction,
        *,
        usage: TokenUsage = DEFAULT_USAGE,
        models: Iterable[str] = ("function",),
        keep_requests: int | None = 1000,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"FunctionModel needs a function, got {type(fn).__name__}")
        self.fn = fn
        super().__init__(
            default=self._answer, usage=usage, models=models, keep_requests=keep_requests
        )

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
        return f"FunctionModel({name}, calls={self.calls})"

    async def _answer(self, request: ChatRequest) -> Reply:
        call = ModelCall(index=self.calls - 1, tools=request.tools, request=request)
        produced = self.fn(list(request.messages), call)
        return await produced if inspect.isawaitable(produced) else produced


def reply(
    text: str | None = None,
    *calls: ToolCall,
    thinking: str | None = None,
    stop_reason: StopReason | None = None,
    usage: TokenUsage = DEFAULT_USAGE,
) -> ChatResponse:
    """A whole model response: reasoning first, then the text, then the tool calls.

    ``stop_reason`` defaults to ``tool_use`` when there are calls, ``end_turn`` otherwise
    (``max_tokens`` makes a truncated reply). Tool calls need ids here (``tool_call(...,
    id="c1")``): a response is replayed exactly as built.
    """
    content: list[ContentPart] = []
    if thinking is not None:
        content.append(ThinkingPart(thinking=Thinking(text=thinking)))
    if text is not None:
        content.append(TextPart(text=text))
    for call in calls:
        if not call.id:
            raise ValueError(f"tool call {call.name!r} needs an id in reply(): pass id=...")
        content.append(ToolCallPart(tool_call=call))
    if not content:
        raise ValueError("reply() needs text, thinking or a tool call")
    if stop_reason is None:
        stop_reason = StopReason.TOOL_USE if calls else StopReason.END_TURN
    return ChatResponse(content=content, stop_reason=stop_reason, usage=usage)
