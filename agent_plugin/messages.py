"""The provider-neutral conversation model.

Transcripts are lists of :class:`ChatMessage`. Every type here is a pydantic model whose JSON
form is stable (content parts are externally tagged: ``{"text": "..."}``,
``{"tool_call": {...}}``, ...), so a transcript survives a database row, a Redis stream or an
arq job result and comes back equal.
"""

from __future__ import annotations

import secrets
from enum import StrEnum
from typing import Annotated, Any, Final, TypeAlias

from pydantic import BaseModel, ConfigDict, Discriminator, Field, JsonValue, Tag

__all__ = [
    "ChatMessage",
    "ContentPart",
    "Image",
    "ImagePart",
    "JsonValue",
    "ProviderBlock",
    "ProviderBlockPart",
    "RedactedThinking",
    "RedactedThinkingPart",
    "Role",
    "ServerToolCall",
    "ServerToolCallPart",
    "ServerToolResult",
    "ServerToolResultPart",
    "StopReason",
    "TextPart",
    "Thinking",
    "ThinkingPart",
    "TokenUsage",
    "ToolCall",
    "ToolCallPart",
    "ToolDefinition",
    "ToolResult",
    "ToolResultPart",
    "repair_transcript",
    "text_of",
    "tool_calls_of",
    "unique_call_ids",
]

