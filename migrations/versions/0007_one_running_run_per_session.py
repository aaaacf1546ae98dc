"""One run of a session runs at a time, as the database says: a partial unique index on
``agent_runs(session_id)`` over the runs in progress. Starting a second run of a session
while another is in progress is refused by the database, whatever Redis remembers (the
Redis session lock of earlier releases is gone).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 04:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from agent_plugin.errors import AgentError, ErrorKind

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ux_agent_runs_session_id_in_progress"
WHERE = "status = 'in_progress' AND session_id IS NOT NULL"


def upgrade() -> None:
    doubled = op.get_bind().execute(
        sa.text(
            f"SELECT session_id FROM agent_runs WHERE {WHERE} "
            "GROUP BY session_id HAVING COUNT(*) > 1"
        )
    )
    sessions = [row[0] for row in doubled]
    if sessions:
        raise AgentError(
            ErrorKind.CONFLICT,
            f"{len(sessions)} session(s) have more than one run in progress (first: "
            f"{sessions[0]!r}): stop the workers of the older release, let their runs end or "
            "cancel them, then migrate again",
        )
    op.create_index(
        op.f(INDEX),
        "agent_runs",
        ["session_id"],
        unique=True,
        sqlite_where=sa.text(WHERE),
        postgresql_where=sa.text(WHERE),
    )


def downgrade() -> None:
    op.drop_index(op.f(INDEX), table_name="agent_runs")
