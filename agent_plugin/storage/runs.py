"""Durable records of background runs and their step checkpoints, on SQLite or PostgreSQL.

A run's record (a row of ``agent_runs``) moves like this; any other move is ``CONFLICT``::

    move               from                                 to
    create             (nothing)                            queued
    start              queued, in_progress (a re-delivery)  in_progress   (attempt + 1, leased)
    progress           in_progress                          (progress only)
    finish             queued, in_progress                  complete | awaiting_approval | cancelled
    fail               queued, in_progress                  failed
    requeue            in_progress                          queued        (a retry is coming)
    take_paused_state  awaiting_approval                    queued        (decisions stored)
    cancel             queued, awaiting_approval            cancelled

Every move bumps the record's ``version`` (compare-and-set). Leases, checkpoints and what a
record shows: ``docs/guide/background-runs.md``; the approval moves: :mod:`.run_approvals`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, TypeVar

import sqlalchemy as sa
from pydantic_core import PydanticSerializationError, to_jsonable_python
from sqlalchemy import exc

from agent_plugin.errors import AgentError, ErrorInfo, ErrorKind, SessionTaken
from agent_plugin.events import OutcomeSummary
from agent_plugin.journal import JournalEntry
from agent_plugin.messages import TokenUsage
from agent_plugin.outcomes import AgentOutcome, AwaitingApproval, Paused
from agent_plugin.records import RunPage, RunRecord, RunStatus, status_of
from agent_plugin.storage.checkpoints import ProgressRule, SqlRunJournal, decode_entry
from agent_plugin.storage.database import Database
from agent_plugin.storage.leased_journal import LeasedRunJournal, Persist
from agent_plugin.storage.models import utcnow
from agent_plugin.storage.run_approvals import PausedRuns
from agent_plugin.storage.run_sql import (
    ARGS,
    ARGS_OF,
    CHECKPOINTS,
    CREATE,
    GET,
    MAX_PAGE,
    NAME_MAX,
    PLACE_TRIES,
    PROGRESS,
    PROGRESS_FORWARD,
    RECORD_COLUMNS,
    RUNNABLE,
    RUNS,
    STARTS,
    SUMMARY,
    as_text,
    check_text,
    conflict_error,
    database_now,
    decode_error,
    decode_json,
    from_now,
    insert_ignoring_duplicates,
    kept_changing,
    make_cursor,
    next_in_session,
    not_found,
    progress_values,
    read_cursor,
    read_status,
    record_of,
)
from agent_plugin.storage.session_turns import session_held

__all__ = ["SqlRunJournal", "SqlRunStore", "StalledRun", "database_now"]

_RUN_ID_MAX: Final = 64
_ORIGIN_MAX: Final = 64

T = TypeVar("T")


_CANCELLABLE: Final = (RunStatus.QUEUED, RunStatus.AWAITING_APPROVAL)
_CANCEL_TRIES: Final = 3
_START_TRIES: Final = 3


@dataclass(frozen=True, slots=True)
class StalledRun:
    """A run that should have a job on the queue (see :meth:`SqlRunStore.stalled`)."""

    run_id: str
    job_id: str
    resume: bool
    """Its job is the resume after approval (``agent_resume``), not ``agent_run``."""
    updated_at: datetime


class SqlRunStore(PausedRuns):
    """Run records and step checkpoints in the plugin's tables, through a shared
    :class:`Database`.

    Errors are :class:`AgentError`: ``NOT_FOUND`` for an unknown run, ``CONFLICT`` for a move
    the run's status does not allow (the message names the status), ``CONFIG`` for bad
    arguments, ``DECODE`` (naming the run and the column) for a stored value that no longer
    decodes, ``UNAVAILABLE`` when the database cannot be reached.
    """

    def __init__(self, database: Database) -> None:
        self.database = database

    def __repr__(self) -> str:
        return f"SqlRunStore({self.database.display_url!r})"

    # --- records ---------------------------------------------------------------------------

    async def create(
        self,
        run_id: str,
        *,
        origin: str,
        args: Mapping[str, Any],
        session_id: str | None = None,
        memory_scope: str | None = None,
        job_id: str | None = None,
        not_before: float | None = None,
    ) -> bool:
        """Record a new queued run; ``False`` (nothing changed) if ``run_id`` already exists.

        ``args`` are the job's arguments as JSON-able data (:meth:`args` gives them back to a
        retry or a resume). ``job_id`` is the arq job that will run it (default: the run id);
        ``not_before``: the job is due that many seconds from now (no delivery may start the
        run before then). Enqueueing the same run twice is a no-op.
        """
        _check_run_id(run_id)
        check_text("origin", origin, _ORIGIN_MAX, required=True)
        check_text("session_id", session_id, NAME_MAX)
        check_text("memory_scope", memory_scope, NAME_MAX)
        check_text("job_id", job_id, NAME_MAX)
        stored_args = _json_args(run_id, args)
        if session_id is None:  # no place to take in a session: the statement built once
            now = utcnow()
            values: dict[str, Any] = {
                "new_run_id": run_id,
                "new_origin": origin,
                "new_session_id": session_id,
                "new_memory_scope": memory_scope,
                "new_args": stored_args,
                "new_job_id": job_id or run_id,
                "new_created_at": now,
                "new_updated_at": now,
            }
            if not_before:
                values["delay"] = float(not_before)
            insert = CREATE[self.database.dialect, bool(not_before)]
            return await self.database.write_prebuilt(insert, values) == 1
        # a run of a session takes the next place in its session's queue
        for _ in range(PLACE_TRIES):
            now = utcnow()
            try:
                async with self.database.write() as conn:
                    insert = insert_ignoring_duplicates(conn).values(
                        run_id=run_id,
                        status=RunStatus.QUEUED.value,
                        origin=origin,
                        session_id=session_id,
                        session_seq=next_in_session(session_id),
                        memory_scope=memory_scope,
                        progress_pct=0,
                        attempt=0,
                        version=0,
                        args=stored_args,
                        job_id=job_id or run_id,
                        lease_until=from_now(not_before) if not_before else None,
                        created_at=now,
                        updated_at=now,
                    )
                    return (await conn.execute(insert)).rowcount == 1
            except exc.IntegrityError:  # a run of the session enqueued at the same moment
                continue  # took the place: take the next one
        raise kept_changing(run_id, "enqueued")

    async def get(self, run_id: str) -> RunRecord | None:
        """The run's public record, or ``None`` if there is no such run."""
        async with self.database.alone(write=False) as conn:
            row = (await conn.execute(GET, {"run": run_id})).one_or_none()
        return record_of(row._mapping) if row is not None else None

    async def discard(self, run_id: str) -> bool:
        """Delete a run that never left the queue (``queued``, never started): what an
        enqueue does when its job could not be queued, so that nothing is recorded for it and
        the same run id can be enqueued again. ``False`` when the run is not such a run."""
        delete = sa.delete(RUNS).where(
            RUNS.run_id == run_id,
            RUNS.status == RunStatus.QUEUED.value,
            RUNS.attempt == 0,
        )
        return bool(await self.database.write_one(delete, {}))

    async def args(self, run_id: str) -> dict[str, Any]:
        """The job arguments stored by :meth:`create`; ``NOT_FOUND`` for an unknown run."""
        async with self.database.alone(write=False) as conn:
            row = (await conn.execute(ARGS_OF, {"run": run_id})).one_or_none()
        if row is None:
            raise not_found(run_id)
        args = decode_json(run_id, "args", row[0], ARGS)
        if args is None:
            raise decode_error(run_id, "args", "the run has no stored arguments")
        return args

    async def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        session_id: str | None = None,
        origin: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> RunPage:
        """Runs, newest first, ``limit`` at a time (1..200), optionally of one ``status``,
        ``session_id`` or ``origin``; ``cursor`` (a page's ``next_cursor``) continues after that
        page. A cursor this store did not make is an ``invalid`` error."""
        if not 1 <= limit <= MAX_PAGE:
            raise AgentError(ErrorKind.INVALID, f"limit must be from 1 to {MAX_PAGE}, got {limit}")
        query = sa.select(*RECORD_COLUMNS)
        if status is not None:
            query = query.where(RUNS.status == RunStatus(status).value)
        if session_id is not None:
            query = query.where(RUNS.session_id == session_id)
        if origin is not None:
            query = query.where(RUNS.origin == origin)
        if cursor is not None:
            created_at, run_id = read_cursor(cursor)
            query = query.where(
                sa.tuple_(RUNS.created_at, RUNS.run_id) < sa.tuple_(created_at, run_id)
            )
        query = query.order_by(RUNS.created_at.desc(), RUNS.run_id.desc()).limit(limit + 1)
        async with self.database.read() as conn:
            rows = (await conn.execute(query)).all()
        records = [record_of(row._mapping) for row in rows[:limit]]
        more = len(rows) > limit
        last = records[-1] if records else None
        next_cursor = make_cursor(last.created_at, last.run_id) if more and last else None
        return RunPage(runs=records, next_cursor=next_cursor)

    async def session_turn(self, session_id: str, run_id: str) -> bool:
        """Whether it is ``run_id``'s turn in session ``session_id``: no other run of the
        session is in progress, and none enqueued before it still waits to run: queued and due,
        or waiting for its retry or its resume (a run booked for later that has never started
        does not hold the turn until it is due). Runs of a session so start in the order they
        were enqueued (their ``session_seq``), whatever Redis remembers."""
        return not await session_held(self.database, session_id, besides=run_id)

    async def session_held(
        self, session_id: str, *, besides: str | None = None, reserved: bool = False
    ) -> bool:
        """Whether another run of ``session_id`` holds it (see
        :func:`agent_plugin.storage.session_turns.session_held`): one query."""
        return await session_held(self.database, session_id, besides=besides, reserved=reserved)

    async def start(
        self,
        run_id: str,
        *,
        job_id: str | None = None,
        lease: float | None = None,
        resume: bool = False,
    ) -> RunRecord:
        """A worker starts (or, after a crash, restarts) the run: ``in_progress``.

        Counts the attempt and sets ``started_at`` the first time. A run that is not queued or
        in progress (finished, paused, cancelled) is not started again: ``CONFLICT``, so a
        re-delivered job for a finished run does nothing. Unknown run: ``NOT_FOUND``.

        * ``job_id``: the arq job of the delivery; a run that belongs to another job (a stale
          delivery of its own job once a resume is queued) is refused: ``CONFLICT``.
        * ``lease``: seconds the delivery holds the run (renew with :meth:`renew_lease`).
          While another delivery's lease (or a retry's backoff) lasts, the run is refused with
          ``CONFLICT`` whose ``retry_after`` says how long it still lasts. Without a lease,
          nothing holds the run once started.
        * ``resume``: decisions accepted for a paused run are its resume's; any other delivery
          is refused (``CONFLICT``), since a stale delivery of the paused run would run the
          approved calls a second time.

        A run of a session whose other run is in progress is refused by the database:
        :class:`~agent_plugin.errors.SessionTaken` (a ``CONFLICT``; wait for the turn).
        """
        statement = STARTS[job_id is not None, not resume]
        for _ in range(_START_TRIES):
            values = {"run": run_id, "now": utcnow(), "job": job_id, "lease": lease or 0.0}
            try:
                async with self.database.alone(write=True) as conn:
                    row = (await conn.execute(statement, values)).one_or_none()
            except exc.IntegrityError:  # the one-run-in-progress-per-session index
                raise SessionTaken(run_id) from None
            if row is not None:
                return record_of(row._mapping)
            refusal = await self._start_refusal(run_id, job_id, resume=resume)
            if refusal is not None:
                raise refusal
        raise AgentError(
            ErrorKind.CONFLICT, f"run {run_id} kept changing while being started; try again"
        )

    async def open_run(
        self, run_id: str, *, job_id: str | None = None, lease: float | None = None
    ) -> tuple[dict[str, Any], RunRecord | None]:
        """What a delivery does first, in one transaction: read the run's stored arguments
        (as :meth:`args`) and, for a run of no session that is not a resume's, start it (as
        :meth:`start`). The record is ``None`` when the run was not started: it has a session
        (start it when its turn comes) or decisions, or the start was refused (:meth:`start`
        says why)."""
        async with self.database.write() as conn:
            row = (
                await conn.execute(
                    sa.select(as_text(RUNS.args), RUNS.session_id).where(RUNS.run_id == run_id)
                )
            ).one_or_none()
            if row is None:
                raise not_found(run_id)
            args = decode_json(run_id, "args", row[0], ARGS)
            if args is None:
                raise decode_error(run_id, "args", "the run has no stored arguments")
            if row[1] is not None:
                return args, None
            values = {"run": run_id, "now": utcnow(), "job": job_id, "lease": lease or 0.0}
            started = (await conn.execute(STARTS[job_id is not None, True], values)).one_or_none()
        return args, record_of(started._mapping) if started is not None else None

    async def renew_lease(self, run_id: str, *, attempt: int, lease: float) -> bool:
        """Extend the lease of the delivery that started ``attempt`` to ``lease`` seconds from
        now; ``False`` when the run is no longer in progress at that attempt (it ended, or a
        later delivery took it over)."""
        update = (
            sa.update(RUNS)
            .where(
                RUNS.run_id == run_id,
                RUNS.attempt == attempt,
                RUNS.status == RunStatus.IN_PROGRESS.value,
            )
            .values(lease_until=from_now(lease))
        )
        return bool(await self.database.write_one(update, {}))

    async def stalled(
        self, older_than: float, *, page: int = 500
    ) -> AsyncIterator[list[StalledRun]]:
        """Runs that should have a job on the queue, ``page`` at a time, oldest first: queued,
        due and unchanged for ``older_than`` seconds, or in progress under a lease that ran out
        that long ago. A run whose job is missing from Redis (lost in a Redis restart, dropped
        by arq as expired, never enqueued because the app died after recording it) is among
        them; a reconciler enqueues its job again (:meth:`agent_plugin.jobs.RunQueue.reconcile`).
        Runs booked for later are not, until they are due.
        """
        before = utcnow() - timedelta(seconds=older_than)
        lapsed = RUNS.lease_until < from_now(-older_than)
        query = (
            sa.select(
                RUNS.run_id,
                RUNS.job_id,
                RUNS.decisions.is_not(None),
                RUNS.updated_at,
            )
            .where(
                RUNS.job_id.is_not(None),
                sa.or_(
                    sa.and_(
                        RUNS.status == RunStatus.QUEUED.value,
                        RUNS.updated_at < before,
                        sa.or_(RUNS.lease_until.is_(None), lapsed),
                    ),
                    sa.and_(
                        RUNS.status == RunStatus.IN_PROGRESS.value,
                        sa.or_(
                            lapsed, sa.and_(RUNS.lease_until.is_(None), RUNS.updated_at < before)
                        ),
                    ),
                ),
            )
            .order_by(RUNS.updated_at, RUNS.run_id)
            .limit(page)
        )
        after: tuple[datetime, str] | None = None
        while True:
            keyset = query
            if after is not None:
                keyset = query.where(sa.tuple_(RUNS.updated_at, RUNS.run_id) > sa.tuple_(*after))
            async with self.database.read() as conn:
                rows = (await conn.execute(keyset)).all()
            runs = [
                StalledRun(run_id, job_id, bool(resume), updated_at)
                for run_id, job_id, resume, updated_at in rows
                if job_id is not None  # (the query asks for it; the type does not know)
            ]
            if runs:
                yield runs
            if len(rows) < page:
                return
            after = (rows[-1].updated_at, rows[-1].run_id)

    async def progress(
        self, run_id: str, pct: int, message: str, *, forward_only: bool = False
    ) -> None:
        """Report progress of a run in progress (one ``UPDATE``; ``pct`` is kept in 0..100).

        Ignored when the run is no longer in progress (a late report changes nothing), and
        with ``forward_only`` when the record's percentage is already higher; ``NOT_FOUND``
        for an unknown run.
        """
        statement = PROGRESS_FORWARD if forward_only else PROGRESS
        async with self.database.write() as conn:
            if (await conn.execute(statement, progress_values(run_id, pct, message))).rowcount:
                return
            if await read_status(conn, run_id) is None:
                raise not_found(run_id)

    async def finish(
        self,
        run_id: str,
        outcome: AgentOutcome,
        *,
        attempt: int | None = None,
        progress: tuple[int, str] | None = None,
    ) -> RunRecord:
        """Record how a queued or running run ended, and move it to the outcome's status.

        The public record gets ``OutcomeSummary.of(outcome)``; a paused run's ``RunState`` is
        kept server-side for :meth:`take_paused_state`. Accepted decisions of a previous pause
        are cleared. A run in any other status: ``CONFLICT``. With ``attempt`` (a worker's
        delivery), only that attempt may: a delivery a later one took over gets ``CONFLICT``.
        ``progress`` is the ``(pct, message)`` the record ends with (a complete run's
        percentage is 100 whatever it says).
        """
        status = status_of(outcome)
        state = outcome.state if isinstance(outcome, AwaitingApproval | Paused) else None
        now = utcnow()
        values: dict[str, Any] = {
            "status": status.value,
            "outcome": OutcomeSummary.of(outcome).model_dump(mode="json"),
            "state": state.model_dump(mode="json") if state is not None else sa.null(),
            "decisions": sa.null(),
            "error": sa.null(),
            "lease_until": sa.null(),
            "updated_at": now,
        }
        if status.finished:
            values["finished_at"] = now
        if progress is not None:
            values["progress_pct"] = min(max(int(progress[0]), 0), 100)
            values["progress_message"] = progress[1]
        if status is RunStatus.COMPLETE:
            values["progress_pct"] = 100
        return await self._move(run_id, "finish", RUNNABLE, attempt=attempt, **values)

    async def fail(self, run_id: str, error: ErrorInfo, *, attempt: int | None = None) -> RunRecord:
        """Record the typed error that ended a queued or running run: ``failed`` (``attempt``
        as for :meth:`finish`)."""
        now = utcnow()
        return await self._move(
            run_id,
            "fail",
            RUNNABLE,
            attempt=attempt,
            status=RunStatus.FAILED.value,
            error=error.model_dump(mode="json"),
            outcome=sa.null(),
            state=sa.null(),
            decisions=sa.null(),
            lease_until=sa.null(),
            finished_at=now,
            updated_at=now,
        )

    async def requeue(
        self, run_id: str, *, attempt: int | None = None, not_before: float | None = None
    ) -> None:
        """A running run goes back to ``queued`` because a retry is coming (queued: no-op;
        ``attempt`` as for :meth:`finish`). With ``not_before``, no delivery may start it for
        that many seconds (the retry's backoff, kept even if its worker dies before arq
        defers the job)."""
        where = [RUNS.run_id == run_id, RUNS.status == RunStatus.IN_PROGRESS.value]
        if attempt is not None:
            where.append(RUNS.attempt == attempt)
        now = utcnow()
        update = (
            sa.update(RUNS)
            .where(*where)
            .values(
                status=RunStatus.QUEUED.value,
                version=RUNS.version + 1,
                lease_until=from_now(not_before) if not_before else None,
                updated_at=now,
            )
        )
        async with self.database.write() as conn:
            if (await conn.execute(update)).rowcount == 1:
                return
            status = await read_status(conn, run_id)
        if status is None:
            raise not_found(run_id)
        if status != RunStatus.QUEUED.value:
            raise conflict_error(run_id, status, "requeue it")

    async def cancel(self, run_id: str, reason: str) -> RunRecord:
        """Cancel a run that is queued or awaiting approval; its record says ``reason``.

        A run in progress is not cancelled here (its worker owns it) and a finished run stays
        as it ended: both ``CONFLICT``. The paused state and any accepted decisions are dropped.
        """
        record, _ = await self.cancel_waiting(run_id, reason)
        return record

    async def cancel_waiting(self, run_id: str, reason: str) -> tuple[RunRecord, str | None]:
        """:meth:`cancel`, answering also the arq job the run was queued under (its own, or
        its resume's once decisions were accepted; ``None``: none), for the queue to drop."""
        for _ in range(_CANCEL_TRIES):
            async with self.database.read() as conn:
                head = (
                    await conn.execute(
                        sa.select(
                            RUNS.status, RUNS.version, as_text(RUNS.outcome), RUNS.job_id
                        ).where(RUNS.run_id == run_id)
                    )
                ).one_or_none()
            if head is None:
                raise not_found(run_id)
            status, version, outcome_text, job_id = head
            if status not in _CANCELLABLE:
                raise conflict_error(run_id, status, "cancel it")
            previous = decode_json(run_id, "outcome", outcome_text, SUMMARY)
            summary = OutcomeSummary(
                status="cancelled",
                reason=reason,
                steps_used=previous.steps_used if previous is not None else 0,
                usage=previous.usage if previous is not None else TokenUsage(),
            )
            now = utcnow()
            record = await self._try_move(
                run_id,
                _CANCELLABLE,
                expected_version=version,
                status=RunStatus.CANCELLED.value,
                outcome=summary.model_dump(mode="json"),
                state=sa.null(),
                decisions=sa.null(),
                job_id=sa.null(),
                lease_until=sa.null(),
                finished_at=now,
                updated_at=now,
            )
            if record is not None:
                return record, job_id
            # it moved between the read and the write (say, a decision was accepted): again
        raise AgentError(
            ErrorKind.CONFLICT, f"run {run_id} kept changing while being cancelled; try again"
        )

    # --- step checkpoints ------------------------------------------------------------------

    def journal(
        self,
        run_id: str,
        *,
        attempt: int | None = None,
        progress: ProgressRule | None = None,
        after_seq: int | None = None,
    ) -> SqlRunJournal:
        """The run's checkpoint journal, to give a run in its ``RunOptions``.

        With ``attempt`` (the number :meth:`start` returned in the record), a checkpoint is
        written only while the run is in progress at that attempt: a worker that was given up
        for dead and replaced cannot write into its successor's journal (``CONFLICT``).
        With ``progress``, a checkpoint for which the rule answers ``(pct, message)`` also
        updates the record's progress, in the same transaction (see :meth:`progress`).
        With ``after_seq`` (the seq of the run's latest checkpoint, from :meth:`checkpoints`;
        0 for a run that has none), a record tried again after an ``unavailable`` failure
        that did commit is not written twice.
        """
        return SqlRunJournal(
            self.database, run_id, attempt=attempt, progress=progress, after_seq=after_seq
        )

    def run_journal(
        self,
        run_id: str,
        *,
        attempt: int,
        after_seq: int,
        lease: float,
        progress: ProgressRule | None = None,
        persist: Persist | None = None,
        session: bool = False,
    ) -> LeasedRunJournal:
        """The journal of the delivery that started ``attempt`` of the run: its checkpoints in
        as few transactions as keep them safe, each renewing its lease by ``lease`` seconds
        and writing the progress ``progress`` gives (see
        :mod:`agent_plugin.storage.leased_journal`). ``after_seq``: the seq of the run's
        latest checkpoint (:meth:`checkpoints`; 0 for a run never started before);
        ``persist`` makes each write (a worker's tries it through a database outage);
        ``session``: the run saves its turn to a session (its final reply is written before
        that). Call its ``close()`` before recording the run's end."""
        return LeasedRunJournal(
            self.database,
            run_id,
            attempt=attempt,
            after_seq=after_seq,
            lease=lease,
            progress=progress,
            persist=persist,
            session=session,
        )

    async def journal_entries(self, run_id: str) -> list[JournalEntry]:
        """The run's checkpoints in the order they were recorded (one query; ``[]`` if none)."""
        entries, _ = await self.checkpoints(run_id)
        return entries

    async def checkpoints(self, run_id: str) -> tuple[list[JournalEntry], int]:
        """The run's checkpoints in order, and the seq of the latest (0 if none): one query."""
        query = (
            sa.select(CHECKPOINTS.seq, CHECKPOINTS.kind, as_text(CHECKPOINTS.payload))
            .where(CHECKPOINTS.run_id == run_id)
            .order_by(CHECKPOINTS.seq)
        )
        async with self.database.read() as conn:
            rows = (await conn.execute(query)).all()
        entries = [decode_entry(run_id, seq, kind, payload) for seq, kind, payload in rows]
        return entries, int(rows[-1][0]) if rows else 0

    async def clear_journal(self, run_id: str) -> None:
        """Delete the run's checkpoints once nothing will continue from them.

        Allowed when the run is finished (its record keeps the outcome summary) or awaiting
        approval (its state is kept in the record, and the resume journals a new start).
        Refused with ``CONFLICT`` while the run is queued or in progress, because a retried
        job continues from its checkpoints. No such run: nothing to clear. Checkpoints are never
        cleared automatically: call this as housekeeping after :meth:`finish`.
        """
        async with self.database.write() as conn:
            status = await read_status(conn, run_id)
            if status is None:
                return
            if status in RUNNABLE:
                raise conflict_error(run_id, status, "clear its checkpoints")
            await conn.execute(sa.delete(CHECKPOINTS).where(CHECKPOINTS.run_id == run_id))

    # --- moves -----------------------------------------------------------------------------

    async def _move(
        self,
        run_id: str,
        action: str,
        allowed: Sequence[RunStatus],
        *,
        attempt: int | None = None,
        **values: Any,
    ) -> RunRecord:
        """Move the run on, or raise NOT_FOUND / CONFLICT naming its status (or the later
        delivery that took the run over, when ``attempt`` is not the run's)."""
        record = await self._try_move(run_id, allowed, expected_attempt=attempt, **values)
        if record is not None:
            return record
        if attempt is not None:
            async with self.database.read() as conn:
                current = await conn.scalar(sa.select(RUNS.attempt).where(RUNS.run_id == run_id))
            if current is not None and current != attempt:
                raise AgentError(
                    ErrorKind.CONFLICT,
                    f"run {run_id} was taken over by a later delivery (attempt {current}, "
                    f"not {attempt}): cannot {action} it",
                )
        raise await self._refusal(run_id, action + " it")

    async def _start_refusal(
        self, run_id: str, job_id: str | None, *, resume: bool
    ) -> AgentError | None:
        """Why :meth:`start` did not start the run; ``None`` when nothing stands in the way
        any more (a lease ended between the two reads: try again)."""
        query = sa.select(
            RUNS.status,
            RUNS.attempt,
            RUNS.job_id,
            RUNS.lease_until,
            RUNS.decisions.is_not(None),
            database_now(),
        ).where(RUNS.run_id == run_id)
        async with self.database.read() as conn:
            head = (await conn.execute(query)).one_or_none()
        if head is None:
            return not_found(run_id)
        status, attempt, owner, lease_until, decided, now = head
        if status not in RUNNABLE:
            return conflict_error(run_id, status, "start it")
        if job_id is not None and owner is not None and owner != job_id:
            return AgentError(
                ErrorKind.CONFLICT,
                f"run {run_id} is {status} for job {owner}: job {job_id} cannot start it",
            )
        if decided and not resume:
            return conflict_error(run_id, status, "start it (decisions wait for its resume)")
        if lease_until is not None and lease_until > now:
            holder = (
                f"held by attempt {attempt}"
                if status == RunStatus.IN_PROGRESS.value
                else "not due"  # a retry's backoff, or a deferred run
            )
            return AgentError(
                ErrorKind.CONFLICT,
                f"run {run_id} is {status}, {holder} until {lease_until.isoformat()}: "
                "cannot start it before then",
                retry_after=(lease_until - now).total_seconds(),
            )
        return None

    async def _refusal(self, run_id: str, action: str) -> AgentError:
        """Why a move did not happen: NOT_FOUND, or CONFLICT naming the run's status."""
        async with self.database.read() as conn:
            status = await read_status(conn, run_id)
        if status is None:
            return not_found(run_id)
        return conflict_error(run_id, status, action)

    async def _try_move(
        self,
        run_id: str,
        allowed: Sequence[RunStatus],
        *,
        expected_version: int | None = None,
        expected_attempt: int | None = None,
        **values: Any,
    ) -> RunRecord | None:
        """One ``UPDATE ... RETURNING`` that moves the run on and bumps its version, if the
        run is in one of the ``allowed`` states (and at ``expected_version`` and
        ``expected_attempt``, if given)."""
        where = [RUNS.run_id == run_id, RUNS.status.in_([s.value for s in allowed])]
        if expected_version is not None:
            where.append(RUNS.version == expected_version)
        if expected_attempt is not None:
            where.append(RUNS.attempt == expected_attempt)
        update = (
            sa.update(RUNS)
            .where(*where)
            .values(version=RUNS.version + 1, **values)
            .returning(*RECORD_COLUMNS)
        )
        async with self.database.alone(write=True) as conn:
            row = (await conn.execute(update)).one_or_none()
        return record_of(row._mapping) if row is not None else None


# --- checks --------------------------------------------------------------------------------


def _check_run_id(run_id: str) -> None:
    check_text("run_id", run_id, _RUN_ID_MAX, required=True)


def _json_args(run_id: str, args: Mapping[str, Any]) -> dict[str, Any]:
    try:
        data = to_jsonable_python(dict(args))
    except (PydanticSerializationError, TypeError, ValueError) as error:
        raise AgentError.config(
            f"run {run_id!r}: the job arguments are not JSON: {error}"
        ) from error
    if not isinstance(data, dict):
        raise AgentError.config(f"run {run_id!r}: the job arguments must be a JSON object")
    return data
