"""Runs paused for approval: reviewers' decisions accepted once, against exactly one pause.

:meth:`PausedRuns.take_paused_state` validates the decisions against the state it read and
then moves the run on only if the record's ``version`` is still the one it read
(compare-and-set), so a decision is accepted once however many requests race. The accepted
decisions are kept with the record for the resume job (:meth:`PausedRuns.pending_resume`).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy import exc

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import OutcomeSummary
from agent_plugin.outcomes import ApprovalDecision, RunState
from agent_plugin.records import RunStatus
from agent_plugin.storage.database import Database
from agent_plugin.storage.models import utcnow
from agent_plugin.storage.run_sql import (
    DECISIONS,
    NAME_MAX,
    PLACE_TRIES,
    RUNS,
    STATE,
    as_text,
    check_text,
    decode_error,
    decode_json,
    kept_changing,
    next_in_session,
    not_found,
    not_paused,
    read_status,
)

__all__ = ["PausedRuns", "check_decisions"]


class PausedRuns:
    """The approval moves of :class:`~agent_plugin.storage.runs.SqlRunStore`."""

    database: Database

    async def take_paused_state(
        self, run_id: str, decisions: Sequence[ApprovalDecision], *, job_id: str | None = None
    ) -> RunState:
        """Accept reviewers' decisions for a paused run: ``awaiting_approval`` -> ``queued``.

        Every decision must name a call that awaits approval, at most once; otherwise
        ``CONFLICT`` listing the awaiting call ids, and nothing changes. A run that is not
        paused: ``CONFLICT`` (``run <id> is <status>, not awaiting approval``), so a second
        request for the same pause is refused: a decision is accepted once. Unknown run:
        ``NOT_FOUND``. Returns the stored state; the decisions are stored with the record for
        the resume job (:meth:`pending_resume`), whose arq job id is ``job_id`` (from then on
        only that job's deliveries may start the run; ``None``: any delivery of the resume).
        """
        decided = list(decisions)
        async with self.database.read() as conn:
            head = (
                await conn.execute(
                    sa.select(RUNS.status, RUNS.version, as_text(RUNS.state)).where(
                        RUNS.run_id == run_id
                    )
                )
            ).one_or_none()
        if head is None:
            raise not_found(run_id)
        status, version, state_text = head
        if status != RunStatus.AWAITING_APPROVAL.value:
            raise not_paused(run_id, status)
        state = decode_json(run_id, "state", state_text, STATE)
        if state is None:
            raise decode_error(run_id, "state", "a paused run has no stored state")
        check_decisions(run_id, state, decided)
        check_text("job_id", job_id, NAME_MAX)
        session_id = await self.session_of(run_id)
        update = (
            sa.update(RUNS)
            .where(RUNS.run_id == run_id, RUNS.version == version)
            .values(
                status=RunStatus.QUEUED.value,
                version=version + 1,
                decisions=[d.model_dump(mode="json") for d in decided],
                outcome=sa.null(),
                job_id=job_id,
                lease_until=sa.null(),
                session_seq=next_in_session(session_id),  # the resume queues behind the rest
                updated_at=utcnow(),
            )
        )
        for _ in range(PLACE_TRIES):
            try:
                async with self.database.write() as conn:
                    if (await conn.execute(update)).rowcount == 1:
                        return state
                    now_status = await read_status(conn, run_id)
                break
            except exc.IntegrityError:  # another run of the session took that place: again
                continue
        else:
            raise kept_changing(run_id, "resumed")
        if now_status is None:
            raise not_found(run_id)
        if now_status == RunStatus.AWAITING_APPROVAL.value:
            raise AgentError(
                ErrorKind.CONFLICT,
                f"run {run_id} paused again while the decisions were checked; "
                "read it again and decide on the calls it awaits now",
            )
        raise not_paused(run_id, now_status)

    async def session_of(self, run_id: str) -> str | None:
        async with self.database.read() as conn:
            return await conn.scalar(sa.select(RUNS.session_id).where(RUNS.run_id == run_id))

    async def return_paused_state(self, run_id: str, outcome: OutcomeSummary | None) -> bool:
        """Undo :meth:`take_paused_state` when the resume could not be queued: the run awaits
        approval again, with ``outcome`` (its summary before) and no decisions, so reviewers can
        decide again. ``False`` when the run is no longer queued with decisions (nothing
        changes then)."""
        update = (
            sa.update(RUNS)
            .where(
                RUNS.run_id == run_id,
                RUNS.status == RunStatus.QUEUED.value,
                RUNS.decisions.is_not(None),
            )
            .values(
                status=RunStatus.AWAITING_APPROVAL.value,
                version=RUNS.version + 1,
                decisions=sa.null(),
                job_id=sa.null(),
                outcome=outcome.model_dump(mode="json") if outcome is not None else sa.null(),
                updated_at=utcnow(),
            )
        )
        async with self.database.write() as conn:
            return bool((await conn.execute(update)).rowcount)

    async def pending_resume(self, run_id: str) -> tuple[RunState, list[ApprovalDecision]] | None:
        """The paused state and the decisions accepted for it, until the resume finishes.

        ``None`` when no decision is waiting to be resumed (or there is no such run).
        """
        async with self.database.read() as conn:
            row = (
                await conn.execute(
                    sa.select(as_text(RUNS.state), as_text(RUNS.decisions)).where(
                        RUNS.run_id == run_id
                    )
                )
            ).one_or_none()
        if row is None:
            return None
        state = decode_json(run_id, "state", row[0], STATE)
        decided = decode_json(run_id, "decisions", row[1], DECISIONS)
        if state is None or decided is None:
            return None
        return state, decided


def check_decisions(run_id: str, state: RunState, decisions: list[ApprovalDecision]) -> None:
    awaiting = [p.call.id for p in state.awaiting()]
    waiting = _listed(awaiting) if awaiting else "none"
    if len(decisions) > len(awaiting):
        raise AgentError(
            ErrorKind.CONFLICT,
            f"run {run_id!r}: {len(decisions)} decisions for {len(awaiting)} call(s) awaiting "
            f"approval; give at most one per call (awaiting: {waiting})",
        )
    waits = set(awaiting)
    seen: set[str] = set()
    unknown: list[str] = []
    twice: list[str] = []
    for decision in decisions:
        if decision.call_id not in waits:
            unknown.append(decision.call_id)
        elif decision.call_id in seen:
            twice.append(decision.call_id)
        seen.add(decision.call_id)
    if unknown:
        raise AgentError(
            ErrorKind.CONFLICT,
            f"run {run_id!r}: no call awaits approval with id {_listed(unknown)}; "
            f"awaiting: {waiting}",
        )
    if twice:
        raise AgentError(
            ErrorKind.CONFLICT,
            f"run {run_id!r}: more than one decision for {_listed(twice)}; "
            f"give one decision per call (awaiting: {waiting})",
        )


def _listed(ids: Sequence[str], most: int = 5) -> str:
    """``ids`` for an error message: the first ``most`` (each cut at 80 characters), then how
    many more, so a message stays short whatever a client sent."""
    shown = [i if len(i) <= 80 else i[:80] + "…" for i in ids[:most]]
    more = f" and {len(ids) - most} more" if len(ids) > most else ""
    return ", ".join(shown) + more
