"""Spending windows (agent_plugin.spend, agent_plugin.live.spend): the windows a run spends
from, holds and settlements in both ledgers (in-process and on the suite's Redis), and a run
that meets a window without room: stopped, or wrapped up on both wires."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from redis.asyncio import Redis

from agent_plugin.agent import Agent
from agent_plugin.compaction import Compaction
from agent_plugin.config import AgentSettings
from agent_plugin.delegate import AgentTool
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import AgentEvent, BudgetSpent, BudgetWarning, OutcomeSummary
from agent_plugin.jobs import JobOptions
from agent_plugin.live.spend import RedisLedger
from agent_plugin.messages import ChatMessage, Role, TokenUsage, ToolResultPart
from agent_plugin.options import AgentOverrides, RunOptions
from agent_plugin.outcomes import BudgetExhausted, Completed
from agent_plugin.pricing import ModelPrice, Prices
from agent_plugin.providers.base import ChatRequest
from agent_plugin.providers.openai import OpenAICompatibleClient
from agent_plugin.providers.profiles import replace as replace_profile
from agent_plugin.providers.retry import RetryPolicy
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.runtime import AgentRuntime, windows_of
from agent_plugin.sessions import InMemorySessionStore
from agent_plugin.spend import (
    WRAP_UP_NOTE,
    BudgetWindows,
    Hold,
    LocalLedger,
    Refused,
    RunSpend,
    SpendLedger,
    Window,
    WindowExhausted,
)
from agent_plugin.telemetry import Telemetry
from agent_plugin.tools import definition_of, tool
from agent_plugin.web import AgentPlugin
from tests.services import REDIS_URL
from tests.wire_agent import KEY, WIRES, Recorder, Wire, client, text_reply

PRICE = ModelPrice(input=1000.0, output=1000.0)  # $0.001 a token
MODELS = (
    "scripted",
    "gpt-4o",
    "gpt-4o-2024-08-06",
    "claude-sonnet-4-5",
    "claude-sonnet-4-20250514",
)
TELEMETRY = Telemetry(prices=Prices(dict.fromkeys(MODELS, PRICE), table=False))


@tool
def work(n: int) -> int:
    """Work."""
    return n


# --- the windows -----------------------------------------------------------------------------


def test_a_run_spends_from_the_windows_that_cover_it() -> None:
    windows = BudgetWindows(session_usd=1.0, scope_usd=5.0, day_usd=50.0)
    now = datetime(2026, 12, 2, 23, 59, tzinfo=UTC)
    names = [(w.name, w.key, w.limit, w.ttl) for w in windows.of_run("s1", "alice", now)]
    assert names == [
        ("session", "session:s1", 1.0, None),
        ("scope", "scope:alice", 5.0, None),
        ("day", "day:2026-12-02", 50.0, 2 * 86_400),
    ]
    # a run without a session has no session window
    assert [w.name for w in windows.of_run(None, "alice", now)] == ["scope", "day"]
    assert not BudgetWindows().any


@pytest.mark.parametrize(
    "bad",
    [
        {"scope_usd": 0.0},
        {"day_usd": -1.0},
        {"warn_fraction": 1.0},
        {"warn_fraction": 0.0},
        {"on_exhausted": "later"},
    ],
)
def test_bad_windows_are_config_errors(bad: dict[str, Any]) -> None:
    with pytest.raises(AgentError) as caught:
        BudgetWindows(**bad)
    assert caught.value.kind is ErrorKind.CONFIG


def test_the_settings_configure_the_windows() -> None:
    settings = AgentSettings.load(
        environ={
            "AGENT_BUDGET_SCOPE_USD": "2.5",
            "AGENT_BUDGET_DAY_USD": "40",
            "AGENT_BUDGET_WARN_FRACTION": "0.5",
            "AGENT_BUDGET_ON_EXHAUSTED": "stop",
        }
    )
    windows = windows_of(settings)
    assert windows == BudgetWindows(
        scope_usd=2.5, day_usd=40.0, warn_fraction=0.5, on_exhausted="stop"
    )
    assert windows_of(AgentSettings.load(environ={})) == BudgetWindows()


async def test_the_runtime_keeps_the_windows_in_redis_under_the_key_prefix(
    tmp_path: Path,
) -> None:
    prefix = f"agent-test-{uuid.uuid4().hex[:12]}:"
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\nprovider = "scripted"\nbudget_scope_usd = 3.0\n')
    environ = {
        "AGENT_REDIS_URL": REDIS_URL,
        "AGENT_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'runs.db'}",
    }
    plugin = AgentPlugin(
        model=ScriptedModel(["hi"]),
        config_file=config,
        environ=environ,
        jobs=JobOptions(key_prefix=prefix),
    )
    runtime = await plugin.start()
    try:
        ledger = runtime.ledger
        assert isinstance(ledger, RedisLedger)
        assert ledger.prefix == f"{prefix}budget:"
        built = runtime.agent_for(AgentOverrides(memory_scope="tenant-b"))
        assert built.spending is not None
        assert built.spending.ledger is ledger
        assert built.spending.scope == "tenant-b"
        assert built.spending.windows.scope_usd == 3.0
    finally:
        await runtime.aclose()
    without = AgentPlugin(model=ScriptedModel(["hi"]), environ=environ, config_file=None)
    plain = await without.start()
    try:
        assert plain.ledger is None
        assert plain.agent_for().spending is None
    finally:
        await plain.aclose()


async def test_a_runtime_without_redis_shares_one_ledger_among_its_agents() -> None:
    settings = AgentSettings.load(environ={"AGENT_BUDGET_DAY_USD": "1"}, config_file=None)
    runtime = AgentRuntime(
        settings=settings, client=ScriptedModel(["hi"]), session_store=InMemorySessionStore()
    )
    try:
        first = runtime.agent_for(AgentOverrides(memory_scope="x")).spending
        second = runtime.agent_for(AgentOverrides(memory_scope="y")).spending
        assert first is not None
        assert second is not None
        assert isinstance(runtime.ledger, LocalLedger)
        assert first.ledger is second.ledger is runtime.ledger
    finally:
        await runtime.aclose()


# --- the ledgers -----------------------------------------------------------------------------


@pytest.fixture(params=["local", "redis"])
async def ledger(request: pytest.FixtureRequest) -> AsyncIterator[SpendLedger]:
    if request.param == "local":
        yield LocalLedger()
        return
    redis = Redis.from_url(REDIS_URL)
    prefix = f"agent-test-{uuid.uuid4().hex[:12]}:"
    try:
        yield RedisLedger(redis, prefix=prefix)
    finally:
        keys = [key async for key in redis.scan_iter(match=prefix + "*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


def windows(limit: float = 1.0) -> tuple[Window, ...]:
    key = uuid.uuid4().hex
    return (Window("session", f"session:{key}", 10.0), Window("scope", f"scope:{key}", limit))


async def spent(ledger: SpendLedger, window: Window) -> float:
    assert isinstance(ledger, LocalLedger | RedisLedger)
    return await ledger.spent(window)


async def test_a_hold_is_settled_at_the_call_s_cost(ledger: SpendLedger) -> None:
    session, scope = both = windows(1.0)
    hold = await ledger.reserve(both, 0.6)
    assert isinstance(hold, Hold)
    # the hold counts: another one that would pass the limit has to wait for it
    busy = await ledger.reserve(both, 0.6)
    assert isinstance(busy, Refused)
    assert busy.busy
    assert busy.window == scope
    assert busy.used == pytest.approx(0.6)
    assert await ledger.settle(hold, 0.25) == pytest.approx((0.25, 0.25))
    assert await spent(ledger, scope) == pytest.approx(0.25)
    again = await ledger.reserve(both, 0.6)
    assert isinstance(again, Hold)
    await ledger.settle(again, 0.7)
    # spent alone leaves no room: exhausted, not busy, and nothing was held
    refused = await ledger.reserve(both, 0.1)
    assert isinstance(refused, Refused)
    assert (refused.window, refused.busy) == (scope, False)
    assert refused.used == pytest.approx(0.95)
    assert refused.spent == pytest.approx(0.95)
    assert await spent(ledger, session) == pytest.approx(0.95)


async def test_a_refused_hold_holds_nothing_in_any_window(ledger: SpendLedger) -> None:
    session, _ = both = windows(1.0)
    assert isinstance(await ledger.reserve(both, 1.5), Refused)
    # the session window, which had room, holds nothing either
    hold = await ledger.reserve((session,), 10.0)
    assert isinstance(hold, Hold)
    await ledger.settle(hold, 0.0)
    assert await spent(ledger, session) == 0.0


async def test_concurrent_holds_never_pass_the_limit(ledger: SpendLedger) -> None:
    both = windows(1.0)
    answers = await asyncio.gather(*(ledger.reserve(both, 0.3) for _ in range(20)))
    held = [a for a in answers if isinstance(a, Hold)]
    assert len(held) == 3
    assert all(isinstance(a, Refused) and a.busy for a in answers if a not in held)


async def test_a_lapsed_hold_frees_its_room() -> None:
    redis = Redis.from_url(REDIS_URL)
    prefix = f"agent-test-{uuid.uuid4().hex[:12]}:"
    try:
        lapsing = RedisLedger(redis, prefix=prefix, hold_secs=0.2)
        both = windows(1.0)
        assert isinstance(await lapsing.reserve(both, 0.8), Hold)  # never settled: it died
        assert isinstance(await lapsing.reserve(both, 0.8), Refused)
        await asyncio.sleep(0.3)
        assert isinstance(await lapsing.reserve(both, 0.8), Hold)
        # a day window's keys expire
        day = Window("day", f"day:{uuid.uuid4().hex}", 5.0, ttl=3600)
        hold = await lapsing.reserve((day,), 1.0)
        assert isinstance(hold, Hold)
        await lapsing.settle(hold, 0.5)
        ttl = await redis.ttl(f"{prefix}budget:{day.key}:spent")
        assert 3500 < ttl <= 3600
    finally:
        keys = [key async for key in redis.scan_iter(match=prefix + "*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


async def test_a_redis_that_cannot_be_reached_is_unavailable() -> None:
    redis = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=1)
    try:
        down = RedisLedger(redis)
        with pytest.raises(AgentError) as caught:
            await down.reserve(windows(1.0), 0.1)
        assert caught.value.kind is ErrorKind.UNAVAILABLE
        assert "spending windows" in caught.value.message
        with pytest.raises(AgentError) as settling:
            await down.settle(Hold(windows(1.0), 0.1), 0.05)
        assert settling.value.kind is ErrorKind.UNAVAILABLE
    finally:
        await redis.aclose()


class Flaky(LocalLedger):
    """A ledger whose settlements fail (its store went away after the hold)."""

    async def settle(self, hold: Hold, cost: float) -> tuple[float, ...]:
        raise AgentError(ErrorKind.UNAVAILABLE, "gone")


async def test_a_reply_stands_when_its_cost_cannot_be_settled() -> None:
    model = ScriptedModel(["the answer"])
    turn = await agent(model, Flaky(), scope_usd=1.0).run("go")
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "the answer"
    failing = ScriptedModel([AgentError(ErrorKind.PROVIDER, "bad request")])
    with pytest.raises(AgentError) as caught:  # the call's own error, not the ledger's
        await agent(failing, Flaky(), scope_usd=1.0).run("go")
    assert caught.value.message == "bad request"


# --- a run's spending ------------------------------------------------------------------------


async def prefilled(limit: float, room: float, ledger: LocalLedger | None = None) -> LocalLedger:
    """A ledger whose ``scope:agent`` window of ``limit`` has ``room`` left."""
    ledger = ledger or LocalLedger()
    window = Window("scope", "scope:agent", limit)
    hold = await ledger.reserve((window,), 0.0)
    assert isinstance(hold, Hold)
    await ledger.settle(hold, limit - room)
    return ledger


def agent(model: Any, ledger: SpendLedger, **windows: Any) -> Agent[Any]:
    return Agent(
        model,
        tools=[work],
        max_steps=50,
        max_tokens=600,
        telemetry=TELEMETRY,
        budget_windows=BudgetWindows(**windows),
        spend_ledger=ledger,
    )


async def test_a_run_stops_budget_exhausted_naming_the_window() -> None:
    model = ScriptedModel(["never sent"])
    ledger = await prefilled(limit=1.0, room=0.1)  # a call's most is ~$0.6
    outcome = (await agent(model, ledger, scope_usd=1.0, on_exhausted="stop").run("go")).outcome
    assert isinstance(outcome, BudgetExhausted)
    assert (outcome.reason, outcome.window) == ("window", "scope")
    assert model.calls == 0
    assert outcome.model_dump()["window"] == "scope"
    summary = OutcomeSummary.of(outcome)  # what records and streams carry
    assert (summary.reason, summary.window) == ("window", "scope")
    # other outcomes' summaries have no window key at all
    assert (
        "window"
        not in OutcomeSummary.of(Completed(text="", steps_used=0, usage=TokenUsage())).model_dump()
    )


async def test_calls_are_settled_at_their_cost_and_told() -> None:
    model = ScriptedModel([tool_call("work", {"n": i}) for i in range(3)] + ["done"])
    ledger = LocalLedger()
    events: list[AgentEvent] = []
    run = agent(model, ledger, session_usd=100.0, scope_usd=100.0, day_usd=100.0)
    turn = await run.run("go", options=RunOptions(on_event=events.append), session_id="s1")
    assert isinstance(turn.outcome, Completed)
    told = [e for e in events if isinstance(e, BudgetSpent)]
    assert [e.cost_usd for e in told] == pytest.approx([0.015] * 4)  # 10 in, 5 out
    assert told[-1].windows == pytest.approx({"session": 0.06, "scope": 0.06, "day": 0.06})
    assert ledger.held == pytest.approx(dict.fromkeys(ledger.held, 0.0))  # every hold settled


async def test_a_window_warns_once_at_its_fraction() -> None:
    model = ScriptedModel([tool_call("work", {"n": i}) for i in range(5)] + ["done"])
    ledger = await prefilled(limit=10.0, room=5.02)  # 4.98 spent: the 2nd call passes 5.0
    events: list[AgentEvent] = []
    run = agent(model, ledger, scope_usd=10.0, warn_fraction=0.5)
    await run.run("go", options=RunOptions(on_event=events.append))
    warnings = [e for e in events if isinstance(e, BudgetWarning)]
    assert len(warnings) == 1
    (warning,) = warnings
    assert (warning.window, warning.limit_usd) == ("scope", 10.0)
    assert warning.spent_usd == pytest.approx(5.01)
    kinds = [e.type for e in events if e.type.startswith("budget")]
    assert kinds == ["budget_spent", "budget_spent", "budget_warning"] + ["budget_spent"] * 4


async def test_a_run_wraps_up_with_tools_kept_and_tool_choice_none() -> None:
    model = ScriptedModel(["here is what I have"])
    ledger = await prefilled(limit=1.0, room=0.1)
    turn = await agent(model, ledger, scope_usd=1.0).run("go")
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "here is what I have"
    (request,) = model.requests
    assert request.tool_choice == "none"
    assert [t.name for t in request.tools] == ["work"]  # the prompt's tool block stays
    assert request.messages[-1].text == WRAP_UP_NOTE
    # the note is the request's, not the conversation's
    assert [m.text for m in turn.messages] == ["go", "here is what I have"]
    assert await ledger.spent(Window("scope", "scope:agent", 1.0)) == pytest.approx(0.915)


class Ticket(BaseModel):
    title: str


async def test_a_typed_run_wraps_up_through_its_final_result_tool() -> None:
    model = ScriptedModel([tool_call("final_result", {"title": "partial"})])
    ledger = await prefilled(limit=1.0, room=0.1)
    typed = Agent(
        model,
        tools=[work],
        max_tokens=600,
        output_type=Ticket,
        telemetry=TELEMETRY,
        budget_windows=BudgetWindows(scope_usd=1.0),
        spend_ledger=ledger,
    )
    turn = await typed.run("go")
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.output == Ticket(title="partial")
    (request,) = model.requests
    assert request.tool_choice == "final_result"
    assert sorted(t.name for t in request.tools) == ["final_result", "work"]


async def test_a_sub_agent_spends_from_its_parent_s_windows() -> None:
    child_model = ScriptedModel(["the child's answer"])
    child = Agent(child_model, max_tokens=600, telemetry=TELEMETRY)  # no windows of its own
    helper = AgentTool(child, name="helper", description="Helps.")
    parent_model = ScriptedModel([tool_call("helper", {"task": "help"}), "done"])
    ledger = LocalLedger()
    parent = Agent(
        parent_model,
        tools=[helper],
        max_tokens=5000,
        memory_scope="tenant-c",
        telemetry=TELEMETRY,
        budget_windows=BudgetWindows(session_usd=100.0, scope_usd=100.0),
        spend_ledger=ledger,
    )
    turn = await parent.run("go", session_id="s9")
    assert isinstance(turn.outcome, Completed)
    assert (parent_model.calls, child_model.calls) == (2, 1)
    # three calls of $0.015, the child's in the parent's session and scope windows
    assert ledger.spent_by == pytest.approx({"session:s9": 0.045, "scope:tenant-c": 0.045})
    # outside a parent's tool call, the child has no windows
    await child.run("alone")
    assert ledger.spent_by == pytest.approx({"session:s9": 0.045, "scope:tenant-c": 0.045})


async def test_a_sub_agent_stopped_by_its_parent_s_window() -> None:
    child_model = ScriptedModel(["never sent"])
    child = Agent(child_model, max_tokens=2000, telemetry=TELEMETRY)  # a call's most: ~$2
    helper = AgentTool(child, name="helper", description="Helps.")
    parent_model = ScriptedModel([tool_call("helper", {"task": "help"}), "done"])
    # room for the parent's calls (their most: ~$0.6), not for the child's
    ledger = await prefilled(limit=1.0, room=0.7)
    parent = Agent(
        parent_model,
        tools=[helper],
        max_tokens=600,
        telemetry=TELEMETRY,
        budget_windows=BudgetWindows(scope_usd=1.0, on_exhausted="stop"),
        spend_ledger=ledger,
    )
    turn = await parent.run("go")
    assert isinstance(turn.outcome, Completed)
    assert (parent_model.calls, child_model.calls) == (2, 0)
    (result,) = [m for m in turn.messages if m.role is Role.TOOL]
    (part,) = result.content
    assert isinstance(part, ToolResultPart)
    stopped = json.loads(part.tool_result.content)["outcome"]  # the child's outcome
    assert (stopped["status"], stopped["reason"], stopped["window"]) == (
        "budget_exhausted",
        "window",
        "scope",
    )


async def test_only_one_wrap_up_then_the_run_stops() -> None:
    # the model calls a tool in its wrap-up anyway: the next call finds no room and no wrap-up
    model = ScriptedModel([tool_call("work", {"n": 1}), "never sent"])
    ledger = await prefilled(limit=1.0, room=0.1)
    outcome = (await agent(model, ledger, scope_usd=1.0).run("go")).outcome
    assert isinstance(outcome, BudgetExhausted)
    assert (outcome.reason, outcome.window) == ("window", "scope")
    assert model.calls == 1


async def test_a_window_spent_to_its_limit_gives_a_new_run_no_wrap_up() -> None:
    # a wrap-up is one call past the limit per run as the window runs out, not one per run
    # for ever: once the window's settled total reaches its limit, runs stop without a call
    ledger = await prefilled(limit=1.0, room=0.01)
    first = ScriptedModel(["what I have"])
    assert isinstance((await agent(first, ledger, scope_usd=1.0).run("go")).outcome, Completed)
    assert first.calls == 1  # the wrap-up took the window past its limit
    for _ in range(3):
        later = ScriptedModel(["never sent"])
        outcome = (await agent(later, ledger, scope_usd=1.0).run("go")).outcome
        assert isinstance(outcome, BudgetExhausted)
        assert later.calls == 0
    assert await ledger.spent(Window("scope", "scope:agent", 1.0)) == pytest.approx(1.005)


async def test_a_call_that_fails_releases_its_hold() -> None:
    model = ScriptedModel([AgentError(ErrorKind.UNAVAILABLE, "down")])
    ledger = LocalLedger()
    with pytest.raises(AgentError):
        await agent(model, ledger, scope_usd=1.0).run("go")
    assert ledger.held == {"scope:agent": 0.0}
    assert ledger.spent_by == {"scope:agent": 0.0}


async def test_a_wrap_up_folded_after_an_overflow_keeps_its_note() -> None:
    model = ScriptedModel(
        [AgentError(ErrorKind.CONTEXT_TOO_LONG, "too long"), "the summary", "wrapped up"]
    )
    ledger = await prefilled(limit=1.0, room=0.1)
    history = [
        ChatMessage.user("first question " * 10),
        ChatMessage.assistant("first answer " * 10),
        ChatMessage.user("second question"),
        ChatMessage.assistant("second answer"),
    ]
    compaction = Compaction(trigger_tokens=1_000_000, keep_recent_tokens=1)
    run = agent(model, ledger, scope_usd=1.0)
    turn = await run.run("go", history=history, options=RunOptions(compaction=compaction))
    assert isinstance(turn.outcome, Completed)
    assert turn.folded is not None
    retried = model.requests[-1]
    assert retried.messages[-1].text == WRAP_UP_NOTE
    assert retried.messages[-2].text == "go"
    assert retried.tool_choice == "none"


async def test_windows_need_priced_calls() -> None:
    unpriced = Agent(
        ScriptedModel(["hi"]),
        budget_windows=BudgetWindows(day_usd=1.0),
        telemetry=Telemetry(prices=Prices(table=False)),
    )
    with pytest.raises(AgentError) as caught:
        await unpriced.run("go")
    assert caught.value.kind is ErrorKind.CONFIG
    assert "scripted" in caught.value.message


async def test_a_run_waits_for_others_holds_to_settle() -> None:
    ledger = LocalLedger()
    window = Window("scope", "scope:agent", 1.0)
    other = await ledger.reserve((window,), 0.8)  # another run's call, in flight
    assert isinstance(other, Hold)
    model = ScriptedModel(["done"])
    running = asyncio.ensure_future(agent(model, ledger, scope_usd=1.0).run("go"))
    await asyncio.sleep(0.1)
    assert model.calls == 0
    assert not running.done()
    await ledger.settle(other, 0.1)
    turn = await asyncio.wait_for(running, 5)
    assert isinstance(turn.outcome, Completed)
    assert model.calls == 1


async def test_a_wait_for_room_ends_at_the_run_s_deadline() -> None:
    ledger = LocalLedger()
    other = await ledger.reserve((Window("scope", "scope:agent", 1.0),), 0.8)  # never settles
    assert isinstance(other, Hold)
    model = ScriptedModel(["never sent"])
    slow = Agent(
        model,
        max_duration=0.3,
        max_tokens=600,  # a call's most: ~$0.6, room once the other hold settles
        telemetry=TELEMETRY,
        budget_windows=BudgetWindows(scope_usd=1.0),
        spend_ledger=ledger,
    )
    started = asyncio.get_running_loop().time()
    outcome = (await slow.run("go")).outcome
    assert isinstance(outcome, BudgetExhausted)
    assert outcome.reason == "deadline"
    assert model.calls == 0
    assert asyncio.get_running_loop().time() - started < 1.0
    assert ledger.held == {"scope:agent": 0.8}  # the waiting run held nothing


async def test_the_estimate_is_the_prompt_and_the_whole_output_cap() -> None:
    spend = RunSpend(
        BudgetWindows(day_usd=1.0),
        LocalLedger(),
        run_id="r1",
        session_id=None,
        scope="agent",
        price=lambda usage, model: usage.input_tokens * 1.0 + usage.output_tokens * 100.0,
        emit=None,
    )
    request = ChatRequest(messages=[ChatMessage.user("x" * 40)], max_tokens=7)
    assert spend.estimate(request) == 14 + 700  # 10 tokens of text, 4 of overhead
    with_tools = ChatRequest(messages=request.messages, tools=[definition_of(work)], max_tokens=7)
    assert spend.estimate(with_tools) > 714

    async def answered(request: ChatRequest, note: ChatMessage | None) -> Any:
        raise AssertionError("not asked")

    spend.ledger = await prefilled(limit=1.0, room=0.0)
    spend.windows = BudgetWindows(scope_usd=1.0, on_exhausted="stop")
    with pytest.raises(WindowExhausted) as caught:
        await spend.call(request, answered)
    assert caught.value.window == "scope"


def test_the_estimate_prices_the_prompt_as_a_cache_write_where_that_is_dearer() -> None:
    writes_dear = Prices({"m": ModelPrice(input=1.0, output=0.0, cache_write=1.25)}, table=False)
    reads_cheap = Prices({"m": ModelPrice(input=1.0, output=0.0, cache_write=0.5)}, table=False)
    request = ChatRequest(messages=[ChatMessage.user("x" * 3996)], max_tokens=0)  # 1003 tokens

    def estimate(prices: Prices) -> float:
        spend = RunSpend(
            BudgetWindows(day_usd=1.0),
            LocalLedger(),
            run_id="r1",
            session_id=None,
            scope="agent",
            price=lambda usage, model: prices.cost(usage, model="m", provider="scripted"),
            emit=None,
        )
        return spend.estimate(request)

    assert estimate(writes_dear) == pytest.approx(1003 * 1.25 / 1e6)
    assert estimate(reads_cheap) == pytest.approx(1003 * 1.0 / 1e6)


# --- the wrap-up on the wire -----------------------------------------------------------------


@pytest.mark.parametrize("wire", WIRES)
async def test_the_wrap_up_on_the_wire(wire: Wire) -> None:
    sent = Recorder()
    model = client(wire, [text_reply(wire, "all I have")], sent)
    ledger = await prefilled(limit=1.0, room=0.01)
    turn = await agent(model, ledger, scope_usd=1.0).run("go")
    assert isinstance(turn.outcome, Completed)
    body = sent.json(0)
    assert [t.get("name") or t["function"]["name"] for t in body["tools"]] == ["work"]
    assert body["tool_choice"] == ("none" if wire == "openai" else {"type": "none"})
    last = body["messages"][-1]
    text = last["content"] if isinstance(last["content"], str) else last["content"][-1]["text"]
    assert (last["role"], text) == ("user", WRAP_UP_NOTE)


async def test_an_endpoint_without_tool_choice_stops_instead_of_wrapping_up() -> None:
    sent: list[httpx.Request] = []

    def never(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(500)

    model = OpenAICompatibleClient(
        api_key=KEY,
        retry=RetryPolicy.never(),
        transport=httpx.MockTransport(never),
        model="gpt-4o",
        profile=replace_profile("ollama"),
    )
    ledger = await prefilled(limit=1.0, room=0.01)
    outcome = (await agent(model, ledger, scope_usd=1.0).run("go")).outcome
    assert isinstance(outcome, BudgetExhausted)
    assert (outcome.reason, outcome.window) == ("window", "scope")
    assert sent == []
