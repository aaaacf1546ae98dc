"""Always-on agents on the job runtime [SPEC §7, reference §1.18 and §1.23]: the reports of
background runs, the heartbeat on arq's scheduler and agent-booked follow-ups.

The first tests call the arq job functions in this process, with the real Redis on 127.0.0.1
and a SQLite database (fast, and exact about what each job does); the acceptance tests at the
end run real arq worker processes (``tests/jobs_app.py``), each environment with its own queue
and key prefix.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis.asyncio as aioredis
import sqlalchemy as sa
from arq.worker import create_worker

from agent_plugin.agent import Agent
from agent_plugin.config import AgentSettings
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.ids import new_run_id
from agent_plugin.jobs import (
    AGENT_HEARTBEAT,
    AGENT_RESUME,
    AGENT_RUN,
    HeartbeatStats,
    RunArgs,
    RunOrigin,
    agent_heartbeat,
    agent_resume,
    agent_run,
    tick_run_id,
)
from agent_plugin.jobs.ticks import tick
from agent_plugin.messages import Role, TokenUsage
from agent_plugin.options import AgentOverrides
from agent_plugin.outcomes import ApprovalDecision, Completed
from agent_plugin.policy import READ_ONLY_REASON, AllowAll, Strictest
from agent_plugin.proactive import (
    APPROVAL_HEADER,
    KEY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    FollowupPlan,
    Heartbeat,
    LogDelivery,
    Report,
    ReportSource,
    verify_webhook,
)
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.runtime import AgentRuntime
from agent_plugin.sessions import InMemorySessionStore, MessageEntry
from agent_plugin.storage.models import RunRow
from agent_plugin.web import AgentPlugin, AppAgent
from tests.httpserver import Hang, HttpServer, Reply
from tests.jobs_app import (
    LOG_ENV,
    InProcess,
    JobsEnv,
    WorkerProcess,
    bring_forward,
    clean_redis,
    in_process,
    jobs_env,
    make_app,
    make_plugin,
)
from tests.services import redis_db

pytestmark = pytest.mark.timeout(90)

SECRET = "whsec-always-on-0123456789abcdef"
FOLLOWUP_REFUSAL = (
    "this run is already 10 follow-ups deep; finish now and report instead of scheduling another"
)


# --- helpers ---------------------------------------------------------------------------------


class Inbox:
    """A Delivery that keeps every report."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    async def deliver(self, report: Report) -> None:
        self.reports.append(report)


class Broken:
    """A Delivery that always fails."""

    def __init__(self) -> None:
        self.calls = 0

    async def deliver(self, report: Report) -> None:
        self.calls += 1
        raise RuntimeError("the mail server said no")


class Stuck:
    """A Delivery that never finishes (its own timeout bounds the wait)."""

    timeout = 0.2

    async def deliver(self, report: Report) -> None:
        await asyncio.Event().wait()


class Closable(Inbox):
    """An Inbox with an ``aclose`` the runtime must call at shutdown."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = 0

    async def aclose(self) -> None:
        self.closed += 1


_tags = iter(range(1_000_000))


def plan(**fields: Any) -> tuple[str, str]:
    """A fresh tag and the prompt that makes the scripted model follow ``fields``."""
    tag = f"a{next(_tags)}_{time.monotonic_ns() % 1_000_000}"
    return tag, json.dumps({"tag": tag, **fields})


def followup_call(minutes: Any, prompt: str) -> list[Any]:
    """A plan round item: call ``schedule_followup``."""
    return ["schedule_followup", "f", {"delay_minutes": minutes, "prompt": prompt}]


def booked(text: str) -> dict[str, Any]:
    """The ``schedule_followup`` result an ``echo`` answer ends with."""
    return dict(json.loads(text.rsplit(" | ", 1)[1]))


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobsEnv]:
    """A database, a queue and a log for the in-process tests (no worker serves this queue);
    the scripted model and the tools of this process log to the environment's log."""
    environment = jobs_env(tmp_path_factory.mktemp("always-on"))
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(LOG_ENV, str(environment.log))
            yield environment
    finally:
        clean_redis(environment)


Running = InProcess


@asynccontextmanager
async def started(
    env: JobsEnv, settings: dict[str, str] | None = None, **plugin: Any
) -> AsyncIterator[InProcess]:
    """The tests' plugin (``plugin`` as :func:`make_plugin` takes; ``settings``: more
    ``AGENT_*`` variables) opened as an app would, beside a worker started in this process."""
    plugin.setdefault("delivery", Inbox())
    plugin.setdefault("heartbeat", None)
    plugin.setdefault("followups", None)
    async with in_process(make_plugin({**env.environ, **(settings or {})}, **plugin)) as on:
        yield on


async def enqueue(
    on: Running,
    prompt: str,
    *,
    deliver: bool = False,
    origin: RunOrigin = "request",
    **overrides: Any,
) -> str:
    """Queue a run as the app (or a tick, or a booking) would; its run id."""
    if origin == "heartbeat":
        overrides.setdefault("read_only", True)
    run_id = new_run_id()
    args = RunArgs.checked(prompt, overrides=overrides, deliver=deliver, origin=origin)
    await on.jobs.enqueue(run_id, args)
    return run_id


async def run_job(on: Running, run_id: str) -> dict[str, Any]:
    """One delivery of ``agent_run`` for the run, in this process."""
    return await agent_run(on.job_ctx(run_id), run_id)


def inbox(on: Running) -> list[Report]:
    delivery = on.runtime.delivery
    assert isinstance(delivery, Inbox)
    return delivery.reports


async def outcome_text(on: Running, run_id: str) -> str:
    record = await on.jobs.get(run_id)
    assert record.outcome is not None, record
    return record.outcome.text or ""


async def stored_args(on: Running | AppAgent, run_id: str) -> dict[str, Any]:
    return await on.jobs.store.args(run_id)


async def queue_score(on: Running, run_id: str) -> float | None:
    redis = await on.jobs.redis()
    score = await redis.zscore(on.jobs.options.queue_name, run_id)
    return None if score is None else float(score)


async def session_messages(on: Running, session: str) -> list[Any]:
    entries = await on.runtime.session_store.entries(session)
    return [e.message for e in entries if isinstance(e, MessageEntry)]


