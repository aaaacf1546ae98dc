"""Run records and step checkpoints (``SqlRunStore``) on a real SQLite file and the real
PostgreSQL on 127.0.0.1, each in a database migrated for this module (the fixtures of
``tests/test_storage.py``); nothing is skipped.

Runs are driven by a real :class:`Agent` with a scripted model: the records it leaves are
checked for what they show (status, progress, a summary, the calls awaiting approval) and what
they must not show (the transcript, secrets); decisions are accepted once, also under a race;
the SQL journal replays to the same state as the in-memory one, and a crashed run continues
from it without running a finished call again.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from agent_plugin import sessions
from agent_plugin.agent import Agent
from agent_plugin.errors import AgentError, ErrorInfo, ErrorKind, SessionTaken
from agent_plugin.events import PendingApproval
from agent_plugin.journal import (
    Appended,
    InMemoryJournal,
    JournalEntry,
    Replied,
    RoundDone,
    Started,
    ToolDone,
    journal_entry_adapter,
    recover,
)
from agent_plugin.memory import AddOp
from agent_plugin.messages import ChatMessage, TokenUsage
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import (
    AgentOutcome,
    ApprovalDecision,
    AwaitingApproval,
    BudgetExhausted,
    Cancelled,
    Completed,
    Finished,
    LoopDetected,
    Paused,
    RunState,
    UnknownOutcome,
)
from agent_plugin.policy import ASK, ToolRules
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.records import RunRecord, RunStatus, status_of
from agent_plugin.redaction import REDACTED, redact_deep
from agent_plugin.sessions import MessageEntry
from agent_plugin.storage import Database, SqlMemoryStore, SqlRunStore, SqlSessionStore
from agent_plugin.storage import runs as runs_module
from agent_plugin.storage.migrations import revisions
from agent_plugin.storage.models import (
    JSON_TYPE,
    Base,
    RunCheckpointRow,
    RunRow,
    UtcDateTime,
    utcnow,
)
from agent_plugin.storage.runs import StalledRun, database_now
from agent_plugin.tools import FnTool, ToolEffect
from tests import test_storage
from tests.store_conformance import report
from tests.test_storage import PostgresSchema, sqlite_url

# The storage tests' fixtures, registered here too: this module gets its own migrated SQLite
# file and PostgreSQL schema (module-scoped), and every database test runs on both.
sqlite_file = test_storage.sqlite_file
pg_schema = test_storage.pg_schema
backend = test_storage.backend
make_database = test_storage.make_database
database = test_storage.database

SECRET = "sk-live-0123456789abcdefghijklmnop"
TRANSCRIPT_MARKER = "only-in-the-transcript"


def new_run_id() -> str:
    return f"run_{uuid.uuid4().hex}"


async def refused(action: Any, kind: ErrorKind) -> AgentError:
    """Await ``action`` and return the AgentError it must raise."""
    with pytest.raises(AgentError) as caught:
        await action
    assert caught.value.kind is kind, caught.value
    return caught.value


class Counter:
    """A tool with an external effect that counts its executions; may crash once."""

    def __init__(self, crash_on: str | None = None) -> None:
        self.calls: list[str] = []
        self.crash_on = crash_on

    def tool(self) -> FnTool:
        def count(args: Any) -> Any:
            name = args["name"]
            if name == self.crash_on:
                self.crash_on = None
                raise Crash
            self.calls.append(name)
            return f"did {name} {TRANSCRIPT_MARKER}"

        return FnTool("count", "counts", {"type": "object"}, count, effect=ToolEffect.EXTERNAL)


class Crash(BaseException):
    """Stands in for the worker dying: nothing in the loop catches it."""


def two_rounds() -> list[Any]:
    return [
        [tool_call("count", {"name": "a"}, id="a"), tool_call("count", {"name": "b"}, id="b")],
        tool_call("count", {"name": "c"}, id="c"),
        "all done",
    ]


def sending_agent(model: ScriptedModel, sent: list[Any]) -> Agent:
    """An agent whose ``send`` tool needs approval."""

    def send(args: Any) -> Any:
        sent.append(args)
        return f"sent to {args.get('to')}"

    tools = [
        FnTool("send", "sends", {"type": "object"}, send, effect=ToolEffect.EXTERNAL),
        FnTool("look", "reads", {"type": "object"}, lambda args: "seen"),
    ]
    return Agent(model, tools=tools, policy=ToolRules({"send": ASK}))


async def paused_run(
    store: SqlRunStore, *, calls: int = 2, session: str | None = None
) -> tuple[str, AwaitingApproval]:
    """A run (of ``session``) recorded as awaiting approval of ``calls`` sends (ids s0, ...)."""
    run_id = new_run_id()
    await store.create(run_id, origin="request", args={"prompt": "send"}, session_id=session)
    await store.start(run_id)
    script: list[Any] = [
        [tool_call("send", {"to": f"p{i}", "password": SECRET}, id=f"s{i}") for i in range(calls)],
        "sent",
    ]
    outcome = (
        await sending_agent(ScriptedModel(script), []).run(
            f"send it {TRANSCRIPT_MARKER}", options=RunOptions(run_id=run_id)
        )
    ).outcome
    assert isinstance(outcome, AwaitingApproval)
    await store.finish(run_id, outcome)
    return run_id, outcome


async def stored(database: Database, run_id: str) -> dict[str, Any]:
    """The run's row as the database holds it."""
    async with database.read() as conn:
        row = (await conn.execute(sa.select(RunRow).where(RunRow.run_id == run_id))).one()
    return dict(row._mapping)


# --- records -----------------------------------------------------------------------------


async def test_create_is_idempotent_and_keeps_the_first_args(database: Database) -> None:
    store = SqlRunStore(database)
    run_id = new_run_id()
    assert await store.create(
        run_id, origin="request", args={"prompt": "hi", "n": 2}, session_id="s1"
    )
    assert not await store.create(run_id, origin="heartbeat", args={"prompt": "other"})
    assert await store.args(run_id) == {"prompt": "hi", "n": 2}
    record = await store.get(run_id)
    assert record is not None
    assert record.status is RunStatus.QUEUED
    assert (record.origin, record.session_id, record.memory_scope) == ("request", "s1", None)
    assert (record.attempt, record.progress_pct, record.outcome, record.awaiting) == (
        0,
        0,
        None,
        [],
    )
    assert record.created_at.tzinfo is UTC
    assert record.started_at is None
    assert record.finished_at is None
    assert await store.get(new_run_id()) is None
    await refused(store.args(new_run_id()), ErrorKind.NOT_FOUND)


async def test_bad_arguments_are_config_errors(database: Database) -> None:
    store = SqlRunStore(database)
    await refused(store.create("r" * 65, origin="request", args={}), ErrorKind.CONFIG)
    await refused(store.create("", origin="request", args={}), ErrorKind.CONFIG)
    error = await refused(
        store.create(new_run_id(), origin="request", args={"x": object()}), ErrorKind.CONFIG
    )
    assert "not JSON" in error.message


async def test_a_run_goes_queued_in_progress_complete(database: Database) -> None:
    store = SqlRunStore(database)
    run_id = new_run_id()
    await store.create(run_id, origin="request", args={"prompt": "go"})
    started = await store.start(run_id)
    assert started.status is RunStatus.IN_PROGRESS
    assert started.attempt == 1
    assert started.started_at is not None

    await store.progress(run_id, 33, "step 1 of 3")
    record = await store.get(run_id)
    assert record is not None
    assert (record.progress_pct, record.progress_message) == (33, "step 1 of 3")
    await store.progress(run_id, 250, "step 9 of 3")  # kept in 0..100
    record = await store.get(run_id)
    assert record is not None
    assert (record.status, record.progress_pct, record.progress_message) == (
        RunStatus.IN_PROGRESS,
        100,
        "step 9 of 3",
    )

    counter = Counter()
    agent = Agent(ScriptedModel(two_rounds()), tools=[counter.tool()])
    outcome = (
        await agent.run(f"count {TRANSCRIPT_MARKER} {SECRET}", options=RunOptions(run_id=run_id))
    ).outcome
    done = await store.finish(run_id, outcome)
    assert done.status is RunStatus.COMPLETE
    assert done.progress_pct == 100
    assert done.finished_at is not None
    assert started.started_at is not None
    assert done.finished_at >= started.started_at
    assert done.started_at == started.started_at
    assert done.outcome is not None
    assert (done.outcome.status, done.outcome.text, done.outcome.steps_used) == (
        "completed",
        "all done",
        2,
    )
    assert done.error is None
    assert done.awaiting == []
    assert await store.get(run_id) == done
    published = done.model_dump_json()
    assert TRANSCRIPT_MARKER not in published
    assert SECRET not in published
    assert RunRecord.model_validate_json(published) == done

    # a re-delivered job for a finished run is not started or finished again
    await refused(store.start(run_id), ErrorKind.CONFLICT)
    error = await refused(store.finish(run_id, outcome), ErrorKind.CONFLICT)
    assert f"run {run_id} is complete" in error.message
    await store.progress(run_id, 5, "late")  # ignored: the run is over
    assert await store.get(run_id) == done


