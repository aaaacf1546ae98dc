"""Sessions: conversations that outlive a run, kept as append-only entries, and compaction.

A session is an ordered list of entries [AP-34..AP-36]. A :class:`MessageEntry` holds one
message of the transcript (never the system prompt: the agent supplies its own); a
:class:`CompactionEntry` records that the messages before ``first_kept_seq`` were folded into a
summary. Entries are numbered ``seq = 1, 2, 3, ...`` within their session and never rewritten,
so the full history stays readable for audit (:meth:`SessionStore.entries`) while the model
sees the compacted :class:`SessionView`. A session's *version* is the ``seq`` of its last entry;
every write names the version it expects, so a concurrent writer is detected
(``ErrorKind.CONFLICT``) instead of two runs' messages being interleaved.

:func:`run_in_session` and :func:`resume_in_session` follow reference §1.14: load, compact when
configured, run, and save the turn's new messages unless the run paused; a resume saves once
it finishes.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Final, Literal, Protocol, TypeAlias, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from agent_plugin.budget import estimate_message, estimate_messages
from agent_plugin.cancellation import CancelToken, RunCancelled, until_cancelled
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.messages import (
    ChatMessage,
    ContentPart,
    ImagePart,
    RedactedThinkingPart,
    Role,
    TextPart,
    ThinkingPart,
    TokenUsage,
    ToolCallPart,
    ToolResultPart,
)
from agent_plugin.outcomes import (
    AgentOutcome,
    AgentTurn,
    ApprovalDecision,
    AwaitingApproval,
    Paused,
    RunState,
)
from agent_plugin.providers.base import ChatRequest, LlmClient

if TYPE_CHECKING:
    from agent_plugin.agent import Agent, EventSink
    from agent_plugin.journal import RunJournal
    from agent_plugin.steering import Steering

__all__ = [
    "MAX_SESSION_ID_LENGTH",
    "SUMMARY_INSTRUCTIONS",
    "SUMMARY_PREFIX",
    "Compaction",
    "CompactionEntry",
    "CompactionReport",
    "CompactionResult",
    "InMemorySessionStore",
    "MessageEntry",
    "SessionEntry",
    "SessionStore",
    "SessionTurn",
    "SessionView",
    "check_expected_version",
    "check_page",
    "check_session_id",
    "compact_session",
    "compaction_target_error",
    "conflict_error",
    "render_transcript",
    "resume_in_session",
    "run_in_session",
    "session_entry_adapter",
    "summary_message",
]

SUMMARY_PREFIX: Final = "[Summary of the earlier conversation]\n"
"""The start of the one user message that stands for the summarised head of a session."""

MAX_SESSION_ID_LENGTH: Final = 255
"""Session ids are non-empty strings of at most this many characters (a database key)."""

SUMMARY_INSTRUCTIONS: Final = (
    "You compress the earlier part of a conversation between a user and an AI agent, so that "
    "the agent can carry on without it. Write a dense summary for that agent. Keep: the user's "
    "goals and standing instructions; decisions made and why; facts with their exact names, ids, "
    "numbers, paths and values; tool results that are still relevant; open tasks and what was "
    "about to happen next. Leave out small talk and pleasantries. Do not address the user and "
    "do not answer any request in the conversation: write only the summary."
)
"""The system prompt of the summary call."""

RESULT_PREVIEW_CHARS: Final = 600
"""A tool result is rendered for the summary call with at most this many characters."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def summary_message(summary: str) -> ChatMessage:
    """The user message that replaces a summarised head: the prefix, then the summary."""
    return ChatMessage.user(SUMMARY_PREFIX + summary)


# --- entries and views ---------------------------------------------------------------------


class CompactionReport(_Model):
    """What a compaction did: how many messages it folded, the estimated tokens of the
    transcript before and after, and the usage of the summary call (not charged to any run)."""

    summarized_messages: int = Field(ge=1)
    tokens_before: int = Field(ge=0)
    tokens_after: int = Field(ge=0)
    usage: TokenUsage = Field(default_factory=TokenUsage)


class MessageEntry(_Model):
    """One message of a session's transcript."""

    kind: Literal["message"] = "message"
    seq: int = Field(ge=1)
    message: ChatMessage


