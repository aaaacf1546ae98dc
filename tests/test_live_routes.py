"""Live runs through the plugin's routes with a real arq worker process, the real Redis on
127.0.0.1 and a SQLite database shared by the app (httpx's ASGI transport) and the worker
(issue 8): the events of a background run over SSE, resuming after ``Last-Event-ID``, cancel
and steering from the web to the worker, and the run console route.

httpx's ASGI transport hands a response over once it is complete; an SSE response completes
after the run's ``run_end``, so each read below is a whole stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import redis as redis_sync

from agent_plugin import live
from agent_plugin.jobs import queue as queue_module
from agent_plugin.records import RunRecord
from agent_plugin.redaction import registered_secrets
from agent_plugin.web import AppAgent
from tests.jobs_app import JobsEnv, make_app, make_plugin

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def env(served_env: JobsEnv) -> JobsEnv:
    """The module's database, queue and log, and one worker process serving them."""
    return served_env


@asynccontextmanager
async def serve(
    env: JobsEnv, options: dict[str, Any] | None = None, **install: Any
) -> AsyncIterator[httpx.AsyncClient]:
    plugin = make_plugin(env.environ, **(options or {}))
    app = make_app(plugin, runs_route=True, **install)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client,
    ):
        HANDLES[id(client)] = plugin.agent(app)
        try:
            yield client
        finally:
            HANDLES.pop(id(client), None)


HANDLES: dict[int, AppAgent] = {}
"""The runtime handle of each served client's app, by the client's id."""


@pytest.fixture
async def client(env: JobsEnv) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(env) as value:
        yield value


_tags = iter(range(1_000_000))


def plan(**fields: Any) -> str:
    tag = f"live{next(_tags)}_{time.monotonic_ns() % 1_000_000}"
    return json.dumps({"tag": tag, **fields})


async def start(client: httpx.AsyncClient, prompt: str) -> str:
    response = await client.post("/agent/runs", json={"prompt": prompt})
    assert response.status_code == 202, response.text
    return str(response.json()["run_id"])


async def record_of(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    response = await client.get(f"/agent/runs/{run_id}")
    assert response.status_code == 200, response.text
    record: dict[str, Any] = response.json()
    return record


async def wait_for(
    client: httpx.AsyncClient, run_id: str, status: set[str], within: float = 15.0
) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        record = await record_of(client, run_id)
        if record["status"] in status:
            return record
        assert time.monotonic() < deadline, f"gave up waiting: {record}"
        await asyncio.sleep(0.03)


async def wait_for_tool(env: JobsEnv, run_id: str, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not any(line.args[0] == run_id for line in env.lines("tool_start")):
        assert time.monotonic() < deadline, "the tool never started"
        await asyncio.sleep(0.03)


def frames(body: str) -> list[dict[str, Any]]:
    """The ``id``/``event``/``data`` frames of an SSE body (comments and ``retry`` skipped)."""
    found: list[dict[str, Any]] = []
    for block in body.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            fields[name] = fields.get(name, "") + value.removeprefix(" ")
        if "event" in fields:
            found.append(
                {
                    "id": fields.get("id"),
                    "event": fields["event"],
                    "data": json.loads(fields["data"]),
                }
            )
    return found


async def events(
    client: httpx.AsyncClient, run_id: str, last: str | None = None
) -> tuple[int, list[dict[str, Any]]]:
    headers = {"last-event-id": last} if last is not None else {}
    response = await client.get(f"/agent/runs/{run_id}/events", headers=headers)
    if response.status_code == 200:
        assert response.headers["content-type"].startswith("text/event-stream")
    return response.status_code, frames(response.text)


def id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq)


# --- events over SSE ------------------------------------------------------------------------


async def test_a_background_runs_events_arrive_in_order_and_resume_after_last_event_id(
    client: httpx.AsyncClient,
) -> None:
    run_id = await start(client, plan(rounds=[[["effect", "a"]], [["effect", "b"]]]))
    status, seen = await events(client, run_id)  # opened while queued or running
    assert status == 200
    kinds = [frame["event"] for frame in seen]
    assert kinds[0] == "run_start"
    assert kinds[-1] == "run_end"
    assert kinds.count("run_end") == 1
    assert kinds.count("tool_start") == 2 or kinds.count("tool_end") == 2, kinds
    ids = [str(frame["id"]) for frame in seen]
    assert ids == sorted(ids, key=id_key)
    assert len(set(ids)) == len(ids)
    end = seen[-1]["data"]
    assert end["run_id"] == run_id
    assert end["summary"]["status"] == "completed"
    assert end["summary"]["text"] == "done after 2 rounds"
    assert (await record_of(client, run_id))["status"] == "complete"

    # reconnect after the third event: the rest, no duplicates, no gaps
    status, rest = await events(client, run_id, last=ids[2])
    assert status == 200
    assert rest == seen[3:]
    # a client that saw the end: 204 (what stops an EventSource reconnecting)
    status, _ = await events(client, run_id, last=ids[-1])
    assert status == 204
    status, _ = await events(client, run_id, last="not-an-id")
    assert status == 422  # the schema says what an event id looks like


async def _stream_for(
    client: httpx.AsyncClient, run_id: str, last: str, seconds: float
) -> tuple[str, bool]:
    """What the run's event stream from ``last`` sent within ``seconds``, and whether it
    ended by then."""
    chunks: list[str] = []

    async def read() -> None:
        headers = {"last-event-id": last}
        async with client.stream("GET", f"/agent/runs/{run_id}/events", headers=headers) as got:
            async for chunk in got.aiter_text():
                chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), seconds)
    except TimeoutError:
        return "".join(chunks), False
    return "".join(chunks), True