async def test_unknown_runs_are_not_found(database: Database) -> None:
    store = SqlRunStore(database)
    missing = new_run_id()
    usage = TokenUsage()
    for action in (
        store.start(missing),
        store.progress(missing, 1, "x"),
        store.finish(missing, Completed(text="x", steps_used=0, usage=usage)),
        store.fail(missing, ErrorInfo(kind=ErrorKind.TOOL, message="x")),
        store.requeue(missing),
        store.cancel(missing, "x"),
        store.take_paused_state(missing, []),
        store.journal(missing).record(ToolDone(step=0, position=0, call_id="c", content="x")),
    ):
        error = await refused(action, ErrorKind.NOT_FOUND)
        assert missing in error.message
    assert await store.pending_resume(missing) is None
    assert await store.journal_entries(missing) == []
    await store.clear_journal(missing)  # nothing to clear


async def test_a_failed_run_keeps_its_typed_error_and_retries_count_attempts(
    database: Database,
) -> None:
    store = SqlRunStore(database)
    run_id = new_run_id()
    await store.create(run_id, origin="request", args={})
    first = await store.start(run_id)
    await store.requeue(run_id)  # a retry is coming
    await store.requeue(run_id)  # already queued: nothing to do
    queued = await store.get(run_id)
    assert queued is not None
    assert queued.status is RunStatus.QUEUED
    second = await store.start(run_id)
    assert second.attempt == 2
    assert second.started_at == first.started_at  # the first start is when the run started
    again = await store.start(run_id)  # re-delivered after a crash while in progress
    assert again.attempt == 3

    error = ErrorInfo(
        kind=ErrorKind.RATE_LIMITED,
        message="slow down",
        provider="openai",
        status=429,
        retry_after=2.5,
    )
    failed = await store.fail(run_id, error)
    assert failed.status is RunStatus.FAILED
    assert failed.error == error
    assert failed.outcome is None
    assert failed.finished_at is not None
    assert (await store.get(run_id)) == failed
    await refused(store.requeue(run_id), ErrorKind.CONFLICT)
    await refused(store.fail(run_id, error), ErrorKind.CONFLICT)


@pytest.mark.parametrize(
    ("outcome", "status"),
    [
        (Completed(text="x", steps_used=1, usage=TokenUsage()), RunStatus.COMPLETE),
        (BudgetExhausted(reason="steps", steps_used=1, usage=TokenUsage()), RunStatus.COMPLETE),
        (LoopDetected(tool="t", repeats=3, steps_used=1, usage=TokenUsage()), RunStatus.COMPLETE),
        (UnknownOutcome(status="from_the_future"), RunStatus.COMPLETE),
        (Cancelled(reason="stop", steps_used=1, usage=TokenUsage()), RunStatus.CANCELLED),
        (
            Paused(reason="hold", state=RunState(run_id="r", messages=[])),
            RunStatus.AWAITING_APPROVAL,
        ),
    ],
)
def test_the_status_an_outcome_leaves(outcome: AgentOutcome, status: RunStatus) -> None:
    assert status_of(outcome) is status


async def test_a_cancelled_outcome_and_a_hook_pause(database: Database) -> None:
    store = SqlRunStore(database)
    run_id = new_run_id()
    await store.create(run_id, origin="request", args={})
    await store.start(run_id)
    record = await store.finish(
        run_id, Cancelled(reason="client went away", steps_used=2, usage=TokenUsage())
    )
    assert record.status is RunStatus.CANCELLED
    assert record.outcome is not None
    assert record.outcome.reason == "client went away"

    paused_id = new_run_id()
    await store.create(paused_id, origin="request", args={})
    await store.start(paused_id)
    state = RunState(run_id=paused_id, messages=[], steps_used=1)
    paused = await store.finish(paused_id, Paused(reason="quota", state=state))
    assert paused.status is RunStatus.AWAITING_APPROVAL
    assert paused.awaiting == []
    assert paused.finished_at is None
    assert await store.take_paused_state(paused_id, []) == state  # nothing to decide: resume


# --- approvals ---------------------------------------------------------------------------


def as_stored(state: RunState | None) -> RunState:
    """``state`` as the database keeps it: with its secrets redacted [OP-35]."""
    assert state is not None
    return RunState.model_validate(redact_deep(state.model_dump(mode="json")))


async def test_a_paused_run_keeps_its_state_on_the_server(database: Database) -> None:
    store = SqlRunStore(database)
    run_id, outcome = await paused_run(store)
    record = await store.get(run_id)
    assert record is not None
    assert record.status is RunStatus.AWAITING_APPROVAL
    assert record.finished_at is None
    assert record.awaiting == [
        PendingApproval(
            call_id=f"s{i}",
            name="send",
            arguments={"to": f"p{i}", "password": REDACTED},
            reason="send needs approval before it runs",
        )
        for i in range(2)
    ]
    assert record.outcome is not None
    assert record.outcome.awaiting == record.awaiting
    published = record.model_dump_json()
    assert SECRET not in published
    assert TRANSCRIPT_MARKER not in published
    assert "state" not in record.model_dump()
    # the state is in the row, whole but for its secrets, and nothing waits to be resumed yet
    row = await stored(database, run_id)
    assert RunState.model_validate(row["state"]) == as_stored(outcome.state)
    assert SECRET not in str(row)
    assert await store.pending_resume(run_id) is None


async def test_decisions_are_accepted_once_and_the_resume_finishes(database: Database) -> None:
    store = SqlRunStore(database)
    run_id, outcome = await paused_run(store)
    decisions = [
        ApprovalDecision.approve("s0"),
        ApprovalDecision.edit("s1", {"to": "edited"}),
    ]
    state = await store.take_paused_state(run_id, decisions)
    assert state == as_stored(outcome.state)
    record = await store.get(run_id)
    assert record is not None
    assert (record.status, record.awaiting, record.outcome) == (RunStatus.QUEUED, [], None)
    assert await store.pending_resume(run_id) == (as_stored(outcome.state), decisions)

    # a decision is accepted once: the same request again, or a different one, is refused
    for again in (decisions, [ApprovalDecision.reject("s0", "changed my mind")]):
        error = await refused(store.take_paused_state(run_id, again), ErrorKind.CONFLICT)
        assert error.message == f"run {run_id} is queued, not awaiting approval"

    # a stale delivery of the paused run may not take them: it would run approved calls again
    error = await refused(store.start(run_id), ErrorKind.CONFLICT)
    assert error.message == (
        f"run {run_id} is queued: cannot start it (decisions wait for its resume)"
    )
    # the resume job: reads what was accepted, resumes the agent, records the outcome
    await store.start(run_id, resume=True)
    await store.start(run_id, resume=True)  # its own re-delivery after a crash may
    pending = await store.pending_resume(run_id)
    assert pending is not None
    sent: list[Any] = []
    turn = await sending_agent(ScriptedModel(["sent both"]), sent).resume(*pending)
    # the secret the model wrote into the call was never stored, so the resumed call has none
    assert sent == [{"to": "p0", "password": REDACTED}, {"to": "edited"}]
    done = await store.finish(run_id, turn.outcome)
    assert done.status is RunStatus.COMPLETE
    assert done.outcome is not None
    assert done.outcome.text == "sent both"
    assert await store.pending_resume(run_id) is None
    assert (await stored(database, run_id))["state"] is None


