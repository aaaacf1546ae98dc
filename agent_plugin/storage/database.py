"""One database connection for the plugin's stores: an async engine plus its session factory.

``Database(url)`` accepts SQLite (``sqlite+aiosqlite:///path/agent.db``, the embedded default) and
PostgreSQL (``postgresql+asyncpg://user@host/db``); the plain ``sqlite://``, ``postgresql://`` and
``postgres://`` forms are given their async driver. Whatever goes wrong in the driver (an
unreachable server, a bad URL, a missing driver) surfaces as an :class:`AgentError` whose message
names the URL with its password hidden.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.engine import URL, AdaptedConnection, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.ext.asyncio import create_async_engine as _create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry, PoolResetState

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.text import storable_json

__all__ = ["DEFAULT_DATABASE_URL", "Database", "hide_password"]

DEFAULT_DATABASE_URL: Final = "sqlite+aiosqlite:///agent.db"
"""The embedded default: a SQLite file in the working directory."""

_ASYNC_DRIVERS: Final = {
    "sqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
}
_EXTRAS: Final = {"aiosqlite": "storage", "asyncpg": "postgres"}
_WRITE_OPTION: Final = "agent_plugin_write"
_SQLITE_BUSY_TIMEOUT_S: Final = 30.0
_POOL_SIZE: Final = 10
"""PostgreSQL connections kept open between transactions."""
_MAX_OVERFLOW: Final = 10
"""PostgreSQL connections opened beyond the pool at a peak (closed again when returned)."""
_POOL_TIMEOUT_S: Final = 30.0
"""Seconds a transaction waits for a pooled connection when all are taken."""
_PING_AFTER_IDLE_S: Final = 5.0
"""A pooled PostgreSQL connection idle for longer is checked before it is used again."""
_IDLE_SINCE: Final = "agent_plugin_idle_since"


def hide_password(url: str | URL) -> str:
    """The URL as text with its password replaced by ``***`` (the text as given if unparsable)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except exc.ArgumentError:
        return "<unparsable database URL>"


