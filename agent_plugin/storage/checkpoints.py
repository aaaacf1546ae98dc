"""Step checkpoints of background runs: :class:`SqlRunJournal` writes a run's journal as rows of
``agent_run_checkpoints`` (one ``INSERT`` each, numbered per run; ``(run_id, seq)`` makes two
writers of one run collide instead of interleaving), and :func:`decode_entry` reads one back.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Final

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy import exc

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.journal import JournalEntry, journal_entry_adapter
from agent_plugin.records import RunStatus
from agent_plugin.storage.database import Database
from agent_plugin.storage.models import shown_call_id, utcnow
from agent_plugin.storage.run_sql import (
    CHECKPOINTS,
    PROGRESS,
    RUNS,
    decode_error,
    describe_validation,
    not_found,
    progress_values,
)

__all__ = ["ProgressRule", "SqlRunJournal", "decode_entry"]

ProgressRule = Callable[[JournalEntry], tuple[int, str] | None]
"""What a run's record says about its progress once a checkpoint is written: ``(pct, message)``
for the entry, or ``None`` to leave the progress as it is."""


class SqlRunJournal:
    """A :class:`~agent_plugin.journal.RunJournal` whose entries are rows of
    ``agent_run_checkpoints``: each :meth:`record` is one ``INSERT``, durable when it returns.

    Records through one journal are written one at a time, in the order they were made (calls
    running in parallel finish concurrently); two journals writing one run are two writers,
    and one of them gets ``CONFLICT`` rather than both getting the same seq.
    """

    def __init__(
        self,
        database: Database,
        run_id: str,
        *,
        attempt: int | None = None,
        progress: ProgressRule | None = None,
        after_seq: int | None = None,
    ) -> None:
        self.database = database
        self.run_id = run_id
        self.attempt = attempt
        self.progress = progress
        self.seq = after_seq
        """The seq of the run's latest checkpoint, when the journal was told where it starts
        (``after_seq``): each record then takes the next seq itself, so a record tried again
        after a failure that may have committed is written once (see :meth:`record`)."""
        self._unsure: JournalEntry | None = None
        self._writing = asyncio.Lock()

    def __repr__(self) -> str:
        return f"SqlRunJournal(run_id={self.run_id!r}, attempt={self.attempt!r})"

    async def record(self, entry: JournalEntry) -> None:
        """Append ``entry`` as the run's next checkpoint (seq = last + 1, in the same statement).

        ``NOT_FOUND`` if the run has no record; ``CONFLICT`` if another writer took the same
        seq at the same moment, or (with ``attempt``) the run moved on to another attempt.
        With a ``progress`` rule, the progress it gives for ``entry`` is written with it.

        A record that failed as ``unavailable`` may have committed all the same (the
        connection broke after the commit): with ``after_seq`` given, recording the same
        entry again finds its seq taken and counts it as written, once.
        """
        async with self._writing:
            await self._record(entry)

    async def _record(self, entry: JournalEntry) -> None:
        now = utcnow()
        seq = None if self.seq is None else self.seq + 1
        values = {
            "run": self.run_id,
            "new_seq": seq,
            "of_attempt": self.attempt,
            "new_kind": entry.kind,
            "new_step": getattr(entry, "step", None),
            "new_position": getattr(entry, "position", None),
            "new_call_id": shown_call_id(entry),
            "new_payload": entry.model_dump(mode="json", exclude={"kind"}),
            "new_created_at": now,
        }
        insert = _INSERTS[self.attempt is not None, seq is not None]
        progress = self.progress(entry) if self.progress is not None else None
        try:
            async with self.database.write() as conn:
                if (await conn.execute(insert, values)).rowcount == 1:
                    if progress is not None:
                        pct, message = progress
                        await conn.execute(
                            PROGRESS, progress_values(self.run_id, pct, message, now)
                        )
                    self.seq, self._unsure = seq, None
                    return
                head = (
                    await conn.execute(
                        sa.select(RUNS.status, RUNS.attempt).where(RUNS.run_id == self.run_id)
                    )
                ).one_or_none()
        except AgentError as error:
            if error.kind is ErrorKind.UNAVAILABLE:
                self._unsure = entry  # it may have committed before the connection broke
            raise
        except exc.IntegrityError as clash:
            if seq is not None and self._unsure is entry:  # the earlier try did commit
                self.seq, self._unsure = seq, None
                return
            raise AgentError(
                ErrorKind.CONFLICT,
                f"run {self.run_id!r}: another writer recorded a checkpoint at the same time; "
                "only one worker may run a run",
            ) from clash
        if head is None:
            raise not_found(self.run_id)
        raise AgentError(
            ErrorKind.CONFLICT,
            f"run {self.run_id!r} is {head[0]} at attempt {head[1]}; attempt {self.attempt} "
            "may no longer record checkpoints",
        )


def _checkpoint_insert(*, of_attempt: bool, given_seq: bool) -> sa.Insert:
    """The checkpoint ``INSERT`` of the entry bound as ``new_<column>``: seq = the run's last
    + 1, in the same statement (``given_seq``: the seq bound as ``new_seq``); with
    ``of_attempt``, only while the run is in progress at the attempt bound as ``of_attempt``.
    (Bind names differ from column names, as SQLAlchemy requires in an ``INSERT``.)"""
    columns = CHECKPOINTS.__table__.c
    run_id = sa.bindparam("run", type_=columns.run_id.type)
    next_seq: sa.ColumnElement[int] = (
        sa.bindparam("new_seq", type_=columns.seq.type)
        if given_seq
        else sa.select(sa.func.coalesce(sa.func.max(columns.seq), 0) + 1)
        .where(columns.run_id == run_id)
        .scalar_subquery()
    )
    where = [RUNS.run_id == run_id]
    if of_attempt:
        where += [
            RUNS.attempt == sa.bindparam("of_attempt", type_=sa.Integer()),
            RUNS.status == RunStatus.IN_PROGRESS.value,
        ]
    fields = ("kind", "step", "position", "call_id", "payload", "created_at")
    source = sa.select(
        RUNS.run_id,
        next_seq,
        *(sa.bindparam(f"new_{name}", type_=columns[name].type) for name in fields),
    ).where(*where)
    return sa.insert(CHECKPOINTS).from_select(["run_id", "seq", *fields], source)


_INSERTS: Final = {
    (of_attempt, given_seq): _checkpoint_insert(of_attempt=of_attempt, given_seq=given_seq)
    for of_attempt in (False, True)
    for given_seq in (False, True)
}
"""The checkpoint inserts by ``(of_attempt, given_seq)``, built once."""


def decode_entry(run_id: str, seq: int, kind: str, payload: str | None) -> JournalEntry:
    where = f"checkpoint {seq} ({kind})"
    try:
        data = json.loads(payload or "")
        if not isinstance(data, dict):
            raise ValueError("the payload is not a JSON object")
        return journal_entry_adapter.validate_python({**data, "kind": kind})
    except ValidationError as error:
        raise decode_error(run_id, where, describe_validation(error)) from error
    except ValueError as error:
        raise decode_error(run_id, where, str(error)) from error
