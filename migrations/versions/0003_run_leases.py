"""Each run names the job that may run it, and the delivery running it holds a lease.

``agent_runs`` gains ``job_id`` (the arq job that may start the run: the run id for a run's own
job, the resume job's id once decisions are accepted) and ``lease_until`` (while it lies ahead,
no other delivery may start the run: its worker is alive and renewing it, or a retry's backoff
has not passed, or a deferred run is not due). Existing runs that are not waiting for a resume
get their own run id as their job; a resume already queued keeps ``NULL`` (any delivery may
start it, as before).

Upgrade with the workers stopped: a worker of an earlier release holds no lease, so a run it
is running could be taken for lost. A run enqueued by hand under a job id of its own, queued at
the upgrade, is refused to that job and started by the reconciler's job instead (a minute
later, by default).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("agent_runs") as batch:
        batch.add_column(sa.Column("job_id", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE agent_runs SET job_id = run_id WHERE decisions IS NULL")


def downgrade() -> None:
    with op.batch_alter_table("agent_runs") as batch:
        batch.drop_column("lease_until")
        batch.drop_column("job_id")
