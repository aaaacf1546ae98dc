"""How a run ends, what a paused run remembers, and the decisions that resume it.

All of these are pydantic models whose JSON matches the seed's: outcomes are tagged by
``status``, pending-call statuses by ``status``, approvals by ``verdict``. A :class:`RunState`
can be stored in a database row or a job result and resumed in another process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Discriminator, Field, JsonValue, Tag, TypeAdapter

from agent_plugin.messages import ChatMessage, TokenUsage, ToolCall

__all__ = [
    "AgentOutcome",
    "AgentTurn",
    "Allowed",
    "Approval",
    "ApprovalDecision",
    "Approve",
    "AwaitingApproval",
    "BudgetExhausted",
    "BudgetReason",
    "Cancelled",
    "Completed",
    "Denied",
    "Edit",
    "Finished",
    "LoopDetected",
    "NeedsApproval",
    "Paused",
    "PendingCall",
    "PendingStatus",
    "Reject",
    "Rejected",
    "RunInfo",
    "RunState",
    "UnknownOutcome",
    "outcome_adapter",
]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


# --- pending calls -------------------------------------------------------------------------


class Allowed(_Model):
    status: Literal["allowed"] = "allowed"


class NeedsApproval(_Model):
    status: Literal["needs_approval"] = "needs_approval"
    reason: str


class Denied(_Model):
    status: Literal["denied"] = "denied"
    reason: str


class Rejected(_Model):
    """A reviewer rejected the call (or gave no decision for it)."""

    status: Literal["rejected"] = "rejected"
    reason: str


class Finished(_Model):
    """The call already ran; its output is kept so a resume never runs it twice."""

    status: Literal["finished"] = "finished"
    content: str
    is_error: bool = False


PendingStatus: TypeAlias = Annotated[
    Allowed | NeedsApproval | Denied | Rejected | Finished, Field(discriminator="status")
]


class PendingCall(_Model):
    call: ToolCall
    status: PendingStatus


class RunState(_Model):
    """Everything needed to resume a run paused for approval.

    The system prompt is not stored: the resuming agent rebuilds it, so a resume sees the
    memory snapshot as of the resume.
    """

    run_id: str
    session_id: str | None = None
    messages: list[ChatMessage]
    usage: TokenUsage = Field(default_factory=TokenUsage)
    steps_used: int = 0
    pending: list[PendingCall] = Field(default_factory=list)
    recent_calls: list[int] = Field(default_factory=list)
    history_length: int = 0
    """How many of ``messages`` were history before the run started (saved in a session)."""
    session_version: int | None = None
    """The session's version the run started from, so a resume can detect a concurrent writer."""

    def awaiting(self) -> list[PendingCall]:
        """The calls that wait for a reviewer's decision."""
        return [p for p in self.pending if isinstance(p.status, NeedsApproval)]


# --- approvals -----------------------------------------------------------------------------


def _verdict_required(schema: dict[str, Any]) -> None:
    """In JSON (a request body), a decision names its verdict: the union is told apart by it,
    so the schema requires it although Python code may leave it out."""
    required = schema.setdefault("required", [])
    if "verdict" not in required:
        required.insert(0, "verdict")


class Approve(_Model):
    model_config = ConfigDict(json_schema_extra=_verdict_required)

    verdict: Literal["approve"] = "approve"


class Edit(_Model):
    model_config = ConfigDict(json_schema_extra=_verdict_required)

    verdict: Literal["edit"] = "edit"
    arguments: JsonValue


class Reject(_Model):
    model_config = ConfigDict(json_schema_extra=_verdict_required)

    verdict: Literal["reject"] = "reject"
    reason: str


Approval: TypeAlias = Annotated[Approve | Edit | Reject, Field(discriminator="verdict")]