async def test_an_event_id_past_what_redis_holds_is_no_outage(
    client: httpx.AsyncClient,
) -> None:
    """The schema takes 20 digits a part; Redis refuses a part past 2**64 - 1, and the reader
    got an ``unavailable`` error event for it, as if Redis were down."""
    run_id = await start(client, plan(rounds=[[["effect", "a"]]], tool_delay=1.0))
    await wait_for(client, run_id, {"in_progress"})
    text, _ = await _stream_for(client, run_id, "99999999999999999999-0", 3.0)
    assert "Invalid stream ID" not in text
    assert "event: error" not in text
    await wait_for(client, run_id, {"complete"})
    status, _ = await events(client, run_id, last="99999999999999999999-99999999999999999999")
    assert status == 204  # past every entry: it has seen the end


async def test_a_reader_past_the_last_entry_of_a_running_run_ends_with_the_run(
    client: httpx.AsyncClient,
) -> None:
    run_id = await start(client, plan(rounds=[[["effect", "a"]]], tool_delay=1.0))
    await wait_for(client, run_id, {"in_progress"})
    last = f"{2**64 - 1}-{2**64 - 1}"  # an id the schema accepts, past every entry
    _, ended = await _stream_for(client, run_id, last, 20.0)
    assert ended, "the stream went on after the run ended"


async def test_events_of_an_unknown_run_are_404(client: httpx.AsyncClient) -> None:
    response = await client.get("/agent/runs/run_nosuchrun/events")
    assert response.status_code == 404


# --- cancel ---------------------------------------------------------------------------------


async def test_a_running_run_is_cancelled_mid_tool(client: httpx.AsyncClient, env: JobsEnv) -> None:
    run_id = await start(client, plan(rounds=[[["effect", "slow"]]], tool_delay=20))
    await wait_for_tool(env, run_id)
    began = time.monotonic()
    response = await client.post(f"/agent/runs/{run_id}/cancel", json={"reason": "stop it"})
    assert response.status_code == 202, response.text
    assert response.json()["run_id"] == run_id
    record = await wait_for(client, run_id, {"cancelled", "complete", "failed"})
    assert record["status"] == "cancelled"
    assert record["outcome"]["reason"] == "stop it"
    assert time.monotonic() - began < 10
    status, seen = await events(client, run_id)
    assert status == 200
    assert seen[-1]["event"] == "run_end"
    assert seen[-1]["data"]["summary"]["status"] == "cancelled"
    # the call in flight has an outcome-unknown result, so the transcript stays valid
    results = [f["data"] for f in seen if f["event"] == "tool_end"]
    assert results
    assert "unknown" in json.dumps(results).lower()

    # a finished run: 409 for cancel and for messages
    again = await client.post(f"/agent/runs/{run_id}/cancel")
    assert again.status_code == 409
    message = await client.post(f"/agent/runs/{run_id}/messages", json={"text": "hello"})
    assert message.status_code == 409


