"""The journal a worker's delivery writes: :class:`LeasedRunJournal` groups a run's checkpoints
into the fewest transactions that keep its guarantees.

A model reply with tool calls is written before its calls run, a round's tool message (and any
steering that joined) before the next model call, and (for a run that saves its turn to a
session, which it does before its end is recorded) its final reply before that save; the rest
rides on those writes or on the record of the run's end. Each transaction is one
``UPDATE agent_runs`` (lease and progress, fenced by the attempt) and one ``INSERT`` of
checkpoints whose seqs the journal numbers itself, so a write tried again after a commit it
never heard about counts once. The story, with the counts per run:
``docs/guide/background-runs.md#checkpoints``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy import exc

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.journal import Appended, JournalEntry, Replied, RoundDone, ToolDone
from agent_plugin.records import RunStatus
from agent_plugin.storage.checkpoints import ProgressRule
from agent_plugin.storage.database import Database
from agent_plugin.storage.models import shown_call_id, utcnow
from agent_plugin.storage.run_sql import CHECKPOINTS, NOW, RUNS, from_now, not_found
from agent_plugin.text import storable

__all__ = ["LeasedRunJournal", "Persist"]

Persist = Callable[[str, Callable[[], Awaitable[None]]], Awaitable[None]]
"""How a write is made: ``persist(what, write)`` awaits ``write()`` (and may try it again
through an outage: see :func:`agent_plugin.outages.keep_trying`)."""

_GATHER_TURNS: Final = 10
"""Turns of the event loop a finished call's result waits for more to join its write."""


def _durable_now(entry: JournalEntry, *, final_reply: bool) -> bool:
    """Whether the run must not go on before ``entry`` is written (``final_reply``: a reply
    without tool calls too)."""
    return isinstance(entry, RoundDone | Appended) or (
        isinstance(entry, Replied) and (final_reply or bool(entry.pending))
    )


_RUN_ID = sa.bindparam("run", type_=sa.String())
_ATTEMPT = sa.bindparam("of_attempt", type_=sa.Integer())
_LEASE = sa.bindparam("lease", type_=sa.Float())
_FENCE = (
    RUNS.run_id == _RUN_ID,
    RUNS.attempt == _ATTEMPT,
    RUNS.status == RunStatus.IN_PROGRESS.value,
)
_TOUCH: Final = sa.update(RUNS).where(*_FENCE).values(lease_until=from_now(_LEASE), updated_at=NOW)
_TOUCH_WITH_PROGRESS: Final = _TOUCH.values(
    progress_pct=sa.bindparam("pct", type_=sa.Integer()),
    progress_message=sa.bindparam("message", type_=sa.Text()),
)
_INSERT: Final = sa.insert(CHECKPOINTS)


async def _once(_what: str, write: Callable[[], Awaitable[None]]) -> None:
    await write()


