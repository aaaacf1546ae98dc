"""A worker running many model-bound runs at once (``agent_plugin/jobs/scale.py``, the default
``JobOptions`` and the database pool settings): a real arq worker process on Redis and
PostgreSQL, the Redis scripts of the queue against a real Redis, and the control watcher's
periodic check of every run in one transaction."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from arq.connections import ArqRedis, create_pool
from arq.constants import in_progress_key_prefix
from arq.jobs import Job
from sqlalchemy.engine import make_url

from agent_plugin.cancellation import CancelToken
from agent_plugin.jobs import AGENT_RUN, JobOptions
from agent_plugin.jobs.redis import dumps, loads, redis_settings
from agent_plugin.jobs.scale import (
    BoundedPool,
    bound_connections,
    enqueue_job,
    read_startable_jobs,
)
from agent_plugin.live import ControlWatcher
from agent_plugin.steering import Steering
from tests.jobs_app import JobsEnv, WorkerProcess, jobs_env, make_app, make_plugin
from tests.services import REDIS_URL
from tests.test_canary import drop_database, postgres_database

OLD_DEFAULT_MAX_JOBS = 10
ARQ_PREFIXES = ("arq:job:", "arq:result:", "arq:retry:", "arq:in-progress:")


def local_ports(pid: int, port: int) -> set[int]:
    """The local ports of the established TCP connections of the process ``pid`` to
    ``port`` (from ``/proc``)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                if fields[3] == "01" and fields[9] in inodes and remote_port == port:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def redis_port() -> int:
    return int(aioredis.ConnectionPool.from_url(REDIS_URL).connection_kwargs.get("port", 6379))


@pytest.fixture
async def pg_env(tmp_path: Path) -> AsyncIterator[JobsEnv]:
    """A background-run environment whose records live in a PostgreSQL database of its own."""
    name = f"agent_scale_{uuid.uuid4().hex[:10]}"
    env = jobs_env(tmp_path)
    url = await postgres_database(name)
    env.environ["AGENT_DATABASE_URL"] = url
    env.database_url = url
    try:
        yield env
    finally:
        await drop_database(name)


async def clean_redis_keys(env: JobsEnv, run_ids: list[str]) -> None:
    """The environment's keys: its queue, its prefix, and arq's keys of ``run_ids``."""
    client = aioredis.Redis.from_url(env.redis_url)
    try:
        keys: list[Any] = [env.queue, env.queue + ":health-check"]
        keys += [key async for key in client.scan_iter(match=env.prefix + "*")]
        keys += [f"{prefix}{run_id}" for run_id in run_ids for prefix in ARQ_PREFIXES]
        await client.delete(*keys)
    finally:
        await client.aclose()


def test_the_default_worker_concurrency_is_sized_for_runs_that_wait() -> None:
    options = JobOptions()
    assert options.max_jobs >= 100
    assert options.max_redis_connections < options.max_jobs
    settings = make_plugin({}).worker_settings()
    assert settings.max_jobs == int(os.environ.get("JOBS_TEST_MAX_JOBS", "10"))


async def test_one_worker_runs_more_runs_at_once_than_the_old_default_on_a_small_pool(
    pg_env: JobsEnv,
) -> None:
    """40 runs of two slow model calls (and a tool call) through one worker with the default
    concurrency, a pool of 3 PostgreSQL connections and 8 Redis connections: they overlap
    far beyond 10 at a time, and every one completes (none waits the pool out)."""
    runs = 40
    pg_port = make_url(pg_env.database_url).port or 5432
    worker = WorkerProcess(
        pg_env,
        extra={
            "JOBS_TEST_MAX_JOBS": str(JobOptions().max_jobs),
            "JOBS_TEST_MAX_REDIS_CONNECTIONS": "8",
            "AGENT_DATABASE_POOL_SIZE": "2",
            "AGENT_DATABASE_MAX_OVERFLOW": "1",
        },
    )
    peak = {"postgres": 0, "redis": 0}
    sampling = True
    observer = aioredis.Redis.from_url(REDIS_URL)

    async def sample() -> None:
        while sampling:
            peak["postgres"] = max(peak["postgres"], len(local_ports(worker.pid, pg_port)))
            # Redis's own list of its clients: a socket the worker is still closing is not one
            mine = local_ports(worker.pid, redis_port())
            clients = await observer.client_list()
            live = sum(1 for c in clients if int(c["addr"].rsplit(":", 1)[1]) in mine)
            peak["redis"] = max(peak["redis"], live)
            await asyncio.sleep(0.02)

    plugin = make_plugin(pg_env.environ)
    app = make_app(plugin, runs_route=True)
    run_ids: list[str] = []
    records: list[dict[str, Any]] = []
    tags = [f"wide{n}" for n in range(runs)]
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c,
    ):
        paths = []
        for tag in tags:  # all queued before the worker starts: its first poll sees them all
            prompt = json.dumps({"tag": tag, "rounds": [[["effect", tag]]], "model_delay": 1})
            response = await c.post("/agent/runs", json={"prompt": prompt})
            assert response.status_code == 202, response.text
            paths.append(response.json()["status_path"])
            run_ids.append(response.json()["run_id"])
        worker.start()
        sampler = asyncio.ensure_future(sample())
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                records = [(await c.get(path)).json() for path in paths]
                if all(r["status"] not in ("queued", "in_progress") for r in records):
                    break
                await asyncio.sleep(0.25)
        finally:
            sampling = False
            await sampler
            await observer.aclose()
            worker.stop()
            await clean_redis_keys(pg_env, run_ids)
    assert [r["status"] for r in records] == ["complete"] * runs, worker.output()
    # the most model calls in flight at one moment, from the worker's log
    moments = sorted(
        (line.time, +1 if line.event == "model_start" else -1)
        for line in pg_env.lines()
        if line.event in ("model_start", "model_end") and line.args[0] in tags
    )
    in_flight = most = 0
    for _, step in moments:
        in_flight += step
        most = max(most, in_flight)
    assert most > OLD_DEFAULT_MAX_JOBS
    assert 1 <= peak["postgres"] <= 3
    assert 1 <= peak["redis"] <= 8


