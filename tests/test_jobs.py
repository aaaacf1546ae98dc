"""Background runs through a real arq worker process, the real Redis on 127.0.0.1 and a SQLite
database shared by the app (httpx's ASGI transport) and the worker [SPEC §6, AP-47..AP-49,
HV-01].

One worker serves the whole module (its own queue and key prefix, so parallel test sessions do
not collide); each test builds its own app from the same plugin factory (``tests/jobs_app.py``).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from arq.connections import RedisSettings, create_pool
from arq.constants import default_queue_name
from arq.jobs import Job, JobStatus
from arq.worker import Retry, create_worker
from fastapi import FastAPI
from pydantic import ValidationError
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError

from agent_plugin.cancellation import CancelToken
from agent_plugin.config import AgentSettings
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.ids import new_run_id
from agent_plugin.jobs import (
    AGENT_RESUME,
    AGENT_RUN,
    JobOptions,
    RunArgs,
    agent_run,
    progress_of,
    runtime_of,
)
from agent_plugin.jobs.args import checked_run_id
from agent_plugin.jobs.keeper import Keeper
from agent_plugin.jobs.redis import OutageRetry, loads
from agent_plugin.jobs.upkeep import Upkeep
from agent_plugin.live import ControlWatcher, RunControlChannel, stream_key
from agent_plugin.messages import Role
from agent_plugin.options import AgentOverrides
from agent_plugin.outcomes import ApprovalDecision
from agent_plugin.providers.scripted import ScriptedModel
from agent_plugin.sessions import InMemorySessionStore, MessageEntry
from agent_plugin.steering import Steering
from agent_plugin.web import AgentPlugin, AppAgent
from agent_plugin.web.health import AgentHealth
from tests.jobs_app import (
    JobsEnv,
    Line,
    make_app,
    make_plugin,
)
from tests.services import APP_QUEUE_DB, redis_db

pytestmark = pytest.mark.timeout(60)


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env(served_env: JobsEnv) -> JobsEnv:
    """The module's database, queue and log, and one worker process serving them."""
    return served_env


@dataclass
class Served:
    plugin: AgentPlugin
    app: FastAPI
    client: httpx.AsyncClient

    @property
    def handle(self) -> AppAgent:
        return self.plugin.agent(self.app)


@asynccontextmanager
async def serve(env: JobsEnv, **environ: str) -> AsyncIterator[Served]:
    plugin = make_plugin({**env.environ, **environ})
    app = make_app(plugin, runs_route=True)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client,
    ):
        yield Served(plugin, app, client)


@pytest.fixture
async def served(env: JobsEnv) -> AsyncIterator[Served]:
    async with serve(env) as value:
        yield value


@pytest.fixture
async def redis_client(env: JobsEnv) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(env.redis_url)
    yield client
    await client.aclose()


# --- helpers --------------------------------------------------------------------------------

_tags = iter(range(1_000_000))


def plan(**fields: Any) -> tuple[str, str]:
    """A fresh tag and the prompt that makes the scripted model follow ``fields``."""
    tag = f"t{next(_tags)}_{time.monotonic_ns() % 1_000_000}"
    return tag, json.dumps({"tag": tag, **fields})


async def poll(
    client: httpx.AsyncClient,
    path: str,
    until: Callable[[dict[str, Any]], bool] = lambda r: (
        r["status"] not in ("queued", "in_progress")
    ),
    within: float = 15.0,
) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        response = await client.get(path)
        assert response.status_code == 200, response.text
        record: dict[str, Any] = response.json()
        if until(record):
            return record
        assert time.monotonic() < deadline, f"gave up waiting: {record}"
        await asyncio.sleep(0.03)


async def start(served: Served, prompt: str, **body: Any) -> str:
    response = await served.client.post("/agent/runs", json={"prompt": prompt, **body})
    assert response.status_code == 202, response.text
    handle = response.json()
    assert response.headers["location"] == handle["status_path"]
    assert handle["status_path"] == f"/agent/runs/{handle['run_id']}"
    return str(handle["status_path"])


def remove_files(directory: Path, pattern: str) -> None:
    for path in directory.glob(pattern):
        path.unlink()


def tool_lines(env: JobsEnv, run_id: str) -> list[Line]:
    return [line for line in env.lines("tool_start") if line.args[0] == run_id]


# --- enqueue, poll, complete ----------------------------------------------------------------


async def test_a_tracked_run_is_queued_polled_and_completed(
    served: Served, env: JobsEnv, redis_client: aioredis.Redis
) -> None:
    tag, prompt = plan(rounds=[[["effect", "a"], ["effect", "b"]]], answer="all done")
    path = await start(served, prompt)
    run_id = path.rsplit("/", 1)[1]
    assert run_id.startswith("run_")
    assert len(run_id) == 4 + 32

    first = (await served.client.get(path)).json()  # the record exists before the job runs
    assert first["status"] in ("queued", "in_progress", "complete")

    record = await poll(served.client, path)
    assert record["status"] == "complete"
    assert record["outcome"]["status"] == "completed"
    assert record["outcome"]["text"] == "all done after 1 rounds"
    assert record["progress_pct"] == 100
    assert record["attempt"] == 1
    assert record["error"] is None
    assert record["started_at"]
    assert record["finished_at"]
    assert [list(x.args[2:]) for x in tool_lines(env, run_id)] == [["effect", "a"], ["effect", "b"]]

    # arq's result is small and carries no prompt: the job's only argument is the run id
    raw = await redis_client.get(f"arq:result:{run_id}")
    assert raw is not None
    result = json.loads(raw)
    assert result["a"] == [run_id]
    assert result["r"] == {"run_id": run_id, "status": "complete"}
    assert tag not in raw.decode()