def unique(prefix: str) -> str:
    return f"{prefix}-{time.monotonic_ns()}"


# --- reports of background runs [AP-43] -----------------------------------------------------


async def test_a_run_with_delivery_reports_its_answer_at_least_once(env: JobsEnv) -> None:
    async with started(env) as on:
        _, prompt = plan(answer="Disk 91% full")
        session = unique("s")
        args = await enqueue(on, prompt, session=session, deliver=True)
        assert await run_job(on, args) == {"run_id": args, "status": "complete"}
        [report] = inbox(on)
        assert report.source is ReportSource.JOB
        assert (report.run_id, report.session_id) == (args, session)
        assert report.text == "Disk 91% full after 0 rounds"
        assert report.key == f"{args}:job:completed:{report.outcome.steps_used}"
        assert report.outcome.status == "completed"

        # the same job delivered again (a worker died after the run): reported once
        assert (await run_job(on, args))["status"] == "complete"
        assert len(inbox(on)) == 1
        # ... unless the first delivery died before it could report: then it reports now
        redis = await on.jobs.redis()
        assert await redis.delete(f"{env.prefix}reported:{args}") == 1
        assert (await run_job(on, args))["status"] == "complete"
        assert [r.key for r in inbox(on)] == [report.key] * 2  # same key: receivers dedupe


async def test_runs_without_delivery_and_silent_answers_report_nothing(env: JobsEnv) -> None:
    async with started(env) as on:
        _, loud = plan(answer="Something happened")
        assert (await run_job(on, await enqueue(on, loud)))["status"] == "complete"
        _, quiet = plan(answer="HEARTBEAT_OK")  # "HEARTBEAT_OK after 0 rounds" is silent
        args = await enqueue(on, quiet, deliver=True, origin="heartbeat")
        assert (await run_job(on, args))["status"] == "complete"
        assert await outcome_text(on, args) == "HEARTBEAT_OK after 0 rounds"
        _, budget = plan(rounds=[[["effect", str(i)]] for i in range(20)])
        stopped = await enqueue(on, budget, deliver=True, max_steps=1)
        assert (await run_job(on, stopped))["status"] == "complete"
        assert (await on.jobs.get(stopped)).outcome.status == "budget_exhausted"  # type: ignore[union-attr]
        assert inbox(on) == []


async def test_a_paused_run_reports_its_calls_and_the_resume_reports_the_answer(
    env: JobsEnv,
) -> None:
    """Reference: ``execute_resume_finishes_a_paused_run``."""
    async with started(env) as on:
        session = unique("pause")
        _, prompt = plan(rounds=[[["send", "x"]]], answer="sent it")
        args = await enqueue(on, prompt, session=session, deliver=True)
        assert (await run_job(on, args))["status"] == "awaiting_approval"
        [paused] = inbox(on)
        assert paused.source is ReportSource.JOB
        assert paused.text.splitlines()[0] == APPROVAL_HEADER
        assert "needs approval" in paused.text
        assert paused.text.splitlines()[1] == '- send {"delay":0.0,"key":"x"}'

        record = await on.jobs.get(args)
        [waiting] = record.awaiting
        await on.jobs.enqueue_resume(args, [ApprovalDecision.approve(waiting.call_id)])
        redis = await on.jobs.redis()
        queued = await redis.zrange(on.jobs.options.queue_name, 0, -1)
        [job_id] = [j.decode() for j in queued if j.decode().startswith(f"{args}:resume:")]
        ctx = on.job_ctx(job_id)  # the resume job, run here
        assert (await agent_resume(ctx, args))["status"] == "complete"
        _, resumed = inbox(on)
        assert resumed.source is ReportSource.RESUME
        assert resumed.key.startswith(f"{args}:resume:")
        assert resumed.key != paused.key
        assert (resumed.run_id, resumed.session_id) == (args, session)
        assert resumed.text == "sent it after 1 rounds"
        roles = [m.role for m in await session_messages(on, session)]
        assert roles == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]  # 4 messages


async def test_a_failing_or_hanging_delivery_never_fails_the_run(
    env: JobsEnv, caplog: pytest.LogCaptureFixture
) -> None:
    broken = Broken()
    for delivery in (broken, Stuck()):
        async with started(env, delivery=delivery) as on:
            _, prompt = plan(answer="worth telling")
            args = await enqueue(on, prompt, deliver=True)
            begun = time.monotonic()
            with caplog.at_level(logging.ERROR, logger="agent_plugin.delivery"):
                result = await run_job(on, args)
            assert result == {"run_id": args, "status": "complete"}
            assert time.monotonic() - begun < 5
            record = await on.jobs.get(args)  # type: ignore[union-attr]
            assert (record.status, record.attempt, record.error) == ("complete", 1, None)
        assert any(f"cannot deliver report {args}:job" in r.getMessage() for r in caplog.records)
    assert broken.calls == 1  # tried once; a failed delivery is not retried


async def test_the_runtime_delivers_to_the_log_by_default_and_closes_its_delivery(
    env: JobsEnv,
) -> None:
    plugin = make_plugin(env.environ, delivery=None, heartbeat=None, followups=None)
    runtime = await plugin.start()
    await runtime.aclose()
    assert isinstance(runtime.delivery, LogDelivery)
    closable = Closable()
    plugin = make_plugin(env.environ, delivery=closable, heartbeat=None, followups=None)
    runtime = await plugin.start()
    assert runtime.delivery is closable
    await runtime.aclose()
    assert closable.closed == 1


# --- the heartbeat's run: read-only, reported with source heartbeat [AP-44, AP-45] ----------


