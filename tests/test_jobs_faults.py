"""Fault tests of background runs: workers killed with SIGKILL at random points, and a Redis
restart while runs wait in the queue [SPEC §6, HV-01].

Real arq worker processes, a real Redis, a SQLite database shared with the app. The scripted
model and the tools log every model call and every tool execution with the worker's pid
(``tests/jobs_app.py``), so the tests can prove that a call ran again only when the worker
running it was killed, and that no run was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import sqlite3
import subprocess
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import redis

from agent_plugin.sessions import MessageEntry
from agent_plugin.web import AgentPlugin, AppAgent
from tests.jobs_app import (
    JobsEnv,
    Line,
    WorkerProcess,
    clean_redis,
    jobs_env,
    make_app,
    make_plugin,
    read_log,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MODEL_DELAY = 0.25
TOOL_DELAY = 0.25
KILLS = 20
ACTIVE_RUNS = 8
FINISHED = ("complete", "failed", "cancelled")


# --- the app side ---------------------------------------------------------------------------


@dataclass
class Served:
    plugin: AgentPlugin
    client: httpx.AsyncClient
    handle: AppAgent


@asynccontextmanager
async def serve(env: JobsEnv) -> AsyncIterator[Served]:
    plugin = make_plugin(env.environ)
    app = make_app(plugin, runs_route=True)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client,
    ):
        yield Served(plugin, client, plugin.agent(app))


def statuses(env: JobsEnv) -> dict[str, str]:
    """Every run's status, read straight from the shared SQLite file."""
    path = env.database_url.removeprefix("sqlite+aiosqlite:///")
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as connection:
        return dict(connection.execute("SELECT run_id, status FROM agent_runs").fetchall())


@dataclass
class Planned:
    run_id: str
    tag: str
    calls: int
    session: str | None


@dataclass
class Feeder:
    """Keeps a few runs going (some in sessions, some needing approval) and approves pauses."""

    served: Served
    env: JobsEnv
    planned: dict[str, Planned] = field(default_factory=dict)
    approvals: int = 0

    async def enqueue(self, index: int) -> None:
        session = ("fault-a", "fault-b")[index % 2] if index % 3 == 1 else None
        rounds: list[list[tuple[str, str]]] = [
            [("effect", f"k{index}r{r}c{c}") for c in range(random.choice((1, 2)))]
            for r in range(3)
        ]
        if session is None and index % 5 == 2:
            rounds[1].append(("send", f"k{index}"))
        tag = f"f{index}"
        prompt = json.dumps(
            {
                "tag": tag,
                "rounds": rounds,
                "model_delay": MODEL_DELAY,
                "tool_delay": TOOL_DELAY,
            }
        )
        handle = await self.served.handle.enqueue(prompt, session=session)
        calls = sum(len(r) for r in rounds)
        self.planned[handle.run_id] = Planned(handle.run_id, tag, calls, session)

    async def approve(self, current: dict[str, str]) -> None:
        for run_id in self.planned:
            if current.get(run_id) != "awaiting_approval":
                continue
            record = await self.served.handle.run_status(run_id)
            decisions = [
                {"call_id": a.call_id, "approval": {"verdict": "approve"}} for a in record.awaiting
            ]
            response = await self.served.client.post(
                f"/agent/runs/{run_id}/decisions", json=decisions
            )
            assert response.status_code in (202, 409), response.text
            self.approvals += response.status_code == 202

    async def keep_going(self, stop: asyncio.Event) -> None:
        index = 0
        while not stop.is_set():
            current = await asyncio.to_thread(statuses, self.env)
            await self.approve(current)
            active = sum(1 for r in self.planned if current.get(r) not in FINISHED)
            for _ in range(ACTIVE_RUNS - active):
                await self.enqueue(index)
                index += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)

    async def drain(self, within: float) -> dict[str, str]:
        deadline = time.monotonic() + within
        while True:
            current = await asyncio.to_thread(statuses, self.env)
            if all(current.get(r) in FINISHED for r in self.planned):
                return current
            assert time.monotonic() < deadline, {
                r: current.get(r) for r in self.planned if current.get(r) not in FINISHED
            }
            await self.approve(current)
            await asyncio.sleep(0.2)


# --- the worker side ------------------------------------------------------------------------


