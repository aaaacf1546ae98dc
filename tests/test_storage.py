"""The SQLAlchemy stores on real SQLite files and the real PostgreSQL on 127.0.0.1.

The session store runs the shared conformance suite (``tests/store_conformance.py``) unchanged;
the memory store runs the contract below, which the in-memory store passes too. Then: data
survives a restart, a malformed row is a typed error that loses nothing, an oversized edit changes
nothing, an unreachable database is a clear error without the password, and loading a long
session costs a fixed number of queries.

PostgreSQL tests run in a fresh schema per module (``AGENT_TEST_POSTGRES_URL``, default
``postgresql+asyncpg://postgres@127.0.0.1:5432/test``), dropped afterwards; they never skip.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from agent_plugin.compaction import SUMMARY_PREFIX
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.memory import (
    DEFAULT_BLOCKS,
    AddOp,
    InMemoryMemoryStore,
    MemoryBlock,
    MemoryOp,
    MemoryStore,
    RemoveOp,
    ReplaceOp,
)
from agent_plugin.messages import ChatMessage
from agent_plugin.sessions import SessionStore
from agent_plugin.storage import Database, SqlMemoryStore, SqlSessionStore
from agent_plugin.storage import database as storage_database
from agent_plugin.storage.models import MemoryBlockRow, SessionEntryRow, SessionRow
from tests.services import POSTGRES_URL
from tests.store_conformance import SessionStoreContract, new_session_id, numbered, report

BACKENDS = ("sqlite", "postgresql")


# --- databases -------------------------------------------------------------------------------


class PostgresSchema:
    """A fresh schema in the test database; every connection of ``database()`` lives in it."""

    def __init__(self, url: str = POSTGRES_URL) -> None:
        self.url = url
        self.name = f"agent_test_{uuid.uuid4().hex[:12]}"

    def database(self) -> Database:
        return Database(self.url, connect_args={"server_settings": {"search_path": self.name}})

    async def _admin(self, statement: str) -> None:
        database = Database(self.url)
        try:
            async with database.write() as conn:
                await conn.execute(sa.text(statement))
        finally:
            await database.dispose()

    async def create(self) -> None:
        await self._admin(f'CREATE SCHEMA "{self.name}"')

    async def drop(self) -> None:
        await self._admin(f'DROP SCHEMA IF EXISTS "{self.name}" CASCADE')


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


async def _migrated(database: Database) -> None:
    try:
        await database.migrate()
    finally:
        await database.dispose()


@pytest.fixture(scope="module")
def sqlite_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file shared by the module's tests (they use fresh ids)."""
    path = tmp_path_factory.mktemp("storage") / "agent.db"
    asyncio.run(_migrated(Database(sqlite_url(path))))
    return path


@pytest.fixture(scope="module")
def pg_schema() -> Iterator[PostgresSchema]:
    """A migrated PostgreSQL schema shared by the module's tests, dropped at the end."""
    schema = PostgresSchema()
    asyncio.run(schema.create())
    try:
        asyncio.run(_migrated(schema.database()))
        yield schema
    finally:
        asyncio.run(schema.drop())


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_database(backend: str, request: pytest.FixtureRequest) -> Callable[[], Database]:
    """Opens a new :class:`Database` (a new engine) on the migrated backend under test."""
    # only the backend under test is set up: a sqlite-only run never touches PostgreSQL
    if backend == "sqlite":
        path: Path = request.getfixturevalue("sqlite_file")
        return lambda: Database(sqlite_url(path))
    schema: PostgresSchema = request.getfixturevalue("pg_schema")
    return schema.database


@pytest.fixture
async def database(make_database: Callable[[], Database]) -> AsyncIterator[Database]:
    db = make_database()
    yield db
    await db.dispose()


class QueryCounter:
    """Counts the statements an engine sends."""

    def __init__(self, database: Database) -> None:
        self.count = 0
        self.statements: list[str] = []
        event.listen(database.engine.sync_engine, "before_cursor_execute", self._seen)
        self._engine = database.engine.sync_engine

    def _seen(self, *args: Any) -> None:
        statement = str(args[2])
        if statement.split(None, 1)[0].upper() not in ("BEGIN", "COMMIT", "ROLLBACK"):
            self.count += 1
            self.statements.append(statement)

    def reset(self) -> None:
        self.count = 0
        self.statements.clear()

    def close(self) -> None:
        event.remove(self._engine, "before_cursor_execute", self._seen)


