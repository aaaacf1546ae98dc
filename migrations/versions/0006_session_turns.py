"""Runs of one session take their turns in the order they were enqueued: ``agent_runs`` gains
``session_seq``, the run's place in its session's queue (1, 2, 3, ... per session, given when
the run is enqueued, and again when decisions for a paused run queue its resume), unique per
session. The database, not Redis, says whose turn it is, so a Redis that loses its data
cannot let a later run of a session go before an earlier one waiting for its retry.

Existing runs of a session are numbered by ``(created_at, run_id)``.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 20:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_agent_runs_session_id_session_seq"


def upgrade() -> None:
    with op.batch_alter_table("agent_runs") as batch:
        batch.add_column(sa.Column("session_seq", sa.BigInteger(), nullable=True))
    op.execute(
        "UPDATE agent_runs SET session_seq = (SELECT count(*) FROM agent_runs AS earlier "
        "WHERE earlier.session_id = agent_runs.session_id AND (earlier.created_at < "
        "agent_runs.created_at OR (earlier.created_at = agent_runs.created_at AND "
        "earlier.run_id <= agent_runs.run_id))) WHERE session_id IS NOT NULL"
    )
    op.create_index(op.f(INDEX), "agent_runs", ["session_id", "session_seq"], unique=True)


def downgrade() -> None:
    op.drop_index(op.f(INDEX), table_name="agent_runs")
    with op.batch_alter_table("agent_runs") as batch:
        batch.drop_column("session_seq")