# --- the Redis scripts ------------------------------------------------------------------------


@pytest.fixture
async def arq_redis() -> AsyncIterator[ArqRedis]:
    redis = await create_pool(
        redis_settings(REDIS_URL, worker=False), job_serializer=dumps, job_deserializer=loads
    )
    try:
        yield redis
    finally:
        await redis.aclose(close_connection_pool=True)


async def test_enqueue_job_puts_an_arq_job_on_the_queue_once(arq_redis: ArqRedis) -> None:
    queue = f"scale-test-{uuid.uuid4().hex[:8]}:queue"
    now, later = uuid.uuid4().hex, uuid.uuid4().hex
    try:
        assert await enqueue_job(arq_redis, AGENT_RUN, "run-1", job_id=now, queue_name=queue)
        assert not await enqueue_job(arq_redis, AGENT_RUN, "run-2", job_id=now, queue_name=queue)
        assert await enqueue_job(
            arq_redis, AGENT_RUN, "run-3", job_id=later, queue_name=queue, defer_by=60
        )
        info = await Job(now, arq_redis, _queue_name=queue, _deserializer=loads).info()
        assert info is not None
        assert (info.function, list(info.args), info.kwargs) == (AGENT_RUN, ["run-1"], {})
        scores = dict(await arq_redis.zrange(queue, 0, -1, withscores=True))
        assert 55_000 <= scores[later.encode()] - scores[now.encode()] <= 65_000
        ttl = await arq_redis.pttl(f"arq:job:{now}")
        assert 86_000_000 <= ttl <= 86_400_000  # arq's own expiry of a job
    finally:
        await arq_redis.delete(queue, f"arq:job:{now}", f"arq:job:{later}")


async def test_a_workers_poll_reads_only_the_jobs_nobody_runs(arq_redis: ArqRedis) -> None:
    queue = f"scale-test-{uuid.uuid4().hex[:8]}:queue"
    ids = [f"{queue}-job{n}" for n in range(5)]
    await arq_redis.zadd(queue, {job: n for n, job in enumerate(ids)})
    await arq_redis.set(in_progress_key_prefix + ids[0], b"1")
    await arq_redis.set(in_progress_key_prefix + ids[2], b"1")
    try:
        read_startable_jobs(arq_redis, queue)
        due = await arq_redis.zrangebyscore(queue, min=float("-inf"), start=0, num=10, max=100)
        assert due == [ids[1].encode(), ids[3].encode(), ids[4].encode()]
        assert await arq_redis.zrangebyscore(queue, min=float("-inf"), start=0, num=2, max=100) == [
            ids[1].encode(),
            ids[3].encode(),
        ]
        # other reads are Redis's own: the upkeep's sweep of the claimed jobs sees them all
        assert await arq_redis.zrangebyscore(queue, min=0, max=1) == [
            ids[0].encode(),
            ids[1].encode(),
        ]
        assert len(await arq_redis.zrangebyscore(queue, "-inf", 100, start=0, num=10)) == 5
    finally:
        await arq_redis.delete(queue, *(in_progress_key_prefix + job for job in ids))