class Database:
    """An async SQLAlchemy engine and session factory for one database URL.

    Create one per application, share it between stores, and :meth:`dispose` it on shutdown.
    Stores open short transactions through :meth:`read` and :meth:`write`; on SQLite a write
    transaction takes the write lock up front (``BEGIN IMMEDIATE``) so two writers queue instead
    of failing halfway.

    ``command_timeout`` bounds each PostgreSQL statement (seconds; ``None``: no bound): a
    connection that hangs then fails as ``unavailable`` (retried by background runs) instead
    of holding a run until its job timeout.

    ``pool_size`` is how many PostgreSQL connections stay open between transactions (default
    10), ``max_overflow`` how many more open at a peak and close again (default 10), and
    ``pool_timeout`` how long a transaction waits for a free connection when all are taken
    (seconds; then ``unavailable``, which background runs retry). A run holds a connection
    only while it reads or writes its record, a few milliseconds a step, so a pool of ten
    serves hundreds of concurrent runs: size it for the database's connection limit, not for
    the runs (``docs/operations/deployment.md``).
    """

    def __init__(
        self,
        url: str | URL,
        *,
        echo: bool = False,
        connect_args: dict[str, Any] | None = None,
        connect_timeout: float = 10.0,
        command_timeout: float | None = 60.0,
        pool_size: int | None = None,
        max_overflow: int | None = None,
        pool_timeout: float | None = None,
    ) -> None:
        self.url = _async_url(url)
        self.display_url = self.url.render_as_string(hide_password=True)
        self._password = self.url.password if isinstance(self.url.password, str) else None
        args = dict(connect_args or {})
        backend = self.url.get_backend_name()
        if backend == "postgresql":
            args.setdefault("timeout", connect_timeout)
            if command_timeout is not None:  # a hung connection must not hang a run for good
                args.setdefault("command_timeout", command_timeout)
        elif backend == "sqlite":
            args.setdefault("timeout", _SQLITE_BUSY_TIMEOUT_S)
        else:
            raise AgentError.config(
                f"unsupported database {self.display_url}: use sqlite+aiosqlite:// or "
                "postgresql+asyncpg://"
            )
        if backend == "sqlite":
            # the pool's rollback-on-return is one more trip to aiosqlite's thread per
            # transaction; _configure_sqlite rolls back only a transaction left open
            pool: dict[str, Any] = {"pool_reset_on_return": None}
        else:
            pool = {
                "pool_size": pool_size or _POOL_SIZE,
                "max_overflow": _MAX_OVERFLOW if max_overflow is None else max_overflow,
                "pool_timeout": pool_timeout or _POOL_TIMEOUT_S,
            }
        with self.errors("open"):
            try:
                self.engine: AsyncEngine = _create_async_engine(
                    self.url,
                    echo=echo,
                    connect_args=args,
                    json_serializer=storable_json,
                    **pool,
                )
            except (exc.NoSuchModuleError, ImportError, exc.InvalidRequestError) as error:
                driver = self.url.get_driver_name()
                extra = _EXTRAS.get(driver)
                hint = f" (install fastapi-agent-plugin[{extra}])" if extra else ""
                raise AgentError.config(
                    f"cannot use database {self.display_url}: driver {driver!r} is not "
                    f"available{hint}"
                ) from error
        self._pool_timeout = float(pool.get("pool_timeout", _POOL_TIMEOUT_S))
        self._writers: asyncio.Lock | None = None
        self._busy_timeout = _SQLITE_BUSY_TIMEOUT_S
        if backend == "sqlite":
            _configure_sqlite(self.engine)
            self._writers = asyncio.Lock()
            self._busy_timeout = float(args["timeout"])
        else:
            _ping_idle_connections(self.engine)
        self._prebuilt: dict[sa.Executable, _DriverStatement] = {}
        self.sessionmaker: async_sessionmaker[AsyncSession] = async_sessionmaker(
            self.engine, expire_on_commit=False
        )

    def __repr__(self) -> str:
        return f"Database({self.display_url!r})"

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self.url.get_backend_name()

    # --- transactions ----------------------------------------------------------------------

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """A connection in a read transaction; driver errors become :class:`AgentError`."""
        with self.errors("read from"):
            async with self.engine.connect() as conn, conn.begin():
                yield conn

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncConnection]:
        """A connection in a write transaction, committed when the block ends without error.

        On SQLite the writers of this process take turns on a lock of their own first: SQLite
        lets one writer in at a time, and its busy handler waits for the write lock by
        sleeping and trying again (up to 100 ms a sleep), while this lock hands over the moment
        the writer before commits. A writer still gives up after the busy timeout.
        """
        with self.errors("write to"):
            async with self._turn_to_write(), self.engine.connect() as conn:
                await conn.execution_options(**{_WRITE_OPTION: True})
                async with conn.begin():
                    yield conn

    @asynccontextmanager
    async def alone(self, *, write: bool) -> AsyncIterator[AsyncConnection]:
        """A connection for one statement in a transaction of its own (the hot single-statement
        reads and writes: a run's record, its start, its lease, its moves).

        On PostgreSQL the statement commits on its own (autocommit): one round trip instead
        of three (``BEGIN``, the statement, ``COMMIT``), the same for a single statement. On
        SQLite it is :meth:`read` or :meth:`write`. Run exactly one statement in it, and read
        its result inside.
        """
        if self.dialect != "postgresql":
            async with self.write() if write else self.read() as conn:
                yield conn
            return
        with self.errors("write to" if write else "read from"):
            async with self.engine.connect() as conn:
                yield await conn.execution_options(isolation_level="AUTOCOMMIT")

    async def write_one(self, statement: sa.Executable, params: dict[str, Any]) -> int:
        """Run one writing statement in a transaction of its own (:meth:`alone`); the rows
        it changed."""
        async with self.alone(write=True) as conn:
            return (await conn.execute(statement, params)).rowcount

    async def write_prebuilt(self, statement: sa.Executable, params: dict[str, Any]) -> int:
        """:meth:`write_one` for a statement built once (a module constant, never one built
        per call): on PostgreSQL it is compiled once per database and the driver runs it,
        without SQLAlchemy's work per execution (a fifth of the enqueue route's CPU).

        The same statement with the same bind parameters, each value processed by its
        column's type as SQLAlchemy would (JSON redacted and encoded, timestamps in UTC), and
        the same errors (:meth:`errors`); a connection whose statement failed other than by
        the server's refusal (a lost connection, a timeout, a cancel) is closed, not pooled
        again. On SQLite it is :meth:`write_one`, and so it is while anything listens to the
        engine's statements (an OpenTelemetry instrumentation, a test's counter): they see it.
        """
        if self.dialect != "postgresql" or self._statements_watched():
            return await self.write_one(statement, params)
        compiled = self._prebuilt.get(statement)
        if compiled is None:
            compiled = self._prebuilt[statement] = _DriverStatement.of(
                statement, self.engine.dialect
            )
        with self.errors("write to"):
            values = compiled.values(params)
            async with self.engine.connect() as conn:
                pooled = await conn.get_raw_connection()
                driver = pooled.driver_connection
                assert driver is not None  # a pooled asyncpg connection
                try:
                    status = await driver.execute(compiled.sql, *values)
                except Exception as error:
                    sqlstate = getattr(error, "sqlstate", None)
                    # the server refused the statement (not the connection): it stays pooled
                    if isinstance(sqlstate, str) and not sqlstate.startswith(("08", "57")):
                        refused = (
                            exc.IntegrityError if sqlstate.startswith("23") else exc.DBAPIError
                        )
                        raise refused(compiled.sql, None, error) from error
                    await conn.invalidate()
                    raise exc.DBAPIError(
                        compiled.sql, None, error, connection_invalidated=True
                    ) from error
                except BaseException:
                    await conn.invalidate()
                    raise
        return int(str(status).rsplit(" ", 1)[-1])

    def _statements_watched(self) -> bool:
        dispatch = self.engine.sync_engine.dispatch
        return bool(
            dispatch.before_cursor_execute
            or dispatch.after_cursor_execute
            or dispatch.before_execute
            or dispatch.after_execute
        )

    @asynccontextmanager
    async def _turn_to_write(self) -> AsyncIterator[None]:
        if self._writers is None:
            yield
            return
        async with asyncio.timeout(self._busy_timeout):
            await self._writers.acquire()
        try:
            yield
        finally:
            self._writers.release()

    @contextmanager
    def errors(self, action: str) -> Iterator[None]:
        """Turn driver and connection errors into :class:`AgentError` naming the hidden URL.

        A value the database refuses (PostgreSQL's data exceptions, SQLSTATE class 22) is
        ``invalid``; a statement that could not be built (a value that does not bind) is
        ``internal``; anything else the driver or the connection raises is ``unavailable``.
        The message is the driver's first line: never the SQL, never the parameters.
        :class:`AgentError` and :class:`sqlalchemy.exc.IntegrityError` pass through unchanged:
        the stores decide what a constraint violation means.
        """
        try:
            yield
        except (AgentError, exc.IntegrityError):
            raise
        except exc.ArgumentError as error:
            raise AgentError.config(
                f"bad database URL {self.display_url}: {self._scrub(error)}"
            ) from error
        except exc.DBAPIError as error:
            if str(getattr(error.orig, "sqlstate", "") or "").startswith("22"):
                raise AgentError(
                    ErrorKind.INVALID,
                    f"database {self.display_url} refused a value: {self._scrub(error)}",
                ) from error
            raise AgentError(
                ErrorKind.UNAVAILABLE,
                f"cannot {action} database {self.display_url}: {self._scrub(error)}",
            ) from error
        except exc.TimeoutError as error:  # every pooled connection taken for pool_timeout
            raise AgentError(
                ErrorKind.UNAVAILABLE,
                f"cannot {action} database {self.display_url}: every pooled connection was "
                f"busy for {self._pool_timeout:.0f} s (raise database_pool_size or "
                "database_max_overflow, within the server's connection limit)",
            ) from error
        except exc.StatementError as error:  # binding a value failed before the driver ran
            raise AgentError(
                ErrorKind.INTERNAL,
                f"cannot {action} database {self.display_url}: a value does not bind "
                f"({self._scrub(error)})",
            ) from error
        except (OSError, TimeoutError, sqlite3.Error) as error:
            raise AgentError(
                ErrorKind.UNAVAILABLE,
                f"cannot {action} database {self.display_url}: {self._scrub(error)}",
            ) from error

    def _scrub(self, error: BaseException) -> str:
        """The driver's first line (``orig``), or the error's type: never SQLAlchemy's text,
        which appends the statement and its parameters."""
        cause = getattr(error, "orig", None)
        if cause is None and isinstance(error, exc.StatementError):
            return type(error.__cause__ or error).__name__
        text = str(cause or error).strip().splitlines()
        message = text[0] if text else type(error).__name__
        if self._password:
            message = message.replace(self._password, "***")
        return message

    # --- lifecycle -------------------------------------------------------------------------

    async def check(self) -> None:
        """Run ``SELECT 1``; raise a clear ``Config`` or ``Unavailable`` error if that fails."""
        if self.dialect == "sqlite":
            path = sqlite_path(self.url)
            if path is not None and not path.parent.is_dir():
                raise AgentError.config(
                    f"cannot open database {self.display_url}: folder {path.parent} does not exist"
                )
        async with self.read() as conn:
            await conn.execute(sa.text("SELECT 1"))

    async def migrate(self, revision: str = "head") -> None:
        """Upgrade the plugin's tables to ``revision`` (default: the newest)."""
        from agent_plugin.storage.migrations import run_migrations

        await self.check()
        async with self.write() as conn:
            await conn.run_sync(run_migrations, "upgrade", revision)

    async def downgrade(self, revision: str = "base") -> None:
        """Downgrade the plugin's tables to ``revision`` (default: none left)."""
        from agent_plugin.storage.migrations import run_migrations

        await self.check()
        async with self.write() as conn:
            await conn.run_sync(run_migrations, "downgrade", revision)

    async def current_revision(self) -> str | None:
        """The migration revision the database is at, or ``None`` before the first one."""
        from agent_plugin.storage.migrations import current_revision

        async with self.read() as conn:
            return await conn.run_sync(current_revision)

    async def dispose(self) -> None:
        """Close every pooled connection."""
        await self.engine.dispose()

    async def __aenter__(self) -> Database:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.dispose()