class CompactionEntry(_Model):
    """The messages before ``first_kept_seq`` are summarised by ``summary`` from here on.

    The messages themselves stay stored; only the view the model gets changes.
    """

    kind: Literal["compaction"] = "compaction"
    seq: int = Field(ge=1)
    summary: str
    first_kept_seq: int = Field(ge=1)
    tokens_before: int = Field(ge=0)
    tokens_after: int = Field(ge=0)
    usage: TokenUsage = Field(default_factory=TokenUsage)

    @model_validator(mode="after")
    def _keeps_an_earlier_message(self) -> CompactionEntry:
        if self.first_kept_seq >= self.seq:
            raise ValueError(
                f"first_kept_seq ({self.first_kept_seq}) must come before the compaction "
                f"entry itself (seq {self.seq})"
            )
        return self

    def summary_message(self) -> ChatMessage:
        return summary_message(self.summary)

    def report(self, summarized_messages: int) -> CompactionReport:
        return CompactionReport(
            summarized_messages=summarized_messages,
            tokens_before=self.tokens_before,
            tokens_after=self.tokens_after,
            usage=self.usage,
        )


SessionEntry: TypeAlias = Annotated[MessageEntry | CompactionEntry, Field(discriminator="kind")]
"""An entry of a session, tagged by ``kind`` (``"message"`` or ``"compaction"``)."""

session_entry_adapter: TypeAdapter[SessionEntry] = TypeAdapter(SessionEntry)
"""``session_entry_adapter.validate_json(...)`` / ``.dump_json(...)`` for one entry."""