TOKEN_MAX: Final = 2**32 - 1
"""Token counts saturate here, like the seed's u32 counters."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class ToolCall(_Model):
    """A call the model asked for. ``arguments`` is the decoded JSON value.

    ``raw_arguments`` keeps the provider's text when it was not valid JSON: such a call is
    answered with an error payload and never reaches the tool, and the text is sent back to the
    provider unchanged so the transcript stays what the model actually said.
    """

    id: str
    name: str
    arguments: JsonValue = Field(default_factory=dict)
    raw_arguments: str | None = Field(default=None, exclude_if=lambda v: v is None)


class ToolResult(_Model):
    tool_call_id: str
    content: str
    is_error: bool = Field(default=False, exclude_if=lambda v: v is False)


class Image(_Model):
    """An image given by URL, or inline as base64 ``data`` with its ``media_type``."""

    url: str | None = Field(default=None, exclude_if=lambda v: v is None)
    data: str | None = Field(default=None, exclude_if=lambda v: v is None)
    media_type: str | None = Field(default=None, exclude_if=lambda v: v is None)


class Thinking(_Model):
    """Model reasoning. Anthropic signs it; the signature must be re-sent unchanged."""

    text: str
    signature: str | None = Field(default=None, exclude_if=lambda v: v is None)


class RedactedThinking(_Model):
    data: str


class ServerToolCall(_Model):
    """A call of a tool the provider runs itself (Anthropic's web search, code execution).

    The agent never runs it: the provider did, and its result follows as a
    :class:`ServerToolResult` in the same reply. Both are kept so the transcript can be sent
    back to that provider as it was; other providers do not see them.
    """

    id: str
    name: str
    arguments: JsonValue = Field(default_factory=dict)


class ServerToolResult(_Model):
    """What a provider-run tool returned: ``type`` names the kind of result as the provider
    does (``web_search_tool_result``), ``content`` is its payload as sent."""

    tool_call_id: str
    type: str
    content: JsonValue = None


class ProviderBlock(_Model):
    """A content block of a kind this model has no type for, kept whole: ``data`` is the block's
    JSON as ``provider`` sent it, re-sent unchanged to that provider and to no other."""

    provider: str
    data: dict[str, JsonValue]


class TextPart(_Model):
    text: str


class ToolCallPart(_Model):
    tool_call: ToolCall


class ToolResultPart(_Model):
    tool_result: ToolResult


class ImagePart(_Model):
    image: Image


class ThinkingPart(_Model):
    thinking: Thinking


class RedactedThinkingPart(_Model):
    redacted_thinking: RedactedThinking


class ServerToolCallPart(_Model):
    server_tool_call: ServerToolCall


class ServerToolResultPart(_Model):
    server_tool_result: ServerToolResult


class ProviderBlockPart(_Model):
    provider_block: ProviderBlock


_PART_TAGS: Final = (
    "text",
    "tool_call",
    "tool_result",
    "image",
    "thinking",
    "redacted_thinking",
    "server_tool_call",
    "server_tool_result",
    "provider_block",
)


def _part_tag(value: Any) -> str | None:
    tag = _TAG_OF_TYPE.get(type(value))
    if tag is not None:  # a part already built (the usual case): no field lookup
        return tag
    if isinstance(value, dict):
        for key in value:
            if key in _PART_TAGS:
                return str(key)
        return None
    for key in _PART_TAGS:
        if key in getattr(type(value), "model_fields", ()):
            return key
    return None


_TAG_OF_TYPE: Final[dict[type, str]] = {
    TextPart: "text",
    ToolCallPart: "tool_call",
    ToolResultPart: "tool_result",
    ImagePart: "image",
    ThinkingPart: "thinking",
    RedactedThinkingPart: "redacted_thinking",
    ServerToolCallPart: "server_tool_call",
    ServerToolResultPart: "server_tool_result",
    ProviderBlockPart: "provider_block",
}

ContentPart: TypeAlias = Annotated[
    Annotated[TextPart, Tag("text")]
    | Annotated[ToolCallPart, Tag("tool_call")]
    | Annotated[ToolResultPart, Tag("tool_result")]
    | Annotated[ImagePart, Tag("image")]
    | Annotated[ThinkingPart, Tag("thinking")]
    | Annotated[RedactedThinkingPart, Tag("redacted_thinking")]
    | Annotated[ServerToolCallPart, Tag("server_tool_call")]
    | Annotated[ServerToolResultPart, Tag("server_tool_result")]
    | Annotated[ProviderBlockPart, Tag("provider_block")],
    Discriminator(_part_tag),
]


class ChatMessage(_Model):
    role: Role
    content: list[ContentPart]

    @classmethod
    def of_text(cls, role: Role | str, text: str) -> ChatMessage:
        """A message of one text part."""
        return cls(role=Role(role), content=[TextPart(text=text)])

    @classmethod
    def system(cls, text: str) -> ChatMessage:
        return cls(role=Role.SYSTEM, content=[TextPart(text=text)])

    @classmethod
    def user(cls, text: str) -> ChatMessage:
        return cls(role=Role.USER, content=[TextPart(text=text)])

    @classmethod
    def assistant(cls, text: str) -> ChatMessage:
        return cls(role=Role.ASSISTANT, content=[TextPart(text=text)])

    @classmethod
    def tool_results(cls, results: list[ToolResult]) -> ChatMessage:
        return cls(role=Role.TOOL, content=[ToolResultPart(tool_result=r) for r in results])

    @property
    def text(self) -> str:
        """All text parts joined with ``""``."""
        return text_of(self.content)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return tool_calls_of(self.content)


def text_of(parts: list[ContentPart]) -> str:
    return "".join(p.text for p in parts if isinstance(p, TextPart))


def tool_calls_of(parts: list[ContentPart]) -> list[ToolCall]:
    return [p.tool_call for p in parts if isinstance(p, ToolCallPart)]


class ToolDefinition(_Model):
    name: str
    description: str
    input_schema: dict[str, JsonValue]


class StopReason(StrEnum):
    END_TURN = "end_turn"
    TOOL_USE = "tool_use"
    MAX_TOKENS = "max_tokens"
    STOP_SEQUENCE = "stop_sequence"
    REFUSAL = "refusal"
    UNKNOWN = "unknown"


class TokenUsage(_Model):
    """Provider-reported token counts.

    ``input_tokens`` is the full prompt size, cached or not; the two cache counts are subsets of
    it, so :meth:`total` is ``input + output``. Sums saturate at 2**32 - 1 like the seed.
    ``cost_usd`` is what the tokens cost in US dollars, where a price is known
    (:mod:`agent_plugin.pricing`); ``None``: no call of the sum was priced.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float | None = Field(default=None, ge=0, exclude_if=lambda v: v is None)

    def total(self) -> int:
        return min(self.input_tokens + self.output_tokens, TOKEN_MAX)

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            input_tokens=min(self.input_tokens + other.input_tokens, TOKEN_MAX),
            output_tokens=min(self.output_tokens + other.output_tokens, TOKEN_MAX),
            cache_read_tokens=min(self.cache_read_tokens + other.cache_read_tokens, TOKEN_MAX),
            cache_write_tokens=min(self.cache_write_tokens + other.cache_write_tokens, TOKEN_MAX),
            cost_usd=_cost_sum(self.cost_usd, other.cost_usd),
        )


