"""S7: background runs through one arq worker, against arq's own no-op throughput (issues 6, 9).

Three measurements, on the real Redis (``AGENT_BENCH_REDIS_URL``, default
``redis://127.0.0.1:6379/0``) with a queue and key prefix of their own, and on a SQLite file
(and PostgreSQL, ``AGENT_BENCH_POSTGRES_URL``, in a schema of its own):

1. **arq alone**: N no-op jobs are enqueued, then one arq ``Worker`` (in this process,
   ``burst=True``) runs them; jobs/s from the end of the worker's startup to the end of its
   last job, and CPU per job.
2. **agent runs**: N tracked runs (``RunQueue.enqueue``: a record, then the job) are enqueued,
   then one worker built by ``AgentPlugin.worker_settings()`` runs them, timed the same way.
   Each run is one tool round with the scripted model (model call, tool call, model call).
   Reported as runs/s and the ratio to (1) (target: at least 0.7), with the SQL statements and
   Redis commands per run. Both sides enqueue before their worker starts, outside the timed
   window (enqueues/s are reported apart). Both workers get the same ``max_jobs`` and
   ``poll_delay``, but they do not meet the same limit. A poll reads up to 100 job ids and
   starts them until every slot is taken (arq's semaphore has ``max_jobs + 1`` permits: the
   start that finds the slots full ends the batch), then the worker sleeps ``poll_delay``. A
   no-op job is done before the next one starts, so a poll starts up to 100 of them; a job
   that outlasts ten starts (every agent run) gets at most ``max_jobs`` starts per poll:
   20 runs/s at the ``JobOptions`` defaults (10 jobs, 0.5 s), however cheap a run is. The
   fast poll (10 ms) is the comparison of what a run costs. A running job also stays in
   arq's queue, and every poll checks each running job again (four Redis round trips): a
   cost a no-op job never pays.
   **arq durable** (per backend, interleaved with (1) and (2), timed the same way, on a worker
   with the no-op job's settings): an arq job that makes the durable writes of a 1-round run
   and nothing else, through the library's own statements: ``SqlRunStore.create`` at enqueue
   time (outside the timed window, as for (2)); in the job ``SqlRunStore.open_run`` (the
   arguments ``SELECT`` and the start, one transaction), the run's checkpoints through
   ``SqlRunStore.run_journal`` with the worker's progress rule (the entries a real 1-round
   run of the same agent journaled, captured in process beforehand: written as the worker
   writes them, the reply with the start and the tool result with the round) and
   ``finish``: the SQL and the transactions per job that (2) reports (4 transactions, 7
   statements), without the agent loop, the model, the session's turn, the event stream or the
   lease keeper. Runs/s is also reported as a ratio to it: the
   ratio to (1) stays the target; the ratio to this says how much of a run's cost is the
   harness beyond its durable writes.
3. **checkpoints**: ``Agent.run_turn`` in process over 1- and 10-step runs, without a journal,
   with ``SqlRunStore.journal`` (what a worker writes), and with the journal and the
   worker's progress rule (the progress written with the checkpoint before each model call);
   the added wall time per step and per run. Then what one write transaction costs, and the
   floor: the least CPU a 1-round run can cost with durable steps (arq's cost of a job that
   holds its slot, measured; the loop; the writes that cannot go) and the best ratio it
   allows. Then where a background run's time goes: a sequential worker (``max_jobs=1``) with
   the store, journal, Redis and model calls timed, and a cProfile of the same
   (``--profile``).

Nothing is asserted. Results go to ``results/jobs.json``; the markdown is printed::

    python benchmarks/bench_jobs.py [--quick] [--profile]   # AGENT_BENCH_SESSIONS=1: in sessions
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import gc
import io
import json
import os
import pstats
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, cast

if __package__ in (None, ""):  # run as a script: make ``agent_plugin`` importable from the tree
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis.asyncio as aioredis
import sqlalchemy as sa
from arq.connections import ArqRedis, RedisSettings, create_pool
from arq.worker import Worker, create_worker, func
from redis.asyncio.client import Pipeline
from redis.asyncio.connection import AbstractConnection, Connection
from sqlalchemy import event

from agent_plugin.agent import Agent
from agent_plugin.errors import AgentError
from agent_plugin.ids import new_run_id
from agent_plugin.jobs import JobOptions, RunArgs, runtime_of
from agent_plugin.jobs.progress import ProgressAtCheckpoints
from agent_plugin.journal import InMemoryJournal, JournalEntry, Started, ToolDone
from agent_plugin.messages import Role
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import AgentOutcome, Completed
from agent_plugin.providers.base import ChatRequest
from agent_plugin.providers.scripted import Reply, ScriptedModel, tool_call
from agent_plugin.records import RunStatus
from agent_plugin.runtime import AgentRuntime
from agent_plugin.storage import Database, SqlRunStore
from agent_plugin.storage.leased_journal import LeasedRunJournal
from agent_plugin.tools import FnTool
from agent_plugin.web import AgentPlugin

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
REDIS_URL = os.environ.get("AGENT_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get(
    "AGENT_BENCH_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)
TARGET = 0.7
CPU = 0
"""The CPU the benchmark (the worker and its driver threads) is pinned to, as in run.py."""
ARQ_KEYS = ("arq:job:", "arq:result:", "arq:retry:", "arq:in-progress:")


# --- the scripted agent: one tool round per run (or ``STEPS=n`` rounds) ----------------------


def _steps_of(request: ChatRequest) -> tuple[int, int]:
    """(rounds the prompt asks for, tool rounds done so far)."""
    messages = request.messages
    prompt = next(m for m in messages if m.role is Role.USER and not m.tool_calls)
    match = re.search(r"STEPS=(\d+)", prompt.text)
    wanted = int(match.group(1)) if match else 1
    return wanted, sum(1 for m in messages if m.role is Role.TOOL)


def scripted_reply(request: ChatRequest) -> Reply:
    """A tool call until the prompt's ``STEPS`` rounds are done, then a short answer."""
    wanted, done = _steps_of(request)
    if done < wanted:
        return tool_call("noop", {"i": done}, id=f"call_{done}")
    return f"done after {done} rounds"


async def _noop_tool(arguments: Any) -> Any:
    return {"ok": True, "i": arguments.get("i") if isinstance(arguments, dict) else None}


NOOP_TOOL = FnTool(
    "noop",
    "Does nothing.",
    {"type": "object", "properties": {"i": {"type": "integer"}}, "required": ["i"]},
    _noop_tool,
)


# --- counting: SQL statements and transactions, Redis commands and round trips ----------------


def _statement_kind(statement: str) -> str:
    words = statement.split()
    verb = words[0].upper() if words else "?"
    if verb in ("BEGIN", "COMMIT", "ROLLBACK"):
        return "transaction control"
    table = re.search(r"\b(?:INTO|UPDATE|FROM)\s+\"?(\w+)", statement, re.IGNORECASE)
    return f"{verb} {table.group(1) if table else ''}".strip()


