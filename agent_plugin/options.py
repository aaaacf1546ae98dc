"""The two values every run is given: how it is driven (:class:`RunOptions`) and what it may
do differently from the app's defaults (:class:`AgentOverrides`).

``RunOptions`` is per run and in-process (a cancel token, an event sink); every entry point
(``Agent.run``, ``Agent.resume``, ``Agent.stream``, ``sessions.run``, ``sessions.resume``)
takes one. ``AgentOverrides`` is plain data: a background run stores it whole in its record,
and ``AgentRuntime.agent_for(overrides)`` turns it into an agent in the app and the worker
alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agent_plugin.cancellation import CancelToken
from agent_plugin.events import AgentEvent
from agent_plugin.steering import MessageMode, Steering
from agent_plugin.text import unstorable

if TYPE_CHECKING:
    from agent_plugin.compaction import Compaction
    from agent_plugin.journal import RunJournal

__all__ = ["DEFAULT_OVERRIDES", "OUTPUT_NAME_PATTERN", "AgentOverrides", "EventSink", "RunOptions"]

OUTPUT_NAME_PATTERN: Final = r"^[A-Za-z][A-Za-z0-9_.\-]{0,63}$"
"""The name of a registered output type: a letter, then up to 63 letters, digits, ``_``,
``.`` or ``-``."""

EventSink: TypeAlias = Callable[[AgentEvent], None]
"""Receives every event of a run, synchronously, in order. Must not block."""


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How one run (or resume) is driven; every field is optional.

    * ``run_id``: the run's id (default: a new one; a resume keeps its state's);
    * ``cancel``: a :class:`~agent_plugin.cancellation.CancelToken` that ends the run
      ``cancelled`` from outside;
    * ``steering``: a :class:`~agent_plugin.steering.Steering` queue of user messages that
      join before the next model call;
    * ``on_event``: an :data:`EventSink` that receives every event as it happens;
    * ``stream``: call the model through ``LlmClient.stream`` (text arrives as deltas);
    * ``journal``: a :class:`~agent_plugin.journal.RunJournal` that checkpoints each step;
    * ``compaction``: how to fold the history when the model says the context is too long
      (default: the agent's ``compaction``; with neither, or ``False``, the error is raised:
      a locked session's runs never fold its history).
    """

    run_id: str | None = None
    cancel: CancelToken | None = None
    steering: Steering | None = None
    on_event: EventSink | None = None
    stream: bool = False
    journal: RunJournal | None = None
    compaction: Compaction | Literal[False] | None = None


class AgentOverrides(BaseModel):
    """What one run changes about the app's agent; ``None`` keeps the setting.

    * ``system_prompt``, ``max_steps``: replace the ``[agent]`` settings for this run;
    * ``memory_scope``: whose memory the run reads and edits (``None``: the default scope);
    * ``read_only``: the run may only call read-only and internal tools (a heartbeat tick's
      check-in), on top of the app's policy;
    * ``session``: the conversation the run belongs to (``None``: a run on its own);
    * ``branch``: the session entry the run continues (``None``: the session's head);
    * ``followup_depth``: how many follow-up links deep the run is (a chain stops at ten);
    * ``output``: the name of an output type registered on the plugin
      (``AgentPlugin(outputs={"ticket": Ticket})``) the run must produce (``None``: text);
    * ``message_mode``: the mode of a message sent to the run without one (``None``:
      ``steer``; see :mod:`agent_plugin.steering`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    system_prompt: str | None = None
    max_steps: int | None = Field(default=None, ge=1, le=1000)
    memory_scope: str | None = Field(default=None, min_length=1, max_length=255)
    read_only: bool = False
    session: str | None = Field(default=None, min_length=1, max_length=255)
    branch: int | None = Field(default=None, ge=1, exclude_if=lambda v: v is None)
    followup_depth: int = Field(default=0, ge=0)
    output: str | None = Field(default=None, pattern=OUTPUT_NAME_PATTERN)
    message_mode: MessageMode | None = None

    @model_validator(mode="after")
    def _branch_of_a_session(self) -> AgentOverrides:
        if self.branch is not None and self.session is None:
            raise ValueError("a branch needs a session")
        return self

    @field_validator("system_prompt", "memory_scope", "session")
    @classmethod
    def _storable(cls, value: str | None) -> str | None:
        problem = None if value is None else unstorable(value)
        if problem is not None:
            raise ValueError(f"must not contain {problem}")
        return value


DEFAULT_OVERRIDES: Final = AgentOverrides()
"""No overrides: the app's agent as configured."""
