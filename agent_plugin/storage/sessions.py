"""A :class:`~agent_plugin.sessions.SessionStore` on SQLite or PostgreSQL.

Entries are rows of ``agent_session_entries`` keyed by ``(session_id, seq)``; the session's
version lives in ``agent_sessions``. An append is one transaction: move the version from the
expected value to the new one with ``UPDATE ... WHERE version = :expected`` (or create the
session row for version 0), then insert one row per entry. A writer that lost the race updates no
row and gets ``ErrorKind.CONFLICT`` with nothing written; the primary key backs this up, so two
runs' messages can never interleave. The cost of an append does not depend on how long the
session already is.

Loading reads the version together with the latest compaction entry (one indexed query), then
the message entries from that compaction's ``first_kept_seq`` on (one query), however many
messages the session holds.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Final

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy import exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.orm import aliased

from agent_plugin.compaction import CompactionReport
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.messages import ChatMessage
from agent_plugin.sessions import (
    CompactionEntry,
    MessageEntry,
    SessionEntry,
    SessionView,
    check_expected_version,
    check_page,
    check_session_id,
    compaction_target_error,
    conflict_error,
)
from agent_plugin.storage.database import Database
from agent_plugin.storage.models import SessionEntryRow, SessionRow, utcnow

__all__ = ["SqlSessionStore"]

_SESSIONS: Final = SessionRow
_ENTRIES: Final = SessionEntryRow
_MESSAGE: Final = "message"
_COMPACTION: Final = "compaction"


class SqlSessionStore:
    """Sessions in the plugin's tables, through a shared :class:`Database`.

    Passes ``tests/store_conformance.py`` on SQLite and PostgreSQL. Every error is an
    :class:`AgentError`: ``CONFLICT`` for a stale version, ``CONFIG`` for bad arguments,
    ``DECODE`` (naming the session and seq) for a stored row that no longer decodes, and
    ``UNAVAILABLE`` when the database cannot be reached.
    """

    def __init__(self, database: Database) -> None:
        self.database = database

    def __repr__(self) -> str:
        return f"SqlSessionStore({self.database.display_url!r})"

    # --- reads -----------------------------------------------------------------------------

    async def load(self, session_id: str) -> SessionView:
        check_session_id(session_id)
        async with self.database.read() as conn:
            # the version and the latest compaction entry, in one indexed query
            head_query = (
                sa.select(_SESSIONS.version, _ENTRIES.seq, _payload_text())
                .select_from(_SESSIONS)
                .outerjoin(
                    _ENTRIES,
                    sa.and_(
                        _ENTRIES.session_id == _SESSIONS.id,
                        _ENTRIES.seq == _latest_compaction_seq(),
                    ),
                )
                .where(_SESSIONS.id == session_id)
            )
            head = (await conn.execute(head_query)).one_or_none()
            if head is None:
                return SessionView()
            version, compaction_seq, compaction_payload = head
            compaction = (
                _decode_compaction(session_id, compaction_seq, compaction_payload)
                if compaction_seq is not None
                else None
            )
            first = compaction.first_kept_seq if compaction is not None else 1
            rows = (
                await conn.execute(
                    sa.select(_ENTRIES.seq, _payload_text())
                    .where(
                        _ENTRIES.session_id == session_id,
                        _ENTRIES.kind == _MESSAGE,
                        _ENTRIES.seq.between(first, version),
                    )
                    .order_by(_ENTRIES.seq)
                )
            ).all()
        # decoded after the transaction: the connection goes back to the pool first
        messages = [_decode_message(session_id, seq, payload) for seq, payload in rows]
        return SessionView.compose(compaction, messages, version)

    async def entries(
        self, session_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[SessionEntry]:
        check_session_id(session_id)
        check_page(after, limit)
        query = (
            sa.select(_ENTRIES.seq, _ENTRIES.kind, _payload_text())
            .where(_ENTRIES.session_id == session_id, _ENTRIES.seq > after)
            .order_by(_ENTRIES.seq)
        )
        if limit is not None:
            query = query.limit(limit)
        async with self.database.read() as conn:
            rows = (await conn.execute(query)).all()
        return [_decode(session_id, seq, kind, payload) for seq, kind, payload in rows]

    # --- writes ----------------------------------------------------------------------------

    async def append(
        self, session_id: str, messages: Sequence[ChatMessage], *, expected_version: int
    ) -> int:
        check_session_id(session_id)
        check_expected_version(expected_version)
        batch = list(messages)
        if not batch:
            async with self.database.read() as conn:
                version = await _version(conn, session_id)
            if version != expected_version:
                raise conflict_error(session_id, expected_version, version)
            return expected_version
        new_version = expected_version + len(batch)
        now = utcnow()
        rows = [
            {
                "session_id": session_id,
                "seq": expected_version + offset,
                "kind": _MESSAGE,
                "payload": message.model_dump(mode="json"),
                "created_at": now,
            }
            for offset, message in enumerate(batch, start=1)
        ]
        async with _writing(self.database, session_id, expected_version) as conn:
            await _advance(conn, session_id, expected_version, new_version)
            await conn.execute(sa.insert(_ENTRIES), rows)
        return new_version

    async def append_compaction(
        self,
        session_id: str,
        summary: str,
        first_kept_seq: int,
        report: CompactionReport,
        *,
        expected_version: int,
    ) -> int:
        check_session_id(session_id)
        check_expected_version(expected_version)
        seq = expected_version + 1
        try:
            entry = CompactionEntry(
                seq=seq,
                summary=summary,
                first_kept_seq=first_kept_seq,
                tokens_before=report.tokens_before,
                tokens_after=report.tokens_after,
                usage=report.usage,
            )
        except ValidationError:
            entry = None  # first_kept_seq names no earlier entry: reported below
        async with _writing(self.database, session_id, expected_version) as conn:
            if expected_version == 0:
                version = await _version(conn, session_id)
                if version != 0:
                    raise conflict_error(session_id, expected_version, version)
                raise compaction_target_error(session_id, first_kept_seq)
            await _advance(conn, session_id, expected_version, seq)
            kind = await conn.scalar(
                sa.select(_ENTRIES.kind).where(
                    _ENTRIES.session_id == session_id, _ENTRIES.seq == first_kept_seq
                )
            )
            if entry is None or kind != _MESSAGE:
                raise compaction_target_error(session_id, first_kept_seq)
            await conn.execute(
                sa.insert(_ENTRIES).values(
                    session_id=session_id,
                    seq=seq,
                    kind=_COMPACTION,
                    payload=entry.model_dump(mode="json", exclude={"kind", "seq"}),
                    created_at=utcnow(),
                )
            )
        return seq

    async def delete(self, session_id: str) -> None:
        check_session_id(session_id)
        async with self.database.write() as conn:
            await conn.execute(sa.delete(_ENTRIES).where(_ENTRIES.session_id == session_id))
            await conn.execute(sa.delete(_SESSIONS).where(_SESSIONS.id == session_id))


@asynccontextmanager
async def _writing(
    database: Database, session_id: str, expected_version: int
) -> AsyncIterator[AsyncConnection]:
    """A write transaction in which a unique-key violation means another writer won."""
    try:
        async with database.write() as conn:
            yield conn
    except exc.IntegrityError as clash:
        raise AgentError(
            ErrorKind.CONFLICT,
            f"session {session_id!r} was written by another writer at version "
            f"{expected_version}; load it again and retry",
        ) from clash


# --- queries -------------------------------------------------------------------------------


def _payload_text() -> sa.ColumnElement[str]:
    """The payload as stored JSON text: decoded here, so a bad row names its seq."""
    return sa.cast(_ENTRIES.payload, sa.Text).label("payload")


def _latest_compaction_seq() -> sa.ScalarSelect[int]:
    """The seq of the session's latest compaction entry (correlated; index-only)."""
    inner = aliased(_ENTRIES)
    return (
        sa.select(sa.func.max(inner.seq))
        .where(
            inner.session_id == _SESSIONS.id,
            inner.kind == _COMPACTION,
            inner.seq <= _SESSIONS.version,
        )
        .correlate(_SESSIONS)
        .scalar_subquery()
    )


