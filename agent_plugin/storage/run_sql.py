"""How the run store talks SQL: its statements (built once, with bind parameters, so a step
pays for executing them and not for building them), the database's clock that leases are set
and compared on, and how a row becomes a :class:`~agent_plugin.records.RunRecord` (a stored
value that no longer decodes is a ``DECODE`` error naming the run and the column).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from datetime import UTC, datetime
from typing import Any, Final, TypeVar, cast

import sqlalchemy as sa
from pydantic import TypeAdapter, ValidationError
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import aliased
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from agent_plugin.errors import AgentError, ErrorInfo, ErrorKind
from agent_plugin.events import OutcomeSummary
from agent_plugin.ids import RUN_ID_PATTERN
from agent_plugin.outcomes import ApprovalDecision, RunState
from agent_plugin.records import RunRecord, RunStatus
from agent_plugin.storage.models import RunCheckpointRow, RunRow, UtcDateTime, utcnow
from agent_plugin.text import storable

T = TypeVar("T")

RUNS: Final = RunRow
RUN_TABLE: Final = cast(sa.Table, RunRow.__table__)
CHECKPOINTS: Final = RunCheckpointRow

RUNNABLE: Final = (RunStatus.QUEUED, RunStatus.IN_PROGRESS)
"""A worker may start, finish or fail a run in these states (in progress: a re-delivery)."""


# --- queries -------------------------------------------------------------------------------


def as_text(column: Any) -> sa.ColumnElement[str]:
    """A JSON column as its stored text: decoded here, so a bad value names its run."""
    return sa.cast(column, sa.Text).label(column.key)


RECORD_COLUMNS: Final = (
    RUNS.run_id,
    RUNS.status,
    RUNS.origin,
    RUNS.session_id,
    RUNS.memory_scope,
    RUNS.progress_pct,
    RUNS.progress_message,
    RUNS.attempt,
    RUNS.created_at,
    RUNS.updated_at,
    RUNS.started_at,
    RUNS.finished_at,
    as_text(RUNS.outcome),
    as_text(RUNS.error),
)


def progress_values(
    run_id: str, pct: int, message: str, now: datetime | None = None
) -> dict[str, Any]:
    return {
        "run": run_id,
        "pct": min(max(int(pct), 0), 100),
        "message": storable(message),
        "now": now or utcnow(),
    }


BY_RUN_ID: Final = RUNS.run_id == sa.bindparam("run", type_=sa.String())
NOW: Final = sa.bindparam("now", type_=RUNS.__table__.c.updated_at.type)
GET: Final = sa.select(*RECORD_COLUMNS).where(BY_RUN_ID)
ARGS_OF: Final = sa.select(as_text(RUNS.args)).where(BY_RUN_ID)


class database_now(FunctionElement[datetime]):
    """The database's clock, in UTC, plus ``seconds`` if given (a number or a bind parameter).

    Leases are set and compared on it, so the workers' own clocks do not matter: PostgreSQL's
    ``clock_timestamp()``; SQLite's ``strftime`` of ``'now'``, in the text form SQLAlchemy
    stores SQLite timestamps in (so the two compare as text).
    """

    type = UtcDateTime()
    inherit_cache = True
    name = "database_now"


@compiles(database_now, "postgresql")
def _postgresql_now(element: database_now, compiler: SQLCompiler, **kw: Any) -> str:
    clauses = list(element.clauses)
    if not clauses:
        return "clock_timestamp()"
    return f"(clock_timestamp() + make_interval(secs => {compiler.process(clauses[0], **kw)}))"


@compiles(database_now, "sqlite")
def _sqlite_now(element: database_now, compiler: SQLCompiler, **kw: Any) -> str:
    clauses = list(element.clauses)
    shift = f", printf('%+.6f seconds', {compiler.process(clauses[0], **kw)})" if clauses else ""
    return f"(strftime('%Y-%m-%d %H:%M:%f', 'now'{shift}) || '000')"


def from_now(seconds: float | sa.BindParameter[float]) -> database_now:
    """``seconds`` from now on the database's clock."""
    if isinstance(seconds, sa.BindParameter):
        return database_now(seconds)
    return database_now(sa.literal(float(seconds), sa.Float()))