# --- the session store: the shared conformance suite ------------------------------------------


class TestSqlSessionStore(SessionStoreContract):
    @pytest.fixture
    def store(self, database: Database) -> SessionStore:
        return SqlSessionStore(database)


# --- the memory store: a contract every MemoryStore passes -----------------------------------


def small(limit: int = 10, *entries: str, label: str = "memory") -> MemoryBlock:
    return MemoryBlock(label=label, description="notes", entries=list(entries), limit=limit)


def new_scope() -> str:
    return f"scope-{uuid.uuid4().hex}"


class MemoryStoreContract:
    """Behaviour every memory store shares; subclasses provide ``make_store(template)``."""

    def make_store(self, template: list[MemoryBlock] | None = None) -> MemoryStore:
        raise AssertionError("subclasses provide make_store")

    async def test_a_new_scope_is_the_template(self) -> None:
        store = self.make_store()
        assert await store.load(new_scope()) == list(DEFAULT_BLOCKS)

    async def test_edits_round_trip_and_keep_order(self) -> None:
        store = self.make_store()
        scope = new_scope()
        await store.apply(scope, AddOp(block="user", text="prefers short answers"))
        await store.apply(scope, AddOp(block="memory", text="  likes tea  "))
        await store.apply(scope, AddOp(block="memory", text="deploys on Tuesdays"))
        edited = await store.apply(
            scope, ReplaceOp(block="memory", old="Tuesdays", text="deploys on Fridays")
        )
        assert edited.entries == ["likes tea", "deploys on Fridays"]
        blocks = await store.load(scope)
        assert [b.label for b in blocks] == ["memory", "user"]
        assert [b.entries for b in blocks] == [
            ["likes tea", "deploys on Fridays"],
            ["prefers short answers"],
        ]
        assert [b.limit for b in blocks] == [2200, 1375]
        removed = await store.apply(scope, RemoveOp(block="memory", old="tea"))
        assert removed.entries == ["deploys on Fridays"]
        assert (await store.load(scope))[0].entries == ["deploys on Fridays"]
        # entries keep their exact text: unicode, quotes, newlines
        odd = 'naïve café 🎉 "quoted" \\ back\nslash'
        await store.apply(scope, AddOp(block="user", text=odd))
        assert (await store.load(scope))[1].entries == ["prefers short answers", odd]

    async def test_scopes_are_isolated(self) -> None:
        store = self.make_store()
        alice, bob = new_scope(), new_scope()
        await store.apply(alice, AddOp(block="memory", text="alice's fact"))
        assert await store.load(bob) == list(DEFAULT_BLOCKS)
        await store.apply(bob, AddOp(block="memory", text="bob's fact"))
        assert (await store.load(alice))[0].entries == ["alice's fact"]
        assert (await store.load(bob))[0].entries == ["bob's fact"]

    async def test_the_rules_and_their_texts(self) -> None:
        store = self.make_store([small(10, "12345")])
        scope = new_scope()
        with pytest.raises(AgentError) as caught:
            await store.apply(scope, AddOp(block="memory", text="678901"))
        assert caught.value.kind is ErrorKind.TOOL
        assert "is full: this edit needs 11 of 10 characters" in caught.value.message
        # a replace that frees room fits
        fitted = await store.apply(scope, ReplaceOp(block="memory", old="123", text="678901"))
        assert fitted.entries == ["678901"]
        cases: list[tuple[MemoryOp, str]] = [
            (AddOp(block="memory", text="   "), "memory entries must not be empty"),
            (RemoveOp(block="memory", old=" "), "give `old`: a substring of the entry to change"),
            (RemoveOp(block="memory", old="zzz"), 'no entry in "memory" contains "zzz"'),
            (AddOp(block="notes", text="x"), 'no memory block "notes"; blocks: ["memory"]'),
        ]
        for op, text in cases:
            with pytest.raises(AgentError) as caught:
                await store.apply(scope, op)
            assert caught.value.kind is ErrorKind.TOOL
            assert caught.value.message == text
        await store.apply(scope, RemoveOp(block="memory", old="678901"))
        await store.apply(scope, AddOp(block="memory", text="ab"))
        await store.apply(scope, AddOp(block="memory", text="abc"))
        with pytest.raises(AgentError) as caught:
            await store.apply(scope, RemoveOp(block="memory", old="ab"))
        assert caught.value.message == '2 entries in "memory" contain "ab": give a longer substring'
        assert (await store.load(scope))[0].entries == ["ab", "abc"]

    async def test_failed_edits_change_nothing_and_record_no_key(self) -> None:
        store = self.make_store([small(10, "12345")])
        scope = new_scope()
        await store.apply(scope, AddOp(block="memory", text="abc"))
        with pytest.raises(AgentError, match="11 of 10"):
            await store.apply(scope, AddOp(block="memory", text="678"), edit_key="k")
        assert [b.entries for b in await store.load(scope)] == [["12345", "abc"]]
        await store.apply(scope, RemoveOp(block="memory", old="abc"))
        again = await store.apply(scope, AddOp(block="memory", text="678"), edit_key="k")
        assert again.entries == ["12345", "678"]

    async def test_an_edit_key_is_applied_once_per_scope(self) -> None:
        store = self.make_store()
        scope, other = new_scope(), new_scope()
        op = AddOp(block="memory", text="deploys on Fridays are banned")
        first = await store.apply(scope, op, edit_key="run-1:0:call-1")
        replay = await store.apply(scope, op, edit_key="run-1:0:call-1")
        assert first == replay
        await store.apply(scope, AddOp(block="memory", text="second"))
        replay = await store.apply(scope, op, edit_key="run-1:0:call-1")
        assert replay.entries == ["deploys on Fridays are banned", "second"]
        assert (await store.apply(other, op, edit_key="run-1:0:call-1")).entries == [op.text]
        long_key = "run-2:3:" + "c" * 400  # longer than any key column
        await store.apply(scope, AddOp(block="user", text="u"), edit_key=long_key)
        again = await store.apply(scope, AddOp(block="user", text="u"), edit_key=long_key)
        assert again.entries == ["u"]

    async def test_concurrent_edits_of_one_scope_all_land(self) -> None:
        store = self.make_store()
        scope = new_scope()  # brand new: the writers also race to create the rows
        texts = [f"fact {i}" for i in range(12)]
        await asyncio.gather(
            *(store.apply(scope, AddOp(block="memory", text=t), edit_key=t) for t in texts),
            *(store.apply(scope, AddOp(block="user", text=t)) for t in texts),
            # the same keyed edit from three retried jobs at once lands once
            *(store.apply(scope, AddOp(block="user", text="once"), edit_key="same") for _ in "abc"),
        )
        memory, user = await store.load(scope)
        assert sorted(memory.entries) == sorted(texts)
        assert sorted(user.entries) == sorted([*texts, "once"])