class Fleet:
    """A few worker processes; a killed one is replaced by a fresh process at once."""

    def __init__(self, env: JobsEnv, size: int) -> None:
        self.workers = [WorkerProcess(env, name=f"w{i}") for i in range(size)]

    def start(self) -> None:
        for worker in self.workers:
            worker.start(wait=False)

    def running(self, pid: int) -> bool:
        return any(w.alive() and w.pid == pid for w in self.workers)

    def kill(self, pid: int) -> float:
        for worker in self.workers:
            if worker.alive() and worker.pid == pid:
                worker.kill()
                killed_at = time.time()
                worker.start(wait=False)
                return killed_at
        raise AssertionError(f"no running worker {pid}")

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()


class Tail:
    """Reads the log's new lines as they come."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new_lines(self) -> list[Line]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [Line.parse(text) for text in complete.decode().splitlines() if text]

    async def wait_for(self, match: Callable[[Line], bool], within: float) -> Line:
        deadline = time.monotonic() + within
        while True:
            for line in self.new_lines():
                if match(line):
                    return line
            assert time.monotonic() < deadline, "no worker reached the kill point"
            await asyncio.sleep(0.005)


@dataclass(frozen=True)
class Kill:
    time: float
    pid: int
    mode: str
    line: Line


KILL_POINTS = {
    "model": ("model_start",),  # during a model call
    "tool": ("tool_start",),  # during a tool call
    "between": ("model_end", "tool_end"),  # between steps, while the checkpoint is written
}


async def kill_at_random_points(fleet: Fleet, tail: Tail, count: int) -> list[Kill]:
    kills: list[Kill] = []
    modes = list(KILL_POINTS)
    for number in range(count):
        mode = modes[number % len(modes)]
        await asyncio.sleep(random.uniform(0.1, 0.6))
        tail.new_lines()  # only lines from now on
        events = KILL_POINTS[mode]

        def kill_point(line: Line, events: tuple[str, ...] = events) -> bool:
            return line.event in events and fleet.running(line.pid)

        line = await tail.wait_for(kill_point, 60)
        if mode == "model":
            await asyncio.sleep(random.uniform(0, 0.8 * MODEL_DELAY))
        elif mode == "tool":
            await asyncio.sleep(random.uniform(0, 0.8 * TOOL_DELAY))
        kills.append(Kill(fleet.kill(line.pid), line.pid, mode, line))
    return kills


# --- checks ---------------------------------------------------------------------------------


def repeats_are_explained(
    lines: list[Line], event: str, key: Callable[[Line], tuple[str, ...]], killed: dict[int, float]
) -> int:
    """Every repeated execution followed the death of the worker running the previous one.

    Returns how many repeats there were.
    """
    executions: dict[tuple[str, ...], list[Line]] = defaultdict(list)
    for line in lines:
        if line.event == event:
            executions[key(line)].append(line)
    repeats = 0
    for name, runs in executions.items():
        for first, again in pairwise(runs):
            died = killed.get(first.pid)
            assert died is not None, f"{event} {name} ran again, but worker {first.pid} lived"
            assert first.time < died < again.time, f"{event} {name} ran again before its crash"
            repeats += 1
    return repeats


def interrupted(kill: Kill, lines: list[Line]) -> bool:
    """Whether the call the kill was aimed at never finished in the killed worker."""
    end = {"model_start": "model_end", "tool_start": "tool_end"}.get(kill.line.event)
    if end is None:
        return False
    return not any(x.event == end and x.pid == kill.pid and x.args == kill.line.args for x in lines)


# --- the tests ------------------------------------------------------------------------------


@pytest.fixture
def env(tmp_path: Path) -> Iterator[JobsEnv]:
    environment = jobs_env(tmp_path, lease="2", max_deliveries="1000", max_jobs="4")
    yield environment
    clean_redis(environment)


async def test_sigkilled_workers_lose_no_run_and_repeat_only_the_calls_in_flight(
    env: JobsEnv,
) -> None:
    started = time.monotonic()
    fleet = Fleet(env, size=2)
    fleet.start()
    try:
        async with serve(env) as served:
            feeder = Feeder(served, env)
            stop = asyncio.Event()
            feeding = asyncio.create_task(feeder.keep_going(stop))
            try:
                kills = await kill_at_random_points(fleet, Tail(env.log), KILLS)
            finally:
                stop.set()
                await feeding
            killing = time.monotonic() - started
            final = await feeder.drain(within=90)
            draining = time.monotonic() - started - killing

            records = {r: await served.handle.run_status(r) for r in feeder.planned}
            store = served.handle.runtime.session_store
            transcripts = {s: await store.entries(s) for s in ("fault-a", "fault-b")}
    finally:
        fleet.stop()

    # every run ended, with its outcome recorded
    failed = {r: records[r].error for r, status in final.items() if status != "complete"}
    assert not failed, failed
    for run_id, record in records.items():
        assert record.outcome is not None
        assert record.outcome.text == "done after 3 rounds", (run_id, record)

    lines = read_log(env.log)
    killed = {kill.pid: kill.time for kill in kills}
    assert len(killed) == KILLS

    # each call ran; a call ran again only after the worker running it was killed
    tool_repeats = repeats_are_explained(lines, "tool_start", lambda x: x.args[:2], killed)
    model_repeats = repeats_are_explained(lines, "model_start", lambda x: x.args[:2], killed)
    for run_id, planned in feeder.planned.items():
        ended = {x.args[1] for x in lines if x.event == "tool_end" and x.args[0] == run_id}
        assert len(ended) == planned.calls, (planned, ended)

    # the session runs saved their turns one after the other, each exactly once
    for session, entries in transcripts.items():
        messages = [e.message for e in entries if isinstance(e, MessageEntry)]
        users = [m for m in messages if m.role.value == "user"]
        expected = [p.tag for p in feeder.planned.values() if p.session == session]
        assert sorted(json.loads(m.text)["tag"] for m in users) == sorted(expected)
        turns = [i for i, m in enumerate(messages) if m.role.value == "user"]
        assert all(b - a == 8 for a, b in pairwise([*turns, len(messages)])), session

    # the kills hit work in flight, at every kind of point
    modes = [kill.mode for kill in kills]
    assert {mode: modes.count(mode) for mode in KILL_POINTS} == {
        "model": 7,
        "tool": 7,
        "between": 6,
    }
    hits = [kill for kill in kills if interrupted(kill, lines)]
    assert any(k.mode == "model" for k in hits)
    assert any(k.mode == "tool" for k in hits)
    assert feeder.approvals >= 1
    print(
        f"\n{len(records)} runs, {KILLS} kills ({len(hits)} mid-call), {tool_repeats} tool "
        f"re-executions, {model_repeats} repeated model calls, {feeder.approvals} approvals, "
        f"{killing:.0f} s of kills, {draining:.0f} s to finish; kills at "
        f"{[round(k.time - kills[0].time, 1) for k in kills]}"
    )


# --- Redis restarts -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A private ``redis-server``; ``persistent``: with an append-only file, so a restart keeps
    the queue (without one, a restart forgets everything)."""

    def __init__(self, directory: Path, *, persistent: bool = True) -> None:
        self.directory = directory
        self.persistent = persistent
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes" if self.persistent else "no",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        try:
            while True:
                with contextlib.suppress(redis.ConnectionError):
                    if client.ping():
                        return
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        """A graceful shutdown (SIGTERM): Redis flushes its append-only file and exits."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    def restart(self, downtime: float = 0.0) -> None:
        self.stop()
        time.sleep(downtime)
        self.start()

    def queued(self, queue: str) -> int:
        client = redis.Redis(port=self.port)
        try:
            return cast(int, client.zcard(queue))
        finally:
            client.close()


async def wait_all(env: JobsEnv, run_ids: list[str], within: float) -> dict[str, str]:
    deadline = time.monotonic() + within
    while True:
        current = await asyncio.to_thread(statuses, env)
        if all(current.get(r) in FINISHED for r in run_ids):
            return {r: current[r] for r in run_ids}
        assert time.monotonic() < deadline, {r: current.get(r) for r in run_ids}
        await asyncio.sleep(0.1)


def runs(count: int, tag: str, **fields: Any) -> list[str]:
    return [
        json.dumps({"tag": f"{tag}{i}", "rounds": [[["effect", f"{tag}{i}"]]], **fields})
        for i in range(count)
    ]


def assert_each_ran_once(env: JobsEnv, run_ids: list[str]) -> None:
    """Each run's one tool call was executed exactly once."""
    lines = read_log(env.log)
    for run_id in run_ids:
        executions = [x for x in lines if x.event == "tool_start" and x.args[0] == run_id]
        assert len(executions) == 1, (run_id, executions)


