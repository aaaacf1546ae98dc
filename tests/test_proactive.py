"""Always-on behaviour: the proactive acceptance cases of reference §1.23 that need no job
runtime, plus cron parsing, the arq field mapping and the webhook delivery over real HTTP."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from arq.cron import next_cron

from agent_plugin import sessions
from agent_plugin.agent import Agent
from agent_plugin.config import AgentSettings
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import OutcomeSummary
from agent_plugin.messages import ChatMessage, Role, TextPart, TokenUsage, ToolCall, ToolResultPart
from agent_plugin.options import AgentOverrides, RunOptions
from agent_plugin.outcomes import (
    AgentOutcome,
    AwaitingApproval,
    BudgetExhausted,
    Completed,
    LoopDetected,
    NeedsApproval,
    PendingCall,
    RunInfo,
    RunState,
)
from agent_plugin.policy import (
    ASK,
    READ_ONLY_REASON,
    AllowAll,
    Deny,
    RequireApproval,
    Strictest,
    ToolPolicy,
    ToolRules,
)
from agent_plugin.proactive import (
    APPROVAL_HEADER,
    DEFAULT_DELIVERY_TIMEOUT,
    DEFAULT_PROMPT,
    HEARTBEAT_OK,
    HEARTBEAT_TASK,
    KEY_HEADER,
    MAX_CHAIN,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    CronSpec,
    FollowupPlan,
    FollowupTool,
    Heartbeat,
    LogDelivery,
    Report,
    ReportSource,
    TickStatus,
    WebhookDelivery,
    deliver_outcome,
    deliver_safely,
    heartbeat_tick,
    is_silent,
    report_for,
    report_text,
    verify_webhook,
    webhook_signature,
)
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.redaction import REDACTED, redact_text
from agent_plugin.runtime import AgentRuntime
from agent_plugin.sessions import InMemorySessionStore
from agent_plugin.tools import FnTool, Tool, ToolContext, ToolEffect
from tests.httpserver import Hang, HttpServer, RecordedRequest, Reply

SECRET = "whsec-test-0123456789abcdef"
USAGE = TokenUsage()


# --- helpers ---------------------------------------------------------------------------------


class Inbox:
    """A Delivery that keeps every report."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    async def deliver(self, report: Report) -> None:
        self.reports.append(report)


class Broken:
    """A Delivery that always fails, with a credential in its error message."""

    async def deliver(self, report: Report) -> None:
        raise RuntimeError("smtp login failed for sk-live-abcdefghijklmnopqrstuvwxyz012345")


class Stuck:
    """A Delivery that never finishes."""

    timeout = 0.05

    async def deliver(self, report: Report) -> None:
        await asyncio.Event().wait()


def done(text: str) -> Completed:
    return Completed(text=text, steps_used=0, usage=USAGE)


def awaiting(*calls: ToolCall) -> AwaitingApproval:
    state = RunState(
        run_id="r",
        messages=[],
        steps_used=1,
        pending=[PendingCall(call=c, status=NeedsApproval(reason="r")) for c in calls],
    )
    return AwaitingApproval(state=state)


def restart_tool(count: list[int]) -> FnTool:
    async def restart(args: Any) -> str:
        count.append(1)
        return "restarted"

    return FnTool("restart_server", "Restarts.", {"type": "object"}, restart,
                  effect=ToolEffect.EXTERNAL)  # fmt: skip


def tool_results(message: ChatMessage) -> list[str]:
    assert message.role is Role.TOOL
    return [p.tool_result.content for p in message.content if isinstance(p, ToolResultPart)]


def last_prompt(model: ScriptedModel) -> str:
    part = model.requests[-1].messages[-1].content[0]
    assert isinstance(part, TextPart)
    return part.text


def ctx(session_id: str | None = "chat-9") -> ToolContext:
    return ToolContext(run_id="run_parent", call_id="c1", session_id=session_id, step=2)


def runtime_for(
    model: ScriptedModel, tools: list[Tool] | None = None, policy: ToolPolicy | None = None
) -> AgentRuntime:
    """A runtime on ``model`` with in-memory sessions (what a worker runs agents with)."""
    return AgentRuntime(
        settings=AgentSettings(provider="scripted"),
        client=model,
        session_store=InMemorySessionStore(),
        tools=tools or [],
        policy=policy,
    )


class Runner:
    """What the jobs layer does for a tick: run the agent in the session, then deliver."""

    def __init__(
        self,
        model: ScriptedModel,
        delivery: Any,
        tools: list[Tool] | None = None,
        policy: ToolPolicy | None = None,
    ):
        self.model = model
        self.delivery = delivery
        self.runtime = runtime_for(model, tools, policy)
        self.store = self.runtime.session_store
        self.policies: list[ToolPolicy] = []

    async def __call__(
        self, prompt: str, session: str | None, memory_scope: str | None, read_only: bool
    ) -> AgentOutcome:
        overrides = AgentOverrides(memory_scope=memory_scope, session=session, read_only=read_only)
        agent = self.runtime.agent_for(overrides)
        self.policies.append(agent.policy)
        if session is None:
            outcome = (await agent.run(prompt, options=RunOptions(run_id="run_tick"))).outcome
        else:
            turn = await sessions.run(
                agent,
                prompt,
                session=session,
                store=self.store,
                options=RunOptions(run_id="run_tick"),
            )
            outcome = turn.outcome
        await deliver_outcome(
            self.delivery, outcome, source=ReportSource.HEARTBEAT, run_id="run_tick",
            session_id=session,
        )  # fmt: skip
        return outcome


