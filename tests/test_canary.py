"""The canary: the configured API key, of a shape no pattern knows, goes everywhere a run can
take it and is found nowhere it could leak (issue #17, "done when").

The key is ``AGENT_API_KEY`` of the app and of its worker (a real arq process, on PostgreSQL
and Redis). It is put in prompts, in a tool's arguments and output, in model replies and in
a provider error; the runs go through a pause and a resume, a retry, a failure and a cancel,
in the foreground (SSE) and in the background. Then every place a secret could end up is
searched for it: every row of every table, every Redis key of the runs, the logs of both
processes at DEBUG, both SSE streams, the run records and every error body.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import sqlalchemy as sa
from fastapi import FastAPI
from pydantic import BaseModel

from agent_plugin.errors import ErrorKind
from agent_plugin.storage import Database
from agent_plugin.web import AgentHandle
from tests.jobs_app import JobsEnv, WorkerProcess, jobs_env, make_plugin
from tests.test_storage import POSTGRES_URL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

CANARY = "qz" + uuid.uuid4().hex + uuid.uuid4().hex[:8]
"""A key of no familiar shape (a gateway's or Azure's): only its value gives it away."""
CONTROL = "qz" + uuid.uuid4().hex + uuid.uuid4().hex[:8]
"""The same shape, never configured: found where the canary would be, so the search is real."""


class Question(BaseModel):
    prompt: str


def foreground_app(environ: dict[str, str]) -> FastAPI:
    """The tests' plugin, with a route that streams a run of its own (``AgentHandle.stream``)."""
    app = FastAPI()
    make_plugin(environ).install(app, runs_route=True, allow_anonymous=True)

    @app.post("/ask/stream")
    async def ask_stream(question: Question, agent: AgentHandle) -> Any:
        return agent.stream(question.prompt)

    return app


def plan(**fields: Any) -> str:
    """A prompt the scripted model follows, carrying the canary itself."""
    return json.dumps({"tag": f"canary{uuid.uuid4().hex[:8]}", "note": CANARY, **fields})


async def postgres_database(name: str) -> str:
    admin = Database(POSTGRES_URL)
    try:
        async with admin.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    finally:
        await admin.dispose()
    url = POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    database = Database(url)
    try:
        await database.migrate()
    finally:
        await database.dispose()
    return url


async def drop_database(name: str) -> None:
    admin = Database(POSTGRES_URL)
    try:
        async with admin.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        await admin.dispose()


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[JobsEnv]:
    name = f"agent_canary_{uuid.uuid4().hex[:10]}"
    base = jobs_env(tmp_path)
    url = await postgres_database(name)
    base.environ.update({"AGENT_DATABASE_URL": url, "AGENT_API_KEY": CANARY})
    base.database_url = url
    try:
        yield base
    finally:
        await drop_database(name)


class Finder:
    """Counts where the canary (and the control) turned up."""

    def __init__(self) -> None:
        self.hits: dict[str, int] = {}
        self.control: set[str] = set()

    def look(self, where: str, text: str | bytes) -> None:
        raw = text if isinstance(text, bytes) else text.encode()
        found = raw.count(CANARY.encode())
        if found:
            self.hits[where] = self.hits.get(where, 0) + found
        if CONTROL.encode() in raw:
            self.control.add(where.split(" (")[0])