async def test_a_redis_restart_loses_no_tracked_run(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    # a lease longer than a restart takes, even on a busy machine: no job looks abandoned
    env = jobs_env(tmp_path, redis_url=server.url, lease="5", max_jobs="2")
    worker = WorkerProcess(env)
    server.start()
    try:
        async with serve(env) as served:
            # runs queued while no worker is up: now, delayed, and in a session
            queued = [(await served.handle.enqueue(p)).run_id for p in runs(6, "q")]
            queued += [(await served.handle.enqueue(p, delay=1.0)).run_id for p in runs(2, "d")]
            queued += [
                (await served.handle.enqueue(p, session="restart")).run_id for p in runs(2, "s")
            ]
            assert server.queued(env.queue) == len(queued)
            server.restart()
            assert server.queued(env.queue) == len(queued)  # the queue survived
            worker.start()
            first = await wait_all(env, queued, within=30)

            # runs in progress and queued behind them while Redis restarts under the worker
            busy = [
                (await served.handle.enqueue(p)).run_id
                for p in runs(8, "b", model_delay=0.3, tool_delay=0.2)
            ]
            for _ in range(1000):  # until the worker has taken the first jobs
                if server.queued(env.queue) <= 6:
                    break
                await asyncio.sleep(0.02)
            server.restart(downtime=1.0)  # down long enough for the worker to meet it
            second = await wait_all(env, busy, within=60)
            assert worker.alive(), f"the worker did not survive the restart: {worker.output()}"
    finally:
        worker.stop()
        server.stop()
    assert set(first.values()) == {"complete"}, first
    assert set(second.values()) == {"complete"}, second
    assert_each_ran_once(env, queued + busy)  # no worker died: never twice


async def test_a_redis_that_forgets_everything_loses_no_run_and_doubles_no_call(
    tmp_path: Path,
) -> None:
    """Redis restarts without persistence: queued jobs and claims are gone.
    The records in the database bring the queued runs back (the reconciler), and the runs in
    progress stay with their workers, whose leases in the database outlive the outage, so no
    call runs twice although every claim in Redis vanished for longer than a lease."""
    server = RedisServer(tmp_path, persistent=False)
    env = jobs_env(tmp_path, redis_url=server.url, lease="1", reconcile_every="1", max_jobs="3")
    worker = WorkerProcess(env)
    server.start()
    try:
        async with serve(env) as served:
            queued = [(await served.handle.enqueue(p)).run_id for p in runs(4, "q")]
            queued += [
                (await served.handle.enqueue(p, session="forget")).run_id for p in runs(2, "s")
            ]
            server.restart()
            assert server.queued(env.queue) == 0  # the queue is gone
            worker.start()
            first = await wait_all(env, queued, within=60)

            busy = [
                (await served.handle.enqueue(p)).run_id
                for p in runs(6, "b", model_delay=0.5, tool_delay=1.5)
            ]
            for _ in range(1000):  # until the worker runs its first three
                if sum(s == "in_progress" for s in statuses(env).values()) >= 3:
                    break
                await asyncio.sleep(0.02)
            server.restart(downtime=2.0)  # longer than the lease: every claim is gone
            second = await wait_all(env, busy, within=90)
            assert worker.alive(), f"the worker did not survive the restart: {worker.output()}"
    finally:
        worker.stop()
        server.stop()
    assert set(first.values()) == {"complete"}, first
    assert set(second.values()) == {"complete"}, second
    assert_each_ran_once(env, queued + busy)  # no worker died: never twice


async def test_a_claim_that_vanished_takes_no_run_from_its_live_worker(tmp_path: Path) -> None:
    """The claims of running jobs vanish while their workers live (what a Redis outage longer
    than the lease, or a failover, does): arq hands the jobs to the other worker at once. The
    leases in the database, renewed all along, turn those deliveries away: no call runs
    twice, and every run completes once."""
    env = jobs_env(tmp_path, lease="1", max_jobs="4")
    workers = [WorkerProcess(env, name=f"w{i}") for i in range(2)]
    try:
        async with serve(env) as served:
            for worker in workers:
                worker.start()
            busy = [
                (await served.handle.enqueue(p)).run_id
                for p in runs(4, "o", model_delay=0.2, tool_delay=4.0)
            ]
            for _ in range(1000):  # until every run's tool call is under way
                if len([x for x in read_log(env.log) if x.event == "tool_start"]) >= len(busy):
                    break
                await asyncio.sleep(0.02)
            client = redis.Redis.from_url(env.redis_url)
            try:
                for _ in range(3):  # the keepers put them back within a third of a lease
                    client.delete(*(f"arq:in-progress:{run_id}" for run_id in busy))
                    await asyncio.sleep(0.6)
            finally:
                client.close()
            done = await wait_all(env, busy, within=60)
    finally:
        for worker in workers:
            worker.stop()
        clean_redis(env)
    assert set(done.values()) == {"complete"}, done
    assert_each_ran_once(env, busy)