def _cost_sum(a: float | None, b: float | None) -> float | None:
    """Dollars added up to a trillionth, so that sums read as prices do (0.000324, not
    0.00032399999999999996)."""
    if a is None:
        return b
    return a if b is None else round(a + b, 12)


_UNANSWERED = '{"error":"no result was recorded for this call"}'


def repair_transcript(messages: list[ChatMessage]) -> list[ChatMessage]:
    """A transcript providers accept: system messages dropped, every tool call answered by the
    one tool message right after it, and no tool result without its call.

    Results split over several tool messages (one per call, as some clients store them) are
    merged; a call whose result is missing is answered with an error payload, so the model
    knows its outcome was not recorded. A valid transcript comes back unchanged, message for
    message (the same objects).
    """
    out: list[ChatMessage] = []
    calls: list[ToolCall] = []  # the calls of the last assistant turn
    results: list[ToolResultPart] = []  # their results, as found so far
    sources: list[ChatMessage] = []  # the tool messages those results came from

    def close_round() -> None:
        if not calls:
            return
        answered = {p.tool_result.tool_call_id for p in results}
        missing = [c for c in calls if c.id not in answered]
        if not missing and len(sources) == 1 and len(sources[0].content) == len(results):
            out.append(sources[0])
        else:
            parts: list[ContentPart] = [*results, *_unanswered_parts(missing)]
            out.append(ChatMessage(role=Role.TOOL, content=parts))

    for message in messages:
        if message.role is Role.SYSTEM:
            continue
        if message.role is Role.TOOL:
            if calls:
                sources.append(message)
                wanted = {c.id for c in calls} - {p.tool_result.tool_call_id for p in results}
                for part in message.content:
                    if isinstance(part, ToolResultPart) and part.tool_result.tool_call_id in wanted:
                        wanted.discard(part.tool_result.tool_call_id)
                        results.append(part)
            continue
        close_round()
        out.append(message)
        calls = message.tool_calls if message.role is Role.ASSISTANT else []
        results, sources = [], []
    close_round()
    return out


def _unanswered_parts(calls: list[ToolCall]) -> list[ToolResultPart]:
    return [
        ToolResultPart(
            tool_result=ToolResult(tool_call_id=c.id, content=_UNANSWERED, is_error=True)
        )
        for c in calls
    ]


def unique_call_ids(content: list[ContentPart]) -> list[ContentPart]:
    """``content`` with a fresh id for every tool call whose id is empty or repeated.

    Some servers (Gemini's OpenAI-compatible endpoint) send ``""``; results are matched to
    calls by id, so each call of a turn needs its own.
    """
    seen: set[str] = set()
    fixed: list[ContentPart] | None = None
    for index, part in enumerate(content):
        if not isinstance(part, ToolCallPart):
            continue
        call = part.tool_call
        if call.id and call.id not in seen:
            seen.add(call.id)
            continue
        if fixed is None:
            fixed = list(content)
        new_id = f"call_{secrets.token_hex(6)}"
        seen.add(new_id)
        fixed[index] = ToolCallPart(tool_call=call.model_copy(update={"id": new_id}))
    return content if fixed is None else fixed
