"""What a background run's record says: :class:`RunStatus` and :class:`RunRecord`, the public
view that ``GET {prefix}/runs/{run_id}`` answers. The store that moves records between
statuses is :class:`agent_plugin.storage.SqlRunStore`.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from agent_plugin.errors import ErrorInfo
from agent_plugin.events import OutcomeSummary, PendingApproval
from agent_plugin.outcomes import AgentOutcome, AwaitingApproval, Cancelled, Paused

__all__ = ["RunPage", "RunRecord", "RunStatus", "status_of"]


class RunStatus(StrEnum):
    """Where a background run is (``agent_plugin.storage.runs`` has the moves between them)."""

    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    AWAITING_APPROVAL = "awaiting_approval"
    COMPLETE = "complete"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """Complete, failed or cancelled: nothing moves the run any more."""
        return self in _FINISHED


_FINISHED: Final = frozenset({RunStatus.COMPLETE, RunStatus.FAILED, RunStatus.CANCELLED})


class RunRecord(BaseModel):
    """The public view of one run: what ``GET {prefix}/runs/{run_id}`` answers.

    Never holds the transcript: ``outcome`` is a summary with tool arguments redacted, and
    ``awaiting`` lists the calls a paused run waits on (redacted too; empty otherwise).
    """

    model_config = ConfigDict(frozen=True)

    run_id: str
    status: RunStatus
    origin: str
    session_id: str | None = None
    memory_scope: str | None = None
    progress_pct: int = 0
    progress_message: str | None = None
    attempt: int = 0
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    outcome: OutcomeSummary | None = None
    error: ErrorInfo | None = None
    awaiting: list[PendingApproval] = Field(default_factory=list)


def status_of(outcome: AgentOutcome) -> RunStatus:
    """The record status an outcome leaves a run in.

    A pause (for approval or by a hook) is ``awaiting_approval``: it waits for a decision to
    resume. An outcome this version does not know (written by a newer one) counts as complete.
    """
    if isinstance(outcome, AwaitingApproval | Paused):
        return RunStatus.AWAITING_APPROVAL
    if isinstance(outcome, Cancelled):
        return RunStatus.CANCELLED
    return RunStatus.COMPLETE  # completed, budget_exhausted, loop_detected, unknown


class RunPage(BaseModel):
    """One page of runs, newest first; ``next_cursor`` fetches the next (``None``: no more)."""

    model_config = ConfigDict(frozen=True)

    runs: list[RunRecord]
    next_cursor: str | None = None
