"""Compaction: fold the head of a long transcript into one summary message.

:class:`Compaction` says when (``trigger_tokens``) and how much to keep; :meth:`Compaction.compact`
makes the one tool-less summary call and returns a :class:`CompactionResult`. Sessions store the
result as a compaction entry (:func:`agent_plugin.sessions.compact_session`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from agent_plugin.budget import estimate_message, estimate_messages
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.messages import (
    ChatMessage,
    ContentPart,
    ImagePart,
    RedactedThinkingPart,
    Role,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
)
from agent_plugin.outcomes import CompactionReport
from agent_plugin.providers.base import ChatRequest, LlmClient

__all__ = [
    "SUMMARY_INSTRUCTIONS",
    "SUMMARY_PREFIX",
    "Compaction",
    "CompactionReason",
    "CompactionReport",
    "CompactionResult",
    "render_transcript",
    "summary_message",
]

SUMMARY_PREFIX: Final = "[Summary of the earlier conversation]\n"
"""The start of the one user message that stands for the summarised head of a session."""

SUMMARY_INSTRUCTIONS: Final = (
    "You compress the earlier part of a conversation between a user and an AI agent, so that "
    "the agent can carry on without it. Write a dense summary for that agent. Keep: the user's "
    "goals and standing instructions; decisions made and why; facts with their exact names, ids, "
    "numbers, paths and values; tool results that are still relevant; open tasks and what was "
    "about to happen next. Leave out small talk and pleasantries. Do not address the user and "
    "do not answer any request in the conversation: write only the summary."
)
"""The system prompt of the summary call."""

CompactionReason: TypeAlias = Literal["threshold", "overflow", "manual"]
"""Why a transcript was compacted: it grew past ``trigger_tokens`` before a run, the model
said it was too long for its context, or someone asked for it."""

RESULT_PREVIEW_CHARS: Final = 600
"""A tool result is rendered for the summary call with at most this many characters."""


def summary_message(summary: str) -> ChatMessage:
    """The user message that replaces a summarised head: the prefix, then the summary."""
    return ChatMessage.user(SUMMARY_PREFIX + summary)


def render_transcript(messages: Sequence[ChatMessage]) -> str:
    """The transcript as plain text for the summary call, one line per part.

    ``<role>: <text>``; ``<role> called <name> with <args json>``; ``<role> result: <the
    first 600 characters>`` (``result (error)`` for a failed call); ``<role> thought: <text>``
    for reasoning; ``<role>: [image <url>]`` or ``<role>: [image: <media type>]`` (inline
    image data is never copied). Empty texts and redacted (encrypted) reasoning are left out.
    """
    lines: list[str] = []
    for message in messages:
        role = message.role.value
        for part in message.content:
            line = _render_part(role, part)
            if line is not None:
                lines.append(line)
    return "\n".join(lines)


def _render_part(role: str, part: ContentPart) -> str | None:
    if isinstance(part, TextPart):
        return f"{role}: {part.text}" if part.text else None
    if isinstance(part, ToolCallPart):
        call = part.tool_call
        arguments = call.raw_arguments
        if arguments is None:
            arguments = json.dumps(call.arguments, ensure_ascii=False, separators=(",", ":"))
        return f"{role} called {call.name} with {arguments}"
    if isinstance(part, ToolResultPart):
        result = part.tool_result
        label = "result (error)" if result.is_error else "result"
        return f"{role} {label}: {result.content[:RESULT_PREVIEW_CHARS]}"
    if isinstance(part, ImagePart):
        image = part.image
        if image.url is not None and not image.url.startswith("data:"):
            return f"{role}: [image {image.url}]"
        media_type = image.media_type
        if media_type is None and image.url is not None:
            media_type = image.url[len("data:") :].split(";", 1)[0].split(",", 1)[0] or None
        return f"{role}: [image: {media_type or 'unknown type'}]"
    if isinstance(part, ThinkingPart):
        return f"{role} thought: {part.thinking.text}" if part.thinking.text else None
    if isinstance(part, RedactedThinkingPart):
        return None
    return None


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """A compacted transcript: the summary message, then the kept tail."""

    summary: str
    """The model's summary, trimmed."""
    messages: list[ChatMessage]
    report: CompactionReport

    @property
    def split(self) -> int:
        """How many messages of the original transcript the summary replaced."""
        return self.report.summarized_messages


@dataclass(frozen=True, slots=True)
class Compaction:
    """When and how to fold the head of a long session into one summary.

    A transcript estimated above ``trigger_tokens`` keeps its newest messages, at most
    ``keep_recent_tokens`` of them starting on a user message, and the rest is summarised by
    one tool-less model call capped at ``summary_max_tokens``.
    """

    trigger_tokens: int = 24_000
    keep_recent_tokens: int = 8_000
    summary_max_tokens: int = 1_024

    def __post_init__(self) -> None:
        for name in ("trigger_tokens", "keep_recent_tokens", "summary_max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise AgentError.config(
                    f"compaction {name} must be a positive integer, got {value!r}"
                )

    def split_point(self, messages: Sequence[ChatMessage]) -> int | None:
        """The index of the first kept message, or ``None`` when there is no split point.

        Walking from the newest message down to index 1 while the tail stays within
        ``keep_recent_tokens``, the oldest user message seen: the kept tail starts on a user
        message, so no tool result loses its call, and index 0 is never a split point.
        """
        tail = 0
        split: int | None = None
        for index in range(len(messages) - 1, 0, -1):
            tail += estimate_message(messages[index])
            if tail > self.keep_recent_tokens:
                break
            if messages[index].role is Role.USER:
                split = index
        return split

    async def compact(
        self,
        model: LlmClient,
        messages: Sequence[ChatMessage],
        *,
        force: bool = False,
        keep_from: int | None = None,
    ) -> CompactionResult | None:
        """Summarise the head of ``messages``, or return ``None`` and call no model.

        ``None`` when the transcript is estimated at ``trigger_tokens`` or less (unless
        ``force``: manual compaction ignores the trigger) or has no split point. ``keep_from``
        (a user message's index) bounds the split: the messages from there on are kept
        whatever their size, and it is the split point when the tail is too large to find one
        (a run's own messages are never folded). A failed or empty summary call raises
        :class:`AgentError`; nothing is changed then.
        """
        before = estimate_messages(messages)
        if not force and before <= self.trigger_tokens:
            return None
        split = self.split_point(messages)
        if keep_from is not None:
            split = keep_from if split is None else min(split, keep_from)
        if split is None or split < 1:
            return None
        request = ChatRequest(
            messages=[
                ChatMessage.system(SUMMARY_INSTRUCTIONS),
                ChatMessage.user(render_transcript(messages[:split])),
            ],
            max_tokens=self.summary_max_tokens,
        )
        response = await model.chat(request)
        summary = response.text.strip()
        if not summary:
            raise AgentError(
                ErrorKind.PROVIDER,
                "the summary call returned no text; the session was not compacted",
                provider=model.provider_name,
            )
        compacted = [summary_message(summary), *messages[split:]]
        report = CompactionReport(
            summarized_messages=split,
            tokens_before=before,
            tokens_after=estimate_messages(compacted),
            usage=response.usage,
        )
        return CompactionResult(summary=summary, messages=compacted, report=report)
