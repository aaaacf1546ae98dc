"""The app and the arq worker of the background-run tests (``tests/test_jobs*.py``).

The worker is a real subprocess: ``python -m arq tests.jobs_app.WorkerSettings``. Both sides
build the same plugin with :func:`make_plugin`; the worker reads its options from the
environment (``AGENT_*`` for the settings, ``JOBS_TEST_*`` for the test's knobs).

The model is scripted by the prompt: a JSON *plan* says which tool calls to make, round by
round, how long each model call and tool call takes, which model calls fail, and the final
answers of a typed run (the registered outputs ``ticket``, tool mode, and
``ticket_prompted``). Every model call and every tool execution appends a line to the log
file ``JOBS_TEST_LOG``, so a test can count them across worker restarts (``pid`` is the
worker's process id)::

    <unix time> <pid> model_start <tag> <round>
    <unix time> <pid> model_end <tag> <round>
    <unix time> <pid> tool_start <run_id> <call_id> <tool> <key>
    <unix time> <pid> tool_end <run_id> <call_id> <tool> <key>
    <unix time> <pid> worker_ready
    <unix time> <pid> heartbeat_tick

The always-on knobs (``tests/test_always_on.py``): ``JOBS_TEST_REPORTS`` (a file the
:class:`FileInbox` delivery appends each report to, as a JSON line), ``JOBS_TEST_WEBHOOK`` (a URL
for a :class:`~agent_plugin.proactive.WebhookDelivery` instead; ``JOBS_TEST_WEBHOOK_TIMEOUT``),
``JOBS_TEST_FOLLOWUPS`` (the follow-ups' longest delay, in minutes) and ``JOBS_TEST_HEARTBEAT``
(``every:<seconds>`` or ``cron:<expression>``, with ``JOBS_TEST_HEARTBEAT_PROMPT``,
``_SESSION``, ``_TIMEZONE``, ``_PER_REPLICA`` and ``_ACTIONS``); the heartbeat's precheck logs
``heartbeat_tick`` on every tick. ``JOBS_TEST_MCP_LOG`` (``tests/test_mcp_jobs.py``) adds the
tests' MCP server as the stdio server ``files``, logging its calls to that file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Final, cast

import redis
import sqlalchemy as sa
from fastapi import FastAPI
from pydantic import BaseModel, Field

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.jobs import (
    AGENT_HEARTBEAT,
    JobOptions,
    RunQueue,
    runtime_of,
    start_worker,
    stop_worker,
)
from agent_plugin.jobs.upkeep import Upkeep
from agent_plugin.messages import Role, ToolResultPart
from agent_plugin.output import Output
from agent_plugin.policy import ASK, ToolPolicy, ToolRules
from agent_plugin.proactive import Delivery, Heartbeat, Report, WebhookDelivery
from agent_plugin.providers.base import ChatRequest
from agent_plugin.providers.scripted import Reply, ScriptedModel, tool_call
from agent_plugin.runtime import AgentRuntime
from agent_plugin.storage import Database
from agent_plugin.storage.models import RunRow
from agent_plugin.tools import ToolContext, ToolEffect, tool
from agent_plugin.toolsets import Toolset
from agent_plugin.web import AgentPlugin, AppAgent
from tests.services import REDIS_URL

LOG_ENV: Final = "JOBS_TEST_LOG"
RETRY_PREFIX: Final = "Your answer was not accepted:"


class FailPlan(BaseModel):
    round: int = 0
    times: int = 0
    kind: ErrorKind = ErrorKind.RATE_LIMITED
    message: str = ""
    """The error's message (default ``scripted <kind>``)."""


class Ticket(BaseModel):
    """The typed result of the tests' background runs (``output="ticket"``)."""

    title: str
    priority: int = Field(ge=1, le=5)


OUTPUTS: Final = {"ticket": Ticket, "ticket_prompted": Output(Ticket, mode="prompted")}


