"""Sessions and compaction: reference §1.14 and the §1.23 acceptance cases, ported [AP-34..36]."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from agent_plugin import sessions
from agent_plugin.agent import Agent
from agent_plugin.budget import estimate_messages
from agent_plugin.cancellation import CancelToken
from agent_plugin.compaction import (
    SUMMARY_INSTRUCTIONS,
    SUMMARY_PREFIX,
    Compaction,
    CompactionReport,
    render_transcript,
)
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import AgentEvent, RunEnded, TextDeltaEvent
from agent_plugin.hooks import AgentHooks, PauseRun, RunControl
from agent_plugin.messages import (
    ChatMessage,
    Image,
    ImagePart,
    RedactedThinking,
    RedactedThinkingPart,
    Role,
    TextPart,
    Thinking,
    ThinkingPart,
    TokenUsage,
    ToolCall,
    ToolCallPart,
    ToolResult,
    ToolResultPart,
)
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import (
    AgentOutcome,
    ApprovalDecision,
    AwaitingApproval,
    Cancelled,
    Completed,
    Paused,
    RunInfo,
    RunState,
)
from agent_plugin.policy import ToolRules
from agent_plugin.providers.base import ChatRequest
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.sessions import (
    CompactionEntry,
    InMemorySessionStore,
    MessageEntry,
    SessionStore,
    SessionTurn,
    SessionView,
    compact_session,
)
from agent_plugin.tools import FnTool, ToolEffect
from tests.store_conformance import SessionStoreContract, numbered

SCHEMA: dict[str, Any] = {"type": "object", "properties": {"city": {"type": "string"}}}


class TestInMemorySessionStore(SessionStoreContract):
    @pytest.fixture
    def store(self) -> SessionStore:
        return InMemorySessionStore()


def test_the_in_memory_store_fits_the_protocol() -> None:
    assert isinstance(InMemorySessionStore(), SessionStore)


def acting_agent(model: ScriptedModel, ran: list[Any], **kwargs: Any) -> Agent:
    def act(args: Any) -> Any:
        ran.append(args)
        return f"did {args.get('city')}"

    tool = FnTool("act", "acts", SCHEMA, act, effect=ToolEffect.WRITE)
    return Agent(
        model,
        tools=[tool],
        policy=ToolRules.ask_before_acting(),
        system_prompt="Be brief.",
        **kwargs,
    )


def completed(outcome: AgentOutcome) -> Completed:
    assert isinstance(outcome, Completed), outcome
    return outcome


def words(count: int, label: str) -> str:
    """A text estimated at exactly ``count`` tokens (4 bytes each)."""
    return (label + "." * (4 * count))[: 4 * count]


def long_transcript(pairs: int, tokens: int = 100) -> list[ChatMessage]:
    """``pairs`` user/assistant exchanges, each message estimated at ``tokens + 4``."""
    messages: list[ChatMessage] = []
    for i in range(pairs):
        messages.append(ChatMessage.user(words(tokens, f"q{i}")))
        messages.append(ChatMessage.assistant(words(tokens, f"a{i}")))
    return messages


async def stored(store: SessionStore, session: str) -> list[ChatMessage]:
    return (await store.load(session)).messages


# --- sessions ------------------------------------------------------------------------------


async def test_sessions_persist_turns_but_not_pauses() -> None:
    ran: list[Any] = []
    model = ScriptedModel(["Hi!", tool_call("act", {"city": "Oslo"}, id="a"), "Done."])
    agent = acting_agent(model, ran)
    store = InMemorySessionStore()

    first = await sessions.run(agent, "hello", session="s1", store=store)
    assert completed(first.outcome).text == "Hi!"
    assert len(await stored(store, "s1")) == 2
    assert first.session_version == 2
    assert first.compaction is None

    paused = await sessions.run(agent, "act now", session="s1", store=store)
    assert isinstance(paused.outcome, AwaitingApproval)
    assert len(await stored(store, "s1")) == 2
    assert paused.session_version == 2
    assert ran == []

    # the state survives JSON (a database row, a job result) and still knows its session
    state = RunState.model_validate_json(paused.outcome.state.model_dump_json())
    assert (state.session_id, state.session_version, state.history_length) == ("s1", 2, 2)
    done = await sessions.resume(agent, state, [ApprovalDecision.approve("a")], store=store)
    assert completed(done.outcome).text == "Done."
    assert ran == [{"city": "Oslo"}]
    assert done.session_version == 6

    messages = await stored(store, "s1")
    assert len(messages) == 6
    assert [m.role for m in messages] == [
        Role.USER,
        Role.ASSISTANT,
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
    ]
    assert [messages[i].text for i in (0, 1, 2, 5)] == ["hello", "Hi!", "act now", "Done."]
    assert messages[3].tool_calls[0].name == "act"
    # transcripts exclude the system prompt, though every request carried it
    assert all(r.messages[0].role is Role.SYSTEM for r in model.requests)
    assert not any(m.role is Role.SYSTEM for m in messages)


async def test_a_run_continues_the_stored_transcript() -> None:
    model = ScriptedModel(["one", "two"])
    agent = Agent(model, system_prompt="sys")
    store = InMemorySessionStore()
    await sessions.run(agent, "first", session="s", store=store)
    turn = await sessions.run(agent, ChatMessage.user("second"), session="s", store=store)
    assert [m.role for m in model.requests[1].messages] == [
        Role.SYSTEM,
        Role.USER,
        Role.ASSISTANT,
        Role.USER,
    ]
    assert turn.history_length == 2
    assert [m.text for m in turn.new_messages] == ["second", "two"]
    assert [m.text for m in await stored(store, "s")] == ["first", "one", "second", "two"]
    round_tripped = SessionTurn.model_validate_json(turn.model_dump_json())
    assert round_tripped == turn


async def test_a_run_that_pauses_again_saves_nothing_until_it_finishes() -> None:
    ran: list[Any] = []
    model = ScriptedModel(
        [
            tool_call("act", {"city": "Oslo"}, id="a"),
            tool_call("act", {"city": "Rome"}, id="b"),
            "Both done.",
        ]
    )
    agent = acting_agent(model, ran)
    store = InMemorySessionStore()
    await store.append("s", numbered(2), expected_version=0)

    first = await sessions.run(agent, "go", session="s", store=store)
    assert isinstance(first.outcome, AwaitingApproval)
    again = await sessions.resume(
        agent, first.outcome.state, [ApprovalDecision.approve("a")], store=store
    )
    assert isinstance(again.outcome, AwaitingApproval)
    assert again.session_version == 2
    assert (await store.load("s")).version == 2
    assert again.outcome.state.session_version == 2

    done = await sessions.resume(
        agent, again.outcome.state, [ApprovalDecision.approve("b")], store=store
    )
    assert completed(done.outcome).text == "Both done."
    messages = await stored(store, "s")
    assert [m.role for m in messages] == [
        Role.USER,
        Role.ASSISTANT,
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
    ]
    assert ran == [{"city": "Oslo"}, {"city": "Rome"}]


class PauseFirstCall(AgentHooks):
    def __init__(self) -> None:
        self.paused = False

    async def before_model(self, request: ChatRequest, info: RunInfo) -> RunControl | None:
        if self.paused:
            return None
        self.paused = True
        return PauseRun("wait for the operator")


async def test_a_hook_pause_saves_nothing_and_its_resume_saves() -> None:
    model = ScriptedModel(["Hi!"])
    agent = Agent(model, hooks=[PauseFirstCall()])
    store = InMemorySessionStore()
    turn = await sessions.run(agent, "hello", session="s", store=store)
    assert isinstance(turn.outcome, Paused)
    assert await store.load("s") == SessionView()
    done = await sessions.resume(agent, turn.outcome.state, store=store)
    assert completed(done.outcome).text == "Hi!"
    assert [m.text for m in await stored(store, "s")] == ["hello", "Hi!"]


async def test_cancelled_runs_are_saved() -> None:
    token = CancelToken()
    token.cancel("user left")
    model = ScriptedModel(["never"])
    store = InMemorySessionStore()
    turn = await sessions.run(
        Agent(model), "hello", session="s", store=store, options=RunOptions(cancel=token)
    )
    assert isinstance(turn.outcome, Cancelled)
    assert model.requests == []
    assert [m.text for m in await stored(store, "s")] == ["hello"]


async def test_streamed_session_turns_emit_events_and_save() -> None:
    events: list[AgentEvent] = []
    store = InMemorySessionStore()
    turn = await sessions.run(
        Agent(ScriptedModel(["Hi there"])),
        "hello",
        session="s",
        store=store,
        options=RunOptions(stream=True, on_event=events.append, run_id="run_fixed"),
    )
    assert completed(turn.outcome).text == "Hi there"
    assert any(isinstance(e, TextDeltaEvent) for e in events)
    assert isinstance(events[-1], RunEnded)
    assert events[-1].run_id == "run_fixed"
    assert len(await stored(store, "s")) == 2


async def test_a_state_without_a_session_resumes_on_its_own() -> None:
    ran: list[Any] = []
    model = ScriptedModel([tool_call("act", {"city": "Oslo"}, id="a"), "Done."])
    agent = acting_agent(model, ran)
    outcome = (await agent.run("act")).outcome
    assert isinstance(outcome, AwaitingApproval)
    store = InMemorySessionStore()
    turn = await sessions.resume(agent, outcome.state, [ApprovalDecision.approve("a")], store=store)
    assert completed(turn.outcome).text == "Done."
    assert ran == [{"city": "Oslo"}]
    assert not isinstance(turn, SessionTurn)  # nothing was saved anywhere


async def test_a_session_state_needs_a_store() -> None:
    ran: list[Any] = []
    agent = acting_agent(ScriptedModel([tool_call("act", {"city": "Oslo"}, id="a")]), ran)
    paused = await sessions.run(agent, "act", session="s", store=InMemorySessionStore())
    assert isinstance(paused.outcome, AwaitingApproval)
    with pytest.raises(AgentError) as caught:
        await sessions.resume(agent, paused.outcome.state, [ApprovalDecision.approve("a")])
    assert caught.value.kind is ErrorKind.CONFIG
    assert ran == []


async def test_bad_session_ids_fail_before_the_run() -> None:
    model = ScriptedModel(["x"])
    with pytest.raises(AgentError) as caught:
        await sessions.run(Agent(model), "hello", session="", store=InMemorySessionStore())
    assert caught.value.kind is ErrorKind.CONFIG
    assert model.requests == []


# --- conflicts -----------------------------------------------------------------------------


async def test_a_writer_during_the_turn_is_a_conflict() -> None:
    store = InMemorySessionStore()
    await store.append("s", numbered(2), expected_version=0)

    async def meddle(args: Any) -> Any:
        await store.append("s", [ChatMessage.user("from elsewhere")], expected_version=2)
        return "ok"

    tool = FnTool("meddle", "writes", SCHEMA, meddle, effect=ToolEffect.READ_ONLY)
    agent = Agent(ScriptedModel([tool_call("meddle"), "done"]), tools=[tool])
    with pytest.raises(AgentError) as caught:
        await sessions.run(agent, "go", session="s", store=store)
    assert caught.value.kind is ErrorKind.CONFLICT
    assert [m.text for m in await stored(store, "s")] == ["m1", "m2", "from elsewhere"]


async def test_a_message_sent_during_a_pause_wins_over_the_resume() -> None:
    ran: list[Any] = []
    model = ScriptedModel([tool_call("act", {"city": "Oslo"}, id="a"), "meanwhile", "Done."])
    agent = acting_agent(model, ran)
    store = InMemorySessionStore()
    paused = await sessions.run(agent, "act now", session="s", store=store)
    assert isinstance(paused.outcome, AwaitingApproval)

    # a new message continues from the last saved transcript (empty), not the paused turn
    other = await sessions.run(agent, "something else", session="s", store=store)
    assert completed(other.outcome).text == "meanwhile"
    assert [m.text for m in await stored(store, "s")] == ["something else", "meanwhile"]

    with pytest.raises(AgentError) as caught:
        await sessions.resume(
            agent, paused.outcome.state, [ApprovalDecision.approve("a")], store=store
        )
    assert caught.value.kind is ErrorKind.CONFLICT
    assert ran == []  # detected before the approved tool ran
    assert len(model.requests) == 2
    assert (await store.load("s")).version == 2


# --- compaction ----------------------------------------------------------------------------


def test_compaction_defaults_and_validation() -> None:
    assert Compaction() == Compaction(
        trigger_tokens=24_000, keep_recent_tokens=8_000, summary_max_tokens=1_024
    )
    for bad in ({"trigger_tokens": 0}, {"keep_recent_tokens": -1}, {"summary_max_tokens": True}):
        with pytest.raises(AgentError) as caught:
            Compaction(**bad)
        assert caught.value.kind is ErrorKind.CONFIG


def tool_heavy_transcript() -> list[ChatMessage]:
    """0 task, 1 call, 2 result, 3 answer | 4 user, 5 call, 6 result, 7 answer (costs in [])."""
    return [
        ChatMessage.user(words(200, "task")),  # [204]
        ChatMessage(
            role=Role.ASSISTANT,
            content=[ToolCallPart(tool_call=ToolCall(id="c1", name="look", arguments={"q": 1}))],
        ),
        ChatMessage.tool_results([ToolResult(tool_call_id="c1", content=words(100, "r1"))]),
        ChatMessage.assistant(words(50, "answer1")),  # [54]
        ChatMessage.user(words(20, "next")),  # [24]
        ChatMessage(
            role=Role.ASSISTANT,
            content=[ToolCallPart(tool_call=ToolCall(id="c2", name="look", arguments={"q": 2}))],
        ),
        ChatMessage.tool_results([ToolResult(tool_call_id="c2", content=words(40, "r2"))]),  # [44]
        ChatMessage.assistant(words(10, "answer2")),  # [14]
    ]


async def test_compaction_folds_the_head_into_one_summary() -> None:
    transcript = tool_heavy_transcript()
    model = ScriptedModel(["\n  Dense summary: user wants q.  \n"])
    compaction = Compaction(trigger_tokens=300, keep_recent_tokens=100, summary_max_tokens=64)
    # the tail 7, 6, 5, 4 (88 tokens) fits in 100 and 3 does not: the split is the user at 4
    assert compaction.split_point(transcript) == 4
    result = await compaction.compact(model, transcript)
    assert result is not None

    assert result.summary == "Dense summary: user wants q."
    assert result.messages[0] == ChatMessage.user(SUMMARY_PREFIX + "Dense summary: user wants q.")
    assert result.messages[1].role is Role.USER
    assert result.messages[1:] == transcript[4:]  # the newest turn is kept whole
    assert result.split == 4

    [request] = model.requests
    assert request.max_tokens == 64
    assert list(request.tools) == []
    assert [m.role for m in request.messages] == [Role.SYSTEM, Role.USER]
    assert request.messages[0].text == SUMMARY_INSTRUCTIONS
    assert request.messages[1].text == render_transcript(transcript[:4])

    assert result.report == CompactionReport(
        summarized_messages=4,
        tokens_before=estimate_messages(transcript),
        tokens_after=estimate_messages(result.messages),
        usage=TokenUsage(input_tokens=10, output_tokens=5),
    )
    assert result.report.tokens_after < result.report.tokens_before


async def test_the_kept_tail_never_starts_on_a_tool_result() -> None:
    transcript = tool_heavy_transcript()
    # 60 tokens reach the tool result at 6 but not the user message at 4: no split point
    assert Compaction(keep_recent_tokens=60).split_point(transcript) is None
    # with room for everything after the task, the oldest user message after index 0 wins
    assert Compaction(keep_recent_tokens=10_000).split_point(transcript) == 4


async def test_no_split_point_means_no_compaction() -> None:
    model = ScriptedModel(["unused"])
    only_task = [
        ChatMessage.user(words(100, "task")),
        *(ChatMessage.assistant(words(100, f"a{i}")) for i in range(5)),
    ]
    compaction = Compaction(trigger_tokens=100, keep_recent_tokens=150)
    assert await compaction.compact(model, only_task) is None
    huge_last_turn = [*long_transcript(3), ChatMessage.user(words(500, "huge"))]
    assert await compaction.compact(model, huge_last_turn) is None
    assert await compaction.compact(model, []) is None
    assert await compaction.compact(model, only_task[:1], force=True) is None
    assert model.requests == []


async def test_short_transcripts_are_left_alone() -> None:
    model = ScriptedModel(["unused"])
    transcript = long_transcript(3)
    at_trigger = Compaction(trigger_tokens=estimate_messages(transcript), keep_recent_tokens=10)
    assert await at_trigger.compact(model, transcript) is None
    assert await Compaction().compact(model, transcript) is None
    assert model.requests == []
    # one token over the trigger and it compacts
    over = Compaction(trigger_tokens=estimate_messages(transcript) - 1, keep_recent_tokens=250)
    assert await over.compact(model, transcript) is not None
    assert len(model.requests) == 1


async def test_an_empty_summary_is_an_error() -> None:
    with pytest.raises(AgentError) as caught:
        await Compaction(trigger_tokens=10, keep_recent_tokens=250).compact(
            ScriptedModel(["   \n"]), long_transcript(4)
        )
    assert caught.value.kind is ErrorKind.PROVIDER
    assert caught.value.provider == "scripted"


def test_transcript_rendering_covers_every_part() -> None:
    long_result = "r" * 700
    transcript = [
        ChatMessage(
            role=Role.USER,
            content=[
                TextPart(text="Find cafés"),
                ImagePart(image=Image(url="https://example.com/map.png")),
                ImagePart(image=Image(data="iVBORw0KGgo=", media_type="image/png")),
                ImagePart(image=Image(url="data:image/jpeg;base64,/9j/4AAQ")),
            ],
        ),
        ChatMessage(
            role=Role.ASSISTANT,
            content=[
                ThinkingPart(thinking=Thinking(text="Search first.", signature="sig")),
                RedactedThinkingPart(redacted_thinking=RedactedThinking(data="opaque")),
                TextPart(text=""),
                ToolCallPart(
                    tool_call=ToolCall(id="1", name="search", arguments={"q": "café", "n": 2})
                ),
                ToolCallPart(
                    tool_call=ToolCall(id="2", name="bad", arguments={}, raw_arguments="{oops")
                ),
            ],
        ),
        ChatMessage(
            role=Role.TOOL,
            content=[
                ToolResultPart(tool_result=ToolResult(tool_call_id="1", content=long_result)),
                ToolResultPart(
                    tool_result=ToolResult(tool_call_id="2", content="not JSON", is_error=True)
                ),
            ],
        ),
        ChatMessage.assistant("Two cafés."),
    ]
    assert render_transcript(transcript).split("\n") == [
        "user: Find cafés",
        "user: [image https://example.com/map.png]",
        "user: [image: image/png]",
        "user: [image: image/jpeg]",
        "assistant thought: Search first.",
        'assistant called search with {"q":"café","n":2}',
        "assistant called bad with {oops",
        "tool result: " + "r" * 600,
        "tool result (error): not JSON",
        "assistant: Two cafés.",
    ]
    assert render_transcript([]) == ""
    assert "opaque" not in render_transcript(transcript)
    assert "iVBOR" not in render_transcript(transcript)


async def test_long_sessions_compact_before_the_run() -> None:
    store = InMemorySessionStore()
    history = long_transcript(10)  # 20 messages of 104 tokens each
    await store.append("s", history, expected_version=0)
    model = ScriptedModel(["  The user asked ten questions.  ", "Answer eleven."])
    compaction = Compaction(trigger_tokens=500, keep_recent_tokens=250, summary_max_tokens=64)
    agent = Agent(model, system_prompt="sys", compaction=compaction)

    turn = await sessions.run(agent, "question eleven", session="s", store=store)

    assert completed(turn.outcome).text == "Answer eleven."
    summary_call, run_call = model.requests
    assert list(summary_call.tools) == []
    assert summary_call.max_tokens == 64
    assert summary_call.messages[1].text == render_transcript(history[:18])
    summary = ChatMessage.user(SUMMARY_PREFIX + "The user asked ten questions.")
    assert run_call.messages == [
        ChatMessage.system("sys"),
        summary,
        *history[18:],
        ChatMessage.user("question eleven"),
    ]
    # the summary call's usage is reported, not charged to the run
    assert completed(turn.outcome).usage == TokenUsage(input_tokens=10, output_tokens=5)
    assert turn.compaction == CompactionReport(
        summarized_messages=18,
        tokens_before=20 * 104,
        tokens_after=estimate_messages([summary, *history[18:]]),
        usage=TokenUsage(input_tokens=10, output_tokens=5),
    )
    assert turn.messages[0] == summary  # the turn's transcript is the compacted one
    assert turn.history_length == 3

    view = await store.load("s")
    assert view.messages == [*run_call.messages[1:], ChatMessage.assistant("Answer eleven.")]
    assert view.version == turn.session_version == 23
    assert view.seqs == [21, 19, 20, 22, 23]

    # the audit history keeps every message, and the compaction entry in its place
    entries = await store.entries("s")
    assert len(entries) == 23
    assert [e.message for e in entries if isinstance(e, MessageEntry)] == [
        *history,
        ChatMessage.user("question eleven"),
        ChatMessage.assistant("Answer eleven."),
    ]
    compaction_entry = entries[20]
    assert isinstance(compaction_entry, CompactionEntry)
    assert compaction_entry.summary == "The user asked ten questions."
    assert compaction_entry.first_kept_seq == 19
    assert compaction_entry.usage == TokenUsage(input_tokens=10, output_tokens=5)

    # the next short turn does not compact again
    again = await sessions.run(agent, "and twelve", session="s", store=store)
    assert again.compaction is None
    assert len(model.requests) == 3


async def test_a_failed_summary_leaves_the_session_unchanged() -> None:
    store = InMemorySessionStore()
    await store.append("s", long_transcript(10), expected_version=0)
    failure = AgentError(ErrorKind.UNAVAILABLE, "overloaded", provider="scripted", status=529)
    model = ScriptedModel([failure])
    with pytest.raises(AgentError) as caught:
        await sessions.run(
            Agent(model, compaction=Compaction(trigger_tokens=500)), "hi", session="s", store=store
        )
    assert caught.value is failure
    assert len(model.requests) == 1  # the run itself never started
    assert (await store.load("s")).version == 20
    assert len(await store.entries("s")) == 20


async def test_cancelling_during_the_summary_skips_compaction_and_ends_the_run() -> None:
    store = InMemorySessionStore()
    await store.append("s", long_transcript(10), expected_version=0)
    token = CancelToken()

    async def cancel_now(request: ChatRequest) -> str:
        token.cancel("user left")
        await asyncio.sleep(60)  # cancelled at once: the run does not wait for the summary
        return "a summary nobody waits for"

    model = ScriptedModel([cancel_now])
    turn = await sessions.run(
        Agent(model, compaction=Compaction(trigger_tokens=500)),
        "hi",
        session="s",
        store=store,
        options=RunOptions(cancel=token),
    )
    assert isinstance(turn.outcome, Cancelled)
    assert turn.compaction is None
    entries = await store.entries("s")
    assert all(isinstance(e, MessageEntry) for e in entries)
    assert len(entries) == 21  # the prompt of the cancelled run is kept


async def test_manual_compaction_on_demand() -> None:
    store = InMemorySessionStore()
    history = long_transcript(3)
    await store.append("s", history, expected_version=0)
    model = ScriptedModel(["Summary one.", "Summary two."])
    compaction = Compaction(keep_recent_tokens=250)

    # below the trigger: only a forced (manual) compaction runs
    assert await compact_session(model, store, "s", compaction, force=False) is None
    assert model.requests == []
    report = await compact_session(model, store, "s", compaction)
    assert report is not None
    assert report.summarized_messages == 4
    view = await store.load("s")
    assert view.messages == [ChatMessage.user(SUMMARY_PREFIX + "Summary one."), *history[4:]]
    assert view.seqs == [7, 5, 6]

    # compacting the compacted view folds the old summary into the new one
    await store.append("s", long_transcript(1, tokens=10), expected_version=7)
    report = await compact_session(model, store, "s", Compaction(keep_recent_tokens=30))
    assert report is not None
    assert report.summarized_messages == 3  # old summary, q2, a2
    assert "Summary one." in model.requests[1].messages[1].text
    view = await store.load("s")
    assert [m.text for m in view.messages] == [
        SUMMARY_PREFIX + "Summary two.",
        *(m.text for m in long_transcript(1, tokens=10)),
    ]
    assert view.seqs == [10, 8, 9]
    assert view == SessionView.from_entries(await store.entries("s"))
    assert len(await store.entries("s")) == 10

    # nothing to compact: no call, no entry
    assert await compact_session(model, store, "empty") is None
    assert await store.entries("empty") == []
    assert len(model.requests) == 2


async def test_manual_compaction_detects_a_concurrent_writer() -> None:
    store = InMemorySessionStore()
    await store.append("s", long_transcript(3), expected_version=0)

    async def summary_while_someone_writes(request: ChatRequest) -> str:
        await store.append("s", [ChatMessage.user("late")], expected_version=6)
        return "summary"

    with pytest.raises(AgentError) as caught:
        await compact_session(
            ScriptedModel([summary_while_someone_writes]),
            store,
            "s",
            Compaction(keep_recent_tokens=250),
        )
    assert caught.value.kind is ErrorKind.CONFLICT
    entries = await store.entries("s")
    assert [e.kind for e in entries] == ["message"] * 7


def test_entries_and_views_validate_themselves() -> None:
    with pytest.raises(ValueError, match="first_kept_seq"):
        CompactionEntry(seq=3, summary="s", first_kept_seq=3, tokens_before=1, tokens_after=1)
    with pytest.raises(ValueError, match="one seq per message"):
        SessionView(messages=[ChatMessage.user("x")], seqs=[], version=1)
    entry = MessageEntry(seq=1, message=ChatMessage.user("x"))
    assert json.loads(entry.model_dump_json())["kind"] == "message"


# --- the in-memory store is bounded --------------------------------------------------------


async def test_the_in_memory_store_forgets_the_least_recently_used_session(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = InMemorySessionStore(max_sessions=2)
    await store.append("a", [ChatMessage.user("1")], expected_version=0)
    await store.append("b", [ChatMessage.user("2")], expected_version=0)
    assert (await store.load("a")).version == 1  # "a" is now the most recently used
    with caplog.at_level(logging.INFO, logger="agent_plugin.sessions"):
        await store.append("c", [ChatMessage.user("3")], expected_version=0)
    assert (await store.load("b")).version == 0  # forgotten
    assert (await store.load("a")).version == 1
    assert (await store.load("c")).version == 1
    assert any("forgot session 'b'" in r.getMessage() for r in caplog.records)
    assert "sessions=2" in repr(store)
    unbounded = InMemorySessionStore(max_sessions=None)
    for i in range(50):
        await unbounded.append(f"s{i}", [ChatMessage.user("x")], expected_version=0)
    assert "sessions=50" in repr(unbounded)
    with pytest.raises(AgentError):
        InMemorySessionStore(max_sessions=0)
