"""Command line: ``python -m agent_plugin migrate [upgrade|downgrade] [revision] --database-url``.

``migrate`` brings the plugin's tables to the newest revision (``upgrade head``, the default) or
takes them back (``downgrade``, to ``base`` unless a revision is given). The URL comes from
``--database-url`` or the ``AGENT_DATABASE_URL`` environment variable; prefer the variable for a
URL that carries a password, so it stays out of the shell history and the process list.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from agent_plugin.errors import AgentError

__all__ = ["main"]

_URL_VARIABLE = "AGENT_DATABASE_URL"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agent_plugin", description="fastapi-agent-plugin maintenance commands"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    migrate = commands.add_parser(
        "migrate",
        help="upgrade or downgrade the plugin's database tables",
        description="Upgrade (default: to head) or downgrade (default: to base) the plugin's "
        f"tables. The database URL comes from --database-url or ${_URL_VARIABLE}.",
    )
    migrate.add_argument(
        "direction", nargs="?", choices=("upgrade", "downgrade"), default="upgrade"
    )
    migrate.add_argument(
        "revision", nargs="?", help="target revision (default: head to upgrade, base to downgrade)"
    )
    migrate.add_argument(
        "--database-url",
        default=None,
        help=f"e.g. sqlite+aiosqlite:///agent.db or postgresql+asyncpg://user@host/db "
        f"(default: ${_URL_VARIABLE})",
    )
    return parser


async def _migrate(url: str, direction: str, revision: str) -> str:
    from agent_plugin.storage.database import Database

    database = Database(url)
    try:
        if direction == "upgrade":
            await database.migrate(revision)
        else:
            await database.downgrade(revision)
        current = await database.current_revision()
    finally:
        await database.dispose()
    return f"database {database.display_url} is at revision {current or 'base (no tables)'}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the process exit code."""
    args = _parser().parse_args(argv)
    url = args.database_url or os.environ.get(_URL_VARIABLE)
    if not url:
        print(f"error: give --database-url or set {_URL_VARIABLE}", file=sys.stderr)
        return 2
    revision = args.revision or ("head" if args.direction == "upgrade" else "base")
    try:
        message = asyncio.run(_migrate(url, args.direction, revision))
    except ModuleNotFoundError as error:
        print(
            f"error: {error.name} is not installed (for PostgreSQL: "
            "pip install 'fastapi-agent-plugin[postgres]')",
            file=sys.stderr,
        )
        return 1
    except AgentError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(message)
    return 0


if __name__ == "__main__":
    sys.exit(main())