class Plan(BaseModel):
    """What the scripted model does for one prompt."""

    tag: str
    rounds: list[list[tuple[str, str] | tuple[str, str, dict[str, Any]]]] = Field(
        default_factory=list
    )
    """Per round, the calls to make: ``(tool, key)`` (tools ``effect``, ``send`` and ``login``,
    which logs in as ``key`` with ``JOBS_TEST_LOGIN_PASSWORD`` and ``JOBS_TEST_LOGIN_KEY``), or
    ``(tool, key, arguments)`` for any other tool (``schedule_followup``)."""
    answer: str = "done"
    echo: bool = False
    """End the answer with the results of the last round's calls (``| <result>`` each)."""
    model_delay: float = 0.0
    tool_delay: float = 0.0
    fail: FailPlan = Field(default_factory=FailPlan)
    """The model call of ``round`` fails (with ``kind``) the first ``times`` times."""
    outputs: list[dict[str, Any]] = Field(default_factory=list)
    """A typed run's final answers after the rounds, one per attempt (the last repeats): a
    ``final_result`` call when the request offers it, else the JSON as text."""


def log_path() -> Path | None:
    value = os.environ.get(LOG_ENV)
    return Path(value) if value else None


@dataclass(frozen=True)
class Line:
    """One line of the log."""

    time: float
    pid: int
    event: str
    args: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Line:
        words = text.split()
        return cls(float(words[0]), int(words[1]), words[2], tuple(words[3:]))


def log(event: str, *words: object) -> None:
    """Append one line to the log (one ``write`` of a short line: atomic with O_APPEND)."""
    path = log_path()
    if path is None:
        return
    line = " ".join([f"{time.time():.6f}", str(os.getpid()), event, *map(str, words)]) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_log(path: Path) -> list[Line]:
    """The log's complete lines."""
    if not path.exists():
        return []
    text = path.read_text()
    return [Line.parse(line) for line in text[: text.rfind("\n") + 1].splitlines() if line]


async def plan_reply(request: ChatRequest) -> Reply:
    """The next reply for the plan in the latest user message."""
    messages = [m for m in request.messages if m.role is not Role.SYSTEM]
    users = [i for i, m in enumerate(messages) if m.role is Role.USER and not m.tool_calls]
    # the latest user message, before a typed run's retries (they answer the model)
    users = [i for i in users if not messages[i].text.startswith(RETRY_PREFIX)] or users
    start = users[-1] if users else 0
    try:
        plan = Plan.model_validate_json(messages[start].text)
    except ValueError:
        return f"echo: {messages[start].text if messages else ''}"
    done = sum(1 for m in messages[start + 1 :] if m.role is Role.TOOL)
    log("model_start", plan.tag, done)
    if plan.fail.times and plan.fail.round == done:
        path = log_path()
        failed = (
            sum(1 for x in read_log(path) if x.event == "model_fail" and x.args[0] == plan.tag)
            if path is not None
            else plan.fail.times
        )
        if failed < plan.fail.times:
            log("model_fail", plan.tag, done)
            message = plan.fail.message or f"scripted {plan.fail.kind.value}"
            raise AgentError(plan.fail.kind, message, provider="scripted")
    if plan.model_delay:
        await asyncio.sleep(plan.model_delay)
    log("model_end", plan.tag, done)
    if done < len(plan.rounds):
        turn = len(users)
        return [
            tool_call(call[0], _arguments(call, plan), id=f"u{turn}r{done}c{i}")
            for i, call in enumerate(plan.rounds[done])
        ]
    if plan.outputs:
        replies = sum(1 for m in messages[start + 1 :] if m.role is Role.ASSISTANT)
        attempt = plan.outputs[min(replies - len(plan.rounds), len(plan.outputs) - 1)]
        if any(t.name == "final_result" for t in request.tools):
            return [tool_call("final_result", attempt, id=f"u{len(users)}o{replies}")]
        return json.dumps(attempt)
    answer = f"{plan.answer} after {done} rounds"
    if plan.echo:
        results = [
            part.tool_result.content
            for m in messages[start + 1 :]
            if m.role is Role.TOOL
            for part in m.content
            if isinstance(part, ToolResultPart)
        ]
        answer = " | ".join([answer, *results[-len(plan.rounds[-1]) :]]) if results else answer
    return answer


