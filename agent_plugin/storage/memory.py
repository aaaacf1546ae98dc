"""A :class:`~agent_plugin.memory.MemoryStore` on SQLite or PostgreSQL.

Each block of each scope is a row of ``agent_memory_blocks``; a scope nobody has edited has no
rows and loads as a copy of the store's template. The template stays the authority on which
blocks exist, their descriptions and their limits (an app that raises a limit gets it for every
scope); the rows hold the entries. Blocks the template no longer names are still loaded, after
the template's.

An edit is one transaction: read the scope's rows (locked with ``FOR UPDATE`` on PostgreSQL; on
SQLite the write transaction holds the database's write lock), apply the op with the shared pure
rules of :func:`agent_plugin.memory.edit_blocks`, write the edited block with a version check,
and record the edit key in the same transaction. Two concurrent edits therefore both land, an
edit key is applied once per scope, and a failed edit changes nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Final

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy import exc
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.memory import DEFAULT_BLOCKS, MemoryBlock, MemoryOp, edit_blocks, fresh_blocks
from agent_plugin.storage.database import Database
from agent_plugin.storage.models import MemoryBlockRow, MemoryEditRow, utcnow

__all__ = ["MAX_SCOPE_LENGTH", "SqlMemoryStore"]

MAX_SCOPE_LENGTH: Final = 255
"""Memory scopes are non-empty strings of at most this many characters (a database key)."""

_MAX_KEY_LENGTH: Final = 255
_ATTEMPTS: Final = 5
"""Tries of an edit that raced another writer creating the same rows (PostgreSQL)."""

_BLOCKS: Final = MemoryBlockRow
_EDITS: Final = MemoryEditRow


class _Stored:
    """A block row as read: the block (template merged in) and the row's version."""

    __slots__ = ("block", "version")

    def __init__(self, block: MemoryBlock, version: int | None) -> None:
        self.block = block
        self.version = version  # None: no row yet, the block comes from the template


class SqlMemoryStore:
    """Memory blocks per scope in the plugin's tables, through a shared :class:`Database`.

    Errors: ``TOOL`` for an edit the rules refuse (texts written for the model, as in
    :func:`agent_plugin.memory.apply_op`), ``CONFIG`` for a bad scope, ``DECODE`` (naming the
    scope and label) for a stored row that no longer decodes, ``UNAVAILABLE`` when the database
    cannot be reached.
    """

    def __init__(
        self, database: Database, template: Iterable[MemoryBlock] = DEFAULT_BLOCKS
    ) -> None:
        self.database = database
        self._template = fresh_blocks(template)

    def __repr__(self) -> str:
        return f"SqlMemoryStore({self.database.display_url!r})"

    async def load(self, scope: str) -> list[MemoryBlock]:
        _check_scope(scope)
        async with self.database.read() as conn:
            stored = await self._read(conn, scope, lock=False)
        return [item.block for item in stored]

    async def apply(self, scope: str, op: MemoryOp, *, edit_key: str | None = None) -> MemoryBlock:
        _check_scope(scope)
        key = _stored_key(edit_key) if edit_key is not None else None
        attempt = 1
        while True:
            try:
                return await self._apply_once(scope, op, key)
            except (exc.IntegrityError, _Raced) as error:
                if attempt >= _ATTEMPTS:
                    raise AgentError(
                        ErrorKind.CONFLICT,
                        f"memory scope {scope!r} kept changing under this edit; try again",
                    ) from error
                attempt += 1

    async def _apply_once(self, scope: str, op: MemoryOp, key: str | None) -> MemoryBlock:
        async with self.database.write() as conn:
            stored = await self._read(conn, scope, lock=True)
            replay = key is not None and await _seen(conn, scope, key)
            blocks = [item.block for item in stored]
            block = edit_blocks(blocks, op, already_applied=replay)
            if replay:
                return block
            position, target = next(
                (i, item) for i, item in enumerate(stored) if item.block.label == block.label
            )
            await _write_block(conn, scope, position, block, target.version)
            if key is not None:
                await conn.execute(
                    sa.insert(_EDITS).values(scope=scope, edit_key=key, created_at=utcnow())
                )
            return block

    async def _read(self, conn: AsyncConnection, scope: str, *, lock: bool) -> list[_Stored]:
        query = (
            sa.select(
                _BLOCKS.label,
                _BLOCKS.description,
                _BLOCKS.entries,
                _BLOCKS.limit_chars,
                _BLOCKS.version,
            )
            .where(_BLOCKS.scope == scope)
            .order_by(_BLOCKS.position, _BLOCKS.label)
        )
        if lock and conn.dialect.name == "postgresql":
            query = query.with_for_update()
        rows = (await conn.execute(query)).all()
        by_label = {row.label: row for row in rows}
        merged: list[_Stored] = []
        for template in fresh_blocks(self._template):
            row = by_label.pop(template.label, None)
            if row is None:
                merged.append(_Stored(template, None))
            else:
                entries = _decode_entries(scope, row.label, row.entries)
                block = template.model_copy(update={"entries": entries})
                merged.append(_Stored(block, row.version))
        for row in rows:  # blocks the template no longer names, in their stored order
            if row.label in by_label:
                block = _decode_block(
                    scope, row.label, row.description, row.entries, row.limit_chars
                )
                merged.append(_Stored(block, row.version))
        return merged


