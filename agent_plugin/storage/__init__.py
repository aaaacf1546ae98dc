"""SQLAlchemy implementations of the plugin's stores, on SQLite (default) or PostgreSQL.

PostgreSQL needs the ``postgres`` extra (``pip install 'fastapi-agent-plugin[postgres]'``). One
:class:`Database` per application owns the async engine; the stores share
it::

    database = Database("sqlite+aiosqlite:///agent.db")
    await database.migrate()              # or: python -m agent_plugin migrate --database-url ...
    sessions = SqlSessionStore(database)
    memory = SqlMemoryStore(database)
    runs = SqlRunStore(database)          # background run records and step checkpoints
    ...
    await database.dispose()

The tables (all named ``agent_*``) are defined in :mod:`agent_plugin.storage.models` and created
by the Alembic migrations that ship with the package.
"""

from agent_plugin.storage.database import DEFAULT_DATABASE_URL, Database, hide_password
from agent_plugin.storage.memory import SqlMemoryStore
from agent_plugin.storage.runs import SqlRunJournal, SqlRunStore
from agent_plugin.storage.sessions import SqlSessionStore

__all__ = [
    "DEFAULT_DATABASE_URL",
    "Database",
    "SqlMemoryStore",
    "SqlRunJournal",
    "SqlRunStore",
    "SqlSessionStore",
    "hide_password",
]
