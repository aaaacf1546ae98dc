"""Running the plugin's Alembic migrations from code or from ``python -m agent_plugin migrate``.

The migration scripts live in the repository's top-level ``migrations/`` folder and ship inside
the wheel as ``agent_plugin/_migrations``; :func:`migrations_dir` finds either. Alembic keeps its
bookkeeping in ``agent_alembic_version``, so the plugin's history never mixes with an
application's own Alembic history in the same database.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.util import CommandError

from agent_plugin.errors import AgentError

__all__ = [
    "VERSION_TABLE",
    "alembic_config",
    "current_revision",
    "include_name",
    "migrations_dir",
    "run_migrations",
]

VERSION_TABLE: Final = "agent_alembic_version"
"""Alembic's version table for the plugin's migration history."""

TABLE_PREFIX: Final = "agent_"

_PACKAGE_DIR: Final = Path(__file__).resolve().parent.parent


def migrations_dir() -> Path:
    """The folder holding ``env.py`` and ``versions/``: inside the wheel or in a checkout."""
    for candidate in (_PACKAGE_DIR / "_migrations", _PACKAGE_DIR.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise AgentError.config(
        "the agent plugin's migration scripts are missing: expected agent_plugin/_migrations "
        "(installed wheel) or migrations/ (source checkout)"
    )


def alembic_config(connection: sa.Connection | None = None, url: str | None = None) -> Config:
    """An Alembic config for the plugin's scripts, bound to a connection or a URL."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def run_migrations(
    connection: sa.Connection, direction: Literal["upgrade", "downgrade"], revision: str
) -> None:
    """Upgrade or downgrade on an open (synchronous) connection; used through ``run_sync``."""
    config = alembic_config(connection)
    try:
        if direction == "upgrade":
            command.upgrade(config, revision)
        else:
            command.downgrade(config, revision)
    except CommandError as error:
        raise AgentError.config(f"cannot {direction} to {revision!r}: {error}") from error


def current_revision(connection: sa.Connection) -> str | None:
    """The revision recorded in ``agent_alembic_version``, or ``None``."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def include_name(name: str | None, type_: str, _parent_names: object) -> bool:
    """Alembic's filter: only the plugin's own tables take part in autogenerate."""
    if type_ == "table":
        return name is not None and name.startswith(TABLE_PREFIX) and name != VERSION_TABLE
    return True
