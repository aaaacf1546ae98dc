"""The agent plugin's first tables: sessions, memory, background runs.

Revision ID: 0001
Revises:
Create Date: 2026-01-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUN_STATUSES = ("queued", "in_progress", "awaiting_approval", "complete", "failed", "cancelled")
CHECKPOINT_KINDS = ("model_reply", "tool_result")


def _json() -> sa.types.TypeEngine[Any]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _timestamp(name: str, *, nullable: bool = False) -> sa.Column[Any]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(repr(value) for value in values)})"


def upgrade() -> None:
    op.create_table(
        "agent_sessions",
        sa.Column("id", sa.String(255), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agent_sessions")),
    )
    op.create_table(
        "agent_session_entries",
        sa.Column("session_id", sa.String(255), nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("payload", _json(), nullable=False),
        _timestamp("created_at"),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["agent_sessions.id"],
            name=op.f("fk_agent_session_entries_session_id_agent_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", "seq", name=op.f("pk_agent_session_entries")),
    )
    op.create_index(
        op.f("ix_agent_session_entries_session_id_kind_seq"),
        "agent_session_entries",
        ["session_id", "kind", "seq"],
    )
    op.create_table(
        "agent_memory_blocks",
        sa.Column("scope", sa.String(255), nullable=False),
        sa.Column("label", sa.String(255), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("entries", _json(), nullable=False),
        sa.Column("limit_chars", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        _timestamp("updated_at"),
        sa.PrimaryKeyConstraint("scope", "label", name=op.f("pk_agent_memory_blocks")),
    )
    op.create_table(
        "agent_memory_edits",
        sa.Column("scope", sa.String(255), nullable=False),
        sa.Column("edit_key", sa.String(255), nullable=False),
        _timestamp("created_at"),
        sa.PrimaryKeyConstraint("scope", "edit_key", name=op.f("pk_agent_memory_edits")),
    )
    op.create_table(
        "agent_runs",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("origin", sa.String(64), nullable=False),
        sa.Column("session_id", sa.String(255), nullable=True),
        sa.Column("memory_scope", sa.String(255), nullable=True),
        sa.Column("progress_pct", sa.Integer(), nullable=False),
        sa.Column("progress_message", sa.Text(), nullable=True),
        _timestamp("created_at"),
        _timestamp("started_at", nullable=True),
        _timestamp("finished_at", nullable=True),
        _timestamp("updated_at"),
        sa.Column("outcome", _json(), nullable=True),
        sa.Column("error", _json(), nullable=True),
        sa.Column("state", _json(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.CheckConstraint(_in("status", RUN_STATUSES), name=op.f("ck_agent_runs_status")),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_agent_runs")),
    )
    op.create_index(op.f("ix_agent_runs_status"), "agent_runs", ["status"])
    op.create_index(op.f("ix_agent_runs_session_id"), "agent_runs", ["session_id"])
    op.create_table(
        "agent_run_checkpoints",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("call_id", sa.String(255), nullable=True),
        sa.Column("payload", _json(), nullable=False),
        _timestamp("created_at"),
        sa.CheckConstraint(
            _in("kind", CHECKPOINT_KINDS), name=op.f("ck_agent_run_checkpoints_kind")
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["agent_runs.run_id"],
            name=op.f("fk_agent_run_checkpoints_run_id_agent_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "seq", name=op.f("pk_agent_run_checkpoints")),
        sa.UniqueConstraint(
            "run_id",
            "kind",
            "step",
            "position",
            name=op.f("uq_agent_run_checkpoints_run_id_kind_step_position"),
        ),
    )


def downgrade() -> None:
    op.drop_table("agent_run_checkpoints")
    op.drop_index(op.f("ix_agent_runs_session_id"), table_name="agent_runs")
    op.drop_index(op.f("ix_agent_runs_status"), table_name="agent_runs")
    op.drop_table("agent_runs")
    op.drop_table("agent_memory_edits")
    op.drop_table("agent_memory_blocks")
    op.drop_index(
        op.f("ix_agent_session_entries_session_id_kind_seq"), table_name="agent_session_entries"
    )
    op.drop_table("agent_session_entries")
    op.drop_table("agent_sessions")
