"""Two arq worker processes pacing one provider through Redis (issue 23 item 5): the
provider answers 429 above its limit, and with pacing on the fleet never sees one."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agent_plugin.records import RunStatus
from tests.httpserver import HttpServer
from tests.jobs_app import WorkerProcess, clean_redis, jobs_env, make_plugin
from tests.test_pacing import LimitedProvider

pytestmark = pytest.mark.slow


async def test_two_workers_share_one_pace_and_see_no_429(tmp_path: Path) -> None:
    env = jobs_env(tmp_path, max_jobs="50")
    limited = LimitedProvider(limit=5, per=1.0)
    async with HttpServer(default=limited) as server:
        extra = {"PACING_TEST_URL": server.url + "/v1", "PACING_TEST_LIMIT": "4/1"}
        workers = [
            WorkerProcess(
                env, name=f"worker{i}", extra=extra, settings="tests.pacing_app.WorkerSettings"
            )
            for i in range(2)
        ]
        try:
            for worker in workers:
                worker.start(wait=False)
            for worker in workers:
                await asyncio.to_thread(worker.wait_ready)
            plugin = make_plugin(env.environ)
            async with plugin.open() as agent:
                started = time.monotonic()
                handles = [await agent.enqueue(f"task {i}") for i in range(16)]
                deadline = time.monotonic() + 60
                while True:
                    records = [await agent.jobs.store.get(h.run_id) for h in handles]
                    statuses = [r.status if r is not None else None for r in records]
                    if all(s not in (RunStatus.QUEUED, RunStatus.IN_PROGRESS) for s in statuses):
                        break
                    assert time.monotonic() < deadline, statuses
                    await asyncio.sleep(0.1)
                elapsed = time.monotonic() - started
        finally:
            for worker in workers:
                worker.stop()
            clean_redis(env)
    assert statuses == [RunStatus.COMPLETE] * 16
    assert limited.refused == 0
    assert limited.answered == 16
    assert elapsed >= 2.5  # 4 at once, then 12 more at 4 a second: 3 s
    # both workers made calls, so the pace held across processes
    assert {line.pid for line in env.lines("model_call")} == {worker.pid for worker in workers}
