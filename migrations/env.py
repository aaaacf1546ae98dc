"""Alembic environment for the agent plugin's tables (async-aware).

Normally run through ``python -m agent_plugin migrate`` or ``Database.migrate()``, which hand
Alembic an open connection. Run by the ``alembic`` command instead, it reads the URL from the
config's ``sqlalchemy.url`` or from ``AGENT_DATABASE_URL`` and opens its own async engine.
Alembic's version table is ``agent_alembic_version`` and only ``agent_*`` tables take part in
autogenerate, so an application's own tables and its own Alembic history are left alone.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import sqlalchemy as sa
from alembic import context

from agent_plugin.storage.database import DEFAULT_DATABASE_URL, Database
from agent_plugin.storage.migrations import VERSION_TABLE, include_name
from agent_plugin.storage.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    return (
        config.get_main_option("sqlalchemy.url")
        or os.environ.get("AGENT_DATABASE_URL")
        or DEFAULT_DATABASE_URL
    )


def _configure(**options: Any) -> None:
    context.configure(
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        include_name=include_name,
        compare_type=True,
        render_as_batch=True,
        **options,
    )


def run_offline() -> None:
    """Emit the SQL instead of running it (``alembic upgrade head --sql``)."""
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_on(connection: sa.Connection) -> None:
    """Run the migrations on an open connection."""
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


async def run_with_own_engine() -> None:
    """Open the plugin's own engine for the URL, migrate, close it."""
    database = Database(_url())
    try:
        async with database.write() as connection:
            await connection.run_sync(run_on)
    finally:
        await database.dispose()


if context.is_offline_mode():
    run_offline()
elif (connection := config.attributes.get("connection")) is not None:
    run_on(connection)
else:
    asyncio.run(run_with_own_engine())
