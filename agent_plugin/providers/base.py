"""The boundary between the agent loop and a model: requests, responses, stream events."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from agent_plugin.errors import AgentError
from agent_plugin.messages import (
    ChatMessage,
    ContentPart,
    StopReason,
    TokenUsage,
    ToolCall,
    ToolDefinition,
    text_of,
    tool_calls_of,
)
from agent_plugin.providers.retry import RetryNotice

__all__ = [
    "ChatRequest",
    "ChatResponse",
    "FallbackNotice",
    "LlmClient",
    "ResponseFormat",
    "StreamDone",
    "StreamEvent",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallArgumentsDelta",
    "ToolCallStarted",
    "merge_extra_body",
]


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """Ask for a reply whose text is JSON matching ``schema`` (native structured output).

    ``name`` names the schema (OpenAI's ``json_schema.name``; on Anthropic, the tool the reply
    is forced through); ``strict`` asks the server to enforce the schema where the endpoint
    takes strict schemas (it is true only for a schema strict mode accepts as it is). The loop
    validates the reply whatever the server did.
    """

    name: str
    schema: Mapping[str, Any]
    description: str | None = None
    strict: bool = False


@dataclass(frozen=True, slots=True)
class FallbackNotice:
    """The call moved from ``from_model`` to ``to_model`` (of ``to_provider``) after ``error``."""

    from_model: str
    to_model: str
    to_provider: str
    to_base_url: str | None
    error: AgentError


@dataclass(slots=True)
class ChatRequest:
    """One model call. Hooks may edit it before it is sent.

    Everything the loop controls lives here, so it never touches wire code: the per-call output
    cap, temperature, tool choice (``"auto"``, ``"none"``, ``"required"`` or a tool's name),
    whether tool calls may come several at once (``parallel_tool_calls``, None: the server's
    default) and whether tool schemas are to be enforced by the server (``strict_tools``, where
    it can), the reply's format (``response_format``: JSON of a schema, for typed results in
    native mode), stop sequences, the model, prompt caching, and provider-specific body fields.
    ``extra_body`` is merged into the wire body last (see :func:`merge_extra_body`): its values
    win, and a ``None`` value removes the key. ``deadline`` (event-loop time) and ``on_retry``
    bound and report the client's retries; ``on_fallback`` hears a
    :class:`~agent_plugin.providers.fallback.FallbackClient` move on to its next model.
    """

    messages: list[ChatMessage]
    tools: Sequence[ToolDefinition] = ()
    max_tokens: int | None = None
    temperature: float | None = None
    tool_choice: str | None = None
    parallel_tool_calls: bool | None = None
    strict_tools: bool = False
    response_format: ResponseFormat | None = None
    stop: list[str] = field(default_factory=list)
    model: str | None = None
    prompt_caching: bool | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    deadline: float | None = None
    on_retry: Callable[[RetryNotice], None] | None = None
    on_fallback: Callable[[FallbackNotice], None] | None = None


class ChatResponse(BaseModel):
    """A complete assistant reply, whether it came in one body or as a stream."""

    model_config = ConfigDict(frozen=True)

    content: list[ContentPart]
    stop_reason: StopReason = StopReason.END_TURN
    usage: TokenUsage = Field(default_factory=TokenUsage)
    model: str | None = None
    id: str | None = None
    raw_stop_reason: str | None = None

    @property
    def text(self) -> str:
        return text_of(self.content)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return tool_calls_of(self.content)


def merge_extra_body(body: dict[str, Any], extra: Mapping[str, Any]) -> None:
    """Merge a request's ``extra_body`` into a wire ``body``, in place.

    Each value replaces the body's; a ``None`` value removes the key instead (for example
    ``{"max_tokens": None, "max_completion_tokens": 500}`` for OpenAI's reasoning models, which
    refuse ``max_tokens``). Values are not copied: the body shares them with the request.
    """
    for key, value in extra.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the reply's text."""

    text: str


@dataclass(frozen=True, slots=True)
class ThinkingDelta:
    """A piece of the model's reasoning."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    """A tool call begins. Always comes before the argument fragments of the same call.

    ``index`` is the 0-based position of the call among this reply's tool calls, whatever the
    provider numbers on the wire (so ``StreamDone.response.tool_calls[index]`` is this call).
    """

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArgumentsDelta:
    """A fragment of a tool call's JSON arguments; ``index`` as in :class:`ToolCallStarted`."""

    index: int
    fragment: str


@dataclass(frozen=True, slots=True)
class StreamDone:
    """Always the last event of a stream: the reply aggregated from the deltas before it."""

    response: ChatResponse


StreamEvent: TypeAlias = (
    TextDelta | ThinkingDelta | ToolCallStarted | ToolCallArgumentsDelta | StreamDone
)


@runtime_checkable
class LlmClient(Protocol):
    """A model. Implementations raise only :class:`~agent_plugin.errors.AgentError`."""

    @property
    def provider_name(self) -> str: ...

    async def chat(self, request: ChatRequest) -> ChatResponse:
        """Send the request and return the whole reply."""
        ...

    def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """Send the request and yield deltas as they arrive, then one :class:`StreamDone`."""
        ...

    async def list_models(self) -> list[str]:
        """Model ids the provider offers; cheap and read-only (used by health checks)."""
        ...

    async def aclose(self) -> None:
        """Release the connection pool."""
        ...