# --- silence and reports [AP-42, AP-43] -----------------------------------------------------


def test_silence_rules() -> None:
    assert is_silent("HEARTBEAT_OK")
    assert is_silent("  HEARTBEAT_OK \n")
    assert is_silent("HEARTBEAT_OK - all quiet")
    assert is_silent("All quiet. HEARTBEAT_OK")
    assert not is_silent("The disk is 95% full.")
    assert not is_silent("HEARTBEAT_OK " + "x" * 301)
    assert is_silent("HEARTBEAT_OK " + "x" * 300)
    assert is_silent("x" * 300 + "  HEARTBEAT_OK")
    assert not is_silent("heartbeat_ok")
    assert not is_silent("all quiet, HEARTBEAT_OK.")  # neither starts nor ends with it
    assert not is_silent("")


def test_report_text_rules() -> None:
    assert report_text(done("Disk full")) == "Disk full"
    assert report_text(done(HEARTBEAT_OK)) is None
    assert report_text(done("   ")) is None
    budget = BudgetExhausted(reason="steps", steps_used=1, usage=USAGE)
    assert report_text(budget) is None
    loop = LoopDetected(tool="t", repeats=3, steps_used=3, usage=USAGE)
    assert report_text(loop) is None

    paused = awaiting(
        ToolCall(id="c", name="send", arguments={"to": "x"}),
        ToolCall(id="d", name="pay", arguments={"amount": 5, "api_key": "k-123"}),
    )
    text = report_text(paused)
    assert text is not None
    assert text.splitlines() == [
        APPROVAL_HEADER,
        '- send {"to":"x"}',
        '- pay {"amount":5,"api_key":"[REDACTED]"}',
    ]
    # the public summary (what a run record stores) gives the same texts
    assert report_text(OutcomeSummary.of(paused)) == text
    assert report_text(OutcomeSummary.of(done("Disk full"))) == "Disk full"
    assert report_text(OutcomeSummary.of(budget)) is None


def test_reports_carry_the_summary_and_a_dedupe_key() -> None:
    assert report_for(done(HEARTBEAT_OK), source=ReportSource.HEARTBEAT, run_id="r") is None
    paused = awaiting(ToolCall(id="c", name="send", arguments={"password": "hunter2"}))
    report = report_for(paused, source=ReportSource.RESUME, run_id="run_1", session_id="s")
    assert report is not None
    assert report.key == "run_1:resume:awaiting_approval:1"
    assert report.outcome.status == "awaiting_approval"
    wire = json.loads(report.model_dump_json())
    assert wire["key"] == report.key
    # the next pause of the same run (a later step) gets its own key
    later = awaiting(ToolCall(id="d", name="send", arguments={}))
    later = later.model_copy(update={"state": later.state.model_copy(update={"steps_used": 2})})
    again = report_for(later, source=ReportSource.RESUME, run_id="run_1")
    assert again is not None
    assert again.key != report.key
    assert wire["source"] == "resume"
    assert wire["session_id"] == "s"
    assert "messages" not in json.dumps(wire)  # never the transcript
    assert "hunter2" not in json.dumps(wire)
    again = Report.model_validate_json(report.model_dump_json())
    assert again == report

    assert ReportSource.for_origin("request") is ReportSource.JOB
    assert ReportSource.for_origin("followup") is ReportSource.FOLLOWUP
    assert ReportSource.for_origin("heartbeat") is ReportSource.HEARTBEAT
    with pytest.raises(AgentError, match="unknown run origin"):
        ReportSource.for_origin("cron")


# --- heartbeat builder and validation [AP-44] -----------------------------------------------


def test_heartbeat_builder_and_task() -> None:
    heartbeat = Heartbeat.cron(
        "0 */30 * * * *", timezone="Europe/Oslo", session="ops", memory_scope="ops"
    ).per_replica()
    assert heartbeat.TASK_NAME == HEARTBEAT_TASK == "agent_heartbeat"
    assert heartbeat.schedule_text == "cron 0 */30 * * * *"
    assert heartbeat.timezone == "Europe/Oslo"
    assert heartbeat.tzinfo() == ZoneInfo("Europe/Oslo")
    assert heartbeat.coordination == "per_replica"
    assert not heartbeat.fleet
    assert heartbeat.description() == "cron 0 */30 * * * * (Europe/Oslo), per replica"
    assert (heartbeat.session, heartbeat.memory_scope) == ("ops", "ops")
    assert heartbeat.prompt == DEFAULT_PROMPT
    assert "read_only=True" in repr(heartbeat)
    assert "precheck=False" in repr(heartbeat)
    heartbeat.validate()

    every = Heartbeat.every(timedelta(seconds=1800))
    assert every.schedule_text == "every 1800s"
    assert every.coordination == "fleet"
    assert every.description() == "every 1800s, fleet"
    assert every.timezone == "UTC"
    assert Heartbeat.every(1800) == every  # seconds work too

    # immutable builders
    acting = every.allow_actions()
    assert every.read_only
    assert not acting.read_only
    assert acting.allows_actions
    checked = every.precheck(lambda state: True)
    assert every.check is None
    assert checked.check is not None
    assert "precheck=True" in repr(checked)
    with pytest.raises(AttributeError):
        every.prompt = "x"  # type: ignore[misc]