def _arguments(
    call: tuple[str, str] | tuple[str, str, dict[str, Any]], plan: Plan
) -> dict[str, Any]:
    if len(call) == 3:
        return call[2]
    if call[0] == "login":  # the model writes the secrets of the worker's environment
        return {
            "user": call[1],
            "password": os.environ.get("JOBS_TEST_LOGIN_PASSWORD", ""),
            "note": f"key {os.environ.get('JOBS_TEST_LOGIN_KEY', '')}",
        }
    return {"key": call[1], "delay": plan.tool_delay}


async def _execute(name: str, key: str, delay: float, ctx: ToolContext) -> dict[str, Any]:
    log("tool_start", ctx.run_id, ctx.call_id, name, key)
    if delay:
        await asyncio.sleep(delay)
    log("tool_end", ctx.run_id, ctx.call_id, name, key)
    return {"done": key, "run_id": ctx.run_id}


@tool(effect=ToolEffect.EXTERNAL)
async def effect(key: str, delay: float, ctx: ToolContext) -> dict[str, Any]:
    """Do something outside the app (logged with the run and call ids)."""
    return await _execute("effect", key, delay, ctx)


@tool(effect=ToolEffect.EXTERNAL)
async def send(key: str, delay: float, ctx: ToolContext) -> dict[str, Any]:
    """Send something; needs approval."""
    return await _execute("send", key, delay, ctx)


@tool
async def login(user: str, password: str, note: str, ctx: ToolContext) -> str:
    """Log in; the result repeats the secrets (a careless tool, for the redaction tests)."""
    log("tool_start", ctx.run_id, ctx.call_id, "login", user)
    return f"logged in as {user}; password: {password}; {note}; api_key={password}"


def options_from_env(env: Mapping[str, str] | None = None, **overrides: Any) -> JobOptions:
    """The test's job options: queue and key prefix per test session, short leases."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {
        "queue_name": env.get("JOBS_TEST_QUEUE", "agent-test:queue"),
        "key_prefix": env.get("JOBS_TEST_PREFIX", "agent-test:"),
        "lease": float(env.get("JOBS_TEST_LEASE", "2")),
        "keep_result": float(env.get("JOBS_TEST_KEEP_RESULT", "1")),
        "job_timeout": float(env.get("JOBS_TEST_JOB_TIMEOUT", "60")),
        "max_deliveries": int(env.get("JOBS_TEST_MAX_DELIVERIES", "20")),
        "retry_backoff": float(env.get("JOBS_TEST_RETRY_BACKOFF", "0.2")),
        "poll_delay": 0.05,
        "max_jobs": int(env.get("JOBS_TEST_MAX_JOBS", "10")),
        "max_redis_connections": int(env.get("JOBS_TEST_MAX_REDIS_CONNECTIONS", "50")),
        "reconcile_every": float(env.get("JOBS_TEST_RECONCILE_EVERY", "60")),
    }
    values.update(overrides)
    return JobOptions(**values)


class FileInbox:
    """A :class:`~agent_plugin.proactive.Delivery` that appends each report to a file as one
    JSON line (one ``write``: reports of several workers do not mix)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def deliver(self, report: Report) -> None:
        line = report.model_dump_json() + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def read_reports(path: Path) -> list[dict[str, Any]]:
    """The reports a :class:`FileInbox` received, oldest first."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def delivery_from_env(env: Mapping[str, str]) -> Delivery | None:
    webhook = env.get("JOBS_TEST_WEBHOOK")
    if webhook:
        timeout = float(env.get("JOBS_TEST_WEBHOOK_TIMEOUT", "5"))
        return WebhookDelivery(webhook, timeout=timeout)  # the secret: AGENT_WEBHOOK_SECRET
    reports = env.get("JOBS_TEST_REPORTS")
    return FileInbox(Path(reports)) if reports else None


def tick_precheck(state: object) -> bool:
    """The test heartbeat's precheck: logs the tick, then lets it run."""
    log("heartbeat_tick")
    return True


