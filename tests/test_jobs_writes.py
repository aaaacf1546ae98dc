"""How many durable writes a background run makes: the fewest that keep its guarantees (its
start with its lease; each model reply before its tools run; each round's results before the
next model call; its end), with progress and the lease renewed on those writes [HV-01].

The deliveries run in this process on SQLite and PostgreSQL; an event listener counts the SQL
statements and transactions of the worker's database while one job is delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from arq.worker import Retry
from sqlalchemy import event

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.ids import new_run_id
from agent_plugin.jobs import agent_run
from agent_plugin.journal import Appended
from agent_plugin.messages import ChatMessage
from agent_plugin.outages import keep_trying
from agent_plugin.records import RunStatus
from agent_plugin.storage import Database
from agent_plugin.storage.leased_journal import LeasedRunJournal
from tests.jobs_app import LOG_ENV, JobsEnv, clean_redis, in_process, jobs_env, make_plugin
from tests.test_jobs_outages import postgres  # noqa: F401  (a fixture)

pytestmark = pytest.mark.timeout(60)


@dataclass
class Counted:
    statements: int = 0
    transactions: int = 0
    log: list[str] = field(default_factory=list)


@contextlib.contextmanager
def counting(database: Database) -> Iterator[Counted]:
    counted = Counted()
    engine = database.engine.sync_engine

    def statement(*args: Any) -> None:
        counted.statements += 1
        counted.log.append(str(args[2])[:60].replace("\n", " ") + str(args[3])[:150])

    def begin(*_args: Any) -> None:
        counted.transactions += 1

    event.listen(engine, "before_cursor_execute", statement)
    event.listen(engine, "begin", begin)
    try:
        yield counted
    finally:
        event.remove(engine, "before_cursor_execute", statement)
        event.remove(engine, "begin", begin)


@pytest.fixture(params=["sqlite", "postgresql"])
def env(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[JobsEnv]:
    url = request.getfixturevalue("postgres") if request.param == "postgresql" else None
    # a lease long enough that no renewal of its own falls due while a run lasts (the runs'
    # writes renew it; one that writes nothing for a third of a lease renews it apart)
    environment = jobs_env(tmp_path, database_url=url, lease="30")
    monkeypatch.setenv(LOG_ENV, str(environment.log))
    try:
        yield environment
    finally:
        clean_redis(environment)


@contextlib.asynccontextmanager
async def delivering(env: JobsEnv) -> AsyncIterator[Any]:
    async with in_process(make_plugin(env.environ)) as here:
        yield here


async def writes_of(env: JobsEnv, rounds: list[list[list[str]]]) -> Counted:
    async with delivering(env) as here:
        prompt = json.dumps({"tag": "w", "rounds": rounds})
        run_id = (await here.agent.enqueue(prompt)).run_id
        database = here.runtime.database
        assert database is not None
        with counting(database) as counted, contextlib.suppress(Retry):
            await agent_run(here.job_ctx(run_id), run_id)
        record = await here.jobs.get(run_id)
        assert record.status is RunStatus.COMPLETE, record
        assert record.progress_pct == 100
        return counted


async def test_a_one_round_run_writes_four_transactions(env: JobsEnv) -> None:
    """Its start (the arguments read with it), its reply with its ``started`` checkpoint,
    its tool result with the round, and its end: 4 transactions, 7 statements."""
    counted = await writes_of(env, [[["effect", "one"]]])
    assert (counted.transactions, counted.statements) == (4, 7), "\n".join(counted.log)


async def test_each_more_round_costs_two_transactions(env: JobsEnv) -> None:
    """Its reply, and its results with the round's message: also for a round of two calls
    that finish together (a call that finishes while others still run is written at once,
    on its own, so that it never runs again)."""
    one = await writes_of(env, [[["effect", "a"]]])
    three = await writes_of(
        env, [[["effect", "a"]], [["effect", "b"], ["effect", "c"]], [["effect", "d"]]]
    )
    assert three.transactions == one.transactions + 2 * 2, "\n".join(three.log)


class CommitsThenBreaks:
    """A database whose first write commits and then fails as ``unavailable``: what a
    connection that breaks after the commit looks like to the writer."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.breaks = 1

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[Any]:
        async with self.database.write() as conn:
            yield conn
        if self.breaks:
            self.breaks -= 1
            raise AgentError(ErrorKind.UNAVAILABLE, "the connection broke after the commit")


async def test_a_write_tried_again_after_a_commit_it_did_not_hear_of_is_written_once(
    env: JobsEnv,
) -> None:
    async with delivering(env) as here:
        store = here.jobs.store
        run_id = new_run_id()
        await store.create(run_id, origin="request", args={})
        record = await store.start(run_id, lease=30)
        journal = LeasedRunJournal(
            cast(Database, CommitsThenBreaks(store.database)),
            run_id,
            attempt=record.attempt,
            after_seq=0,
            lease=30,
            persist=lambda what, write: keep_trying(what, write, first_delay=0.01),
        )
        first = Appended(messages=[ChatMessage.user("once")])
        second = Appended(messages=[ChatMessage.user("twice?")])
        await journal.record(first)  # committed, then "failed", then tried again
        await journal.record(second)
        assert await store.journal_entries(run_id) == [first, second]
        assert journal.transactions == 2


async def test_a_run_in_a_session_writes_its_final_reply_before_saving_its_turn(
    env: JobsEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run in a session saves its turn before its end is recorded. A delivery that stops in
    between (here: the worker shuts down as the end is written) leaves a session that holds
    the turn; its final reply, written before the save, tells the next delivery that the turn
    was its own, and that delivery ends the run instead of failing it as ``conflict``."""
    from agent_plugin.storage import SqlRunStore

    finish = SqlRunStore.finish
    stops = [True]

    async def stopping(self: SqlRunStore, *args: Any, **kwargs: Any) -> Any:
        if stops and stops.pop():
            raise asyncio.CancelledError  # the worker shuts down: arq runs the job again
        return await finish(self, *args, **kwargs)

    monkeypatch.setattr(SqlRunStore, "finish", stopping)
    async with delivering(env) as here:
        prompt = json.dumps({"tag": "s", "rounds": [[["effect", "once"]]]})
        run_id = (await here.agent.enqueue(prompt, session="s-final")).run_id
        database = here.runtime.database
        assert database is not None
        with counting(database) as counted, pytest.raises(asyncio.CancelledError):
            await agent_run(here.job_ctx(run_id), run_id)
        # start, reply, round, the final reply, the session's turn, and the run put back
        assert counted.transactions >= 5, "\n".join(counted.log)
        with contextlib.suppress(Retry):
            await agent_run(here.job_ctx(run_id), run_id)
        record = await here.jobs.get(run_id)
        assert record.status is RunStatus.COMPLETE, record
        assert record.outcome is not None
        assert record.outcome.text == "done after 1 rounds"
        session = await here.runtime.session_store.load("s-final")
        texts = [m.text for m in session.messages]
        assert texts.count("done after 1 rounds") == 1, texts  # the turn saved once
