"""Background runs that lost their job or their worker's claim [SPEC §6, HV-01].

What the run's record in the database says wins over what Redis holds: a run whose job
vanished from Redis is queued again by the reconciler, a run a live worker holds is not taken
over when its claim in Redis vanished, and a worker whose run was taken over stops. Real Redis,
a SQLite database, the deliveries in this process or in a worker process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from unittest.mock import patch

import pytest
import sqlalchemy as sa
from arq.worker import Retry

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.ids import new_run_id
from agent_plugin.jobs import AGENT_RUN, RunArgs, agent_run
from agent_plugin.messages import TokenUsage
from agent_plugin.outcomes import Completed
from agent_plugin.records import RunStatus
from agent_plugin.storage import SqlRunStore
from agent_plugin.storage.models import RunRow, utcnow
from tests.jobs_app import (
    LOG_ENV,
    InProcess,
    JobsEnv,
    WorkerProcess,
    clean_redis,
    in_process,
    jobs_env,
    make_plugin,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[JobsEnv]:
    """A fresh database and queue; no worker (tests start one when they need it)."""
    environment = jobs_env(tmp_path, lease="1", reconcile_every="1")
    monkeypatch.setenv(LOG_ENV, str(environment.log))  # the tools run here log too
    try:
        yield environment
    finally:
        clean_redis(environment)


Here = InProcess


def here(env: JobsEnv) -> contextlib.AbstractAsyncContextManager[InProcess]:
    return in_process(make_plugin(env.environ))


def prompt(tag: str, *rounds: list[list[str]], tool_delay: float = 0.0) -> str:
    return json.dumps({"tag": tag, "rounds": list(rounds), "tool_delay": tool_delay})


async def record_only(here: Here, text: str, *, age: float = 5.0) -> str:
    """A run recorded as queued ``age`` seconds ago whose job never reached Redis (the app
    died in between, or Redis lost it)."""
    run_id = new_run_id()
    await here.jobs.store.create(
        run_id, origin="request", args=RunArgs(prompt=text).model_dump(mode="json")
    )
    await backdate(here, run_id, age)
    return run_id


async def backdate(here: Here, run_id: str, age: float) -> None:
    then = utcnow() - timedelta(seconds=age)
    async with here.jobs.store.database.write() as conn:
        await conn.execute(sa.update(RunRow).where(RunRow.run_id == run_id).values(updated_at=then))


async def wait_for(here: Here, run_id: str, *, within: float = 20.0) -> RunStatus:
    deadline = time.monotonic() + within
    while True:
        record = await here.jobs.get(run_id)
        if record.status.finished or record.status is RunStatus.AWAITING_APPROVAL:
            return record.status
        assert time.monotonic() < deadline, record
        await asyncio.sleep(0.05)


def executions(env: JobsEnv, run_id: str) -> list[tuple[str, ...]]:
    return [line.args[2:] for line in env.lines("tool_start") if line.args[0] == run_id]


# --- the reconciler -------------------------------------------------------------------------


async def test_a_run_whose_job_is_missing_gets_it_back_once(env: JobsEnv) -> None:
    async with here(env) as h:
        lost = await record_only(h, prompt("lost", [["effect", "a"]]))
        fresh = await record_only(h, prompt("fresh", [["effect", "b"]]), age=0)
        assert await h.upkeep.reconcile() == [lost]  # not the one recorded just now
        assert await h.redis.zscore(env.queue, lost) is not None
        assert await h.upkeep.reconcile() == []  # it has its job now
        assert await h.redis.zscore(env.queue, fresh) is None


async def test_a_result_left_by_an_earlier_delivery_does_not_block_the_restore(
    env: JobsEnv,
) -> None:
    async with here(env) as h:
        run_id = await record_only(h, prompt("kept", [["effect", "a"]]))
        # arq keeps a result per job id and refuses to enqueue that id again while it does
        await h.redis.set(f"arq:result:{run_id}", b"{}", ex=3600)
        assert await h.redis.enqueue_job(AGENT_RUN, run_id, _job_id=run_id) is None
        assert await h.upkeep.reconcile() == [run_id]
        assert await h.redis.exists(f"arq:job:{run_id}")


async def test_a_lost_job_due_later_is_restored_once_it_is_due(env: JobsEnv) -> None:
    async with here(env) as h:
        later = new_run_id()
        await h.jobs.enqueue(later, RunArgs(prompt=prompt("later", [["effect", "a"]])), delay=3600)
        retried = await record_only(h, prompt("backoff", [["effect", "b"]]))
        await h.jobs.store.start(retried, job_id=retried, lease=1)
        await h.jobs.store.requeue(retried, attempt=1, not_before=30)  # a retry's backoff
        await backdate(h, later, 5)
        await backdate(h, retried, 5)
        await h.redis.delete(env.queue, f"arq:job:{later}")  # Redis lost both jobs
        assert await h.upkeep.reconcile() == []  # neither is due: nothing to run yet
        async with h.jobs.store.database.write() as conn:  # ... until their time has come
            await conn.execute(
                sa.update(RunRow)
                .where(RunRow.run_id.in_([later, retried]))
                .values(lease_until=utcnow() - timedelta(seconds=2))
            )
        assert sorted(await h.upkeep.reconcile()) == sorted([later, retried])
        for run_id in (later, retried):
            score = await h.redis.zscore(env.queue, run_id)
            assert score is not None
            assert score - time.time() * 1000 < 1000  # due now, not in 30 s or an hour


async def test_reconciling_goes_past_a_page_of_runs_that_have_their_job(env: JobsEnv) -> None:
    async with here(env) as h:
        healthy = []
        for i in range(5):  # queued, waiting for a worker, with their jobs in Redis
            run_id = new_run_id()
            await h.jobs.enqueue(run_id, RunArgs(prompt=prompt(f"h{i}", [["effect", "a"]])))
            await backdate(h, run_id, 10)
            healthy.append(run_id)
        lost = await record_only(h, prompt("lost", [["effect", "b"]]), age=5)  # the newest
        with patch("agent_plugin.jobs.upkeep.RECONCILE_PAGE", 2):
            assert await h.upkeep.reconcile() == [lost]


async def test_runs_held_or_claimed_or_paused_are_left_alone(env: JobsEnv) -> None:
    async with here(env) as h:
        held = await record_only(h, prompt("held", [["effect", "a"]]))
        await h.jobs.store.start(held, job_id=held, lease=30)  # a live worker runs it
        claimed = await record_only(h, prompt("claimed", [["effect", "b"]]))
        await h.redis.set(f"arq:in-progress:{claimed}", b"1", px=10_000)  # arq's claim
        assert await h.upkeep.reconcile() == []


async def test_a_worker_queues_a_lost_run_again_and_it_completes(env: JobsEnv) -> None:
    async with here(env) as h:
        run_id = await record_only(h, prompt("worker", [["effect", "w"]]))
        worker = WorkerProcess(env)
        worker.start()
        try:
            assert await wait_for(h, run_id) is RunStatus.COMPLETE
        finally:
            worker.stop()
    assert executions(env, run_id) == [("effect", "w")]


async def test_a_run_redis_forgot_mid_way_continues_from_its_checkpoints(env: JobsEnv) -> None:
    """The worker died and Redis lost the job with it (a restart without persistence): the
    run is in progress in the database only; its lease runs out, the reconciler queues it
    again, and it continues where its checkpoints say."""
    worker = WorkerProcess(env)
    async with here(env) as h:
        text = prompt("forgot", [["effect", "one"]], [["effect", "two"]], tool_delay=0.5)
        run_id = new_run_id()
        await h.jobs.enqueue(run_id, RunArgs(prompt=text))
        worker.start()
        try:
            deadline = time.monotonic() + 20
            while len(executions(env, run_id)) < 2:  # "one" is done, "two" in flight
                assert time.monotonic() < deadline, env.lines()
                await asyncio.sleep(0.02)
            worker.kill()
            await h.redis.delete(
                env.queue, f"arq:job:{run_id}", f"arq:in-progress:{run_id}", f"arq:retry:{run_id}"
            )
            assert (await h.jobs.get(run_id)).status is RunStatus.IN_PROGRESS
            worker.start()
            assert await wait_for(h, run_id) is RunStatus.COMPLETE
        finally:
            worker.stop()
        record = await h.jobs.get(run_id)
    assert record.attempt == 2
    # "one" finished before the worker died and never ran again; "two" was in flight
    assert executions(env, run_id) == [("effect", "one"), ("effect", "two"), ("effect", "two")]


# --- leases ---------------------------------------------------------------------------------


async def test_a_delivery_does_not_take_over_a_run_a_live_worker_holds(env: JobsEnv) -> None:
    async with here(env) as h:
        run_id = await record_only(h, prompt("live", [["effect", "a"]]), age=0)
        await h.jobs.store.start(run_id, job_id=run_id, lease=30)  # held by a live delivery
        # this job's claim in Redis vanished (Redis restarted), so arq delivers it again
        with pytest.raises(Retry) as caught:
            await agent_run(h.job_ctx(run_id), run_id)
        assert caught.value.defer_score is not None
        assert 29_000 < caught.value.defer_score <= 30_200  # when the lease would run out
        record = await h.jobs.get(run_id)
        assert (record.status, record.attempt) == (RunStatus.IN_PROGRESS, 1)
    assert executions(env, run_id) == []


async def test_a_retry_that_comes_early_waits_for_its_backoff(env: JobsEnv) -> None:
    async with here(env) as h:
        run_id = await record_only(h, prompt("early", [["effect", "a"]]), age=0)
        await h.jobs.store.start(run_id, job_id=run_id, lease=30)
        await h.jobs.store.requeue(run_id, attempt=1, not_before=5)  # its worker then died
        with pytest.raises(Retry) as caught:
            await agent_run(h.job_ctx(run_id), run_id)
        assert caught.value.defer_score is not None
        assert 4_000 < caught.value.defer_score <= 5_200
        assert (await h.jobs.get(run_id)).status is RunStatus.QUEUED
    assert executions(env, run_id) == []


async def test_a_delivery_whose_run_was_taken_over_stops_at_once(env: JobsEnv) -> None:
    async with here(env) as h:
        text = json.dumps({"tag": "taken", "rounds": [[["effect", "one"]]], "model_delay": 3.0})
        run_id = await record_only(h, text, age=0)
        delivery = asyncio.create_task(agent_run(h.job_ctx(run_id), run_id))
        deadline = time.monotonic() + 10
        while not env.lines("model_start"):  # the model call is under way
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        async with h.jobs.store.database.write() as conn:  # another delivery took it over
            await conn.execute(
                sa.update(RunRow).where(RunRow.run_id == run_id).values(attempt=RunRow.attempt + 1)
            )
        with pytest.raises(Retry):  # the job stays queued under the delivery that has it now
            await asyncio.wait_for(delivery, 10)
        record = await h.jobs.get(run_id)
        assert (record.status, record.attempt) == (RunStatus.IN_PROGRESS, 2)
    # its lease renewal found the run gone and cancelled the model call mid-way
    assert env.lines("model_end") == []
    assert executions(env, run_id) == []


async def test_a_run_that_cannot_start_fails_instead_of_coming_back(env: JobsEnv) -> None:
    async with here(env) as h:
        session = f"poison-{time.monotonic_ns()}"
        run_id = await session_run(h, session, "poison")
        async with h.jobs.store.database.write() as conn:  # arguments no version can read
            await conn.execute(
                sa.update(RunRow).where(RunRow.run_id == run_id).values(args={"prompt": 5})
            )
        for delivery in range(1, 4):  # max_attempts deliveries: a newer worker may read them
            with pytest.raises(AgentError) as caught:
                await agent_run(h.job_ctx(run_id), run_id)
            assert caught.value.kind is ErrorKind.DECODE
            record = await h.jobs.get(run_id)
            assert record.status is (RunStatus.FAILED if delivery == 3 else RunStatus.QUEUED)
        assert record.error is not None
        assert "do not decode" in record.error.message
        assert not await h.jobs.session_active(session)  # the session is free again
        await backdate(h, run_id, 5)
        assert await h.upkeep.reconcile() == []  # not delivered again and again


async def test_a_redelivery_of_an_ended_run_of_a_session_ends_its_job(env: JobsEnv) -> None:
    async with here(env) as h:
        session = f"left-{time.monotonic_ns()}"
        run_id = await session_run(h, session, "left")
        await h.jobs.store.start(run_id, job_id=run_id, lease=30)
        await h.jobs.store.finish(run_id, Completed(text="x", steps_used=1, usage=TokenUsage()))
        result = await agent_run(h.job_ctx(run_id), run_id)  # its worker died before arq knew
        assert result == {"run_id": run_id, "status": "complete"}
        assert not await h.jobs.session_active(session)


async def session_run(h: Here, session: str, tag: str) -> str:
    run_id = new_run_id()
    args = RunArgs.checked(prompt(tag, [["effect", tag]]), overrides={"session": session})
    await h.jobs.store.create(
        run_id, origin="request", args=args.model_dump(mode="json"), session_id=session
    )
    return run_id


async def test_a_stale_delivery_leaves_the_live_run_of_a_session_alone(env: JobsEnv) -> None:
    async with here(env) as h:
        session = f"stale-{time.monotonic_ns()}"
        run_id = await session_run(h, session, "live")
        await h.jobs.store.start(run_id, job_id=run_id, lease=30)  # a live delivery runs it
        result = await agent_run(h.job_ctx(f"{run_id}:stale"), run_id)  # another job's delivery
        assert result == {"run_id": run_id, "status": "in_progress"}
        record = await h.jobs.get(run_id)
        assert (record.status, record.attempt) == (RunStatus.IN_PROGRESS, 1)


async def test_a_delivery_stopped_while_waiting_for_its_turn_leaves_the_run_alone(
    env: JobsEnv,
) -> None:
    async with here(env) as h:
        session = f"stop-{time.monotonic_ns()}"
        other = await session_run(h, session, "other")
        await h.jobs.store.start(other, job_id=other, lease=30)  # the session is busy
        run_id = await session_run(h, session, "mine")
        waiting = asyncio.create_task(agent_run(h.job_ctx(run_id), run_id))
        await asyncio.sleep(0.3)  # it waits for the session
        waiting.cancel()  # the worker shuts down
        with pytest.raises(asyncio.CancelledError):
            await waiting
        record = await h.jobs.get(run_id)
        assert (record.status, record.attempt) == (RunStatus.QUEUED, 0)  # untouched


async def test_a_run_whose_session_was_taken_between_its_turn_and_its_start_waits(
    env: JobsEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database has the last word: a delivery told it was its turn, whose start is then
    refused because another run of the session started meanwhile, waits for the session
    instead of failing, and runs once the other run ended."""
    async with here(env) as h:
        session = f"race-{time.monotonic_ns()}"
        run_id = await session_run(h, session, "second")
        other = await session_run(h, session, "first")
        store = h.jobs.store
        asked: list[str] = []

        async def always_my_turn(self: SqlRunStore, session_id: str, asking: str) -> bool:
            asked.append(asking)
            return True  # (a stale answer: the other run starts right after it)

        monkeypatch.setattr(SqlRunStore, "session_turn", always_my_turn)  # the worker's too
        started = await store.start(other, job_id=other, lease=30)
        delivery = asyncio.create_task(agent_run(h.job_ctx(run_id), run_id))
        await asyncio.sleep(0.5)
        assert not delivery.done()
        assert len(asked) >= 2  # refused, and asking again
        record = await h.jobs.get(run_id)
        assert (record.status, record.attempt) == (RunStatus.QUEUED, 0)
        await store.finish(
            other, Completed(text="x", steps_used=1, usage=TokenUsage()), attempt=started.attempt
        )
        result = await asyncio.wait_for(delivery, 10)
        assert result == {"run_id": run_id, "status": "complete"}