def test_heartbeat_validation() -> None:
    cases: list[tuple[Any, str]] = [
        (lambda: Heartbeat.every(timedelta(milliseconds=10)), "at least one second"),
        (lambda: Heartbeat.every(0), "at least one second"),
        (lambda: Heartbeat.cron("  "), "must not be blank"),
        (lambda: Heartbeat.every(timedelta(seconds=60), prompt=" "), "prompt must not be blank"),
        (lambda: Heartbeat.cron("0 * * * *", prompt=""), "prompt must not be blank"),
        (lambda: Heartbeat.cron("0 * * * *", timezone="Mars/Olympus"), "unknown heartbeat tz"),
        (lambda: Heartbeat.cron("0 * * * *", timezone="../etc"), "unknown heartbeat tz"),
        (lambda: Heartbeat.cron("* * * *"), "expected 5 fields"),
        (lambda: Heartbeat.cron("0 0 0 * * * 2030"), "got 7"),
        (lambda: Heartbeat.cron("61 * * * *"), "minute field '61': 61 is out of range 0-59"),
        (lambda: Heartbeat.cron("0 */0 * * * *"), "step must be at least 1"),
        (lambda: Heartbeat.cron("0 0 5-3 * *"), "range 5-3 runs backwards"),
        (lambda: Heartbeat.cron("0 0 * * FUNDAY"), "not a whole number or a name"),
        (lambda: Heartbeat.cron("0 0 30 2 *"), "never fires"),
        (lambda: Heartbeat.cron("0 0,,5 * * *"), "empty list item"),
        (lambda: Heartbeat.every(timedelta(minutes=7)), "use Heartbeat.cron"),
        (lambda: Heartbeat.every(90), "divide a minute, an hour or a day"),
        (lambda: Heartbeat.every(1.5), "divide a minute"),
        (lambda: Heartbeat.every(timedelta(days=2)), "use Heartbeat.cron"),
        (lambda: Heartbeat.every(60, session="  "), "session must be a non-blank"),
        (lambda: Heartbeat.every(60, memory_scope="x" * 256), "memory scope"),
        (lambda: Heartbeat.every(60).precheck(42), "precheck must be callable"),  # type: ignore[arg-type]
    ]
    for build, message in cases:
        with pytest.raises(AgentError) as caught:
            build()
        assert caught.value.kind is ErrorKind.CONFIG
        if message == "unknown heartbeat tz":
            message = "unknown heartbeat timezone"
        assert message in caught.value.message, caught.value.message


# --- cron parsing and the arq mapping -------------------------------------------------------


def test_cron_expressions_parse() -> None:
    five = CronSpec.parse("*/15 9-17 * * MON-FRI")
    assert five.second == frozenset({0})
    assert five.minute == frozenset({0, 15, 30, 45})
    assert five.hour == frozenset(range(9, 18))
    assert five.day is None
    assert five.month is None
    assert five.weekday == frozenset({1, 2, 3, 4, 5})

    six = CronSpec.parse("0 */30 * * * *")
    assert six.second == frozenset({0})
    assert six.minute == frozenset({0, 30})
    assert six.hour is None
    assert six.weekday is None

    assert CronSpec.parse("* * * * * *").second is None
    assert CronSpec.parse("0 0 * * 0").weekday == frozenset({0})
    assert CronSpec.parse("0 0 * * 7").weekday == frozenset({0})  # 7 is Sunday too
    assert CronSpec.parse("0 0 * * fri-sun").weekday == frozenset({5, 6, 0})
    assert CronSpec.parse("0 0 * * 0-6").weekday is None  # every day
    assert CronSpec.parse("0 0 ? * 1").day is None
    assert CronSpec.parse("0 0 1 jan,JUL *").month == frozenset({1, 7})
    assert CronSpec.parse("5/20 * * * *").minute == frozenset({5, 25, 45})
    assert CronSpec.parse("0 1-10/3 * * *").hour == frozenset({1, 4, 7, 10})
    assert CronSpec.parse("0 0 29 2 *").day == frozenset({29})  # leap days exist
    assert CronSpec.parse("0 0 31 1-3 *").day == frozenset({31})


def fires(heartbeat: Heartbeat, start: datetime, count: int = 3) -> list[datetime]:
    """The next ``count`` times arq's own scheduler computes for the heartbeat's fields."""
    fields = heartbeat.cron_fields()
    times: list[datetime] = []
    current = start
    for _ in range(count):
        current = next_cron(current, microsecond=0, **fields)
        times.append(current)
    return times


def test_a_day_and_a_weekday_match_either_as_in_unix_cron() -> None:
    spec = CronSpec.parse("0 9 1,15 * MON")
    assert spec.day_or_weekday
    fields = spec.arq_fields()
    assert (fields["day"], fields["weekday"], fields["hour"]) == (None, None, {9})
    assert spec.fires_on(date(2026, 12, 1))  # the 1st (a Tuesday)
    assert spec.fires_on(date(2026, 12, 15))  # the 15th
    assert spec.fires_on(date(2026, 12, 7))  # a Monday
    assert not spec.fires_on(date(2026, 12, 8))  # a Tuesday, the 8th
    # One restricted field alone is arq's to match, as before.
    assert CronSpec.parse("0 9 1 * *").fires_on(date(2026, 12, 8))
    assert CronSpec.parse("0 9 * * MON").arq_fields()["weekday"] == {0}
    # A day no month has is fine when a weekday may match instead.
    assert CronSpec.parse("0 0 31 2 FRI").fires_on(date(2027, 2, 5))
    # Judged on the date in the heartbeat's timezone: 23:30 UTC on Sunday is Monday in Oslo.
    oslo = Heartbeat.cron("30 0 1 * MON", timezone="Europe/Oslo")
    sunday_night = datetime(2026, 12, 6, 23, 30, tzinfo=UTC)
    assert oslo.fires_at(sunday_night)
    assert not Heartbeat.cron("30 0 1 * MON").fires_at(sunday_night)
    assert Heartbeat.every(60).fires_at(sunday_night)


