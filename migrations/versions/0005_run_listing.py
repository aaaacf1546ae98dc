"""Runs are listed newest first: an index on ``(created_at, run_id)`` of ``agent_runs``, the
keyset ``GET {prefix}/runs`` pages by.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 00:00:01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_agent_runs_created_at_run_id"


def upgrade() -> None:
    op.create_index(op.f(INDEX), "agent_runs", ["created_at", "run_id"])


def downgrade() -> None:
    op.drop_index(op.f(INDEX), table_name="agent_runs")