@dataclass(frozen=True, slots=True)
class _DriverStatement:
    """A statement compiled for the driver (:meth:`Database.write_prebuilt`): its SQL with
    positional parameters, their names in order, the values compiled into it (``status =
    'queued'``) and the type processing of each value."""

    sql: str
    names: tuple[str, ...]
    fixed: dict[str, Any]
    processors: tuple[Callable[[Any], Any] | None, ...]

    @classmethod
    def of(cls, statement: sa.Executable, dialect: sa.Dialect) -> _DriverStatement:
        compiled = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
        names = tuple(compiled.positiontup or ())
        processors = tuple(
            compiled.binds[name].type.dialect_impl(dialect).bind_processor(dialect)
            for name in names
        )
        return cls(str(compiled), names, dict(compiled.params), processors)

    def values(self, params: dict[str, Any]) -> list[Any]:
        """The positional values for ``params``; a value that does not bind is a
        :class:`~sqlalchemy.exc.StatementError` (``internal``), as in SQLAlchemy."""
        try:
            return [
                value if process is None else process(value)
                for value, process in zip(
                    (params.get(name, self.fixed[name]) for name in self.names),
                    self.processors,
                    strict=True,
                )
            ]
        except Exception as error:
            raise exc.StatementError("a value does not bind", self.sql, None, error) from error


