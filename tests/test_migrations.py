"""The Alembic migrations: up, down and up again on SQLite and PostgreSQL; they agree with the
models; they leave an application's own tables alone; the CLI runs them."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from agent_plugin.__main__ import main
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.messages import ChatMessage
from agent_plugin.storage import Database, SqlSessionStore
from agent_plugin.storage.migrations import (
    VERSION_TABLE,
    alembic_config,
    include_name,
    migrations_dir,
)
from agent_plugin.storage.models import Base, RunRow
from tests.test_storage import PostgresSchema, sqlite_url

PLUGIN_TABLES = sorted(Base.metadata.tables)
APP_TABLES = ["alembic_version", "app_items"]


@pytest.fixture(params=["sqlite", "postgresql"])
async def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """An empty database holding only an application's own tables (and its own Alembic)."""
    schema: PostgresSchema | None = None
    if request.param == "sqlite":
        make: Callable[[], Database] = lambda: Database(sqlite_url(tmp_path / "empty.db"))  # noqa: E731
    else:
        schema = PostgresSchema()
        await schema.create()
        make = schema.database
    database = make()
    async with database.write() as conn:
        await conn.execute(sa.text("CREATE TABLE app_items (id INTEGER PRIMARY KEY, name TEXT)"))
        await conn.execute(sa.text("CREATE TABLE alembic_version (version_num VARCHAR(32))"))
        await conn.execute(sa.text("INSERT INTO alembic_version VALUES ('app_0042')"))
        await conn.execute(sa.text("INSERT INTO app_items VALUES (1, 'kept')"))
    try:
        yield database
    finally:
        await database.dispose()
        if schema is not None:
            await schema.drop()


async def table_names(database: Database) -> list[str]:
    async with database.read() as conn:
        return sorted(await conn.run_sync(lambda sync: sa.inspect(sync).get_table_names()))


async def model_differences(database: Database) -> list[Any]:
    def compare(connection: sa.Connection) -> list[Any]:
        context = MigrationContext.configure(
            connection,
            opts={"include_name": include_name, "compare_type": True},
        )
        return list(compare_metadata(context, Base.metadata))

    async with database.read() as conn:
        return await conn.run_sync(compare)


async def app_data_is_intact(database: Database) -> None:
    async with database.read() as conn:
        assert (await conn.execute(sa.text("SELECT name FROM app_items"))).scalar_one() == "kept"
        version = await conn.execute(sa.text("SELECT version_num FROM alembic_version"))
        assert version.scalar_one() == "app_0042"


async def test_upgrade_downgrade_upgrade(empty_database: Database) -> None:
    database = empty_database
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head == "0008"
    assert await database.current_revision() is None

    await database.migrate()
    assert await database.current_revision() == head
    assert await table_names(database) == sorted([*APP_TABLES, *PLUGIN_TABLES, VERSION_TABLE])
    assert await model_differences(database) == []
    await database.migrate()  # already at head: a no-op
    assert await database.current_revision() == head

    await database.downgrade()
    assert await database.current_revision() is None
    assert await table_names(database) == sorted([*APP_TABLES, VERSION_TABLE])
    await app_data_is_intact(database)

    await database.migrate("head")
    assert await database.current_revision() == head
    assert await model_differences(database) == []
    await app_data_is_intact(database)


async def test_0008_sessions_written_before_branches_keep_their_history(
    empty_database: Database,
) -> None:
    """Entries stored at 0006 follow each other after the upgrade; a downgrade keeps them."""
    database = empty_database
    await database.migrate("0006")
    async with database.write() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO agent_sessions (id, version, created_at, updated_at) "
                "VALUES ('old', 3, '2026-01-01 00:00:00', '2026-01-01 00:00:00')"
            )
        )
        for seq, text in enumerate(["q1", "a1", "q2"], start=1):
            role = "user" if seq % 2 else "assistant"
            payload = json.dumps({"role": role, "content": [{"text": text}]})
            await conn.execute(
                sa.text(
                    "INSERT INTO agent_session_entries (session_id, seq, kind, payload, "
                    "created_at) VALUES ('old', :seq, 'message', :payload, "
                    "'2026-01-01 00:00:00')"
                ),
                {"seq": seq, "payload": payload},
            )
    await database.migrate()
    store = SqlSessionStore(database)
    assert [m.text for m in (await store.load("old")).messages] == ["q1", "a1", "q2"]
    assert [e.parent_seq for e in await store.entries("old")] == [None, 1, 2]
    await store.fork("old", 1)
    assert await store.append("old", [ChatMessage.assistant("b1")], expected_version=3) == 4
    assert [m.text for m in (await store.load("old")).messages] == ["q1", "b1"]

    await database.downgrade("0006")
    async with database.read() as conn:
        count = await conn.scalar(sa.text("SELECT count(*) FROM agent_session_entries"))
    assert count == 4