async def _version(conn: AsyncConnection, session_id: str) -> int:
    version = await conn.scalar(sa.select(_SESSIONS.version).where(_SESSIONS.id == session_id))
    return int(version) if version is not None else 0


async def _advance(conn: AsyncConnection, session_id: str, expected: int, new: int) -> None:
    """Move the session from ``expected`` to ``new``, or raise CONFLICT (nothing written)."""
    now = utcnow()
    if expected == 0:
        insert = _insert_ignoring_duplicates(conn).values(
            id=session_id, version=new, created_at=now, updated_at=now
        )
        moved = (await conn.execute(insert)).rowcount
    else:
        update = (
            sa.update(_SESSIONS)
            .where(_SESSIONS.id == session_id, _SESSIONS.version == expected)
            .values(version=new, updated_at=now)
        )
        moved = (await conn.execute(update)).rowcount
    if moved != 1:
        raise conflict_error(session_id, expected, await _version(conn, session_id))


def _insert_ignoring_duplicates(conn: AsyncConnection) -> sa.Insert:
    if conn.dialect.name == "postgresql":
        return postgresql.insert(_SESSIONS).on_conflict_do_nothing(index_elements=["id"])
    return sqlite.insert(_SESSIONS).on_conflict_do_nothing(index_elements=["id"])


# --- decoding ------------------------------------------------------------------------------


def _decode(session_id: str, seq: int, kind: str, payload: str | None) -> SessionEntry:
    """One stored row as an entry; a row that does not decode is a DECODE error."""
    if kind == _MESSAGE:
        return _decode_message(session_id, seq, payload)
    if kind == _COMPACTION:
        return _decode_compaction(session_id, seq, payload)
    raise _decode_error(session_id, seq, kind, f"unknown entry kind {kind!r}")


def _decode_message(session_id: str, seq: int, payload: str | None) -> MessageEntry:
    try:
        return MessageEntry(seq=seq, message=ChatMessage.model_validate_json(payload or ""))
    except ValidationError as error:
        raise _decode_error(session_id, seq, _MESSAGE, _describe(error)) from error


def _decode_compaction(session_id: str, seq: int, payload: str | None) -> CompactionEntry:
    try:
        data = json.loads(payload or "")
        if not isinstance(data, dict):
            raise ValueError("the payload is not a JSON object")
        return CompactionEntry.model_validate({**data, "kind": _COMPACTION, "seq": seq})
    except ValidationError as error:
        raise _decode_error(session_id, seq, _COMPACTION, _describe(error)) from error
    except ValueError as error:
        raise _decode_error(session_id, seq, _COMPACTION, str(error)) from error


def _decode_error(session_id: str, seq: int, kind: str, problem: str) -> AgentError:
    return AgentError(
        ErrorKind.DECODE,
        f"session {session_id!r}: stored entry {seq} ({kind}) does not decode: {problem}",
    )


def _describe(error: ValidationError) -> str:
    first = error.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"])
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{where or 'value'}: {first['msg']}{more}"
