"""A locked agent keeps its prompt prefix [AG-01], and a golden check on both wires: every
request starts with the bytes of the request before it (tools, system prompt and messages in
the provider's cache order, cache markers aside), across turns, a pause and its resume, and
turns of a session reloaded from the database.

The bodies are the bytes the real clients put on the wire (httpx's mock transport); replies
are recorded bodies (``tests/fixtures/wire``)."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent_plugin import sessions
from agent_plugin.agent import Agent
from agent_plugin.compaction import Compaction
from agent_plugin.errors import AgentError, ErrorKind, PrefixLocked
from agent_plugin.hooks import AgentHooks, NextTurn, TurnInfo
from agent_plugin.memory import InMemoryMemoryStore
from agent_plugin.messages import ChatMessage
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import ApprovalDecision, Approve, AwaitingApproval, Completed, RunState
from agent_plugin.policy import ToolRules
from agent_plugin.providers.scripted import ScriptedModel
from agent_plugin.sessions import InMemorySessionStore
from agent_plugin.storage import Database, SqlSessionStore
from agent_plugin.tools import FnTool, ToolEffect
from tests.wire_agent import (
    TOO_LONG,
    WIRES,
    Recorder,
    Reply,
    Wire,
    client,
    recorded,
    text_reply,
    tool_reply,
)

LOOK = FnTool(
    "look", "looks", {"type": "object"}, lambda a: {"seen": a}, effect=ToolEffect.READ_ONLY
)
ACT = FnTool("act", "acts", {"type": "object"}, lambda a: "acted", effect=ToolEffect.WRITE)

_MARKER = re.compile(r',"cache_control":\{[^{}]*\}')


def top_level(raw: bytes) -> dict[str, str]:
    """The raw text of each top-level value of a compact JSON body, by key."""
    text = raw.decode()
    decoder = json.JSONDecoder()
    assert text[0] == "{"
    values: dict[str, str] = {}
    pos = 1
    while text[pos] != "}":
        key, pos = decoder.raw_decode(text, pos)
        assert text[pos] == ":"
        _, end = decoder.raw_decode(text, pos + 1)
        values[key] = text[pos + 1 : end]
        pos = end + (text[end] == ",")
    return values


def prompt_prefix(wire: Wire, raw: bytes) -> bytes:
    """What a provider caches of a request, as the wire carried it: the tools, the system
    prompt, then the messages (the array left open, so the next request may go on), with the
    cache markers taken out (they move to the newest message on every request)."""
    values = top_level(raw)
    tools = values.get("tools", "")
    messages = values["messages"][:-1]
    system = values.get("system", "") if wire == "anthropic" else ""
    return _MARKER.sub("", tools + system + messages).encode()


def assert_each_starts_with_the_last(wire: Wire, bodies: list[bytes]) -> None:
    assert len(bodies) >= 2
    for before, after in itertools.pairwise(bodies):
        first, then = prompt_prefix(wire, before), prompt_prefix(wire, after)
        assert then.startswith(first), (first, then)
        assert len(then) > len(first)


# --- the golden prefix ----------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("wire", WIRES)
async def test_ag01_each_request_of_a_run_starts_with_the_last_one(
    wire: Wire, streamed: bool
) -> None:
    sent = Recorder()
    replies: list[Reply] = [
        tool_reply(wire, "look", {"at": "the logs"}, "call_1"),
        tool_reply(wire, "look", {"at": "the metrics"}, "call_2"),
        text_reply(wire, "all quiet"),
    ]
    agent = Agent(client(wire, replies, sent), tools=[LOOK], system_prompt="You watch.").lock()
    turn = await agent.run("anything odd?", options=RunOptions(stream=streamed))
    assert isinstance(turn.outcome, Completed)
    assert len(sent.bodies) == 3
    assert_each_starts_with_the_last(wire, sent.bodies)


@pytest.mark.parametrize("wire", WIRES)
async def test_ag01_the_request_after_a_resume_starts_with_the_one_before_the_pause(
    wire: Wire,
) -> None:
    sent = Recorder()

    def agent(*replies: Reply) -> Agent:
        return Agent(
            client(wire, list(replies), sent),
            tools=[LOOK, ACT],
            system_prompt="You act with care.",
            policy=ToolRules.ask_before_acting(),
        ).lock()

    paused = await agent(
        tool_reply(wire, "look", {}, "call_1"), tool_reply(wire, "act", {}, "call_2")
    ).run("fix it")
    assert isinstance(paused.outcome, AwaitingApproval)
    state = RunState.model_validate_json(paused.outcome.state.model_dump_json())
    approve = [ApprovalDecision(call_id="call_2", approval=Approve())]
    resumed = await agent(text_reply(wire, "fixed")).resume(state, approve)
    assert isinstance(resumed.outcome, Completed)
    assert len(sent.bodies) == 3
    assert_each_starts_with_the_last(wire, sent.bodies)


@pytest.fixture
async def sql_sessions(tmp_path: Path) -> AsyncIterator[SqlSessionStore]:
    database = Database(f"sqlite+aiosqlite:///{tmp_path / 'agent.db'}")
    await database.migrate()
    yield SqlSessionStore(database)
    await database.dispose()


@pytest.mark.parametrize("wire", WIRES)
async def test_ag01_a_sessions_next_turn_starts_with_the_last_request_of_the_one_before(
    wire: Wire, sql_sessions: SqlSessionStore
) -> None:
    sent = Recorder()
    turns: list[list[Reply]] = [
        [tool_reply(wire, "look", {"at": "Oslo"}, "call_1"), text_reply(wire, "Oslo: sunny")],
        [text_reply(wire, "Bergen: rain")],
        [tool_reply(wire, "look", {"at": "Tromsø"}, "call_2"), text_reply(wire, "Tromsø: snow")],
    ]
    for prompt, replies in zip(["Oslo?", "Bergen?", "Tromsø?"], turns, strict=True):
        # a fresh agent each turn, as after a restart: the history comes from the database
        agent = Agent(client(wire, replies, sent), tools=[LOOK], system_prompt="Weather.").lock()
        turn = await sessions.run(agent, prompt, session="weather", store=sql_sessions)
        assert isinstance(turn.outcome, Completed)
    assert len(sent.bodies) == 5
    assert_each_starts_with_the_last(wire, sent.bodies)


@pytest.mark.parametrize("wire", WIRES)
async def test_ag01_a_locked_agent_keeps_its_system_prompt_when_memory_changes(wire: Wire) -> None:
    """Memory edits reach an unlocked agent's prompt at its next run (a new prefix); a locked
    agent keeps the prompt it rendered first, so the next run's request goes on from it."""
    for locked in (False, True):
        sent = Recorder()
        memory = InMemoryMemoryStore()
        note = {"action": "add", "block": "memory", "text": "the user likes short answers"}
        replies: list[Reply] = [
            tool_reply(wire, "memory", note, "call_1"),
            text_reply(wire, "noted"),
            text_reply(wire, "ok"),
        ]
        agent = Agent(client(wire, replies, sent), system_prompt="You help.", memory=memory)
        if locked:
            agent.lock()
        store = InMemorySessionStore()
        await sessions.run(agent, "remember: short answers", session="s", store=store)
        await sessions.run(agent, "hello", session="s", store=store)
        last, next_run = prompt_prefix(wire, sent.bodies[1]), prompt_prefix(wire, sent.bodies[2])
        assert next_run.startswith(last) is locked
        assert ("short answers" in system_text(wire, sent.bodies[2])) is not locked
        assert "short answers" in str(await memory.load("agent"))