async def test_a_queued_run_is_cancelled_at_once_and_its_readers_see_the_end(
    client: httpx.AsyncClient, env: JobsEnv
) -> None:
    queued = await HANDLES[id(client)].enqueue(plan(rounds=[[["effect", "never"]]]), delay=30)
    run_id = queued.run_id
    reader = asyncio.create_task(events(client, run_id))
    await asyncio.sleep(0.2)
    response = await client.post(f"/agent/runs/{run_id}/cancel")
    assert response.status_code == 202
    assert (await record_of(client, run_id))["status"] == "cancelled"
    status, seen = await asyncio.wait_for(reader, 10)
    assert status == 200
    assert [f["event"] for f in seen] == ["run_end"]
    assert seen[0]["data"]["summary"]["status"] == "cancelled"
    message = await client.post(f"/agent/runs/{run_id}/messages", json={"text": "hello"})
    assert message.status_code == 409


async def test_a_cancel_reason_is_redacted_before_it_is_stored_sent_or_logged(
    client: httpx.AsyncClient, env: JobsEnv, caplog: pytest.LogCaptureFixture
) -> None:
    canary = "qz" + "7" * 40  # a key of no familiar shape, registered by value
    queued = await HANDLES[id(client)].enqueue(plan(rounds=[[["effect", "never"]]]), delay=30)
    run_id = queued.run_id
    reason = f"leaked {canary} and password: hunter2-secret"
    with registered_secrets(canary), caplog.at_level(logging.DEBUG):
        response = await client.post(f"/agent/runs/{run_id}/cancel", json={"reason": reason})
    assert response.status_code == 202
    stored = (await record_of(client, run_id))["outcome"]["reason"]
    assert canary not in stored
    assert "hunter2-secret" not in stored
    assert "[REDACTED]" in stored
    control = redis_sync.Redis.from_url(env.redis_url)
    try:
        sent = control.get(f"{env.prefix}run:{run_id}:cancel") or b""
    finally:
        control.close()
    assert canary.encode() not in sent
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert canary not in logged
    assert "hunter2-secret" not in logged


async def test_a_cancel_reason_reaches_redis_without_a_password_assignment(
    client: httpx.AsyncClient, env: JobsEnv
) -> None:
    queued = await HANDLES[id(client)].enqueue(plan(rounds=[[["effect", "never"]]]), delay=30)
    reason = "stop, the password: Hunter2-Cancel-9q"
    response = await client.post(f"/agent/runs/{queued.run_id}/cancel", json={"reason": reason})
    assert response.status_code == 202
    assert "Hunter2-Cancel-9q" not in (await record_of(client, queued.run_id))["outcome"]["reason"]
    control = redis_sync.Redis.from_url(env.redis_url)
    try:
        sent = control.get(f"{env.prefix}run:{queued.run_id}:cancel") or b""
    finally:
        control.close()
    assert b"stop, the password: " in sent
    assert b"Hunter2-Cancel-9q" not in sent


async def test_a_steering_message_reaches_redis_redacted(
    client: httpx.AsyncClient, env: JobsEnv
) -> None:
    import threading

    run_id = await start(client, plan(rounds=[[["effect", "slow"]]], tool_delay=20))
    await wait_for_tool(env, run_id)
    key = "sk-" + "Zq8wSteer4Kx7Lp2Mn5Vb9Cx3Rt6Yh1J"
    # the worker takes the message off Redis at once: what was written is seen with MONITOR
    steer_key = f"{env.prefix}run:{run_id}:steer"
    written: list[str] = []
    ready = threading.Event()
    watcher = redis_sync.Redis.from_url(env.redis_url, socket_timeout=10)

    def watch() -> None:
        with watcher.monitor() as monitor:
            ready.set()
            for seen in monitor.listen():
                if steer_key in seen["command"]:
                    written.append(seen["command"])
                    return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        assert await asyncio.to_thread(ready.wait, 10)
        response = await client.post(
            f"/agent/runs/{run_id}/messages", json={"text": f"use the key {key}"}
        )
        assert response.status_code == 202, response.text
        await asyncio.to_thread(thread.join, 10)
    finally:
        watcher.close()
        await client.post(f"/agent/runs/{run_id}/cancel")
    assert any("use the key" in command for command in written), written
    assert not any(key in command for command in written)