async def test_the_comparison_can_see_a_difference(empty_database: Database) -> None:
    """The no-differences check above is real: a missing index is reported."""
    await empty_database.migrate()
    async with empty_database.write() as conn:
        await conn.execute(sa.text("DROP INDEX ix_agent_runs_status"))
    differences = await model_differences(empty_database)
    assert [d[0] for d in differences] == ["add_index"]


async def test_0007_lets_one_run_of_a_session_be_in_progress(empty_database: Database) -> None:
    database = empty_database
    await database.migrate("0006")
    rows = [  # (run, status, session, seq): what a database of 0006 holds, untouched by 0007
        ("a", "in_progress", "s", 1),
        ("b", "queued", "s", 2),
        ("c", "in_progress", "t", 1),
        ("d", "in_progress", None, None),
        ("e", "in_progress", None, None),
    ]
    now = datetime.now(UTC)
    async with database.write() as conn:
        for run_id, status, session, seq in rows:
            await conn.execute(
                sa.insert(RunRow).values(
                    run_id=run_id,
                    status=status,
                    session_id=session,
                    session_seq=seq,
                    attempt=1,
                    created_at=now,
                    updated_at=now,
                )
            )
    await database.migrate()
    start_b = sa.text("UPDATE agent_runs SET status = 'in_progress' WHERE run_id = 'b'")
    with pytest.raises(sa.exc.IntegrityError):  # a second run of session s in progress
        async with database.write() as conn:
            await conn.execute(start_b)
    async with database.write() as conn:  # once a's run ended, b may start
        await conn.execute(sa.text("UPDATE agent_runs SET status = 'complete' WHERE run_id = 'a'"))
        await conn.execute(start_b)
    await database.downgrade("0006")  # the downgrade lifts the rule
    async with database.write() as conn:
        await conn.execute(sa.text("UPDATE agent_runs SET status = 'in_progress'"))
    assert await database.current_revision() == "0006"
    # two runs of session s in progress (an older release's workers): 0007 says so, untouched
    with pytest.raises(AgentError) as caught:
        await database.migrate()
    assert caught.value.kind is ErrorKind.CONFLICT
    assert "1 session(s) have more than one run in progress (first: 's')" in caught.value.message
    assert await database.current_revision() == "0006"


async def test_an_unknown_revision_is_a_config_error(tmp_path: Path) -> None:
    database = Database(sqlite_url(tmp_path / "agent.db"))
    try:
        with pytest.raises(AgentError) as caught:
            await database.migrate("nope")
        assert caught.value.kind is ErrorKind.CONFIG
        assert "nope" in caught.value.message
    finally:
        await database.dispose()


def test_the_scripts_are_found_in_the_checkout() -> None:
    found = migrations_dir()
    assert (found / "env.py").is_file()
    assert (found / "versions" / "0001_initial.py").is_file()


# --- the command line ------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "AGENT_DATABASE_URL"}
    return subprocess.run(
        [sys.executable, "-m", "agent_plugin", "migrate", *args],
        capture_output=True,
        text=True,
        check=False,
        env=environment,
        timeout=60,
    )


def sqlite_tables(path: Path) -> list[str]:
    import sqlite3

    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return sorted(name for (name,) in rows)


def test_the_cli_migrates_in_a_new_process(tmp_path: Path) -> None:
    path = tmp_path / "cli.db"
    result = cli("--database-url", sqlite_url(path))
    assert result.returncode == 0, result.stderr
    assert "is at revision 0008" in result.stdout
    assert sqlite_tables(path) == sorted([*PLUGIN_TABLES, VERSION_TABLE])


# The same entry point in-process (a new process costs seconds on a busy machine).


class Terminal(io.StringIO):
    """A stdin that says it is a terminal, so the downgrade asks."""

    def isatty(self) -> bool:
        return True