async def test_bound_connections_share_a_few_connections_between_many_commands() -> None:
    name = f"scale-test-{uuid.uuid4().hex[:8]}"
    client = aioredis.Redis.from_url(REDIS_URL, client_name=name)
    observer = aioredis.Redis.from_url(REDIS_URL)
    try:
        await bound_connections(client, 3)
        peak = 0

        async def blocked() -> Any:
            return await client.blpop([f"{name}:list"], timeout=0.3)

        waiting = [asyncio.ensure_future(blocked()) for _ in range(12)]
        while not all(task.done() for task in waiting):
            clients = await observer.client_list()
            peak = max(peak, sum(1 for c in clients if c.get("name") == name))
            await asyncio.sleep(0.02)
        assert [task.result() for task in waiting] == [None] * 12
        assert 1 <= peak <= 3
    finally:
        await client.aclose(close_connection_pool=True)
        await observer.aclose()


async def test_a_bounded_pool_hands_a_free_connection_over_without_waiting() -> None:
    # redis-py's blocking pool takes every connection under a condition and a timer; a worker's
    # command that finds one free while no other waits takes it at once, and while commands
    # wait, a connection given back goes to them (here: the first, then the later one)
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        await bound_connections(client, 2)
        pool = client.connection_pool
        assert isinstance(pool, BoundedPool)
        async with pool._condition:  # held: a command that went through the wait would hang
            assert await asyncio.wait_for(client.ping(), 2)
        held = [await pool.get_connection() for _ in range(2)]
        waiting = asyncio.ensure_future(client.ping())
        await asyncio.sleep(0.05)
        later = asyncio.ensure_future(pool.get_connection())
        await asyncio.sleep(0.05)
        assert not waiting.done()  # both taken: they wait
        assert not later.done()
        await pool.release(held.pop())
        assert await asyncio.wait_for(waiting, 2)  # the first to wait is served first ...
        held.append(await asyncio.wait_for(later, 2))  # ... and the later one after it
        for connection in held:
            await pool.release(connection)
        assert await asyncio.wait_for(client.ping(), 2)
    finally:
        await client.aclose(close_connection_pool=True)


async def test_the_periodic_check_keeps_a_messages_mode() -> None:
    """A message stored with its mode (as ``send_steering`` stores it) whose notice was lost
    joins the run by its mode when the periodic check finds it, as it does when the notice
    comes: a follow-up waits for the run's end, it does not steer."""
    prefix = f"scale-test-{uuid.uuid4().hex[:8]}:run:"
    client = aioredis.Redis.from_url(REDIS_URL)
    watcher = ControlWatcher(client, prefix=prefix, poll=0.1)
    steering = Steering()
    stored = json.dumps(["agent-message", "followup", "and then the summary"])
    try:
        async with watcher.watch("run1", CancelToken(), steering):
            await client.rpush(f"{prefix}run1:steer", stored)
            for _ in range(200):  # the next periodic check, 0.1 s away
                if steering.following:
                    break
                await asyncio.sleep(0.05)
        assert not steering.pending
        assert [m.text for m in steering.take_followup()] == ["and then the summary"]
    finally:
        await watcher.aclose()
        await client.delete(f"{prefix}run1:steer")
        await client.aclose()


async def test_the_watchers_periodic_check_carries_requests_to_every_run_in_one_go() -> None:
    """Requests whose notice was lost (stored, never published) reach each watched run at
    the next periodic check, and only the runs they are for."""
    prefix = f"scale-test-{uuid.uuid4().hex[:8]}:run:"
    client = aioredis.Redis.from_url(REDIS_URL)
    watcher = ControlWatcher(client, prefix=prefix, poll=0.1)
    runs = [f"run{n}" for n in range(30)]
    tokens = {run: CancelToken() for run in runs}
    steering = {run: Steering() for run in runs}
    try:
        async with contextlib.AsyncExitStack() as stack:
            for run in runs:
                await stack.enter_async_context(watcher.watch(run, tokens[run], steering[run]))
            await client.set(f"{prefix}run3:cancel", "stop three")
            await client.rpush(f"{prefix}run7:steer", "turn left", "then right")
            deadline = time.monotonic() + 10
            done = False
            while not done and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                done = tokens["run3"].cancelled and steering["run7"].pending
        assert [run for run in runs if tokens[run].cancelled] == ["run3"]
        assert tokens["run3"].reason == "stop three"
        assert [m.text for m in steering["run7"].drain()] == ["turn left", "then right"]
        assert [run for run in runs if steering[run].pending] == []
        assert await client.exists(f"{prefix}run7:steer") == 0
    finally:
        await watcher.aclose()
        await client.delete(f"{prefix}run3:cancel", f"{prefix}run7:steer")
        await client.aclose()
