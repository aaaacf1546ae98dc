"""Spending windows across workers: two real arq worker processes run ten concurrent
background runs of one memory scope against one per-scope window in Redis, on a model whose
every call costs the most it may (``tests/spend_worker.py``). The held calls never pass the
limit together, and each run passes it by at most its one wrap-up call."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from redis.asyncio import Redis

from agent_plugin.ids import new_run_id
from agent_plugin.jobs.args import RunArgs
from agent_plugin.live.spend import RedisLedger
from agent_plugin.options import AgentOverrides
from agent_plugin.records import RunStatus
from agent_plugin.spend import Window
from tests.jobs_app import Plan, WorkerProcess, clean_redis, jobs_env, make_plugin

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

LIMIT = 0.1
"""The tenant's window, in USD; the ten runs would spend about three times as much."""
PER_TOKEN = 1e-6  # $1 a million tokens, in and out
RUNS = 10
ROUNDS = 6


def configure(config: Path, on_exhausted: str) -> None:
    """The window, the prices and a token budget the runs never reach."""
    config.write_text(
        "[agent]\n"
        'provider = "scripted"\n'
        "max_steps = 8\n"
        "max_tokens = 1000000\n"
        f"budget_scope_usd = {LIMIT}\n"
        f'budget_on_exhausted = "{on_exhausted}"\n'
        '[agent.prices."scripted"]\n'
        "input = 1.0\n"
        "output = 1.0\n",
        encoding="utf-8",
    )


@pytest.mark.parametrize("on_exhausted", ["wrap_up", "stop"])
async def test_two_workers_overshoot_a_scope_window_by_at_most_one_call_each(
    tmp_path: Path, on_exhausted: str
) -> None:
    env = jobs_env(tmp_path)
    configure(Path(env.environ["AGENT_CONFIG_FILE"]), on_exhausted)
    env.environ["JOBS_TEST_MAX_JOBS"] = str(RUNS // 2)  # neither worker can take every run
    workers = [
        WorkerProcess(env, name=f"worker{i}", settings="tests.spend_worker.WorkerSettings")
        for i in range(2)
    ]
    redis = Redis.from_url(env.redis_url)
    try:
        for worker in workers:
            worker.start()
        plugin = make_plugin(env.environ)
        async with plugin.open() as agent:
            assert agent.jobs is not None
            overrides = AgentOverrides(memory_scope="tenant-a")
            run_ids = [new_run_id() for _ in range(RUNS)]
            for i, run_id in enumerate(run_ids):
                plan = Plan(
                    tag=f"run{i}",
                    rounds=[[("effect", f"r{i}k{k}")] for k in range(ROUNDS)],
                    model_delay=0.05,
                )
                await agent.jobs.enqueue(
                    run_id, RunArgs(prompt=plan.model_dump_json(), overrides=overrides)
                )
            deadline = time.monotonic() + 120
            while True:
                records = [await agent.jobs.get(run_id) for run_id in run_ids]
                if all(r.status is RunStatus.COMPLETE for r in records):
                    break
                assert all(
                    r.status in (RunStatus.QUEUED, RunStatus.IN_PROGRESS, RunStatus.COMPLETE)
                    for r in records
                ), [r.status for r in records]
                assert time.monotonic() < deadline, [r.status for r in records]
                await asyncio.sleep(0.1)
        calls = env.lines("priced_call")
        # both workers ran the runs, concurrently
        assert {line.pid for line in calls} == {w.pid for w in workers}
        costs = [int(line.args[1]) * PER_TOKEN for line in calls]
        held = sum(c for c, line in zip(costs, calls, strict=True) if line.args[2] == "0")
        wrap_ups = [line.args[0] for line in calls if line.args[2] == "1"]
        ledger = RedisLedger(redis, prefix=env.prefix)
        spent = await ledger.spent(Window("scope", "scope:tenant-a", LIMIT))
        overshoot = spent - LIMIT
        print(
            f"\n{on_exhausted}: window ${LIMIT}: {len(calls)} calls, held ${held:.6f}, "
            f"spent ${spent:.6f}, "
            f"overshoot ${max(overshoot, 0.0):.6f} from {len(wrap_ups)} wrap-ups, "
            f"largest call ${max(costs):.6f}"
        )
        assert spent == pytest.approx(sum(costs))  # every call settled at its cost
        assert held <= LIMIT + 1e-9  # the held calls never passed the limit together
        assert len(wrap_ups) == len(set(wrap_ups))  # one wrap-up a run, at most
        assert overshoot <= RUNS * max(costs)
        # the window ran out: fewer calls than the plans, and the runs say how they ended
        assert len(calls) < RUNS * (ROUNDS + 1)
        outcomes = [r.outcome for r in records if r.outcome is not None]
        if on_exhausted == "wrap_up":
            assert wrap_ups
            assert [o.text for o in outcomes].count("wrapped up") == len(wrap_ups)
        else:
            assert not wrap_ups
            assert overshoot <= 1e-9  # no call past the limit at all
            stopped = [o for o in outcomes if o.status == "budget_exhausted"]
            assert stopped
            assert {(o.reason, o.window) for o in stopped} == {("window", "scope")}
    finally:
        for worker in workers:
            worker.stop()
        clean_redis(env)
        await redis.aclose()
