"""How a run ends, what a paused run remembers, and the decisions that resume it.

All of these are pydantic models whose JSON matches the seed's: outcomes are tagged by
``status``, pending-call statuses by ``status``, approvals by ``verdict``. A :class:`RunState`
can be stored in a database row or a job result and resumed in another process.

A run's output type flows through the generics: ``Agent[T].run`` returns an ``AgentTurn[T]``
whose ``Completed[T]`` holds ``output: T`` (``str`` by default). Unparametrised, they hold any
output.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Generic, Literal, TypeAlias

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    Tag,
    TypeAdapter,
    model_serializer,
    model_validator,
)
from pydantic_core import to_jsonable_python
from typing_extensions import TypeAliasType, TypeVar

from agent_plugin.errors import AgentError
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
    "CompactionReport",
    "Completed",
    "Denied",
    "Edit",
    "Finished",
    "Folded",
    "LoopDetected",
    "NeedsApproval",
    "OutputInvalid",
    "OutputT",
    "Paused",
    "PendingCall",
    "PendingStatus",
    "Reject",
    "Rejected",
    "RunInfo",
    "RunState",
    "TurnSettings",
    "UnknownOutcome",
    "outcome_adapter",
]


OutputT = TypeVar("OutputT", default=Any, covariant=True)
"""The type of a run's output in :class:`Completed`, :class:`AgentTurn` and
:data:`AgentOutcome` (any, unparametrised)."""


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


class CompactionReport(BaseModel):
    """What a compaction did: how many messages it folded, the estimated tokens of the
    transcript before and after, and the usage of the summary call (not charged to any run)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    summarized_messages: int = Field(ge=1)
    tokens_before: int = Field(ge=0)
    tokens_after: int = Field(ge=0)
    usage: TokenUsage = Field(default_factory=TokenUsage)


class Folded(_Model):
    """The head of a run's history that the run folded into one summary (the model said the
    context was too long): ``report.summarized_messages`` messages of the history the run
    was given. A session saves it as a compaction entry with the run's messages."""

    summary: str
    report: CompactionReport


class TurnSettings(_Model):
    """What a ``prepare_next_turn`` hook set for the run's next requests (``None``: as the
    agent is): the model name, the names of the tools offered, a section added to the system
    prompt, and provider fields merged into the request body."""

    model: str | None = None
    tools: list[str] | None = None
    system_prompt_addition: str | None = None
    extra_body: dict[str, JsonValue] = Field(default_factory=dict)


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
    session_leaf: int | None = Field(default=None, exclude_if=lambda v: v is None)
    """The session entry the run continues (``None``: the head), where its resume saves it."""
    session_lock: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """The prefix fingerprint of the session's lock when the run paused (``None``: unlocked):
    a resume must bring the same system prompt and tools."""
    output: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """The output type the run must produce (its label, ``Ticket``); ``None``: plain text. A
    resume checks that its agent produces the same."""
    output_retries: int = Field(default=0, exclude_if=lambda v: v == 0)
    """How many replies were sent back to the model because they gave no valid output."""
    folded: Folded | None = Field(default=None, exclude_if=lambda v: v is None)
    """The head of the history the run folded into a summary so far (``None``: none)."""
    turn_settings: TurnSettings | None = Field(default=None, exclude_if=lambda v: v is None)
    """What turn-level hooks set for the next requests (``None``: nothing)."""
    trace: dict[str, str] = Field(default_factory=dict, exclude_if=lambda v: not v)
    """The paused run's span as W3C trace headers (empty without tracing): its resume links
    to it."""

    def awaiting(self) -> list[PendingCall]:
        """The calls that wait for a reviewer's decision."""
        return [p for p in self.pending if isinstance(p.status, NeedsApproval)]

    def decided(self, decisions: Iterable[ApprovalDecision]) -> list[PendingCall]:
        """The pending calls with reviewers' ``decisions`` applied: approved and edited calls
        are allowed (an edit replaces the arguments), rejected ones and those that await
        approval without a decision are rejected; the first decision for a call counts.

        A decision that names a call not awaiting approval is a ``config``
        :class:`~agent_plugin.errors.AgentError`.
        """
        decisions = list(decisions)
        awaiting = {p.call.id for p in self.awaiting()}
        for decision in decisions:
            if decision.call_id not in awaiting:
                raise AgentError.config(
                    f"call {decision.call_id!r} is not awaiting approval in run {self.run_id!r}"
                )
        first: dict[str, Approval] = {}
        for decision in decisions:
            first.setdefault(decision.call_id, decision.approval)
        resolved: list[PendingCall] = []
        for pending in self.pending:
            if not isinstance(pending.status, NeedsApproval):
                resolved.append(pending)
                continue
            approval = first.get(pending.call.id)
            if approval is None:
                resolved.append(
                    pending.model_copy(update={"status": Rejected(reason="no decision was given")})
                )
            elif isinstance(approval, Reject):
                resolved.append(
                    pending.model_copy(update={"status": Rejected(reason=approval.reason)})
                )
            elif isinstance(approval, Edit):
                call = pending.call.model_copy(
                    update={"arguments": approval.arguments, "raw_arguments": None}
                )
                resolved.append(PendingCall(call=call, status=Allowed()))
            else:
                resolved.append(pending.model_copy(update={"status": Allowed()}))
        return resolved


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


