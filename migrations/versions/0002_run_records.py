"""Run records and step checkpoints as the run store uses them.

``agent_runs`` gains the job's arguments (``args``), the reviewers' accepted decisions
(``decisions``) and a ``version`` for compare-and-set. ``agent_run_checkpoints`` holds the
entries of :mod:`agent_plugin.journal` (``started``, ``replied``, ``tool_done``, ...): ``step``
and ``position`` become optional (a ``started`` entry has neither), the unique
``(run_id, kind, step, position)`` goes (a run resumed twice starts twice) and so does the check
on ``kind`` (the entry kinds grow with the code; the store reports an unknown kind when it reads
it); ``(run_id, seq)`` stays the key. Checkpoints of the earlier shape were never written by
any release and could not be replayed, so the table is emptied on the way up and on the way
down.

Revision ID: 0002
Revises: 0001
Create Date: 2026-01-02 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_KINDS = ("model_reply", "tool_result")
KIND_CHECK = "ck_agent_run_checkpoints_kind"
UNIQUE_STEP = "uq_agent_run_checkpoints_run_id_kind_step_position"


def _json() -> sa.types.TypeEngine[Any]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(repr(value) for value in values)})"


def upgrade() -> None:
    with op.batch_alter_table("agent_runs") as batch:
        batch.add_column(sa.Column("args", _json(), nullable=True))
        batch.add_column(sa.Column("decisions", _json(), nullable=True))
        batch.add_column(
            sa.Column("version", sa.Integer(), server_default=sa.text("0"), nullable=False)
        )
    op.execute("DELETE FROM agent_run_checkpoints")
    with op.batch_alter_table("agent_run_checkpoints") as batch:
        batch.drop_constraint(op.f(UNIQUE_STEP), type_="unique")
        batch.drop_constraint(op.f(KIND_CHECK), type_="check")
        batch.alter_column("step", existing_type=sa.Integer(), nullable=True)
        batch.alter_column("position", existing_type=sa.Integer(), nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM agent_run_checkpoints")
    with op.batch_alter_table("agent_run_checkpoints") as batch:
        batch.alter_column("step", existing_type=sa.Integer(), nullable=False)
        batch.alter_column("position", existing_type=sa.Integer(), nullable=False)
        batch.create_check_constraint(op.f(KIND_CHECK), _in("kind", OLD_KINDS))
        batch.create_unique_constraint(op.f(UNIQUE_STEP), ["run_id", "kind", "step", "position"])
    with op.batch_alter_table("agent_runs") as batch:
        batch.drop_column("version")
        batch.drop_column("decisions")
        batch.drop_column("args")