class ApprovalDecision(_Model):
    call_id: str
    approval: Approval

    @classmethod
    def approve(cls, call_id: str) -> ApprovalDecision:
        return cls(call_id=call_id, approval=Approve())

    @classmethod
    def edit(cls, call_id: str, arguments: JsonValue) -> ApprovalDecision:
        return cls(call_id=call_id, approval=Edit(arguments=arguments))

    @classmethod
    def reject(cls, call_id: str, reason: str) -> ApprovalDecision:
        return cls(call_id=call_id, approval=Reject(reason=reason))


# --- outcomes ------------------------------------------------------------------------------


class _Outcome(_Model):
    def is_completed(self) -> bool:
        return False


class Completed(_Outcome):
    status: Literal["completed"] = "completed"
    text: str
    steps_used: int
    usage: TokenUsage

    def is_completed(self) -> bool:
        return True


BudgetReason: TypeAlias = Literal["steps", "tokens", "deadline"]


class BudgetExhausted(_Outcome):
    status: Literal["budget_exhausted"] = "budget_exhausted"
    reason: BudgetReason
    steps_used: int
    usage: TokenUsage


class LoopDetected(_Outcome):
    status: Literal["loop_detected"] = "loop_detected"
    tool: str
    repeats: int
    steps_used: int
    usage: TokenUsage


class _Stopped(_Outcome):
    """An outcome that keeps the run's state so ``resume`` can continue it."""

    state: RunState

    @property
    def steps_used(self) -> int:
        return self.state.steps_used

    @property
    def usage(self) -> TokenUsage:
        return self.state.usage


class AwaitingApproval(_Stopped):
    status: Literal["awaiting_approval"] = "awaiting_approval"


class Paused(_Stopped):
    """A hook paused the run at a boundary; ``resume(state)`` continues it."""

    status: Literal["paused"] = "paused"
    reason: str


class Cancelled(_Outcome):
    status: Literal["cancelled"] = "cancelled"
    reason: str = "cancelled"
    steps_used: int
    usage: TokenUsage


class UnknownOutcome(_Outcome):
    """An outcome with a status this version does not know (written by a newer one)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    status: str
    steps_used: int = 0
    usage: TokenUsage = Field(default_factory=TokenUsage)


_KNOWN_STATUSES = frozenset(
    {"completed", "budget_exhausted", "loop_detected", "awaiting_approval", "paused", "cancelled"}
)


def _outcome_tag(value: Any) -> str:
    status = value.get("status") if isinstance(value, dict) else getattr(value, "status", None)
    return status if isinstance(status, str) and status in _KNOWN_STATUSES else "unknown"


AgentOutcome: TypeAlias = Annotated[
    Annotated[Completed, Tag("completed")]
    | Annotated[BudgetExhausted, Tag("budget_exhausted")]
    | Annotated[LoopDetected, Tag("loop_detected")]
    | Annotated[AwaitingApproval, Tag("awaiting_approval")]
    | Annotated[Paused, Tag("paused")]
    | Annotated[Cancelled, Tag("cancelled")]
    | Annotated[UnknownOutcome, Tag("unknown")],
    Discriminator(_outcome_tag),
]

outcome_adapter: TypeAdapter[AgentOutcome] = TypeAdapter(
    AgentOutcome, config=ConfigDict(defer_build=True)
)
"""``outcome_adapter.validate_json(...)`` / ``.dump_json(...)`` for outcomes on their own.

Built on first use (runs never need it), not when the package is imported."""


class AgentTurn(_Model):
    """What a run or resume returns: the outcome and the transcript without the system prompt.

    ``messages[history_length:]`` are the messages this run (and the runs it resumed) added
    to the history it was given: what a session store appends.
    """

    outcome: AgentOutcome
    messages: list[ChatMessage]
    history_length: int = 0

    @property
    def new_messages(self) -> list[ChatMessage]:
        return self.messages[self.history_length :]


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What hooks and policies are told about the run they are part of."""

    run_id: str
    session_id: str | None
    steps_used: int
    max_steps: int
    usage: TokenUsage