async def wait_until(client: httpx.AsyncClient, path: str, done: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        record: dict[str, Any] = (await client.get(path)).json()
        if record["status"] in done:
            return record
        assert time.monotonic() < deadline, record
        await asyncio.sleep(0.1)


async def test_the_configured_key_is_found_nowhere(
    env: JobsEnv, caplog: pytest.LogCaptureFixture
) -> None:
    finder = Finder()
    worker = WorkerProcess(env, extra={"JOBS_TEST_DEBUG_LOGS": "1"})
    worker.start()
    app = foreground_app(env.environ)
    caplog.set_level(logging.DEBUG)
    paths: list[str] = []
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c,
        ):
            # foreground: the key in the prompt, a tool's arguments and result, the reply
            answer = f"the key is {CANARY}"
            streamed = await c.post(
                "/ask/stream", json={"prompt": plan(rounds=[[["effect", CANARY]]], answer=answer)}
            )
            assert streamed.status_code == 200
            assert "run_end" in streamed.text
            finder.look("foreground SSE", streamed.text)

            async def run(prompt: str) -> str:
                queued = await c.post("/agent/runs", json={"prompt": prompt})
                assert queued.status_code == 202, queued.text
                finder.look("enqueue answer", queued.text)
                paths.append(queued.json()["status_path"])
                return str(queued.json()["status_path"])

            # background: the same, echoing the tool's result in the reply
            plain = await run(
                plan(rounds=[[["effect", CANARY], ["effect", CONTROL]]], answer=answer, echo=True)
            )
            # a pause for approval of a call whose arguments hold the key, then the resume
            paused = await run(plan(rounds=[[["send", CANARY]]], answer=answer))
            record = await wait_until(c, paused, {"awaiting_approval", "failed"})
            assert record["status"] == "awaiting_approval", record
            call = record["awaiting"][0]["call_id"]
            # a forged decision naming the key as a call id: refused, without echoing it
            forged = await c.post(
                f"{paused}/decisions",
                json=[{"call_id": CANARY, "approval": {"verdict": "approve"}}],
            )
            assert forged.status_code == 409
            finder.look("error body (forged decision)", forged.text)
            resumed = await c.post(
                f"{paused}/decisions", json=[{"call_id": call, "approval": {"verdict": "approve"}}]
            )
            assert resumed.status_code == 202, resumed.text
            # a retry after a rate limit whose message holds the key
            fail_once = {"round": 0, "times": 1, "kind": "rate_limited", "message": CANARY}
            retried = await run(plan(answer=answer, fail=fail_once))
            # a failure for good, with the key in the provider's message
            fail_always = {"round": 0, "times": 99, "kind": "provider", "message": CANARY}
            failed = await run(plan(fail=fail_always))
            # a cancel whose reason holds the key
            waiting = await c.post(
                "/agent/runs", json={"prompt": plan(rounds=[[["effect", "x"]]], model_delay=30)}
            )
            cancelled = str(waiting.json()["status_path"])
            paths.append(cancelled)
            await wait_until(c, cancelled, {"in_progress"})
            await c.post(f"{cancelled}/cancel", json={"reason": f"stop {CANARY}"})

            outcomes = {
                path: await wait_until(c, path, {"complete", "failed", "cancelled"})
                for path in (plain, paused, retried, failed, cancelled)
            }
            assert outcomes[plain]["status"] == "complete"
            assert outcomes[paused]["status"] == "complete"
            assert outcomes[retried]["status"] == "complete"
            assert outcomes[retried]["attempt"] == 2
            assert outcomes[failed]["status"] == "failed"
            assert outcomes[failed]["error"]["kind"] == ErrorKind.PROVIDER.value
            assert outcomes[cancelled]["status"] == "cancelled"

            for path in paths:
                finder.look("run record", (await c.get(path)).text)
                events = await c.get(f"{path}/events")
                finder.look("background SSE", events.text)
            finder.look("run listing", (await c.get("/agent/runs?limit=200")).text)
    finally:
        worker.stop()

    # every row of every table
    database = Database(env.database_url)
    try:
        async with database.read() as conn:
            tables = (
                await conn.execute(
                    sa.text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
                )
            ).scalars()
            for table in list(tables):
                rows = (await conn.execute(sa.text(f'SELECT * FROM "{table}"'))).all()
                assert rows or table != "agent_runs"
                for row in rows:
                    finder.look(f"table {table}", json.dumps([str(v) for v in row]))
    finally:
        await database.dispose()

    # every Redis key of the runs: the queue, streams, control keys, locks, arq's keys
    client = redis.Redis.from_url(env.redis_url)
    try:
        run_ids = [path.rsplit("/", 1)[-1] for path in paths]
        keys = [*client.scan_iter(match=env.prefix + "*"), env.queue.encode()]
        for run_id in run_ids:
            keys += list(client.scan_iter(match=f"arq:*{run_id}*"))
        assert keys
        for key in keys:
            kind = client.type(key)
            if kind == b"string":
                value: Any = client.get(key)
            elif kind == b"hash":
                value = client.hgetall(key)
            elif kind == b"stream":
                value = client.xrange(key)
            elif kind == b"zset":
                value = client.zrange(key, 0, -1)
            elif kind == b"list":
                value = client.lrange(key, 0, -1)
            else:
                value = b""
            finder.look(f"redis {kind.decode()}", repr(value))
        client.delete(*keys)
    finally:
        client.close()

    # the logs of the app (here) and of the worker, every logger at DEBUG
    finder.look("app log", "\n".join(r.getMessage() for r in caplog.records))
    finder.look("app log (exceptions)", "\n".join(str(r.exc_info) for r in caplog.records))
    finder.look("worker log", worker.output(whole=True))

    assert finder.hits == {}
    # The unconfigured key of the same shape was found where it went: the search covers them.
    assert {"table agent_runs", "table agent_run_checkpoints", "background SSE"} <= finder.control