def sqlite_path(url: URL) -> Path | None:
    """The file a SQLite URL points to, or ``None`` for an in-memory database."""
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def _async_url(url: str | URL) -> URL:
    try:
        parsed = make_url(url)
    except exc.ArgumentError as error:
        raise AgentError.config(
            f"bad database URL {hide_password(url)}: expected something like "
            "sqlite+aiosqlite:///agent.db or postgresql+asyncpg://user@host/db"
        ) from error
    driver = _ASYNC_DRIVERS.get(parsed.drivername)
    return parsed.set(drivername=driver) if driver else parsed


def _configure_sqlite(engine: AsyncEngine) -> None:
    """Foreign keys, WAL, and transactions that SQLAlchemy (not the driver) begins.

    Every call into aiosqlite is a trip to the connection's own thread and back, which costs
    more than the SQLite work of a small transaction: ``BEGIN`` goes as one call (not a cursor
    opened, executed and closed), and a connection that comes back to the pool is rolled back
    only if a transaction is still open on it (``Database.read`` and ``write`` end theirs).
    """

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
        # Let SQLAlchemy emit BEGIN itself (see _on_begin) instead of the driver's implicit one.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        write = conn.get_execution_options().get(_WRITE_OPTION, False)
        statement = "BEGIN IMMEDIATE" if write else "BEGIN"
        _driver_connection(conn.connection.dbapi_connection).run_async(
            lambda driver: driver.execute_fetchall(statement)
        )

    @event.listens_for(engine.sync_engine, "reset")
    def _on_reset(
        dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry, state: PoolResetState
    ) -> None:
        adapted = _driver_connection(dbapi_connection)
        if state.asyncio_safe and adapted.driver_connection.in_transaction:
            dbapi_connection.rollback()