class TestInMemoryMemoryStore(MemoryStoreContract):
    def make_store(self, template: list[MemoryBlock] | None = None) -> MemoryStore:
        return InMemoryMemoryStore(template if template is not None else DEFAULT_BLOCKS)


class TestSqlMemoryStore(MemoryStoreContract):
    @pytest.fixture(autouse=True)
    def _database(self, database: Database) -> None:
        self.database = database

    def make_store(self, template: list[MemoryBlock] | None = None) -> MemoryStore:
        return SqlMemoryStore(self.database, template if template is not None else DEFAULT_BLOCKS)


# --- restarts --------------------------------------------------------------------------------


async def test_data_survives_a_restart(make_database: Callable[[], Database]) -> None:
    session, scope = new_session_id(), new_scope()
    first = make_database()
    sessions = SqlSessionStore(first)
    await sessions.append(session, numbered(3), expected_version=0)
    await sessions.append_compaction(session, "m1 said hi", 2, report(), expected_version=3)
    await SqlMemoryStore(first).apply(scope, AddOp(block="user", text="likes tea"), edit_key="k")
    await first.dispose()

    second = make_database()  # a new engine: nothing cached survives but the database
    try:
        view = await SqlSessionStore(second).load(session)
        assert [m.text for m in view.messages] == [
            SUMMARY_PREFIX + "m1 said hi",
            "m2",
            "m3",
        ]
        assert view.version == 4
        assert len(await SqlSessionStore(second).entries(session)) == 4
        memory = SqlMemoryStore(second)
        assert (await memory.load(scope))[1].entries == ["likes tea"]
        # the edit key survived too: a retried job after the restart changes nothing
        again = await memory.apply(scope, AddOp(block="user", text="likes tea"), edit_key="k")
        assert again.entries == ["likes tea"]
    finally:
        await second.dispose()