class Completed(_Outcome, Generic[OutputT]):
    """The run gave its answer: ``output``, validated as the run's output type (for a plain
    text run, the text), and ``text`` (the answer's text; a typed output's JSON).

    In JSON, ``output`` is left out when it is the text itself, as the seed writes a
    completed outcome; reading such JSON back sets it to the text.
    """

    status: Literal["completed"] = "completed"
    text: str
    output: OutputT = None  # type: ignore[assignment]  # the text when not given
    steps_used: int
    usage: TokenUsage

    @model_validator(mode="before")
    @classmethod
    def _text_is_the_default_output(cls, data: Any) -> Any:
        if isinstance(data, dict) and "output" not in data and "text" in data:
            return {**data, "output": data["text"]}
        return data

    @model_serializer(mode="wrap")
    def _output_only_when_not_the_text(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            if isinstance(self.output, str) and self.output == self.text:
                data.pop("output", None)
            elif info.mode_is_json() and "output" in data:
                data["output"] = to_jsonable_python(self.output, by_alias=True)
        return data

    def is_completed(self) -> bool:
        return True


BudgetReason: TypeAlias = Literal["steps", "tokens", "deadline", "cost", "window"]


class BudgetExhausted(_Outcome):
    """The run stopped at a limit: ``reason`` names it, and ``window`` (``session``,
    ``scope`` or ``day``) the spending window when the reason is ``window``."""

    status: Literal["budget_exhausted"] = "budget_exhausted"
    reason: BudgetReason
    window: str | None = Field(default=None, exclude_if=lambda v: v is None)
    steps_used: int
    usage: TokenUsage


class LoopDetected(_Outcome):
    status: Literal["loop_detected"] = "loop_detected"
    tool: str
    repeats: int
    steps_used: int
    usage: TokenUsage


class OutputInvalid(_Outcome):
    """The run's answer never validated as its output type: ``message`` says what was wrong
    with the last reply, after ``retries`` replies were sent back to be fixed."""

    status: Literal["output_invalid"] = "output_invalid"
    message: str
    retries: int
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
    {
        "completed",
        "budget_exhausted",
        "loop_detected",
        "output_invalid",
        "awaiting_approval",
        "paused",
        "cancelled",
    }
)


def _outcome_tag(value: Any) -> str:
    status = value.get("status") if isinstance(value, dict) else getattr(value, "status", None)
    return status if isinstance(status, str) and status in _KNOWN_STATUSES else "unknown"


AgentOutcome = TypeAliasType(
    "AgentOutcome",
    Annotated[
        Annotated[Completed[OutputT], Tag("completed")]
        | Annotated[BudgetExhausted, Tag("budget_exhausted")]
        | Annotated[LoopDetected, Tag("loop_detected")]
        | Annotated[OutputInvalid, Tag("output_invalid")]
        | Annotated[AwaitingApproval, Tag("awaiting_approval")]
        | Annotated[Paused, Tag("paused")]
        | Annotated[Cancelled, Tag("cancelled")]
        | Annotated[UnknownOutcome, Tag("unknown")],
        Discriminator(_outcome_tag),
    ],
    type_params=(OutputT,),
)
"""How a run ended, told apart by ``status``; ``AgentOutcome[T]`` when its output is a ``T``."""

outcome_adapter: TypeAdapter[AgentOutcome] = TypeAdapter(
    AgentOutcome, config=ConfigDict(defer_build=True)
)
"""``outcome_adapter.validate_json(...)`` / ``.dump_json(...)`` for outcomes on their own.

Built on first use (runs never need it), not when the package is imported."""


class AgentTurn(_Model, Generic[OutputT]):
    """What a run or resume returns: the outcome and the transcript without the system prompt.

    ``messages[history_length:]`` are the messages this run (and the runs it resumed) added
    to the history it was given: what a session store appends. ``AgentTurn[T]`` is the turn
    of an ``Agent[T]``: a completed outcome's ``output`` is a ``T``.
    """

    outcome: AgentOutcome[OutputT]
    messages: list[ChatMessage]
    history_length: int = 0
    folded: Folded | None = None
    """The head of the given history the run folded into a summary (it had grown past the
    model's context): ``messages`` starts with that summary then."""

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