def test_cron_fields_fire_where_cron_says_in_arq() -> None:
    saturday = datetime(2024, 6, 1, 12, 0, 0, tzinfo=UTC)  # a Saturday
    assert saturday.weekday() == 5

    weekdays = Heartbeat.cron("30 9 * * MON-FRI")
    assert weekdays.cron_fields()["weekday"] == {0, 1, 2, 3, 4}  # arq: 0 = Monday
    monday = datetime(2024, 6, 3, 9, 30, tzinfo=UTC)
    assert fires(weekdays, saturday) == [monday + timedelta(days=n) for n in range(3)]

    sundays = Heartbeat.cron("0 0 8 * * 0")
    assert sundays.cron_fields()["weekday"] == {6}
    assert fires(sundays, saturday, 2) == [
        datetime(2024, 6, 2, 8, tzinfo=UTC),
        datetime(2024, 6, 9, 8, tzinfo=UTC),
    ]
    assert Heartbeat.cron("0 8 * * 7").cron_fields()["weekday"] == {6}

    half_hours = Heartbeat.cron("0 */30 * * * *")
    assert fires(half_hours, saturday) == [
        datetime(2024, 6, 1, 12, 30, tzinfo=UTC),
        datetime(2024, 6, 1, 13, 0, tzinfo=UTC),
        datetime(2024, 6, 1, 13, 30, tzinfo=UTC),
    ]
    seconds = Heartbeat.cron("*/20 * * * * *")
    assert fires(seconds, saturday) == [saturday + timedelta(seconds=s) for s in (20, 40, 60)]

    new_year = Heartbeat.cron("0 0 1 JAN *")
    assert fires(new_year, saturday, 1) == [datetime(2025, 1, 1, tzinfo=UTC)]
    fields = new_year.cron_fields()
    assert fields == {
        "month": {1},
        "day": {1},
        "weekday": None,
        "hour": {0},
        "minute": {0},
        "second": {0},
    }


def test_every_maps_to_clock_aligned_arq_fields() -> None:
    start = datetime(2024, 6, 1, 12, 0, 0, tzinfo=UTC)
    expected = {
        1: [start + timedelta(seconds=n) for n in (1, 2, 3)],
        15: [start + timedelta(seconds=n) for n in (15, 30, 45)],
        60: [start + timedelta(minutes=n) for n in (1, 2, 3)],
        1800: [start + timedelta(minutes=n) for n in (30, 60, 90)],
        7200: [start + timedelta(hours=n) for n in (2, 4, 6)],
        86400: [start + timedelta(hours=12 + 24 * n) for n in (0, 1, 2)],
    }
    for seconds, times in expected.items():
        assert fires(Heartbeat.every(seconds), start) == times, seconds
    assert Heartbeat.every(1).cron_fields() == {
        "month": None, "day": None, "weekday": None, "hour": None, "minute": None, "second": None,
    }  # fmt: skip
    assert Heartbeat.every(1800).cron_fields()["minute"] == {0, 30}
    assert Heartbeat.every(timedelta(hours=6)).cron_fields()["hour"] == {0, 6, 12, 18}


# --- heartbeat ticks [AP-45] ----------------------------------------------------------------


async def test_quiet_heartbeat_delivers_nothing() -> None:
    model = ScriptedModel([HEARTBEAT_OK])
    inbox = Inbox()
    runner = Runner(model, inbox)
    result = await heartbeat_tick(Heartbeat.every(60), None, runner)
    assert result.status is TickStatus.STARTED
    assert result.started
    assert isinstance(result.run, Completed)
    assert inbox.reports == []
    assert HEARTBEAT_OK in last_prompt(model)


async def test_noteworthy_heartbeat_is_delivered_and_stays_read_only() -> None:
    restarts: list[int] = []
    model = ScriptedModel(
        [
            tool_call("restart_server", {}),
            "The server is down; I could not restart it.",
        ]
    )
    inbox = Inbox()
    runner = Runner(model, inbox, [restart_tool(restarts)])
    heartbeat = Heartbeat.every(60, session="ops")
    result = await heartbeat_tick(heartbeat, None, runner)
    assert result.started
    assert restarts == [], "a read-only heartbeat must not act"
    denied = tool_results(model.requests[1].messages[-1])
    assert READ_ONLY_REASON in denied[0]
    assert len(inbox.reports) == 1
    report = inbox.reports[0]
    assert report.source is ReportSource.HEARTBEAT
    assert report.session_id == "ops"
    assert "server is down" in report.text
    assert report.key.startswith("run_tick:heartbeat:completed:")
    view = await runner.store.load("ops")
    assert len(view.messages) == 4  # the tick ran in the session