def _ping_idle_connections(engine: AsyncEngine) -> None:
    """Check a pooled connection before it is used again only if it sat idle for a while.

    SQLAlchemy's ``pool_pre_ping`` checks every checkout, which with asyncpg is three round
    trips (``BEGIN``, the ping, ``ROLLBACK``): as many as the small transaction that follows.
    A connection given back less than ``_PING_AFTER_IDLE_S`` seconds ago is used as it is: if
    the server went away in between, that one transaction fails (``UNAVAILABLE``, which
    background runs retry) and SQLAlchemy replaces every connection of the pool.
    """
    sync_engine = engine.sync_engine

    @event.listens_for(sync_engine, "checkin")
    def _on_checkin(_dbapi_connection: DBAPIConnection, record: ConnectionPoolEntry) -> None:
        record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(sync_engine, "checkout")
    def _on_checkout(
        dbapi_connection: DBAPIConnection, record: ConnectionPoolEntry, _proxy: object
    ) -> None:
        idle_since = record.info.pop(_IDLE_SINCE, None)
        if idle_since is None or time.monotonic() - idle_since < _PING_AFTER_IDLE_S:
            return
        try:
            sync_engine.dialect.do_ping(dbapi_connection)
        except Exception as error:  # the pool connects again (up to three times)
            raise exc.DisconnectionError(f"stale pooled connection: {error}") from error


def _driver_connection(dbapi_connection: DBAPIConnection | None) -> AdaptedConnection:
    """The asyncio adapter of a pooled connection (aiosqlite's, under SQLAlchemy's)."""
    if not isinstance(dbapi_connection, AdaptedConnection):
        raise TypeError(f"not an asyncio driver connection: {dbapi_connection!r}")
    return dbapi_connection
