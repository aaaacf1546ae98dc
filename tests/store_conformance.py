"""The conformance suite every :class:`~agent_plugin.sessions.SessionStore` must pass.

Use it by subclassing :class:`SessionStoreContract` in a ``test_*.py`` module and providing a
``store`` fixture (sync or async, parametrised as you like)::

    class TestSqliteSessionStore(SessionStoreContract):
        @pytest.fixture
        async def store(self, engine) -> AsyncIterator[SessionStore]:
            yield SqlSessionStore(engine)

Every test uses fresh random session ids, so a store backed by a shared database needs no
cleanup between tests.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from agent_plugin.branching import Branch, SessionLock
from agent_plugin.compaction import SUMMARY_PREFIX, CompactionReport
from agent_plugin.errors import AgentError, ErrorKind, SessionLocked
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
from agent_plugin.sessions import (
    CompactionEntry,
    MessageEntry,
    SessionStore,
    SessionView,
    session_entry_adapter,
)

__all__ = ["SessionStoreContract", "every_part_transcript", "new_session_id", "numbered"]


def new_session_id(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def numbered(count: int, label: str = "m") -> list[ChatMessage]:
    """``count`` messages alternating user / assistant, with texts ``<label>1``, ``<label>2``..."""
    return [
        ChatMessage.of_text(Role.USER if i % 2 else Role.ASSISTANT, f"{label}{i}")
        for i in range(1, count + 1)
    ]


def every_part_transcript() -> list[ChatMessage]:
    """A transcript with every content part type and every optional field set and unset."""
    return [
        ChatMessage(
            role=Role.USER,
            content=[
                TextPart(text='Look at these — 日本語, emoji 🎉, quotes " and \\ backslash'),
                ImagePart(image=Image(url="https://example.com/cat.png")),
                ImagePart(image=Image(data="iVBORw0KGgo=", media_type="image/png")),
            ],
        ),
        ChatMessage(
            role=Role.ASSISTANT,
            content=[
                ThinkingPart(thinking=Thinking(text="Let me think.", signature="sig-abc==")),
                ThinkingPart(thinking=Thinking(text="Unsigned thought.")),
                RedactedThinkingPart(redacted_thinking=RedactedThinking(data="b64-opaque==")),
                TextPart(text=""),
                ToolCallPart(
                    tool_call=ToolCall(
                        id="call_1",
                        name="search",
                        arguments={
                            "query": "naïve café",
                            "limit": 3,
                            "ratio": 0.25,
                            "exact": True,
                            "tags": ["a", None, {"nested": []}],
                        },
                    )
                ),
                ToolCallPart(
                    tool_call=ToolCall(
                        id="call_2", name="broken", arguments={}, raw_arguments='{"city": "Os'
                    )
                ),
            ],
        ),
        ChatMessage(
            role=Role.TOOL,
            content=[
                ToolResultPart(tool_result=ToolResult(tool_call_id="call_1", content='["hit"]')),
                ToolResultPart(
                    tool_result=ToolResult(
                        tool_call_id="call_2",
                        content='{"error":"arguments are not valid JSON"}',
                        is_error=True,
                    )
                ),
            ],
        ),
        ChatMessage.assistant("Done.\nTwo lines."),
    ]


def report(summarized: int = 2) -> CompactionReport:
    return CompactionReport(
        summarized_messages=summarized,
        tokens_before=900,
        tokens_after=300,
        usage=TokenUsage(input_tokens=120, output_tokens=40, cache_read_tokens=7),
    )


def texts(view: SessionView) -> list[str]:
    return [m.text for m in view.messages]


async def expect_conflict(store: SessionStore, session_id: str, version: int) -> None:
    """The session is still at ``version``: nothing was written by the failed call."""
    assert (await store.load(session_id)).version == version
    entries = await store.entries(session_id)
    assert [e.seq for e in entries] == list(range(1, version + 1))


class SessionStoreContract:
    """Behaviour every session store shares. Subclasses provide the ``store`` fixture."""

    # --- basics ----------------------------------------------------------------------------

    async def test_unknown_session_is_empty(self, store: SessionStore) -> None:
        session = new_session_id()
        view = await store.load(session)
        assert view == SessionView()
        assert view.messages == []
        assert view.version == 0
        assert await store.entries(session) == []
        await store.delete(session)  # deleting what does not exist is fine

    async def test_every_message_part_round_trips(self, store: SessionStore) -> None:
        session = new_session_id()
        transcript = every_part_transcript()
        assert await store.append(session, transcript, expected_version=0) == len(transcript)
        view = await store.load(session)
        assert view.messages == transcript
        assert view.seqs == [1, 2, 3, 4]
        # the JSON form survives too (exclude-if-default fields stay excluded)
        dumped = [m.model_dump(mode="json") for m in view.messages]
        assert dumped == [m.model_dump(mode="json") for m in transcript]
        call = view.messages[1].tool_calls[1]
        assert call.raw_arguments == '{"city": "Os'
        assert view.messages[1].tool_calls[0].raw_arguments is None
        results = [p for p in view.messages[2].content if isinstance(p, ToolResultPart)]
        assert [r.tool_result.is_error for r in results] == [False, True]
        entries = await store.entries(session)
        assert [e.message for e in entries if isinstance(e, MessageEntry)] == transcript

    async def test_append_keeps_order_and_counts_versions(self, store: SessionStore) -> None:
        session = new_session_id()
        first, second = numbered(2, "a"), numbered(3, "b")
        assert await store.append(session, first, expected_version=0) == 2
        assert await store.append(session, second, expected_version=2) == 5
        view = await store.load(session)
        assert texts(view) == ["a1", "a2", "b1", "b2", "b3"]
        assert view.version == 5
        assert view.seqs == [1, 2, 3, 4, 5]
        entries = await store.entries(session)
        assert [e.seq for e in entries] == [1, 2, 3, 4, 5]
        assert all(e.kind == "message" for e in entries)

    async def test_an_empty_append_writes_nothing(self, store: SessionStore) -> None:
        session = new_session_id()
        assert await store.append(session, [], expected_version=0) == 0
        await store.append(session, numbered(1), expected_version=0)
        assert await store.append(session, [], expected_version=1) == 1
        assert (await store.load(session)).version == 1
        with pytest.raises(AgentError) as caught:
            await store.append(session, [], expected_version=0)
        assert caught.value.kind is ErrorKind.CONFLICT

    async def test_sessions_are_isolated(self, store: SessionStore) -> None:
        one, two = new_session_id("one"), new_session_id("two")
        await store.append(one, numbered(3, "x"), expected_version=0)
        await store.append(two, numbered(1, "y"), expected_version=0)
        await store.append_compaction(one, "sum", 3, report(), expected_version=3)
        assert texts(await store.load(two)) == ["y1"]
        assert (await store.load(two)).version == 1
        assert [e.seq for e in await store.entries(two)] == [1]
        await store.delete(one)
        assert await store.load(one) == SessionView()
        assert await store.entries(one) == []
        assert texts(await store.load(two)) == ["y1"]
        # a deleted session starts again from version 0
        assert await store.append(one, numbered(1, "z"), expected_version=0) == 1
        assert texts(await store.load(one)) == ["z1"]

    async def test_bad_session_ids_are_config_errors(self, store: SessionStore) -> None:
        for bad in ("", "x" * 256):
            with pytest.raises(AgentError) as caught:
                await store.append(bad, numbered(1), expected_version=0)
            assert caught.value.kind is ErrorKind.CONFIG
        longest = new_session_id()
        longest += "x" * (255 - len(longest))
        await store.delete(longest)
        assert await store.append(longest, numbered(1), expected_version=0) == 1
        await store.delete(longest)

    # --- conflicts -------------------------------------------------------------------------

    async def test_a_stale_version_conflicts_and_writes_nothing(self, store: SessionStore) -> None:
        session = new_session_id()
        await store.append(session, numbered(2), expected_version=0)
        for stale in (0, 1, 3, 7):
            with pytest.raises(AgentError) as caught:
                await store.append(session, numbered(2, "late"), expected_version=stale)
            assert caught.value.kind is ErrorKind.CONFLICT
            assert caught.value.http_status == 409
            assert session in caught.value.message
            await expect_conflict(store, session, 2)
        with pytest.raises(AgentError) as caught:
            await store.append_compaction(session, "s", 1, report(), expected_version=1)
        assert caught.value.kind is ErrorKind.CONFLICT
        await expect_conflict(store, session, 2)
        assert texts(await store.load(session)) == ["m1", "m2"]

    async def test_appending_to_an_unknown_session_needs_version_zero(
        self, store: SessionStore
    ) -> None:
        session = new_session_id()
        with pytest.raises(AgentError) as caught:
            await store.append(session, numbered(1), expected_version=1)
        assert caught.value.kind is ErrorKind.CONFLICT
        assert await store.load(session) == SessionView()

    async def test_two_concurrent_writers_one_wins(self, store: SessionStore) -> None:
        session = new_session_id()
        await store.append(session, numbered(2, "base"), expected_version=0)
        barrier = asyncio.Barrier(2)

        async def writer(label: str) -> int:
            view = await store.load(session)
            await barrier.wait()  # both have read version 2 before either writes
            return await store.append(session, numbered(3, label), expected_version=view.version)

        results = await asyncio.gather(writer("a"), writer("b"), return_exceptions=True)
        wins = [r for r in results if isinstance(r, int)]
        losses = [r for r in results if isinstance(r, AgentError)]
        assert wins == [5]
        assert len(losses) == 1
        assert losses[0].kind is ErrorKind.CONFLICT
        loaded = texts(await store.load(session))
        assert loaded[:2] == ["base1", "base2"]
        assert loaded[2:] in (["a1", "a2", "a3"], ["b1", "b2", "b3"])
        assert [e.seq for e in await store.entries(session)] == [1, 2, 3, 4, 5]

    async def test_concurrent_writers_that_retry_lose_nothing(self, store: SessionStore) -> None:
        session = new_session_id()
        writers, batches, size = 4, 3, 3

        async def writer(w: int) -> int:
            conflicts = 0
            for b in range(batches):
                batch = numbered(size, f"w{w}b{b}-")
                while not await attempt(batch):
                    conflicts += 1
            return conflicts

        async def attempt(batch: list[ChatMessage]) -> bool:
            view = await store.load(session)
            await asyncio.sleep(0)  # let the other writers read the same version
            try:
                await store.append(session, batch, expected_version=view.version)
            except AgentError as error:
                if error.kind is not ErrorKind.CONFLICT:
                    raise
                return False
            return True

        conflicts = await asyncio.gather(*(writer(w) for w in range(writers)))
        assert sum(conflicts) > 0  # the writers really did collide
        loaded = texts(await store.load(session))
        assert len(loaded) == writers * batches * size
        # every batch is present once and contiguous: nothing lost, nothing interleaved
        chunks = [loaded[i : i + size] for i in range(0, len(loaded), size)]
        prefixes = [chunk[0][:-1] for chunk in chunks]  # drop the trailing "1"
        assert sorted(prefixes) == sorted(
            f"w{w}b{b}-" for w in range(writers) for b in range(batches)
        )
        for prefix, chunk in zip(prefixes, chunks, strict=True):
            assert chunk == [f"{prefix}{i}" for i in range(1, size + 1)]
        entries = await store.entries(session)
        assert [e.seq for e in entries] == list(range(1, len(loaded) + 1))

    # --- compaction ------------------------------------------------------------------------

    async def test_compaction_changes_the_view_not_the_history(self, store: SessionStore) -> None:
        session = new_session_id()
        transcript = numbered(6)
        await store.append(session, transcript, expected_version=0)
        version = await store.append_compaction(
            session, "the first four", 5, report(4), expected_version=6
        )
        assert version == 7
        view = await store.load(session)
        assert view.version == 7
        assert view.seqs == [7, 5, 6]
        assert view.messages[0] == ChatMessage.user(SUMMARY_PREFIX + "the first four")
        assert view.messages[1:] == transcript[4:]

        assert await store.append(session, numbered(2, "n"), expected_version=7) == 9
        view = await store.load(session)
        assert texts(view)[1:] == ["m5", "m6", "n1", "n2"]
        assert view.seqs == [7, 5, 6, 8, 9]

        entries = await store.entries(session)
        assert [e.kind for e in entries] == ["message"] * 6 + ["compaction"] + ["message"] * 2
        compaction = entries[6]
        assert isinstance(compaction, CompactionEntry)
        assert compaction == CompactionEntry(
            seq=7,
            summary="the first four",
            first_kept_seq=5,
            tokens_before=900,
            tokens_after=300,
            usage=TokenUsage(input_tokens=120, output_tokens=40, cache_read_tokens=7),
        )
        # the audit history still has every message
        assert [e.message for e in entries if isinstance(e, MessageEntry)] == [
            *transcript,
            *numbered(2, "n"),
        ]
        assert SessionView.from_entries(entries) == view

    async def test_the_latest_compaction_wins(self, store: SessionStore) -> None:
        session = new_session_id()
        await store.append(session, numbered(4), expected_version=0)
        await store.append_compaction(session, "first", 3, report(), expected_version=4)
        await store.append(session, numbered(4, "n"), expected_version=5)  # seqs 6..9
        version = await store.append_compaction(session, "second", 8, report(), expected_version=9)
        assert version == 10
        view = await store.load(session)
        assert texts(view) == [SUMMARY_PREFIX + "second", "n3", "n4"]
        assert view.seqs == [10, 8, 9]
        assert view == SessionView.from_entries(await store.entries(session))

    async def test_compaction_must_keep_a_message_entry(self, store: SessionStore) -> None:
        session = new_session_id()
        with pytest.raises(AgentError) as caught:
            await store.append_compaction(session, "s", 1, report(), expected_version=0)
        assert caught.value.kind is ErrorKind.CONFIG
        await store.append(session, numbered(3), expected_version=0)
        await store.append_compaction(session, "s", 2, report(), expected_version=3)
        for bad in (0, 4, 5, 9):  # no entry, the compaction entry itself, past the end
            with pytest.raises(AgentError) as caught:
                await store.append_compaction(session, "t", bad, report(), expected_version=4)
            assert caught.value.kind is ErrorKind.CONFIG
        await expect_conflict(store, session, 4)

    # --- the audit history -----------------------------------------------------------------

    async def test_entries_page_through_the_history(self, store: SessionStore) -> None:
        session = new_session_id()
        await store.append(session, numbered(5), expected_version=0)
        await store.append_compaction(session, "s", 4, report(), expected_version=5)
        await store.append(session, numbered(1, "n"), expected_version=6)
        everything = await store.entries(session)
        assert [e.seq for e in everything] == [1, 2, 3, 4, 5, 6, 7]
        pages: list[list[int]] = []
        after = 0
        while page := await store.entries(session, after=after, limit=3):
            pages.append([e.seq for e in page])
            after = page[-1].seq
        assert pages == [[1, 2, 3], [4, 5, 6], [7]]
        assert [e.seq for e in await store.entries(session, after=5)] == [6, 7]
        assert await store.entries(session, after=7) == []
        assert await store.entries(session, after=70, limit=5) == []
        for bad_after, bad_limit in ((-1, None), (0, 0), (0, -3)):
            with pytest.raises(AgentError) as caught:
                await store.entries(session, after=bad_after, limit=bad_limit)
            assert caught.value.kind is ErrorKind.CONFIG

    async def test_entries_round_trip_through_json(self, store: SessionStore) -> None:
        session = new_session_id()
        await store.append(session, every_part_transcript(), expected_version=0)
        await store.append_compaction(session, "s", 3, report(), expected_version=4)
        for entry in await store.entries(session):
            data = session_entry_adapter.dump_json(entry)
            assert session_entry_adapter.validate_json(data) == entry

    # --- branches and the lock ---------------------------------------------------------------

    async def test_op23_a_linear_session_has_one_active_branch(self, store: SessionStore) -> None:
        sid = new_session_id()
        assert await store.branches(sid) == []
        await store.append(sid, numbered(3), expected_version=0)
        assert await store.branches(sid) == [Branch(leaf=3, length=3, active=True)]
        entries = await store.entries(sid)
        assert [e.parent_seq for e in entries] == [None, 1, 2]

    async def test_op23_a_fork_starts_a_branch_the_next_append_continues(
        self, store: SessionStore
    ) -> None:
        sid = new_session_id()
        await store.append(sid, numbered(4), expected_version=0)
        forked = await store.fork(sid, 2)
        assert forked == Branch(leaf=2, length=2, fork_point=2, active=True)
        view = await store.load(sid)
        assert (texts(view), view.seqs, view.leaf, view.version) == (["m1", "m2"], [1, 2], 2, 4)

        assert await store.append(sid, numbered(2, "b"), expected_version=4) == 6
        assert texts(await store.load(sid)) == ["m1", "m2", "b1", "b2"]
        assert [(e.seq, e.parent_seq) for e in await store.entries(sid, after=4)] == [
            (5, 2),
            (6, 5),
        ]
        assert await store.branches(sid) == [
            Branch(leaf=4, length=4, fork_point=2, active=False),
            Branch(leaf=6, length=4, fork_point=2, active=True),
        ]
        # the first branch stays, and an append can continue it by naming its leaf
        old = await store.load(sid, leaf=4)
        assert (texts(old), old.leaf, old.version) == (["m1", "m2", "m3", "m4"], 4, 6)
        assert await store.append(sid, numbered(1, "c"), expected_version=6, leaf=4) == 7
        assert texts(await store.load(sid)) == ["m1", "m2", "m3", "m4", "c1"]
        assert [b.leaf for b in await store.branches(sid) if b.active] == [7]
        # a fork at the head changes nothing; a stale version still conflicts on a branch
        assert (await store.fork(sid, 7)).active
        with pytest.raises(AgentError) as caught:
            await store.append(sid, numbered(1), expected_version=6, leaf=6)
        assert caught.value.kind is ErrorKind.CONFLICT
        await expect_conflict(store, sid, 7)

    async def test_op23_three_branches_from_one_fork_point(self, store: SessionStore) -> None:
        sid = new_session_id()
        version = await store.append(sid, numbered(2), expected_version=0)
        for label in ("x", "y"):
            await store.fork(sid, 1)
            version = await store.append(sid, numbered(1, label), expected_version=version)
        branches = await store.branches(sid)
        assert [(b.leaf, b.length, b.fork_point) for b in branches] == [
            (2, 2, 1),
            (3, 2, 1),
            (4, 2, 1),
        ]
        assert [texts(await store.load(sid, leaf=b.leaf)) for b in branches] == [
            ["m1", "m2"],
            ["m1", "x1"],
            ["m1", "y1"],
        ]

    async def test_op24_a_compaction_folds_only_its_own_branch(self, store: SessionStore) -> None:
        sid = new_session_id()
        await store.append(sid, numbered(6), expected_version=0)
        await store.fork(sid, 4)
        await store.append(sid, numbered(2, "b"), expected_version=6)
        with pytest.raises(AgentError) as caught:  # m5 is not on the head's branch
            await store.append_compaction(sid, "s", 5, report(), expected_version=8)
        assert caught.value.kind is ErrorKind.CONFIG
        assert await store.append_compaction(sid, "s", 3, report(), expected_version=8) == 9
        view = await store.load(sid)
        assert texts(view) == [f"{SUMMARY_PREFIX}s", "m3", "m4", "b1", "b2"]
        assert (view.seqs, view.leaf) == ([9, 3, 4, 7, 8], 9)
        assert texts(await store.load(sid, leaf=6)) == [f"m{i}" for i in range(1, 7)]
        # a compaction of the other branch, named by its leaf
        assert (
            await store.append_compaction(sid, "t", 5, report(), expected_version=9, leaf=6) == 10
        )
        assert texts(await store.load(sid)) == [f"{SUMMARY_PREFIX}t", "m5", "m6"]
        assert [e.parent_seq for e in await store.entries(sid, after=8)] == [8, 6]

    async def test_unknown_leaves_and_fork_points_are_not_found(self, store: SessionStore) -> None:
        sid = new_session_id()
        for call in (store.load(sid, leaf=1), store.fork(sid, 1)):
            with pytest.raises(AgentError) as caught:
                await call
            assert caught.value.kind is ErrorKind.NOT_FOUND
        await store.append(sid, numbered(2), expected_version=0)
        for call in (
            store.load(sid, leaf=3),
            store.fork(sid, 0),
            store.append(sid, numbered(1), expected_version=2, leaf=5),
        ):
            with pytest.raises(AgentError) as caught:
                await call
            assert caught.value.kind is ErrorKind.NOT_FOUND
        await expect_conflict(store, sid, 2)  # nothing written

    async def test_ag01_a_locked_session_keeps_its_history(self, store: SessionStore) -> None:
        sid = new_session_id()
        await store.append(sid, numbered(4), expected_version=0)
        lock = await store.lock(sid, "f" * 64)
        assert lock == SessionLock(fingerprint="f" * 64, seq=4)
        assert (await store.load(sid)).lock == lock
        with pytest.raises(SessionLocked):
            await store.fork(sid, 2)
        with pytest.raises(SessionLocked):
            await store.append_compaction(sid, "s", 3, report(), expected_version=4)
        assert await store.append(sid, numbered(2, "b"), expected_version=4) == 6
        assert (await store.fork(sid, 5)).leaf == 5  # after the locked history: allowed
        assert await store.append(sid, numbered(1, "c"), expected_version=6) == 7
        await store.unlock(sid)
        assert (await store.load(sid)).lock is None
        await store.fork(sid, 2)
        assert texts(await store.load(sid)) == ["m1", "m2"]

    async def test_ag01_a_branch_off_the_locked_history_cannot_be_continued(
        self, store: SessionStore
    ) -> None:
        sid = new_session_id()
        await store.append(sid, numbered(3), expected_version=0)
        await store.fork(sid, 1)
        await store.append(sid, numbered(1, "b"), expected_version=3)
        await store.fork(sid, 3)
        await store.lock(sid, "f" * 64)
        with pytest.raises(SessionLocked):
            await store.append(sid, numbered(1), expected_version=4, leaf=4)
        await expect_conflict(store, sid, 4)

    async def test_ag01_an_empty_session_can_be_locked_and_then_written(
        self, store: SessionStore
    ) -> None:
        sid = new_session_id()
        assert await store.lock(sid, "a" * 64) == SessionLock(fingerprint="a" * 64, seq=0)
        view = await store.load(sid)
        assert (view.version, view.lock) == (0, SessionLock(fingerprint="a" * 64, seq=0))
        assert await store.append(sid, numbered(2), expected_version=0) == 2
        assert (await store.load(sid)).lock is not None
        await store.delete(sid)
        assert await store.load(sid) == SessionView()
        assert await store.branches(sid) == []
