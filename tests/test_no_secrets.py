"""No secret leaves a background run [OP-35] (issue 8): a canary API key and a canary password,
written by the model into tool arguments and repeated by a tool in its results, never reach the
run's event stream, the logs of the app or of the worker (every logger at DEBUG), the database
(its tables and its raw files) or Redis.

The worker is a real arq process against the real Redis; the run logs in (secrets in the
arguments and the result), pauses for an approval (the paused state is stored), is approved over
HTTP and logs in again, so the secrets pass through the journal, the paused state, the session,
the outcome and the events.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from agent_plugin.redaction import REDACTED, looks_secret, redact
from agent_plugin.storage import Database
from tests.jobs_app import JobsEnv, jobs_env, worker_serving
from tests.test_live_routes import frames as parse_frames
from tests.test_live_routes import record_of, serve, wait_for
from tests.test_run_store import every_row

pytestmark = pytest.mark.timeout(90)

CANARY_KEY = "sk-ant-" + "Wc4nAry9XcV4bN8pR3tY6wZ1kA9b3Q"
CANARY_PASSWORD = "Canary-Pw-51c0e7aa"
CANARIES = (CANARY_KEY, CANARY_PASSWORD)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobsEnv]:
    environment = jobs_env(
        tmp_path_factory.mktemp("secrets"),
        login_password=CANARY_PASSWORD,
        login_key=CANARY_KEY,
        debug_logs="1",
    )
    with worker_serving(environment):
        yield environment


def redis_contents(env: JobsEnv, run_id: str) -> bytes:
    """Every value of every key of the test's queue, prefix and run, as bytes."""
    client = redis.Redis.from_url(env.redis_url)
    try:
        keys = {env.queue.encode(), *client.scan_iter(match=env.prefix + "*")}
        keys |= set(client.scan_iter(match=f"arq:*{run_id}*"))
        found = [b"keys: " + b" ".join(sorted(keys))]
        for key in keys:
            kind = client.type(key)
            if kind == b"string":
                found.append(client.get(key) or b"")
            elif kind == b"stream":
                found += [repr(entry).encode() for entry in client.xrange(key)]
            elif kind == b"zset":
                found += client.zrange(key, 0, -1)
            elif kind == b"hash":
                found.append(repr(client.hgetall(key)).encode())
            elif kind == b"list":
                found += client.lrange(key, 0, -1)
        return b"\n".join(found)
    finally:
        client.close()


def database_files(env: JobsEnv) -> bytes:
    """The SQLite database's files as they are on disk, free pages and write-ahead log too."""
    path = Path(env.database_url.removeprefix("sqlite+aiosqlite:///"))
    return b"".join(
        candidate.read_bytes()
        for candidate in (path, path.with_name(path.name + "-wal"))
        if candidate.exists()
    )


async def test_canaries_never_reach_the_stream_the_logs_the_database_or_redis(
    env: JobsEnv, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    rounds = [[["login", "ann"]], [["send", "k1"]], [["login", "bob"]]]
    prompt = json.dumps({"tag": "canary", "rounds": rounds, "echo": True})
    async with serve(env) as client:
        response = await client.post("/agent/runs", json={"prompt": prompt, "session": "s-canary"})
        assert response.status_code == 202, response.text
        run_id = str(response.json()["run_id"])
        paused = await wait_for(client, run_id, {"awaiting_approval"}, within=30)
        [call] = paused["awaiting"]
        assert call["name"] == "send"
        decided = await client.post(
            f"/agent/runs/{run_id}/decisions",
            json=[{"call_id": call["call_id"], "approval": {"verdict": "approve"}}],
        )
        assert decided.status_code == 202, decided.text
        done = await wait_for(client, run_id, {"complete"}, within=30)
        replay = await client.get(f"/agent/runs/{run_id}/events?follow=true")  # across the pause
        assert replay.status_code == 200
        frames = parse_frames(replay.text)
        assert [f["event"] for f in frames].count("run_end") == 2
        stream = json.dumps(frames)
        record = json.dumps(await record_of(client, run_id))
        database = await _every_row(env)

    # the secrets were there to leak: the login results and the answer held them
    answer = done["outcome"]["text"]
    assert answer.startswith("done after 3 rounds | ")
    assert f"password: {REDACTED}" in answer
    assert f"key {REDACTED}" in answer
    tools = [frame["data"] for frame in frames if frame["event"] == "tool_start"]
    assert [tool["arguments"].get("password") for tool in tools] == [REDACTED, None, REDACTED]

    worker_output = b"".join(path.read_bytes() for path in env.directory.glob("worker-*.out"))
    assert b"DEBUG" in worker_output  # every logger of the worker was on
    places = {
        "the event stream": stream.encode(),
        "the run record": record.encode(),
        "the app's logs": caplog.text.encode(),
        "the worker's logs": worker_output,
        "the database's rows": database.encode(),
        "the database's files": database_files(env),
        "redis": redis_contents(env, run_id),
    }
    for place, contents in places.items():
        for canary in CANARIES:
            for text in (canary, json.dumps(canary)[1:-1]):
                assert text.encode() not in contents, f"{canary!r} reached {place}"
            assert canary[:12].encode() not in contents, f"part of {canary!r} reached {place}"


async def _every_row(env: JobsEnv) -> str:
    database = Database(env.database_url)
    try:
        return await every_row(database)
    finally:
        await database.dispose()


def test_the_canaries_look_like_what_they_stand_for() -> None:
    """The canaries are caught by the shape of a key and by the name of a password field, not
    by a list of known values: a test with easier canaries would prove less."""
    assert looks_secret(CANARY_KEY)
    assert not looks_secret(CANARY_PASSWORD)
    assert redact({"password": CANARY_PASSWORD}) == {"password": REDACTED}