async def test_cancel_and_messages_of_an_unknown_run_are_404(client: httpx.AsyncClient) -> None:
    assert (await client.post("/agent/runs/run_nosuchrun/cancel")).status_code == 404
    steer = await client.post("/agent/runs/run_nosuchrun/messages", json={"text": "x"})
    assert steer.status_code == 404


# --- retries of the whole run [OP-14] --------------------------------------------------------


async def test_op14_a_background_runs_retries_end_with_retry_succeeded(
    client: httpx.AsyncClient,
) -> None:
    run_id = await start(client, plan(fail={"round": 0, "times": 2, "kind": "rate_limited"}))
    record = await wait_for(client, run_id, {"complete", "failed"})
    assert record["status"] == "complete", record
    status, seen = await events(client, run_id)
    assert status == 200
    kinds = [frame["event"] for frame in seen]
    assert kinds.count("retry") == 2
    assert "retry_exhausted" not in kinds
    (end,) = [frame["data"] for frame in seen if frame["event"] == "retry_succeeded"]
    assert end["attempts"] == 3 == record["attempt"]
    assert end["elapsed_seconds"] >= 0.0
    assert kinds.index("retry_succeeded") > max(i for i, k in enumerate(kinds) if k == "retry")
    assert kinds[-2:] == ["retry_succeeded", "run_end"]


async def test_op14_a_background_run_out_of_retries_ends_with_retry_exhausted(
    client: httpx.AsyncClient,
) -> None:
    run_id = await start(client, plan(fail={"round": 0, "times": 5, "kind": "unavailable"}))
    record = await wait_for(client, run_id, {"complete", "failed"})
    assert record["status"] == "failed", record
    status, seen = await events(client, run_id)
    assert status == 200
    kinds = [frame["event"] for frame in seen]
    assert kinds.count("retry") == 2
    (end,) = [frame["data"] for frame in seen if frame["event"] == "retry_exhausted"]
    assert end["attempts"] == 3
    assert end["error"]["kind"] == "unavailable"
    assert kinds[-2:] == ["retry_exhausted", "run_end"]


# --- steering -------------------------------------------------------------------------------


async def test_a_steering_message_joins_the_next_model_request(
    client: httpx.AsyncClient, env: JobsEnv
) -> None:
    run_id = await start(client, plan(rounds=[[["effect", "wait"]]], tool_delay=1.5))
    await wait_for_tool(env, run_id)
    response = await client.post(
        f"/agent/runs/{run_id}/messages", json={"text": "steer-canary please"}
    )
    assert response.status_code == 202, response.text
    record = await wait_for(client, run_id, {"complete", "failed", "cancelled"})
    # the scripted model answers from the latest user message: the steering one
    assert record["outcome"]["text"] == "echo: steer-canary please"
    bad = await client.post(f"/agent/runs/{run_id}/messages", json={"text": ""})
    assert bad.status_code == 422


async def test_op11_a_followup_message_continues_the_run_when_it_would_end(
    client: httpx.AsyncClient, env: JobsEnv
) -> None:
    run_id = await start(client, plan(rounds=[[["effect", "wait"]]], tool_delay=1.0))
    await wait_for_tool(env, run_id)
    response = await client.post(
        f"/agent/runs/{run_id}/messages", json={"text": "followup-canary", "mode": "followup"}
    )
    assert response.status_code == 202, response.text
    record = await wait_for(client, run_id, {"complete", "failed", "cancelled"})
    assert record["outcome"]["text"] == "echo: followup-canary"
    _, seen = await events(client, run_id)
    modes = [(f["data"]["mode"], f["data"]["messages"]) for f in seen if f["event"] == "steered"]
    assert modes == [("followup", ["followup-canary"])]
    kinds = [f["event"] for f in seen]
    # the run answered first (a model response without tools), then went on with the message
    answers = [i for i, k in enumerate(kinds) if k == "model_response"]
    assert len(answers) == 3  # the tool call, the answer that would have ended it, the echo
    assert answers[1] < kinds.index("steered") < answers[2]
    bad = await client.post(f"/agent/runs/{run_id}/messages", json={"text": "x", "mode": "shout"})
    assert bad.status_code == 422


