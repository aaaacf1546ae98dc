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
messages the session holds. Once a session has branches (its ``head`` is set), a branch is read
from its links (``seq, parent_seq``: primary-key ranges, no payloads), walked from the leaf to
the root, or to its latest compaction's first kept message, then the messages on it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Final, NamedTuple

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy import exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.orm import aliased

from agent_plugin.branching import Branch, SessionLock, SessionTree, unknown_entry_error
from agent_plugin.compaction import CompactionReport
from agent_plugin.errors import AgentError, ErrorKind, SessionLocked
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

    async def load(self, session_id: str, *, leaf: int | None = None) -> SessionView:
        check_session_id(session_id)
        async with self.database.read() as conn:
            # the version and the latest compaction entry, in one indexed query
            head_query = (
                sa.select(
                    _SESSIONS.version,
                    _SESSIONS.head,
                    _SESSIONS.lock_seq,
                    _SESSIONS.lock_fingerprint,
                    _ENTRIES.seq,
                    _ENTRIES.parent_seq,
                    _payload_text(),
                )
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
            row = (await conn.execute(head_query)).one_or_none()
            if row is None:
                if leaf:
                    raise unknown_entry_error(session_id, leaf)
                return SessionView()
            version, head, lock_seq, fingerprint, compaction_seq, compaction_parent, payload = row
            lock = _lock(lock_seq, fingerprint)
            if leaf is not None and not 1 <= leaf <= version:
                raise unknown_entry_error(session_id, leaf)
            if head is not None or (leaf is not None and leaf != version):
                tip = leaf if leaf is not None else head or version
                return await _branch_view(conn, session_id, tip, version, lock)
            compaction = (
                _decode_compaction(session_id, compaction_seq, compaction_parent, payload)
                if compaction_seq is not None
                else None
            )
            first = compaction.first_kept_seq if compaction is not None else 1
            rows = (
                await conn.execute(
                    sa.select(_ENTRIES.seq, _ENTRIES.parent_seq, _payload_text())
                    .where(
                        _ENTRIES.session_id == session_id,
                        _ENTRIES.kind == _MESSAGE,
                        _ENTRIES.seq.between(first, version),
                    )
                    .order_by(_ENTRIES.seq)
                )
            ).all()
        # decoded after the transaction: the connection goes back to the pool first
        messages = [_decode_message(session_id, *row) for row in rows]
        return SessionView.compose(compaction, messages, version, lock=lock)

    async def branches(self, session_id: str) -> list[Branch]:
        check_session_id(session_id)
        async with self.database.read() as conn:
            tree = await _tree(conn, session_id)
        return tree.branches()

    async def entries(
        self, session_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[SessionEntry]:
        check_session_id(session_id)
        check_page(after, limit)
        query = (
            sa.select(_ENTRIES.seq, _ENTRIES.kind, _ENTRIES.parent_seq, _payload_text())
            .where(_ENTRIES.session_id == session_id, _ENTRIES.seq > after)
            .order_by(_ENTRIES.seq)
        )
        if limit is not None:
            query = query.limit(limit)
        async with self.database.read() as conn:
            rows = (await conn.execute(query)).all()
        return [_decode(session_id, *row) for row in rows]

    # --- writes ----------------------------------------------------------------------------

    async def append(
        self,
        session_id: str,
        messages: Sequence[ChatMessage],
        *,
        expected_version: int,
        leaf: int | None = None,
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
        async with _writing(self.database, session_id, expected_version) as conn:
            after = await _moved_on(conn, session_id, expected_version, new_version, leaf)
            if after is None:  # a branch off the head, or a stale version: checked first
                after = await _continued(conn, session_id, expected_version, leaf)
                await _advance(conn, session_id, expected_version, new_version, after)
            rows = [
                {
                    "session_id": session_id,
                    "seq": expected_version + offset,
                    "parent_seq": expected_version + offset - 1 if offset > 1 else after or None,
                    "kind": _MESSAGE,
                    "payload": message.model_dump(mode="json"),
                    "created_at": now,
                }
                for offset, message in enumerate(batch, start=1)
            ]
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
        leaf: int | None = None,
    ) -> int:
        check_session_id(session_id)
        check_expected_version(expected_version)
        seq = expected_version + 1
        async with _writing(self.database, session_id, expected_version) as conn:
            state = await _state(conn, session_id)
            if state.version != expected_version:
                raise conflict_error(session_id, expected_version, state.version)
            if state.lock is not None:
                raise SessionLocked(session_id, "compacting it")
            after = await _continued(conn, session_id, expected_version, leaf, state)
            if state.head is None and after == expected_version:
                on_branch = 1 <= first_kept_seq <= after
            else:
                on_branch = first_kept_seq in await _path_seqs(conn, session_id, after)
            kind = await conn.scalar(
                sa.select(_ENTRIES.kind).where(
                    _ENTRIES.session_id == session_id, _ENTRIES.seq == first_kept_seq
                )
            )
            if not on_branch or kind != _MESSAGE or after == 0:
                raise compaction_target_error(session_id, first_kept_seq)
            entry = CompactionEntry(
                seq=seq,
                parent_seq=after,
                summary=summary,
                first_kept_seq=first_kept_seq,
                tokens_before=report.tokens_before,
                tokens_after=report.tokens_after,
                usage=report.usage,
            )
            await _advance(conn, session_id, expected_version, seq, after)
            await conn.execute(
                sa.insert(_ENTRIES).values(
                    session_id=session_id,
                    seq=seq,
                    parent_seq=after,
                    kind=_COMPACTION,
                    payload=entry.model_dump(mode="json", exclude={"kind", "seq", "parent_seq"}),
                    created_at=utcnow(),
                )
            )
        return seq

    async def delete(self, session_id: str) -> None:
        check_session_id(session_id)
        async with self.database.write() as conn:
            await conn.execute(sa.delete(_ENTRIES).where(_ENTRIES.session_id == session_id))
            await conn.execute(sa.delete(_SESSIONS).where(_SESSIONS.id == session_id))

    async def fork(self, session_id: str, at_seq: int) -> Branch:
        check_session_id(session_id)
        async with self.database.write() as conn:
            state = await _state(conn, session_id)
            if not 1 <= at_seq <= state.version:
                raise unknown_entry_error(session_id, at_seq)
            locked = state.lock.seq if state.lock is not None else 0
            if locked and locked not in await _path_seqs(conn, session_id, at_seq):
                raise SessionLocked(session_id, f"forking at entry {at_seq}")
            if at_seq != (state.version if state.head is None else state.head):
                await conn.execute(
                    sa.update(_SESSIONS)
                    .where(_SESSIONS.id == session_id)
                    .values(head=at_seq, updated_at=utcnow())
                )
            tree = await _tree(conn, session_id)
        return next(b for b in tree.branches() if b.leaf == at_seq)

    async def lock(self, session_id: str, fingerprint: str) -> SessionLock:
        check_session_id(session_id)
        async with self.database.write() as conn:
            now = utcnow()
            await conn.execute(
                _insert_ignoring_duplicates(conn).values(
                    id=session_id, version=0, created_at=now, updated_at=now
                )
            )
            state = await _state(conn, session_id)
            lock = SessionLock(
                fingerprint=fingerprint,
                seq=state.version if state.head is None else state.head,
            )
            await conn.execute(
                sa.update(_SESSIONS)
                .where(_SESSIONS.id == session_id)
                .values(lock_seq=lock.seq, lock_fingerprint=fingerprint, updated_at=now)
            )
        return lock

    async def unlock(self, session_id: str) -> None:
        check_session_id(session_id)
        async with self.database.write() as conn:
            await conn.execute(
                sa.update(_SESSIONS)
                .where(_SESSIONS.id == session_id)
                .values(lock_seq=None, lock_fingerprint=None)
            )


class _State(NamedTuple):
    version: int
    head: int | None
    lock: SessionLock | None


async def _state(conn: AsyncConnection, session_id: str) -> _State:
    """The session's version, head (``None``: no branches) and lock (unknown: version 0)."""
    row = (
        await conn.execute(
            sa.select(
                _SESSIONS.version, _SESSIONS.head, _SESSIONS.lock_seq, _SESSIONS.lock_fingerprint
            ).where(_SESSIONS.id == session_id)
        )
    ).one_or_none()
    if row is None:
        return _State(0, None, None)
    return _State(int(row[0]), row[1], _lock(row[2], row[3]))


async def _moved_on(
    conn: AsyncConnection, session_id: str, expected: int, new: int, leaf: int | None
) -> int | None:
    """Move the session from ``expected`` to ``new`` in one statement when the write continues
    its head, and return the entry it chains after; ``None``: not that case, nothing done."""
    if expected == 0:
        if leaf:
            raise unknown_entry_error(session_id, leaf)
        await _advance(conn, session_id, 0, new, 0)
        return 0
    if leaf is None or leaf == expected:
        continues: sa.ColumnElement[bool] = sa.or_(
            _SESSIONS.head.is_(None), _SESSIONS.head == expected
        )
        if leaf is None:
            continues = _SESSIONS.head.is_(None)
    else:
        continues = _SESSIONS.head == leaf
    update = (
        sa.update(_SESSIONS)
        .where(_SESSIONS.id == session_id, _SESSIONS.version == expected, continues)
        .values(
            version=new,
            head=sa.case((_SESSIONS.head.is_(None), None), else_=new),
            updated_at=utcnow(),
        )
    )
    if (await conn.execute(update)).rowcount != 1:
        return None
    return expected if leaf is None else leaf


async def _continued(
    conn: AsyncConnection,
    session_id: str,
    expected: int,
    leaf: int | None,
    state: _State | None = None,
) -> int:
    """The entry a write at ``expected`` chains after (``leaf``, default the head), checked:
    ``CONFLICT`` for a stale version, ``NOT_FOUND`` for an unknown leaf, ``SessionLocked`` for
    a leaf off a locked session's history."""
    state = state or await _state(conn, session_id)
    if state.version != expected:
        raise conflict_error(session_id, expected, state.version)
    head = state.version if state.head is None else state.head
    if leaf is None or leaf == head:
        return head
    if not 1 <= leaf <= state.version:
        raise unknown_entry_error(session_id, leaf)
    locked = state.lock.seq if state.lock is not None else 0
    if locked and locked not in await _path_seqs(conn, session_id, leaf):
        raise SessionLocked(session_id, f"continuing entry {leaf}")
    return leaf


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


_WINDOW: Final = 1024
"""How many links a branch walk reads first; each further read covers four times as many."""


async def _path(
    conn: AsyncConnection, session_id: str, leaf: int, *, to_compaction: bool = False
) -> tuple[list[tuple[int, int | None, str]], CompactionEntry | None]:
    """``(seq, parent_seq, kind)`` of the entries from the root to ``leaf``, root first.

    The links (no payloads) are read by primary-key ranges ending where the walk is, each
    wider than the last, and walked here: a planner's choice cannot turn the walk into a
    scan per step. With ``to_compaction``, the walk stops below the ``first_kept_seq`` of the
    branch's latest compaction, which it returns."""
    links: dict[int, tuple[int | None, str]] = {}
    path: list[tuple[int, int | None, str]] = []
    compaction: CompactionEntry | None = None
    width = _WINDOW
    node: int | None = leaf
    while node is not None:
        if node not in links:
            rows = (
                await conn.execute(
                    sa.select(_ENTRIES.seq, _ENTRIES.parent_seq, _ENTRIES.kind).where(
                        _ENTRIES.session_id == session_id,
                        _ENTRIES.seq > node - width,
                        _ENTRIES.seq <= node,
                    )
                )
            ).all()
            links.update((seq, (parent, kind)) for seq, parent, kind in rows)
            width *= 4
            if node not in links:
                break
        parent, kind = links[node]
        if compaction is not None and node < compaction.first_kept_seq:
            break
        path.append((node, parent, kind))
        if to_compaction and compaction is None and kind == _COMPACTION:
            payload = await conn.scalar(
                sa.select(_payload_text()).where(
                    _ENTRIES.session_id == session_id, _ENTRIES.seq == node
                )
            )
            compaction = _decode_compaction(session_id, node, parent, payload)
        node = parent if parent is not None and parent < node else None
    path.reverse()
    return path, compaction


async def _path_seqs(conn: AsyncConnection, session_id: str, leaf: int) -> set[int]:
    path, _ = await _path(conn, session_id, leaf)
    return {seq for seq, _, _ in path}


async def _tree(conn: AsyncConnection, session_id: str) -> SessionTree:
    state = await _state(conn, session_id)
    links = (
        await conn.execute(
            sa.select(_ENTRIES.seq, _ENTRIES.parent_seq).where(_ENTRIES.session_id == session_id)
        )
    ).all()
    head = state.version if state.head is None else state.head
    return SessionTree(((int(seq), parent) for seq, parent in links), head)


async def _branch_view(
    conn: AsyncConnection,
    session_id: str,
    leaf: int,
    version: int,
    lock: SessionLock | None,
) -> SessionView:
    """The view of the branch ending at ``leaf``: its path down to its latest compaction's
    ``first_kept_seq`` (if any), then the payloads of the messages on it."""
    path, compaction = await _path(conn, session_id, leaf, to_compaction=True)
    first = compaction.first_kept_seq if compaction is not None else 1
    on_path = {seq for seq, _, kind in path if kind == _MESSAGE and seq >= first}
    rows = (
        await conn.execute(
            sa.select(_ENTRIES.seq, _ENTRIES.parent_seq, _payload_text())
            .where(
                _ENTRIES.session_id == session_id,
                _ENTRIES.kind == _MESSAGE,
                _ENTRIES.seq.between(min(on_path, default=first), leaf),
            )
            .order_by(_ENTRIES.seq)
        )
    ).all()
    messages = [_decode_message(session_id, *row) for row in rows if row[0] in on_path]
    return SessionView.compose(compaction, messages, version, leaf=leaf, lock=lock)


def _lock(seq: int | None, fingerprint: str | None) -> SessionLock | None:
    if seq is None or fingerprint is None:
        return None
    return SessionLock(fingerprint=fingerprint, seq=seq)


async def _version(conn: AsyncConnection, session_id: str) -> int:
    version = await conn.scalar(sa.select(_SESSIONS.version).where(_SESSIONS.id == session_id))
    return int(version) if version is not None else 0


async def _advance(
    conn: AsyncConnection, session_id: str, expected: int, new: int, after: int
) -> None:
    """Move the session from ``expected`` to ``new`` written after entry ``after``, or raise
    CONFLICT (nothing written). The head is kept only once the session has branches."""
    now = utcnow()
    moved = 0
    if expected == 0:
        insert = _insert_ignoring_duplicates(conn).values(
            id=session_id, version=new, created_at=now, updated_at=now
        )
        moved = (await conn.execute(insert)).rowcount
    if moved == 0:  # an existing row (a locked empty session has one at version 0)
        head = sa.case((_SESSIONS.head.is_(None), None), else_=new) if after == expected else new
        update = (
            sa.update(_SESSIONS)
            .where(_SESSIONS.id == session_id, _SESSIONS.version == expected)
            .values(version=new, head=head, updated_at=now)
        )
        moved = (await conn.execute(update)).rowcount
    if moved != 1:
        raise conflict_error(session_id, expected, await _version(conn, session_id))


def _insert_ignoring_duplicates(conn: AsyncConnection) -> sa.Insert:
    if conn.dialect.name == "postgresql":
        return postgresql.insert(_SESSIONS).on_conflict_do_nothing(index_elements=["id"])
    return sqlite.insert(_SESSIONS).on_conflict_do_nothing(index_elements=["id"])


# --- decoding ------------------------------------------------------------------------------


def _decode(
    session_id: str, seq: int, kind: str, parent: int | None, payload: str | None
) -> SessionEntry:
    """One stored row as an entry; a row that does not decode is a DECODE error."""
    if kind == _MESSAGE:
        return _decode_message(session_id, seq, parent, payload)
    if kind == _COMPACTION:
        return _decode_compaction(session_id, seq, parent, payload)
    raise _decode_error(session_id, seq, kind, f"unknown entry kind {kind!r}")


def _decode_message(
    session_id: str, seq: int, parent: int | None, payload: str | None
) -> MessageEntry:
    try:
        message = ChatMessage.model_validate_json(payload or "")
        return MessageEntry(seq=seq, parent_seq=parent, message=message)
    except ValidationError as error:
        raise _decode_error(session_id, seq, _MESSAGE, _describe(error)) from error


def _decode_compaction(
    session_id: str, seq: int, parent: int | None, payload: str | None
) -> CompactionEntry:
    try:
        data = json.loads(payload or "")
        if not isinstance(data, dict):
            raise ValueError("the payload is not a JSON object")
        fields = {**data, "kind": _COMPACTION, "seq": seq, "parent_seq": parent}
        return CompactionEntry.model_validate(fields)
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