def system_text(wire: Wire, raw: bytes) -> str:
    body = json.loads(raw)
    if wire == "openai":
        return str(body["messages"][0]["content"])
    return "".join(block["text"] for block in body["system"])


# --- what a lock refuses --------------------------------------------------------------------


def test_ag01_a_locked_agent_refuses_changes_to_its_tools_and_system_prompt() -> None:
    agent = Agent(ScriptedModel(), tools=[LOOK], system_prompt="base").lock()
    assert agent.locked
    other = FnTool("other", "other", {"type": "object"}, lambda a: a)
    changes = [
        lambda: agent.tools.add(other),
        lambda: agent.tools.remove("look"),
        lambda: agent.tools.replace(LOOK),
        lambda: setattr(agent, "system_prompt", "new"),
    ]
    for change in changes:
        with pytest.raises(PrefixLocked) as caught:
            change()
        assert caught.value.kind is ErrorKind.CONFLICT
    assert agent.tools.names() == ["look"]
    assert agent.system_prompt == "base"
    agent.unlock()  # the caller accepts that the cache starts over
    agent.tools.add(other)
    agent.system_prompt = "new"
    assert (agent.locked, agent.tools.names(), agent.system_prompt) == (
        False,
        ["look", "other"],
        "new",
    )


async def test_ag01_a_locked_agent_does_not_compact_its_sessions() -> None:
    store = InMemorySessionStore()
    long = [
        ChatMessage.user("x" * 800),
        ChatMessage.assistant("y" * 800),
    ] * 3
    await store.append("s", long, expected_version=0)
    model = ScriptedModel(["answer"])
    agent = Agent(model, compaction=Compaction(trigger_tokens=100, keep_recent_tokens=50)).lock()
    turn = await sessions.run(agent, "go", session="s", store=store)
    assert isinstance(turn, sessions.SessionTurn)
    assert turn.compaction is None  # no summary call: the history stays the prefix
    assert model.calls == 1
    with pytest.raises(PrefixLocked):
        await sessions.compact(agent, "s", store=store)


@pytest.mark.parametrize("wire", WIRES)
async def test_ag01_a_locked_agent_raises_a_context_overflow_instead_of_folding(
    wire: Wire,
) -> None:
    store = InMemorySessionStore()
    await store.append("s", [ChatMessage.user("a"), ChatMessage.assistant("b")], expected_version=0)
    sent = Recorder()
    agent = Agent(
        client(wire, [recorded(TOO_LONG[wire])], sent),
        compaction=Compaction(trigger_tokens=1_000_000, keep_recent_tokens=1),
    ).lock()
    with pytest.raises(AgentError) as caught:
        await sessions.run(agent, "go", session="s", store=store)
    assert caught.value.kind is ErrorKind.CONTEXT_TOO_LONG
    assert len(sent.bodies) == 1


async def test_ag01_a_hook_may_not_change_a_locked_agents_tools_or_system_prompt() -> None:
    class Swap(AgentHooks):
        async def prepare_next_turn(self, turn: TurnInfo) -> NextTurn | None:
            return NextTurn(tools=["look"])

    agent = Agent(ScriptedModel(["x"]), tools=[LOOK], hooks=[Swap()]).lock()
    with pytest.raises(PrefixLocked):
        await agent.run("go")

    # what does not touch the prefix is fine: messages and the model
    class Nudge(AgentHooks):
        nudged = False

        async def prepare_next_turn(self, turn: TurnInfo) -> NextTurn | None:
            if self.nudged:
                return None
            self.nudged = True
            return NextTurn(messages=["more"], model="m2")

    model = ScriptedModel(["one", "two"])
    turn = await Agent(model, hooks=[Nudge()]).lock().run("go")
    assert isinstance(turn.outcome, Completed)
    assert model.requests[1].model == "m2"