async def test_progress_reads_step_n_of_m_while_the_run_goes_on(served: Served) -> None:
    _, prompt = plan(rounds=[[["effect", "a"]], [["effect", "b"]]], model_delay=0.4)
    path = await start(served, prompt)
    record = await poll(served.client, path, until=lambda r: r["progress_message"] == "step 1 of 8")
    assert record["status"] == "in_progress"
    assert record["progress_pct"] == 1 * 99 // 8
    done = await poll(served.client, path)
    assert done["status"] == "complete"
    assert done["progress_message"] == "step 2 of 8"
    assert done["progress_pct"] == 100


def test_progress_formula() -> None:
    assert progress_of(0, 8) == (0, "step 0 of 8")
    assert progress_of(1, 8) == (12, "step 1 of 8")
    assert progress_of(8, 8) == (99, "step 8 of 8")
    assert progress_of(12, 8) == (99, "step 12 of 8")
    assert progress_of(3, 0)[0] == 99  # max is at least 1


async def test_a_delayed_run_waits_its_time(served: Served) -> None:
    _, prompt = plan(answer="later")
    run_id = (await served.handle.enqueue(prompt, delay=1.0)).run_id
    path = f"/agent/runs/{run_id}"
    await asyncio.sleep(0.3)
    assert (await served.client.get(path)).json()["status"] == "queued"
    record = await poll(served.client, path)
    assert record["outcome"]["text"] == "later after 0 rounds"


# --- approvals over HTTP --------------------------------------------------------------------


async def test_a_paused_run_resumes_after_decisions_over_http(served: Served, env: JobsEnv) -> None:
    _, prompt = plan(rounds=[[["effect", "a"]], [["send", "x"], ["send", "y"]]])
    path = await start(served, prompt)
    run_id = path.rsplit("/", 1)[1]
    paused = await poll(served.client, path)
    assert paused["status"] == "awaiting_approval"
    assert paused["outcome"]["status"] == "awaiting_approval"
    awaiting = paused["awaiting"]
    assert [(a["name"], a["arguments"]["key"]) for a in awaiting] == [("send", "x"), ("send", "y")]
    assert all("approval" in a["reason"] for a in awaiting)
    x, y = (a["call_id"] for a in awaiting)
    assert "state" not in paused
    assert "messages" not in json.dumps(paused)

    decisions = f"{path}/decisions"
    unknown = await served.client.post(
        decisions, json=[{"call_id": "nope", "approval": {"verdict": "approve"}}]
    )
    assert unknown.status_code == 409
    assert unknown.json()["kind"] == "conflict"
    assert "nope" in unknown.json()["detail"]

    accepted = await served.client.post(
        decisions,
        json=[
            {"call_id": x, "approval": {"verdict": "approve"}},
            {"call_id": y, "approval": {"verdict": "reject", "reason": "not y"}},
        ],
    )
    assert accepted.status_code == 202, accepted.text
    assert accepted.json() == {"run_id": run_id, "status_path": path}
    again = await served.client.post(
        decisions, json=[{"call_id": x, "approval": {"verdict": "approve"}}]
    )
    assert again.status_code == 409  # a pause takes decisions once

    done = await poll(served.client, path)
    assert done["status"] == "complete", done
    assert done["outcome"]["text"] == "done after 2 rounds"
    assert done["awaiting"] == []
    sent = [list(x.args[2:]) for x in tool_lines(env, run_id)]
    assert sent == [["effect", "a"], ["send", "x"]]  # y was rejected; a did not run again


