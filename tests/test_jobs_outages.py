"""Fault tests of background runs through outages, with no process killed [SPEC §6, HV-01]:
the database cut under running workers (a TCP proxy in front of PostgreSQL the test opens and
closes), Redis losing its data while a session's run waits for its retry, Redis down longer
than a command's retries while workers poll, and processes starting while their database (or
Redis) is down.

Each test asserts the promise in numbers: no finished call runs again (no worker dies here,
so no call at all runs twice), no run is lost or failed by the fault, the runs of a session
keep their order, and the processes stay up (or, past ``startup_wait_secs``, exit non-zero
with a clear message). Real arq worker processes, a real Redis (a private ``redis-server``
where the test restarts it), SQLite or PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.sessions import MessageEntry
from agent_plugin.storage import Database
from agent_plugin.web import AgentPlugin, AppAgent
from tests.jobs_app import JobsEnv, WorkerProcess, clean_redis, jobs_env, make_app, make_plugin
from tests.services import POSTGRES_URL
from tests.tcp_proxy import TcpProxy, free_port
from tests.test_jobs_faults import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FINISHED = ("complete", "failed", "cancelled")


# --- helpers ---------------------------------------------------------------------------------


@asynccontextmanager
async def serve(env: JobsEnv, **environ: str) -> AsyncIterator[tuple[AgentPlugin, AppAgent]]:
    plugin = make_plugin({**env.environ, **environ})
    app = make_app(plugin, runs_route=True)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app"),
    ):
        yield plugin, plugin.agent(app)


async def statuses(url: str, run_ids: list[str]) -> dict[str, str]:
    database = Database(url)
    try:
        async with database.read() as conn:
            rows = await conn.execute(
                sa.text("SELECT run_id, status FROM agent_runs WHERE run_id IN :ids").bindparams(
                    sa.bindparam("ids", expanding=True)
                ),
                {"ids": run_ids},
            )
            return {str(row[0]): str(row[1]) for row in rows.all()}
    finally:
        await database.dispose()


async def wait_all(url: str, run_ids: list[str], within: float) -> dict[str, str]:
    deadline = time.monotonic() + within
    while True:
        current = await statuses(url, run_ids)
        if all(current.get(r) in FINISHED for r in run_ids):
            return current
        assert time.monotonic() < deadline, current
        await asyncio.sleep(0.2)


def plan(tag: str, rounds: list[list[tuple[str, str]]], **fields: Any) -> str:
    return json.dumps({"tag": tag, "rounds": rounds, **fields})


def executions_per_call(env: JobsEnv, run_ids: list[str]) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for line in env.lines("tool_start"):
        if line.args[0] in run_ids:
            key = (line.args[0], line.args[1])
            counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.fixture
def postgres() -> Iterator[str]:
    """A PostgreSQL database of the test's own (created and dropped on the test server)."""
    base = make_url(POSTGRES_URL)
    name = f"agent_outage_{uuid.uuid4().hex[:10]}"

    async def admin(statement: str) -> None:
        engine = Database(base)
        try:
            async with engine.engine.connect() as conn:
                await conn.execution_options(isolation_level="AUTOCOMMIT")
                await conn.execute(sa.text(statement))
        finally:
            await engine.dispose()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def through(url: str, proxy: TcpProxy) -> str:
    return (
        make_url(url).set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    )


@pytest.fixture
def proxy(postgres: str) -> Iterator[TcpProxy]:
    target = make_url(postgres)
    forward = TcpProxy((target.host or "127.0.0.1", target.port or 5432))
    try:
        yield forward
    finally:
        forward.close()


# --- the database cut under running workers ------------------------------------------------