async def test_op11_messages_beyond_the_bound_are_refused_with_409(env: JobsEnv) -> None:
    async with serve(env, {"max_queued_messages": 2}) as client:
        run_id = await start(client, plan(rounds=[[["effect", "wait"]]], tool_delay=1.5))
        await wait_for_tool(env, run_id)
        body = {"text": "later", "mode": "followup"}
        for _ in range(2):
            ok = await client.post(f"/agent/runs/{run_id}/messages", json=body)
            assert ok.status_code == 202, ok.text
        refused = await client.post(f"/agent/runs/{run_id}/messages", json=body)
        assert refused.status_code == 409, refused.text
        assert "2 messages" in refused.json()["detail"]
        record = await wait_for(client, run_id, {"complete", "failed", "cancelled"})
        assert record["status"] == "complete", record
        _, seen = await events(client, run_id)
        assert [f["data"]["mode"] for f in seen if f["event"] == "steered"] == [
            "followup",
            "followup",
        ]


async def test_op11_a_runs_message_mode_is_the_default_of_its_messages(
    client: httpx.AsyncClient, env: JobsEnv
) -> None:
    prompt = plan(rounds=[[["effect", "wait"]]], tool_delay=1.0)
    response = await client.post("/agent/runs", json={"prompt": prompt, "message_mode": "followup"})
    assert response.status_code == 202, response.text
    run_id = response.json()["run_id"]
    await wait_for_tool(env, run_id)
    sent = await client.post(f"/agent/runs/{run_id}/messages", json={"text": "default-canary"})
    assert sent.status_code == 202, sent.text
    record = await wait_for(client, run_id, {"complete", "failed", "cancelled"})
    assert record["outcome"]["text"] == "echo: default-canary"
    _, seen = await events(client, run_id)
    assert [f["data"]["mode"] for f in seen if f["event"] == "steered"] == ["followup"]


# --- the console ----------------------------------------------------------------------------


async def test_the_console_is_off_by_default_and_served_when_on(
    client: httpx.AsyncClient, env: JobsEnv
) -> None:
    run_id = await start(client, plan())
    assert (await client.get(f"/agent/console/{run_id}")).status_code == 404
    async with serve(env, console=True) as on:
        page = await on.get(f"/agent/console/{run_id}")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "content-security-policy" in page.headers
        assert run_id in page.text
        assert 'data-prefix="/agent"' in page.text
        assert (await on.get("/agent/console/run_nosuchrun")).status_code == 404
    await wait_for(client, run_id, {"complete"})


# --- an end the stream lacks ----------------------------------------------------------------