class SessionView(_Model):
    """What the model sees of a session, and the version it was read at.

    Without a compaction entry, ``messages`` is the whole transcript. Otherwise it is the
    summary message of the *latest* compaction followed by the message entries with
    ``seq >= first_kept_seq``. ``seqs[i]`` is the seq of the entry ``messages[i]`` comes from
    (for the summary message, the compaction entry's). An unknown session is empty, version 0.
    """

    messages: list[ChatMessage] = Field(default_factory=list)
    seqs: list[int] = Field(default_factory=list)
    version: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _one_seq_per_message(self) -> SessionView:
        if len(self.seqs) != len(self.messages):
            raise ValueError(
                f"a session view needs one seq per message: {len(self.messages)} messages, "
                f"{len(self.seqs)} seqs"
            )
        return self

    @classmethod
    def compose(
        cls,
        compaction: CompactionEntry | None,
        messages: Iterable[MessageEntry],
        version: int,
    ) -> SessionView:
        """The view from the latest compaction entry (if any) and the message entries from its
        ``first_kept_seq`` on, in seq order (earlier message entries are skipped).

        This is how a database store loads a session in two indexed reads, whatever its length:
        the latest compaction entry, then the messages with ``seq >= first_kept_seq``.
        """
        first = compaction.first_kept_seq if compaction is not None else 1
        kept = [e for e in messages if e.seq >= first]
        head_messages = [compaction.summary_message()] if compaction is not None else []
        head_seqs = [compaction.seq] if compaction is not None else []
        return cls(
            messages=[*head_messages, *(e.message for e in kept)],
            seqs=[*head_seqs, *(e.seq for e in kept)],
            version=version,
        )

    @classmethod
    def from_entries(cls, entries: Sequence[SessionEntry]) -> SessionView:
        """The view of a session given all its entries in seq order."""
        latest: CompactionEntry | None = None
        for entry in entries:
            if isinstance(entry, CompactionEntry):
                latest = entry
        messages = [e for e in entries if isinstance(e, MessageEntry)]
        return cls.compose(latest, messages, entries[-1].seq if entries else 0)


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

    async def load(self, session_id: str) -> SessionView:
        """The compacted view of the session (unknown session: empty, version 0)."""
        ...

    async def append(
        self, session_id: str, messages: Sequence[ChatMessage], *, expected_version: int
    ) -> int:
        """Append one message entry per message after ``expected_version``."""
        ...

    async def append_compaction(
        self,
        session_id: str,
        summary: str,
        first_kept_seq: int,
        report: CompactionReport,
        *,
        expected_version: int,
    ) -> int:
        """Append a compaction entry after ``expected_version``.

        ``first_kept_seq`` must name a message entry of the session (``ErrorKind.CONFIG``
        otherwise, nothing written); ``report`` supplies the token counts and usage.
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

    Every operation runs under one lock that is never held across an ``await``, so each is
    atomic on any event loop and across threads.
    """

    def __init__(self) -> None:
        self._entries: dict[str, list[SessionEntry]] = {}
        self._latest: dict[str, CompactionEntry] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"InMemorySessionStore(sessions={len(self._entries)})"

    async def load(self, session_id: str) -> SessionView:
        check_session_id(session_id)
        with self._lock:
            entries = self._entries.get(session_id)
            if not entries:
                return SessionView()
            latest = self._latest.get(session_id)
            # seq n is entries[n - 1]: only the kept part of a long session is read
            start = latest.first_kept_seq - 1 if latest is not None else 0
            kept = [e for e in entries[start:] if isinstance(e, MessageEntry)]
            version = len(entries)
        return SessionView.compose(latest, kept, version)

    async def append(
        self, session_id: str, messages: Sequence[ChatMessage], *, expected_version: int
    ) -> int:
        check_session_id(session_id)
        check_expected_version(expected_version)
        batch = list(messages)
        with self._lock:
            entries = self._entries.get(session_id, [])
            if len(entries) != expected_version:
                raise conflict_error(session_id, expected_version, len(entries))
            added = [
                MessageEntry(seq=expected_version + i, message=m)
                for i, m in enumerate(batch, start=1)
            ]
            if added:
                self._entries.setdefault(session_id, []).extend(added)
            return expected_version + len(added)

    async def append_compaction(
        self,
        session_id: str,
        summary: str,
        first_kept_seq: int,
        report: CompactionReport,
        *,
        expected_version: int,
    ) -> int:
        check_session_id(session_id)
        check_expected_version(expected_version)
        with self._lock:
            entries = self._entries.get(session_id, [])
            if len(entries) != expected_version:
                raise conflict_error(session_id, expected_version, len(entries))
            if not (
                1 <= first_kept_seq <= len(entries)
                and isinstance(entries[first_kept_seq - 1], MessageEntry)
            ):
                raise compaction_target_error(session_id, first_kept_seq)
            entry = CompactionEntry(
                seq=expected_version + 1,
                summary=summary,
                first_kept_seq=first_kept_seq,
                tokens_before=report.tokens_before,
                tokens_after=report.tokens_after,
                usage=report.usage,
            )
            entries.append(entry)
            self._latest[session_id] = entry
            return entry.seq

    async def entries(
        self, session_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[SessionEntry]:
        check_session_id(session_id)
        check_page(after, limit)
        with self._lock:
            entries = self._entries.get(session_id, [])
            end = len(entries) if limit is None else after + limit
            return entries[after:end]

    async def delete(self, session_id: str) -> None:
        check_session_id(session_id)
        with self._lock:
            self._entries.pop(session_id, None)
            self._latest.pop(session_id, None)


# --- compaction ----------------------------------------------------------------------------


def render_transcript(messages: Sequence[ChatMessage]) -> str:
    """The transcript as plain text for the summary call, one line per part [reference §1.14].

    ``<role>: <text>``; ``<role> called <name> with <args json>``; ``<role> result: <the
    first 600 characters>`` (``result (error)`` for a failed call); ``<role> thought: <text>``
    for reasoning; ``<role>: [image <url>]`` or ``<role>: [image: <media type>]`` (inline
    image data is never copied). Empty texts and redacted (encrypted) reasoning are left out.
    """
    lines: list[str] = []
    for message in messages:
        role = message.role.value
        for part in message.content:
            line = _render_part(role, part)
            if line is not None:
                lines.append(line)
    return "\n".join(lines)


def _render_part(role: str, part: ContentPart) -> str | None:
    if isinstance(part, TextPart):
        return f"{role}: {part.text}" if part.text else None
    if isinstance(part, ToolCallPart):
        call = part.tool_call
        arguments = call.raw_arguments
        if arguments is None:
            arguments = json.dumps(call.arguments, ensure_ascii=False, separators=(",", ":"))
        return f"{role} called {call.name} with {arguments}"
    if isinstance(part, ToolResultPart):
        result = part.tool_result
        label = "result (error)" if result.is_error else "result"
        return f"{role} {label}: {result.content[:RESULT_PREVIEW_CHARS]}"
    if isinstance(part, ImagePart):
        image = part.image
        if image.url is not None and not image.url.startswith("data:"):
            return f"{role}: [image {image.url}]"
        media_type = image.media_type
        if media_type is None and image.url is not None:
            media_type = image.url[len("data:") :].split(";", 1)[0].split(",", 1)[0] or None
        return f"{role}: [image: {media_type or 'unknown type'}]"
    if isinstance(part, ThinkingPart):
        return f"{role} thought: {part.thinking.text}" if part.thinking.text else None
    if isinstance(part, RedactedThinkingPart):
        return None
    return None


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """A compacted transcript: the summary message, then the kept tail."""

    summary: str
    """The model's summary, trimmed."""
    messages: list[ChatMessage]
    report: CompactionReport

    @property
    def split(self) -> int:
        """How many messages of the original transcript the summary replaced."""
        return self.report.summarized_messages


@dataclass(frozen=True, slots=True)
class Compaction:
    """When and how to fold the head of a long session into one summary [AP-36].

    A transcript estimated above ``trigger_tokens`` keeps its newest messages, at most
    ``keep_recent_tokens`` of them starting on a user message, and the rest is summarised by
    one tool-less model call capped at ``summary_max_tokens``.
    """

    trigger_tokens: int = 24_000
    keep_recent_tokens: int = 8_000
    summary_max_tokens: int = 1_024

    def __post_init__(self) -> None:
        for name in ("trigger_tokens", "keep_recent_tokens", "summary_max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise AgentError.config(
                    f"compaction {name} must be a positive integer, got {value!r}"
                )

    def split_point(self, messages: Sequence[ChatMessage]) -> int | None:
        """The index of the first kept message, or ``None`` when there is no split point.

        Walking from the newest message down to index 1 while the tail stays within
        ``keep_recent_tokens``, the oldest user message seen: the kept tail starts on a user
        message, so no tool result loses its call, and index 0 is never a split point.
        """
        tail = 0
        split: int | None = None
        for index in range(len(messages) - 1, 0, -1):
            tail += estimate_message(messages[index])
            if tail > self.keep_recent_tokens:
                break
            if messages[index].role is Role.USER:
                split = index
        return split

    async def compact(
        self, model: LlmClient, messages: Sequence[ChatMessage], *, force: bool = False
    ) -> CompactionResult | None:
        """Summarise the head of ``messages``, or return ``None`` and call no model.

        ``None`` when the transcript is estimated at ``trigger_tokens`` or less (unless
        ``force``: manual compaction ignores the trigger) or has no split point. A failed or
        empty summary call raises :class:`AgentError`; nothing is changed then.
        """
        before = estimate_messages(messages)
        if not force and before <= self.trigger_tokens:
            return None
        split = self.split_point(messages)
        if split is None:
            return None
        request = ChatRequest(
            messages=[
                ChatMessage.system(SUMMARY_INSTRUCTIONS),
                ChatMessage.user(render_transcript(messages[:split])),
            ],
            max_tokens=self.summary_max_tokens,
        )
        response = await model.chat(request)
        summary = response.text.strip()
        if not summary:
            raise AgentError(
                ErrorKind.PROVIDER,
                "the summary call returned no text; the session was not compacted",
                provider=model.provider_name,
            )
        compacted = [summary_message(summary), *messages[split:]]
        report = CompactionReport(
            summarized_messages=split,
            tokens_before=before,
            tokens_after=estimate_messages(compacted),
            usage=response.usage,
        )
        return CompactionResult(summary=summary, messages=compacted, report=report)


# --- running in a session ------------------------------------------------------------------


class SessionTurn(AgentTurn):
    """An :class:`AgentTurn` run in a session: the session's id and version after the turn
    (unchanged when the run paused: nothing was saved) and the compaction report, if the
    session was compacted before the run."""

    session_id: str
    session_version: int
    compaction: CompactionReport | None = None


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
    cancel: CancelToken | None = None,
) -> tuple[SessionView, CompactionReport | None]:
    """Compact ``view`` if ``compaction`` says so, store the entry, return the new view."""
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
    )
    compacted = SessionView(
        messages=result.messages, seqs=[version, *view.seqs[result.split :]], version=version
    )
    return compacted, result.report


