"""Session branches and the session lock, through :mod:`agent_plugin.sessions`: the tree
model on its own, a run on a forked leaf sends exactly that leaf's path (the scripted model's
request log and both real wires), a paused run resumes on its own branch, and a locked
session refuses what would change its prompt prefix with a typed error."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent_plugin import sessions
from agent_plugin.agent import Agent
from agent_plugin.branching import Branch, SessionTree, prefix_fingerprint
from agent_plugin.compaction import Compaction
from agent_plugin.errors import AgentError, ErrorKind, SessionLocked
from agent_plugin.messages import ChatMessage
from agent_plugin.outcomes import ApprovalDecision, Approve, AwaitingApproval, Completed, RunState
from agent_plugin.policy import ToolRules
from agent_plugin.providers.scripted import ScriptedModel
from agent_plugin.sessions import InMemorySessionStore, SessionStore, SessionView
from agent_plugin.storage import Database, SqlSessionStore
from agent_plugin.testing import tool_call
from agent_plugin.tools import FnTool, ToolEffect
from tests.wire_agent import WIRES, Recorder, Wire, client, text_reply

LOOK = FnTool("look", "looks", {"type": "object"}, lambda a: "seen", effect=ToolEffect.READ_ONLY)
ACT = FnTool("act", "acts", {"type": "object"}, lambda a: "acted", effect=ToolEffect.WRITE)


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    if request.param == "memory":
        yield InMemorySessionStore()
        return
    database = Database(f"sqlite+aiosqlite:///{tmp_path / 'agent.db'}")
    await database.migrate()
    yield SqlSessionStore(database)
    await database.dispose()


def texts(messages: list[ChatMessage]) -> list[str]:
    return [m.text for m in messages if m.role.value != "system"]


async def two_turns(agent: Agent, store: SessionStore, session: str = "s") -> None:
    for prompt in ("q1", "q2"):
        turn = await sessions.run(agent, prompt, session=session, store=store)
        assert isinstance(turn.outcome, Completed)


# --- the tree on its own ----------------------------------------------------------------------


def test_op23_the_tree_finds_paths_leaves_and_fork_points() -> None:
    # 1 - 2 - 3 - 4, then 5 after 2, 6 after 5, and 7 after 1
    tree = SessionTree([(1, None), (2, 1), (3, 2), (4, 3), (5, 2), (6, 5), (7, 1)], head=6)
    assert tree.path(6) == [1, 2, 5, 6]
    assert tree.path(4) == [1, 2, 3, 4]
    assert tree.path(99) == []
    assert tree.leaves() == [4, 6, 7]
    assert tree.branches() == [
        Branch(leaf=4, length=4, fork_point=2),
        Branch(leaf=6, length=4, fork_point=2, active=True),
        Branch(leaf=7, length=2, fork_point=1),
    ]
    # a head moved to an inner entry is a branch of its own until something follows it
    forked = SessionTree(tree.parents.items(), head=3)
    assert [b.leaf for b in forked.branches()] == [3, 4, 6, 7]
    assert forked.branches()[0] == Branch(leaf=3, length=3, fork_point=3, active=True)
    assert SessionTree([], head=0).branches() == []
    # links that loop end the walk instead of hanging it
    looped = SessionTree([(1, 2), (2, 1), (3, 2)], head=3)
    assert looped.path(3) == [1, 2, 3]
    assert [b.leaf for b in looped.branches()] == [3]


def test_op24_a_view_from_entries_follows_the_leaf() -> None:
    store_entries = [
        sessions.MessageEntry(seq=1, message=ChatMessage.user("q1")),
        sessions.MessageEntry(seq=2, message=ChatMessage.assistant("a1")),
        sessions.MessageEntry(seq=3, parent_seq=1, message=ChatMessage.assistant("b1")),
    ]
    assert texts(SessionView.from_entries(store_entries).messages) == ["q1", "b1"]
    assert texts(SessionView.from_entries(store_entries, leaf=2).messages) == ["q1", "a1"]
    # an entry stored before branches existed follows the one before it
    old = sessions.session_entry_adapter.validate_json(
        '{"kind": "message", "seq": 4, "message": {"role": "user", "content": []}}'
    )
    assert old.parent_seq == 3
    with pytest.raises(ValueError, match="parent_seq"):
        sessions.MessageEntry(seq=2, parent_seq=2, message=ChatMessage.user("x"))


# --- runs on branches -------------------------------------------------------------------------


async def test_op23_a_run_on_a_forked_leaf_sends_exactly_that_leafs_path(
    store: SessionStore,
) -> None:
    model = ScriptedModel(["a1", "a2", "b2", "c2"])
    agent = Agent(model, system_prompt="Be brief.")
    await two_turns(agent, store)

    forked = await sessions.fork("s", 2, store=store)
    assert (forked.leaf, forked.active) == (2, True)
    turn = await sessions.run(agent, "p2", session="s", store=store)
    assert texts(model.requests[-1].messages) == ["q1", "a1", "p2"]
    assert turn.session_version == 6

    # the first branch is still there, and a run can continue it by naming its leaf
    assert [(b.leaf, b.active) for b in await sessions.branches("s", store=store)] == [
        (4, False),
        (6, True),
    ]
    again = await sessions.run(agent, "q3", session="s", store=store, branch=4)
    assert texts(model.requests[-1].messages) == ["q1", "a1", "q2", "a2", "q3"]
    assert again.session_version == 8
    assert texts((await store.load("s")).messages) == ["q1", "a1", "q2", "a2", "q3", "c2"]
    assert texts((await store.load("s", leaf=6)).messages) == ["q1", "a1", "p2", "b2"]


async def test_an_unknown_branch_is_not_found(store: SessionStore) -> None:
    agent = Agent(ScriptedModel(["a1"]))
    await sessions.run(agent, "q1", session="s", store=store)
    for call in (
        sessions.run(agent, "q2", session="s", store=store, branch=7),
        sessions.fork("s", 9, store=store),
    ):
        with pytest.raises(AgentError) as caught:
            await call
        assert caught.value.kind is ErrorKind.NOT_FOUND


async def test_a_paused_run_on_a_branch_resumes_on_that_branch(store: SessionStore) -> None:
    model = ScriptedModel(["a1", "a2", tool_call("act", {}, id="c1"), "done"])
    agent = Agent(model, tools=[ACT], policy=ToolRules.ask_before_acting())
    await two_turns(agent, store)
    await sessions.fork("s", 4, store=store)  # the head, moved back and forth: a branch
    await sessions.fork("s", 2, store=store)
    await sessions.fork("s", 4, store=store)

    paused = await sessions.run(agent, "act", session="s", store=store, branch=2)
    assert isinstance(paused.outcome, AwaitingApproval)
    state = RunState.model_validate_json(paused.outcome.state.model_dump_json())
    assert state.session_leaf == 2
    approve = [ApprovalDecision(call_id="c1", approval=Approve())]
    done = await sessions.resume(agent, state, approve, store=store)
    assert isinstance(done.outcome, Completed)
    assert texts((await store.load("s")).messages)[:3] == ["q1", "a1", "act"]
    assert texts((await store.load("s", leaf=4)).messages) == ["q1", "a1", "q2", "a2"]


@pytest.mark.parametrize("wire", WIRES)
async def test_op23_both_wires_send_only_the_forked_branch(wire: Wire) -> None:
    sent = Recorder()
    replies = [text_reply(wire, t) for t in ("a1", "a2", "b2")]
    agent = Agent(client(wire, replies, sent), tools=[LOOK], system_prompt="You watch.")
    store = InMemorySessionStore()
    await two_turns(agent, store)
    await sessions.fork("s", 2, store=store)
    await sessions.run(agent, "p2", session="s", store=store)

    def said(body: bytes) -> list[str]:
        found: list[str] = []
        for message in json.loads(body)["messages"]:
            content: Any = message["content"]
            if message["role"] in ("system", "developer"):
                continue
            if isinstance(content, str):
                found.append(content)
            else:
                found.extend(part["text"] for part in content if part.get("type") == "text")
        return found

    assert [said(body) for body in sent.bodies] == [
        ["q1"],
        ["q1", "a1", "q2"],
        ["q1", "a1", "p2"],
    ]
    # branching changes which history is sent, nothing else
    first, last = json.loads(sent.bodies[1]), json.loads(sent.bodies[2])
    assert {k: v for k, v in first.items() if k != "messages"} == {
        k: v for k, v in last.items() if k != "messages"
    }


# --- the session lock -------------------------------------------------------------------------


async def test_ag01_a_locked_session_refuses_another_prompt_or_other_tools(
    store: SessionStore,
) -> None:
    model = ScriptedModel(["a1", "a2", "a3"])
    agent = Agent(model, tools=[LOOK], system_prompt="You watch.")
    await two_turns(agent, store)
    lock = await sessions.lock(agent, "s", store=store)
    assert lock.seq == 4
    assert lock.fingerprint == prefix_fingerprint("You watch.", agent.definitions())

    others = [
        Agent(model, tools=[LOOK], system_prompt="You act."),
        Agent(model, tools=[LOOK, ACT], system_prompt="You watch."),
        Agent(model, system_prompt="You watch."),
    ]
    for other in others:
        with pytest.raises(SessionLocked) as caught:
            await sessions.run(other, "q3", session="s", store=store)
        assert caught.value.kind is ErrorKind.CONFLICT
        assert "another system prompt or other tools" in str(caught.value)
    assert len(model.requests) == 2  # refused before any request
    turn = await sessions.run(agent, "q3", session="s", store=store)
    assert isinstance(turn.outcome, Completed)

    await sessions.unlock("s", store=store)
    turn = await sessions.run(others[0], "q4", session="s", store=store, branch=2)
    assert texts(model.requests[-1].messages) == ["q1", "a1", "q4"]


async def test_ag01_a_run_paused_in_a_locked_session_resumes_with_its_prefix_only(
    store: SessionStore,
) -> None:
    model = ScriptedModel(["a1", "a2", tool_call("act", {}, id="c1"), "done"])
    agent = Agent(model, tools=[ACT], policy=ToolRules.ask_before_acting())
    await two_turns(agent, store)
    lock = await sessions.lock(agent, "s", store=store)
    paused = await sessions.run(agent, "act", session="s", store=store)
    assert isinstance(paused.outcome, AwaitingApproval)
    state = RunState.model_validate_json(paused.outcome.state.model_dump_json())
    assert state.session_lock == lock.fingerprint
    approve = [ApprovalDecision(call_id="c1", approval=Approve())]
    other = Agent(model, tools=[ACT, LOOK], policy=ToolRules.ask_before_acting())
    with pytest.raises(SessionLocked) as caught:
        await sessions.resume(other, state, approve, store=store)
    assert "resuming it with another system prompt or other tools" in str(caught.value)
    assert len(model.requests) == 3  # refused before the approved call or a request
    done = await sessions.resume(agent, state, approve, store=store)
    assert isinstance(done.outcome, Completed)


async def test_ag01_an_overflow_in_a_locked_session_is_the_error_not_a_fold(
    store: SessionStore,
) -> None:
    # the agent may compact, the session may not: the context error is raised, no summary
    # call is made, and the session keeps exactly what it had
    model = ScriptedModel(["a1", "a2", AgentError(ErrorKind.CONTEXT_TOO_LONG, "too long")])
    agent = Agent(model, compaction=Compaction(trigger_tokens=10_000, keep_recent_tokens=12))
    await two_turns(agent, store)
    await sessions.lock(agent, "s", store=store)
    before = await store.load("s")
    with pytest.raises(AgentError) as caught:
        await sessions.run(agent, "q3", session="s", store=store)
    assert caught.value.kind is ErrorKind.CONTEXT_TOO_LONG
    assert len(model.requests) == 3  # no summary request after the overflow
    after = await store.load("s")
    assert (after.version, texts(after.messages)) == (before.version, texts(before.messages))


async def test_ag01_a_locked_session_keeps_its_history(store: SessionStore) -> None:
    model = ScriptedModel(["a1", "a2", "a3", "Summary.", "a4"])
    agent = Agent(model, compaction=Compaction(trigger_tokens=1, keep_recent_tokens=12))
    plain = Agent(model)
    await two_turns(plain, store)
    await sessions.fork("s", 2, store=store)
    await sessions.fork("s", 4, store=store)
    await sessions.lock(plain, "s", store=store)

    with pytest.raises(SessionLocked):
        await sessions.fork("s", 2, store=store)
    with pytest.raises(SessionLocked):
        await sessions.compact(plain, "s", store=store)
    with pytest.raises(SessionLocked):
        await sessions.run(plain, "q3", session="s", store=store, branch=1)
    # a run that would compact first does not: the locked history is sent as it is
    await sessions.lock(agent, "s", store=store)
    turn = await sessions.run(agent, "q3", session="s", store=store)
    assert turn.compaction is None
    assert texts(model.requests[-1].messages) == ["q1", "a1", "q2", "a2", "q3"]
    assert (await store.load("s")).lock is not None
    # unlocked, the same run compacts first
    await sessions.unlock("s", store=store)
    turn = await sessions.run(agent, "q4", session="s", store=store)
    assert turn.compaction is not None