async def test_database_cuts_make_no_finished_call_run_again(
    tmp_path: Path, postgres: str, proxy: TcpProxy
) -> None:
    """The workers' database connections are cut again and again while runs make tool calls
    (the app still reaches the database). Each worker keeps the results it has and writes them
    once the database is back: every run completes, and every call ran exactly once."""
    proxy.open()
    env = jobs_env(tmp_path, database_url=postgres, lease="2", max_jobs="4", job_timeout="120")
    workers = [
        WorkerProcess(env, name=f"w{i}", extra={"AGENT_DATABASE_URL": through(postgres, proxy)})
        for i in range(2)
    ]
    try:
        for worker in workers:
            worker.start()
        async with serve(env) as (_, agent):
            run_ids = []
            for i in range(10):
                rounds = [
                    [("effect", f"c{i}r{r}c{c}") for c in range(1 + (i + r) % 2)] for r in range(3)
                ]
                session = f"cut-{i % 2}" if i % 3 == 0 else None
                prompt = plan(f"cut{i}", rounds, model_delay=0.15, tool_delay=0.3)
                run_ids.append((await agent.enqueue(prompt, session=session)).run_id)
            for _ in range(6):  # cuts of 0.4 to 2.4 s while the runs go on
                await asyncio.sleep(0.7)
                with proxy.cut_for():
                    await asyncio.sleep(0.4 + 0.4 * proxy.cuts)
            final = await wait_all(postgres, run_ids, within=150)
            records = {r: await agent.run_status(r) for r in run_ids}
        alive = [w.alive() for w in workers]
        outputs = "".join(w.output(whole=True) for w in workers)
    finally:
        for worker in workers:
            worker.stop()
        clean_redis(env)
    assert alive == [True, True], outputs[-3000:]
    failed = {r: records[r].error for r, status in final.items() if status != "complete"}
    assert not failed, failed  # no run failed (or was lost) by the cuts
    for record in records.values():
        assert record.outcome is not None
        assert record.outcome.text == "done after 3 rounds"
    counts = executions_per_call(env, run_ids)
    planned = sum(1 + (i + r) % 2 for i in range(10) for r in range(3))
    assert len(counts) == planned
    assert set(counts.values()) == {1}, {k: n for k, n in counts.items() if n != 1}
    # the cuts did hit the runs' writes: the workers kept trying them
    assert "trying again" in outputs, outputs[-3000:]


# --- Redis loses its data while a session's run waits for its retry ------------------------


async def test_a_redis_wipe_during_a_retry_wait_keeps_the_sessions_order(tmp_path: Path) -> None:
    """Run A of a session is rate limited and waits for its retry; B and C queue behind it.
    Redis restarts without its data during A's wait: every job and claim is
    gone. The database still says it is A's turn: the reconciler brings the jobs back, A
    runs first and completes, then B, then C; none fails."""
    server = RedisServer(tmp_path, persistent=False)
    env = jobs_env(
        tmp_path,
        redis_url=server.url,
        lease="1",
        reconcile_every="1",
        retry_backoff="4",
        max_jobs="4",
    )
    server.start()
    worker = WorkerProcess(env)
    session = "sr0"
    try:
        worker.start()
        async with serve(env) as (_, agent):
            a = plan(
                "A",
                [[("effect", "a1")], [("effect", "a2")]],
                fail={"round": 1, "times": 1, "kind": "rate_limited"},
            )
            ids = [(await agent.enqueue(a, session=session)).run_id]
            for tag in ("B", "C"):
                prompt = plan(tag, [[("effect", tag.lower())]])
                ids.append((await agent.enqueue(prompt, session=session)).run_id)
            deadline = time.monotonic() + 30
            while not env.lines("model_fail"):  # A's second model call failed: it waits
                assert time.monotonic() < deadline, "run A was never rate limited"
                await asyncio.sleep(0.05)
            server.restart()  # without persistence: Redis forgets everything
            assert server.queued(env.queue) == 0
            final = await wait_all(env.database_url, ids, within=90)
            entries = await agent.runtime.session_store.entries(session)
        alive = worker.alive()
        output = worker.output()
    finally:
        worker.stop()
        server.stop()
    assert alive, output
    assert final == dict.fromkeys(ids, "complete"), final  # 0 runs failed by the wipe
    # the session's turns in the order the runs were enqueued, each once
    users = [
        json.loads(e.message.text)["tag"]
        for e in entries
        if isinstance(e, MessageEntry) and e.message.role.value == "user"
    ]
    assert users == ["A", "B", "C"]
    starts = [(x.time, x.args[0]) for x in env.lines("model_start")]
    a_end = max(t for t, tag in starts if tag == "A")
    b_first = min(t for t, tag in starts if tag == "B")
    c_first = min(t for t, tag in starts if tag == "C")
    assert a_end < b_first < c_first, starts
    assert executions_per_call(env, ids) == dict.fromkeys(executions_per_call(env, ids), 1)


# --- Redis down for longer than a command's retries --------------------------------------


