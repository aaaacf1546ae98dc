"""What a run reports while it goes on.

Every event is a pydantic model tagged by ``type``, so it crosses a Redis stream or an SSE
connection as plain JSON. One run (or resume) emits, in order::

    (compaction)       a session's run, when the session had grown past its trigger
    run_start
      turn_start
        model_request  (text_delta | thinking_delta | tool_call_delta | output_delta)*  (retry)*
          (retry_succeeded | retry_exhausted)   after any retry: how the retries ended
          (compaction ...)   the context was too long: folded, the call made once more
          (budget_spent budget_warning?)   with spending windows: what the call cost
          model_response
        (approval_required | tool_start* tool_progress* tool_end*)
      turn_end
      ...
    run_end            exactly once, on every exit path, errors included

Tool arguments are redacted before they are put in an event; tool results and
assistant text are not. A typed run streams its output as it grows (``output_delta``, the
JSON parsed so far) and ends with the validated value in ``run_end``'s summary.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter
from pydantic_core import to_jsonable_python

from agent_plugin.errors import AgentError, ErrorInfo
from agent_plugin.messages import ChatMessage, StopReason, TokenUsage, ToolCallPart
from agent_plugin.outcomes import (
    AgentOutcome,
    AwaitingApproval,
    BudgetExhausted,
    Cancelled,
    Completed,
    LoopDetected,
    NeedsApproval,
    OutputInvalid,
    Paused,
)
from agent_plugin.redaction import redact

if TYPE_CHECKING:
    from agent_plugin.outcomes import AgentTurn

__all__ = [
    "AgentEvent",
    "ApprovalRequired",
    "BudgetSpent",
    "BudgetWarning",
    "Compacted",
    "ModelFallback",
    "ModelRequestStarted",
    "ModelResponded",
    "OutcomeSummary",
    "OutputDelta",
    "PacingWait",
    "PendingApproval",
    "RetryExhausted",
    "RetryScheduled",
    "RetrySucceeded",
    "RunEnded",
    "RunStarted",
    "Steered",
    "TextDeltaEvent",
    "ThinkingDeltaEvent",
    "ToolCallDeltaEvent",
    "ToolFinished",
    "ToolProgress",
    "ToolStarted",
    "TurnEnded",
    "TurnStarted",
    "event_adapter",
    "events_of",
    "public_message",
    "tee",
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
    message_count: int
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


class OutputDelta(_Event):
    """A typed run's output as the model writes it: ``partial`` is the JSON parsed so far
    (complete or not, never validated), ``choice`` the output type it is written as."""

    type: Literal["output_delta"] = "output_delta"
    choice: str
    partial: JsonValue


class RetryScheduled(_Event):
    type: Literal["retry"] = "retry"
    attempt: int
    max_attempts: int
    wait_seconds: float
    error: ErrorInfo


class RetrySucceeded(_Event):
    """A call that was retried succeeded: after ``attempts`` attempts (the first included),
    ``elapsed_seconds`` after its first attempt began. Follows the call's ``retry`` events."""

    type: Literal["retry_succeeded"] = "retry_succeeded"
    attempts: int
    elapsed_seconds: float


class RetryExhausted(_Event):
    """A call that was retried did not succeed: its last attempt failed with ``error`` (no
    retry was left, or the error was not worth one), or the run was ``cancelled`` or hit its
    ``deadline`` meanwhile (``error`` is then ``None``). ``attempts`` is how many failed."""

    type: Literal["retry_exhausted"] = "retry_exhausted"
    attempts: int
    elapsed_seconds: float
    reason: Literal["error", "cancelled", "deadline"] = "error"
    error: ErrorInfo | None = None


class ModelFallback(_Event):
    """The model call moved on to the next model of a fallback list after ``error``."""

    type: Literal["model_fallback"] = "model_fallback"
    from_model: str
    to_model: str
    error: ErrorInfo


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


class ToolProgress(_Event):
    """A running tool's own report (:meth:`ToolContext.report_progress
    <agent_plugin.tools.ToolContext.report_progress>`): how far it is, from 0 to 1."""

    type: Literal["tool_progress"] = "tool_progress"
    call_id: str
    name: str
    fraction: float = Field(ge=0.0, le=1.0)
    message: str | None = None


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


class Steered(_Event):
    """Messages sent to the running run joined the conversation before the next request."""

    type: Literal["steered"] = "steered"
    messages: list[str]
    mode: Literal["steer", "followup"] = "steer"
    """``steer``: before the next model call; ``followup``: when the run would have ended."""


class Compacted(BaseModel):
    """A transcript's head was folded into one summary: before a session's run (``threshold``),
    in a run whose model said the context was too long (``overflow``; the call is made again
    once), or on request (``manual``: ``run_id`` is ``None`` outside a run)."""

    model_config = ConfigDict(frozen=True)

    type: Literal["compaction"] = "compaction"
    run_id: str | None = None
    session_id: str | None = None
    reason: Literal["threshold", "overflow", "manual"]
    summarized_messages: int
    tokens_before: int
    tokens_after: int


class TurnEnded(_Event):
    type: Literal["turn_end"] = "turn_end"
    step: int