async def test_allow_actions_lifts_the_read_only_rule_but_keeps_the_app_policy() -> None:
    restarts: list[int] = []
    model = ScriptedModel([tool_call("restart_server", {}), "Restarted."])
    runner = Runner(model, Inbox(), [restart_tool(restarts)])
    heartbeat = Heartbeat.every(60).allow_actions()
    await heartbeat_tick(heartbeat, None, runner)
    assert restarts == [1]

    # the app policy still applies, with or without the read-only rule
    asking = ToolRules().for_tool("restart_server", ASK)
    call = ToolCall(id="c", name="restart_server", arguments={})
    info = RunInfo(run_id="r", session_id=None, steps_used=0, max_steps=1, usage=USAGE)
    tool = restart_tool([])
    runtime = runtime_for(ScriptedModel([]), policy=asking)
    read_only = runtime.agent_for(AgentOverrides(read_only=Heartbeat.every(60).read_only)).policy
    assert isinstance(read_only, Strictest)
    assert isinstance(read_only.decide(call, None, info), RequireApproval)
    assert isinstance(read_only.decide(call, tool, info), Deny)
    actions = runtime.agent_for(AgentOverrides(read_only=heartbeat.read_only)).policy
    assert actions is asking
    assert isinstance(actions.decide(call, tool, info), RequireApproval)

    # internal tools (memory, follow-ups) pass the read-only rule
    followups = FollowupTool(_never_enqueue, max_delay=timedelta(hours=1))
    booking = ToolCall(id="f", name="schedule_followup", arguments={})
    assert read_only.decide(booking, followups, info).decision == "allow"


async def _never_enqueue(plan: FollowupPlan) -> str:
    raise AssertionError("not expected to enqueue")


async def test_precheck_skips_the_model_call() -> None:
    model = ScriptedModel()
    runner = Runner(model, Inbox())
    seen: list[Any] = []

    async def nothing_new(state: Any) -> bool:
        seen.append(state)
        return False

    heartbeat = Heartbeat.every(60).precheck(nothing_new)
    state = object()
    result = await heartbeat_tick(heartbeat, state, runner)
    assert result.status is TickStatus.SKIPPED_PRECHECK
    assert not result.started
    assert result.run is None
    assert seen == [state]
    assert model.requests == []
    assert runner.policies == []

    # a sync precheck works too, and True lets the tick run
    sync = Heartbeat.every(60).precheck(lambda state: state["orders"] > 0)
    skipped = await heartbeat_tick(sync, {"orders": 0}, runner)
    assert skipped.status is TickStatus.SKIPPED_PRECHECK
    assert model.requests == []
    ran = await heartbeat_tick(sync, {"orders": 3}, runner)
    assert ran.started
    assert len(model.requests) == 1


async def test_a_failing_precheck_fails_the_tick_without_a_model_call() -> None:
    model = ScriptedModel()

    def broken(state: Any) -> bool:
        raise KeyError("orders")

    heartbeat = Heartbeat.every(60).precheck(broken)
    with pytest.raises(AgentError) as caught:
        await heartbeat_tick(heartbeat, None, Runner(model, Inbox()))
    assert caught.value.kind is ErrorKind.INTERNAL
    assert "precheck failed: KeyError" in caught.value.message
    assert model.requests == []


async def test_a_busy_session_skips_the_tick() -> None:
    model = ScriptedModel()
    runner = Runner(model, Inbox())
    asked: list[str | None] = []
    prechecked: list[Any] = []

    async def busy(session: str | None) -> bool:
        asked.append(session)
        return session == "ops"

    def precheck(state: Any) -> bool:
        prechecked.append(state)
        return True

    heartbeat = Heartbeat.every(60, session="ops").precheck(precheck)
    result = await heartbeat_tick(heartbeat, None, runner, is_busy=busy)
    assert result.status is TickStatus.SKIPPED_BUSY
    assert asked == ["ops"]
    assert prechecked == []  # nothing else is asked
    assert model.requests == []

    free = Heartbeat.every(60, session="other")
    result = await heartbeat_tick(free, None, runner, is_busy=busy)
    assert result.started


# --- delivery [AP-43] -----------------------------------------------------------------------


def a_report(text: str = "Disk full") -> Report:
    report = report_for(done(text), source=ReportSource.JOB, run_id="run_1", session_id="s1")
    assert report is not None
    return report


async def test_failed_delivery_is_logged_not_returned(caplog: pytest.LogCaptureFixture) -> None:
    model = ScriptedModel(["Something happened."])
    runner = Runner(model, Broken())
    with caplog.at_level(logging.ERROR, logger="agent_plugin.delivery"):
        result = await heartbeat_tick(Heartbeat.every(60), None, runner)
    assert result.started
    assert isinstance(result.run, Completed)
    [record] = [r for r in caplog.records if r.name == "agent_plugin.delivery"]
    assert record.levelno == logging.ERROR
    message = record.getMessage()
    assert "run_tick:heartbeat" in message
    assert "RuntimeError" in message
    assert "sk-live" not in message
    assert "[REDACTED]" in message

    assert await deliver_safely(Broken(), a_report()) is False


