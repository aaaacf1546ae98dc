"""What a run reports while it goes on.

Every event is a pydantic model tagged by ``type``, so it crosses a Redis stream or an SSE
connection as plain JSON. One run (or resume) emits, in order [OP-01]::

    run_start
      turn_start
        model_request  (text_delta | thinking_delta | tool_call_delta)*  (retry)*  model_response
        (approval_required | tool_start* tool_end*)
      turn_end
      ...
    run_end            exactly once, on every exit path, errors included [OP-02]

Tool arguments are redacted before they are put in an event [OP-17]; tool results and
assistant text are not.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter

from agent_plugin.messages import ChatMessage, StopReason, TokenUsage
from agent_plugin.outcomes import AgentOutcome

__all__ = [
    "AgentEvent",
    "ApprovalRequired",
    "ModelRequestStarted",
    "ModelResponded",
    "PendingApproval",
    "RetryScheduled",
    "RunEnded",
    "RunStarted",
    "TextDeltaEvent",
    "ThinkingDeltaEvent",
    "ToolCallDeltaEvent",
    "ToolFinished",
    "ToolStarted",
    "TurnEnded",
    "TurnStarted",
    "event_adapter",
]


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True)

    run_id: str


class RunStarted(_Event):
    type: Literal["run_start"] = "run_start"
    session_id: str | None = None
    resumed: bool = False


class TurnStarted(_Event):
    type: Literal["turn_start"] = "turn_start"
    step: int


class ModelRequestStarted(_Event):
    type: Literal["model_request"] = "model_request"
    step: int
    messages: int
    max_tokens: int | None


class TextDeltaEvent(_Event):
    type: Literal["text_delta"] = "text_delta"
    text: str


class ThinkingDeltaEvent(_Event):
    type: Literal["thinking_delta"] = "thinking_delta"
    text: str


class ToolCallDeltaEvent(_Event):
    """A tool call being written by the model; its arguments are not shown until it ends."""

    type: Literal["tool_call_delta"] = "tool_call_delta"
    index: int
    call_id: str
    name: str


class RetryScheduled(_Event):
    type: Literal["retry"] = "retry"
    attempt: int
    max_attempts: int
    wait_seconds: float
    error: dict[str, Any]


class ModelResponded(_Event):
    type: Literal["model_response"] = "model_response"
    step: int
    message: ChatMessage
    stop_reason: StopReason
    usage: TokenUsage


class ToolStarted(_Event):
    type: Literal["tool_start"] = "tool_start"
    call_id: str
    name: str
    arguments: JsonValue


class ToolFinished(_Event):
    type: Literal["tool_end"] = "tool_end"
    call_id: str
    name: str
    content: str
    is_error: bool = False
    terminate: bool = False


class PendingApproval(BaseModel):
    model_config = ConfigDict(frozen=True)

    call_id: str
    name: str
    arguments: JsonValue
    reason: str


class ApprovalRequired(_Event):
    type: Literal["approval_required"] = "approval_required"
    calls: list[PendingApproval]


class TurnEnded(_Event):
    type: Literal["turn_end"] = "turn_end"
    step: int


class RunEnded(_Event):
    """The last event of every run: the outcome, or the error that ended it."""

    type: Literal["run_end"] = "run_end"
    outcome: AgentOutcome | None = None
    error: dict[str, Any] | None = None


AgentEvent: TypeAlias = Annotated[
    RunStarted
    | TurnStarted
    | ModelRequestStarted
    | TextDeltaEvent
    | ThinkingDeltaEvent
    | ToolCallDeltaEvent
    | RetryScheduled
    | ModelResponded
    | ToolStarted
    | ToolFinished
    | ApprovalRequired
    | TurnEnded
    | RunEnded,
    Field(discriminator="type"),
]

event_adapter: TypeAdapter[AgentEvent] = TypeAdapter(AgentEvent)