# --- bad input -------------------------------------------------------------------------------


async def _corrupt_entry(database: Database, session_id: str, seq: int, payload: Any) -> None:
    async with database.write() as conn:
        await conn.execute(
            sa.update(SessionEntryRow)
            .where(SessionEntryRow.session_id == session_id, SessionEntryRow.seq == seq)
            .values(payload=payload)
        )


async def test_a_malformed_row_is_a_typed_error_and_loses_nothing(database: Database) -> None:
    store = SqlSessionStore(database)
    session, neighbour = new_session_id(), new_session_id()
    await store.append(session, numbered(5), expected_version=0)
    await store.append(neighbour, numbered(2), expected_version=0)
    await _corrupt_entry(database, session, 3, {"role": "narrator", "content": "not a list"})

    for read in (store.load(session), store.entries(session)):
        with pytest.raises(AgentError) as caught:
            await read
        error = caught.value
        assert error.kind is ErrorKind.DECODE
        assert session in error.message
        assert "stored entry 3 (message)" in error.message
    # the rows around it are intact and readable, and so is every other session
    before = await store.entries(session, limit=2)
    assert [e.seq for e in before] == [1, 2]
    after = await store.entries(session, after=3)
    assert [e.seq for e in after] == [4, 5]
    assert [m.text for m in (await store.load(neighbour)).messages] == ["m1", "m2"]
    async with database.read() as conn:
        count = await conn.scalar(
            sa.select(sa.func.count()).where(SessionEntryRow.session_id == session)
        )
    assert count == 5
    # a compaction that folds the bad row away makes the session loadable again
    await store.append_compaction(session, "earlier", 4, report(), expected_version=5)
    view = await store.load(session)
    assert [m.text for m in view.messages][1:] == ["m4", "m5"]


async def test_a_row_that_is_not_json_is_a_typed_error(tmp_path: Path) -> None:
    database = Database(sqlite_url(tmp_path / "raw.db"))
    try:
        await database.migrate()
        store = SqlSessionStore(database)
        session = new_session_id()
        await store.append(session, numbered(2), expected_version=0)
        await store.append_compaction(session, "s", 2, report(), expected_version=2)
        async with database.write() as conn:  # SQLite stores JSON as text: break it
            await conn.execute(
                sa.text(
                    "UPDATE agent_session_entries SET payload = '{\"summary\": ' "
                    "WHERE session_id = :s AND seq = 3"
                ),
                {"s": session},
            )
        with pytest.raises(AgentError) as caught:
            await store.load(session)
        assert caught.value.kind is ErrorKind.DECODE
        assert "stored entry 3 (compaction)" in caught.value.message
        assert [e.seq for e in await store.entries(session, limit=2)] == [1, 2]
    finally:
        await database.dispose()


async def test_a_sqlite_connection_given_back_mid_transaction_is_rolled_back(
    tmp_path: Path,
) -> None:
    """The pool does not roll back every connection it gets back (one more trip to
    aiosqlite's thread per transaction): only one whose transaction is still open."""
    database = Database(sqlite_url(tmp_path / "reset.db"))
    try:
        await database.migrate()
        async with database.engine.connect() as conn:
            driver = (await conn.get_raw_connection()).driver_connection
            assert driver is not None
            await driver.execute("BEGIN IMMEDIATE")
            await driver.execute(
                "INSERT INTO agent_sessions (id, version, created_at, updated_at) "
                "VALUES ('left-open', 0, '2024-01-01', '2024-01-01')"
            )
        # the write lock is free again (a writer would wait 30 s for it) and nothing landed
        async with asyncio.timeout(5):
            store = SqlSessionStore(database)
            await store.append("after", numbered(1), expected_version=0)
            async with database.read() as conn:
                ids = (await conn.scalars(sa.select(SessionRow.id))).all()
        assert list(ids) == ["after"]
    finally:
        await database.dispose()