@pytest.mark.looptime
async def test_a_hanging_delivery_is_cut_off(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.get_running_loop()
    with caplog.at_level(logging.ERROR, logger="agent_plugin.delivery"):
        started = loop.time()
        assert await deliver_safely(Stuck(), a_report()) is False
        assert loop.time() - started == pytest.approx(1.05)  # its own timeout + 1 s of grace
        started = loop.time()
        assert await deliver_safely(Stuck(), a_report(), limit=0.5) is False
        assert loop.time() - started == pytest.approx(0.5)

        class Plain:  # no timeout of its own: the default bound
            async def deliver(self, report: Report) -> None:
                await asyncio.Event().wait()

        started = loop.time()
        assert await deliver_safely(Plain(), a_report()) is False
        assert loop.time() - started == pytest.approx(DEFAULT_DELIVERY_TIMEOUT)
    messages = [r.getMessage() for r in caplog.records]
    assert "no answer within 1.05 s" in messages[0]
    assert "no answer within 0.5 s" in messages[1]


async def test_deliver_outcome_only_delivers_what_has_something_to_say() -> None:
    inbox = Inbox()
    budget = BudgetExhausted(reason="tokens", steps_used=2, usage=USAGE)
    assert not await deliver_outcome(inbox, budget, source=ReportSource.JOB, run_id="r")
    assert not await deliver_outcome(inbox, done(HEARTBEAT_OK), source="job", run_id="r")  # type: ignore[arg-type]
    assert await deliver_outcome(inbox, done("hi"), source=ReportSource.FOLLOWUP, run_id="r2")
    assert [r.key for r in inbox.reports] == ["r2:followup:completed:0"]


async def test_log_delivery_accepts_reports(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="agent_plugin.delivery"):
        await LogDelivery().deliver(a_report("hi"))
        assert await deliver_safely(LogDelivery(), a_report("there"))
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("run_1:job" in m and m.endswith(": hi") for m in messages)
    assert any(m.endswith(": there") for m in messages)


# --- webhook delivery over real HTTP --------------------------------------------------------


async def test_webhook_delivery_sends_signed_reports() -> None:
    async with HttpServer(default=Reply(204)) as server:
        delivery = WebhookDelivery(f"{server.url}/hooks/agent?token=abc", secret=SECRET)
        try:
            report = a_report()
            assert await deliver_safely(delivery, report)
            assert await deliver_safely(delivery, a_report("Disk still full"))
        finally:
            await delivery.aclose()
    first, second = server.requests
    assert first.method == "POST"
    assert first.path == "/hooks/agent?token=abc"
    assert first.headers["content-type"] == "application/json"
    assert first.headers[KEY_HEADER.lower()] == "run_1:job:completed:0"
    assert json.loads(first.body) == json.loads(report.model_dump_json())
    assert Report.model_validate_json(first.body) == report
    # a receiver's check, written out by hand
    timestamp = first.headers[TIMESTAMP_HEADER.lower()]
    assert abs(int(timestamp) - time.time()) < 60
    digest = hmac.new(SECRET.encode(), timestamp.encode() + b"." + first.body, hashlib.sha256)
    assert first.headers[SIGNATURE_HEADER.lower()] == "sha256=" + digest.hexdigest()
    assert verify_webhook(
        SECRET, first.body, timestamp=timestamp, signature=first.headers["x-agent-signature"]
    )
    assert second.connection == first.connection  # one pooled client


def test_webhook_signatures_verify_only_the_real_thing() -> None:
    body = b'{"text":"hi"}'
    now = 1_700_000_000.0
    stamp = str(int(now))
    good = webhook_signature(SECRET, stamp, body)
    assert verify_webhook(SECRET, body, timestamp=stamp, signature=good, now=now)
    assert not verify_webhook(SECRET, body + b" ", timestamp=stamp, signature=good, now=now)
    assert not verify_webhook("other", body, timestamp=stamp, signature=good, now=now)
    later = str(int(now) + 1)
    assert not verify_webhook(SECRET, body, timestamp=later, signature=good, now=now)
    assert not verify_webhook(SECRET, body, timestamp=stamp, signature=good, now=now + 301)
    assert not verify_webhook(SECRET, body, timestamp="soon", signature=good, now=now)


@pytest.mark.parametrize(
    ("timestamp", "signature"),
    [
        pytest.param("1700000000", "sha256=" + "é" * 64, id="non-ascii signature"),
        pytest.param("1700000000", "sha256=\ud800", id="lone surrogate"),
        pytest.param("1700000000", "", id="empty signature"),
        pytest.param("9" * 4000, "sha256=00", id="timestamp too large for the clock"),
        pytest.param("9" * 5000, "sha256=00", id="more digits than int reads"),
        pytest.param("١٧٠٠٠٠٠٠٠٠", "sha256=00", id="non-ascii digits"),
        pytest.param("", "sha256=00", id="empty timestamp"),
    ],
)
def test_malformed_webhook_headers_are_refused_without_raising(
    timestamp: str, signature: str
) -> None:
    body = b'{"text":"hi"}'
    assert (
        verify_webhook(SECRET, body, timestamp=timestamp, signature=signature, now=1.7e9) is False
    )


async def test_failing_and_hanging_webhooks_do_not_raise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def hang_then_remember(request: RecordedRequest) -> Hang:
        return Hang()

    async with HttpServer() as server:
        server.queue(Reply(500, body="boom"), hang_then_remember)
        delivery = WebhookDelivery(f"{server.url}/secret-path-token", secret=SECRET, timeout=0.3)
        try:
            with caplog.at_level(logging.ERROR, logger="agent_plugin.delivery"):
                assert await deliver_safely(delivery, a_report()) is False
                started = time.monotonic()
                assert await deliver_safely(delivery, a_report()) is False
                assert time.monotonic() - started < 2
        finally:
            await delivery.aclose()
    assert len(server.requests) == 2
    messages = [r.getMessage() for r in caplog.records]
    assert f"the webhook at {server.url} answered 500" in messages[0]
    assert "did not answer within 0.3 s" in messages[1]
    assert not any("secret-path-token" in m or SECRET in m for m in messages)

    # nothing listens on the port any more
    closed = WebhookDelivery(server.url, secret=SECRET, timeout=1)
    with pytest.raises(AgentError) as caught:
        await closed.deliver(a_report())
    await closed.aclose()
    assert caught.value.kind is ErrorKind.TRANSPORT
    assert "cannot reach the webhook" in caught.value.message


async def test_webhook_delivery_checks_its_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_WEBHOOK_SECRET", raising=False)
    with pytest.raises(AgentError, match="AGENT_WEBHOOK_SECRET environment variable"):
        WebhookDelivery("https://hooks.example.com/x")
    with pytest.raises(AgentError, match="absolute http"):
        WebhookDelivery("ftp://example.com/x", secret=SECRET)
    with pytest.raises(AgentError, match="timeout must be positive"):
        WebhookDelivery("https://example.com", secret=SECRET, timeout=0)
    monkeypatch.setenv("AGENT_WEBHOOK_SECRET", SECRET)
    delivery = WebhookDelivery("https://user:pw@hooks.example.com:8443/T0/B0/tok?x=1")
    assert delivery.target == "https://hooks.example.com:8443"
    assert SECRET not in repr(delivery)
    assert "tok" not in repr(delivery)
    monkeypatch.setenv("MY_SECRET", "another-secret")
    assert WebhookDelivery("http://localhost/", secret_env="MY_SECRET").timeout == 5.0
    async with WebhookDelivery("http://localhost/") as scoped:
        assert isinstance(scoped, WebhookDelivery)


# --- follow-ups [AP-46] ---------------------------------------------------------------------


def test_followup_plans_are_validated() -> None:
    tool = FollowupTool(_never_enqueue, max_delay=timedelta(hours=1), memory_scope="u1")
    plan = tool.plan({"delay_minutes": 20, "prompt": " check the deploy "}, ctx())
    assert plan.delay_seconds == 1200
    assert plan.delay == timedelta(minutes=20)
    assert plan.prompt == "check the deploy"
    assert plan.session == "chat-9"
    assert plan.memory_scope == "u1"
    assert plan.depth == 1
    assert (plan.parent_run_id, plan.step, plan.call_id) == ("run_parent", 2, "c1")

    # outside a session the tool's own session is used
    own = FollowupTool(_never_enqueue, max_delay=timedelta(hours=1), session="ops")
    assert own.plan({"delay_minutes": 1, "prompt": "x"}, ctx(None)).session == "ops"

    # chains are capped
    deep = FollowupTool(_never_enqueue, max_delay=timedelta(hours=1), depth=MAX_CHAIN - 1)
    assert deep.plan({"delay_minutes": 1, "prompt": "x"}, ctx()).depth == MAX_CHAIN
    too_deep = FollowupTool(_never_enqueue, max_delay=timedelta(hours=1), depth=MAX_CHAIN)
    with pytest.raises(AgentError) as caught:
        too_deep.plan({"delay_minutes": 0, "prompt": ""}, ctx())  # depth is checked first
    assert caught.value.kind is ErrorKind.TOOL
    assert caught.value.message == (
        "this run is already 10 follow-ups deep; finish now and report instead of scheduling "
        "another"
    )

    delay_error = "delay_minutes must be a whole number from 1 to 60"
    bad: list[tuple[Any, str]] = [
        ({"delay_minutes": 0, "prompt": "x"}, delay_error),
        ({"delay_minutes": 61, "prompt": "x"}, delay_error),
        ({"delay_minutes": "5", "prompt": "x"}, delay_error),
        ({"delay_minutes": 2.5, "prompt": "x"}, delay_error),
        ({"delay_minutes": True, "prompt": "x"}, delay_error),
        ({"prompt": "x"}, delay_error),
        ("not an object", delay_error),
        ({"delay_minutes": 5}, "give a `prompt` for the follow-up run"),
        ({"delay_minutes": 5, "prompt": "  "}, "give a `prompt` for the follow-up run"),
        ({"delay_minutes": 5, "prompt": 7}, "give a `prompt` for the follow-up run"),
        (
            {"delay_minutes": 5, "prompt": "x" * 2001},
            "the follow-up prompt must be at most 2000 characters",
        ),
    ]
    for arguments, message in bad:
        with pytest.raises(AgentError) as caught:
            tool.plan(arguments, ctx())
        assert caught.value.kind is ErrorKind.TOOL, arguments
        assert caught.value.message == message, arguments
    assert tool.plan({"delay_minutes": 5.0, "prompt": "x" * 2000}, ctx()).delay_seconds == 300
    assert tool.plan({"delay_minutes": 60, "prompt": "x"}, ctx()).delay_seconds == 3600

    assert tool.name == "schedule_followup"
    assert tool.effect is ToolEffect.INTERNAL
    assert isinstance(tool, Tool)
    schema: Any = tool.input_schema
    assert schema["properties"]["delay_minutes"]["maximum"] == 60
    assert schema["properties"]["delay_minutes"]["minimum"] == 1
    assert schema["required"] == ["delay_minutes", "prompt"]
    assert tool.validate({"delay_minutes": "nonsense"}) is None  # execute explains instead
    odd = FollowupTool(_never_enqueue, max_delay=timedelta(minutes=90, seconds=59))
    assert odd.input_schema["properties"]["delay_minutes"]["maximum"] == 90  # type: ignore[index, call-overload]


def test_followup_tool_settings_are_checked() -> None:
    with pytest.raises(AgentError, match="at least one minute"):
        FollowupTool(_never_enqueue, max_delay=timedelta(seconds=59))
    with pytest.raises(AgentError, match="depth must be an int >= 0"):
        FollowupTool(_never_enqueue, max_delay=timedelta(hours=1), depth=-1)
    with pytest.raises(AgentError, match="enqueue must be callable"):
        FollowupTool(None, max_delay=timedelta(hours=1))  # type: ignore[arg-type]


def test_followup_run_ids_are_stable_per_booking_call() -> None:
    tool = FollowupTool(_never_enqueue, max_delay=timedelta(hours=1))
    arguments: dict[str, Any] = {"delay_minutes": 5, "prompt": "x"}
    first = tool.plan(arguments, ctx()).derived_run_id()
    assert first == tool.plan(arguments, ctx()).derived_run_id()  # a retried job: same id
    assert first.startswith("run_")
    assert len(first) == 36
    other_call = ToolContext(run_id="run_parent", call_id="c2", session_id="chat-9", step=2)
    other_step = ToolContext(run_id="run_parent", call_id="c1", session_id="chat-9", step=3)
    assert tool.plan(arguments, other_call).derived_run_id() != first
    assert tool.plan(arguments, other_step).derived_run_id() != first


async def test_followup_without_a_job_runtime_reports_a_tool_error() -> None:
    async def no_runtime(plan: FollowupPlan) -> str:
        raise AgentError(ErrorKind.UNAVAILABLE, "background runs are not configured")

    tool = FollowupTool(no_runtime, max_delay=timedelta(hours=1))
    with pytest.raises(AgentError) as caught:
        await tool.execute({"delay_minutes": 5, "prompt": "check"}, ToolContext.detached("c"))
    assert caught.value.kind is ErrorKind.TOOL
    assert caught.value.message == (
        "cannot schedule the follow-up: background runs are not configured"
    )

    async def redis_down(plan: FollowupPlan) -> str:
        raise ConnectionError("redis://:sk-abcdefghijklmnopqrstuvwx@cache:6379 refused")

    tool = FollowupTool(redis_down, max_delay=timedelta(hours=1))
    with pytest.raises(AgentError) as caught:
        await tool.execute({"delay_minutes": 5, "prompt": "check"}, ToolContext.detached("c"))
    assert caught.value.message.startswith("cannot schedule the follow-up: ConnectionError")
    assert "sk-abc" not in caught.value.message


async def test_a_followup_is_booked_through_the_agent_loop() -> None:
    booked: list[FollowupPlan] = []

    async def enqueue(plan: FollowupPlan) -> str:
        booked.append(plan)
        return plan.derived_run_id()

    model = ScriptedModel(
        [
            tool_call("schedule_followup", {"delay_minutes": 20, "prompt": "check the deploy"}),
            "I will check again in 20 minutes.",
        ]
    )
    tool = FollowupTool(enqueue, max_delay=timedelta(hours=1), depth=2, memory_scope="u1")
    agent = Agent(model, tools=[tool], policy=Strictest([AllowAll(), ToolRules.read_only()]))
    outcome = (
        await agent.run(
            "Deploy is running", session_id="chat-9", options=RunOptions(run_id="run_parent")
        )
    ).outcome
    assert isinstance(outcome, Completed)
    [plan] = booked
    assert (plan.delay_seconds, plan.prompt, plan.depth) == (1200, "check the deploy", 3)
    assert (plan.session, plan.memory_scope, plan.parent_run_id) == ("chat-9", "u1", "run_parent")
    [result] = tool_results(model.requests[1].messages[-1])
    assert json.loads(result) == {
        "scheduled": True,
        "in_minutes": 20,
        "run_id": plan.derived_run_id(),
    }
    assert model.requests[0].tools[0].name == "schedule_followup"

    # the eleventh link of a chain is refused with the reference's text
    model = ScriptedModel([tool_call("schedule_followup", {"delay_minutes": 1, "prompt": "x"})])
    capped = FollowupTool(enqueue, max_delay=timedelta(hours=1), depth=MAX_CHAIN)
    outcome = (await Agent(model, tools=[capped]).run("again")).outcome
    assert isinstance(outcome, Completed)
    [result] = tool_results(model.requests[1].messages[-1])
    assert json.loads(result) == {
        "error": "this run is already 10 follow-ups deep; finish now and report instead of "
        "scheduling another"
    }
    assert len(booked) == 1


def test_a_webhooks_signing_secret_is_redacted_wherever_it_appears() -> None:
    secret = "whsec-" + "9a" * 12  # no familiar shape
    WebhookDelivery("https://hooks.example.com/in", secret=secret)
    assert redact_text(f"signed with {secret}") == f"signed with {REDACTED}"