async def test_a_heartbeat_run_is_denied_actions_and_reports_with_source_heartbeat(
    env: JobsEnv,
) -> None:
    """Reference: ``noteworthy_heartbeat_is_delivered_and_stays_read_only``, as jobs."""
    heartbeat = Heartbeat.every(60, session="ops")
    async with started(env, heartbeat=heartbeat, policy=AllowAll()) as on:
        assert isinstance(on.runtime.agent_for(AgentOverrides(read_only=True)).policy, Strictest)
        session = unique("ops")
        _, prompt = plan(rounds=[[["effect", "restart"]]], answer="Server is down", echo=True)
        args = await enqueue(on, prompt, session=session, deliver=True, origin="heartbeat")
        assert (await run_job(on, args))["status"] == "complete"
        assert not [line for line in env.lines("tool_start") if line.args[0] == args]
        [report] = inbox(on)
        assert report.source is ReportSource.HEARTBEAT
        assert report.session_id == session
        assert report.text.startswith("Server is down after 1 rounds | ")
        assert READ_ONLY_REASON in report.text
        assert len(await session_messages(on, session)) == 4

        # a request run of the same app may act: only heartbeat runs are read-only
        _, acting = plan(rounds=[[["effect", "restart"]]])
        request = await enqueue(on, acting, session=session)
        assert (await run_job(on, request))["status"] == "complete"
        assert [line.args[2] for line in env.lines("tool_start") if line.args[0] == request]

    # allow_actions lifts the read-only rule (but keeps the app policy)
    _, prompt = plan(rounds=[[["effect", "restart"]]])
    acting_heartbeat = Heartbeat.every(60, prompt=prompt).allow_actions()
    async with started(env, heartbeat=acting_heartbeat, policy=AllowAll()) as on:
        ticked = await agent_heartbeat(on.job_ctx(unique("agent_heartbeat")))
        assert ticked["status"] == "started"
        assert (await run_job(on, ticked["run_id"]))["status"] == "complete"
        assert [
            line.args[2] for line in env.lines("tool_start") if line.args[0] == ticked["run_id"]
        ]

    # a heartbeat run left in the queue after the heartbeat was removed stays read-only
    async with started(env, policy=AllowAll()) as on:
        _, prompt = plan(rounds=[[["effect", "late"]]], echo=True)
        args = await enqueue(on, prompt, origin="heartbeat")
        assert (await run_job(on, args))["status"] == "complete"
        assert READ_ONLY_REASON in await outcome_text(on, args)


# --- the heartbeat's cron job ---------------------------------------------------------------