async def test_bad_decisions_are_conflicts_and_change_nothing(database: Database) -> None:
    store = SqlRunStore(database)
    run_id, outcome = await paused_run(store)
    before = await store.get(run_id)

    error = await refused(
        store.take_paused_state(
            run_id, [ApprovalDecision.approve("s0"), ApprovalDecision.approve("nope")]
        ),
        ErrorKind.CONFLICT,
    )
    assert "nope" in error.message
    assert "awaiting: s0, s1" in error.message
    error = await refused(
        store.take_paused_state(
            run_id, [ApprovalDecision.approve("s1"), ApprovalDecision.reject("s1", "no")]
        ),
        ErrorKind.CONFLICT,
    )
    assert "more than one decision for s1" in error.message
    # more decisions than calls that wait: refused at once, with a short message
    flood = [ApprovalDecision.approve(f"forged-{i}") for i in range(100_000)]
    error = await refused(store.take_paused_state(run_id, flood), ErrorKind.CONFLICT)
    assert "100000 decisions for 2 call(s)" in error.message
    assert len(error.message) < 300
    many_unknown = [ApprovalDecision.approve(f"x{i}") for i in range(2)]
    error = await refused(store.take_paused_state(run_id, many_unknown), ErrorKind.CONFLICT)
    assert "x0, x1" in error.message
    assert await store.get(run_id) == before
    assert await store.pending_resume(run_id) is None
    # still paused: a good decision goes through
    assert await store.take_paused_state(run_id, [ApprovalDecision.approve("s1")]) == (
        as_stored(outcome.state)
    )

    running = new_run_id()
    await store.create(running, origin="request", args={})
    for status in ("queued", "in_progress"):
        error = await refused(store.take_paused_state(running, []), ErrorKind.CONFLICT)
        assert error.message == f"run {running} is {status}, not awaiting approval"
        await store.start(running)


