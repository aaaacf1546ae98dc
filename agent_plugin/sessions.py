"""Sessions: conversations that outlive a run, kept as append-only entries.

A session is a tree of entries (:mod:`agent_plugin.session_entries`, numbered ``seq = 1, 2,
...`` and never rewritten); a run continues one leaf, the *head* unless it names another, and
sends the path from there to the root. A session's *version* is the ``seq`` of its last entry,
and every write names the version it expects, so a second writer is a ``CONFLICT`` instead of
an interleaving. :class:`SessionStore` is the protocol (``tests/store_conformance.py`` is the
suite every store passes), :class:`InMemorySessionStore` the in-process store.

:func:`run` and :func:`resume` are the one door a run goes through, in a session or not: the
web handle and the background worker both call them; :func:`fork`, :func:`branches`,
:func:`lock` and :func:`unlock` manage a session's branches and its locked prefix.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Generic,
    Protocol,
    runtime_checkable,
)

from typing_extensions import TypeVar

from agent_plugin.branching import (
    Branch,
    SessionLock,
    SessionTree,
    prefix_fingerprint,
    unknown_entry_error,
)
from agent_plugin.cancellation import RunCancelled, until_cancelled
from agent_plugin.compaction import (
    Compaction,
    CompactionReason,
    CompactionReport,
)
from agent_plugin.errors import AgentError, ErrorKind, PrefixLocked, SessionLocked
from agent_plugin.events import Compacted
from agent_plugin.ids import new_run_id
from agent_plugin.messages import ChatMessage
from agent_plugin.options import EventSink, RunOptions
from agent_plugin.outcomes import (
    AgentOutcome,
    AgentTurn,
    ApprovalDecision,
    AwaitingApproval,
    OutputT,
    Paused,
    RunState,
)
from agent_plugin.providers.base import LlmClient
from agent_plugin.session_entries import (
    CompactionEntry,
    MessageEntry,
    SessionEntry,
    SessionView,
    session_entry_adapter,
)
from agent_plugin.text import unstorable

if TYPE_CHECKING:
    from agent_plugin.agent import Agent

__all__ = [
    "MAX_SESSION_ID_LENGTH",
    "CompactionEntry",
    "InMemorySessionStore",
    "MessageEntry",
    "SessionEntry",
    "SessionStore",
    "SessionTurn",
    "SessionView",
    "branches",
    "check_expected_version",
    "check_locked_run",
    "check_page",
    "check_session_id",
    "compact",
    "compact_session",
    "compaction_target_error",
    "conflict_error",
    "fork",
    "lock",
    "resume",
    "run",
    "session_entry_adapter",
    "unlock",
]

logger = logging.getLogger("agent_plugin.sessions")

T = TypeVar("T", default=str)

MAX_SESSION_ID_LENGTH: Final = 255
"""Session ids are non-empty strings of at most this many characters (a database key)."""


# --- the store protocol --------------------------------------------------------------------


@runtime_checkable
class SessionStore(Protocol):
    """Where sessions live. Writes append entries; nothing is ever rewritten.

    Every write names the version it expects (the seq of the session's last entry, 0 for a new
    session). If the session is at another version, the write raises
    ``AgentError(ErrorKind.CONFLICT)`` and stores nothing; otherwise its entries get the next
    seqs, all or none, and it returns the new version. Implementations raise only
    :class:`AgentError`. ``tests/store_conformance.py`` is the suite every store must pass.

    A database store should index entries by ``(session_id, seq)`` and load a view with two
    reads: the latest compaction entry, then the messages with ``seq >= first_kept_seq``
    (:meth:`SessionView.compose` builds the view), so a long session costs no more to load
    after compaction than a short one.
    """

    async def load(self, session_id: str, *, leaf: int | None = None) -> SessionView:
        """The compacted view of the branch ending at ``leaf`` (default: the head; unknown
        session: empty, version 0). A ``leaf`` that names no entry is ``NOT_FOUND``."""
        ...

    async def append(
        self,
        session_id: str,
        messages: Sequence[ChatMessage],
        *,
        expected_version: int,
        leaf: int | None = None,
    ) -> int:
        """Append one message entry per message after ``expected_version``, chained after
        ``leaf`` (default: the head); the last one becomes the head."""
        ...

    async def append_compaction(
        self,
        session_id: str,
        summary: str,
        first_kept_seq: int,
        report: CompactionReport,
        *,
        expected_version: int,
        leaf: int | None = None,
    ) -> int:
        """Append a compaction entry after ``expected_version``, chained after ``leaf``
        (default: the head), which it becomes.

        ``first_kept_seq`` must name a message entry on that branch (``ErrorKind.CONFIG``
        otherwise, nothing written); ``report`` supplies the token counts and usage. A locked
        session refuses it (:class:`~agent_plugin.errors.SessionLocked`).
        """
        ...

    async def entries(
        self, session_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[SessionEntry]:
        """The full history: entries with ``seq > after`` in seq order, at most ``limit``."""
        ...

    async def delete(self, session_id: str) -> None:
        """Forget the session and all its entries (an unknown session is not an error)."""
        ...

    async def fork(self, session_id: str, at_seq: int) -> Branch:
        """Make entry ``at_seq`` the head, so the next run starts a branch after it.

        ``NOT_FOUND`` if it names no entry; a locked session refuses a fork point before the
        lock's entry (:class:`~agent_plugin.errors.SessionLocked`). Writes no entry.
        """
        ...

    async def branches(self, session_id: str) -> list[Branch]:
        """One :class:`Branch` per leaf, in leaf order (unknown session: none)."""
        ...

    async def lock(self, session_id: str, fingerprint: str) -> SessionLock:
        """Lock the session at its head: from now on its history up to there is fixed."""
        ...

    async def unlock(self, session_id: str) -> None:
        """Lift the lock (an unlocked or unknown session is not an error)."""
        ...


# --- checks shared by store implementations ------------------------------------------------


def check_session_id(session_id: str) -> None:
    """Raise a config error unless ``session_id`` is a non-empty string of at most 255 chars."""
    if not isinstance(session_id, str) or not session_id:
        raise AgentError.config("a session id must be a non-empty string")
    if len(session_id) > MAX_SESSION_ID_LENGTH:
        raise AgentError.config(
            f"a session id must be at most {MAX_SESSION_ID_LENGTH} characters, "
            f"got {len(session_id)}"
        )
    problem = unstorable(session_id)
    if problem is not None:
        raise AgentError(ErrorKind.INVALID, f"a session id must not contain {problem}")


def check_page(after: int, limit: int | None) -> None:
    """Raise a config error for a negative ``after`` or a ``limit`` below 1."""
    if after < 0:
        raise AgentError.config(f"after must be 0 or more, got {after}")
    if limit is not None and limit < 1:
        raise AgentError.config(f"limit must be at least 1, got {limit}")


def check_expected_version(expected_version: int) -> None:
    """Raise a config error for a negative ``expected_version``."""
    if expected_version < 0:
        raise AgentError.config(f"expected_version must be 0 or more, got {expected_version}")


def conflict_error(session_id: str, expected_version: int, version: int) -> AgentError:
    """The error a store raises when a write names a version the session is no longer at."""
    return AgentError(
        ErrorKind.CONFLICT,
        f"session {session_id!r} is at version {version}, not {expected_version}: another "
        "writer changed it; load it again and retry",
    )


def compaction_target_error(session_id: str, first_kept_seq: int) -> AgentError:
    """The error for a compaction whose ``first_kept_seq`` names no message entry."""
    return AgentError.config(
        f"first_kept_seq {first_kept_seq} does not name a message entry of session {session_id!r}"
    )


# --- the in-memory store -------------------------------------------------------------------


class InMemorySessionStore:
    """A :class:`SessionStore` in a dict: per process, lost on restart, not shared between
    replicas. For tests, scripts and single-process demos; use a database store in production.

    It keeps at most ``max_sessions`` sessions (``None``: no bound): past that, the session
    used least recently is forgotten, with a log line, so a long-lived process does not grow
    without bound. Every operation runs under one lock that is never held across an
    ``await``, so each is atomic on any event loop and across threads.
    """

    def __init__(self, *, max_sessions: int | None = 10_000) -> None:
        if max_sessions is not None and max_sessions < 1:
            raise AgentError.config(f"max_sessions must be at least 1, got {max_sessions}")
        self.max_sessions = max_sessions
        self._entries: OrderedDict[str, list[SessionEntry]] = OrderedDict()
        self._latest: dict[str, CompactionEntry] = {}
        self._heads: dict[str, int] = {}  # only for sessions with branches
        self._locks: dict[str, SessionLock] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"InMemorySessionStore(sessions={len(self._entries)})"

    def _used(self, session_id: str) -> list[SessionEntry] | None:
        """The session's entries, marked as used now (call under the lock)."""
        entries = self._entries.get(session_id)
        if entries is not None:
            self._entries.move_to_end(session_id)
        return entries

    def _evict(self) -> None:
        """Forget the sessions used least recently beyond ``max_sessions`` (under the lock)."""
        while self.max_sessions is not None and len(self._entries) > self.max_sessions:
            forgotten, _ = self._entries.popitem(last=False)
            self._forget(forgotten)
            logger.info(
                "in-memory session store: forgot session %r, the least recently used of more "
                "than %d (use a database store to keep every session)",
                forgotten,
                self.max_sessions,
            )

    def _forget(self, session_id: str) -> None:
        self._latest.pop(session_id, None)
        self._heads.pop(session_id, None)
        self._locks.pop(session_id, None)

    def _head(self, session_id: str, entries: list[SessionEntry]) -> int:
        return self._heads.get(session_id, len(entries))

    def _path(self, entries: list[SessionEntry], leaf: int) -> list[SessionEntry]:
        """The entries from the root to ``leaf`` (seq n is ``entries[n - 1]``)."""
        path: list[SessionEntry] = []
        seq: int | None = leaf or None
        while seq is not None:
            entry = entries[seq - 1]
            path.append(entry)
            seq = entry.parent_seq
        path.reverse()
        return path

    def _leaf(self, session_id: str, entries: list[SessionEntry], leaf: int | None) -> int:
        """The leaf a call names (default: the head), checked (under the lock)."""
        if leaf is None:
            return self._head(session_id, entries)
        if not 1 <= leaf <= len(entries):
            raise unknown_entry_error(session_id, leaf)
        return leaf

    def _continues(self, session_id: str, entries: list[SessionEntry], leaf: int) -> None:
        """Refuse to write after ``leaf`` unless it holds a locked session's fixed history."""
        lock = self._locks.get(session_id)
        if (
            lock is not None
            and lock.seq
            and leaf != self._head(session_id, entries)
            and all(e.seq != lock.seq for e in self._path(entries, leaf))
        ):
            raise SessionLocked(session_id, f"continuing entry {leaf}")

    async def load(self, session_id: str, *, leaf: int | None = None) -> SessionView:
        check_session_id(session_id)
        with self._lock:
            entries = self._used(session_id)
            lock = self._locks.get(session_id)
            if not entries:
                if leaf:
                    raise unknown_entry_error(session_id, leaf)
                return SessionView(lock=lock)
            version = len(entries)
            tip = self._leaf(session_id, entries, leaf)
            if tip != version or session_id in self._heads:
                path = self._path(entries, tip)
                return SessionView.from_path(path, version, lock=lock)
            latest = self._latest.get(session_id)
            # seq n is entries[n - 1]: only the kept part of a long session is read
            start = latest.first_kept_seq - 1 if latest is not None else 0
            kept = [e for e in entries[start:] if isinstance(e, MessageEntry)]
        return SessionView.compose(latest, kept, version, lock=lock)

    async def append(
        self,
        session_id: str,
        messages: Sequence[ChatMessage],
        *,
        expected_version: int,
        leaf: int | None = None,
    ) -> int:
        check_session_id(session_id)
        check_expected_version(expected_version)
        batch = list(messages)
        with self._lock:
            entries = self._used(session_id) or []
            if len(entries) != expected_version:
                raise conflict_error(session_id, expected_version, len(entries))
            after = self._leaf(session_id, entries, leaf)
            self._continues(session_id, entries, after)
            added = [
                MessageEntry(
                    seq=expected_version + i,
                    parent_seq=(expected_version + i - 1) if i > 1 else (after or None),
                    message=m,
                )
                for i, m in enumerate(batch, start=1)
            ]
            if added:
                self._moved(session_id, entries, after, added[-1].seq)
                self._entries.setdefault(session_id, []).extend(added)
                self._evict()
            return expected_version + len(added)

    def _moved(self, session_id: str, entries: list[SessionEntry], after: int, tip: int) -> None:
        """Record the head at ``tip``, written after ``after`` (under the lock)."""
        if session_id in self._heads or after != len(entries):
            self._heads[session_id] = tip  # a session with branches: its head is kept

    async def append_compaction(
        self,
        session_id: str,
        summary: str,
        first_kept_seq: int,
        report: CompactionReport,
        *,
        expected_version: int,
        leaf: int | None = None,
    ) -> int:
        check_session_id(session_id)
        check_expected_version(expected_version)
        with self._lock:
            entries = self._used(session_id) or []
            if len(entries) != expected_version:
                raise conflict_error(session_id, expected_version, len(entries))
            if session_id in self._locks:
                raise SessionLocked(session_id, "compacting it")
            after = self._leaf(session_id, entries, leaf)
            on_branch = {e.seq for e in self._path(entries, after) if isinstance(e, MessageEntry)}
            if first_kept_seq not in on_branch:
                raise compaction_target_error(session_id, first_kept_seq)
            entry = CompactionEntry(
                seq=expected_version + 1,
                parent_seq=after,
                summary=summary,
                first_kept_seq=first_kept_seq,
                tokens_before=report.tokens_before,
                tokens_after=report.tokens_after,
                usage=report.usage,
            )
            self._moved(session_id, entries, after, entry.seq)
            entries.append(entry)
            if session_id not in self._heads:
                self._latest[session_id] = entry
            return entry.seq

    async def entries(
        self, session_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[SessionEntry]:
        check_session_id(session_id)
        check_page(after, limit)
        with self._lock:
            entries = self._used(session_id) or []
            end = len(entries) if limit is None else after + limit
            return entries[after:end]

    async def delete(self, session_id: str) -> None:
        check_session_id(session_id)
        with self._lock:
            self._entries.pop(session_id, None)
            self._forget(session_id)

    async def fork(self, session_id: str, at_seq: int) -> Branch:
        check_session_id(session_id)
        with self._lock:
            entries = self._used(session_id) or []
            if not 1 <= at_seq <= len(entries):
                raise unknown_entry_error(session_id, at_seq)
            lock = self._locks.get(session_id)
            path = self._path(entries, at_seq)
            if lock is not None and lock.seq and all(e.seq != lock.seq for e in path):
                raise SessionLocked(session_id, f"forking at entry {at_seq}")
            if at_seq != self._head(session_id, entries):
                self._heads[session_id] = at_seq
            tree = SessionTree(((e.seq, e.parent_seq) for e in entries), at_seq)
        return next(b for b in tree.branches() if b.leaf == at_seq)

    async def branches(self, session_id: str) -> list[Branch]:
        check_session_id(session_id)
        with self._lock:
            entries = self._used(session_id) or []
            tree = SessionTree(
                ((e.seq, e.parent_seq) for e in entries), self._head(session_id, entries)
            )
        return tree.branches()

    async def lock(self, session_id: str, fingerprint: str) -> SessionLock:
        check_session_id(session_id)
        with self._lock:
            entries = self._used(session_id)
            if entries is None:
                entries = self._entries.setdefault(session_id, [])
                self._evict()
            lock = SessionLock(fingerprint=fingerprint, seq=self._head(session_id, entries))
            self._locks[session_id] = lock
        return lock

    async def unlock(self, session_id: str) -> None:
        check_session_id(session_id)
        with self._lock:
            self._locks.pop(session_id, None)


# --- running in a session or not -------------------------------------------------------


class SessionTurn(AgentTurn[OutputT], Generic[OutputT]):
    """An :class:`AgentTurn` run in a session: the session's id and version after the turn
    (unchanged when the run paused: nothing was saved) and the compaction report, if the
    session was compacted before the run."""

    session_id: str
    session_version: int
    compaction: CompactionReport | None = None


async def run(
    agent: Agent[T],
    prompt: str | ChatMessage,
    *,
    session: str | None = None,
    store: SessionStore | None = None,
    options: RunOptions | None = None,
    branch: int | None = None,
) -> AgentTurn[T]:
    """Run ``prompt`` on its own, or as the next turn of ``session`` in ``store``.

    In a session the run continues the branch ending at entry ``branch`` (default: the
    session's head) and sends exactly that branch's history; its messages are chained after
    it and become the head. A locked session needs an agent with the system prompt and tools
    it was locked with and a branch that holds its locked history
    (:class:`~agent_plugin.errors.SessionLocked` otherwise), and is never compacted.

    In a session: load it; compact it first when the agent has ``compaction`` and the session
    is long enough (the summary call's usage is reported, not charged to the run); run the
    turn; append its new messages unless the run paused (a resume saves them once it
    finishes). Raises ``CONFLICT`` if another writer changed the session during the turn
    (nothing of the turn is saved then) and leaves the session unchanged if the summary call
    fails. A typed run's final-result call and its result are saved with the turn, so the
    next turn sees the output.
    """
    if session is None:
        return await agent.run(prompt, options=options)
    check_session_id(session)
    sessions = _store(store, session)
    view = await sessions.load(session, leaf=branch)
    if view.lock is not None:
        check_locked_run(agent, session, view)
        options = replace(options or RunOptions(), compaction=False)  # nor on an overflow
    report: CompactionReport | None = None
    if agent.compaction is not None and not agent.locked and view.lock is None:
        if options is not None and options.on_event is not None and options.run_id is None:
            options = replace(options, run_id=new_run_id())  # named in its compaction event
        view, report = await _compacted(
            agent.model,
            sessions,
            session,
            view,
            agent.compaction,
            force=False,
            options=options,
            reason="threshold",
        )
    turn = await agent.run(
        prompt,
        history=view.messages,
        options=options,
        session_id=session,
        session_version=view.version,
    )
    return await _saved(sessions, session, turn, view, compaction=report)


def check_locked_run(agent: Agent[Any], session: str, view: SessionView) -> None:
    """Raise :class:`~agent_plugin.errors.SessionLocked` unless ``agent`` may run on the
    locked session's branch ``view``: same system prompt and tools, the locked history kept."""
    lock = view.lock
    if lock is None:
        return
    if prefix_fingerprint(agent.system_prompt, agent.definitions()) != lock.fingerprint:
        raise SessionLocked(session, "running it with another system prompt or other tools")
    if lock.seq and lock.seq not in view.seqs and view.leaf != lock.seq:
        raise SessionLocked(session, f"running on entry {view.leaf}, before its locked history")


async def resume(
    agent: Agent[T],
    state: RunState,
    decisions: Iterable[ApprovalDecision] = (),
    *,
    store: SessionStore | None = None,
    options: RunOptions | None = None,
) -> AgentTurn[T]:
    """Continue a paused (or recovered) run, and save its turn to its session once it ends.

    A state from :func:`run` in a session carries the session id and the version the run
    started from. If the session changed since, say a new message was sent meanwhile, this
    raises ``CONFLICT`` before any approved tool runs. If the session already holds exactly the
    turn's new messages (a worker saved the turn and stopped before recording the run's end),
    the run's outcome is answered without saving again. A run that pauses again saves nothing.
    A run paused in a locked session resumes only with the system prompt and tools it was
    locked with (:class:`~agent_plugin.errors.SessionLocked` otherwise, before any tool runs).
    """
    session, expected = state.session_id, state.session_version
    if session is None or expected is None:
        return await agent.resume(state, decisions, options=options)
    sessions = _store(store, session)
    locked = state.session_lock
    if (
        locked is not None
        and prefix_fingerprint(agent.system_prompt, agent.definitions()) != locked
    ):
        raise SessionLocked(session, "resuming it with another system prompt or other tools")
    if locked is not None:
        options = replace(options or RunOptions(), compaction=False)
    mine = state.messages[state.history_length :]
    newer = await sessions.entries(session, after=expected, limit=len(mine) + 1)
    if newer and mine and [e.message for e in newer if isinstance(e, MessageEntry)] == mine:
        return await agent.resume(state, decisions, options=options)  # saved already: unsaved
    if newer:
        raise AgentError(
            ErrorKind.CONFLICT,
            f"session {session!r} changed after run {state.run_id!r} paused at version "
            f"{expected}: the paused turn can no longer be saved",
        )
    turn = await agent.resume(state, decisions, options=options)
    if turn.folded is None or _paused(turn.outcome):
        leaf = expected if state.session_leaf is None else state.session_leaf
        return await _saved(sessions, session, turn, SessionView(version=expected, leaf=leaf))
    began = state.session_leaf if state.session_leaf is not None else expected or None
    view = await sessions.load(session, leaf=began)  # as the run began
    if view.version != expected:
        raise conflict_error(session, expected, view.version)
    return await _saved(sessions, session, turn, view)


def _store(store: SessionStore | None, session: str) -> SessionStore:
    if store is None:
        raise AgentError.config(f"session {session!r} needs a session store to run in")
    return store


def _paused(outcome: AgentOutcome) -> bool:
    return isinstance(outcome, AwaitingApproval | Paused)


async def _compacted(
    model: LlmClient,
    store: SessionStore,
    session_id: str,
    view: SessionView,
    compaction: Compaction,
    *,
    force: bool,
    options: RunOptions | None,
    reason: CompactionReason,
) -> tuple[SessionView, CompactionReport | None]:
    """Compact ``view`` if ``compaction`` says so, store the entry (a ``compaction`` event
    says so), and return the new view."""
    cancel = options.cancel if options is not None else None
    try:
        result = await until_cancelled(
            compaction.compact(model, view.messages, force=force), cancel
        )
    except RunCancelled:
        return view, None  # the run that follows sees the token and ends cancelled
    if result is None:
        return view, None
    version = await store.append_compaction(
        session_id,
        result.summary,
        view.seqs[result.split],
        result.report,
        expected_version=view.version,
        leaf=view.leaf,
    )
    compacted = SessionView(
        messages=result.messages,
        seqs=[version, *view.seqs[result.split :]],
        version=version,
        leaf=version,
    )
    if options is not None and options.on_event is not None:
        options.on_event(
            Compacted(
                run_id=options.run_id,
                session_id=session_id,
                reason=reason,
                summarized_messages=result.split,
                tokens_before=result.report.tokens_before,
                tokens_after=result.report.tokens_after,
            )
        )
    return compacted, result.report


async def _saved(
    store: SessionStore,
    session_id: str,
    turn: AgentTurn[Any],
    view: SessionView,
    *,
    compaction: CompactionReport | None = None,
) -> SessionTurn[Any]:
    """Append the turn's new messages unless the run paused, and report where it ended.

    A run that folded the head of its history (``view``'s messages) saves that as a
    compaction entry after them: the kept messages start at the view's matching seq, or at
    the turn's first message when the whole history was folded."""
    version = view.version
    outcome = turn.outcome
    if isinstance(outcome, AwaitingApproval | Paused):  # its resume continues the same leaf
        leaf = view.leaf if view.leaf != view.version else None
        lock = None if view.lock is None else view.lock.fingerprint
        where = {"session_leaf": leaf, "session_lock": lock}
        outcome = outcome.model_copy(update={"state": outcome.state.model_copy(update=where)})
    else:
        started = version
        version = await store.append(
            session_id, turn.new_messages, expected_version=version, leaf=view.leaf or None
        )
        folded = turn.folded
        if folded is not None:
            kept = folded.report.summarized_messages
            version = await store.append_compaction(
                session_id,
                folded.summary,
                view.seqs[kept] if kept < len(view.seqs) else started + 1,
                folded.report,
                expected_version=version,
                leaf=version if version != started else view.leaf or None,
            )
    return SessionTurn(
        outcome=outcome,
        messages=turn.messages,
        history_length=turn.history_length,
        folded=turn.folded,
        session_id=session_id,
        session_version=version,
        compaction=compaction,
    )


async def compact(
    agent: Agent[Any],
    session: str,
    *,
    store: SessionStore | None,
    force: bool = True,
    on_event: EventSink | None = None,
) -> CompactionReport | None:
    """Compact ``session`` now with ``agent``'s model and ``compaction`` settings (the
    defaults without), and return the report (``None``: nothing to fold).

    Manual compaction ignores ``trigger_tokens`` unless ``force`` is false; ``on_event``
    hears of it (a ``compaction`` event, reason ``manual``). Raises ``CONFLICT`` if the
    session changed during the summary call, :class:`~agent_plugin.errors.PrefixLocked` for a
    locked agent (the session's history is the prefix its requests start with).
    """
    if agent.locked:
        raise PrefixLocked(f"compacting session {session!r}")
    return await compact_session(
        agent.model,
        _store(store, session),
        session,
        agent.compaction,
        force=force,
        on_event=on_event,
    )


async def compact_session(
    model: LlmClient,
    store: SessionStore,
    session_id: str,
    compaction: Compaction | None = None,
    *,
    force: bool = True,
    on_event: EventSink | None = None,
) -> CompactionReport | None:
    """Compact a stored session now, and return the report (``None``: nothing to compact).

    Manual compaction ignores ``trigger_tokens`` unless ``force`` is false; it still needs a
    split point. Raises ``CONFLICT`` if the session changed during the summary call.
    ``on_event`` hears of the compaction (a ``compaction`` event, reason ``manual``).
    """
    check_session_id(session_id)
    view = await store.load(session_id)
    if view.lock is not None:
        raise SessionLocked(session_id, "compacting it")
    _, report = await _compacted(
        model,
        store,
        session_id,
        view,
        compaction or Compaction(),
        force=force,
        options=RunOptions(on_event=on_event),
        reason="manual",
    )
    return report


# --- branches and the lock -----------------------------------------------------------------


async def fork(session: str, at_seq: int, *, store: SessionStore | None) -> Branch:
    """Start a branch of ``session`` after entry ``at_seq``: the next run continues it (the
    entries after it stay, on their own branch). ``NOT_FOUND`` for an unknown entry."""
    return await _store(store, session).fork(session, at_seq)


async def branches(session: str, *, store: SessionStore | None) -> list[Branch]:
    """The branches of ``session``, one per leaf, the head's marked ``active``."""
    return await _store(store, session).branches(session)


async def lock(agent: Agent[Any], session: str, *, store: SessionStore | None) -> SessionLock:
    """Lock ``session`` so every request its runs send starts with the same bytes: from now
    on a run needs ``agent``'s system prompt and tools, the history up to the head stays as
    it is (no compaction, no branch before it), and trying otherwise is a
    :class:`~agent_plugin.errors.SessionLocked` error. Returns the lock."""
    fingerprint = prefix_fingerprint(agent.system_prompt, agent.definitions())
    return await _store(store, session).lock(session, fingerprint)


async def unlock(session: str, *, store: SessionStore | None) -> None:
    """Lift ``session``'s lock; its next request may miss the provider's cache."""
    await _store(store, session).unlock(session)