async def test_the_heartbeat_job_without_the_plugin_is_a_no_op(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Reference: ``heartbeat_task_handler_without_the_plugin_is_a_no_op``."""
    with caplog.at_level(logging.WARNING, logger="agent_plugin.jobs"):
        assert await agent_heartbeat({"job_id": "agent_heartbeat:1"}) == {"status": "not_started"}
    assert "has not started" in caplog.text


async def test_the_heartbeat_job_enqueues_the_installed_heartbeat(env: JobsEnv) -> None:
    """Reference: ``heartbeat_task_handler_runs_the_installed_heartbeat``: a tick enqueues a
    tracked run with the heartbeat's prompt, session and scope, delivery on."""
    session = unique("ops")
    _, prompt = plan(answer="HEARTBEAT_OK")
    heartbeat = Heartbeat.every(1800, prompt=prompt, session=session, memory_scope="u1")
    async with started(env, heartbeat=heartbeat) as on:
        before = await on.agent.heartbeat_stats()
        tick = "agent_heartbeat:1700000000123"
        result = await agent_heartbeat(on.job_ctx(tick))
        run_id = tick_run_id(env.queue, tick)
        assert result == {"status": "started", "run_id": run_id}
        record = await on.jobs.get(run_id)
        assert (record.status, record.origin) == ("queued", "heartbeat")
        assert (record.session_id, record.memory_scope) == (session, "u1")
        args = await stored_args(on, run_id)
        assert (args["prompt"], args["deliver"], args["origin"]) == (prompt, True, "heartbeat")
        assert await queue_score(on, run_id) is not None  # on the queue, due now

        # the next tick finds the check-in still waiting for a worker: skipped, and counted
        result = await agent_heartbeat(on.job_ctx("agent_heartbeat:1700000001123"))
        assert result == {"status": "skipped_busy", "run_id": None}
        stats = await on.agent.heartbeat_stats()
        counts = (stats.started, stats.skipped_busy, stats.skipped_precheck)
        assert counts == (before.started + 1, before.skipped_busy + 1, before.skipped_precheck)
        assert (stats.last_status, stats.last_run_id) == ("skipped_busy", None)
        assert stats.last_tick_at is not None


async def test_a_day_and_weekday_cron_ticks_on_either_and_skips_other_dates(
    env: JobsEnv,
) -> None:
    """``0 9 1 * MON`` is the 1st of each month and every Monday, as in Unix cron: arq fires
    it every day at 9, and the tick of a date that is neither does nothing."""
    _, prompt = plan(answer="HEARTBEAT_OK")
    heartbeat = Heartbeat.cron("0 9 1 * MON", prompt=prompt, session=unique("cron"))
    assert heartbeat.cron_fields()["day"] is None
    assert heartbeat.cron_fields()["weekday"] is None

    def at(day: datetime) -> dict[str, Any]:
        ms = int(day.timestamp() * 1000)
        return {**on.job_ctx(f"agent_heartbeat:{ms}"), "score": ms}

    async with started(env, heartbeat=heartbeat) as on:
        before = (await on.agent.heartbeat_stats()).started
        tuesday = datetime(2026, 12, 8, 9, tzinfo=UTC)  # neither the 1st nor a Monday
        assert await agent_heartbeat(at(tuesday)) == {"status": "not_scheduled"}
        assert (await on.agent.heartbeat_stats()).started == before
        monday = datetime(2026, 12, 7, 9, tzinfo=UTC)
        assert (await agent_heartbeat(at(monday)))["status"] == "started"
        assert (await on.agent.heartbeat_stats()).started == before + 1


async def test_ticks_are_skipped_only_while_a_run_of_the_session_is_active(env: JobsEnv) -> None:
    session = unique("busy")
    async with started(env, heartbeat=Heartbeat.every(60, session=session)) as on:
        jobs = on.jobs
        redis = await jobs.redis()
        assert not await jobs.session_active(session)
        assert not await jobs.session_active(None)  # no session: never busy

        # a follow-up booked for later does not count until its time has come
        _, prompt = plan()
        args = RunArgs.checked(prompt, overrides={"session": session})
        later = await jobs.enqueue(new_run_id(), args, delay=600)
        assert not await jobs.session_active(session)
        async with jobs.store.database.write() as conn:  # its time came: due, as its record says
            await conn.execute(
                sa.update(RunRow)
                .where(RunRow.run_id == later.run_id)
                .values(lease_until=datetime.now(UTC) - timedelta(seconds=1))
            )
        assert await jobs.session_active(session)  # due: waiting for a worker
        await jobs.store.cancel(later.run_id, "test")
        assert not await jobs.session_active(session)

        # a run of the session in progress (its worker holds it, whatever Redis says)
        other = await jobs.enqueue(new_run_id(), args)
        await redis.zrem(env.queue, other.run_id)  # (no worker here takes it)
        await jobs.store.start(other.run_id, job_id=other.run_id, lease=30)
        assert await jobs.session_active(session)
        tick = await agent_heartbeat(on.job_ctx(unique("agent_heartbeat")))
        assert tick["status"] == "skipped_busy"
        await jobs.store.finish(other.run_id, Completed(text="x", steps_used=1, usage=TokenUsage()))
        assert not await jobs.session_active(session)
        tick = await agent_heartbeat(on.job_ctx(unique("agent_heartbeat")))
        assert tick["status"] == "started"


async def test_a_precheck_skips_or_fails_the_tick_without_enqueueing(env: JobsEnv) -> None:
    calls: list[object] = []

    def nothing_new(state: object) -> bool:
        calls.append(state)
        return False

    def broken(state: object) -> bool:
        raise RuntimeError("orders database is down")

    async with started(env, heartbeat=Heartbeat.every(60).precheck(nothing_new)) as on:
        before = await on.jobs.heartbeat_stats()
        tick = unique("agent_heartbeat")
        assert (await agent_heartbeat(on.job_ctx(tick)))["status"] == ("skipped_precheck")
        assert calls == [on.runtime]  # the precheck gets the runtime as the app state
        with pytest.raises(AgentError) as caught:
            await on.jobs.get(tick_run_id(env.queue, tick))
        assert caught.value.kind is ErrorKind.NOT_FOUND
    async with started(env, heartbeat=Heartbeat.every(60).precheck(broken)) as on:
        result = await agent_heartbeat(on.job_ctx(unique("agent_heartbeat")))
        assert result["status"] == "failed"
        assert "orders database is down" in result["error"]
        after = await on.jobs.heartbeat_stats()
    assert after.skipped_precheck == before.skipped_precheck + 1
    assert after.failed == before.failed + 1
    assert after.last_status == "failed"


async def test_one_tick_enqueued_by_two_workers_is_one_run(env: JobsEnv) -> None:
    """A fleet tick has one arq job id for every worker; its run id derives from it."""
    async with started(env, heartbeat=Heartbeat.every(60)) as on:
        tick_id = unique("agent_heartbeat")
        first = await tick(on.jobs, on.runtime, Heartbeat.every(60), tick_id)
        second = await tick(on.jobs, on.runtime, Heartbeat.every(60), tick_id)
        assert first == second == {"status": "started", "run_id": tick_run_id(env.queue, tick_id)}
        assert tick_run_id(env.queue, tick_id) != tick_run_id("other:queue", tick_id)
        assert tick_run_id(env.queue, tick_id) != tick_run_id(env.queue, tick_id + "1")
        assert re.fullmatch(r"run_[0-9a-f]{32}", tick_run_id(env.queue, tick_id))


# --- worker settings and startup checks -----------------------------------------------------


def test_worker_settings_register_the_heartbeat_cron_job(env: JobsEnv) -> None:
    settings = make_plugin(env.environ, heartbeat=Heartbeat.every(1)).worker_settings()
    [job] = settings.cron_jobs
    assert job.name == AGENT_HEARTBEAT == "agent_heartbeat"
    assert job.coroutine is agent_heartbeat
    assert job.unique is True  # one tick per schedule across the fleet
    assert job.run_at_startup is False  # missed ticks are never replayed
    assert job.second is None  # every second
    assert job.minute is None
    assert job.max_tries == 1
    assert job.keep_result_s == 60
    assert settings.timezone == ZoneInfo("UTC")
    assert [f.name for f in settings.functions] == [AGENT_RUN, AGENT_RESUME]
    # arq's Worker takes the current event loop and puts its SIGINT/SIGTERM handlers on it: give
    # it a loop of this test's own and close it here, in the main thread. Left open, that loop is
    # collected later, in whatever thread the garbage collector happens to run (a to_thread of a
    # later test), where its close() cannot restore the signal handlers: pytest then fails that
    # later test with an unraisable ValueError from BaseEventLoop.__del__.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        worker = create_worker(settings)  # arq accepts it (no connection yet)
        assert worker.loop is loop
        assert set(worker.functions) == {AGENT_RUN, AGENT_RESUME, AGENT_HEARTBEAT}
        assert worker.timezone == ZoneInfo("UTC")
    finally:
        asyncio.set_event_loop(None)
        loop.close()

    oslo = Heartbeat.cron("0 */30 8-18 * * MON-FRI", timezone="Europe/Oslo").per_replica()
    settings = make_plugin(env.environ, heartbeat=oslo).worker_settings()
    [job] = settings.cron_jobs
    assert job.unique is False
    assert job.keep_result_s == 0
    assert (job.second, job.minute, job.hour) == ({0}, {0, 30}, set(range(8, 19)))
    assert job.weekday == {0, 1, 2, 3, 4}  # arq counts from Monday = 0
    assert settings.timezone == ZoneInfo("Europe/Oslo")

    none = make_plugin(env.environ, heartbeat=None).worker_settings()
    assert none.cron_jobs == []
    assert not hasattr(none, "timezone")


def test_worker_settings_keep_other_cron_jobs_and_refuse_another_timezone(env: JobsEnv) -> None:
    from arq.cron import cron

    async def nightly(ctx: dict[str, Any]) -> None:
        return None

    mine = cron(nightly, name="nightly", hour={3}, minute={0})
    plugin = make_plugin(env.environ, heartbeat=Heartbeat.every(60))
    settings = plugin.worker_settings(cron_jobs=[mine])
    assert [job.name for job in settings.cron_jobs] == [AGENT_HEARTBEAT, "nightly"]
    assert plugin.worker_settings(timezone=ZoneInfo("UTC")).timezone == ZoneInfo("UTC")
    with pytest.raises(AgentError, match="differs from the heartbeat's"):
        plugin.worker_settings(timezone=ZoneInfo("Asia/Tokyo"))


async def test_startup_rejects_a_misconfigured_always_on_setup(env: JobsEnv) -> None:
    def starting(**plugin: Any) -> Any:
        return make_plugin(env.environ, **{"heartbeat": None, "followups": None, **plugin})

    broken = Heartbeat.every(60)
    object.__setattr__(broken, "prompt", "  ")  # past the checks made when it was built
    cases: list[tuple[dict[str, Any], str]] = [
        ({"heartbeat": "*/5 * * * *"}, "heartbeat must be a Heartbeat"),
        ({"heartbeat": broken}, "invalid heartbeat: the heartbeat prompt must not be blank"),
        ({"delivery": object()}, "delivery must have an async deliver(report) method"),
        ({"followups": timedelta(seconds=30)}, "at least one minute"),
        ({"followups": 3600}, "at least one minute"),
    ]
    for fields, message in cases:
        plugin = starting(**fields)
        with pytest.raises(AgentError) as caught:
            await plugin.start()  # the app's startup and the worker's
        assert caught.value.kind is ErrorKind.CONFIG
        assert caught.value.message.startswith("the agent plugin could not start: ")
        assert message in caught.value.message, caught.value.message
        with pytest.raises(AgentError, match=re.escape(message)):
            plugin.worker_settings()  # the worker module's import
        app = make_app(plugin)
        with pytest.raises(AgentError, match=re.escape(message)):
            async with app.router.lifespan_context(app):
                pass

    # a heartbeat or follow-ups without background runs could never run
    off: list[tuple[dict[str, Any], str]] = [
        ({"heartbeat": Heartbeat.every(60)}, "a heartbeat needs background runs"),
        ({"followups": timedelta(hours=1)}, "follow-ups need background runs"),
    ]
    for needs, message in off:
        plugin = AgentPlugin(session_store=InMemorySessionStore(), model=ScriptedModel(), **needs)
        assert plugin.job_options() is None
        with pytest.raises(AgentError, match=re.escape(message)):
            await plugin.start()

    # invalid schedules cannot even be built, so the module defining the app fails first
    with pytest.raises(AgentError, match="at least one second"):
        Heartbeat.every(0.5)
    with pytest.raises(AgentError, match="invalid cron expression"):
        Heartbeat.cron("61 * * * *")


# --- follow-ups [AP-46] ---------------------------------------------------------------------


async def test_a_followup_is_booked_as_a_deferred_tracked_run_one_link_deeper(
    env: JobsEnv,
) -> None:
    async with started(env, followups=timedelta(hours=1)) as on:
        jobs = on.jobs
        session = unique("chat")
        _, later = plan(answer="checked the deploy again")
        _, prompt = plan(rounds=[[followup_call(1, later)]], answer="booked", echo=True)
        parent = await enqueue(
            on, prompt, session=session, memory_scope="u1", origin="followup", followup_depth=2
        )
        booked_at = time.time()
        assert (await run_job(on, parent))["status"] == "complete"
        result = booked(await outcome_text(on, parent))
        assert result["scheduled"] is True
        assert result["in_minutes"] == 1
        run_id = result["run_id"]

        # a deferred arq job, one minute out, whose payload is only the run id
        score = await queue_score(on, run_id)
        assert score is not None
        assert abs(score / 1000 - (booked_at + 60)) < 5
        redis = await jobs.redis()
        job = await redis.get(f"arq:job:{run_id}")
        assert job is not None
        assert json.loads(job)["a"] == [run_id]
        record = await jobs.get(run_id)
        assert (record.status, record.origin) == ("queued", "followup")
        assert (record.session_id, record.memory_scope) == (session, "u1")
        args = await stored_args(on, run_id)
        assert (args["overrides"]["followup_depth"], args["deliver"], args["prompt"]) == (
            3,
            True,
            later,
        )
        assert not await jobs.session_active(session)  # waiting for its time holds nothing

        # the same booking call made again (a retried job) books nothing new
        plan_again = FollowupPlan(
            delay_seconds=600,
            prompt="x",
            depth=3,
            session=session,
            parent_run_id=parent,
            step=0,
            call_id="u1r0c0",
        )
        assert plan_again.derived_run_id() == run_id
        assert await jobs.enqueue_followup(plan_again) == run_id
        assert (await stored_args(on, run_id))["prompt"] == later  # unchanged
        assert await queue_score(on, run_id) == score

        # when its time comes it runs in the session, with delivery on
        await bring_forward(jobs, run_id)
        assert (await run_job(on, run_id))["status"] == "complete"
        reports = [r for r in inbox(on) if r.run_id == run_id]
        [report] = reports
        assert report.source is ReportSource.FOLLOWUP
        assert report.session_id == session
        assert report.text == "checked the deploy again after 0 rounds"
        users = [m for m in await session_messages(on, session) if m.role is Role.USER]
        assert [m.text for m in users] == [prompt, later]


async def test_the_eleventh_link_of_a_chain_is_refused(env: JobsEnv) -> None:
    async with started(env, followups=timedelta(hours=1)) as on:
        _, next_link = plan()
        _, prompt = plan(rounds=[[followup_call(1, next_link)]], echo=True)
        tenth = await enqueue(on, prompt, origin="followup", followup_depth=9)
        assert (await run_job(on, tenth))["status"] == "complete"
        run_id = booked(await outcome_text(on, tenth))["run_id"]
        assert (await stored_args(on, run_id))["overrides"]["followup_depth"] == 10

        eleventh = await enqueue(on, prompt, origin="followup", followup_depth=10)
        assert (await run_job(on, eleventh))["status"] == "complete"
        assert booked(await outcome_text(on, eleventh)) == {"error": FOLLOWUP_REFUSAL}
        # and the tool's own checks reach the model the same way
        _, bad = plan(rounds=[[followup_call(61, "x")]], echo=True)
        args = await enqueue(on, bad)
        assert (await run_job(on, args))["status"] == "complete"
        assert booked(await outcome_text(on, args)) == {
            "error": "delay_minutes must be a whole number from 1 to 60"
        }


async def test_a_followup_does_not_hold_its_session_under_the_reject_policy(
    env: JobsEnv,
) -> None:
    """The booking run holds its session; the follow-up it books must not be refused for it,
    nor keep the session from other runs while it waits."""
    reject = {"AGENT_SESSION_LOCK": "reject"}
    async with started(env, reject, followups=timedelta(hours=1)) as on:
        jobs = on.jobs
        session = unique("locked")
        _, later = plan()
        _, prompt = plan(rounds=[[followup_call(30, later)]], echo=True)
        handle = await jobs.enqueue(
            new_run_id(), RunArgs.checked(prompt, overrides={"session": session})
        )
        ctx = on.job_ctx(handle.run_id)
        assert (await agent_run(ctx, handle.run_id))["status"] == "complete"
        result = booked(await outcome_text(on, handle.run_id))
        assert result.get("scheduled") is True, result
        _, other = plan()
        args = RunArgs.checked(other, overrides={"session": session})
        assert await jobs.enqueue(new_run_id(), args)  # not 409


async def test_request_runs_get_the_followup_tool_and_book_in_their_session(
    env: JobsEnv,
) -> None:
    async with started(env, followups=timedelta(minutes=30)) as on:
        handle = on.agent
        assert "schedule_followup" in handle.tool_names()
        [info] = [t for t in handle.agent().tools if t.name == "schedule_followup"]
        assert info.input_schema["properties"]["delay_minutes"]["maximum"] == 30  # type: ignore[index, call-overload]
        session = unique("chat")
        _, later = plan()
        _, prompt = plan(rounds=[[followup_call(5, later)]], echo=True)
        outcome = (await handle.chat(session, prompt, scope="user-7")).outcome
        assert outcome.status == "completed"
        run_id = booked(outcome.text)["run_id"]  # type: ignore[union-attr]
        record = await handle.run_status(run_id)
        assert (record.origin, record.session_id, record.memory_scope) == (
            "followup",
            session,
            "user-7",
        )
        assert (await stored_args(on, run_id))["overrides"]["followup_depth"] == 1
    async with started(env) as on:  # no followups: no tool
        assert "schedule_followup" not in on.agent.tool_names()


async def test_the_followups_builder_sets_the_longest_delay(env: JobsEnv) -> None:
    plugin = make_plugin(env.environ, heartbeat=None, followups=None)
    assert plugin.followups(timedelta(minutes=5)) is plugin
    runtime = await plugin.start()
    try:
        [tool] = [t for t in runtime.agent_for().tools if t.name == "schedule_followup"]
        assert tool.input_schema["properties"]["delay_minutes"]["maximum"] == 5  # type: ignore[index, call-overload]
    finally:
        await runtime.aclose()


async def test_a_followup_without_a_job_runtime_is_a_tool_error() -> None:
    """Reference: ``followup_without_a_job_runtime_reports_a_tool_error``, through a runtime
    whose background runs are off."""
    model = ScriptedModel(
        [tool_call("schedule_followup", {"delay_minutes": 5, "prompt": "check"}), "ok"]
    )
    runtime = AgentRuntime(
        settings=AgentSettings.model_construct(),
        client=model,
        session_store=InMemorySessionStore(),
        followups=timedelta(hours=1),
    )
    agent: Agent = runtime.agent_for()
    outcome = (await agent.run("book it")).outcome
    assert outcome.status == "completed"
    tool_message = model.requests[1].messages[-1]
    [part] = tool_message.content
    assert json.loads(part.tool_result.content) == {  # type: ignore[union-attr]
        "error": "cannot schedule the follow-up: background runs are off for this plugin, so "
        "nothing can run later"
    }


# --- acceptance: real arq worker processes --------------------------------------------------


def heartbeat_env(directory: Path, **knobs: str) -> JobsEnv:
    """An environment on a Redis database of its own: arq names a fleet tick's job
    ``agent_heartbeat:<time>`` per Redis database, not per queue."""
    return jobs_env(directory, redis_url=redis_db(), **knobs)


def start_workers(*workers: WorkerProcess) -> None:
    for worker in workers:
        worker.start(wait=False)
    for worker in workers:
        worker.wait_ready()


def tick_seconds(env: JobsEnv) -> dict[int, list[str]]:
    """A fleet heartbeat's jobs that ran, by the whole second they were scheduled for, which
    arq writes in the tick's job id: ``agent_heartbeat:<scheduled unix ms>``.

    Not by the job's score: arq defers a tick it enqueues ahead of its time to that time, but
    gives one it enqueues late (every worker's event loop stalled past the tick's second, as
    on a loaded machine) the enqueue time as its score, and runs the next tick right after it;
    both then land in one second, which reads as a doubled tick and a missed one."""
    ticks: dict[int, list[str]] = {}
    for line in env.lines("heartbeat_job"):
        job_id = line.args[0]
        name, _, scheduled_ms = job_id.rpartition(":")
        assert name == AGENT_HEARTBEAT, job_id
        ticks.setdefault(int(scheduled_ms) // 1000, []).append(job_id)
    return ticks


def replica_tick_seconds(env: JobsEnv) -> dict[int, list[str]]:
    """A per-replica heartbeat's jobs that ran, by the whole second of their score. arq gives
    these jobs random ids, so the score is all there is: the scheduled time for a tick enqueued
    on time (ahead of its time, deferred to it), the enqueue time for one a stalled worker
    enqueued more than a second late."""
    ticks: dict[int, list[str]] = {}
    for line in env.lines("heartbeat_job"):
        job_id, score = line.args
        ticks.setdefault(int(score) // 1000, []).append(job_id)
    return ticks


async def stats_of(env: JobsEnv) -> HeartbeatStats:
    client = aioredis.Redis.from_url(env.redis_url)
    try:
        raw = await client.hgetall(f"{env.prefix}heartbeat")
    finally:
        await client.aclose()
    values = {k.decode(): v.decode() for k, v in raw.items() if v}
    return HeartbeatStats.model_validate(values)


async def wait_for(check: Any, within: float, what: str) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.05)


async def settle(check: Any, within: float) -> Any:
    """``check()`` once it holds, or after ``within`` seconds: the caller asserts on it."""
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value or time.monotonic() >= deadline:
            return value
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_a_fleet_heartbeat_ticks_once_per_second_and_per_replica_once_per_worker(
    tmp_path: Path,
) -> None:
    """Two workers each: ``every(1)`` ticks once a second in total; a per-replica cron
    heartbeat (every second, Oslo time) once a second on each worker. Silent answers
    (``HEARTBEAT_OK``) are never delivered."""
    fleet_tag, fleet_prompt = plan(answer="HEARTBEAT_OK")
    replica_tag, replica_prompt = plan(answer="HEARTBEAT_OK")
    (tmp_path / "fleet").mkdir()
    (tmp_path / "replica").mkdir()
    fleet = heartbeat_env(tmp_path / "fleet", heartbeat="every:1", heartbeat_prompt=fleet_prompt)
    replica = heartbeat_env(
        tmp_path / "replica",
        heartbeat="cron:* * * * * *",
        heartbeat_timezone="Europe/Oslo",
        heartbeat_per_replica="1",
        heartbeat_prompt=replica_prompt,
    )
    workers = [WorkerProcess(e, name=f"w{i}") for e in (fleet, replica) for i in (1, 2)]
    try:
        start_workers(*workers)
        first = math.ceil(time.time()) + 1  # the window: five whole seconds, all workers up
        window = range(first, first + 5)
        await asyncio.sleep(first + 5 + 1.5 - time.time())
        # a loaded machine may run a tick of the window later still; a missed one never comes
        await settle(lambda: _window_ran(fleet, replica, window), 15)

        fleet_ticks = tick_seconds(fleet)
        assert [len(fleet_ticks.get(s, [])) for s in window] == [1] * 5, fleet_ticks
        assert all(
            job == f"agent_heartbeat:{s * 1000 + 123}" for s, t in fleet_ticks.items() for job in t
        )
        replica_ticks = replica_tick_seconds(replica)
        assert [len(replica_ticks.get(s, [])) for s in window] == [2] * 5, replica_ticks

        # every tick started a check-in run on the workers; none had anything to say
        stats = await stats_of(fleet)
        assert stats.started >= 5
        assert stats.skipped_busy == stats.failed == 0
        await wait_for(lambda: _model_ends(fleet, fleet_tag, 5), 15, "five fleet check-ins")
        await wait_for(lambda: _model_ends(replica, replica_tag, 10), 15, "ten replica check-ins")
        assert fleet.delivered() == replica.delivered() == []
    finally:
        for worker in workers:
            worker.stop()
        clean_redis(fleet)
        clean_redis(replica)


async def test_a_heartbeat_that_asks_for_an_action_is_denied_reported_and_never_doubled(
    tmp_path: Path,
) -> None:
    """Two workers, one read-only heartbeat in a session: each scheduled second ticks once
    across both; the model asks for an external-effect tool, gets it denied and reports with
    source heartbeat; ticks while that run is active are skipped and counted."""
    session = unique("ops")
    tag, prompt = plan(
        rounds=[[["effect", "restart"]]],
        answer="The disk is full",
        echo=True,
        model_delay=0.8,  # the run outlasts a tick or two
    )
    # The library's default lease, not the tests' 2 s: a delivery whose worker has not renewed
    # its claim for a lease is taken for dead and its run taken over by the other worker (at
    # least once, by design), and a loaded machine can stall a worker for 2 s; that takeover
    # reads as two check-ins at once. Worker death is tested in tests/test_jobs_faults.py.
    env = heartbeat_env(
        tmp_path,
        heartbeat="every:1",
        heartbeat_session=session,
        heartbeat_prompt=prompt,
        lease="15",
    )
    workers = [WorkerProcess(env, name="w1"), WorkerProcess(env, name="w2")]
    try:
        await asyncio.to_thread(start_workers, *workers)
        reports = await wait_for(lambda: _delivered(env), 15, "a heartbeat report")
        report = reports[0]
        assert report["source"] == "heartbeat"
        assert report["session_id"] == session
        assert report["key"].startswith(f"{report['run_id']}:heartbeat:")
        assert report["text"].startswith("The disk is full after 1 rounds | ")
        assert READ_ONLY_REASON in report["text"]
        assert not [line for line in env.lines("tool_start") if line.args[2] == "effect"]

        stats = await wait_for(lambda: _skipped(env), 10, "a skipped tick")
        assert stats.started >= 1
        # never two check-ins of the session at once: model calls start and end in turn
        calls = [x.event for x in env.lines() if x.event.startswith("model_") and x.args[0] == tag]
        assert all(a != b for a, b in itertools.pairwise(calls)), calls
        # one tick per scheduled second, not one per worker, and none missed: four scheduled
        # seconds in a row from the first tick each ran (a missed tick never comes, so a gap
        # stays; a tick a stalled worker runs late, after the next one, fills it then)
        ticks = await settle(lambda: _ticks_in_a_row(env, 4), 15) or tick_seconds(env)
        assert all(len(jobs) == 1 for jobs in ticks.values()), ticks
        assert len(ticks) >= 4, ticks
        assert sorted(ticks) == list(range(min(ticks), max(ticks) + 1)), ticks
    finally:
        await asyncio.to_thread(_stop, *workers)
        clean_redis(env)


async def _ticks_in_a_row(env: JobsEnv, count: int) -> dict[int, list[str]] | None:
    ticks = tick_seconds(env)
    if len(ticks) >= count and sorted(ticks) == list(range(min(ticks), max(ticks) + 1)):
        return ticks
    return None


async def _window_ran(fleet: JobsEnv, replica: JobsEnv, window: range) -> bool:
    fleet_ticks, replica_ticks = tick_seconds(fleet), replica_tick_seconds(replica)
    return all(s in fleet_ticks and len(replica_ticks.get(s, [])) >= 2 for s in window)


async def _model_ends(env: JobsEnv, tag: str, count: int) -> bool:
    return len([x for x in env.lines("model_end") if x.args[0] == tag]) >= count


def _stop(*workers: WorkerProcess) -> None:
    for worker in workers:
        worker.stop()


async def _delivered(env: JobsEnv) -> list[dict[str, Any]]:
    return env.delivered()


async def _skipped(env: JobsEnv) -> HeartbeatStats | None:
    stats = await stats_of(env)
    return stats if stats.skipped_busy >= 1 else None


async def test_webhook_reports_arrive_signed_and_failing_receivers_do_not_fail_runs(
    tmp_path: Path,
) -> None:
    env = jobs_env(tmp_path)
    async with HttpServer(default=Reply(204)) as server:
        server.queue(Reply(204), Reply(500, body="boom"), Hang())
        worker = WorkerProcess(
            env,
            extra={
                "JOBS_TEST_WEBHOOK": f"{server.url}/hooks/T0/tok-123",
                "JOBS_TEST_WEBHOOK_TIMEOUT": "0.5",
                "AGENT_WEBHOOK_SECRET": SECRET,
            },
        )
        await asyncio.to_thread(worker.start)
        try:
            async with make_plugin(env.environ, delivery=None).open() as handle:
                session = unique("hooks")
                ids: list[str] = []
                for count, text in enumerate(("first", "second", "third"), 1):
                    _, prompt = plan(answer=text)
                    ids.append((await handle.enqueue(prompt, deliver=True, session=session)).run_id)
                    await wait_for(lambda: _count(server, count), 15, text)  # noqa: B023
                for run_id in ids:
                    await wait_for(lambda: _finished(handle, run_id), 15, "the runs")  # noqa: B023
                records = [await handle.run_status(run_id) for run_id in ids]
                assert [r.status for r in records] == ["complete"] * 3
                assert [r.attempt for r in records] == [1, 1, 1]  # never re-run for a delivery

                first = server.requests[0]
                assert (first.method, first.path) == ("POST", "/hooks/T0/tok-123")
                assert verify_webhook(
                    SECRET,
                    first.body,
                    timestamp=first.headers[TIMESTAMP_HEADER.lower()],
                    signature=first.headers[SIGNATURE_HEADER.lower()],
                )
                body = first.json()
                assert (body["source"], body["run_id"], body["session_id"]) == (
                    "job",
                    ids[0],
                    session,
                )
                assert body["text"] == "first after 0 rounds"
                assert (
                    first.headers[KEY_HEADER.lower()] == f"{ids[0]}:job:completed:0" == body["key"]
                )
                assert [r.json()["run_id"] for r in server.requests[1:3]] == ids[1:]

                # the worker logged the failures and carried on
                output = await asyncio.to_thread(_wait_output, worker, "did not answer within")
                assert f"cannot deliver report {ids[1]}:job" in output
                assert "answered 500" in output
                assert "tok-123" not in output
                _, prompt = plan(answer="after the failures")
                later = (await handle.enqueue(prompt, deliver=True)).run_id
                await wait_for(lambda: _finished(handle, later), 15, "a later run")
                await wait_for(lambda: _count(server, 4), 5, "the later report")
        finally:
            await asyncio.to_thread(worker.stop)
            clean_redis(env)


async def _finished(handle: AppAgent, run_id: str) -> bool:
    return (await handle.run_status(run_id)).status not in ("queued", "in_progress")


async def _count(server: HttpServer, n: int) -> bool:
    return len(server.requests) >= n


def _wait_output(worker: WorkerProcess, text: str, within: float = 10) -> str:
    deadline = time.monotonic() + within
    while text not in (output := worker.output()):
        assert time.monotonic() < deadline, output
        time.sleep(0.05)
    return output


async def test_a_followup_booked_for_a_minute_runs_in_a_worker_one_link_deeper(
    tmp_path: Path,
) -> None:
    env = jobs_env(tmp_path, followups="60")
    worker = WorkerProcess(env)
    await asyncio.to_thread(worker.start)
    try:
        async with make_plugin(env.environ).open() as handle:
            session = unique("deploy")
            later_tag, later = plan(answer="the deploy finished")
            _, prompt = plan(rounds=[[followup_call(1, later)]], answer="will check", echo=True)
            parent = (await handle.enqueue(prompt, session=session, scope="u1")).run_id
            await wait_for(lambda: _finished(handle, parent), 15, "the booking run")
            record = await handle.run_status(parent)
            assert record.outcome is not None
            run_id = booked(record.outcome.text or "")["run_id"]

            # a deferred arq job one minute out, tracked, one link deeper
            redis = await handle.jobs.redis()
            score = await redis.zscore(env.queue, run_id)
            assert score is not None
            assert 50 < score / 1000 - time.time() <= 60
            followup = await handle.run_status(run_id)
            assert (followup.status, followup.origin, followup.session_id) == (
                "queued",
                "followup",
                session,
            )
            assert (await stored_args(handle, run_id))["overrides"]["followup_depth"] == 1

            # its minute has passed (we move it forward): the worker runs it and reports
            await bring_forward(handle.jobs, run_id)
            await wait_for(lambda: _finished(handle, run_id), 15, "the follow-up")
            done = await handle.run_status(run_id)
            assert done.status == "complete"
            assert done.outcome is not None
            assert done.outcome.text == "the deploy finished after 0 rounds"
            assert [line.args[0] for line in env.lines("model_end")].count(later_tag) == 1
            [report] = await wait_for(lambda: _delivered(env), 5, "the follow-up's report")
            assert (report["source"], report["run_id"], report["session_id"]) == (
                "followup",
                run_id,
                session,
            )

            # the eleventh link of a chain is refused with the reference's text
            _, deep = plan(rounds=[[followup_call(1, later)]], echo=True)
            eleventh = new_run_id()
            deeper = RunArgs.checked(deep, overrides={"followup_depth": 10}, origin="followup")
            await handle.jobs.enqueue(eleventh, deeper)
            await wait_for(lambda: _finished(handle, eleventh), 15, "the eleventh link")
            refused = await handle.run_status(eleventh)
            assert refused.outcome is not None
            assert booked(refused.outcome.text or "") == {"error": FOLLOWUP_REFUSAL}
    finally:
        await asyncio.to_thread(worker.stop)
        clean_redis(env)


# --- the demo -------------------------------------------------------------------------------


def test_the_always_on_demo_runs_with_one_command() -> None:
    """``python -m example_app.always_on``: memory, an approval round trip, and two heartbeat
    ticks against the scripted model, one silent and one reported (reference: the seed's
    ``always_on_agent`` example)."""
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, "-m", "example_app.always_on"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "user memory: ['Mark; wants to hear at once when the nightly backup fails']" in out
    assert "paused: restart_service {'service': 'web'} needs approval" in out
    assert "approved; agent: The web server was restarted." in out
    assert "tick 1: the agent answered 'HEARTBEAT_OK'" in out
    assert f'restart_service -> {{"error":"denied by policy: {READ_ONLY_REASON}"}}' in out
    assert out.count(">> report to ops (heartbeat): Mark, the nightly backup failed") == 1
    assert "reports delivered: 1 (the silent tick sent none)" in out
