"""Background runs that call an MCP tool, through a real arq worker process on the real Redis:
the worker starts its own session with the server at startup, its runs share it, and its
shutdown ends the server (issue 22)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from agent_plugin.records import RunRecord
from agent_plugin.web import AppAgent
from tests.jobs_app import WorkerProcess, clean_redis, jobs_env, make_plugin
from tests.mcp_harness import alive, calls

pytestmark = pytest.mark.timeout(90)


async def finished(agent: AppAgent, run_id: str, within: float = 30.0) -> RunRecord:
    deadline = time.monotonic() + within
    while True:
        record = await agent.run_status(run_id)
        if record.status not in ("queued", "in_progress"):
            return record
        assert time.monotonic() < deadline, f"gave up waiting: {record}"
        await asyncio.sleep(0.05)


def echo_plan(tag: str, text: str) -> str:
    return json.dumps({"tag": tag, "rounds": [[["files_echo", "k", {"text": text}]]], "echo": True})


async def test_a_background_run_calls_an_mcp_tool_through_the_workers_session(
    tmp_path: Path,
) -> None:
    log = tmp_path / "mcp.log"
    env = jobs_env(tmp_path, mcp_log=str(log))
    worker = WorkerProcess(env)
    worker.start()
    try:
        async with make_plugin(env.environ).open() as agent:
            texts = ["from the worker", "and again"]
            for number, text in enumerate(texts):
                handle = await agent.enqueue(echo_plan(f"mcp{number}", text))
                record = await finished(agent, handle.run_id)
                assert record.status == "complete", record
                assert record.outcome is not None
                assert record.outcome.model_dump()["text"] == (f'done after 1 rounds | "{text}"')
    finally:
        worker.stop()
        clean_redis(env)
    served = calls(log, "echo")
    assert [call.argument for call in served] == texts
    assert {call.ppid for call in served} == {worker.pid}  # the worker's own server
    [worker_server] = [call for call in calls(log, "started") if call.ppid == worker.pid]
    assert {call.pid for call in served} == {worker_server.pid}  # one session for both runs
    app_servers = [call for call in calls(log, "started") if call.ppid == os.getpid()]
    assert len(app_servers) == 1  # the app's process has its own
    assert not alive(worker_server.pid)  # the worker's shutdown ended it
