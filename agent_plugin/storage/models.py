"""The plugin's tables, as SQLAlchemy 2 typed declarative models.

Every table name starts with ``agent_`` so the plugin's tables sit beside an application's own
in one database. Columns are portable between SQLite and PostgreSQL: JSON is ``JSON`` (``JSONB``
on PostgreSQL) and timestamps are timezone-aware UTC on both (SQLite stores them naive; they come
back as UTC).

No secret is ever written: every JSON column is a :class:`SecretFreeJson`, which passes
what is written through :func:`~agent_plugin.redaction.redact_deep`. A password a model put in a
tool call's arguments, or an API key a tool returned, is stored (and so read back, by the next
turn of a session or by a resumed run) as ``[REDACTED]``; a tool that needs a secret takes it
from its own configuration, never from the model.

The Alembic migrations in ``migrations/`` create exactly these tables; a test compares the two.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from agent_plugin.redaction import redact_deep

__all__ = [
    "RUN_STATUSES",
    "Base",
    "MemoryBlockRow",
    "MemoryEditRow",
    "RunCheckpointRow",
    "RunRow",
    "SecretFreeJson",
    "SessionEntryRow",
    "SessionRow",
    "UtcDateTime",
    "utcnow",
]

RUN_STATUSES: Final = (
    "queued",
    "in_progress",
    "awaiting_approval",
    "complete",
    "failed",
    "cancelled",
)
"""The states a background run record moves through."""


NAMING_CONVENTION: Final = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
"""Deterministic constraint names, so migrations can name (and drop) what they create."""

ONE_RUNNING_PER_SESSION: Final = "status = 'in_progress' AND session_id IS NOT NULL"
"""Where the unique index of ``agent_runs(session_id)`` applies: the runs in progress."""


def utcnow() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(UTC)


class UtcDateTime(sa.TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend.

    PostgreSQL keeps the offset (``timestamptz``); SQLite has no time zones, so values are stored
    as naive UTC and given back their UTC zone when read.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("timestamps stored by the agent plugin must be timezone-aware")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class SecretFreeJson(sa.TypeDecorator[Any]):
    """JSON (``JSONB`` on PostgreSQL) with secrets redacted on the way in.

    Whatever is bound to the column (an ORM value, an ``insert().values(...)``, a
    ``sa.literal(value, column.type)``) passes through
    :func:`~agent_plugin.redaction.redact_deep`; values read back are what was stored.
    """

    impl = sa.JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(postgresql.JSONB())
        return dialect.type_descriptor(sa.JSON())

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else redact_deep(cast(Any, value))


JSON_TYPE: Final = SecretFreeJson()
"""The type of every JSON column: JSON everywhere, ``JSONB`` on PostgreSQL, never a secret."""


class Base(DeclarativeBase):
    """The declarative base of the plugin's tables; ``Base.metadata`` is Alembic's target."""

    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {  # noqa: RUF012 - SQLAlchemy reads this class attribute as-is
        datetime: UtcDateTime(),
        dict[str, Any]: JSON_TYPE,
        list[Any]: JSON_TYPE,
    }


# --- sessions ------------------------------------------------------------------------------


class SessionRow(Base):
    """One conversation. ``version`` is the seq of its last entry (0: none) and guards appends.

    ``head`` is the leaf the next run continues once the session has branches (``NULL``: none,
    the head is the last entry); ``lock_seq`` and ``lock_fingerprint`` hold a lock's fixed
    history and the digest of its system prompt and tools (``NULL``: not locked).
    """

    __tablename__ = "agent_sessions"

    id: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    version: Mapped[int] = mapped_column(sa.Integer, default=0)
    head: Mapped[int | None] = mapped_column(sa.Integer)
    lock_seq: Mapped[int | None] = mapped_column(sa.Integer)
    lock_fingerprint: Mapped[str | None] = mapped_column(sa.String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class SessionEntryRow(Base):
    """One append-only entry of a session: a message or a compaction, numbered 1, 2, 3, ...

    ``payload`` is the entry's JSON without ``kind``, ``seq`` and ``parent_seq`` (those are
    columns): a message entry's payload is the message itself. ``parent_seq`` is the entry it
    follows (``NULL``: a root). The primary key ``(session_id, seq)`` is what makes two
    concurrent writers collide instead of interleaving their messages.
    """

    __tablename__ = "agent_session_entries"
    __table_args__ = (sa.Index(None, "session_id", "kind", "seq"),)

    session_id: Mapped[str] = mapped_column(
        sa.String(255),
        sa.ForeignKey("agent_sessions.id", ondelete="CASCADE"),
        primary_key=True,
    )
    seq: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column(sa.String(32))
    parent_seq: Mapped[int | None] = mapped_column(sa.Integer)
    payload: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


# --- memory --------------------------------------------------------------------------------


class MemoryBlockRow(Base):
    """One bounded memory block of one scope; ``position`` keeps the template's order."""

    __tablename__ = "agent_memory_blocks"

    scope: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    label: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    position: Mapped[int] = mapped_column(sa.Integer, default=0)
    description: Mapped[str] = mapped_column(sa.Text, default="")
    entries: Mapped[list[Any]]
    limit_chars: Mapped[int] = mapped_column(sa.Integer)
    version: Mapped[int] = mapped_column(sa.Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class MemoryEditRow(Base):
    """An applied memory edit key: the same ``(scope, edit_key)`` is never applied twice."""

    __tablename__ = "agent_memory_edits"

    scope: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    edit_key: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


# --- background runs -----------------------------------------------------------------------


class RunRow(Base):
    """The record of one background run, kept long after the job queue forgot the job.

    ``outcome`` is the public :class:`~agent_plugin.events.OutcomeSummary` (no transcript, tool
    arguments redacted); ``state`` (the :class:`~agent_plugin.outcomes.RunState` of a paused
    run), ``decisions`` (the reviewers' accepted decisions, until the resume finishes) and
    ``args`` (the job's arguments) stay on the server. ``version`` moves on every change of
    status, so a decision is accepted against exactly one pause (compare-and-set). ``job_id``
    is the arq job that may start the run (another job's delivery is stale) and
    ``lease_until`` the time before which no other delivery may start it (its worker's lease,
    or a retry's backoff). ``session_seq`` is the run's place in its session's queue (given
    when it is enqueued, and again when its resume is): runs of a session take their turns in
    that order. At most one run of a session is ``in_progress`` at a time (a partial unique
    index): the database refuses to start a second.
    """

    __tablename__ = "agent_runs"
    __table_args__ = (
        sa.CheckConstraint(
            sa.column("status").in_(RUN_STATUSES),
            name="status",
        ),
        sa.Index(None, "status"),
        sa.Index(None, "session_id"),
        sa.Index(None, "created_at", "run_id"),
        sa.Index(None, "session_id", "session_seq", unique=True),
        sa.Index(
            "ux_agent_runs_session_id_in_progress",
            "session_id",
            unique=True,
            sqlite_where=sa.text(ONE_RUNNING_PER_SESSION),
            postgresql_where=sa.text(ONE_RUNNING_PER_SESSION),
        ),
    )

    run_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    status: Mapped[str] = mapped_column(sa.String(32), default="queued")
    origin: Mapped[str] = mapped_column(sa.String(64), default="api")
    session_id: Mapped[str | None] = mapped_column(sa.String(255))
    memory_scope: Mapped[str | None] = mapped_column(sa.String(255))
    progress_pct: Mapped[int] = mapped_column(sa.Integer, default=0)
    progress_message: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    outcome: Mapped[dict[str, Any] | None]
    error: Mapped[dict[str, Any] | None]
    state: Mapped[dict[str, Any] | None]
    attempt: Mapped[int] = mapped_column(sa.Integer, default=0)
    args: Mapped[dict[str, Any] | None]
    decisions: Mapped[list[Any] | None]
    version: Mapped[int] = mapped_column(sa.Integer, default=0, server_default=sa.text("0"))
    job_id: Mapped[str | None] = mapped_column(sa.String(255))
    lease_until: Mapped[datetime | None]
    session_seq: Mapped[int | None] = mapped_column(sa.BigInteger)


_CALL_ID_SHOWN: Final = 255
"""The width of a checkpoint row's ``call_id`` column."""


class RunCheckpointRow(Base):
    """One journal entry of a run (:mod:`agent_plugin.journal`), numbered 1, 2, 3, ... per run.

    ``payload`` is the entry's JSON without ``kind`` (a column); ``step``, ``position`` and
    ``call_id`` repeat the entry's fields where it has them, for people reading the table. The
    primary key ``(run_id, seq)`` makes two writers of one run collide instead of interleaving.
    ``kind`` has no check constraint: the journal's entry kinds grow with the code, and an
    unknown kind is reported when the entry is read.
    """

    __tablename__ = "agent_run_checkpoints"

    run_id: Mapped[str] = mapped_column(
        sa.String(64),
        sa.ForeignKey("agent_runs.run_id", ondelete="CASCADE"),
        primary_key=True,
    )
    seq: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column(sa.String(32))
    step: Mapped[int | None] = mapped_column(sa.Integer)
    position: Mapped[int | None] = mapped_column(sa.Integer)
    call_id: Mapped[str | None] = mapped_column(sa.String(_CALL_ID_SHOWN))
    payload: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


def shown_call_id(entry: object) -> str | None:
    """A journal entry's call id as its row's ``call_id`` column shows it. The message model
    sets no limit on a provider's tool-call ids (a gateway may send longer ones) and
    PostgreSQL refuses what does not fit, so a longer id is cut: the column is for people
    reading the table, and the payload keeps the id whole."""
    call_id = getattr(entry, "call_id", None)
    return call_id[:_CALL_ID_SHOWN] if isinstance(call_id, str) else None