class OutcomeSummary(BaseModel):
    """How a run ended, safe to publish: no transcript, tool arguments redacted.

    ``output`` is a typed run's output as JSON (by alias, so the output type validates it
    back); ``None`` when the answer is text (``text`` holds it).
    """

    model_config = ConfigDict(frozen=True)

    status: str
    steps_used: int
    usage: TokenUsage
    text: str | None = None
    output: JsonValue = None
    reason: str | None = None
    tool: str | None = None
    repeats: int | None = None
    awaiting: list[PendingApproval] = Field(default_factory=list)
    window: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """The spending window a ``budget_exhausted`` run found without room."""

    @classmethod
    def of(cls, outcome: AgentOutcome) -> OutcomeSummary:
        summary = cls(status=outcome.status, steps_used=outcome.steps_used, usage=outcome.usage)
        if isinstance(outcome, Completed):
            value = outcome.output
            text = isinstance(value, str) and value == outcome.text
            output = None if text else to_jsonable_python(value, by_alias=True)
            return summary.model_copy(update={"text": outcome.text, "output": output})
        if isinstance(outcome, BudgetExhausted):
            return summary.model_copy(update={"reason": outcome.reason, "window": outcome.window})
        if isinstance(outcome, Cancelled | Paused):
            return summary.model_copy(update={"reason": outcome.reason})
        if isinstance(outcome, OutputInvalid):
            return summary.model_copy(update={"reason": outcome.message})
        if isinstance(outcome, LoopDetected):
            return summary.model_copy(update={"tool": outcome.tool, "repeats": outcome.repeats})
        if isinstance(outcome, AwaitingApproval):
            return summary.model_copy(update={"awaiting": pending_approvals(outcome)})
        return summary


def pending_approvals(outcome: AwaitingApproval) -> list[PendingApproval]:
    """The calls a paused run waits on, with their arguments redacted."""
    return [
        PendingApproval(
            call_id=p.call.id,
            name=p.call.name,
            arguments=redact(p.call.arguments),
            reason=p.status.reason,
        )
        for p in outcome.state.pending
        if isinstance(p.status, NeedsApproval)
    ]


class RunEnded(_Event):
    """The last event of every run: how it ended, or the error that ended it.

    ``outcome`` is the full outcome (a paused run's state included) for consumers in the same
    process; it is never serialised. What crosses a process boundary is ``summary``.
    """

    type: Literal["run_end"] = "run_end"
    summary: OutcomeSummary | None = None
    error: ErrorInfo | None = None
    outcome: AgentOutcome | None = Field(default=None, exclude=True, repr=False)

    @classmethod
    def of(cls, run_id: str, outcome: AgentOutcome) -> RunEnded:
        return cls(run_id=run_id, summary=OutcomeSummary.of(outcome), outcome=outcome)


class PacingWait(_Event):
    """The model call waited ``wait_seconds`` before it was sent, for the ``limit`` (requests
    or tokens per minute) of ``provider`` and ``model`` (see ``agent_plugin.pacing``)."""

    type: Literal["pacing_wait"] = "pacing_wait"
    wait_seconds: float
    limit: Literal["requests", "tokens"]
    provider: str
    model: str


class BudgetSpent(_Event):
    """A model call's cost (``None``: unpriced, its hold was kept) and, by window name
    (``session``, ``scope``, ``day``), what each of the run's windows has spent since."""

    type: Literal["budget_spent"] = "budget_spent"
    cost_usd: float | None
    windows: dict[str, float]


class BudgetWarning(_Event):
    """A window has spent ``warn_fraction`` of its limit (told once per run and window)."""

    type: Literal["budget_warning"] = "budget_warning"
    window: str
    spent_usd: float
    limit_usd: float


AgentEvent: TypeAlias = Annotated[
    RunStarted
    | TurnStarted
    | ModelRequestStarted
    | TextDeltaEvent
    | ThinkingDeltaEvent
    | ToolCallDeltaEvent
    | OutputDelta
    | RetryScheduled
    | RetrySucceeded
    | RetryExhausted
    | ModelFallback
    | ModelResponded
    | ToolStarted
    | ToolProgress
    | ToolFinished
    | ApprovalRequired
    | Steered
    | Compacted
    | TurnEnded
    | RunEnded
    | PacingWait
    | BudgetSpent
    | BudgetWarning,
    Field(discriminator="type"),
]

event_adapter: TypeAdapter[AgentEvent] = TypeAdapter(
    AgentEvent, config=ConfigDict(defer_build=True)
)
"""``event_adapter.validate_json(...)`` / ``.dump_json(...)`` for events on their own.

Built on first use (runs never need it), not when the package is imported."""


# --- plumbing --------------------------------------------------------------------------------


def public_message(message: ChatMessage) -> ChatMessage:
    """``message`` with its tool calls' arguments redacted, as events show it."""
    if not message.tool_calls:
        return message
    return message.model_copy(
        update={
            "content": [
                ToolCallPart(
                    tool_call=p.tool_call.model_copy(
                        update={"arguments": redact(p.tool_call.arguments), "raw_arguments": None}
                    )
                )
                if isinstance(p, ToolCallPart)
                else p
                for p in message.content
            ]
        }
    )


def tee(
    first: Callable[[AgentEvent], None], second: Callable[[AgentEvent], None] | None
) -> Callable[[AgentEvent], None]:
    """A sink that gives each event to ``first``, then to ``second`` (if any)."""
    if second is None:
        return first

    def both(event: AgentEvent) -> None:
        first(event)
        second(event)

    return both


async def events_of(
    start: Callable[[Callable[[AgentEvent], None]], Awaitable[AgentTurn]],
) -> AsyncIterator[AgentEvent]:
    """The events of the run ``start(sink)`` begins, up to its ``run_end``; leaving the
    iteration early cancels the run."""
    queue: asyncio.Queue[AgentEvent] = asyncio.Queue()
    task = asyncio.ensure_future(start(queue.put_nowait))
    try:
        while True:
            event = await queue.get()
            yield event
            if isinstance(event, RunEnded):
                break
        await task
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, AgentError):
                await task