def heartbeat_from_env(env: Mapping[str, str]) -> Heartbeat | None:
    spec = env.get("JOBS_TEST_HEARTBEAT")
    if not spec:
        return None
    kind, _, value = spec.partition(":")
    fields: dict[str, Any] = {
        "session": env.get("JOBS_TEST_HEARTBEAT_SESSION") or None,
        "memory_scope": env.get("JOBS_TEST_HEARTBEAT_SCOPE") or None,
    }
    if env.get("JOBS_TEST_HEARTBEAT_PROMPT"):
        fields["prompt"] = env["JOBS_TEST_HEARTBEAT_PROMPT"]
    if kind == "every":
        heartbeat = Heartbeat.every(float(value), **fields)
    else:
        zone = env.get("JOBS_TEST_HEARTBEAT_TIMEZONE", "UTC")
        heartbeat = Heartbeat.cron(value, timezone=zone, **fields)
    if env.get("JOBS_TEST_HEARTBEAT_PER_REPLICA"):
        heartbeat = heartbeat.per_replica()
    if env.get("JOBS_TEST_HEARTBEAT_ACTIONS"):
        heartbeat = heartbeat.allow_actions()
    return heartbeat.precheck(tick_precheck)


_FROM_ENV: Final[Any] = object()


def make_plugin(
    environ: Mapping[str, str] | None = None,
    *,
    delivery: Delivery | None = _FROM_ENV,
    heartbeat: Heartbeat | None = _FROM_ENV,
    followups: timedelta | None = _FROM_ENV,
    policy: ToolPolicy | None = None,
    **options: Any,
) -> AgentPlugin:
    """The plugin of the tests: scripted model, two logging tools, ``send`` needs approval.

    ``environ`` (default ``os.environ``) supplies the ``AGENT_*`` settings and the
    ``JOBS_TEST_*`` knobs; ``delivery``, ``heartbeat`` and ``followups`` replace what the knobs
    say, ``policy`` the tests' policy; ``options`` override the :class:`JobOptions`.
    """
    env = os.environ if environ is None else environ
    if followups is _FROM_ENV:
        minutes = env.get("JOBS_TEST_FOLLOWUPS")
        followups = timedelta(minutes=float(minutes)) if minutes else None
    return AgentPlugin(
        tools=[effect, send, login],
        toolsets=mcp_from_env(env),
        policy=policy if policy is not None else ToolRules().for_tool("send", ASK),
        model=ScriptedModel(default=plan_reply),
        jobs=options_from_env(environ, **options),
        environ=environ,
        delivery=delivery_from_env(env) if delivery is _FROM_ENV else delivery,
        heartbeat=heartbeat_from_env(env) if heartbeat is _FROM_ENV else heartbeat,
        followups=followups,
        outputs=OUTPUTS,
    )


def mcp_from_env(env: Mapping[str, str]) -> list[Toolset]:
    """The tests' MCP server (``files``) when ``JOBS_TEST_MCP_LOG`` names its log."""
    log = env.get("JOBS_TEST_MCP_LOG")
    if not log:
        return []
    from tests.mcp_harness import stdio_server

    return [stdio_server("files", log=Path(log))]


def make_app(plugin: AgentPlugin, **install: Any) -> FastAPI:
    app = FastAPI()
    plugin.install(app, **install)
    return app


@dataclass
class InProcess:
    """An app's agent (enqueues runs, reads records) beside a worker started in this process:
    a test delivers jobs here by calling arq's job functions with :meth:`job_ctx`, and runs
    the fleet's upkeep itself (the worker here does none)."""

    plugin: AgentPlugin
    agent: AppAgent
    ctx: dict[str, Any]

    @property
    def runtime(self) -> AgentRuntime:
        """The worker's runtime (the one the jobs run with)."""
        return runtime_of(self.ctx)

    @property
    def jobs(self) -> RunQueue:
        return self.agent.jobs

    @property
    def redis(self) -> Any:
        return self.ctx["redis"]

    @property
    def upkeep(self) -> Upkeep:
        return Upkeep(self.redis, self.jobs.store, self.jobs.options)

    def job_ctx(self, job_id: str) -> dict[str, Any]:
        """What arq gives a job function: the worker's context, the job id and try."""
        return {**self.ctx, "job_id": job_id, "job_try": 1}


