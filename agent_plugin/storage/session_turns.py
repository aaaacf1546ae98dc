"""Whose turn it is in a session, as the run records say: one query answers whether other runs
of a session hold it (:func:`session_held`), for a run waiting for its turn, for
``session_lock = "reject"`` and for heartbeat ticks. The partial unique index of migration
0007 backs it: however the answers race, the database starts one run of a session at a time.
"""

from __future__ import annotations

from typing import Final

import sqlalchemy as sa
from sqlalchemy.orm import aliased

from agent_plugin.records import RunStatus
from agent_plugin.storage.database import Database
from agent_plugin.storage.run_sql import RUNS, database_now

__all__ = ["UNRESERVED_ORIGIN", "session_held"]

UNRESERVED_ORIGIN: Final = "followup"
"""The origin of runs booked for later that hold their session only once due (follow-ups)."""


async def session_held(
    database: Database, session_id: str, *, besides: str | None = None, reserved: bool = False
) -> bool:
    """Whether another run of ``session_id`` holds it: one in progress, or one queued (ahead of
    ``besides``, when given: enqueued before it) that is due, or waits for its retry or its
    resume. A ``besides`` in progress itself (the re-delivery of a run whose worker died) is
    held back by no queued run: it has the session already. With ``reserved``, a queued run
    booked for later holds it from its enqueue too (what ``session_lock = "reject"``
    promises), unless it is a follow-up."""
    other = aliased(RUNS)
    waiting = sa.or_(
        other.attempt > 0,
        other.lease_until.is_(None),
        other.lease_until <= database_now(),
        other.origin != UNRESERVED_ORIGIN if reserved else sa.false(),
    )
    queued = sa.and_(other.status == RunStatus.QUEUED.value, waiting)
    where = [other.session_id == session_id]
    if besides is not None:
        mine = sa.select(RUNS.session_seq, RUNS.status).where(RUNS.run_id == besides).subquery()
        place = sa.select(mine.c.session_seq).scalar_subquery()
        running = sa.select(mine.c.status).scalar_subquery() == RunStatus.IN_PROGRESS.value
        where.append(other.run_id != besides)
        queued = sa.and_(queued, other.session_seq < place, sa.not_(running))
    query = (
        sa.select(other.run_id)
        .where(*where, sa.or_(other.status == RunStatus.IN_PROGRESS.value, queued))
        .limit(1)
    )
    async with database.read() as conn:
        return (await conn.execute(query)).first() is not None