class _Raced(Exception):
    """Another writer changed the block between the read and the write: try again."""


async def _seen(conn: AsyncConnection, scope: str, key: str) -> bool:
    found = await conn.scalar(
        sa.select(sa.literal(1)).where(_EDITS.scope == scope, _EDITS.edit_key == key)
    )
    return found is not None


async def _write_block(
    conn: AsyncConnection, scope: str, position: int, block: MemoryBlock, version: int | None
) -> None:
    now = utcnow()
    if version is None:
        await conn.execute(
            sa.insert(_BLOCKS).values(
                scope=scope,
                label=block.label,
                position=position,
                description=block.description,
                entries=list(block.entries),
                limit_chars=block.limit,
                version=1,
                updated_at=now,
            )
        )
        return
    result = await conn.execute(
        sa.update(_BLOCKS)
        .where(_BLOCKS.scope == scope, _BLOCKS.label == block.label, _BLOCKS.version == version)
        .values(
            entries=list(block.entries),
            description=block.description,
            limit_chars=block.limit,
            position=position,
            version=version + 1,
            updated_at=now,
        )
    )
    if result.rowcount != 1:
        raise _Raced()


def _decode_entries(scope: str, label: str, entries: object) -> list[str]:
    if isinstance(entries, list) and all(isinstance(entry, str) for entry in entries):
        return list(entries)
    raise _decode_error(scope, label, "entries must be a list of strings")


def _decode_block(
    scope: str, label: str, description: str, entries: object, limit: int
) -> MemoryBlock:
    try:
        return MemoryBlock(
            label=label,
            description=description,
            entries=_decode_entries(scope, label, entries),
            limit=limit,
        )
    except ValidationError as error:
        raise _decode_error(scope, label, str(error.errors(include_url=False)[0]["msg"])) from error


def _decode_error(scope: str, label: str, problem: str) -> AgentError:
    return AgentError(
        ErrorKind.DECODE,
        f"memory scope {scope!r}: stored block {label!r} does not decode: {problem}",
    )


def _check_scope(scope: str) -> None:
    if not isinstance(scope, str) or not scope:
        raise AgentError.config("a memory scope must be a non-empty string")
    if len(scope) > MAX_SCOPE_LENGTH:
        raise AgentError.config(
            f"a memory scope must be at most {MAX_SCOPE_LENGTH} characters, got {len(scope)}"
        )


def _stored_key(edit_key: str) -> str:
    """The key as stored: itself, or a SHA-256 digest when it is too long for the column."""
    if len(edit_key) <= _MAX_KEY_LENGTH:
        return edit_key
    return "sha256:" + hashlib.sha256(edit_key.encode()).hexdigest()
