"""Step checkpoints: a run writes down its progress as it goes, so a crash costs one call.

A run given a :class:`RunJournal` records, in order:

* ``started``: the state it starts from (the history and prompt, or a resumed state with the
  reviewers' decisions applied);
* ``replied``: each model reply, with the policy's verdict for each of its calls;
* ``tool_done``: each executed call's result, as soon as it is known;
* ``round_done``: the tool message that closed a round;
* ``appended``: messages that joined between steps (steering).

:func:`recover` turns those entries back into a :class:`~agent_plugin.outcomes.RunState`, and
``Agent.resume(state)`` continues from it: recorded replies are not asked for again and
finished calls never run again. Only a call that was running when the process died runs a
second time, with the same ``run_id`` and ``call_id`` so the tool can deduplicate it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal, Protocol, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from agent_plugin.messages import ChatMessage, TokenUsage
from agent_plugin.outcomes import Finished, PendingCall, RunState, TurnSettings

__all__ = [
    "Appended",
    "InMemoryJournal",
    "JournalEntry",
    "Replied",
    "RoundDone",
    "RunJournal",
    "Started",
    "ToolDone",
    "journal_entry_adapter",
    "recover",
]


class _Entry(BaseModel):
    model_config = ConfigDict(frozen=True)


class Started(_Entry):
    kind: Literal["started"] = "started"
    state: RunState


class Replied(_Entry):
    """A model reply was recorded as step ``step`` (its tool calls, if any, gated)."""

    kind: Literal["replied"] = "replied"
    step: int
    message: ChatMessage
    usage: TokenUsage
    """The run's usage after this reply."""
    steps_used: int
    recent_calls: list[int] = Field(default_factory=list)
    pending: list[PendingCall] = Field(default_factory=list)
    output_retries: int = Field(default=0, exclude_if=lambda v: v == 0)
    """The run's output retries after this reply (a typed run)."""


class ToolDone(_Entry):
    kind: Literal["tool_done"] = "tool_done"
    step: int
    position: int
    call_id: str
    content: str
    is_error: bool = False


class Appended(_Entry):
    """Messages that joined the transcript between steps (steering, follow-ups, a turn-level
    hook's), and what such a hook set for the next requests (``None``: unchanged)."""

    kind: Literal["appended"] = "appended"
    messages: list[ChatMessage]
    turn_settings: TurnSettings | None = Field(default=None, exclude_if=lambda v: v is None)


class RoundDone(_Entry):
    kind: Literal["round_done"] = "round_done"
    step: int
    message: ChatMessage


JournalEntry: TypeAlias = Annotated[
    Started | Replied | ToolDone | RoundDone | Appended, Field(discriminator="kind")
]
journal_entry_adapter: TypeAdapter[JournalEntry] = TypeAdapter(JournalEntry)


class RunJournal(Protocol):
    """Durable storage of one run's progress; each ``record`` must be persisted when it returns."""

    async def record(self, entry: JournalEntry) -> None: ...


class InMemoryJournal:
    """A journal in a list: for tests, and for runs that need no durability."""

    def __init__(self) -> None:
        self.entries: list[JournalEntry] = []

    async def record(self, entry: JournalEntry) -> None:
        self.entries.append(entry)


def recover(entries: Iterable[JournalEntry]) -> RunState | None:
    """The state to resume a run from, given its journal in order (``None`` if it is empty).

    The latest ``started`` entry is the base; every later reply and round is replayed onto
    it, and calls with a recorded result become ``finished`` so they never run again.
    """
    state: RunState | None = None
    for entry in entries:
        if isinstance(entry, Started):
            state = entry.state
        elif state is None:
            continue
        elif isinstance(entry, Replied):
            state = state.model_copy(
                update={
                    "messages": [*state.messages, entry.message],
                    "usage": entry.usage,
                    "steps_used": entry.steps_used,
                    "recent_calls": entry.recent_calls,
                    "pending": entry.pending,
                    "output_retries": entry.output_retries,
                }
            )
        elif isinstance(entry, ToolDone):
            pending = list(state.pending)
            if 0 <= entry.position < len(pending) and pending[entry.position].call.id == (
                entry.call_id
            ):
                pending[entry.position] = pending[entry.position].model_copy(
                    update={"status": Finished(content=entry.content, is_error=entry.is_error)}
                )
                state = state.model_copy(update={"pending": pending})
        elif isinstance(entry, Appended):
            update: dict[str, object] = {"messages": [*state.messages, *entry.messages]}
            if entry.turn_settings is not None:
                update["turn_settings"] = entry.turn_settings
            state = state.model_copy(update=update)
        else:
            state = state.model_copy(
                update={"messages": [*state.messages, entry.message], "pending": []}
            )
    return state