async def run_in_session(
    agent: Agent,
    store: SessionStore,
    session_id: str,
    prompt: str | ChatMessage,
    *,
    compaction: Compaction | None = None,
    run_id: str | None = None,
    cancel: CancelToken | None = None,
    steering: Steering | None = None,
    on_event: EventSink | None = None,
    stream: bool = False,
    journal: RunJournal | None = None,
) -> SessionTurn:
    """Continue the session with ``prompt`` [AP-35].

    Loads the session; with ``compaction``, compacts it first when it is long enough (the
    summary call goes to the agent's model, its usage is reported, not charged to the run);
    runs the turn; and appends the turn's new messages unless the run paused for approval or
    a hook paused it (then nothing is saved: :func:`resume_in_session` saves once the run
    finishes, and a new message meanwhile continues from the last saved transcript).

    Raises ``ErrorKind.CONFLICT`` if another writer changed the session during the turn; the
    turn's messages are then not saved and the caller decides (retry on a fresh load, or
    report). A failed summary call raises and leaves the session unchanged. ``journal``
    checkpoints the run (see :mod:`agent_plugin.journal`).
    """
    check_session_id(session_id)
    view = await store.load(session_id)
    report: CompactionReport | None = None
    if compaction is not None:
        view, report = await _compacted(
            agent.model, store, session_id, view, compaction, force=False, cancel=cancel
        )
    turn = await agent.run_turn(
        view.messages,
        prompt,
        run_id=run_id,
        session_id=session_id,
        cancel=cancel,
        steering=steering,
        on_event=on_event,
        stream=stream,
        session_version=view.version,
        journal=journal,
    )
    return await _saved(store, session_id, turn, view.version, compaction=report)