class SqlCounter:
    """Statements (by verb and table) and transactions an engine runs; listen while active."""

    def __init__(self) -> None:
        self.statements: Counter[str] = Counter()
        self.transactions = 0
        self.connections = 0
        self.active = False

    def attach(self, database: Database) -> None:
        engine = database.engine.sync_engine
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "begin", self._begin)
        event.listen(engine, "connect", self._connect)

    def _statement(self, *args: Any) -> None:
        if self.active:
            self.statements[_statement_kind(str(args[2]))] += 1

    def _begin(self, *_args: Any) -> None:
        if self.active:
            self.transactions += 1

    def _connect(self, *_args: Any) -> None:
        if self.active:
            self.connections += 1

    def total(self) -> int:
        return sum(n for kind, n in self.statements.items() if kind != "transaction control")


class RedisCounter:
    """Commands, round trips and new connections of every asyncio Redis connection of this
    process, by patching ``send_packed_command``, the packers and ``Connection._connect``
    while active (restored on exit)."""

    def __init__(self) -> None:
        self.commands = 0
        self.round_trips = 0
        self.connections = 0

    @contextlib.contextmanager
    def counting(self) -> Iterator[RedisCounter]:
        cls = AbstractConnection
        pack_one, pack_many, send = cls.pack_command, cls.pack_commands, cls.send_packed_command
        open_socket = Connection._connect

        async def connect(conn: Connection) -> None:
            self.connections += 1
            await open_socket(conn)  # type: ignore[no-untyped-call]

        in_pipeline = False

        def pack_command(conn: AbstractConnection, *args: Any) -> Any:
            if not in_pipeline:
                self.commands += 1
            return pack_one(conn, *args)

        def pack_commands(conn: AbstractConnection, commands: Any) -> Any:
            # redis-py packs a pipeline's commands one by one through pack_command: count
            # them here, once, and not again there
            nonlocal in_pipeline
            commands = list(commands)
            self.commands += len(commands)
            in_pipeline = True
            try:
                return pack_many(conn, commands)
            finally:
                in_pipeline = False

        async def send_packed_command(conn: AbstractConnection, *args: Any, **kw: Any) -> Any:
            self.round_trips += 1
            return await send(conn, *args, **kw)

        cls.pack_command = pack_command  # type: ignore[method-assign, assignment]
        cls.pack_commands = pack_commands  # type: ignore[method-assign, assignment]
        cls.send_packed_command = send_packed_command  # type: ignore[method-assign, assignment]
        Connection._connect = connect  # type: ignore[method-assign]
        try:
            yield self
        finally:
            cls.pack_command = pack_one  # type: ignore[method-assign]
            cls.pack_commands = pack_many  # type: ignore[method-assign]
            cls.send_packed_command = send  # type: ignore[method-assign]
            Connection._connect = open_socket  # type: ignore[method-assign]