# --- cancelling -------------------------------------------------------------------------------


async def test_cancelling_a_run_whose_resume_is_queued_takes_the_resume_job_off_the_queue(
    env: JobsEnv,
) -> None:
    """Decisions queue the resume under a job of its own (``<run id>:resume:<id>``); a cancel
    before a worker takes it removes that job, not only the run's own, so nothing is left to
    deliver [HV-01]."""
    async with here(env) as h:
        handle = await h.agent.enqueue(prompt("cr", [["send", "x"]]))
        run_id = handle.run_id
        with contextlib.suppress(Retry):
            await agent_run(h.job_ctx(run_id), run_id)
        record = await h.jobs.get(run_id)
        assert record.status is RunStatus.AWAITING_APPROVAL
        await h.jobs.enqueue_resume(run_id, [])
        queued = [m.decode() for m in await h.redis.zrange(env.queue, 0, -1)]
        resume_jobs = [job for job in queued if job.startswith(f"{run_id}:resume:")]
        assert len(resume_jobs) == 1
        cancelled = await h.jobs.cancel(run_id, "not needed")
        assert cancelled.status is RunStatus.CANCELLED
        assert await h.redis.zrange(env.queue, 0, -1) == []
        assert not await h.redis.exists(f"arq:job:{resume_jobs[0]}")