@pytest.fixture
async def quick(env: JobsEnv, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[httpx.AsyncClient]:
    """A client of an app whose readers look at the run's record every 0.2 s while nothing
    arrives (every 15 s by default)."""
    checking = functools.partial(live.open_events, check_every=0.2)
    monkeypatch.setattr(queue_module, "open_events", checking)  # what the routes call
    async with serve(env) as value:
        yield value


async def last_entry(client: httpx.AsyncClient, run_id: str) -> tuple[str, dict[bytes, bytes]]:
    """The id and fields of the last entry of the run's event stream."""
    jobs = HANDLES[id(client)].jobs
    redis = await jobs.redis()
    [(entry_id, fields)] = await redis.xrevrange(
        live.stream_key(run_id, jobs.options.live_prefix), count=1
    )
    return entry_id.decode(), fields


async def drop_end(client: httpx.AsyncClient, run_id: str) -> dict[bytes, bytes]:
    """Delete the ``run_end`` the run's stream ends with, as if publishing it had failed; the
    fields it had."""
    jobs = HANDLES[id(client)].jobs
    redis = await jobs.redis()
    entry_id, fields = await last_entry(client, run_id)
    assert fields[b"type"] == b"run_end"
    assert await redis.xdel(live.stream_key(run_id, jobs.options.live_prefix), entry_id) == 1
    return fields


def after(entry_id: str) -> str:
    ms, seq = id_key(entry_id)
    return f"{ms}-{seq + 1}"


@pytest.mark.parametrize(
    ("fields", "ended"),
    [
        pytest.param({"rounds": [[["effect", "a"]]]}, "complete", id="complete"),
        pytest.param(
            {"fail": {"round": 0, "times": 5, "kind": "authentication"}}, "failed", id="failed"
        ),
    ],
)
async def test_a_finished_run_whose_stream_lacks_its_end_ends_with_the_records_end(
    quick: httpx.AsyncClient, fields: dict[str, Any], ended: str
) -> None:
    run_id = await start(quick, plan(**fields))
    record = await wait_for(quick, run_id, {"complete", "failed", "cancelled"})
    assert record["status"] == ended
    published = json.loads((await drop_end(quick, run_id))[b"data"])
    status, seen = await asyncio.wait_for(events(quick, run_id), 10)
    assert status == 200
    kinds = [frame["event"] for frame in seen]
    assert kinds[0] == "run_start"
    assert kinds.count("run_end") == 1
    assert kinds[-1] == "run_end"
    end = seen[-1]
    assert end["data"] == {
        "run_id": run_id,
        "type": "run_end",
        "summary": record["outcome"],
        "error": record["error"],
    }
    assert end["data"] == published  # what the worker published
    assert (record["outcome"] is None) == (ended == "failed")
    assert (record["error"] is None) == (ended == "complete")
    # its id comes right after the stream's last entry
    assert end["id"] == after(str(seen[-2]["id"]))
    # a reconnect from before it gets it again; one after it: 204, the end was seen
    status, rest = await asyncio.wait_for(events(quick, run_id, last=str(seen[-2]["id"])), 10)
    assert (status, rest) == (200, [end])
    status, _ = await events(quick, run_id, last=str(end["id"]))
    assert status == 204


async def test_a_run_end_in_the_stream_is_the_only_end(quick: httpx.AsyncClient) -> None:
    run_id = await start(quick, plan())
    await wait_for(quick, run_id, {"complete"})
    end_id, _ = await last_entry(quick, run_id)
    status, seen = await asyncio.wait_for(events(quick, run_id), 10)
    assert status == 200
    assert [frame["event"] for frame in seen].count("run_end") == 1
    assert seen[-1]["event"] == "run_end"
    assert seen[-1]["id"] == end_id


async def test_an_end_published_just_after_the_record_says_ended_is_the_only_end(
    quick: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker records the end, then publishes it: a reader that finds the record ended
    first waits a moment for the event, and sends only that one."""
    # a wide grace, so that a loaded machine's late publish still lands inside it
    monkeypatch.setattr(live.streams, "_END_GRACE_MS", 8_000)
    run_id = await start(quick, plan())
    await wait_for(quick, run_id, {"complete"})
    fields = await drop_end(quick, run_id)
    jobs = HANDLES[id(quick)].jobs
    redis = await jobs.redis()
    key = live.stream_key(run_id, jobs.options.live_prefix)
    get = jobs.get
    looks: list[str] = []
    late: list[str] = []

    async def publish_late() -> None:
        await asyncio.sleep(0.3)
        late.append((await redis.xadd(key, fields)).decode())

    tasks: list[asyncio.Task[None]] = []

    async def get_then_publish(of: str) -> RunRecord:
        looks.append(of)
        if len(looks) == 2:  # the reader's first look (the first: the route's own)
            tasks.append(asyncio.create_task(publish_late()))
        return await get(of)

    monkeypatch.setattr(jobs, "get", get_then_publish)
    status, seen = await asyncio.wait_for(events(quick, run_id), 20)
    assert status == 200
    assert len(looks) >= 2
    assert [frame["event"] for frame in seen].count("run_end") == 1
    await asyncio.gather(*tasks)  # the reader may have the event before the publisher its reply
    assert late
    assert seen[-1]["id"] == late[0]  # the published one, not one built from the record
    assert seen[-1]["data"] == json.loads(fields[b"data"])


async def test_a_paused_runs_missing_end_ends_a_reader_and_a_follower_waits_on(
    quick: httpx.AsyncClient,
) -> None:
    run_id = await start(quick, plan(rounds=[[["send", "x"]]]))
    record = await wait_for(quick, run_id, {"awaiting_approval", "complete", "failed"})
    assert record["status"] == "awaiting_approval"
    await drop_end(quick, run_id)
    follower = asyncio.create_task(
        quick.get(f"/agent/runs/{run_id}/events", params={"follow": "true"})
    )

    status, seen = await asyncio.wait_for(events(quick, run_id), 10)
    assert status == 200
    assert [frame["event"] for frame in seen].count("run_end") == 1
    end = seen[-1]
    assert end["event"] == "run_end"
    assert end["data"]["summary"] == record["outcome"]
    assert end["data"]["summary"]["status"] == "awaiting_approval"
    # a reconnect after that end waits for the resume, as after a published pause's end
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(events(quick, run_id, last=str(end["id"])), 2.0)

    # the follower has been through many looks at the record and waits on through the pause
    assert not follower.done()
    response = await quick.post(f"/agent/runs/{run_id}/cancel")
    assert response.status_code == 202
    followed = await asyncio.wait_for(follower, 10)
    assert followed.status_code == 200
    seen = frames(followed.text)
    assert [frame["event"] for frame in seen].count("run_end") == 1
    assert seen[-1]["event"] == "run_end"
    assert seen[-1]["data"]["summary"]["status"] == "cancelled"


async def reading(redis: Any, within: float = 15.0) -> None:
    """Until an event reader of the app blocks in ``XREAD``."""
    deadline = time.monotonic() + within
    while not any(
        c.get("name") == queue_module.READER_CLIENT_NAME and c.get("cmd") == "xread"
        for c in await redis.client_list()
    ):
        assert time.monotonic() < deadline, "no reader came to wait on the stream"
        await asyncio.sleep(0.02)


async def test_a_reader_of_a_run_whose_record_went_gets_an_end(quick: httpx.AsyncClient) -> None:
    jobs = HANDLES[id(quick)].jobs
    run_id = f"run_{uuid.uuid4().hex}"
    await jobs.store.create(run_id, origin="request", args={"prompt": "p"})  # its job never came
    redis = await jobs.redis()
    await redis.xadd(live.stream_key(run_id, jobs.options.live_prefix), {"type": "x", "data": "{}"})
    reader = asyncio.create_task(events(quick, run_id))
    await reading(redis)  # the reader found the record and waits on the stream
    assert await jobs.store.discard(run_id)  # the enqueue that recorded it gave up
    status, seen = await asyncio.wait_for(reader, 10)
    assert status == 200
    assert seen[-1]["event"] == "run_end"
    assert seen[-1]["data"]["error"]["kind"] == "not_found"


# --- readers are bounded ---------------------------------------------------------------------


async def test_event_readers_are_capped_and_never_crowd_out_the_apps_redis(env: JobsEnv) -> None:
    async with serve(env, options={"max_event_readers": 3}) as client:
        agent = HANDLES[id(client)]
        waiting = await agent.enqueue(plan(rounds=[[["effect", "never"]]]), delay=60)
        streams = [await agent.jobs.events(waiting.run_id) for _ in range(3)]
        readers = [asyncio.create_task(anext(s)) for s in streams if s is not None]
        assert len(readers) == 3
        await asyncio.sleep(0.3)  # each reader now blocks in XREAD on a connection of its own

        # One more is turned away at once: 503, with when to try again.
        refused = await client.get(f"/agent/runs/{waiting.run_id}/events")
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "5"
        assert "max_event_readers" in refused.json()["detail"]
        # The app's own Redis work goes on beside them: a run is queued and completes.
        done = await start(client, plan(answer="fine"))
        assert (await wait_for(client, done, {"complete", "failed"}))["status"] == "complete"
        # The readers hold no more connections than the cap.
        probe = redis_sync.Redis.from_url(env.redis_url)
        try:
            names = [c.get("name") for c in probe.client_list()]
        finally:
            probe.close()
        assert 1 <= names.count(queue_module.READER_CLIENT_NAME) <= 3

        # A reader that stops gives its place back.
        readers[0].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await readers[0]
        assert streams[0] is not None
        await streams[0].aclose()  # type: ignore[attr-defined]
        assert agent.jobs.readers == 2
        again = await agent.jobs.events(waiting.run_id)
        assert again is not None
        assert agent.jobs.readers == 3
        for reader in readers[1:]:
            reader.cancel()
        await asyncio.gather(*readers[1:], return_exceptions=True)
        for stream in [*streams[1:], again]:
            await stream.aclose()  # type: ignore[union-attr]
        assert agent.jobs.readers == 0
        await agent.cancel(waiting.run_id)