async def test_a_decision_race_has_exactly_one_winner(
    database: Database, make_database: Callable[[], Database], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both requests read the paused run before either writes: the version decides."""
    store = SqlRunStore(database)
    run_id, outcome = await paused_run(store)
    barrier = asyncio.Barrier(2)
    racers = [make_database(), make_database()]
    for racer in racers:
        original = racer.write

        @asynccontextmanager
        async def gated(original: Any = original) -> AsyncIterator[Any]:
            await barrier.wait()  # both reads are done
            async with original() as conn:
                yield conn

        monkeypatch.setattr(racer, "write", gated)
    try:
        results = await asyncio.gather(
            SqlRunStore(racers[0]).take_paused_state(run_id, [ApprovalDecision.approve("s0")]),
            SqlRunStore(racers[1]).take_paused_state(run_id, [ApprovalDecision.reject("s0", "no")]),
            return_exceptions=True,
        )
    finally:
        for racer in racers:
            await racer.dispose()
    wins = [r for r in results if isinstance(r, RunState)]
    losses = [r for r in results if isinstance(r, AgentError)]
    assert wins == [as_stored(outcome.state)]
    assert [e.kind for e in losses] == [ErrorKind.CONFLICT]
    assert "is queued, not awaiting approval" in losses[0].message
    pending = await store.pending_resume(run_id)
    assert pending is not None
    winner = results.index(wins[0])
    assert pending[1][0].approval.verdict == ("approve" if winner == 0 else "reject")


async def test_many_concurrent_decisions_one_winner(
    database: Database, make_database: Callable[[], Database]
) -> None:
    store = SqlRunStore(database)
    run_id, _ = await paused_run(store, calls=1)
    racers = [make_database() for _ in range(4)]
    try:
        results = await asyncio.gather(
            *(
                SqlRunStore(racer).take_paused_state(run_id, [ApprovalDecision.approve("s0")])
                for racer in racers
            ),
            return_exceptions=True,
        )
    finally:
        for racer in racers:
            await racer.dispose()
    assert sum(isinstance(r, RunState) for r in results) == 1
    assert all(
        isinstance(r, RunState) or (isinstance(r, AgentError) and r.kind is ErrorKind.CONFLICT)
        for r in results
    ), results


async def test_a_decision_for_an_earlier_pause_is_refused(
    database: Database, make_database: Callable[[], Database], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run is decided, resumed and paused again between a request's read and its write:
    the request's decisions were checked against the old pause, so they are refused."""
    store = SqlRunStore(database)
    run_id, outcome = await paused_run(store)
    late = make_database()
    original = late.write
    moved_on: list[bool] = []

    @asynccontextmanager
    async def write_after_a_new_pause() -> AsyncIterator[Any]:
        if not moved_on:
            await store.take_paused_state(run_id, [ApprovalDecision.approve("s0")])
            await store.start(run_id, resume=True)
            await store.finish(run_id, outcome)  # paused again (here: on the same calls)
            moved_on.append(True)
        async with original() as conn:
            yield conn

    monkeypatch.setattr(late, "write", write_after_a_new_pause)
    try:
        error = await refused(
            SqlRunStore(late).take_paused_state(run_id, [ApprovalDecision.reject("s0", "no")]),
            ErrorKind.CONFLICT,
        )
    finally:
        await late.dispose()
    assert "paused again" in error.message
    assert await store.pending_resume(run_id) is None  # the new pause waits for a decision
    record = await store.get(run_id)
    assert record is not None
    assert record.status is RunStatus.AWAITING_APPROVAL


# --- cancellation ------------------------------------------------------------------------


async def test_cancel_rules(database: Database) -> None:
    store = SqlRunStore(database)
    queued = new_run_id()
    await store.create(queued, origin="request", args={})
    cancelled = await store.cancel(queued, "not needed")
    assert cancelled.status is RunStatus.CANCELLED
    assert cancelled.outcome is not None
    assert (cancelled.outcome.status, cancelled.outcome.reason) == ("cancelled", "not needed")
    assert cancelled.finished_at is not None
    for action in (store.cancel(queued, "again"), store.start(queued)):
        error = await refused(action, ErrorKind.CONFLICT)
        assert f"run {queued} is cancelled" in error.message

    paused, outcome = await paused_run(store)
    record = await store.cancel(paused, "nobody answered")
    assert record.awaiting == []
    assert record.outcome is not None
    assert record.outcome.steps_used == outcome.steps_used
    assert record.outcome.usage == outcome.usage
    assert (await stored(database, paused))["state"] is None  # nothing left to resume
    error = await refused(
        store.take_paused_state(paused, [ApprovalDecision.approve("s0")]), ErrorKind.CONFLICT
    )
    assert error.message == f"run {paused} is cancelled, not awaiting approval"

    decided, _ = await paused_run(store)
    await store.take_paused_state(decided, [ApprovalDecision.approve("s0")])
    await store.cancel(decided, "changed plans")  # queued for its resume: still cancellable
    assert await store.pending_resume(decided) is None

    running = new_run_id()
    await store.create(running, origin="request", args={})
    await store.start(running)
    error = await refused(store.cancel(running, "stop"), ErrorKind.CONFLICT)
    assert f"run {running} is in_progress" in error.message
    await store.finish(running, Completed(text="x", steps_used=1, usage=TokenUsage()))
    await refused(store.cancel(running, "stop"), ErrorKind.CONFLICT)


async def test_a_cancel_that_races_a_decision_still_cancels(
    database: Database, make_database: Callable[[], Database], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision lands between the cancel's read and its write: the cancel reads again."""
    store = SqlRunStore(database)
    run_id, _ = await paused_run(store)
    canceller = make_database()
    original = canceller.alone  # the moves' one statement
    raced: list[RunState] = []

    @asynccontextmanager
    async def write_after_a_decision(*, write: bool) -> AsyncIterator[Any]:
        if write and not raced:
            raced.append(await store.take_paused_state(run_id, [ApprovalDecision.approve("s0")]))
        async with original(write=write) as conn:
            yield conn

    monkeypatch.setattr(canceller, "alone", write_after_a_decision)
    try:
        record = await SqlRunStore(canceller).cancel(run_id, "stop")
    finally:
        await canceller.dispose()
    assert len(raced) == 1
    assert record.status is RunStatus.CANCELLED
    assert await store.pending_resume(run_id) is None


# --- step checkpoints --------------------------------------------------------------------


class Tee:
    """Records every entry in two journals."""

    def __init__(self, *journals: Any) -> None:
        self.journals = journals

    async def record(self, entry: JournalEntry) -> None:
        for journal in self.journals:
            await journal.record(entry)


async def test_the_sql_journal_replays_like_the_in_memory_one(database: Database) -> None:
    store = SqlRunStore(database)
    run_id = new_run_id()
    await store.create(run_id, origin="request", args={})
    record = await store.start(run_id)
    memory = InMemoryJournal()
    agent = Agent(ScriptedModel(two_rounds()), tools=[Counter().tool()])
    await agent.run(
        "count",
        options=RunOptions(
            run_id=run_id, journal=Tee(memory, store.journal(run_id, attempt=record.attempt))
        ),
    )
    entries = await store.journal_entries(run_id)
    assert [e.kind for e in entries] == [
        "started",
        "replied",
        "tool_done",
        "tool_done",
        "round_done",
        "replied",
        "tool_done",
        "round_done",
        "replied",
    ]
    assert entries == memory.entries
    assert recover(entries) == recover(memory.entries)
    async with database.read() as conn:
        rows = (
            await conn.execute(
                sa.select(RunCheckpointRow.seq, RunCheckpointRow.step, RunCheckpointRow.call_id)
                .where(RunCheckpointRow.run_id == run_id, RunCheckpointRow.kind == "tool_done")
                .order_by(RunCheckpointRow.seq)
            )
        ).all()
    assert [(seq, step) for seq, step, _ in rows] == [(3, 0), (4, 0), (7, 1)]
    assert sorted(str(call_id) for _, _, call_id in rows[:2]) == ["a", "b"]  # ran in parallel
    assert rows[2].call_id == "c"


async def test_every_kind_of_entry_round_trips(database: Database) -> None:
    store = SqlRunStore(database)
    run_id = new_run_id()
    await store.create(run_id, origin="request", args={})
    state = RunState(run_id=run_id, messages=[ChatMessage.user("hi")])
    entries: list[JournalEntry] = [
        Started(state=state),
        Replied(step=0, message=ChatMessage.assistant("a"), usage=TokenUsage(), steps_used=1),
        ToolDone(step=0, position=1, call_id="c", content="out", is_error=True),
        RoundDone(step=0, message=ChatMessage.user("r")),
        Appended(messages=[ChatMessage.user("steer"), ChatMessage.user("more")]),
    ]
    kinds = set(journal_entry_adapter.json_schema()["discriminator"]["mapping"])
    assert {entry.kind for entry in entries} == kinds  # a new kind needs a line here
    journal = store.journal(run_id)
    for entry in entries:
        await journal.record(entry)
    assert await store.journal_entries(run_id) == entries


async def test_a_crashed_run_continues_from_its_checkpoints(database: Database) -> None:
    store = SqlRunStore(database)
    run_id = new_run_id()
    await store.create(run_id, origin="request", args={"prompt": "count"})
    counter = Counter(crash_on="b")
    first = await store.start(run_id)
    model = ScriptedModel(two_rounds())
    agent = Agent(model, tools=[counter.tool()], parallel_tool_calls=False)
    with pytest.raises(Crash):
        await agent.run(
            "count",
            options=RunOptions(run_id=run_id, journal=store.journal(run_id, attempt=first.attempt)),
        )
    assert counter.calls == ["a"]

    # the retry, in a "new process": only what the database kept
    second = await store.start(run_id)
    state = recover(await store.journal_entries(run_id))
    assert state is not None
    assert state.run_id == run_id
    assert next(type(p.status) for p in state.pending) is Finished
    retry_model = ScriptedModel(two_rounds()[1:])
    retry = Agent(retry_model, tools=[counter.tool()], parallel_tool_calls=False)
    turn = await retry.resume(
        state, options=RunOptions(journal=store.journal(run_id, attempt=second.attempt))
    )
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "all done"
    assert counter.calls == ["a", "b", "c"]  # a ran once; b (in flight at the crash) once more
    assert len(model.requests) + len(retry_model.requests) == 3  # no reply was asked twice
    done = await store.finish(run_id, turn.outcome)
    assert done.attempt == 2

    # recovering the finished run from its checkpoints asks nothing and runs nothing
    final = recover(await store.journal_entries(run_id))
    assert final is not None
    idle = ScriptedModel()
    again = await Agent(idle, tools=[counter.tool()]).resume(final)
    assert isinstance(again.outcome, Completed)
    assert idle.requests == []
    assert counter.calls == ["a", "b", "c"]


async def test_a_superseded_attempt_cannot_write_checkpoints(database: Database) -> None:
    store = SqlRunStore(database)
    run_id = new_run_id()
    await store.create(run_id, origin="request", args={})
    first = await store.start(run_id)
    entry = ToolDone(step=0, position=0, call_id="c", content="x")
    await store.journal(run_id, attempt=first.attempt).record(entry)
    second = await store.start(run_id)  # the job was re-delivered to another worker
    error = await refused(
        store.journal(run_id, attempt=first.attempt).record(entry), ErrorKind.CONFLICT
    )
    assert f"attempt {first.attempt} may no longer record" in error.message
    await store.journal(run_id, attempt=second.attempt).record(entry)
    await store.journal(run_id).record(entry)  # unfenced: any writer of an existing run
    assert len(await store.journal_entries(run_id)) == 3


async def test_a_superseded_attempt_cannot_end_or_requeue_the_run(database: Database) -> None:
    store = SqlRunStore(database)
    run_id = new_run_id()
    await store.create(run_id, origin="request", args={})
    first = await store.start(run_id)
    second = await store.start(run_id)  # the job was re-delivered to another worker
    stale = first.attempt
    usage = TokenUsage(input_tokens=1, output_tokens=1)
    error_info = AgentError(ErrorKind.PROVIDER, "late").info()
    for action in (
        store.finish(run_id, Completed(text="late", steps_used=1, usage=usage), attempt=stale),
        store.fail(run_id, error_info, attempt=stale),
    ):
        error = await refused(action, ErrorKind.CONFLICT)
        assert f"taken over by a later delivery (attempt {second.attempt}" in error.message
    await refused(store.requeue(run_id, attempt=stale), ErrorKind.CONFLICT)
    record = await store.get(run_id)
    assert record is not None
    assert (record.status, record.attempt) == (RunStatus.IN_PROGRESS, second.attempt)
    done = await store.finish(run_id, Completed(text="done", steps_used=1, usage=usage), attempt=2)
    assert done.status is RunStatus.COMPLETE


async def test_parallel_records_through_one_journal_keep_their_order(
    database: Database,
) -> None:
    """Parallel tool calls finish concurrently: every result lands, in the order recorded."""
    store = SqlRunStore(database)
    run_id = new_run_id()
    await store.create(run_id, origin="request", args={})
    journal = store.journal(run_id)
    entries = [ToolDone(step=0, position=i, call_id=f"c{i}", content="x") for i in range(8)]
    await asyncio.gather(*(journal.record(entry) for entry in entries))
    assert await store.journal_entries(run_id) == entries


async def test_a_progress_rule_writes_the_progress_with_its_checkpoint(
    database: Database,
) -> None:
    store = SqlRunStore(database)
    run_id = new_run_id()
    await store.create(run_id, origin="request", args={})
    started = await store.start(run_id)
    seen: list[str] = []

    def rule(entry: JournalEntry) -> tuple[int, str] | None:
        seen.append(entry.kind)
        return (250, f"after {entry.kind}") if isinstance(entry, RoundDone) else None

    journal = store.journal(run_id, attempt=started.attempt, progress=rule)
    await Agent(ScriptedModel(two_rounds()), tools=[Counter().tool()]).run(
        "count", options=RunOptions(run_id=run_id, journal=journal)
    )
    assert seen == [entry.kind for entry in await store.journal_entries(run_id)]
    record = await store.get(run_id)
    assert record is not None
    assert (record.progress_pct, record.progress_message) == (100, "after round_done")

    # a checkpoint that is refused changes no progress either
    await store.requeue(run_id)
    late = RoundDone(step=9, message=ChatMessage.of_text("user", "late"))
    error = await refused(journal.record(late), ErrorKind.CONFLICT)
    assert "queued" in error.message
    record = await store.get(run_id)
    assert record is not None
    assert record.progress_message == "after round_done"


async def test_two_writers_of_one_run_never_share_a_seq(
    database: Database, make_database: Callable[[], Database]
) -> None:
    store = SqlRunStore(database)
    run_id = new_run_id()
    await store.create(run_id, origin="request", args={})
    writers = [make_database() for _ in range(4)]
    try:
        results = await asyncio.gather(
            *(
                SqlRunStore(writer)
                .journal(run_id)
                .record(ToolDone(step=0, position=i, call_id=f"c{i}", content="x"))
                for i, writer in enumerate(writers)
            ),
            return_exceptions=True,
        )
    finally:
        for writer in writers:
            await writer.dispose()
    clashes = [r for r in results if r is not None]
    assert all(isinstance(r, AgentError) and r.kind is ErrorKind.CONFLICT for r in clashes)
    entries = await store.journal_entries(run_id)
    assert len(entries) == len(writers) - len(clashes) >= 1
    async with database.read() as conn:
        seqs = (
            await conn.scalars(
                sa.select(RunCheckpointRow.seq)
                .where(RunCheckpointRow.run_id == run_id)
                .order_by(RunCheckpointRow.seq)
            )
        ).all()
    assert list(seqs) == list(range(1, len(entries) + 1))


async def test_clearing_the_journal(database: Database) -> None:
    store = SqlRunStore(database)
    run_id = new_run_id()
    await store.create(run_id, origin="request", args={})
    await store.start(run_id)
    await Agent(ScriptedModel(["hi"])).run(
        "hi", options=RunOptions(run_id=run_id, journal=store.journal(run_id))
    )
    error = await refused(store.clear_journal(run_id), ErrorKind.CONFLICT)
    assert "in_progress" in error.message
    assert len(await store.journal_entries(run_id)) == 2
    await store.finish(run_id, Completed(text="hi", steps_used=1, usage=TokenUsage()))
    await store.clear_journal(run_id)
    assert await store.journal_entries(run_id) == []
    record = await store.get(run_id)
    assert record is not None
    assert record.outcome is not None


# --- durability and bad rows -------------------------------------------------------------


async def test_records_survive_a_new_database(make_database: Callable[[], Database]) -> None:
    first = make_database()
    run_id, outcome = await paused_run(SqlRunStore(first))
    before = await SqlRunStore(first).get(run_id)
    await (
        SqlRunStore(first)
        .journal(run_id)
        .record(ToolDone(step=0, position=0, call_id="s0", content="x"))
    )
    await first.dispose()

    second = make_database()  # a new engine: only the database remembers
    try:
        store = SqlRunStore(second)
        assert await store.get(run_id) == before
        assert await store.args(run_id) == {"prompt": "send"}
        assert await store.journal_entries(run_id) == [
            ToolDone(step=0, position=0, call_id="s0", content="x")
        ]
        assert await store.take_paused_state(run_id, []) == as_stored(outcome.state)
    finally:
        await second.dispose()


async def _corrupt(database: Database, run_id: str, **values: Any) -> None:
    async with database.write() as conn:
        await conn.execute(sa.update(RunRow).where(RunRow.run_id == run_id).values(**values))


async def test_malformed_values_are_typed_decode_errors(database: Database) -> None:
    store = SqlRunStore(database)
    run_id, _ = await paused_run(store)
    neighbour, _ = await paused_run(store)
    await _corrupt(database, run_id, outcome={"status": 5}, state={"messages": "nope"})
    error = await refused(store.get(run_id), ErrorKind.DECODE)
    assert run_id in error.message
    assert "stored outcome" in error.message
    error = await refused(
        store.take_paused_state(run_id, [ApprovalDecision.approve("s0")]), ErrorKind.DECODE
    )
    assert "stored state" in error.message
    assert (await store.get(neighbour)) is not None  # other runs are unaffected

    await _corrupt(database, neighbour, error=[1, 2], decisions={"x": 1}, args=[1])
    for action, column in (
        (store.get(neighbour), "error"),
        (store.pending_resume(neighbour), "decisions"),
        (store.args(neighbour), "args"),
    ):
        error = await refused(action, ErrorKind.DECODE)
        assert f"stored {column}" in error.message

    journal = store.journal(neighbour)
    for i in range(3):
        await journal.record(ToolDone(step=0, position=i, call_id=f"c{i}", content="x"))
    async with database.write() as conn:
        await conn.execute(
            sa.update(RunCheckpointRow)
            .where(RunCheckpointRow.run_id == neighbour, RunCheckpointRow.seq == 2)
            .values(payload={"step": "two"})
        )
    error = await refused(store.journal_entries(neighbour), ErrorKind.DECODE)
    assert "checkpoint 2 (tool_done)" in error.message

    if database.dialect == "sqlite":  # SQLite keeps JSON as text: break the text itself
        async with database.write() as conn:
            await conn.execute(
                sa.text("UPDATE agent_runs SET outcome = '{\"status\": ' WHERE run_id = :r"),
                {"r": neighbour},
            )
        error = await refused(store.get(neighbour), ErrorKind.DECODE)
        assert "stored outcome" in error.message


# --- the migration -----------------------------------------------------------------------


@asynccontextmanager
async def database_at(revision: str, backend: str, tmp_path: Path) -> AsyncIterator[Database]:
    """A database migrated to ``revision`` only."""
    schema: PostgresSchema | None = None
    if backend == "sqlite":
        database = Database(sqlite_url(tmp_path / "old.db"))
    else:
        schema = PostgresSchema()
        await schema.create()
        database = schema.database()
    try:
        await database.migrate(revision)
        yield database
    finally:
        await database.dispose()
        if schema is not None:
            await schema.drop()


@pytest.fixture
async def at_0001(backend: str, tmp_path: Path) -> AsyncIterator[Database]:
    async with database_at("0001", backend, tmp_path) as database:
        yield database


@pytest.fixture
async def at_0002(backend: str, tmp_path: Path) -> AsyncIterator[Database]:
    async with database_at("0002", backend, tmp_path) as database:
        yield database


OLD_RUNS = sa.table(
    "agent_runs",
    *(sa.column(name) for name in ("run_id", "status", "origin", "progress_pct", "attempt")),
    sa.column("created_at", UtcDateTime()),
    sa.column("updated_at", UtcDateTime()),
)
OLD_CHECKPOINTS = sa.table(
    "agent_run_checkpoints",
    *(sa.column(name) for name in ("run_id", "seq", "kind", "step", "position")),
    sa.column("payload", JSON_TYPE),
    sa.column("created_at", UtcDateTime()),
)


async def test_runs_recorded_before_0002_survive_the_upgrade(at_0001: Database) -> None:
    database = at_0001
    then = datetime(2025, 6, 1, 12, tzinfo=UTC)
    old = {"run_id": "old", "status": "complete", "origin": "request", "progress_pct": 100}
    async with database.write() as conn:
        await conn.execute(
            sa.insert(OLD_RUNS).values(**old, attempt=1, created_at=then, updated_at=then)
        )
        await conn.execute(
            sa.insert(OLD_CHECKPOINTS).values(
                run_id="old",
                seq=1,
                kind="model_reply",
                step=0,
                position=0,
                payload={},
                created_at=then,
            )
        )
    await database.migrate()
    assert await database.current_revision() == revisions()[0].id  # the head
    store = SqlRunStore(database)
    record = await store.get("old")
    assert record is not None
    assert (record.status, record.attempt, record.created_at) == (RunStatus.COMPLETE, 1, then)
    error = await refused(store.args("old"), ErrorKind.DECODE)  # finished: never read again
    assert "no stored arguments" in error.message
    assert await store.journal_entries("old") == []  # the old shape could never be replayed
    await refused(store.start("old"), ErrorKind.CONFLICT)
    # the journal's entries are stored; a kind this version does not know is a typed error
    entry = ToolDone(step=0, position=0, call_id="c", content="x")
    await store.journal("old").record(entry)
    assert await store.journal_entries("old") == [entry]
    async with database.write() as conn:
        await conn.execute(
            sa.insert(OLD_CHECKPOINTS).values(
                run_id="old", seq=2, kind="model_reply", payload={}, created_at=then
            )
        )
    error = await refused(store.journal_entries("old"), ErrorKind.DECODE)
    assert "checkpoint 2 (model_reply)" in error.message


# --- no secret is stored -----------------------------------------------------------------

CANARY_KEY = "sk-ant-" + "Q7f2Lm9XcV4bN8pR3tY6wZ1kA9b3C7"
CANARY_PASSWORD = "Canary-Pw-7f3e91d2"


async def every_row(database: Database) -> str:
    """Every row of every table of the plugin, as the database's own text of each column."""
    rows: list[str] = []
    async with database.read() as conn:
        for table in Base.metadata.sorted_tables:
            columns = [sa.cast(column, sa.Text) for column in table.columns]
            rows += [repr(tuple(row)) for row in await conn.execute(sa.select(*columns))]
    return "\n".join(rows)


async def test_no_secret_reaches_any_table(database: Database) -> None:
    """A canary key and password in a prompt, tool arguments, tool results, the answer, a
    memory entry, a compaction summary and an error never reach a row [OP-35]."""
    session = f"s-{uuid.uuid4().hex}"
    login_args = {"user": "ann", "password": CANARY_PASSWORD, "note": f"key {CANARY_KEY}"}
    script: list[Any] = [
        tool_call("login", login_args, id="l1"),
        f"Logged in. Your key is {CANARY_KEY}, password: {CANARY_PASSWORD}",
    ]

    def login(args: Any) -> Any:
        return json.dumps({"ok": True, "token": "t0k3n-value", "hint": f"use {CANARY_KEY}"})

    agent = Agent(ScriptedModel(script), tools=[FnTool("login", "logs in", {}, login)])
    store = SqlRunStore(database)
    run_id = new_run_id()
    await store.create(run_id, origin="request", args={"prompt": f"password={CANARY_PASSWORD}"})
    record = await store.start(run_id)
    turn = await sessions.run(
        agent,
        f"log in as ann with password: {CANARY_PASSWORD}",
        session=session,
        store=SqlSessionStore(database),
        options=RunOptions(run_id=run_id, journal=store.journal(run_id, attempt=record.attempt)),
    )
    assert isinstance(turn.outcome, Completed)
    assert CANARY_KEY in turn.outcome.text  # the caller of a run in process gets it whole
    await store.finish(run_id, turn.outcome)
    session_store = SqlSessionStore(database)
    await session_store.append_compaction(
        session, f"the user's password: {CANARY_PASSWORD}", 2, report(), expected_version=4
    )
    failed = new_run_id()
    await store.create(failed, origin="request", args={})
    await store.fail(failed, ErrorInfo(kind=ErrorKind.PROVIDER, message=f"echoed {CANARY_KEY}"))
    await SqlMemoryStore(database).apply(
        f"scope-{uuid.uuid4().hex}", AddOp(block="user", text=f"api_key={CANARY_KEY}")
    )
    await paused_run(store)

    rows = await every_row(database)
    for secret in (CANARY_KEY, CANARY_PASSWORD, SECRET, "t0k3n-value"):
        assert secret not in rows
    assert REDACTED in rows
    assert "ann" in rows  # what is not secret is kept
    # and the session still reads back as a valid conversation, with the secrets redacted
    entries = await session_store.entries(session)
    messages = [entry.message for entry in entries if isinstance(entry, MessageEntry)]
    assert [m.role for m in messages] == [m.role for m in turn.messages]
    assert messages[1].tool_calls[0].arguments == {
        "user": "ann",
        "password": REDACTED,
        "note": f"key {REDACTED}",
    }


RUNS_AT_0002 = sa.table(
    "agent_runs",
    *(sa.column(name) for name in ("run_id", "status", "origin", "progress_pct", "attempt")),
    sa.column("decisions", JSON_TYPE),
    sa.column("created_at", UtcDateTime()),
    sa.column("updated_at", UtcDateTime()),
)


async def test_runs_recorded_before_0003_get_their_job_and_no_lease(at_0002: Database) -> None:
    database = at_0002
    then = datetime(2026, 6, 1, 12, tzinfo=UTC)
    common = {"origin": "request", "progress_pct": 0, "created_at": then, "updated_at": then}
    async with database.write() as conn:
        await conn.execute(
            sa.insert(RUNS_AT_0002),
            [
                {"run_id": "queued", "status": "queued", "attempt": 0, **common},
                {"run_id": "running", "status": "in_progress", "attempt": 1, **common},
            ],
        )
        decided = [{"call_id": "c", "action": "approve"}]
        await conn.execute(
            sa.insert(RUNS_AT_0002).values(
                run_id="deciding", status="queued", attempt=1, decisions=decided, **common
            )
        )
    await database.migrate("0003")
    assert await database.current_revision() == "0003"
    async with database.read() as conn:
        jobs = dict((await conn.execute(sa.select(RunRow.run_id, RunRow.job_id))).all())
    assert jobs == {"queued": "queued", "running": "running", "deciding": None}
    store = SqlRunStore(database)
    # their own jobs start them; a resume queued before the upgrade is started by its job
    await refused(store.start("queued", job_id="someone-else"), ErrorKind.CONFLICT)
    assert (await store.start("queued", job_id="queued", lease=30)).attempt == 1
    assert (await store.start("running", job_id="running", lease=30)).attempt == 2
    assert (await store.start("deciding", job_id="deciding:resume:1", resume=True)).attempt == 2
    await database.downgrade("0002")  # and back down
    assert await database.current_revision() == "0002"


@pytest.fixture
async def at_0003(backend: str, tmp_path: Path) -> AsyncIterator[Database]:
    async with database_at("0003", backend, tmp_path) as database:
        yield database


RUNS_AT_0003 = sa.table(
    "agent_runs",
    *(sa.column(name) for name in ("run_id", "status", "origin", "progress_pct", "attempt")),
    sa.column("session_id"),
    sa.column("memory_scope"),
    sa.column("args", JSON_TYPE),
    sa.column("state", JSON_TYPE),
    sa.column("created_at", UtcDateTime()),
    sa.column("updated_at", UtcDateTime()),
)


async def test_runs_recorded_before_0004_keep_their_overrides_as_one_value(
    at_0003: Database,
) -> None:
    database = at_0003
    then = datetime(2026, 11, 1, 12, tzinfo=UTC)
    common = {"progress_pct": 0, "attempt": 0, "created_at": then, "updated_at": then}
    flat = {
        "prompt": "check in",
        "system_prompt": "Be brief.",
        "max_steps": 3,
        "session": "ops",
        "memory_scope": "u1",
        "deliver": True,
        "origin": "heartbeat",
        "run_id": "tick",
        "followup_depth": 0,
    }
    paused_state = {"run_id": "paused", "messages": [], "pending": []}
    async with database.write() as conn:
        for row in (
            {"run_id": "tick", "status": "queued", "origin": "heartbeat", "args": flat},
            {
                "run_id": "paused",
                "status": "awaiting_approval",
                "origin": "request",
                "session_id": "chat",
                "args": None,
                "state": paused_state,
            },
            {"run_id": "lost", "status": "queued", "origin": "request", "args": None},
        ):
            await conn.execute(sa.insert(RUNS_AT_0003).values(**row, **common))
    await database.migrate("0004")
    assert await database.current_revision() == "0004"
    store = SqlRunStore(database)
    assert await store.args("tick") == {
        "prompt": "check in",
        "overrides": {
            "system_prompt": "Be brief.",
            "max_steps": 3,
            "session": "ops",
            "memory_scope": "u1",
            "followup_depth": 0,
            "read_only": True,  # what its worker used to derive from the origin
        },
        "deliver": True,
        "origin": "heartbeat",
    }
    # a paused run can still be resumed: its arguments come from its columns
    assert (await store.args("paused"))["overrides"] == {"session": "chat"}
    # a queued run recorded without arguments can never run: it is left without them
    await refused(store.args("lost"), ErrorKind.DECODE)
    await database.downgrade("0003")  # and back down: the flat shape again
    async with database.read() as conn:
        back = dict((await conn.execute(sa.select(RunRow.run_id, RunRow.args))).all())
    assert back["tick"] == flat
    assert back["lost"] is None


# --- leases and jobs -----------------------------------------------------------------------


async def test_a_leased_run_is_not_taken_over_until_its_lease_ends(database: Database) -> None:
    store = SqlRunStore(database)
    run_id = new_run_id()
    await store.create(run_id, origin="request", args={"prompt": "p"})
    first = await store.start(run_id, job_id=run_id, lease=30)
    assert first.attempt == 1

    # a second delivery of the same job (its claim in Redis vanished) waits for the lease
    error = await refused(store.start(run_id, job_id=run_id, lease=30), ErrorKind.CONFLICT)
    assert error.retry_after is not None
    assert 29 < error.retry_after <= 30
    assert f"run {run_id} is in_progress, held by attempt 1 until " in error.message
    record = await store.get(run_id)
    assert record is not None
    assert record.attempt == 1  # nothing moved

    # the live delivery renews; a lease that ran out lets the next delivery take over
    assert await store.renew_lease(run_id, attempt=1, lease=0.2)
    await asyncio.sleep(0.3)
    second = await store.start(run_id, job_id=run_id, lease=30)
    assert second.attempt == 2
    assert not await store.renew_lease(run_id, attempt=1, lease=30)  # the old one learns it
    assert await store.renew_lease(run_id, attempt=2, lease=30)

    # the run's end clears the lease; renewals of an ended run are refused
    await store.finish(run_id, Completed(text="x", steps_used=1, usage=TokenUsage()), attempt=2)
    assert not await store.renew_lease(run_id, attempt=2, lease=30)
    async with database.read() as conn:
        lease = await conn.scalar(sa.select(RunRow.lease_until).where(RunRow.run_id == run_id))
    assert lease is None


async def test_a_retry_backoff_holds_the_run_even_without_its_job(database: Database) -> None:
    store = SqlRunStore(database)
    run_id = new_run_id()
    await store.create(run_id, origin="request", args={"prompt": "p"})
    await store.start(run_id, job_id=run_id, lease=30)
    await store.requeue(run_id, attempt=1, not_before=30)
    error = await refused(store.start(run_id, job_id=run_id, lease=30), ErrorKind.CONFLICT)
    assert f"run {run_id} is queued, not due until " in error.message
    assert error.retry_after is not None
    assert 29 < error.retry_after <= 30

    async with database.write() as conn:  # the backoff passes
        await conn.execute(
            sa.update(RunRow).where(RunRow.run_id == run_id).values(lease_until=utcnow())
        )
    assert (await store.start(run_id, job_id=run_id, lease=0.1)).attempt == 2
    await store.requeue(run_id, attempt=2)  # a shutdown's requeue: no backoff to wait for
    assert (await store.start(run_id, job_id=run_id, lease=30)).attempt == 3


async def test_only_the_runs_current_job_may_start_it(database: Database) -> None:
    store = SqlRunStore(database)
    run_id, _ = await paused_run(store)
    await store.take_paused_state(
        run_id, [ApprovalDecision.approve("s0"), ApprovalDecision.approve("s1")], job_id="r:1"
    )
    for job_id, resume in ((run_id, False), (run_id, True), ("r:0", True)):
        error = await refused(
            store.start(run_id, job_id=job_id, lease=30, resume=resume), ErrorKind.CONFLICT
        )
        assert error.message == (
            f"run {run_id} is queued for job r:1: job {job_id} cannot start it"
        )
        assert error.retry_after is None  # never this job's: nothing to wait for
    assert (await store.start(run_id, job_id="r:1", lease=30, resume=True)).attempt == 2

    # a new run's job is its run id unless the enqueue names another
    other = new_run_id()
    await store.create(other, origin="request", args={}, job_id="custom")
    await refused(store.start(other, job_id=other), ErrorKind.CONFLICT)
    assert (await store.start(other, job_id="custom")).status is RunStatus.IN_PROGRESS


async def test_stalled_runs_are_those_a_job_should_be_running(database: Database) -> None:
    store = SqlRunStore(database)
    names = ("old", "new", "dead", "alive", "done", "later")
    ids = {name: new_run_id() for name in names}
    for name, run_id in ids.items():
        due = 3600 if name == "later" else None  # booked for an hour from now
        await store.create(run_id, origin="request", args={"prompt": "p"}, not_before=due)
    for name in ("dead", "alive", "done"):
        await store.start(ids[name], job_id=ids[name], lease=0.05 if name == "dead" else 30)
    await store.finish(ids["done"], Completed(text="x", steps_used=1, usage=TokenUsage()))
    paused_id, _ = await paused_run(store)
    resumed_id, _ = await paused_run(store)
    await store.take_paused_state(
        resumed_id,
        [ApprovalDecision.approve("s0"), ApprovalDecision.approve("s1")],
        job_id="resume-job",
    )
    await asyncio.sleep(0.3)
    async with database.write() as conn:  # "new" changed just now (a minute ahead, so that it
        # is still "just now" however slowly the machine runs the queries below)
        just_now = utcnow() + timedelta(minutes=1)
        await conn.execute(
            sa.update(RunRow).where(RunRow.run_id == ids["new"]).values(updated_at=just_now)
        )
    mine = {run_id: name for name, run_id in ids.items()} | {
        paused_id: "paused",
        resumed_id: "resumed",
    }

    async def stalled(page: int = 500) -> list[StalledRun]:
        found = [run async for runs in store.stalled(0.2, page=page) for run in runs]
        return [run for run in found if run.run_id in mine]

    found = {mine[run.run_id]: run for run in await stalled()}
    assert set(found) == {"old", "dead", "resumed"}
    assert (found["old"].job_id, found["old"].resume) == (ids["old"], False)
    assert (found["resumed"].job_id, found["resumed"].resume) == ("resume-job", True)
    # page by page, oldest first, none twice
    paged = await stalled(page=1)
    assert [run.run_id for run in paged] == [run.run_id for run in await stalled()]
    assert len({run.run_id for run in paged}) == 3


async def test_leases_run_on_the_databases_clock(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose clock is 20 s slow neither sees a live lease as run out nor cuts its
    own short: the lease times are the database's."""
    store = SqlRunStore(database)
    run_id = new_run_id()
    await store.create(run_id, origin="request", args={"prompt": "p"})
    real = runs_module.utcnow
    monkeypatch.setattr(runs_module, "utcnow", lambda: real() - timedelta(seconds=20))
    await store.start(run_id, job_id=run_id, lease=15)  # the slow worker holds it
    monkeypatch.setattr(runs_module, "utcnow", real)
    error = await refused(store.start(run_id, job_id=run_id, lease=15), ErrorKind.CONFLICT)
    assert error.retry_after is not None
    assert 14 < error.retry_after <= 15
    async with database.read() as conn:
        lease, now = (
            await conn.execute(
                sa.select(RunRow.lease_until, database_now()).where(RunRow.run_id == run_id)
            )
        ).one()
    assert abs((now - utcnow()).total_seconds()) < 1  # the same host: one clock
    assert 14 < (lease - now).total_seconds() <= 15


# --- listing -------------------------------------------------------------------------------


async def test_runs_are_listed_newest_first_a_page_at_a_time(database: Database) -> None:
    store = SqlRunStore(database)
    session = f"list-{uuid.uuid4().hex}"
    made: list[str] = []
    for i in range(5):
        run_id = new_run_id()
        origin = "heartbeat" if i % 2 else "request"
        await store.create(run_id, origin=origin, args={"prompt": str(i)}, session_id=session)
        made.append(run_id)
    await store.start(made[0])
    await store.fail(made[0], ErrorInfo(kind=ErrorKind.PROVIDER, message="no"))
    newest_first = list(reversed(made))

    first = await store.list_runs(session_id=session, limit=2)
    assert [r.run_id for r in first.runs] == newest_first[:2]
    assert first.next_cursor is not None
    second = await store.list_runs(session_id=session, limit=2, cursor=first.next_cursor)
    third = await store.list_runs(session_id=session, limit=2, cursor=second.next_cursor)
    assert [r.run_id for r in second.runs + third.runs] == newest_first[2:]
    assert third.next_cursor is None  # the last page says so

    failed = await store.list_runs(session_id=session, status=RunStatus.FAILED)
    assert [r.run_id for r in failed.runs] == [made[0]]
    ticks = await store.list_runs(session_id=session, origin="heartbeat")
    assert [r.run_id for r in ticks.runs] == [made[3], made[1]]
    assert (await store.list_runs(session_id="no-such-session")).runs == []

    for bad in ("not-a-cursor", "W10", first.next_cursor[:-3]):
        await refused(store.list_runs(cursor=bad), ErrorKind.INVALID)
    for limit in (0, 201):
        await refused(store.list_runs(limit=limit), ErrorKind.INVALID)


# --- session turns ---------------------------------------------------------------------------


async def test_runs_of_a_session_take_their_turns_in_the_order_they_were_enqueued(
    database: Database,
) -> None:
    """The database says whose turn it is: a run waiting for its retry keeps it, a run booked
    for later holds it only once due, and a resume queues behind the runs enqueued before its
    decisions [HV-01]."""
    store = SqlRunStore(database)
    session = f"turns-{uuid.uuid4().hex[:8]}"
    a, b, c, later = (new_run_id() for _ in range(4))
    for run_id in (a, b):
        await store.create(run_id, origin="request", args={}, session_id=session)
    await store.create(later, origin="request", args={}, session_id=session, not_before=3600)
    await store.create(c, origin="request", args={}, session_id=session)
    assert [await store.session_turn(session, r) for r in (a, b, later, c)] == [
        True,
        False,
        False,
        False,
    ]
    started = await store.start(a, job_id=a, lease=30)
    assert not await store.session_turn(session, b)  # in progress
    # a's retry waits out its backoff: still a's turn, not b's
    await store.requeue(a, attempt=started.attempt, not_before=0.3)
    assert await store.session_turn(session, a)
    assert not await store.session_turn(session, b)
    await asyncio.sleep(0.4)  # (due or not, a holds its turn until it ends)
    assert not await store.session_turn(session, b)
    await store.start(a, job_id=a, lease=30)
    await store.finish(a, Completed(text="a", steps_used=1, usage=TokenUsage()))
    # b next; the run booked for an hour from now holds nothing back
    assert [await store.session_turn(session, r) for r in (b, c)] == [True, False]
    await store.fail(b, ErrorInfo(kind=ErrorKind.INTERNAL, message="x"))
    assert await store.session_turn(session, c)
    # a run without a session, or of another session, is never held back
    loner = new_run_id()
    await store.create(loner, origin="request", args={})
    assert await store.session_turn(session, loner)


async def test_a_dead_workers_run_keeps_its_session_from_a_run_placed_before_it(
    database: Database,
) -> None:
    """A run booked for later (place 1) becomes due while a run placed after it (place 2) is in
    progress, and that run's worker dies: its re-delivery has the session still, and the
    earlier run waits for it to end; neither waits for the other until the job timeout."""
    store = SqlRunStore(database)
    session = f"dead-{uuid.uuid4().hex[:8]}"
    booked, running = new_run_id(), new_run_id()
    await store.create(booked, origin="request", args={}, session_id=session, not_before=0.3)
    await store.create(running, origin="request", args={}, session_id=session)
    assert await store.session_turn(session, running)  # the booked run is not due yet
    await store.start(running, job_id=running, lease=0.2)
    await asyncio.sleep(0.4)  # the booked run is due, the running run's lease has lapsed
    assert await store.session_turn(session, running)
    assert not await store.session_turn(session, booked)
    await store.start(running, job_id=running, lease=30)
    await store.finish(running, Completed(text="done", steps_used=1, usage=TokenUsage()))
    assert await store.session_turn(session, booked)


async def test_the_database_refuses_a_second_run_of_a_session_in_progress(
    database: Database,
) -> None:
    """Whatever a delivery was told about the session's turn, the start of a second run of a
    session in progress is refused (a typed ``SessionTaken``), and nothing of that run moves;
    runs of other sessions, and of none, start side by side."""
    store = SqlRunStore(database)
    session = f"taken-{uuid.uuid4().hex[:8]}"
    a, b = new_run_id(), new_run_id()
    for run_id in (a, b):
        await store.create(run_id, origin="request", args={}, session_id=session)
    started = await store.start(a, job_id=a, lease=0.2)
    with pytest.raises(SessionTaken) as caught:
        await store.start(b, job_id=b, lease=30)
    assert caught.value.kind is ErrorKind.CONFLICT
    assert b in caught.value.message
    waiting = await store.get(b)
    assert waiting is not None
    assert (waiting.status, waiting.attempt, waiting.started_at) == (RunStatus.QUEUED, 0, None)
    await asyncio.sleep(0.3)  # a's worker died: its re-delivery takes the run (and session) on
    again = await store.start(a, job_id=a, lease=30)
    assert again.attempt == started.attempt + 1
    others = [new_run_id() for _ in range(3)]
    await store.create(others[0], origin="request", args={}, session_id=session + "-2")
    await store.create(others[1], origin="request", args={})
    await store.create(others[2], origin="request", args={})
    for run_id in others:
        assert (await store.start(run_id, job_id=run_id)).status is RunStatus.IN_PROGRESS
    await store.finish(a, Completed(text="a", steps_used=1, usage=TokenUsage()))
    assert (await store.start(b, job_id=b, lease=30)).status is RunStatus.IN_PROGRESS


async def test_what_holds_a_session(database: Database) -> None:
    """A session is held by a run in progress, or queued and due or waiting for its retry;
    ``reserved`` (the reject policy) counts a run booked for later too, but not a follow-up;
    ``besides`` asks only about runs enqueued before that one."""
    store = SqlRunStore(database)
    session = f"held-{uuid.uuid4().hex[:8]}"
    assert not await store.session_held(session)
    followup, later = new_run_id(), new_run_id()
    await store.create(followup, origin="followup", args={}, session_id=session, not_before=600)
    assert not await store.session_held(session)
    assert not await store.session_held(session, reserved=True)
    await store.create(later, origin="request", args={}, session_id=session, not_before=600)
    assert not await store.session_held(session)
    assert await store.session_held(session, reserved=True)
    assert not await store.session_held(session, besides=later, reserved=True)  # only it
    now = new_run_id()
    await store.create(now, origin="request", args={}, session_id=session)
    assert await store.session_held(session)  # due: waiting for a worker
    assert not await store.session_held(session, besides=now)  # enqueued before it: not due
    assert await store.session_held(session, besides=now, reserved=True)  # later is reserved
    await store.cancel(later, "test")
    assert not await store.session_held(session, besides=now, reserved=True)
    started = await store.start(now, job_id=now, lease=30)
    assert await store.session_held(session, besides=followup)  # in progress
    await store.requeue(now, attempt=started.attempt, not_before=600)
    assert await store.session_held(session)  # waiting for its retry
    await store.fail(now, ErrorInfo(kind=ErrorKind.INTERNAL, message="x"))
    assert not await store.session_held(session, reserved=True)
    assert not await store.session_held(session + "-other")


async def test_a_resume_takes_a_new_place_in_its_sessions_queue(database: Database) -> None:
    store = SqlRunStore(database)
    session = f"resume-{uuid.uuid4().hex[:8]}"
    paused, _ = await paused_run(store, calls=1, session=session)
    queued = new_run_id()
    await store.create(queued, origin="request", args={}, session_id=session)
    assert await store.session_turn(session, queued)  # a paused run holds nothing back
    await store.take_paused_state(paused, [ApprovalDecision.approve("s0")], job_id="resume")
    assert await store.session_turn(session, queued)  # enqueued before the decisions
    assert not await store.session_turn(session, paused)