@contextlib.asynccontextmanager
async def in_process(plugin: AgentPlugin) -> AsyncIterator[InProcess]:
    """``plugin`` opened as an app, and as a worker in this process (without upkeep)."""
    async with plugin.open() as agent:
        ctx: dict[str, Any] = {"redis": await agent.jobs.redis()}
        await start_worker(ctx, await plugin.start(), agent.jobs.options, upkeep=False)
        try:
            yield InProcess(plugin, agent, ctx)
        finally:
            await stop_worker(ctx)


def worker_settings() -> type[Any]:
    """The worker's settings, from the environment; its startup logs ``worker_ready <pid>``,
    and each run of the heartbeat's cron job ``heartbeat_job <job id> <scheduled ms>``."""
    if os.environ.get("JOBS_TEST_DEBUG_LOGS"):  # every logger of the worker, at DEBUG
        logging.basicConfig(level=logging.DEBUG, format="%(name)s %(levelname)s %(message)s")
    settings = make_plugin().worker_settings()
    startup = settings.on_startup

    async def on_startup(ctx: dict[str, Any]) -> None:
        await startup(ctx)
        log("worker_ready", os.getpid())

    settings.on_startup = on_startup
    for job in settings.cron_jobs:
        if job.name == AGENT_HEARTBEAT:
            job.coroutine = _traced(job.coroutine)
    return settings


def _traced(tick: Callable[[dict[str, Any]], Awaitable[Any]]) -> Any:
    async def traced(ctx: dict[str, Any]) -> Any:
        log("heartbeat_job", ctx["job_id"], ctx["score"])
        return await tick(ctx)

    return traced


def __getattr__(name: str) -> Any:
    """``WorkerSettings`` is built when the worker asks for it (not when a test imports)."""
    if name == "WorkerSettings":
        return worker_settings()
    raise AttributeError(name)


# --- the test side: environment, worker processes, clean-up --------------------------------

ROOT: Final = Path(__file__).resolve().parent.parent


@dataclass
class JobsEnv:
    """Where one test module's runs live: its database, queue, key prefix and log."""

    directory: Path
    environ: dict[str, str]
    log: Path
    queue: str
    prefix: str
    redis_url: str
    database_url: str
    reports: Path

    def lines(self, event: str | None = None) -> list[Line]:
        """The log's lines, only ``event`` ones if given."""
        return [line for line in read_log(self.log) if event is None or line.event == event]

    def delivered(self) -> list[dict[str, Any]]:
        """The reports the workers' :class:`FileInbox` received."""
        return read_reports(self.reports)


def jobs_env(
    directory: Path,
    *,
    redis_url: str = REDIS_URL,
    database_url: str | None = None,
    **knobs: str,
) -> JobsEnv:
    """A fresh environment in ``directory``: config file, database (a SQLite file unless
    ``database_url`` names another, migrated here), unique queue."""
    token = uuid.uuid4().hex[:12]
    config = directory / "agent.toml"
    config.write_text('[agent]\nprovider = "scripted"\nmax_steps = 8\n', encoding="utf-8")
    database_url = database_url or f"sqlite+aiosqlite:///{directory / 'runs.db'}"
    log_file = directory / "events.log"
    reports = directory / "reports.jsonl"
    environ = {
        "AGENT_CONFIG_FILE": str(config),
        "AGENT_DATABASE_URL": database_url,
        "AGENT_REDIS_URL": redis_url,
        "JOBS_TEST_QUEUE": f"agent-test-{token}:queue",
        "JOBS_TEST_PREFIX": f"agent-test-{token}:",
        "JOBS_TEST_REPORTS": str(reports),
        LOG_ENV: str(log_file),
        **{f"JOBS_TEST_{k.upper()}": v for k, v in knobs.items()},
    }
    with ThreadPoolExecutor(1) as thread:  # also from a test whose event loop is running
        thread.submit(asyncio.run, _migrate(database_url)).result()
    return JobsEnv(
        directory=directory,
        environ=environ,
        log=log_file,
        queue=environ["JOBS_TEST_QUEUE"],
        prefix=environ["JOBS_TEST_PREFIX"],
        redis_url=redis_url,
        database_url=database_url,
        reports=reports,
    )