async def test_sqlite_writers_take_turns_and_give_up_after_the_busy_timeout(
    tmp_path: Path,
) -> None:
    database = Database(sqlite_url(tmp_path / "turns.db"), connect_args={"timeout": 0.3})
    try:
        await database.migrate()
        order: list[str] = []
        holding = asyncio.Event()

        async def write(name: str, hold: float) -> None:
            async with database.write() as conn:
                order.append(f"{name} in")
                holding.set()
                await conn.execute(sa.text("SELECT 1"))
                await asyncio.sleep(hold)
                order.append(f"{name} out")

        await asyncio.gather(write("a", 0.1), write("b", 0), write("c", 0))
        assert order == ["a in", "a out", "b in", "b out", "c in", "c out"]

        holding.clear()
        slow = asyncio.ensure_future(write("slow", 1.0))
        await holding.wait()  # slow holds the write lock (a fixed sleep flaked under load)
        with pytest.raises(AgentError) as caught:
            await write("late", 0)
        assert caught.value.kind is ErrorKind.UNAVAILABLE
        await slow
    finally:
        await database.dispose()


async def _drop_connections_of(application: str) -> None:
    """Terminate the server side of every connection of ``application`` (and wait for it)."""
    admin = Database(POSTGRES_URL)
    try:
        async with admin.write() as conn:
            await conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
                    "WHERE application_name = :name"
                ),
                {"name": application},
            )
    finally:
        await admin.dispose()