class LeasedRunJournal:
    """A :class:`~agent_plugin.journal.RunJournal` for the delivery that started ``attempt``
    of the run (see the module): checkpoints in few transactions, each renewing the lease by
    ``lease`` seconds and writing the ``progress`` the rule gives.

    ``after_seq``: the seq of the run's latest checkpoint (0 for none). ``persist`` makes
    each write (default: once). ``session``: the run saves its turn to a session before its
    end is recorded, so its final reply is written before it goes on (a delivery that failed
    between the save and the end would otherwise leave its retry a session that holds the turn
    and a journal that does not, and the retry could not tell the turn was its own).
    :meth:`close` writes what is left before the run's end.
    """

    def __init__(
        self,
        database: Database,
        run_id: str,
        *,
        attempt: int,
        after_seq: int,
        lease: float,
        progress: ProgressRule | None = None,
        persist: Persist | None = None,
        session: bool = False,
    ) -> None:
        self.database = database
        self.run_id = run_id
        self.attempt = attempt
        self.seq = after_seq
        self.lease = lease
        self.progress = progress
        self.persist = persist or _once
        self._final_reply = session  # (a session run: its final reply is written at once)
        self.renewed_at = float("-inf")
        """When (``time.monotonic()``) a write last renewed the lease."""
        self.transactions = 0
        """Write transactions committed so far."""
        self._pending: list[JournalEntry] = []
        self._progress: tuple[int, str] | None = None
        self._writing = asyncio.Lock()
        self._soon: asyncio.Task[None] | None = None
        self._failed: AgentError | None = None
        self._unsure = False

    def __repr__(self) -> str:
        return f"LeasedRunJournal(run_id={self.run_id!r}, attempt={self.attempt})"

    async def record(self, entry: JournalEntry) -> None:
        """Add ``entry``; written before this returns when the run must not go on without it
        (see the module), otherwise with the next write or as soon as the run yields."""
        self._raise_failure()
        if self.progress is not None:
            progress = self.progress(entry)
            if progress is not None:
                self._progress = progress
        self._pending.append(entry)
        if _durable_now(entry, final_reply=self._final_reply):
            await self.flush()
        elif isinstance(entry, ToolDone) and (self._soon is None or self._soon.done()):
            self._soon = asyncio.create_task(self._flush_soon(), name=f"journal {self.run_id}")

    async def flush(self, *, results_only: bool = False) -> None:
        """Write every pending checkpoint now (one transaction; nothing if none), or with
        ``results_only`` only if a finished call's result is among them."""
        async with self._writing:
            self._raise_failure()
            if results_only and not self._holds_results():
                return
            if self._pending:
                await self.persist(f"checkpoint {self._pending[-1].kind}", self._write)

    def _holds_results(self) -> bool:
        return any(isinstance(entry, ToolDone) for entry in self._pending)

    async def close(self) -> None:
        """Before the run's end is recorded: write the results of finished calls still
        pending (a round a hook paused or a cancel cut short); the rest (the run's start, its
        final reply) the end's record makes needless."""
        soon, self._soon = self._soon, None
        if soon is not None:
            await asyncio.gather(soon, return_exceptions=True)
        await self.flush(results_only=True)

    async def _flush_soon(self) -> None:
        try:
            for _ in range(_GATHER_TURNS):  # calls finishing together share the write
                await asyncio.sleep(0)
            await self.flush(results_only=True)
        except AgentError as error:
            self._failed = error

    def _raise_failure(self) -> None:
        if self._failed is not None:
            failure, self._failed = self._failed, None
            raise failure

    async def _write(self) -> None:
        batch = list(self._pending)
        now = utcnow()
        rows = [
            {
                "run_id": self.run_id,
                "seq": self.seq + i,
                "kind": entry.kind,
                "step": getattr(entry, "step", None),
                "position": getattr(entry, "position", None),
                "call_id": shown_call_id(entry),
                "payload": entry.model_dump(mode="json", exclude={"kind"}),
                "created_at": now,
            }
            for i, entry in enumerate(batch, start=1)
        ]
        values: dict[str, Any] = {
            "run": self.run_id,
            "of_attempt": self.attempt,
            "lease": self.lease,
            "now": now,
        }
        progress = self._progress
        if progress is not None:
            values["pct"] = min(max(int(progress[0]), 0), 100)
            values["message"] = storable(progress[1])
        touch = _TOUCH if progress is None else _TOUCH_WITH_PROGRESS
        started = time.monotonic()
        try:
            async with self.database.write() as conn:
                if (await conn.execute(touch, values)).rowcount != 1:
                    head = (
                        await conn.execute(
                            sa.select(RUNS.status, RUNS.attempt).where(RUNS.run_id == self.run_id)
                        )
                    ).one_or_none()
                    raise self._refused(head)
                await conn.execute(_INSERT, rows)
        except AgentError as error:
            if error.kind is ErrorKind.UNAVAILABLE:
                self._unsure = True  # it may have committed before the connection broke
            raise
        except exc.IntegrityError as clash:
            if not self._unsure:
                raise AgentError(
                    ErrorKind.CONFLICT,
                    f"run {self.run_id!r}: another writer recorded a checkpoint at the same "
                    "time; only one worker may run a run",
                ) from clash
            # the earlier try did commit: these checkpoints are written
        self._unsure = False
        self.transactions += 1
        self.seq += len(batch)
        del self._pending[: len(batch)]
        if progress is self._progress:
            self._progress = None
        self.renewed_at = started

    def _refused(self, head: Any) -> AgentError:
        if head is None:
            return not_found(self.run_id)
        status, attempt = head
        return AgentError(
            ErrorKind.CONFLICT,
            f"run {self.run_id!r} is {status} at attempt {attempt}; attempt {self.attempt} "
            "may no longer record checkpoints",
        )