def test_the_cli_reads_the_apps_database_url_from_its_config_layers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("AGENT_DATABASE_URL", "AGENT_CONFIG_FILE", "AGENT_PROFILE", "AGENT_ENV_FILE"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "agent.toml").write_text(
        "[agent]\ndatabase_url = 'sqlite+aiosqlite:///./from-toml.db'\n", encoding="utf-8"
    )
    assert main(["migrate"]) == 0
    assert sqlite_tables(tmp_path / "from-toml.db") == sorted([*PLUGIN_TABLES, VERSION_TABLE])
    # The profile overlay and .env are the app's layers too.
    (tmp_path / "agent.prod.toml").write_text(
        "[agent]\ndatabase_url = 'sqlite+aiosqlite:///./from-overlay.db'\n", encoding="utf-8"
    )
    (tmp_path / ".env").write_text("AGENT_PROFILE=prod\n", encoding="utf-8")
    assert main(["migrate", "upgrade", "0002"]) == 0
    assert "at revision 0002 (behind head 0008" in capsys.readouterr().out
    assert (tmp_path / "from-overlay.db").is_file()
    monkeypatch.setenv("AGENT_DATABASE_URL", f"sqlite:///{tmp_path / 'plain.db'}")  # plain works
    assert main(["migrate", "current"]) == 0
    assert "is at base (no plugin tables); head is 0008 (database_url of the app's settings)" in (
        capsys.readouterr().out
    )
    # --database-url beats the layers, before or after the action.
    other = sqlite_url(tmp_path / "other.db")
    assert main(["migrate", "--database-url", other]) == 0
    assert main(["migrate", "current", "--database-url", other]) == 0
    assert "other.db is at revision 0008 (head) (--database-url)" in capsys.readouterr().out


def test_a_downgrade_needs_a_revision_and_a_confirmation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "down.db"
    url = ["--database-url", sqlite_url(path)]
    assert main(["migrate", *url]) == 0
    with pytest.raises(SystemExit):
        main(["migrate", "downgrade", *url])  # no revision: refused by the parser
    capsys.readouterr()

    # Not a terminal and no --yes: refused, and nothing changes.
    assert main(["migrate", "downgrade", "0003", *url], stdin=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "undoes 0008, 0007, 0006, 0005, 0004" in err
    assert "--yes" in err
    assert sqlite_tables(path) == sorted([*PLUGIN_TABLES, VERSION_TABLE])

    # A terminal asks; anything but yes cancels.
    asked: list[str] = []

    def answer(reply: str) -> Callable[[str], str]:
        def confirm(question: str) -> str:
            asked.append(question)
            return reply

        return confirm

    assert main(["migrate", "downgrade", "base", *url], confirm=answer(""), stdin=Terminal()) == 2
    assert "drops every plugin table" in asked[-1]
    assert sqlite_tables(path) == sorted([*PLUGIN_TABLES, VERSION_TABLE])
    assert main(["migrate", "downgrade", "base", *url], confirm=answer("y"), stdin=Terminal()) == 0
    assert sqlite_tables(path) == [VERSION_TABLE]
    assert "is at base (no plugin tables)" in capsys.readouterr().out

    # --yes goes ahead without asking; a downgrade with nothing to undo asks nothing.
    assert main(["migrate", "upgrade", "0003", *url]) == 0
    assert main(["migrate", "downgrade", "0001", "--yes", *url], confirm=answer("n")) == 0
    assert "at revision 0001" in capsys.readouterr().out
    count = len(asked)
    assert main(["migrate", "downgrade", "0001", *url], confirm=answer("n"), stdin=Terminal()) == 0
    assert len(asked) == count


def test_history_marks_the_head_and_the_current_revision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--database-url", sqlite_url(tmp_path / "history.db")]
    assert main(["migrate", "history", *url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("0008 (head)  Session branches and locks: every entry")
    assert lines[-1] == "base (current)  no plugin tables"
    assert [line.split()[0] for line in lines] == [
        "0008",
        "0007",
        "0006",
        "0005",
        "0004",
        "0003",
        "0002",
        "0001",
        "base",
    ]
    assert main(["migrate", "upgrade", "0002", *url]) == 0
    assert main(["migrate", "history", *url]) == 0
    assert "0002 (current)  Run records" in capsys.readouterr().out


def test_the_cli_reports_errors_without_the_password(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENT_DATABASE_URL", raising=False)
    url = "postgresql://agent:hunter2-secret@127.0.0.1:1/agent"
    assert main(["migrate", "--database-url", url]) == 1
    out, err = capsys.readouterr()
    assert "[Unavailable]" in err
    assert "postgresql+asyncpg://agent:***@127.0.0.1:1/agent" in err
    assert "hunter2-secret" not in out + err

    assert main(["migrate", "upgrade", "nope", "--database-url", "sqlite://"]) == 1
    assert "[Config] cannot upgrade to 'nope'" in capsys.readouterr().err
    assert main(["migrate", "downgrade", "nope", "--yes", "--database-url", "sqlite://"]) == 1
    assert "[Config] unknown revision 'nope'" in capsys.readouterr().err

    monkeypatch.setenv("AGENT_MAX_STEPS", "lots")  # the app's settings are checked as the app would
    assert main(["migrate"]) == 1
    assert "AGENT_MAX_STEPS must be a whole number" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["migrate", "sideways"])