def start_statement(*, of_job: bool, without_decisions: bool) -> sa.Update:
    """The ``UPDATE`` of :meth:`SqlRunStore.start`: a runnable run whose lease has ended
    becomes ``in_progress`` under the next attempt and a new lease; with ``of_job``, only for
    the job bound as ``job`` (or a run that names none); with ``without_decisions``, only a
    run holding no accepted decisions."""
    where = [
        BY_RUN_ID,
        RUNS.status.in_([s.value for s in RUNNABLE]),
        sa.or_(RUNS.lease_until.is_(None), RUNS.lease_until <= database_now()),
    ]
    if of_job:
        job = sa.bindparam("job", type_=sa.String())
        where.append(sa.or_(RUNS.job_id.is_(None), RUNS.job_id == job))
    if without_decisions:
        where.append(RUNS.decisions.is_(None))
    return (
        sa.update(RUNS)
        .where(*where)
        .values(
            status=RunStatus.IN_PROGRESS.value,
            attempt=RUNS.attempt + 1,
            version=RUNS.version + 1,
            lease_until=from_now(sa.bindparam("lease", type_=sa.Float())),
            started_at=sa.func.coalesce(RUNS.started_at, NOW),
            updated_at=NOW,
        )
        .returning(*RECORD_COLUMNS)
    )


STARTS: Final = {
    (of_job, without_decisions): start_statement(of_job=of_job, without_decisions=without_decisions)
    for of_job in (False, True)
    for without_decisions in (False, True)
}
"""The start statements by ``(of_job, without_decisions)``, built once."""
PROGRESS: Final = (
    sa.update(RUNS)
    .where(BY_RUN_ID, RUNS.status == RunStatus.IN_PROGRESS.value)
    .values(
        progress_pct=sa.bindparam("pct", type_=sa.Integer()),
        progress_message=sa.bindparam("message", type_=sa.Text()),
        updated_at=NOW,
    )
)
PROGRESS_FORWARD: Final = PROGRESS.where(
    RUNS.progress_pct <= sa.bindparam("pct", type_=sa.Integer())
)
""":data:`PROGRESS` that never moves a run's percentage back."""


async def read_status(conn: AsyncConnection, run_id: str) -> str | None:
    status = await conn.scalar(sa.select(RUNS.status).where(RUNS.run_id == run_id))
    return str(status) if status is not None else None


CREATE_FIELDS: Final = (
    "run_id",
    "origin",
    "session_id",
    "memory_scope",
    "args",
    "job_id",
    "created_at",
    "updated_at",
)
"""The values of a new run's record bound at each ``INSERT`` (as ``new_<name>``); with a
delay, ``delay`` too (seconds)."""


def _create_statement(insert: postgresql.Insert | sqlite.Insert, *, delayed: bool) -> sa.Insert:
    """The ``INSERT`` of a new queued run that does nothing when its run id exists: on the
    table (not the mapped class: no ORM work per execution), every value a bind parameter."""
    table = RUN_TABLE
    bound = {name: sa.bindparam(f"new_{name}", type_=table.c[name].type) for name in CREATE_FIELDS}
    lease = from_now(sa.bindparam("delay", type_=sa.Float())) if delayed else None
    return insert.values(
        **bound,
        status=RunStatus.QUEUED.value,
        progress_pct=0,
        attempt=0,
        version=0,
        lease_until=lease,
    ).on_conflict_do_nothing(index_elements=["run_id"])


CREATE: Final = {
    (dialect, delayed): _create_statement(make(RUN_TABLE), delayed=delayed)
    for dialect, make in (("postgresql", postgresql.insert), ("sqlite", sqlite.insert))
    for delayed in (False, True)
}
"""The ``INSERT`` of :meth:`SqlRunStore.create`, built once: by ``(dialect, delayed)``."""