async def resume_in_session(
    agent: Agent,
    store: SessionStore,
    state: RunState,
    decisions: Iterable[ApprovalDecision] = (),
    *,
    cancel: CancelToken | None = None,
    steering: Steering | None = None,
    on_event: EventSink | None = None,
    stream: bool = False,
    journal: RunJournal | None = None,
) -> SessionTurn:
    """Resume a run paused in a session, and save the whole turn once it finishes [AP-35].

    The state must come from :func:`run_in_session` (it carries the session id and the
    version the run started from). If the session changed since the pause, for example a new
    message was sent meanwhile, this raises ``ErrorKind.CONFLICT`` before any approved tool
    runs. A run that pauses again saves nothing.
    """
    session_id = state.session_id
    expected = state.session_version
    if session_id is None or expected is None:
        raise AgentError.config(
            f"run {state.run_id!r} was not run in a session: resume it with Agent.resume"
        )
    newer = await store.entries(session_id, after=expected, limit=1)
    if newer:
        raise AgentError(
            ErrorKind.CONFLICT,
            f"session {session_id!r} changed after run {state.run_id!r} paused at version "
            f"{expected}: the paused turn can no longer be saved",
        )
    turn = await agent.resume(
        state,
        decisions,
        cancel=cancel,
        steering=steering,
        on_event=on_event,
        stream=stream,
        journal=journal,
    )
    return await _saved(store, session_id, turn, expected)


async def _saved(
    store: SessionStore,
    session_id: str,
    turn: AgentTurn,
    version: int,
    *,
    compaction: CompactionReport | None = None,
) -> SessionTurn:
    """Append the turn's new messages unless the run paused, and report where it ended."""
    if not _paused(turn.outcome):
        version = await store.append(session_id, turn.new_messages, expected_version=version)
    return SessionTurn(
        outcome=turn.outcome,
        messages=turn.messages,
        history_length=turn.history_length,
        session_id=session_id,
        session_version=version,
        compaction=compaction,
    )


async def compact_session(
    model: LlmClient,
    store: SessionStore,
    session_id: str,
    compaction: Compaction | None = None,
    *,
    force: bool = True,
) -> CompactionReport | None:
    """Compact a stored session now, and return the report (``None``: nothing to compact).

    Manual compaction ignores ``trigger_tokens`` unless ``force`` is false; it still needs a
    split point. Raises ``ErrorKind.CONFLICT`` if the session changed during the summary call.
    """
    check_session_id(session_id)
    view = await store.load(session_id)
    _, report = await _compacted(
        model, store, session_id, view, compaction or Compaction(), force=force
    )
    return report