async def test_decisions_that_cannot_be_queued_leave_the_run_awaiting_them(
    served: Served, env: JobsEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, prompt = plan(rounds=[[["send", "z"]]])
    path = await start(served, prompt)
    paused = await poll(served.client, path)
    assert paused["status"] == "awaiting_approval"
    [call] = [a["call_id"] for a in paused["awaiting"]]
    queue = served.handle.jobs
    assert queue is not None
    redis = await queue.redis()

    async def redis_blip(*_args: Any, **_kwargs: Any) -> None:
        raise RedisConnectionError("Connection refused")

    monkeypatch.setattr(redis, "enqueue_job", redis_blip)
    decisions = [{"call_id": call, "approval": {"verdict": "approve"}}]
    refused = await served.client.post(f"{path}/decisions", json=decisions)
    assert refused.status_code == 503, refused.text
    again = (await served.client.get(path)).json()
    assert again["status"] == "awaiting_approval"  # not failed: decide again
    assert [a["call_id"] for a in again["awaiting"]] == [call]
    assert again["outcome"] == paused["outcome"]
    monkeypatch.undo()
    accepted = await served.client.post(f"{path}/decisions", json=decisions)
    assert accepted.status_code == 202, accepted.text
    assert (await poll(served.client, path))["status"] == "complete"
    run_id = path.rsplit("/", 1)[1]
    assert [list(x.args[2:]) for x in tool_lines(env, run_id)] == [["send", "z"]]


async def test_a_stale_delivery_of_a_decided_run_leaves_the_approved_calls_to_the_resume(
    served: Served, env: JobsEnv
) -> None:
    _, prompt = plan(rounds=[[["send", "w"]]])
    path = await start(served, prompt)
    run_id = path.rsplit("/", 1)[1]
    paused = await poll(served.client, path)
    [call] = [a["call_id"] for a in paused["awaiting"]]
    queue = served.handle.jobs
    assert queue is not None
    # decisions accepted, and the paused run's own job delivered again (its worker had died
    # before arq ended it) before the resume job runs
    resume = f"{run_id}:resume:late"
    await queue.store.take_paused_state(run_id, [ApprovalDecision.approve(call)], job_id=resume)
    redis = await queue.redis()
    await redis.delete(f"arq:result:{run_id}")  # (arq would not take the same id again)
    for function, stale in ((AGENT_RUN, run_id), (AGENT_RESUME, f"{run_id}:resume:other")):
        await redis.enqueue_job(function, run_id, _job_id=stale, _queue_name=env.queue)
        result = await (await _job(redis, stale, env)).result(timeout=10)
        assert result == {"run_id": run_id, "status": "queued"}
    assert tool_lines(env, run_id) == []  # the approved call waits for its resume
    await redis.enqueue_job(AGENT_RESUME, run_id, _job_id=resume, _queue_name=env.queue)
    assert (await poll(served.client, path))["status"] == "complete"
    assert [list(x.args[2:]) for x in tool_lines(env, run_id)] == [["send", "w"]]


async def _job(redis: Any, job_id: str, env: JobsEnv) -> Job:
    return Job(job_id, redis, _queue_name=env.queue, _deserializer=loads)


async def test_a_run_whose_job_cannot_be_queued_is_not_recorded_and_can_be_enqueued_again(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = served.handle.jobs
    assert queue is not None
    redis = await queue.redis()

    async def redis_blip(*_args: Any, **_kwargs: Any) -> None:
        raise RedisConnectionError("Connection refused")

    _, prompt = plan()
    run_id = new_run_id()  # a follow-up's or a tick's id is derived: the same again
    monkeypatch.setattr(redis, "evalsha", redis_blip)  # the enqueue script's one command
    with pytest.raises(AgentError) as caught:
        await served.handle.enqueue(prompt, run_id=run_id)
    assert caught.value.kind is ErrorKind.UNAVAILABLE
    assert (await served.client.get(queue.handle(run_id).status_path)).status_code == 404
    monkeypatch.undo()
    handle = await served.handle.enqueue(prompt, run_id=run_id)
    assert (await poll(served.client, handle.status_path))["status"] == "complete"


async def test_decisions_for_runs_that_are_not_paused_answer_409_or_404(served: Served) -> None:
    _, prompt = plan()
    path = await start(served, prompt)
    assert (await poll(served.client, path))["status"] == "complete"
    body = [{"call_id": "c", "approval": {"verdict": "approve"}}]
    finished = await served.client.post(f"{path}/decisions", json=body)
    assert finished.status_code == 409
    assert "not awaiting approval" in finished.json()["detail"]
    missing = await served.client.post("/agent/runs/run_nope/decisions", json=body)
    assert missing.status_code == 404
    malformed = await served.client.post(f"{path}/decisions", json=[{"call_id": "c"}])
    assert malformed.status_code == 422
    flood = body * 1001  # more than any pause can take: refused before a record is read
    refused = await served.client.post(f"{path}/decisions", json=flood)
    assert refused.status_code == 422
    assert len(refused.content) < 2000


async def test_unknown_runs_answer_404(served: Served) -> None:
    response = await served.client.get("/agent/runs/run_00000000000000000000000000000000")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["kind"] == "not_found"


# --- ids, duplicates, expiry ----------------------------------------------------------------


async def test_an_idempotency_key_makes_retries_one_run(served: Served, env: JobsEnv) -> None:
    tag, prompt = plan()
    key = {"idempotency-key": f"key-{uuid.uuid4()}"}
    body = {"prompt": prompt, "session": f"s-{uuid.uuid4().hex[:8]}"}
    first = await served.client.post("/agent/runs", json=body, headers=key)
    again = await served.client.post("/agent/runs", json=body, headers=key)  # a retry
    assert (first.status_code, again.status_code) == (202, 202)
    assert first.json() == again.json()
    assert (await poll(served.client, first.json()["status_path"]))["status"] == "complete"
    third = await served.client.post("/agent/runs", json=body, headers=key)  # after it ended
    assert third.json() == first.json()
    assert [x.args[0] for x in env.lines("model_start")].count(tag) == 1  # it ran once

    changed = await served.client.post(
        "/agent/runs", json={**body, "prompt": prompt + " "}, headers=key
    )
    assert changed.status_code == 409
    assert "Idempotency-Key" in changed.json()["detail"]
    # Without a key, the same body twice is two runs.
    one = await served.client.post("/agent/runs", json={**body, "session": None})
    two = await served.client.post("/agent/runs", json={**body, "session": None})
    assert one.json()["run_id"] != two.json()["run_id"]


async def test_enqueueing_the_same_run_twice_is_a_no_op(served: Served, env: JobsEnv) -> None:
    tag, prompt = plan(rounds=[[["effect", "once"]]])
    run_id = new_run_id()
    first, second = await asyncio.gather(
        served.handle.enqueue(prompt, run_id=run_id), served.handle.enqueue(prompt, run_id=run_id)
    )
    assert first == second
    assert first.run_id == run_id
    record = await poll(served.client, first.status_path)
    assert record["status"] == "complete"
    again = await served.handle.enqueue(prompt, run_id=run_id)  # after it finished: the same
    assert again.run_id == run_id
    await asyncio.sleep(0.4)
    assert len([x for x in env.lines("model_start") if x.args[0] == tag]) == 2  # one run, 2 calls
    assert len(tool_lines(env, run_id)) == 1
    assert (await served.client.get(first.status_path)).json()["attempt"] == 1


async def test_a_claim_its_worker_never_renewed_is_cut_to_the_lease(
    served: Served, env: JobsEnv, redis_client: aioredis.Redis
) -> None:
    # a worker SIGKILLed between arq's claim (an in-progress key living the whole job timeout)
    # and the delivery's first renewal: the sweeper cuts the claim, another delivery runs it
    _, prompt = plan(rounds=[[["effect", "once"]]])
    run_id = new_run_id()
    claim = f"arq:in-progress:{run_id}"
    await redis_client.psetex(claim, 600_000, b"1")  # as arq's start_jobs leaves it
    handle = await served.handle.enqueue(prompt, run_id=run_id)
    lease_ms = 2000  # JOBS_TEST_LEASE
    deadline = time.monotonic() + 10
    while (ttl := await redis_client.pttl(claim)) > lease_ms:
        assert time.monotonic() < deadline, f"the claim still lives {ttl} ms"
        await asyncio.sleep(0.05)
    record = await poll(served.client, handle.status_path, within=20)
    assert record["status"] == "complete"
    assert len(tool_lines(env, run_id)) == 1


async def test_the_sweeper_leaves_other_jobs_and_renewed_claims_alone(
    served: Served, env: JobsEnv, redis_client: aioredis.Redis
) -> None:
    queue = served.handle.jobs
    assert queue is not None
    redis = await queue.redis()
    other = "someone-elses-job"  # not an agent job: its long claim is its worker's business
    # claimed first, so the module's worker never takes it between the two
    await redis_client.psetex(f"arq:in-progress:{other}", 600_000, b"1")
    await redis.enqueue_job("send_newsletter", _job_id=other, _queue_name=env.queue)
    try:
        assert await Upkeep(redis, queue.store, queue.options).release_abandoned_claims() == []
        assert await redis_client.pttl(f"arq:in-progress:{other}") > 500_000
    finally:
        await redis_client.zrem(env.queue, other)
        await redis_client.delete(f"arq:in-progress:{other}", f"arq:job:{other}")


async def test_the_status_outlives_arqs_own_result(
    served: Served, redis_client: aioredis.Redis
) -> None:
    _, prompt = plan(answer="kept")
    path = await start(served, prompt)
    run_id = path.rsplit("/", 1)[1]
    await poll(served.client, path)
    deadline = time.monotonic() + 5
    while await redis_client.exists(f"arq:result:{run_id}", f"arq:job:{run_id}"):
        assert time.monotonic() < deadline, "arq kept the result longer than keep_result"
        await asyncio.sleep(0.1)
    record = (await served.client.get(path)).json()
    assert record["status"] == "complete"
    assert record["outcome"]["text"] == "kept after 0 rounds"


async def test_a_job_enqueued_by_hand_for_a_run_without_a_record_does_nothing(
    served: Served, env: JobsEnv
) -> None:
    """A run is recorded by its enqueue; a job for a run id with no record ends ``unknown``."""
    run_id = new_run_id()
    arq = await served.handle.jobs.redis()
    job = await arq.enqueue_job(AGENT_RUN, run_id, _job_id=run_id, _queue_name=env.queue)
    assert job is not None
    assert await job.result(timeout=10) == {"run_id": run_id, "status": "unknown"}
    assert (await served.client.get(f"/agent/runs/{run_id}")).status_code == 404


# --- retries --------------------------------------------------------------------------------


async def test_a_retryable_failure_is_retried_with_the_same_run_id(
    served: Served, env: JobsEnv
) -> None:
    tag, prompt = plan(
        rounds=[[["effect", "a"]], [["effect", "b"]]],
        fail={"round": 1, "times": 2, "kind": "rate_limited"},
    )
    path = await start(served, prompt)
    run_id = path.rsplit("/", 1)[1]
    record = await poll(served.client, path)
    assert record["status"] == "complete", record
    assert record["attempt"] == 3  # 2 failures, the third attempt finished
    assert len([x for x in env.lines("model_fail") if x.args[0] == tag]) == 2
    tools = tool_lines(env, run_id)
    assert [list(x.args[2:]) for x in tools] == [
        ["effect", "a"],
        ["effect", "b"],
    ]  # a did not run again
    # the first model call was checkpointed: asked once, never again
    assert [x.args[1] for x in env.lines("model_start") if x.args[0] == tag] == [
        "0",
        "1",
        "1",
        "1",
        "2",
    ]


async def test_retryable_failures_stop_after_max_attempts(served: Served) -> None:
    _, prompt = plan(fail={"round": 0, "times": 5, "kind": "unavailable"})
    record = await poll(served.client, await start(served, prompt))
    assert record["status"] == "failed"
    assert record["attempt"] == 3
    assert record["error"]["kind"] == "unavailable"
    assert record["outcome"] is None


async def test_other_failures_fail_at_once_with_the_typed_error(served: Served) -> None:
    _, prompt = plan(fail={"round": 0, "times": 5, "kind": "authentication"})
    record = await poll(served.client, await start(served, prompt))
    assert record["status"] == "failed"
    assert record["attempt"] == 1
    assert record["error"] == {
        "kind": "authentication",
        "message": "scripted authentication",
        "provider": "scripted",
        "status": None,
        "retry_after": None,
    }


# --- one writer per session -----------------------------------------------------------------


async def test_two_runs_for_one_session_never_interleave(
    served: Served, env: JobsEnv, redis_client: aioredis.Redis
) -> None:
    session = f"s-{time.monotonic_ns()}"
    slow = {"rounds": [[["effect", "1"]], [["effect", "2"]]], "model_delay": 0.1}
    (tag_a, prompt_a), (tag_b, prompt_b) = plan(**slow), plan(**slow)
    path_a = await start(served, prompt_a, session=session)
    path_b = await start(served, prompt_b, session=session)
    a, b = await asyncio.gather(poll(served.client, path_a), poll(served.client, path_b))
    assert (a["status"], b["status"]) == ("complete", "complete"), (a, b)

    def span(tag: str) -> tuple[float, float]:
        times = [x.time for x in env.lines() if x.event.startswith("model_") and x.args[0] == tag]
        return min(times), max(times)

    (a0, a1), (b0, b1) = span(tag_a), span(tag_b)
    assert a1 < b0 or b1 < a0, "the two runs overlapped"

    store = served.handle.runtime.session_store
    messages = [e.message for e in await store.entries(session) if isinstance(e, MessageEntry)]
    assert len(messages) == 12  # two turns of user, 3 x assistant, 2 x tool
    users = [i for i, m in enumerate(messages) if m.role is Role.USER]
    assert users == [0, 6]
    first_tag = json.loads(messages[0].text)["tag"]
    assert first_tag == (tag_a if a1 < b0 else tag_b)
    # the database keeps the session's turns: nothing of the session is kept in Redis
    assert [key async for key in redis_client.scan_iter(f"{env.prefix}*{session}*")] == []


async def test_op23_a_background_run_continues_the_branch_it_names(served: Served) -> None:
    session = f"s-{uuid.uuid4().hex}"
    tags = []
    for _ in range(2):
        tag, prompt = plan(answer="ok")
        tags.append(tag)
        assert (await poll(served.client, await start(served, prompt, session=session)))[
            "status"
        ] == "complete"
    branches = f"/agent/sessions/{session}/branches"
    listed = await served.client.get(branches)
    assert listed.json() == [{"leaf": 4, "length": 4, "fork_point": None, "active": True}]
    forked = await served.client.post(branches, json={"at": 2})
    assert forked.status_code == 201, forked.text
    assert forked.json() == {"leaf": 2, "length": 2, "fork_point": 2, "active": True}

    # the next run continues the fork; one that names the old leaf continues that one
    tag_c, prompt_c = plan(answer="ok")
    await poll(served.client, await start(served, prompt_c, session=session))
    tag_d, prompt_d = plan(answer="ok")
    await poll(served.client, await start(served, prompt_d, session=session, branch=4))
    store = served.handle.runtime.session_store

    def asked(messages: list[Any]) -> list[str]:
        return [json.loads(m.text)["tag"] for m in messages if m.role is Role.USER]

    assert asked((await store.load(session, leaf=6)).messages) == [tags[0], tag_c]
    assert asked((await store.load(session)).messages) == [*tags, tag_d]
    assert [b["leaf"] for b in (await served.client.get(branches)).json()] == [6, 8]

    # unknown ids and bad bodies are problem details
    for response, status in [
        (await served.client.post(branches, json={"at": 99}), 404),
        (await served.client.get(f"/agent/sessions/s-{uuid.uuid4().hex}/branches"), 404),
        (await served.client.post(branches, json={"at": 0}), 422),
        (await served.client.post(branches, json={"at": 2, "more": 1}), 422),
        (await served.client.post("/agent/runs", json={"prompt": "x", "branch": 2}), 422),
    ]:
        assert response.status_code == status, response.text
        assert response.headers["content-type"] == "application/problem+json"
    # a locked session refuses a branch before its lock: 409
    await served.handle.lock(session)
    refused = await served.client.post(branches, json={"at": 2})
    assert refused.status_code == 409, refused.text
    assert "is locked" in refused.json()["detail"]


async def test_the_reject_policy_answers_409_while_the_session_is_busy(env: JobsEnv) -> None:
    session = f"r-{time.monotonic_ns()}"
    async with serve(env, AGENT_SESSION_LOCK="reject") as served:
        _, slow = plan(rounds=[[["effect", "1"]]], model_delay=0.3)
        path = await start(served, slow, session=session)
        _, other = plan()
        busy = await served.client.post("/agent/runs", json={"prompt": other, "session": session})
        assert busy.status_code == 409
        assert busy.json()["kind"] == "conflict"
        assert session in busy.json()["detail"]
        assert (await poll(served.client, path))["status"] == "complete"
        later = await start(served, other, session=session)  # free again
        assert (await poll(served.client, later))["status"] == "complete"
        # another session is never blocked
        elsewhere = await start(served, other, session=session + "-2")
        assert (await poll(served.client, elsewhere))["status"] == "complete"


async def test_the_reject_policy_lets_one_of_many_racing_enqueues_in(env: JobsEnv) -> None:
    """Enqueues of one session that race are decided by the records: the run that took the
    earlier place in the session is accepted, every later one is refused, however they
    interleave."""
    session = f"x-{time.monotonic_ns()}"
    async with serve(env, AGENT_SESSION_LOCK="reject") as served:
        prompts = [plan(rounds=[[["effect", "1"]]], model_delay=0.3)[1] for _ in range(5)]
        answers = await asyncio.gather(
            *(
                served.client.post("/agent/runs", json={"prompt": p, "session": session})
                for p in prompts
            )
        )
        codes = sorted(answer.status_code for answer in answers)
        assert codes == [202, 409, 409, 409, 409], [a.text for a in answers]
        accepted = next(a for a in answers if a.status_code == 202).json()
        assert (await poll(served.client, accepted["status_path"]))["status"] == "complete"
        page = (await served.client.get("/agent/runs", params={"session": session})).json()
        assert [run["run_id"] for run in page["runs"]] == [accepted["run_id"]]  # none left over


async def test_cancelling_a_queued_run_frees_its_session_for_the_reject_policy(
    env: JobsEnv,
) -> None:
    session = f"c-{time.monotonic_ns()}"
    async with serve(env, AGENT_SESSION_LOCK="reject") as served:
        _, prompt = plan()
        queued = await served.handle.enqueue(prompt, session=session, delay=600)
        run_id = queued.run_id  # queued, holding the session
        _, other = plan()
        busy = await served.client.post("/agent/runs", json={"prompt": other, "session": session})
        assert busy.status_code == 409
        cancelled = await served.client.post(f"/agent/runs/{run_id}/cancel")
        assert cancelled.status_code == 202, cancelled.text
        path = await start(served, other, session=session)  # free at once, not in 30 minutes
        assert (await poll(served.client, path))["status"] == "complete"


async def test_the_reject_policy_refuses_decisions_while_the_session_is_busy(
    env: JobsEnv,
) -> None:
    """A resume is a run of its session too: while another run of the session is in progress
    its decisions answer 409, and the run still awaits them; once the session is free they
    are accepted and the resume is queued."""
    session = f"d-{time.monotonic_ns()}"
    async with serve(env, AGENT_SESSION_LOCK="reject") as served:
        _, pausing = plan(rounds=[[["send", "z"]]])
        path = await start(served, pausing, session=session)
        paused = await poll(served.client, path)
        assert paused["status"] == "awaiting_approval"
        _, slow = plan(rounds=[[["effect", "1"]]], model_delay=1.0)
        busy = await start(served, slow, session=session)  # a paused run holds no turn
        await poll(served.client, busy, until=lambda r: r["status"] == "in_progress")
        decisions = [
            {"call_id": paused["awaiting"][0]["call_id"], "approval": {"verdict": "approve"}}
        ]
        refused = await served.client.post(f"{path}/decisions", json=decisions)
        assert refused.status_code == 409, refused.text
        assert session in refused.json()["detail"]
        again = (await served.client.get(path)).json()
        assert again["status"] == "awaiting_approval"  # decide again later
        assert again["awaiting"] == paused["awaiting"]
        assert (await poll(served.client, busy))["status"] == "complete"
        accepted = await served.client.post(f"{path}/decisions", json=decisions)
        assert accepted.status_code == 202, accepted.text
        # (the resume then finds its session written since the pause: that is the session
        # store's conflict, whatever the policy)
        assert (await poll(served.client, path))["status"] != "awaiting_approval"


# --- failure to reach Redis, and the API without a worker -----------------------------------


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_an_unreachable_redis_is_a_typed_error_naming_the_url_without_password(
    env: JobsEnv,
) -> None:
    port = closed_port()
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    async with serve(env, AGENT_REDIS_URL=url) as served:
        run_id = new_run_id()
        with pytest.raises(AgentError) as caught:
            await served.handle.enqueue("hello", run_id=run_id)
        error = caught.value
        assert error.kind is ErrorKind.UNAVAILABLE
        assert f"redis://:***@127.0.0.1:{port}/0" in error.message
        assert "hunter2" not in str(error) + repr(error)
        response = await served.client.post("/agent/runs", json={"prompt": "hello"})
        assert response.status_code == 503
        assert "hunter2" not in response.text
        assert response.json()["kind"] == "unavailable"
        # nothing was recorded for a run that never reached the queue
        assert (await served.client.get(f"/agent/runs/{run_id}")).status_code == 404


async def test_the_enqueue_api_needs_a_running_plugin_with_background_runs(env: JobsEnv) -> None:
    plugin = make_plugin(env.environ)
    with pytest.raises(AgentError) as caught:
        plugin.agent(make_app(plugin))  # not started
    assert caught.value.kind is ErrorKind.UNAVAILABLE
    assert "not installed" in caught.value.message

    off = AgentPlugin(session_store=InMemorySessionStore(), environ={}, model=plugin.model)
    assert off.job_options() is None
    app = make_app(off)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as client,
    ):
        assert off.agent(app).queue is None
        assert off.agent(app).runtime.database is None
        with pytest.raises(AgentError) as caught:
            await off.agent(app).enqueue("hello")
        assert caught.value.kind is ErrorKind.CONFIG
        assert (await client.get("/agent/runs/run_x")).status_code == 404  # no such route
    with pytest.raises(AgentError, match="jobs=True"):
        off.worker_settings()


async def test_a_job_without_the_plugin_is_unavailable() -> None:
    with pytest.raises(AgentError) as caught:
        await agent_run({"job_id": "x", "job_try": 1}, "run_x")
    assert caught.value.kind is ErrorKind.UNAVAILABLE
    assert caught.value.http_status == 503


# --- arguments and worker settings (no worker needed) ---------------------------------------


def test_run_args_defaults_round_trip_and_refuse_unknown_fields() -> None:
    args = RunArgs.model_validate_json('{"prompt": "hi"}')
    assert args.prompt == "hi"
    assert args.overrides == AgentOverrides()
    assert args.overrides.system_prompt is None
    assert args.overrides.max_steps is None
    assert args.overrides.session is None
    assert args.overrides.memory_scope is None
    assert args.overrides.followup_depth == 0
    assert args.overrides.read_only is False
    assert args.deliver is False
    assert args.origin == "request"
    assert RunArgs.model_validate_json(args.model_dump_json()) == args
    with pytest.raises(ValidationError):
        RunArgs.model_validate({"prompt": "hi", "added_later": 1})


def test_run_args_are_checked_with_errors_naming_the_field() -> None:
    built = RunArgs.checked("hi", overrides={"session": "s", "max_steps": 3})
    assert (built.prompt, built.overrides.session, built.overrides.max_steps) == ("hi", "s", 3)
    assert checked_run_id("my-run.1") == "my-run.1"
    assert checked_run_id(None).startswith("run_")
    assert checked_run_id(None) != checked_run_id(None)
    for overrides in ({"max_steps": 0}, {"session": ""}):
        with pytest.raises(AgentError) as caught:
            RunArgs.checked("hi", overrides=overrides)
        assert caught.value.kind is ErrorKind.CONFIG
        assert next(iter(overrides)) in caught.value.message
    with pytest.raises(AgentError) as caught:
        RunArgs.checked("hi", origin="cron")  # type: ignore[arg-type]
    assert "origin" in caught.value.message
    with pytest.raises(AgentError) as caught:
        checked_run_id("has space")
    assert "run_id" in caught.value.message
    with pytest.raises(AgentError):
        RunArgs.checked("")


def test_job_options_are_checked_and_backoff_grows() -> None:
    with pytest.raises(AgentError, match="max_attempts"):
        JobOptions(max_attempts=0)
    with pytest.raises(AgentError, match="lease"):
        JobOptions(lease=0)
    options = JobOptions(retry_backoff=1.0, max_backoff=10.0)
    assert 0.5 <= options.backoff(1, None) <= 1.0
    assert 2.0 <= options.backoff(3, None) <= 4.0
    assert options.backoff(1, 7.0) == 7.0  # Retry-After wins
    assert options.backoff(10, None) == 10.0
    assert options.timeout_for(None) == 1800.0
    assert options.timeout_for(120) == 180.0
    assert JobOptions(job_timeout=5).timeout_for(120) == 5


def test_worker_settings_build_an_arq_worker_from_the_plugin(env: JobsEnv) -> None:
    settings = make_plugin(env.environ).worker_settings(max_jobs=3)
    names = [f.name for f in settings.functions]
    assert names == [AGENT_RUN, AGENT_RESUME]
    assert settings.queue_name == env.queue
    assert settings.redis_settings.host == "127.0.0.1"
    assert settings.redis_settings.port == int(env.redis_url.rsplit(":", 1)[1].split("/")[0])
    # its Redis commands ride out an outage of any length once it has started
    assert isinstance(settings.redis_settings.retry, OutageRetry)
    assert settings.keep_result == 1.0
    assert settings.max_jobs == 3
    assert callable(settings.on_startup)
    assert callable(settings.on_shutdown)
    assert settings.job_serializer({"a": 1}) == b'{"a":1}'
    # arq never drops an agent job on its own (the run would stay queued for good)
    assert settings.max_tries >= 1_000_000
    assert all(f.max_tries is not None and f.max_tries >= 1_000_000 for f in settings.functions)


async def test_a_run_started_more_often_than_max_deliveries_fails(
    served: Served, env: JobsEnv
) -> None:
    _, prompt = plan(rounds=[[["effect", "once"]]])
    run_id, args = new_run_id(), RunArgs(prompt=prompt)
    queue = served.handle.jobs
    await queue.store.create(run_id, origin="job", args=args.model_dump(mode="json"))
    for _ in range(20):  # JOBS_TEST_MAX_DELIVERIES deliveries whose workers all died
        await queue.store.start(run_id)
    redis = await queue.redis()
    await redis.enqueue_job(AGENT_RUN, run_id, _job_id=run_id, _queue_name=env.queue)
    record = await poll(served.client, queue.handle(run_id).status_path)
    assert record["status"] == "failed"
    assert "started 20 times without finishing" in record["error"]["message"]
    assert tool_lines(env, run_id) == []


async def test_a_redelivery_ends_the_event_stream_its_first_delivery_left_open(
    served: Served, env: JobsEnv, redis_client: aioredis.Redis
) -> None:
    # the first delivery's worker died between recording the end and publishing run_end
    _, prompt = plan()
    run_id, args = new_run_id(), RunArgs(prompt=prompt)
    queue = served.handle.jobs
    await queue.store.create(run_id, origin="job", args=args.model_dump(mode="json"))
    error = AgentError(ErrorKind.PROVIDER, "the model said no")
    await queue.store.fail(run_id, error.info())
    key = stream_key(run_id, queue.options.live_prefix)
    await redis_client.xadd(key, {"type": "run_start", "data": "{}"})
    redis = await queue.redis()
    await redis.enqueue_job(AGENT_RUN, run_id, _job_id=run_id, _queue_name=env.queue)
    deadline = time.monotonic() + 10
    while (last := await redis_client.xrevrange(key, count=1))[0][1][b"type"] != b"run_end":
        assert time.monotonic() < deadline, last
        await asyncio.sleep(0.05)
    end = json.loads(last[0][1][b"data"])
    assert end["error"]["message"] == "the model said no"
    assert 0 < await redis_client.ttl(key) <= queue.options.events_ttl


async def test_a_live_delivery_keeps_its_claim_even_when_the_key_is_deleted(
    redis_client: aioredis.Redis,
) -> None:
    job_id = f"keeper-{time.monotonic_ns()}"
    key = f"arq:in-progress:{job_id}"
    renewals: list[float] = []

    async def run_lease() -> None:
        renewals.append(time.monotonic())

    async with Keeper(redis_client, job_id, 0.3, run_lease):  # type: ignore[arg-type]
        assert 0 < await redis_client.pttl(key) <= 300
        await redis_client.delete(key)  # a superseded delivery of the same job ended
        await asyncio.sleep(0.25)
        assert 0 < await redis_client.pttl(key) <= 300
    await redis_client.delete(key)
    assert renewals  # the run's lease in the database too


async def test_a_delivery_cuts_its_claim_on_the_runs_first_look_at_its_control_channel(
    redis_client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one round trip at the start of a run, not two: the claim's cut rides on the transaction
    # that reads the requests made before the run started (which still reach the run)
    job_id = f"keeper-{time.monotonic_ns()}"
    key = f"arq:in-progress:{job_id}"
    prefix = f"agent-test-claim-{uuid.uuid4().hex[:8]}:"
    await redis_client.psetex(key, 600_000, b"1")  # as arq's start_jobs leaves it
    await RunControlChannel(redis_client, job_id, prefix=prefix).request_cancel("before")
    await RunControlChannel(redis_client, job_id, prefix=prefix).send_steering("early")
    watcher = ControlWatcher(redis_client, prefix=prefix, poll=30)
    cancel, steering = CancelToken(), Steering()
    sent = 0
    send = AbstractConnection.send_packed_command

    async def counted(conn: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal sent
        sent += 1
        return await send(conn, *args, **kwargs)

    async def no_lease() -> None:
        return None

    try:
        await watcher.start()
        keeper = Keeper(redis_client, job_id, 0.3, no_lease, claim_at_once=False)
        async with keeper:
            assert await redis_client.pttl(key) > 500_000  # left to the first look
            with monkeypatch.context() as patched:
                patched.setattr(AbstractConnection, "send_packed_command", counted)
                async with watcher.watch(job_id, cancel, steering, also=keeper.cut_claim):
                    assert sent == 1
            assert 0 < await redis_client.pttl(key) <= 300
        assert cancel.reason == "before"
        assert [m.text for m in steering.drain()] == ["early"]
    finally:
        await watcher.aclose()
        await redis_client.delete(key, f"{prefix}{job_id}:cancel", f"{prefix}{job_id}:steer")


class RestartingRedis:
    """A Redis that goes down after the first command: later ones fail slowly, as a worker's
    retried commands do while Redis restarts."""

    def __init__(self) -> None:
        self.calls = 0

    async def set(self, *_args: object, **_kwargs: object) -> None:
        self.calls += 1
        if self.calls > 1:
            await asyncio.sleep(1.0)
            raise RedisConnectionError("Connection refused")


async def test_a_redis_outage_does_not_stop_the_runs_lease_in_the_database() -> None:
    renewals: list[float] = []
    redis = RestartingRedis()

    async def run_lease() -> None:
        renewals.append(time.monotonic())

    async with Keeper(redis, "job", 0.3, run_lease):  # type: ignore[arg-type]
        await asyncio.sleep(0.75)
    assert redis.calls >= 2  # the claim's renewal hung on Redis ...
    assert len(renewals) >= 4, renewals  # ... while the run's lease was renewed every lease/3


def test_the_demo_worker_is_built_from_the_demo_plugin() -> None:
    from example_app.main import app
    from example_app.worker import WorkerSettings

    assert [f.name for f in WorkerSettings.functions] == [AGENT_RUN, AGENT_RESUME]
    assert WorkerSettings.queue_name == "agent:queue"
    paths = set(app.openapi()["paths"])
    assert {"/agent/runs", "/agent/runs/{run_id}", "/agent/runs/{run_id}/decisions"} <= paths


async def test_a_delivery_that_cannot_reach_the_database_is_tried_again_later(
    env: JobsEnv, tmp_path: Path
) -> None:
    database = tmp_path / "gone.db"
    plugin = make_plugin({**env.environ, "AGENT_DATABASE_URL": f"sqlite+aiosqlite:///{database}"})
    settings = plugin.worker_settings()
    redis = await create_pool(settings.redis_settings)
    ctx: dict[str, Any] = {"redis": redis, "job_id": "run_gone", "job_try": 1}
    await settings.on_startup(ctx)
    try:
        runtime = runtime_of(ctx)
        assert runtime.database is not None
        await runtime.database.dispose()
        # the next connection finds an empty database: no tables
        await asyncio.to_thread(remove_files, tmp_path, "gone.db*")
        with pytest.raises(Retry) as caught:
            await agent_run(ctx, "run_gone")
        assert caught.value.defer_score == 2000  # one lease
    finally:
        await settings.on_shutdown(ctx)
        await redis.aclose()


async def test_the_agent_worker_leaves_an_apps_own_arq_jobs_alone(tmp_path: Path) -> None:
    """The agent's queue is its own: a job the app put on arq's default queue is never taken
    by an agent worker (and the agent's runs are not on the app's queue)."""
    redis_url = redis_db(APP_QUEUE_DB)
    plugin = AgentPlugin(
        model=ScriptedModel(["done"]),
        session_store=InMemorySessionStore(),
        jobs=True,
        settings=AgentSettings(
            provider="scripted",
            redis_url=redis_url,
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'runs.db'}",
        ),
    )
    settings = plugin.worker_settings()
    assert settings.queue_name == "agent:queue" != default_queue_name
    apps = await create_pool(RedisSettings.from_dsn(redis_url))
    try:
        await apps.flushdb()
        newsletter = await apps.enqueue_job("send_newsletter", _job_id="newsletter-1")
        assert newsletter is not None
        async with plugin.open() as agent:
            handle = await agent.enqueue("hello")
            worker = create_worker(settings, burst=True, handle_signals=False, poll_delay=0.05)
            try:
                await worker.async_run()
            finally:
                await worker.close()
            assert (await agent.run_status(handle.run_id)).status == "complete"
        assert await newsletter.status() is JobStatus.queued  # untouched, still waiting
        assert await apps.zrange(default_queue_name, 0, -1) == [b"newsletter-1"]
    finally:
        await apps.flushdb()
        await apps.aclose()


async def test_readiness_sees_the_worker_that_serves_the_queue(served: Served) -> None:
    health = AgentHealth(workers=True)
    health.attach(served.handle.runtime, served.handle.jobs)
    deadline = time.monotonic() + 10
    while (report := await health.readiness()).status != "UP":  # its first poll writes it
        assert time.monotonic() < deadline, report
        await asyncio.sleep(0.2)
    workers = report.components["workers"]
    assert workers.details["queue"] == served.handle.jobs.options.queue_name
    assert set(report.components) == {"database", "redis", "workers"}