class Breakdown:
    """Wall time spent inside chosen async methods (patched at class level while active)."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()
        self._saved: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        async def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start
                self.calls[label] += 1

        self._saved.append((owner, name, original))
        setattr(owner, name, timed)

    def restore(self) -> None:
        while self._saved:
            owner, name, original = self._saved.pop()
            setattr(owner, name, original)


# --- Redis and database environments -----------------------------------------------------------


@dataclass
class RedisSpace:
    """A private queue and key prefix; :meth:`clean` deletes only the keys made for it."""

    token: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    job_ids: list[str] = field(default_factory=list)

    @property
    def queue(self) -> str:
        return f"agent-bench-{self.token}:queue"

    @property
    def prefix(self) -> str:
        return f"agent-bench-{self.token}:"

    async def clean(self) -> None:
        client = aioredis.Redis.from_url(REDIS_URL)
        try:
            keys: list[str | bytes] = [self.queue, self.queue + ":health-check"]
            keys += [prefix + job_id for job_id in self.job_ids for prefix in ARQ_KEYS]
            keys += [key async for key in client.scan_iter(match=self.prefix + "*")]
            for start in range(0, len(keys), 500):
                await client.delete(*keys[start : start + 500])
        finally:
            await client.aclose()


@contextlib.asynccontextmanager
async def database_url(backend: str) -> AsyncIterator[str]:
    """A database for one measurement: a SQLite file in a temporary folder, or, on PostgreSQL,
    a schema of its own in the test database reached through a role of its own whose
    ``search_path`` is that schema (so the plugin's unmodified URL handling lands there);
    both dropped afterwards."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite+aiosqlite:///{Path(folder) / 'runs.db'}"
        return
    name = f"agent_bench_{uuid.uuid4().hex[:12]}"
    admin = Database(POSTGRES_URL)
    try:
        async with admin.write() as conn:
            await conn.execute(sa.text(f'CREATE ROLE "{name}" LOGIN'))
            await conn.execute(sa.text(f'CREATE SCHEMA "{name}" AUTHORIZATION "{name}"'))
            await conn.execute(sa.text(f'ALTER ROLE "{name}" SET search_path = "{name}"'))
        url = sa.make_url(POSTGRES_URL).set(username=name, password=None)
        yield url.render_as_string(hide_password=False)
    finally:
        try:
            async with admin.write() as conn:
                await conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
                await conn.execute(sa.text(f'DROP ROLE IF EXISTS "{name}"'))
        finally:
            await admin.dispose()


# --- 1 and 2: throughput through one worker ----------------------------------------------------


@dataclass
class Throughput:
    """One worker draining a queue of ``jobs`` jobs."""

    jobs: int
    seconds: float
    cpu_seconds: float
    startup_seconds: float
    completed: int
    max_jobs: int
    poll_delay: float
    sql_per_job: dict[str, float] = field(default_factory=dict)
    sql_transactions_per_job: float = 0.0
    sql_connections_opened: int = 0
    redis_commands_per_job: float = 0.0
    redis_round_trips_per_job: float = 0.0
    redis_connections_opened: int = 0
    enqueue_per_second: float = 0.0

    @property
    def per_second(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else float("nan")


def _measured(
    jobs: int,
    drained: tuple[float, float, float],
    *,
    completed: int,
    workers: tuple[int, float],
    counted: tuple[SqlCounter, RedisCounter],
    enqueue_rate: float,
) -> Throughput:
    """A drained worker's throughput: ``drained`` is what :func:`_drain` measured (seconds,
    CPU seconds, startup seconds), ``workers`` its ``(max_jobs, poll_delay)``, ``counted``
    the SQL and Redis it was counted with."""
    seconds, cpu, startup = drained
    sql, redis_counter = counted
    return Throughput(
        jobs=jobs,
        seconds=seconds,
        cpu_seconds=cpu,
        startup_seconds=startup,
        completed=completed,
        max_jobs=workers[0],
        poll_delay=workers[1],
        sql_per_job={k: n / jobs for k, n in sorted(sql.statements.items())},
        sql_transactions_per_job=sql.transactions / jobs,
        sql_connections_opened=sql.connections,
        redis_commands_per_job=redis_counter.commands / jobs,
        redis_round_trips_per_job=redis_counter.round_trips / jobs,
        redis_connections_opened=redis_counter.connections,
        enqueue_per_second=enqueue_rate,
    )


class _Clock:
    """Marks the end of the worker's startup and the end of its last job."""

    def __init__(self) -> None:
        self.started = 0.0
        self.started_cpu = 0.0
        self.last_end = 0.0
        self.last_end_cpu = 0.0
        self.ends = 0

    def start(self) -> None:
        self.started, self.started_cpu = time.perf_counter(), time.process_time()

    async def job_ended(self, _ctx: dict[str, Any]) -> None:
        self.last_end, self.last_end_cpu = time.perf_counter(), time.process_time()
        self.ends += 1


async def _drain(worker: Worker, clock: _Clock) -> tuple[tuple[float, float, float], RedisCounter]:
    """Run a burst worker to the end, counting its Redis commands; ((seconds, CPU seconds,
    startup seconds), the counter)."""
    gc.collect()
    redis_counter = RedisCounter()
    begun = time.perf_counter()
    with redis_counter.counting():
        try:
            await worker.async_run()
        finally:
            await worker.close()
    timed = (
        clock.last_end - clock.started,
        clock.last_end_cpu - clock.started_cpu,
        clock.started - begun,
    )
    return timed, redis_counter


def _bare_worker(
    function: Callable[..., Awaitable[Any]],
    name: str,
    space: RedisSpace,
    settings: RedisSettings,
    clock: _Clock,
    *,
    max_jobs: int,
    poll_delay: float,
    setup: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
    teardown: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
) -> Worker:
    """A plain arq ``Worker`` of one function (the no-op job's and the durable job's): burst,
    ``keep_result`` 60 s, arq's defaults otherwise; ``setup`` runs at startup, before the
    clock starts."""

    async def on_startup(ctx: dict[str, Any]) -> None:
        if setup is not None:
            await setup(ctx)
        clock.start()

    return Worker(
        [func(cast(Any, function), name=name)],
        queue_name=space.queue,
        redis_settings=settings,
        burst=True,
        handle_signals=False,
        max_jobs=max_jobs,
        poll_delay=poll_delay,
        keep_result=60,
        on_startup=cast(Any, on_startup),
        on_shutdown=cast(Any, teardown),
        after_job_end=cast(Any, clock.job_ended),
    )


def _noop(hold: float) -> Callable[[dict[str, Any]], Awaitable[None]]:
    async def noop(_ctx: dict[str, Any]) -> None:
        if hold:
            await asyncio.sleep(hold)

    return noop


async def arq_noop(jobs: int, *, max_jobs: int, poll_delay: float, hold: float = 0.0) -> Throughput:
    """(1) arq's own throughput: a no-op job through one worker. With ``hold``, each job
    holds its slot that many seconds (sleeping): what arq itself costs per job when jobs take
    time (it checks every running job again at every poll)."""
    space = RedisSpace()
    settings = RedisSettings.from_dsn(REDIS_URL)
    pool: ArqRedis = await create_pool(settings, default_queue_name=space.queue)
    try:
        space.job_ids = [f"agent-bench-{space.token}-{i}" for i in range(jobs)]
        enqueue_start = time.perf_counter()
        for job_id in space.job_ids:
            await pool.enqueue_job("noop", _job_id=job_id, _queue_name=space.queue)
        enqueue_seconds = time.perf_counter() - enqueue_start
        clock = _Clock()
        worker = _bare_worker(
            _noop(hold), "noop", space, settings, clock, max_jobs=max_jobs, poll_delay=poll_delay
        )
        (seconds, cpu, startup), redis_counter = await _drain(worker, clock)
        return Throughput(
            jobs=jobs,
            seconds=seconds,
            cpu_seconds=cpu,
            startup_seconds=startup,
            completed=worker.jobs_complete,
            max_jobs=max_jobs,
            poll_delay=poll_delay,
            redis_commands_per_job=redis_counter.commands / jobs,
            redis_round_trips_per_job=redis_counter.round_trips / jobs,
            redis_connections_opened=redis_counter.connections,
            enqueue_per_second=jobs / enqueue_seconds,
        )
    finally:
        await pool.aclose()
        await space.clean()


EVENTS_SWITCH: Final = "events" in {f.name for f in dataclasses.fields(JobOptions)}
"""Whether ``JobOptions`` can turn the runs' Redis event streams off (the live-runs feature)."""


def make_plugin(
    url: str, space: RedisSpace, *, max_jobs: int, poll_delay: float, events: bool = True
) -> AgentPlugin:
    """The plugin of the benchmark: scripted model, one no-op tool, runs in ``url``;
    ``events=False`` turns the runs' event streams off (when ``JobOptions`` has the switch)."""
    options: dict[str, Any] = {
        "queue_name": space.queue,
        "key_prefix": space.prefix,
        "max_jobs": max_jobs,
        "poll_delay": poll_delay,
        "keep_result": 60,
    }
    if EVENTS_SWITCH:
        options["events"] = events
    return AgentPlugin(
        tools=[NOOP_TOOL],
        model=ScriptedModel(default=scripted_reply, keep_requests=0),  # (a real client keeps none)
        jobs=JobOptions(**options),
        environ={
            "AGENT_PROVIDER": "scripted",
            "AGENT_DATABASE_URL": url,
            "AGENT_REDIS_URL": REDIS_URL,
        },
        auto_migrate=True,
    )


SESSIONS = os.environ.get("AGENT_BENCH_SESSIONS") == "1"
"""``AGENT_BENCH_SESSIONS=1``: each agent run in a session of its own, so a run pays for its
session's turn (what the SQL and Redis per run then say)."""


async def enqueue_runs(plugin: AgentPlugin, space: RedisSpace, runs: int) -> float:
    """Enqueue ``runs`` tracked runs from an app-side agent; answers runs enqueued per s."""
    async with plugin.open() as agent:
        start = time.perf_counter()
        for i in range(runs):
            session = f"{space.prefix}s{i}" if SESSIONS else None
            handle = await agent.enqueue(f"STEPS=1 run {i}: use the noop tool", session=session)
            space.job_ids.append(handle.run_id)
        return runs / (time.perf_counter() - start)


async def count_complete(url: str, run_ids: list[str]) -> int:
    database = Database(url)
    try:
        store = SqlRunStore(database)
        records = [await store.get(run_id) for run_id in run_ids]
        return sum(1 for r in records if r is not None and r.status is RunStatus.COMPLETE)
    finally:
        await database.dispose()


async def agent_runs(
    backend: str,
    runs: int,
    *,
    max_jobs: int,
    poll_delay: float,
    events: bool = True,
    breakdown: Breakdown | None = None,
    profile: cProfile.Profile | None = None,
) -> Throughput:
    """(2) ``agent_run`` jobs with the scripted model through a worker built by the plugin."""
    space = RedisSpace()
    try:
        async with database_url(backend) as url:
            plugin = make_plugin(
                url, space, max_jobs=max_jobs, poll_delay=poll_delay, events=events
            )
            enqueue_rate = await enqueue_runs(plugin, space, runs)
            settings = plugin.worker_settings()
            startup = settings.on_startup
            clock = _Clock()
            sql = SqlCounter()

            async def on_startup(ctx: dict[str, Any]) -> None:
                await startup(ctx)
                database = runtime_of(ctx).database
                if database is not None:
                    sql.attach(database)
                sql.active = True
                if profile is not None:
                    profile.enable()
                clock.start()

            worker = create_worker(
                settings,
                on_startup=on_startup,
                after_job_end=clock.job_ended,
                burst=True,
                handle_signals=False,
            )
            try:
                drained, redis_counter = await _drain(worker, clock)
            finally:
                if profile is not None:
                    profile.disable()
                sql.active = False
                if breakdown is not None:
                    breakdown.restore()
            completed = await count_complete(url, space.job_ids)
        return _measured(
            runs,
            drained,
            completed=completed,
            workers=(max_jobs, poll_delay),
            counted=(sql, redis_counter),
            enqueue_rate=enqueue_rate,
        )
    finally:
        await space.clean()


# --- the durable baseline: an arq job that makes a 1-round run's durable writes, nothing else ---


DURABLE_JOB: Final = "durable"
_STORE_KEY: Final = "agent_bench_store"
_WRITES_KEY: Final = "agent_bench_writes"


@dataclass(frozen=True)
class RunWrites:
    """What one 1-round run of the benchmark's agent journals, captured from a real run in
    process: its checkpoint entries in order, its outcome, its ``max_steps`` (the progress
    rule's denominator) and the lease a worker takes (``JobOptions.lease``)."""

    entries: tuple[JournalEntry, ...]
    outcome: AgentOutcome
    max_steps: int
    lease: float

    def entries_of(self, run_id: str) -> list[JournalEntry]:
        """The entries as run ``run_id`` journals them (its ``started`` state names it)."""
        return [
            Started(state=e.state.model_copy(update={"run_id": run_id}))
            if isinstance(e, Started)
            else e
            for e in self.entries
        ]


async def capture_run_writes(runtime: AgentRuntime, lease: float) -> RunWrites:
    """Run the worker's agent (built as an attempt builds it) once in process, one tool round
    with the scripted model, journaling in memory: the entries a worker's run writes."""
    args = RunArgs(prompt="STEPS=1 run 0: use the noop tool")
    agent = runtime.agent_for(args.overrides)
    journal = InMemoryJournal()
    options = RunOptions(run_id=new_run_id(), journal=journal)
    turn = await agent.run(args.prompt, options=options)
    if not isinstance(turn.outcome, Completed) or turn.outcome.steps_used != 1:
        raise RuntimeError(f"durable bench: the captured run ended {turn.outcome!r}")
    return RunWrites(tuple(journal.entries), turn.outcome, agent.budget.max_steps, lease)


async def durable_job(ctx: dict[str, Any], run_id: str) -> None:
    """The arq job of the durable baseline: the statements a 1-round ``agent_run`` makes, in
    its order and transactions, through the library's own store and journal: the stored
    arguments read and the start in one transaction (``SqlRunStore.open_run``), the run's
    checkpoints through the delivery's journal (``SqlRunStore.run_journal``: the reply with
    the start, the tool result with the round, each with the lease and progress ``UPDATE``)
    and the finish (``UPDATE ... RETURNING``)."""
    store: SqlRunStore = ctx[_STORE_KEY]
    writes: RunWrites = ctx[_WRITES_KEY]
    _, record = await store.open_run(run_id, job_id=ctx["job_id"], lease=writes.lease)
    if record is None:
        raise RuntimeError(f"durable bench: run {run_id} did not start")
    rule = ProgressAtCheckpoints(writes.max_steps)
    journal = store.run_journal(
        run_id, attempt=record.attempt, after_seq=0, lease=writes.lease, progress=rule
    )
    for entry in writes.entries_of(run_id):
        await journal.record(entry)
    await journal.close()
    await store.finish(
        run_id, writes.outcome, attempt=record.attempt, progress=rule.at_end(writes.outcome)
    )


async def arq_durable(backend: str, jobs: int, *, max_jobs: int, poll_delay: float) -> Throughput:
    """The durable baseline: :func:`durable_job` through a worker built as (1)'s, on the
    database (2) uses. Runs are recorded (``SqlRunStore.create`` with the arguments
    ``RunQueue.enqueue`` stores) and enqueued before the worker starts; the worker opens the
    database as the plugin's worker does (``pool_size=max_jobs``, migrated at startup)."""
    space = RedisSpace()
    try:
        async with database_url(backend) as url:
            plugin = make_plugin(url, space, max_jobs=max_jobs, poll_delay=poll_delay)
            options = plugin.job_options()
            runtime = await plugin.start()
            settings = RedisSettings.from_dsn(REDIS_URL)
            try:
                if runtime.database is None or options is None:
                    raise RuntimeError("background runs are off for the benchmark plugin")
                writes = await capture_run_writes(runtime, options.lease)
                store = SqlRunStore(runtime.database)
                pool: ArqRedis = await create_pool(settings, default_queue_name=space.queue)
                try:
                    start = time.perf_counter()
                    for i in range(jobs):
                        run_id = new_run_id()
                        args = RunArgs(prompt=f"STEPS=1 run {i}: use the noop tool")
                        await store.create(
                            run_id,
                            origin=args.origin,
                            args=args.model_dump(mode="json"),
                            session_id=args.overrides.session,
                            memory_scope=args.overrides.memory_scope,
                        )
                        await pool.enqueue_job(
                            DURABLE_JOB, run_id, _job_id=run_id, _queue_name=space.queue
                        )
                        space.job_ids.append(run_id)
                    enqueue_rate = jobs / (time.perf_counter() - start)
                finally:
                    await pool.aclose()
            finally:
                await runtime.aclose()
            clock = _Clock()
            sql = SqlCounter()

            async def setup(ctx: dict[str, Any]) -> None:
                database = Database(url, pool_size=max_jobs)
                await database.migrate()
                sql.attach(database)
                ctx[_STORE_KEY], ctx[_WRITES_KEY] = SqlRunStore(database), writes
                sql.active = True

            async def teardown(ctx: dict[str, Any]) -> None:
                store = ctx.pop(_STORE_KEY, None)
                if store is not None:
                    await store.database.dispose()

            worker = _bare_worker(
                durable_job,
                DURABLE_JOB,
                space,
                settings,
                clock,
                max_jobs=max_jobs,
                poll_delay=poll_delay,
                setup=setup,
                teardown=teardown,
            )
            try:
                drained, redis_counter = await _drain(worker, clock)
            finally:
                sql.active = False
            completed = await count_complete(url, space.job_ids)
        return _measured(
            jobs,
            drained,
            completed=completed,
            workers=(max_jobs, poll_delay),
            counted=(sql, redis_counter),
            enqueue_rate=enqueue_rate,
        )
    finally:
        await space.clean()


def _row(label: str, t: Throughput, base: Throughput | None) -> dict[str, Any]:
    row: dict[str, Any] = {"subject": label, **asdict(t), "per_second": t.per_second}
    row["cpu_ms_per_job"] = t.cpu_seconds / t.jobs * 1000
    row["wall_ms_per_job"] = t.seconds / t.jobs * 1000
    if base is not None:
        row["ratio"] = t.per_second / base.per_second
    return row


async def throughput(
    *,
    jobs: int,
    configs: list[tuple[int, float]],
    backends: list[str],
    repeats: int,
    events_off: bool,
) -> list[dict[str, Any]]:
    """(1), the durable baseline and (2) for each worker configuration ``(max_jobs,
    poll_delay)``, interleaved (each backend's durable baseline just before its agent runs);
    the best of ``repeats`` (the least disturbed) of each. With ``events_off``, a fast-poll
    configuration also runs the first backend with the runs' event streams off.

    Every row but the no-op's has ``ratio`` (to arq's no-op jobs/s: the target); agent rows
    also have ``ratio_to_durable`` (to the durable baseline on their backend)."""
    rows = []
    for max_jobs, poll_delay in configs:
        best: dict[str, Throughput] = {}
        subjects: list[tuple[str, str, str, bool]] = [("arq no-op", "noop", "", True)]
        for b in backends:
            subjects += [
                (f"arq durable {b}", "durable", b, True),
                (f"agent_run {b}", "run", b, True),
            ]
        if events_off and EVENTS_SWITCH and poll_delay < 0.1:
            subjects.append((f"agent_run {backends[0]}, events off", "run", backends[0], False))
        for _ in range(repeats):
            for subject, kind, backend, events in subjects:
                if kind == "noop":
                    result = await arq_noop(jobs, max_jobs=max_jobs, poll_delay=poll_delay)
                elif kind == "durable":
                    result = await arq_durable(
                        backend, jobs, max_jobs=max_jobs, poll_delay=poll_delay
                    )
                else:
                    result = await agent_runs(
                        backend, jobs, max_jobs=max_jobs, poll_delay=poll_delay, events=events
                    )
                if subject not in best or result.per_second > best[subject].per_second:
                    best[subject] = result
        base = best["arq no-op"]
        for subject, kind, backend, _events in subjects:
            result = best[subject]
            row = _row(subject, result, None if kind == "noop" else base)
            row["repeats"] = repeats
            durable = best.get(f"arq durable {backend}")
            if kind == "run" and durable is not None:
                row["ratio_to_durable"] = result.per_second / durable.per_second
            rows.append(row)
    return rows


# --- 3: checkpoint latency per step, in process -------------------------------------------------


async def _one_run(
    store: SqlRunStore, model: ScriptedModel, steps: int, variant: str, sql: SqlCounter
) -> tuple[float, float, int]:
    """Wall and CPU seconds and SQL statements of one in-process run of ``steps`` rounds."""
    run_id = f"bench_{uuid.uuid4().hex}"
    await store.create(run_id, origin="request", args={"prompt": "bench"})
    record = await store.start(run_id)
    agent = Agent(model, tools=[NOOP_TOOL], max_steps=steps + 1)
    # what a worker's journal does: the progress rides on the checkpoint before a model call
    progress = ProgressAtCheckpoints(steps + 1) if variant == "journal+progress" else None
    journal = (
        None
        if variant == "none"
        else store.journal(run_id, attempt=record.attempt, progress=progress)
    )
    sql.statements.clear()
    sql.active = True
    wall, cpu = time.perf_counter(), time.process_time()
    turn = await agent.run(f"STEPS={steps} go", options=RunOptions(run_id=run_id, journal=journal))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    sql.active = False
    if not isinstance(turn.outcome, Completed) or turn.outcome.steps_used != steps:
        raise RuntimeError(f"checkpoint bench: the run ended {turn.outcome!r}")
    model.requests.clear()
    return wall, cpu, sql.total()


VARIANTS = ("none", "journal", "journal+progress")


def _checkpoint_row(
    variant: str, median: dict[tuple[str, str, int], float], statements: dict[tuple[str, int], int]
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "variant": variant,
        "statements_1_step": statements[variant, 1],
        "statements_10_steps": statements[variant, 10],
        "statements_per_step": (statements[variant, 10] - statements[variant, 1]) / 9,
    }
    for key in ("wall", "cpu"):
        one, ten = median[key, variant, 1], median[key, variant, 10]
        row[f"{key}_ms_1_step"] = one * 1000
        row[f"{key}_ms_10_steps"] = ten * 1000
        row[f"{key}_ms_per_step"] = (ten - one) / 9 * 1000
        if variant != "none":
            base_one, base_ten = median[key, "none", 1], median[key, "none", 10]
            per_step = ((ten - base_ten) - (one - base_one)) / 9
            row[f"added_{key}_ms_per_step"] = per_step * 1000
            row[f"added_{key}_ms_per_run_fixed"] = ((one - base_one) - per_step) * 1000
    return row


async def checkpoints_on(url: str, repeats: int) -> dict[str, Any]:
    """1- and 10-step runs of each variant, interleaved; medians of ``repeats``."""
    database = Database(url)
    try:
        await database.migrate()
        store = SqlRunStore(database)
        sql = SqlCounter()
        sql.attach(database)
        model = ScriptedModel(default=scripted_reply, keep_requests=0)
        samples: dict[tuple[str, str, int], list[float]] = defaultdict(list)
        statements: dict[tuple[str, int], int] = {}
        for steps in (1, 10):
            for variant in VARIANTS:  # warm-up
                await _one_run(store, model, steps, variant, sql)
        for repeat in range(repeats):
            for steps in (1, 10):
                order = VARIANTS[repeat % 3 :] + VARIANTS[: repeat % 3]
                for variant in order:
                    wall, cpu, count = await _one_run(store, model, steps, variant, sql)
                    samples["wall", variant, steps].append(wall)
                    samples["cpu", variant, steps].append(cpu)
                    statements[variant, steps] = count
        median = {key: statistics.median(values) for key, values in samples.items()}
        rows = [_checkpoint_row(variant, median, statements) for variant in VARIANTS]
        return {"repeats": repeats, "rows": rows}
    finally:
        await database.dispose()


async def checkpoints(backends: list[str], repeats: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for backend in backends:
        try:
            async with database_url(backend) as url:
                results[backend] = await checkpoints_on(url, repeats)
        except AgentError as error:
            results[backend] = {"error": str(error)}
    return results


# --- what one SQL transaction costs: the basis of the floor --------------------------------------


async def _cpu_and_wall(action: Callable[[], Awaitable[Any]], count: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        await action()
    return (time.perf_counter() - wall) / count, (time.process_time() - cpu) / count


async def transaction_costs_on(url: str, repeats: int) -> dict[str, Any]:
    """Wall and CPU of a write transaction (``Database.write``) holding 1, 2 and 4 small
    ``INSERT`` s into a scratch table, of ``SqlRunJournal.record`` and ``SqlRunStore.progress``,
    each the median of ``repeats`` interleaved loops of 40. ``T(k) = overhead + k × statement``
    is fitted from k = 1 and 4."""
    database = Database(url)
    table = "agent_bench_scratch"
    try:
        await database.migrate()
        async with database.write() as conn:
            await conn.execute(sa.text(f"CREATE TABLE {table} (k VARCHAR(40), v VARCHAR(200))"))
        store = SqlRunStore(database)
        run_id = f"bench_{uuid.uuid4().hex}"
        await store.create(run_id, origin="request", args={"prompt": "bench"})
        record = await store.start(run_id)
        journal = store.journal(run_id, attempt=record.attempt)
        insert = sa.text(f"INSERT INTO {table} (k, v) VALUES (:k, :v)")
        seq = iter(range(10**9))

        def transaction(k: int) -> Callable[[], Awaitable[None]]:
            async def action() -> None:
                async with database.write() as conn:
                    for _ in range(k):
                        await conn.execute(insert, {"k": run_id, "v": "x" * 100})

            return action

        async def checkpoint() -> None:
            step = next(seq)
            await journal.record(ToolDone(step=step, position=0, call_id=f"c{step}", content="{}"))

        async def progress() -> None:
            await store.progress(run_id, 50, "step 5 of 10")

        actions: dict[str, Callable[[], Awaitable[None]]] = {
            "transaction_1_insert": transaction(1),
            "transaction_2_inserts": transaction(2),
            "transaction_4_inserts": transaction(4),
            "journal_record": checkpoint,
            "progress_update": progress,
        }
        samples: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for action in actions.values():  # warm-up
            await _cpu_and_wall(action, 10)
        for repeat in range(repeats):
            names = list(actions)
            names = names[repeat % len(names) :] + names[: repeat % len(names)]
            for name in names:
                samples[name].append(await _cpu_and_wall(actions[name], 40))
        result: dict[str, Any] = {}
        for name, values in samples.items():
            result[name] = {
                "wall_ms": statistics.median(v[0] for v in values) * 1000,
                "cpu_ms": statistics.median(v[1] for v in values) * 1000,
            }
        for key in ("wall_ms", "cpu_ms"):
            one, four = result["transaction_1_insert"][key], result["transaction_4_inserts"][key]
            statement = (four - one) / 3
            result[f"statement_{key}"] = statement
            result[f"transaction_overhead_{key}"] = one - statement
        return result
    finally:
        with contextlib.suppress(AgentError):
            async with database.write() as conn:
                await conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
        await database.dispose()


async def transaction_costs(backends: list[str], repeats: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for backend in backends:
        try:
            async with database_url(backend) as url:
                results[backend] = await transaction_costs_on(url, repeats)
        except AgentError as error:
            results[backend] = {"error": str(error)}
    return results


MIN_WRITES: Final = 4
"""Durable writes a 1-round run cannot do without: its start (which claims the attempt), the
reply that asks for the tool (durable before the tool runs), the tool's result with the round
(durable before the next model call, so a re-delivered run never repeats a tool call) and its
outcome (with the final reply)."""


async def floor(report: dict[str, Any], jobs: int) -> list[dict[str, Any]]:
    """How close to arq's no-op throughput a 1-round run can get, from measured parts.

    A worker of short runs is CPU-bound (one core): runs/s = 1000 / CPU ms per run. Per run it
    spends at least arq's cost of a no-op job, the agent loop itself (in process, no journal:
    the checkpoint table's ``none`` row) and :data:`MIN_WRITES` durable writes at the cheapest
    write measured (a transaction of one small ``INSERT``). The ratio at that floor is the
    best a run could reach with durable steps through this stack; "storage free" drops the
    writes as well. Both are generous: arq costs more per job when jobs hold their slots
    (it checks every running job again at each poll), measured here with no-op jobs that
    sleep as long as a run holds its slot now.
    """
    rows = []
    fast = [r for r in report["throughput"] if r["poll_delay"] < 0.1]
    noop = next((r for r in fast if r["subject"] == "arq no-op"), None)
    for backend, costs in report.get("transactions", {}).items():
        run = next((r for r in fast if r["subject"] == f"agent_run {backend}"), None)
        checkpoints = report.get("checkpoints", {}).get(backend, {}).get("rows")
        if noop is None or run is None or "error" in costs or not checkpoints:
            continue
        slot = run["max_jobs"] / run["per_second"]  # how long a run holds its slot, on average
        held = await arq_noop(
            jobs, max_jobs=run["max_jobs"], poll_delay=run["poll_delay"], hold=slot
        )
        loop = next(r for r in checkpoints if r["variant"] == "none")["cpu_ms_1_step"]
        write = costs["transaction_1_insert"]["cpu_ms"]
        arq = noop["cpu_ms_per_job"]
        at_floor = arq + loop + MIN_WRITES * write
        rows.append(
            {
                "backend": backend,
                "arq_noop_cpu_ms": noop["cpu_ms_per_job"],
                "arq_holding_cpu_ms": held.cpu_seconds / held.jobs * 1000,
                "slot_ms": slot * 1000,
                "loop_cpu_ms": loop,
                "write_cpu_ms": write,
                "writes_now": run["sql_transactions_per_job"],
                "writes_at_least": MIN_WRITES,
                "run_cpu_ms_now": run["cpu_ms_per_job"],
                "floor_cpu_ms": at_floor,
                "ratio_now": run["ratio"],
                "ratio_at_floor": arq / at_floor,
                "ratio_storage_free": arq / (arq + loop),
            }
        )
    return rows


# --- where a background run's time goes ---------------------------------------------------------


def _wrap_components(breakdown: Breakdown) -> None:
    for name in ("open_run", "args", "start", "finish", "get", "checkpoints", "pending_resume"):
        breakdown.wrap(SqlRunStore, name, f"store.{name}")
    breakdown.wrap(LeasedRunJournal, "record", "checkpoint (journal.record, lease, progress)")
    breakdown.wrap(Agent, "run", "Agent.run (includes checkpoints, model calls)")
    breakdown.wrap(ScriptedModel, "chat", "model calls (scripted)")
    breakdown.wrap(aioredis.Redis, "execute_command", "redis commands (outside pipelines)")
    breakdown.wrap(Pipeline, "execute", "redis pipelines (arq, event streams, control)")


async def where_time_goes(
    runs: int, *, poll_delay: float, profile: bool, backends: list[str]
) -> dict[str, Any]:
    """A sequential worker (``max_jobs=1``) on SQLite with its parts timed; with ``profile``,
    a cProfile of the throughput worker (``max_jobs=10``) on each backend, its own time per
    run grouped by part of the stack (wall-clock timer: time a call waits for the GIL or the
    kernel counts; ``results/jobs_profile.txt`` has the top functions)."""
    breakdown = Breakdown()
    _wrap_components(breakdown)
    result = await agent_runs(
        "sqlite", runs, max_jobs=1, poll_delay=poll_delay, breakdown=breakdown
    )
    per_run = {label: s / runs * 1000 for label, s in breakdown.seconds.items()}
    calls = {label: n / runs for label, n in breakdown.calls.items()}
    report: dict[str, Any] = {
        "runs": runs,
        "poll_delay": poll_delay,
        "wall_ms_per_run": result.seconds / runs * 1000,
        "cpu_ms_per_run": result.cpu_seconds / runs * 1000,
        "ms_per_run": dict(sorted(per_run.items(), key=lambda item: -item[1])),
        "calls_per_run": calls,
        "sql_per_run": result.sql_per_job,
        "sql_transactions_per_run": result.sql_transactions_per_job,
        "redis_commands_per_run": result.redis_commands_per_job,
        "redis_round_trips_per_run": result.redis_round_trips_per_job,
        "redis_connections_per_run": result.redis_connections_opened / runs,
    }
    if profile:
        report["profile"] = {}
        texts = []
        for backend in backends:
            profiler = cProfile.Profile()
            await agent_runs(backend, runs, max_jobs=10, poll_delay=poll_delay, profile=profiler)
            text = io.StringIO()
            stats = pstats.Stats(profiler, stream=text)
            stats.sort_stats("tottime").print_stats(30)
            texts.append(f"=== {backend}, max_jobs=10, {runs} runs ===\n{text.getvalue()}")
            areas: Counter[str] = Counter()
            for (filename, _line, name), row in stats.stats.items():  # type: ignore[attr-defined]
                areas[_area(filename, name)] += row[2]
            report["profile"][backend] = {
                area: seconds / runs * 1000 for area, seconds in areas.most_common()
            }
        (RESULTS / "jobs_profile.txt").write_text("\n".join(texts))
    return report


_AREAS: Final = (
    ("sqlalchemy", "SQLAlchemy"),
    ("greenlet", "SQLAlchemy"),
    ("aiosqlite", "driver (aiosqlite, asyncpg)"),
    ("asyncpg", "driver (aiosqlite, asyncpg)"),
    ("redis", "redis-py"),
    ("arq", "arq"),
    ("agent_plugin/storage", "agent_plugin.storage"),
    ("agent_plugin/jobs", "agent_plugin.jobs"),
    ("agent_plugin", "agent_plugin (loop, tools, messages)"),
    ("pydantic", "pydantic"),
    ("asyncio", "asyncio event loop"),
    ("selectors", "asyncio event loop"),
)
_BUILTINS: Final = {
    "<method 'poll' of 'select.epoll' objects>": "idle (waiting in epoll)",
    "<method 'put_nowait' of '_queue.SimpleQueue' objects>": "hand-off to aiosqlite's thread",
    "<method 'switch' of 'greenlet.greenlet' objects>": "SQLAlchemy",
    "<method 'send' of '_socket.socket' objects>": "socket send/recv",
    "<method 'recv' of '_socket.socket' objects>": "socket send/recv",
}


def _area(filename: str, name: str) -> str:
    """Which part of the stack a profiled function belongs to."""
    if filename == "~":
        return _BUILTINS.get(name, "other built-ins")
    for needle, area in _AREAS:
        if f"/{needle}" in filename:
            return area
    return "other"


# --- the whole benchmark ------------------------------------------------------------------------


@dataclass
class Plan:
    jobs: int
    configs: list[tuple[int, float]]
    backends: list[str]
    repeats: int
    checkpoint_backends: list[str]
    checkpoint_repeats: int
    transaction_repeats: int
    breakdown_runs: int
    profile: bool
    events_off: bool
    floor_jobs: int

    @classmethod
    def of(cls, quick: bool, profile: bool) -> Plan:
        if quick:
            return cls(120, [(10, 0.01)], ["sqlite"], 1, ["sqlite"], 5, 3, 0, False, False, 60)
        both = ["sqlite", "postgresql"]
        return cls(200, [(10, 0.5), (10, 0.01)], both, 2, both, 15, 7, 150, profile, True, 150)


async def _postgres_reachable() -> bool:
    database = Database(POSTGRES_URL, connect_timeout=3)
    try:
        await database.check()
    except AgentError:
        return False
    finally:
        await database.dispose()
    return True


async def run(plan: Plan) -> dict[str, Any]:
    def log(message: str) -> None:
        print(f"[bench_jobs {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    notes: list[str] = []
    if "postgresql" in plan.backends + plan.checkpoint_backends and not (
        await _postgres_reachable()
    ):
        notes.append(f"PostgreSQL unreachable at {sa.make_url(POSTGRES_URL)!r}: skipped")
        plan.backends = [b for b in plan.backends if b != "postgresql"]
        plan.checkpoint_backends = [b for b in plan.checkpoint_backends if b != "postgresql"]
    log(f"throughput: {plan.jobs} jobs, configs {plan.configs}, {plan.backends}")
    report: dict[str, Any] = {
        "load_average_at_start": os.getloadavg(),
        "plan": asdict(plan),
        "target": TARGET,
        "notes": notes,
        "throughput": await throughput(
            jobs=plan.jobs,
            configs=plan.configs,
            backends=plan.backends,
            repeats=plan.repeats,
            events_off=plan.events_off,
        ),
    }
    log(f"checkpoints: {plan.checkpoint_backends}")
    report["checkpoints"] = await checkpoints(plan.checkpoint_backends, plan.checkpoint_repeats)
    log("transaction costs")
    report["transactions"] = await transaction_costs(
        plan.checkpoint_backends, plan.transaction_repeats
    )
    log("the floor")
    report["floor"] = await floor(report, plan.floor_jobs)
    report["load_average_at_end"] = os.getloadavg()
    if plan.breakdown_runs:
        log("where the time goes")
        report["breakdown"] = await where_time_goes(
            plan.breakdown_runs, poll_delay=0.01, profile=plan.profile, backends=plan.backends
        )
    return report


# --- markdown ------------------------------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    """The markdown tables of a report (also embedded by ``benchmarks/run.py``)."""
    out = [
        "Throughput through one worker (in process, `burst=True`), jobs/s from the end of the "
        "worker's startup to the end of its last job, best of "
        f"{report['plan']['repeats']}; each agent run is one tool round (two scripted model "
        "calls and a tool call), enqueued as a tracked run beforehand. Both sides enqueue "
        "before the timed window (enqueued/s: the app side's rate, apart). At a 0.5 s poll arq "
        "starts at most max_jobs long jobs per poll (20 runs/s), but up to 100 no-op jobs; the "
        "10 ms poll compares costs. *arq durable*: an arq job on the no-op job's worker "
        "settings that makes only a 1-round run's durable writes, through the library's own "
        "`SqlRunStore` (the record created at enqueue; in the job `open_run`, the arguments "
        "read with the start; the run's journal checkpoints through `run_journal` with the "
        "worker's progress rule, the reply with the start and the tool result with the round; "
        "`finish`: 4 transactions) on the same database, interleaved with the others.",
        "",
        "Ratio to arq no-op is the target (≥ 0.7, see Targets); ratio to arq durable (same "
        "backend) is how much of a run's cost is the harness beyond its durable writes (1.0: "
        "none; the loop, model, tool, event stream, session turn, lease keeper and arq's "
        "handling of a tracked run make up the rest). At the 0.5 s poll a durable job holds "
        "its slot too and meets the same 20 jobs/s limit, so that ratio is about 1 by "
        "construction; the 10 ms poll compares costs.",
        "",
        "| max_jobs | poll_delay s | subject | jobs | jobs/s | ratio to arq no-op "
        "| ratio to arq durable | wall ms/job | CPU ms/job | SQL statements/job "
        "| SQL transactions/job | DB connections opened | Redis commands/job (round trips) "
        "| Redis connections opened | enqueued/s |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["throughput"]:
        ratio = f"{row['ratio']:.2f}×" if "ratio" in row else "—"
        durable = f"{row['ratio_to_durable']:.2f}×" if "ratio_to_durable" in row else "—"
        sql = sum(row["sql_per_job"].values()) - row["sql_per_job"].get("transaction control", 0)
        done = "" if row["completed"] == row["jobs"] else f" ({row['completed']} completed!)"
        uses_db = "no-op" not in row["subject"]
        out.append(
            f"| {row['max_jobs']} | {row['poll_delay']:g} | {row['subject']}{done} "
            f"| {row['jobs']} | {row['per_second']:,.0f} | {ratio} | {durable} "
            f"| {row['wall_ms_per_job']:.2f} | {row['cpu_ms_per_job']:.2f} "
            f"| {sql:.1f} | {row['sql_transactions_per_job']:.1f} "
            f"| {row['sql_connections_opened'] if uses_db else '—'} "
            f"| {row['redis_commands_per_job']:.1f} ({row['redis_round_trips_per_job']:.1f}) "
            f"| {row['redis_connections_opened']} | {row['enqueue_per_second']:,.0f} |"
        )
    out += [
        "",
        "Checkpoint cost in process (`Agent.run_turn`, scripted model, no worker): median wall "
        "of 1- and 10-step runs without a journal, with `SqlRunStore.journal` and with the "
        "journal and the worker's progress rule (the progress `UPDATE` in the transaction of "
        "the checkpoint before each model call); added per step = the slope between 1 and 10 "
        "steps less the no-journal slope.",
        "",
        "| backend | variant | run ms, 1 step | run ms, 10 steps | wall ms/step "
        "| added wall ms/step | added CPU ms/step | added wall ms per run (fixed) "
        "| SQL statements per step |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for backend, data in report["checkpoints"].items():
        if "error" in data:
            out.append(f"| {backend} | unavailable: {data['error']} | | | | | | | |")
            continue
        for row in data["rows"]:

            def cell(key: str, row: dict[str, Any] = row) -> str:
                return f"{row[key]:.2f}" if key in row else "—"

            out.append(
                f"| {backend} | {row['variant']} | {cell('wall_ms_1_step')} "
                f"| {cell('wall_ms_10_steps')} | {cell('wall_ms_per_step')} "
                f"| {cell('added_wall_ms_per_step')} | {cell('added_cpu_ms_per_step')} "
                f"| {cell('added_wall_ms_per_run_fixed')} | {row['statements_per_step']:.1f} |"
            )
    transactions = report.get("transactions") or {}
    if transactions:
        out += [
            "",
            "What one write costs (`Database.write`, median of interleaved loops): a transaction "
            "with 1, 2 and 4 small INSERTs, one checkpoint (`SqlRunJournal.record`) and one "
            "progress `UPDATE`; overhead and statement fitted as T(k) = overhead + k × "
            "statement.",
            "",
            "| backend | measure | 1 INSERT | 2 INSERTs | 4 INSERTs | journal.record "
            "| progress | transaction overhead | per statement |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for backend, costs in transactions.items():
            if "error" in costs:
                out.append(f"| {backend} | unavailable: {costs['error']} | | | | | | | |")
                continue
            for key, label in (("wall_ms", "wall ms"), ("cpu_ms", "CPU ms")):
                cells = [
                    costs[name][key]
                    for name in (
                        "transaction_1_insert",
                        "transaction_2_inserts",
                        "transaction_4_inserts",
                        "journal_record",
                        "progress_update",
                    )
                ]
                cells += [costs[f"transaction_overhead_{key}"], costs[f"statement_{key}"]]
                out.append(
                    f"| {backend} | {label} | " + " | ".join(f"{c:.2f}" for c in cells) + " |"
                )
    floor_rows = report.get("floor") or []
    if floor_rows:
        out += [
            "",
            f"The floor (fast poll): a worker of short runs is CPU-bound, so runs/s = 1000 / CPU "
            f"ms per run. A 1-round run costs at least arq's cost of a no-op job, the agent "
            f"loop (the checkpoint table's `none` row) and {MIN_WRITES} durable writes (start, "
            f"the reply with the tool call, the tool result with the round, the outcome) at "
            f"the cheapest write measured (one small `INSERT`); the ratio at that floor is the "
            f"best a run could reach through this stack, and the last column drops the writes "
            f"too. Both are generous: arq's own cost per job grows when jobs hold their slots "
            f"(it checks each running job again at every poll), shown for no-op jobs that sleep "
            f"as long as a run holds its slot now.",
            "",
            "| backend | arq no-op CPU ms/job | arq holding its slot (ms) CPU ms/job "
            "| loop CPU ms/run | one write CPU ms | writes/run now (at least) "
            "| CPU ms/run now | floor CPU ms/run | ratio now | ratio at the floor "
            "| ratio, storage free |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in floor_rows:
            out.append(
                f"| {row['backend']} | {row['arq_noop_cpu_ms']:.2f} "
                f"| {row['arq_holding_cpu_ms']:.2f} ({row['slot_ms']:.0f}) "
                f"| {row['loop_cpu_ms']:.2f} | {row['write_cpu_ms']:.2f} "
                f"| {row['writes_now']:.0f} ({row['writes_at_least']}) "
                f"| {row['run_cpu_ms_now']:.2f} | {row['floor_cpu_ms']:.2f} "
                f"| {row['ratio_now']:.3f}× | {row['ratio_at_floor']:.2f}× "
                f"| {row['ratio_storage_free']:.2f}× |"
            )
    breakdown = report.get("breakdown")
    if breakdown:
        out += [
            "",
            f"Where a background run's time goes (SQLite, one worker with max_jobs=1, poll "
            f"{breakdown['poll_delay']:g} s, {breakdown['runs']} runs): "
            f"{breakdown['wall_ms_per_run']:.2f} ms wall and {breakdown['cpu_ms_per_run']:.2f} "
            f"ms CPU per run; {sum(breakdown['sql_per_run'].values()):.1f} SQL statements in "
            f"{breakdown['sql_transactions_per_run']:.1f} transactions, "
            f"{breakdown['redis_commands_per_run']:.1f} Redis commands in "
            f"{breakdown['redis_round_trips_per_run']:.1f} round trips and "
            f"{breakdown['redis_connections_per_run']:.2f} new Redis connections per run.",
            "",
            "| part | ms per run | calls per run |",
            "|---|---:|---:|",
        ]
        for label, ms in breakdown["ms_per_run"].items():
            out.append(f"| {label} | {ms:.2f} | {breakdown['calls_per_run'][label]:.1f} |")
        out += ["", "| SQL statement | per run |", "|---|---:|"]
        for kind, count in breakdown["sql_per_run"].items():
            out.append(f"| {kind} | {count:.1f} |")
        profiled = breakdown.get("profile") or {}
        if profiled:
            backends = list(profiled)
            areas = sorted(
                {area for data in profiled.values() for area in data},
                key=lambda area: -max(data.get(area, 0.0) for data in profiled.values()),
            )
            out += [
                "",
                "cProfile of the throughput worker (max_jobs=10, fast poll), own time per run "
                "by part of the stack, ms (wall-clock timer, profiler overhead included):",
                "",
                "| part | " + " | ".join(backends) + " |",
                "|---|" + "---:|" * len(backends),
            ]
            for area in areas:
                shown = " | ".join(f"{profiled[b].get(area, 0.0):.2f}" for b in backends)
                out.append(f"| {area} | {shown} |")
    for note in report.get("notes", []):
        out += ["", f"Note: {note}."]
    return "\n".join(out)


def target_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The S7 target (agent runs/s ≥ 0.7 × arq's no-op jobs/s), per configuration and backend."""
    rows = []
    for row in report["throughput"]:
        subject = row["subject"]
        if "ratio" not in row or not subject.startswith("agent_run") or "events off" in subject:
            continue
        measured = row["ratio"]
        verdict = (
            "met"
            if measured >= TARGET
            else f"missed: {measured / TARGET:.2f}× the target ({TARGET / measured:.1f}× short)"
        )
        rows.append(
            {
                "target": f"S7 {row['subject']} (max_jobs {row['max_jobs']}, poll "
                f"{row['poll_delay']:g} s): runs/s ≥ 0.7× arq no-op jobs/s",
                "measured": measured,
                "verdict": verdict,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run (~15 s)")
    parser.add_argument("--profile", action="store_true", help="also cProfile the worker")
    options = parser.parse_args()
    if (os.cpu_count() or 1) > 1 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {CPU})  # like the suite's client; the servers keep the others
    RESULTS.mkdir(exist_ok=True)
    report = asyncio.run(run(Plan.of(options.quick, options.profile)))
    report["targets"] = target_rows(report)
    (RESULTS / "jobs.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(render(report))
    print()
    for row in report["targets"]:
        print(f"{row['target']}: {row['measured']:.2f}× ({row['verdict']})")


if __name__ == "__main__":
    main()