async def _migrate(url: str) -> None:
    database = Database(url)
    try:
        await database.migrate()
    finally:
        await database.dispose()


class WorkerProcess:
    """``python -m arq tests.jobs_app.WorkerSettings`` (or another ``settings``) as a
    subprocess of the test."""

    def __init__(
        self,
        env: JobsEnv,
        *,
        name: str = "worker",
        extra: Mapping[str, str] | None = None,
        settings: str = "tests.jobs_app.WorkerSettings",
    ) -> None:
        self.settings = settings
        self.env = env
        self.name = name
        self.extra = dict(extra or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, *, wait: bool = True, timeout: float = 30.0) -> None:
        self.starts += 1
        output = open(self.env.directory / f"{self.name}-{self.starts}.out", "wb")  # noqa: SIM115
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "arq", self.settings],
                cwd=ROOT,
                env={**os.environ, **self.env.environ, **self.extra},
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        finally:
            output.close()
        if wait:
            self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until the worker's startup logged ``worker_ready <pid>``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready():
                return
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"the worker exited: {self.output()}")
            time.sleep(0.05)
        raise AssertionError(f"the worker did not start in {timeout} s: {self.output()}")

    def ready(self) -> bool:
        """Whether this process has finished its startup."""
        return self.process is not None and any(
            line.pid == self.pid for line in self.env.lines("worker_ready")
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def output(self, *, whole: bool = False) -> str:
        """What the worker printed (its last 3000 characters, unless ``whole``)."""
        path = self.env.directory / f"{self.name}-{self.starts}.out"
        text = path.read_text(errors="replace") if path.exists() else ""
        return text if whole else text[-3000:]

    def kill(self) -> None:
        """SIGKILL: the worker dies mid-whatever, with no clean-up at all."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        """SIGTERM (arq's graceful shutdown), then SIGKILL if it hangs."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()


@contextlib.contextmanager
def worker_serving(env: JobsEnv) -> Iterator[JobsEnv]:
    """``env`` with one worker process serving it; afterwards the worker stops and the
    environment's Redis keys go."""
    worker = WorkerProcess(env)
    worker.start()
    try:
        yield env
    finally:
        worker.stop()
        clean_redis(env)


def clean_redis(env: JobsEnv) -> None:
    """Delete this environment's keys (its queue, its prefix, its runs' and its queued jobs'
    arq keys) only."""
    client = redis.Redis.from_url(env.redis_url)
    try:
        keys: list[bytes | str] = [env.queue, env.queue + ":health-check"]
        keys += list(client.scan_iter(match=env.prefix + "*"))
        queued = [m.decode() for m in cast(list[bytes], client.zrange(env.queue, 0, -1))]
        for run_id in [*run_ids(env), *queued]:
            for prefix in ("arq:job:", "arq:result:", "arq:retry:", "arq:in-progress:"):
                keys.append(prefix + run_id)
                keys += list(client.scan_iter(match=f"{prefix}{run_id}:*"))
        client.delete(*keys)
    finally:
        client.close()


def run_ids(env: JobsEnv) -> list[str]:
    """Every run id recorded in the environment's database (a SQLite file; none for another
    database, whose runs' arq keys expire on their own)."""
    if not env.database_url.startswith("sqlite+aiosqlite:///"):
        return []
    path = env.database_url.removeprefix("sqlite+aiosqlite:///")
    with contextlib.closing(sqlite3.connect(path)) as connection:
        return [row[0] for row in connection.execute("SELECT run_id FROM agent_runs")]


async def bring_forward(queue: RunQueue, run_id: str) -> None:
    """Make a deferred run due now, as if its time had come: its job's score in Redis and the
    due time in its record."""
    redis_client = await queue.redis()
    await redis_client.zadd(queue.options.queue_name, {run_id: time.time() * 1000}, xx=True)
    async with queue.store.database.write() as conn:
        due = sa.update(RunRow).where(RunRow.run_id == run_id).values(lease_until=None)
        await conn.execute(due)