async def test_a_postgres_connection_idle_for_a_while_is_checked_before_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only connections that sat idle are pinged (a ping is three round trips with asyncpg);
    one given back a moment ago is used as it is, so a server restart in between costs that
    one transaction, after which the pool reconnects."""
    application = f"agent-test-{uuid.uuid4().hex[:8]}"
    database = Database(
        POSTGRES_URL, connect_args={"server_settings": {"application_name": application}}
    )
    try:
        async with database.read() as conn:
            await conn.execute(sa.text("SELECT 1"))
        await _drop_connections_of(application)
        with pytest.raises(AgentError) as caught:  # used again at once: not checked
            await database.check()
        assert caught.value.kind is ErrorKind.UNAVAILABLE
        await database.check()  # the pool has reconnected

        await _drop_connections_of(application)
        monkeypatch.setattr(storage_database, "_PING_AFTER_IDLE_S", 0.0)
        await database.check()  # idle "long enough": pinged, found dead, replaced
    finally:
        await database.dispose()


async def test_a_malformed_memory_row_is_a_typed_error(database: Database) -> None:
    store = SqlMemoryStore(database)
    scope = new_scope()
    await store.apply(scope, AddOp(block="memory", text="kept"))
    async with database.write() as conn:
        await conn.execute(
            sa.update(MemoryBlockRow)
            .where(MemoryBlockRow.scope == scope, MemoryBlockRow.label == "memory")
            .values(entries={"not": "a list"})
        )
    for action in (store.load(scope), store.apply(scope, AddOp(block="user", text="x"))):
        with pytest.raises(AgentError) as caught:
            await action
        assert caught.value.kind is ErrorKind.DECODE
        assert scope in caught.value.message
        assert "'memory'" in caught.value.message
    other = new_scope()
    await store.apply(other, AddOp(block="memory", text="fine"))
    assert (await store.load(other))[0].entries == ["fine"]


async def test_an_oversized_memory_edit_changes_nothing(
    make_database: Callable[[], Database],
) -> None:
    scope = new_scope()
    first = make_database()
    store = SqlMemoryStore(first)
    await store.apply(scope, AddOp(block="user", text="u" * 1000))
    with pytest.raises(AgentError) as caught:
        await store.apply(scope, AddOp(block="user", text="v" * 400), edit_key="big")
    assert caught.value.kind is ErrorKind.TOOL
    assert "is full: this edit needs 1400 of 1375 characters" in caught.value.message
    await first.dispose()
    second = make_database()
    try:
        blocks = await SqlMemoryStore(second).load(scope)
        assert blocks[1].entries == ["u" * 1000]
        async with second.read() as conn:
            edits = await conn.scalar(
                sa.text("SELECT count(*) FROM agent_memory_edits WHERE scope = :s"), {"s": scope}
            )
        assert edits == 0
    finally:
        await second.dispose()


async def test_bad_memory_scopes_are_config_errors(database: Database) -> None:
    store = SqlMemoryStore(database)
    for bad in ("", "s" * 256):
        with pytest.raises(AgentError) as caught:
            await store.load(bad)
        assert caught.value.kind is ErrorKind.CONFIG
    assert await store.load("s" * 255) == list(DEFAULT_BLOCKS)


async def test_the_template_names_the_blocks_and_their_limits(database: Database) -> None:
    scope = new_scope()
    await SqlMemoryStore(database, [small(10, label="memory")]).apply(
        scope, AddOp(block="memory", text="abc")
    )
    # the app later raises the limit and adds a block: every scope gets both
    grown = SqlMemoryStore(database, [small(50, label="memory"), small(20, label="notes")])
    blocks = await grown.load(scope)
    assert [(b.label, b.limit, b.entries) for b in blocks] == [
        ("memory", 50, ["abc"]),
        ("notes", 20, []),
    ]
    await grown.apply(scope, AddOp(block="memory", text="x" * 40))
    # a block the template dropped is still loaded, after the template's
    shrunk = SqlMemoryStore(database, [small(20, label="notes")])
    assert [(b.label, b.limit) for b in await shrunk.load(scope)] == [("notes", 20), ("memory", 50)]


# --- connection errors -----------------------------------------------------------------------


async def test_an_unreachable_database_is_a_clear_error_without_the_password() -> None:
    secret = "s3cret-Pa55word"
    database = Database(f"postgresql+asyncpg://agent:{secret}@127.0.0.1:1/agent")
    assert secret not in repr(database)
    assert database.display_url == "postgresql+asyncpg://agent:***@127.0.0.1:1/agent"
    try:
        attempts: list[Callable[[], Awaitable[object]]] = [
            database.check,
            lambda: SqlSessionStore(database).load("s"),
            lambda: SqlSessionStore(database).append("s", numbered(1), expected_version=0),
            lambda: SqlMemoryStore(database).apply("s", AddOp(block="memory", text="x")),
            database.migrate,
        ]
        for attempt in attempts:
            with pytest.raises(AgentError) as caught:
                await attempt()
            error = caught.value
            assert error.kind is ErrorKind.UNAVAILABLE
            assert "postgresql+asyncpg://agent:***@127.0.0.1:1/agent" in error.message
            for text in (str(error), repr(error), error.message, str(error.info())):
                assert secret not in text
    finally:
        await database.dispose()


async def test_bad_urls_are_config_errors(tmp_path: Path) -> None:
    cases = {
        "not a url": "bad database URL",
        "mysql://root:hunter2@db/agent": "unsupported database mysql://root:***@db/agent",
        "postgresql+nosuchdriver://u:hunter2@h/db": "driver 'nosuchdriver' is not available",
    }
    for url, text in cases.items():
        with pytest.raises(AgentError) as caught:
            Database(url)
        assert caught.value.kind is ErrorKind.CONFIG
        assert text in caught.value.message
        assert "hunter2" not in caught.value.message
    missing = Database(sqlite_url(tmp_path / "no" / "such" / "agent.db"))
    with pytest.raises(AgentError) as caught:
        await missing.check()
    assert caught.value.kind is ErrorKind.CONFIG
    assert "does not exist" in caught.value.message
    await missing.dispose()


def test_plain_urls_get_their_async_driver() -> None:
    assert Database("sqlite:///x.db").url.drivername == "sqlite+aiosqlite"
    assert Database("postgresql://u@h/db").url.drivername == "postgresql+asyncpg"
    assert Database("postgres://u@h/db").url.drivername == "postgresql+asyncpg"
    assert Database("postgres://u@h/db").dialect == "postgresql"


# --- cost ------------------------------------------------------------------------------------


async def test_loading_costs_the_same_queries_at_any_length(database: Database) -> None:
    store = SqlSessionStore(database)
    short, long = new_session_id(), new_session_id()
    await store.append(short, numbered(4), expected_version=0)
    version = 0
    for _ in range(6):  # 600 messages in turns of 100
        version = await store.append(long, numbered(100), expected_version=version)
    counter = QueryCounter(database)
    try:
        await store.load(short)
        short_queries = counter.count
        counter.reset()
        view = await store.load(long)
        assert len(view.messages) == 600
        assert counter.count == short_queries == 2
        # after a compaction, still two queries, and only the kept rows are read
        await store.append_compaction(long, "s", 590, report(), expected_version=600)
        counter.reset()
        view = await store.load(long)
        assert counter.count == 2
        assert len(view.messages) == 12
        # paging the audit history: one query per page
        counter.reset()
        after, pages = 0, 0
        while page := await store.entries(long, after=after, limit=250):
            after, pages = page[-1].seq, pages + 1
        assert pages == 3
        assert counter.count == 4  # three pages and the empty one that ends the loop
        # an append is a fixed number of statements, whatever the session's length
        counter.reset()
        await store.append(long, numbered(2), expected_version=601)
        assert counter.count == 2
        # with branches: the session, the links and the messages of the branch, at any length
        await store.fork(long, 602)
        await store.fork(short, 2)
        counter.reset()
        assert len((await store.load(short)).messages) == 2
        assert counter.count == 3
        counter.reset()
        view = await store.load(long)
        assert (len(view.messages), view.leaf) == (13, 602)
        assert counter.count == 4  # and one for the compaction on it
        # appending after the leaf a run loaded, the head, is still two statements
        counter.reset()
        await store.append(long, numbered(2), expected_version=603, leaf=602)
        assert counter.count == 2
    finally:
        counter.close()


async def test_timestamps_are_timezone_aware(database: Database) -> None:
    session = new_session_id()
    await SqlSessionStore(database).append(session, [ChatMessage.user("hi")], expected_version=0)
    async with database.read() as conn:
        created = await conn.scalar(
            sa.select(SessionRow.created_at).where(SessionRow.id == session)
        )
        entry_created = await conn.scalar(
            sa.select(SessionEntryRow.created_at).where(SessionEntryRow.session_id == session)
        )
    assert created is not None
    assert entry_created is not None
    assert created.tzinfo is not None
    assert created.utcoffset() == UTC.utcoffset(None)
    assert entry_created.tzinfo is not None


async def test_a_hung_postgres_statement_fails_unavailable_in_the_command_timeout() -> None:
    database = Database(POSTGRES_URL, command_timeout=0.3)
    try:
        started = time.monotonic()
        with pytest.raises(AgentError) as caught:
            async with database.read() as conn:
                await conn.execute(sa.text("SELECT pg_sleep(5)"))
        assert time.monotonic() - started < 3
        assert caught.value.kind is ErrorKind.UNAVAILABLE
        async with database.read() as conn:  # the pool recovers
            assert await conn.scalar(sa.text("SELECT 1")) == 1
    finally:
        await database.dispose()


# --- text every store accepts ----------------------------------------------------------------

NUL_AND_SURROGATE = "a fetched page: \x00 and \ud800 end"


async def test_a_nul_or_a_lone_surrogate_from_a_model_or_a_tool_is_stored_safely(
    database: Database,
) -> None:
    session, scope = new_session_id(), new_scope()
    sessions = SqlSessionStore(database)
    message = ChatMessage.user(NUL_AND_SURROGATE)
    await sessions.append(session, [message], expected_version=0)
    [stored] = (await sessions.load(session)).messages
    assert stored.text == "a fetched page: \ufffd and \ufffd end"
    await SqlMemoryStore(database).apply(
        scope, AddOp(block="user", text="likes \x00 tea"), edit_key="nul"
    )
    assert (await SqlMemoryStore(database).load(scope))[1].entries == ["likes \ufffd tea"]
    # An escaped backslash before "u0000" is text, not a NUL: it stays as it was.
    literal = ChatMessage.user("a path: C:\\u0000\\x")
    await sessions.append(session, [literal], expected_version=1)
    assert (await sessions.load(session)).messages[-1].text == "a path: C:\\u0000\\x"


async def test_a_session_id_with_a_nul_is_refused_as_invalid(database: Database) -> None:
    with pytest.raises(AgentError) as caught:
        await SqlSessionStore(database).append("s\x00", numbered(1), expected_version=0)
    assert caught.value.kind is ErrorKind.INVALID
    assert "NUL" in str(caught.value)


async def execute_in(database: Database, statement: Any, values: dict[str, Any]) -> None:
    async with database.write() as conn:
        await conn.execute(statement, values)


async def test_a_value_the_database_refuses_is_invalid_and_never_shows_sql() -> None:
    schema = PostgresSchema()
    await schema.create()
    database = schema.database()
    try:
        with pytest.raises(AgentError) as caught:
            async with database.write() as conn:
                await conn.execute(sa.text("SELECT CAST(:s AS text)"), {"s": "top\x00secret"})
        assert caught.value.kind is ErrorKind.INVALID
        message = str(caught.value)
        assert "refused a value" in message
        assert "[SQL" not in message
        assert "SELECT" not in message
        assert "secret" not in message
        # A value that cannot even be bound is internal, with neither SQL nor parameters.
        statement = sa.select(sa.literal("x")).where(
            sa.bindparam("v", type_=sa.JSON()) != None  # noqa: E711
        )
        with pytest.raises(AgentError) as bound:
            await execute_in(database, statement, {"v": {"top-secret": object()}})
        assert bound.value.kind is ErrorKind.INTERNAL
        assert "top-secret" not in str(bound.value)
        assert "[SQL" not in str(bound.value)
    finally:
        await database.dispose()
        await schema.drop()


# --- prebuilt writes: the driver runs them on PostgreSQL ---------------------------------------

SECRET = "sk-live-0123456789abcdefghijklmnop"


async def test_a_new_run_is_recorded_through_the_driver_as_sqlalchemy_would(
    pg_schema: PostgresSchema,
) -> None:
    from agent_plugin.storage import SqlRunStore
    from agent_plugin.storage.run_sql import CREATE

    database = pg_schema.database()
    try:
        store = SqlRunStore(database)
        args = {"prompt": f"use {SECRET}", "overrides": {"api_key": SECRET}}
        run_id = f"run_{uuid.uuid4().hex}"
        assert await store.create(run_id, origin="request", args=args)
        assert CREATE["postgresql", False] in database._prebuilt  # the driver ran it
        assert not await store.create(run_id, origin="request", args=args)  # a no-op
        record = await store.get(run_id)
        assert record is not None
        assert record.status.value == "queued"
        assert record.created_at.tzinfo is not None
        stored = await store.args(run_id)
        assert SECRET not in str(stored)  # redacted by the JSON column's type, as before
        assert stored["prompt"].startswith("use ")
        later = f"run_{uuid.uuid4().hex}"
        assert await store.create(later, origin="request", args=args, not_before=60)
        async with database.read() as conn:
            lease = await conn.scalar(
                sa.text("SELECT lease_until - now() FROM agent_runs WHERE run_id = :r"),
                {"r": later},
            )
        assert 50 < lease.total_seconds() <= 61
        # with a listener on the engine's statements (tracing), SQLAlchemy runs it: it is seen
        counter = QueryCounter(database)
        try:
            assert await store.create(f"run_{uuid.uuid4().hex}", origin="request", args=args)
        finally:
            counter.close()
        assert [s.split(None, 2)[:2] for s in counter.statements] == [["INSERT", "INTO"]]
    finally:
        await database.dispose()


async def test_a_prebuilt_write_keeps_the_errors_typed_and_never_shows_sql(
    pg_schema: PostgresSchema,
) -> None:
    database = pg_schema.database()
    text = sa.text("SELECT CAST(:s AS text)").bindparams(sa.bindparam("s", type_=sa.String()))
    try:
        with pytest.raises(AgentError) as refused:
            await database.write_prebuilt(text, {"s": "top\x00secret"})
        assert refused.value.kind is ErrorKind.INVALID
        assert "refused a value" in str(refused.value)
        assert "SELECT" not in str(refused.value)
        assert "secret" not in str(refused.value)
        as_json = sa.text("SELECT CAST(:v AS jsonb)").bindparams(sa.bindparam("v", type_=sa.JSON()))
        with pytest.raises(AgentError) as unbound:
            await database.write_prebuilt(as_json, {"v": {"top-secret": object()}})
        assert unbound.value.kind is ErrorKind.INTERNAL
        assert "top-secret" not in str(unbound.value)
        # a connection the server ends is unavailable, and is not pooled again
        ended = sa.text("SELECT pg_terminate_backend(pg_backend_pid())")
        with pytest.raises(AgentError) as lost:
            await database.write_prebuilt(ended, {})
        assert lost.value.kind is ErrorKind.UNAVAILABLE
        assert "SELECT" not in str(lost.value)
        for _ in range(3):  # every pooled connection still works
            assert await database.write_prebuilt(text, {"s": "fine"}) == 1
    finally:
        await database.dispose()
