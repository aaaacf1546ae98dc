"""Session branches and locks: every entry of ``agent_session_entries`` names the entry it
follows (``parent_seq``, ``NULL`` for a root), and ``agent_sessions`` gains ``head`` (the leaf
the next run continues, ``NULL`` while a session has no branches) and a lock
(``lock_seq``, ``lock_fingerprint``, ``NULL`` when unlocked).

Existing entries each follow the entry before them: ``parent_seq = seq - 1``. A downgrade keeps
every entry but forgets the branches: a session reads as all its entries in seq order.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 04:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("agent_session_entries", sa.Column("parent_seq", sa.Integer(), nullable=True))
    op.execute("UPDATE agent_session_entries SET parent_seq = seq - 1 WHERE seq > 1")
    op.add_column("agent_sessions", sa.Column("head", sa.Integer(), nullable=True))
    op.add_column("agent_sessions", sa.Column("lock_seq", sa.Integer(), nullable=True))
    op.add_column(
        "agent_sessions", sa.Column("lock_fingerprint", sa.String(length=64), nullable=True)
    )


def downgrade() -> None:
    # plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+): a batch copy of agent_sessions would
    # drop the table, and with it every entry through the foreign key's ON DELETE CASCADE
    for column in ("lock_fingerprint", "lock_seq", "head"):
        op.drop_column("agent_sessions", column)
    op.drop_column("agent_session_entries", "parent_seq")
