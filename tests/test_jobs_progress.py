"""How far a run is: the record's progress at each step, a tool's own reports (as events and,
throttled, on the record of a background run), and the step a run ended on."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest

from agent_plugin import Agent, RunOptions
from agent_plugin.events import AgentEvent, ToolProgress
from agent_plugin.ids import new_run_id
from agent_plugin.jobs import RunArgs, agent_run
from agent_plugin.jobs.progress import ProgressAtCheckpoints, ToolProgressWriter
from agent_plugin.journal import Replied
from agent_plugin.messages import ChatMessage, TokenUsage
from agent_plugin.outcomes import Completed
from agent_plugin.policy import ASK, ToolRules
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.records import RunStatus
from agent_plugin.storage import Database, SqlRunStore
from agent_plugin.tools import (
    MAX_PROGRESS_MESSAGE,
    TRUNCATION_MARKER,
    ToolContext,
    ToolEffect,
    tool,
)
from agent_plugin.web import AgentPlugin
from tests.jobs_app import clean_redis, in_process, jobs_env, options_from_env
from tests.test_storage import sqlite_url


class Gate:
    """A crawl tool that reports twice, then waits until the test lets it finish."""

    def __init__(self) -> None:
        self.reported = asyncio.Event()
        self.release = asyncio.Event()

    def tool(self) -> Any:
        @tool(effect=ToolEffect.READ_ONLY)
        async def crawl(pages: int, ctx: ToolContext) -> str:
            """Fetch pages."""
            await ctx.report_progress(0.1, "fetched 10 of 100 pages")
            await ctx.report_progress(0.4, f"fetched 40 of {pages} pages")
            self.reported.set()
            await self.release.wait()
            return "done"

        return crawl


def crawl_then_answer() -> ScriptedModel:
    return ScriptedModel([tool_call("crawl", {"pages": 100}), "all fetched"])


# --- the context -----------------------------------------------------------------------------


async def test_report_progress_checks_and_keeps_in_range() -> None:
    seen: list[tuple[float, str | None]] = []
    ctx = ToolContext(run_id="r", call_id="c", progress=lambda f, m: seen.append((f, m)))
    await ctx.report_progress(0.25, "a quarter")
    await ctx.report_progress(7, None)  # kept in range
    await ctx.report_progress(-1.0)
    await ctx.report_progress(0.5, "x" * (MAX_PROGRESS_MESSAGE + 50))
    assert seen[:3] == [(0.25, "a quarter"), (1.0, None), (0.0, None)]
    assert seen[3][1] is not None
    assert len(seen[3][1]) <= MAX_PROGRESS_MESSAGE + len(TRUNCATION_MARKER)
    assert seen[3][1].endswith(TRUNCATION_MARKER)
    for bad in (math.nan, math.inf, True, "0.5"):
        with pytest.raises(ValueError, match="fraction must be"):
            await ctx.report_progress(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="message must be text"):
        await ctx.report_progress(0.5, 42)  # type: ignore[arg-type]
    assert len(seen) == 4
    await ToolContext.detached("c").report_progress(0.5, "nowhere")  # outside a run: a no-op


async def test_a_foreground_run_streams_the_tools_progress_as_events() -> None:
    gate = Gate()
    gate.release.set()
    agent = Agent(crawl_then_answer(), tools=[gate.tool()])
    events: list[AgentEvent] = []
    turn = await agent.run("crawl", options=RunOptions(on_event=events.append))
    assert isinstance(turn.outcome, Completed)
    progress = [e for e in events if isinstance(e, ToolProgress)]
    assert [(e.fraction, e.message) for e in progress] == [
        (0.1, "fetched 10 of 100 pages"),
        (0.4, "fetched 40 of 100 pages"),
    ]
    assert {e.name for e in progress} == {"crawl"}
    types = [e.type for e in events]
    assert types.index("tool_start") < types.index("tool_progress") < types.index("tool_end")


# --- the record of a background run ----------------------------------------------------------


async def test_a_background_runs_record_shows_its_tools_progress_and_its_stream_the_events(
    tmp_path: Path,
) -> None:
    env = jobs_env(tmp_path)
    gate = Gate()
    plugin = AgentPlugin(
        tools=[gate.tool()],
        model=crawl_then_answer(),
        jobs=options_from_env(env.environ),
        environ=env.environ,
    )
    try:
        async with in_process(plugin) as here:
            run_id = new_run_id()
            await here.jobs.enqueue(run_id, RunArgs.checked("crawl"))
            job = asyncio.create_task(agent_run(here.job_ctx(run_id), run_id))
            await asyncio.wait_for(gate.reported.wait(), 10)
            record = await poll_record(here.jobs.store, run_id, "fetched 40")
            assert record.status is RunStatus.IN_PROGRESS
            assert record.progress_message == "step 1 of 8: fetched 40 of 100 pages"
            assert record.progress_pct == int(0.4 * 99 / 8)
            gate.release.set()
            result = await asyncio.wait_for(job, 10)
            done = await here.jobs.store.get(run_id)
            stream = await here.jobs.events(run_id)
            assert stream is not None
            events = [data async for _, data in stream]
    finally:
        clean_redis(env)
    assert result["status"] == "complete"
    assert done is not None
    assert (done.progress_pct, done.progress_message) == (100, "step 1 of 8")
    progress = [e for e in events if e["type"] == "tool_progress"]
    assert [e["message"] for e in progress] == [
        "fetched 10 of 100 pages",
        "fetched 40 of 100 pages",
    ]


async def test_a_run_paused_after_one_round_says_step_1(tmp_path: Path) -> None:
    env = jobs_env(tmp_path)
    gate = Gate()
    gate.release.set()
    plugin = AgentPlugin(
        tools=[gate.tool()],
        model=crawl_then_answer(),
        policy=ToolRules().for_tool("crawl", ASK),
        jobs=options_from_env(env.environ),
        environ=env.environ,
    )
    try:
        async with in_process(plugin) as here:
            run_id = new_run_id()
            await here.jobs.enqueue(run_id, RunArgs.checked("crawl"))
            result = await agent_run(here.job_ctx(run_id), run_id)
            record = await here.jobs.store.get(run_id)
    finally:
        clean_redis(env)
    assert result["status"] == "awaiting_approval"
    assert record is not None
    assert record.outcome is not None
    assert record.outcome.steps_used == 1
    assert record.progress_message == "step 1 of 8"
    assert record.progress_pct == 99 // 8


async def poll_record(store: SqlRunStore, run_id: str, text: str) -> Any:
    for _ in range(200):
        record = await store.get(run_id)
        if record is not None and text in (record.progress_message or ""):
            return record
        await asyncio.sleep(0.02)
    raise AssertionError(f"the record never said {text!r}: {record}")


# --- the writer ------------------------------------------------------------------------------


async def test_the_writer_throttles_keeps_the_latest_and_never_goes_back(tmp_path: Path) -> None:
    database = Database(sqlite_url(tmp_path / "progress.db"))
    await database.migrate()
    store = SqlRunStore(database)
    try:
        run_id = new_run_id()
        await store.create(run_id, origin="request", args={"prompt": "x"})
        await store.start(run_id)
        rule = ProgressAtCheckpoints(max_steps=4)
        reply = ChatMessage.assistant("calling")
        rule(Replied(step=1, message=reply, steps_used=2, usage=TokenUsage()))  # in step 2 of 4
        writer = ToolProgressWriter(store, run_id, rule, interval=0.1)
        for i in range(1, 1001):
            writer.report(ToolProgress(run_id=run_id, call_id="c", name="crawl", fraction=i / 1000))
            if i % 100 == 0:
                await asyncio.sleep(0.01)  # a tool that reports 1000 times in ~0.1 s
        await asyncio.sleep(0.35)
        record = await store.get(run_id)
        assert record is not None
        assert record.progress_message == "step 2 of 4: crawl 100%"
        assert record.progress_pct == int(2 * 99 / 4)
        assert 2 <= writer.writes <= 6  # a few, not a thousand
        # A report behind what the record says changes nothing.
        await store.progress(run_id, 80, "step 4 of 4")
        writer.report(ToolProgress(run_id=run_id, call_id="c", name="crawl", fraction=0.5))
        await asyncio.sleep(0.3)
        record = await store.get(run_id)
        assert record is not None
        assert (record.progress_pct, record.progress_message) == (80, "step 4 of 4")
        await writer.aclose()
    finally:
        await database.dispose()