async def test_workers_ride_out_a_long_redis_restart(tmp_path: Path) -> None:
    """Redis stays down for 20 s while two workers poll (longer than the retries of one
    command used to last, after which arq's poll loop died): both workers wait for it, then
    run what is queued, before and after the outage."""
    server = RedisServer(tmp_path)
    env = jobs_env(tmp_path, redis_url=server.url, lease="5", max_jobs="2")
    server.start()
    workers = [WorkerProcess(env, name=f"w{i}") for i in range(2)]
    try:
        for worker in workers:
            worker.start()
        async with serve(env) as (_, agent):
            before = [
                (await agent.enqueue(plan(f"b{i}", [[("effect", f"b{i}")]]))).run_id
                for i in range(3)
            ]
            await wait_all(env.database_url, before, within=30)
            server.stop()
            await asyncio.sleep(20)
            server.start()
            after = [
                (await agent.enqueue(plan(f"a{i}", [[("effect", f"a{i}")]]))).run_id
                for i in range(3)
            ]
            final = await wait_all(env.database_url, before + after, within=60)
        alive = [w.alive() for w in workers]
        outputs = "".join(w.output(whole=True) for w in workers)
    finally:
        for worker in workers:
            worker.stop()
        server.stop()
    assert alive == [True, True], outputs
    assert set(final.values()) == {"complete"}, final
    assert "the worker waits for it" in outputs
    assert set(executions_per_call(env, before + after).values()) == {1}


# --- start-up with the database (or Redis) down ------------------------------------------


async def test_a_worker_started_while_the_database_is_down_waits_for_it(
    tmp_path: Path, postgres: str, proxy: TcpProxy
) -> None:
    """The database is unreachable when a worker starts: it tries again, a log line a try,
    and starts once the database is back; then it runs what was queued."""
    env = jobs_env(tmp_path, database_url=postgres, lease="2")
    worker = WorkerProcess(
        env, extra={"AGENT_DATABASE_URL": through(postgres, proxy), "AGENT_STARTUP_WAIT_SECS": "60"}
    )
    try:
        async with serve(env) as (_, agent):
            run_id = (await agent.enqueue(plan("s0", [[("effect", "s0")]]))).run_id
            worker.start(wait=False)
            deadline = time.monotonic() + 30
            while "opening the database" not in worker.output():
                assert worker.alive(), worker.output()
                assert time.monotonic() < deadline, worker.output()
                await asyncio.sleep(0.1)
            assert not worker.ready()
            proxy.open()
            worker.wait_ready(60)
            final = await wait_all(postgres, [run_id], within=60)
    finally:
        worker.stop()
        clean_redis(env)
    assert final == {run_id: "complete"}
    assert "try 1 failed" in worker.output(whole=True)


async def test_processes_give_up_after_startup_wait_secs_with_a_clear_message(
    tmp_path: Path, postgres: str, proxy: TcpProxy
) -> None:
    """Past ``startup_wait_secs`` a worker whose database (or Redis) stays down exits
    non-zero, saying what it waited for and for how long; an app's start-up fails with an
    ``unavailable`` error saying the same."""
    env = jobs_env(tmp_path, database_url=postgres)
    no_database = WorkerProcess(
        env,
        name="no-db",
        extra={"AGENT_DATABASE_URL": through(postgres, proxy), "AGENT_STARTUP_WAIT_SECS": "2"},
    )
    no_redis = WorkerProcess(
        env,
        name="no-redis",
        extra={
            "AGENT_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "AGENT_STARTUP_WAIT_SECS": "2",
        },
    )
    for worker in (no_database, no_redis):
        worker.start(wait=False)
    for worker in (no_database, no_redis):
        assert worker.process is not None
        code = await asyncio.to_thread(worker.process.wait, 60)
        assert code != 0, worker.output()
        assert not worker.ready()
    said = no_database.output(whole=True)
    assert "still out of reach after waiting 2 s: startup_wait_secs" in said
    said = no_redis.output(whole=True)
    assert "cannot reach Redis at redis://127.0.0.1:" in said
    assert "gave up after" in said
    assert "startup_wait_secs = 2" in said

    with pytest.raises(AgentError) as raised:
        async with serve(
            env, AGENT_DATABASE_URL=through(postgres, proxy), AGENT_STARTUP_WAIT_SECS="1"
        ):
            pass
    assert raised.value.kind is ErrorKind.UNAVAILABLE
    assert "startup_wait_secs" in raised.value.message


async def test_an_app_started_while_the_database_is_down_waits_for_it(
    tmp_path: Path, postgres: str, proxy: TcpProxy
) -> None:
    env = jobs_env(tmp_path, database_url=postgres)

    async def start_app() -> bool:
        async with serve(env, AGENT_DATABASE_URL=through(postgres, proxy)) as (_, agent):
            return (await agent.runtime.session_store.entries("nobody")) == []

    starting = asyncio.create_task(start_app())
    await asyncio.sleep(1.5)
    assert not starting.done()  # still waiting for the database
    proxy.open()
    assert await asyncio.wait_for(starting, 60)
