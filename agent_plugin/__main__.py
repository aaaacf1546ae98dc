"""Command line: ``python -m agent_plugin migrate [upgrade|downgrade|current|history]``.

``migrate`` (or ``migrate upgrade [REVISION]``) brings the plugin's tables to the newest
revision; ``migrate downgrade REVISION`` takes them back (``base`` drops every plugin table) and
asks first, unless ``--yes``; ``current`` and ``history`` say where the database is and what
there is. The database is the app's: ``database_url`` read from the same layers (``agent.toml``,
the profile overlay, ``AGENT_*``, ``.env``, the secrets directory), unless ``--database-url``
names another. Prefer ``AGENT_DATABASE_URL`` for a URL that carries a password, so it stays out
of the shell history and the process list.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from agent_plugin.errors import AgentError

__all__ = ["main"]

_DRIVER_HINT = "for PostgreSQL: pip install 'fastapi-agent-plugin[postgres]'"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agent_plugin", description="fastapi-agent-plugin maintenance commands"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    migrate = commands.add_parser(
        "migrate",
        help="upgrade, downgrade or inspect the plugin's database tables",
        description="Manage the plugin's tables in the app's database (database_url from "
        "agent.toml, the profile overlay and AGENT_* variables, or --database-url). Without "
        "an action: upgrade to head.",
    )
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument(
        "--database-url",
        default=None,
        help="another database, e.g. sqlite+aiosqlite:///agent.db or "
        "postgresql+asyncpg://user@host/db (default: the app's database_url)",
    )
    where.add_argument(
        "--config-file",
        default=None,
        help="the app's config file (default: $AGENT_CONFIG_FILE or agent.toml)",
    )
    # Also before the action (``migrate --database-url URL``), kept apart: a subparser's
    # defaults would overwrite a value given there.
    migrate.add_argument("--database-url", dest="outer_url", default=None, help=argparse.SUPPRESS)
    migrate.add_argument("--config-file", dest="outer_config", default=None, help=argparse.SUPPRESS)
    actions = migrate.add_subparsers(dest="action", metavar="ACTION")
    upgrade = actions.add_parser("upgrade", parents=[where], help="upgrade (default: to head)")
    upgrade.add_argument("revision", nargs="?", default="head", help="target (default: head)")
    downgrade = actions.add_parser(
        "downgrade", parents=[where], help="downgrade to a revision; base drops every table"
    )
    downgrade.add_argument("revision", help="target revision, or base to drop every plugin table")
    downgrade.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    actions.add_parser("current", parents=[where], help="the revision the database is at")
    actions.add_parser("history", parents=[where], help="the plugin's revisions, newest first")
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    confirm: Callable[[str], str] = input,
    stdin: TextIO | None = None,
) -> int:
    """Run the command line; return the process exit code.

    ``confirm`` asks the downgrade question (``input`` by default) when ``stdin`` is a terminal.
    """
    args = _parser().parse_args(argv)
    action = args.action or "upgrade"
    try:
        url, origin = _database_url(
            getattr(args, "database_url", None) or args.outer_url,
            getattr(args, "config_file", None) or args.outer_config,
        )
        if action == "history":
            return _print(asyncio.run(_history(url)))
        if action == "downgrade":
            undone = asyncio.run(_undone(url, args.revision))
            if not undone:
                return _print(asyncio.run(_current(url)))
            if not args.yes and not _confirmed(url, args.revision, undone, confirm, stdin):
                return 2
        revision = getattr(args, "revision", "head")
        message = asyncio.run(_migrate(url, action, revision))
    except ModuleNotFoundError as error:
        print(f"error: {error.name} is not installed ({_DRIVER_HINT})", file=sys.stderr)
        return 1
    except AgentError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return _print(f"{message} ({origin})" if action == "current" else message)


def _print(message: str) -> int:
    print(message)
    return 0


def _database_url(given: str | None, config_file: str | None) -> tuple[str, str]:
    """The database to work on, and where its URL came from."""
    if given:
        return given, "--database-url"
    from agent_plugin.config import AgentSettings

    settings = AgentSettings.load(config_file=config_file)
    return settings.database_url, "database_url of the app's settings"


def _confirmed(
    url: str,
    revision: str,
    undone: Sequence[str],
    confirm: Callable[[str], str],
    stdin: TextIO | None,
) -> bool:
    from agent_plugin.storage.database import hide_password

    stream = sys.stdin if stdin is None else stdin
    loss = (
        "This drops every plugin table and the data in them"
        if revision == "base"
        else "Tables and columns these migrations added are dropped, with their data"
    )
    what = f"Downgrading {hide_password(url)} undoes {', '.join(undone)}. {loss}."
    if not stream.isatty():
        print(f"error: {what} Pass --yes to go ahead.", file=sys.stderr)
        return False
    answer = confirm(f"{what} Go ahead? [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        print("downgrade cancelled", file=sys.stderr)
        return False
    return True


async def _undone(url: str, revision: str) -> list[str]:
    from agent_plugin.storage.database import Database
    from agent_plugin.storage.migrations import revisions_between

    async with Database(url) as database:
        current = await database.current_revision()
    return [item.id for item in revisions_between(current, revision)]


async def _current(url: str) -> str:
    from agent_plugin.storage.database import Database
    from agent_plugin.storage.migrations import revisions

    async with Database(url) as database:
        current = await database.current_revision()
        shown = database.display_url
    head = revisions()[0].id
    if current is None:
        return f"database {shown} is at base (no plugin tables); head is {head}"
    state = "head" if current == head else f"behind head {head}: run migrate upgrade"
    return f"database {shown} is at revision {current} ({state})"


async def _history(url: str) -> str:
    from agent_plugin.storage.database import Database
    from agent_plugin.storage.migrations import revisions

    async with Database(url) as database:
        current = await database.current_revision()
    lines = []
    for index, item in enumerate(revisions()):
        marks = [mark for mark, on in (("head", index == 0), ("current", item.id == current)) if on]
        label = f" ({', '.join(marks)})" if marks else ""
        lines.append(f"{item.id}{label}  {item.title}")
    lines.append("base" + (" (current)" if current is None else "") + "  no plugin tables")
    return "\n".join(lines)


async def _migrate(url: str, action: str, revision: str) -> str:
    from agent_plugin.storage.database import Database

    if action == "current":
        return await _current(url)
    async with Database(url) as database:
        if action == "upgrade":
            await database.migrate(revision)
        else:
            await database.downgrade(revision)
    return await _current(url)


if __name__ == "__main__":
    sys.exit(main())
