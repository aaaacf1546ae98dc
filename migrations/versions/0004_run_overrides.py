"""A run's stored arguments hold its agent overrides as one value.

``agent_runs.args`` was the flat job payload (``prompt``, ``system_prompt``, ``max_steps``,
``session``, ``memory_scope``, ``deliver``, ``origin``, ``run_id``, ``followup_depth``); it
becomes ``{"prompt", "overrides": {...}, "deliver", "origin"}``, where ``overrides`` is the
run's ``AgentOverrides``. A heartbeat tick's run becomes ``read_only`` (the policy its worker
used to derive from the origin). A run recorded without arguments that can still continue (it
has checkpoints, or a paused state) gets them from its columns, with a placeholder prompt it
never reads; one that cannot is left without, and fails when a worker delivers it, as before.

Upgrade with the workers stopped, as for every migration of the run tables. The downgrade
writes the flat shape back.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 00:00:00
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OVERRIDES = ("system_prompt", "max_steps", "memory_scope", "session", "followup_depth")
_NOT_RECORDED = "(this run's prompt was not recorded)"
_BATCH = 500


def _runs() -> sa.Table:
    json_type = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    return sa.table(
        "agent_runs",
        sa.column("run_id", sa.String()),
        sa.column("origin", sa.String()),
        sa.column("session_id", sa.String()),
        sa.column("memory_scope", sa.String()),
        sa.column("args", json_type),
        sa.column("state", json_type),
    )


def _loaded(value: Any) -> dict[str, Any] | None:
    if isinstance(value, str):  # a driver that hands JSON back as text
        value = json.loads(value)
    return value if isinstance(value, dict) else None


def _nested(old: dict[str, Any]) -> dict[str, Any]:
    overrides = {key: old[key] for key in _OVERRIDES if old.get(key) is not None}
    if old.get("origin") == "heartbeat":
        overrides["read_only"] = True
    return {
        "prompt": old.get("prompt") or _NOT_RECORDED,
        "overrides": overrides,
        "deliver": bool(old.get("deliver", False)),
        "origin": old.get("origin") or "request",
    }


def _flat(new: dict[str, Any], run_id: str) -> dict[str, Any]:
    overrides = new.get("overrides") or {}
    flat = {key: overrides[key] for key in _OVERRIDES if key in overrides}
    return {
        "prompt": new.get("prompt"),
        **flat,
        "deliver": bool(new.get("deliver", False)),
        "origin": new.get("origin") or "request",
        "run_id": run_id,
    }


def _rewrite(convert: Any, *, fill_missing: bool) -> None:
    bind = op.get_bind()
    runs = _runs()
    checkpoints = sa.table("agent_run_checkpoints", sa.column("run_id", sa.String()))
    checkpointed = sa.select(sa.literal(1)).where(checkpoints.c.run_id == runs.c.run_id)
    query = sa.select(
        runs.c.run_id,
        runs.c.args,
        runs.c.origin,
        runs.c.session_id,
        runs.c.memory_scope,
        sa.or_(runs.c.state.is_not(None), sa.exists(checkpointed)),
    ).order_by(runs.c.run_id)
    after: str | None = None
    while True:
        page = query if after is None else query.where(runs.c.run_id > after)
        rows = bind.execute(page.limit(_BATCH)).all()
        for run_id, args, origin, session_id, memory_scope, resumable in rows:
            old = _loaded(args)
            if old is None:
                if not (fill_missing and resumable):
                    continue
                old = {"origin": origin, "session": session_id, "memory_scope": memory_scope}
            bind.execute(
                runs.update().where(runs.c.run_id == run_id).values(args=convert(old, run_id))
            )
        if len(rows) < _BATCH:
            return
        after = rows[-1][0]


def upgrade() -> None:
    _rewrite(lambda old, _run_id: _nested(old), fill_missing=True)


def downgrade() -> None:
    _rewrite(_flat, fill_missing=False)
