"""Running the plugin's Alembic migrations from code or from ``python -m agent_plugin migrate``.

The migration scripts live in the repository's top-level ``migrations/`` folder and ship inside
the wheel as ``agent_plugin/_migrations``; :func:`migrations_dir` finds either. Alembic keeps its
bookkeeping in ``agent_alembic_version``, so the plugin's history never mixes with an
application's own Alembic history in the same database.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError

from agent_plugin.errors import AgentError

__all__ = [
    "VERSION_TABLE",
    "Revision",
    "alembic_config",
    "current_revision",
    "include_name",
    "migrations_dir",
    "revisions",
    "revisions_between",
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


@dataclass(frozen=True, slots=True)
class Revision:
    """One migration of the plugin's history."""

    id: str
    down: str | None
    """The revision it follows; ``None`` for the first."""
    title: str
    """The first paragraph of its docstring, on one line."""


def revisions() -> list[Revision]:
    """The plugin's migrations, newest first (the head is the first)."""
    script = ScriptDirectory.from_config(alembic_config())
    found = []
    for item in script.walk_revisions():
        down = item.down_revision
        found.append(
            Revision(
                id=item.revision,
                down=down if isinstance(down, str) else None,
                title=" ".join((item.doc or "").replace("``", "").split("\n\n")[0].split()),
            )
        )
    return found


def revisions_between(current: str | None, target: str) -> list[Revision]:
    """The migrations a downgrade from ``current`` to ``target`` undoes, newest first.

    ``target`` is a revision id or ``base``. Raises a ``config`` error for an unknown revision
    or one that is not below ``current``.
    """
    history = revisions()
    ids = [item.id for item in history]
    if target != "base" and target not in ids:
        raise AgentError.config(
            f"unknown revision {target!r}; the plugin's revisions are: base, "
            + ", ".join(reversed(ids))
        )
    if current is None:
        return []
    start = ids.index(current) if current in ids else 0
    stop = len(ids) if target == "base" else ids.index(target)
    if stop < start:
        raise AgentError.config(
            f"revision {target!r} is newer than the database's {current!r}; use upgrade"
        )
    return history[start:stop]
