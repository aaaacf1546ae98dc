"""Session entries and views: what a :class:`~agent_plugin.sessions.SessionStore` keeps.

A :class:`MessageEntry` per message (never the system prompt) and a :class:`CompactionEntry`
where a branch's head was folded into a summary, numbered ``seq = 1, 2, ...`` and never
rewritten; each names the entry it follows (``parent_seq``), so a session's entries form a tree
(:mod:`agent_plugin.branching`). :class:`SessionView` is what the model sees of one branch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from agent_plugin.branching import SessionLock, SessionTree
from agent_plugin.compaction import CompactionReport, summary_message
from agent_plugin.messages import ChatMessage, TokenUsage

__all__ = [
    "CompactionEntry",
    "MessageEntry",
    "SessionEntry",
    "SessionView",
    "session_entry_adapter",
]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _Entry(_Model):
    seq: int = Field(ge=1)
    parent_seq: int | None = None
    """The entry this one follows (``None``: a root); without it, the entry before (seq - 1)."""

    @model_validator(mode="before")
    @classmethod
    def _follows_the_previous_entry(cls, data: Any) -> Any:
        if isinstance(data, dict) and "parent_seq" not in data and isinstance(data.get("seq"), int):
            return {**data, "parent_seq": data["seq"] - 1 or None}
        return data

    @model_validator(mode="after")
    def _parent_comes_first(self) -> _Entry:
        if self.parent_seq is not None and not 1 <= self.parent_seq < self.seq:
            raise ValueError(f"parent_seq ({self.parent_seq}) must be an earlier entry's seq")
        return self


class MessageEntry(_Entry):
    """One message of a session's transcript."""

    kind: Literal["message"] = "message"
    message: ChatMessage


class CompactionEntry(_Entry):
    """The messages before ``first_kept_seq`` are summarised by ``summary`` from here on.

    The messages themselves stay stored; only the view the model gets changes.
    """

    kind: Literal["compaction"] = "compaction"
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
    """What the model sees of a session's branch, and the version it was read at.

    The branch is the path from the root to ``leaf`` (the head unless a leaf was asked for).
    Without a compaction entry on it, ``messages`` is the branch's whole transcript. Otherwise
    it is the summary message of the branch's *latest* compaction followed by its message
    entries with ``seq >= first_kept_seq``. ``seqs[i]`` is the seq of the entry ``messages[i]``
    comes from (for the summary message, the compaction entry's). ``lock`` is set while the
    session is locked. An unknown session is empty, version 0.
    """

    messages: list[ChatMessage] = Field(default_factory=list)
    seqs: list[int] = Field(default_factory=list)
    version: int = Field(default=0, ge=0)
    leaf: int = Field(default=0, ge=0)
    lock: SessionLock | None = None

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
        *,
        leaf: int | None = None,
        lock: SessionLock | None = None,
    ) -> SessionView:
        """The view from the latest compaction entry (if any) and the message entries from its
        ``first_kept_seq`` on, in seq order (earlier message entries are skipped); ``leaf``
        defaults to ``version`` (a session without branches).

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
            leaf=version if leaf is None else leaf,
            lock=lock,
        )

    @classmethod
    def from_path(
        cls,
        path: Sequence[SessionEntry],
        version: int,
        *,
        lock: SessionLock | None = None,
    ) -> SessionView:
        """The view of the branch whose entries, root first, are ``path``."""
        latest: CompactionEntry | None = None
        for entry in path:
            if isinstance(entry, CompactionEntry):
                latest = entry
        messages = [e for e in path if isinstance(e, MessageEntry)]
        leaf = path[-1].seq if path else 0
        return cls.compose(latest, messages, version, leaf=leaf, lock=lock)

    @classmethod
    def from_entries(
        cls, entries: Sequence[SessionEntry], *, leaf: int | None = None
    ) -> SessionView:
        """The view of the branch ending at ``leaf`` (default: the last entry) of a session,
        given all its entries in seq order."""
        if not entries:
            return cls()
        by_seq = {e.seq: e for e in entries}
        tree = SessionTree(((e.seq, e.parent_seq) for e in entries), entries[-1].seq)
        path = [by_seq[seq] for seq in tree.path(entries[-1].seq if leaf is None else leaf)]
        return cls.from_path(path, entries[-1].seq)