def insert_ignoring_duplicates(conn: AsyncConnection) -> sa.Insert:
    """An ``INSERT`` into the runs that does nothing when the run id exists (a run of a
    session, whose place in the session's queue is a subquery: not the prebuilt one)."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(RUNS).on_conflict_do_nothing(index_elements=["run_id"])
    return sqlite.insert(RUNS).on_conflict_do_nothing(index_elements=["run_id"])


# --- errors --------------------------------------------------------------------------------


def not_found(run_id: str) -> AgentError:
    return AgentError(ErrorKind.NOT_FOUND, f"no run {run_id!r}")


def not_paused(run_id: str, status: str) -> AgentError:
    return AgentError(ErrorKind.CONFLICT, f"run {run_id} is {status}, not awaiting approval")


def conflict_error(run_id: str, status: str, action: str) -> AgentError:
    return AgentError(ErrorKind.CONFLICT, f"run {run_id} is {status}: cannot {action}")


def decode_error(run_id: str, column: str, problem: str) -> AgentError:
    return AgentError(
        ErrorKind.DECODE, f"run {run_id!r}: the stored {column} does not decode: {problem}"
    )


# --- decoding ------------------------------------------------------------------------------

SUMMARY: Final = TypeAdapter(OutcomeSummary)
ERROR: Final = TypeAdapter(ErrorInfo)
STATE: Final = TypeAdapter(RunState)
DECISIONS: Final = TypeAdapter(list[ApprovalDecision])
ARGS: Final = TypeAdapter(dict[str, Any])


def decode_json(run_id: str, column: str, text: str | None, adapter: TypeAdapter[T]) -> T | None:
    """A stored JSON value (SQL ``NULL`` or JSON ``null``: ``None``), or a DECODE error."""
    if text is None or text.strip() == "null":
        return None
    try:
        return adapter.validate_json(text)
    except ValidationError as error:
        raise decode_error(run_id, column, describe_validation(error)) from error


def record_of(row: sa.RowMapping) -> RunRecord:
    run_id = str(row["run_id"])
    try:
        status = RunStatus(row["status"])
    except ValueError as error:
        raise decode_error(run_id, "status", f"unknown status {row['status']!r}") from error
    outcome = decode_json(run_id, "outcome", row["outcome"], SUMMARY)
    awaiting = (
        list(outcome.awaiting)
        if outcome is not None and status is RunStatus.AWAITING_APPROVAL
        else []
    )
    return RunRecord(
        run_id=run_id,
        status=status,
        origin=row["origin"],
        session_id=row["session_id"],
        memory_scope=row["memory_scope"],
        progress_pct=row["progress_pct"],
        progress_message=row["progress_message"],
        attempt=row["attempt"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        outcome=outcome,
        error=decode_json(run_id, "error", row["error"], ERROR),
        awaiting=awaiting,
    )


def describe_validation(error: ValidationError) -> str:
    first = error.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"])
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{where or 'value'}: {first['msg']}{more}"


MAX_PAGE: Final = 200
"""The most runs one page of :meth:`~agent_plugin.storage.SqlRunStore.list_runs` holds."""


def make_cursor(created_at: datetime, run_id: str) -> str:
    """An opaque cursor that continues a listing after the run ``run_id``."""
    raw = json.dumps([created_at.isoformat(), run_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def read_cursor(cursor: str) -> tuple[datetime, str]:
    """The position :func:`make_cursor` encoded; an ``invalid`` error for anything else.

    A cursor comes from a client, so a forged one is refused here, before a database sees
    it: a run id that no run can have (a NUL, a lone surrogate), a moment without a zone or
    outside what a timestamp in UTC can hold (year 1 at +14:00)."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created_at, run_id = json.loads(base64.urlsafe_b64decode(padded.encode()))
        moment = datetime.fromisoformat(created_at)
        if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id) or moment.tzinfo is None:
            raise ValueError(cursor)
        moment = moment.astimezone(UTC)
    except (ValueError, TypeError, OverflowError, binascii.Error, UnicodeError):
        raise AgentError(ErrorKind.INVALID, "cursor is not one a listing of runs gave") from None
    return moment, run_id


_RUN_ID: Final = re.compile(RUN_ID_PATTERN)


# --- a session's queue ----------------------------------------------------------------------

PLACE_TRIES: Final = 5
"""Tries to give a run the next place in its session's queue (two enqueued at once on
PostgreSQL may compute the same one; the unique index refuses the second)."""


def next_in_session(session_id: str | None) -> sa.ColumnElement[int] | None:
    """The next place in the session's queue (``None`` for a run without a session)."""
    if session_id is None:
        return None
    others = aliased(RUNS)
    return (
        sa.select(sa.func.coalesce(sa.func.max(others.session_seq), 0) + 1)
        .where(others.session_id == session_id)
        .scalar_subquery()
    )


def kept_changing(run_id: str, action: str) -> AgentError:
    return AgentError(
        ErrorKind.CONFLICT,
        f"run {run_id}: its session kept changing while it was {action}; try again",
    )


# --- checks ----------------------------------------------------------------------------------

NAME_MAX: Final = 255
"""The longest session id, memory scope or job id a record takes."""


def check_text(name: str, value: str | None, limit: int, *, required: bool = False) -> None:
    if value is None and not required:
        return
    if not isinstance(value, str) or not value or len(value) > limit:
        raise AgentError.config(f"{name} must be a non-empty string of at most {limit} characters")
