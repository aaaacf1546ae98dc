"""Follow-ups: the ``schedule_followup`` tool (:class:`FollowupTool`) lets the agent book its
own next run; the jobs layer enqueues the :class:`FollowupPlan` as a delayed run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from typing import ClassVar, Final, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from agent_plugin.errors import AgentError, describe
from agent_plugin.tools import ToolContext, ToolEffect

# --- follow-ups ------------------------------------------------------------------------------

MAX_CHAIN: Final = 10
"""The longest chain of follow-ups (a follow-up that books a follow-up that ...)."""

MAX_FOLLOWUP_PROMPT_CHARS: Final = 2000
"""The longest prompt a follow-up may carry, in characters."""

_FOLLOWUP_DESCRIPTION: Final = (
    "Wake yourself up later: after delay_minutes, a new run starts with `prompt` in this "
    "conversation, and its answer is sent to the user. Use it to check back on something that "
    "is not ready yet."
)


class FollowupPlan(BaseModel):
    """A follow-up the agent booked: what the jobs layer enqueues as a delayed ``agent_run``
    with ``deliver=True``, ``origin="followup"`` and ``followup_depth=depth``.

    ``parent_run_id``, ``step`` and ``call_id`` name the tool call that booked it;
    :meth:`derived_run_id` turns them into a run id that is the same when a retried job makes
    the same call again, so enqueueing under it books the follow-up only once.
    """

    model_config = ConfigDict(frozen=True)

    delay_seconds: int = Field(ge=60)
    prompt: str = Field(min_length=1, max_length=MAX_FOLLOWUP_PROMPT_CHARS)
    depth: int = Field(ge=1, le=MAX_CHAIN)
    session: str | None = None
    memory_scope: str | None = None
    parent_run_id: str = "detached"
    step: int = 0
    call_id: str = ""

    @property
    def delay(self) -> timedelta:
        """How long from now the follow-up runs."""
        return timedelta(seconds=self.delay_seconds)

    def derived_run_id(self) -> str:
        """``run_<32 hex digits>`` derived from the booking call; stable across retries."""
        seed = f"followup:{self.parent_run_id}:{self.step}:{self.call_id}"
        return f"run_{hashlib.sha256(seed.encode('utf-8')).hexdigest()[:32]}"


Enqueue: TypeAlias = Callable[[FollowupPlan], Awaitable[str]]
"""Enqueues a follow-up's delayed run and returns its run id."""


def _whole_number(value: object) -> int | None:
    """``value`` as an int when JSON Schema would call it an integer (``5`` or ``5.0``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


class FollowupTool:
    """The ``schedule_followup`` tool: the agent books its own next wake-up.

    Input ``{delay_minutes: integer 1..max, prompt: string}``, both required, where max is
    ``max_delay`` in whole minutes (the schema's ``maximum``). Checked in this order, each
    failure reaching the model as the tool's error:

    1. the chain: a run already ``depth`` follow-ups deep may book one only while
       ``depth + 1 <= MAX_CHAIN``;
    2. ``delay_minutes`` is a whole number in range (a string such as ``"5"`` is refused);
    3. ``prompt``, trimmed, is not empty and has at most 2000 characters.

    Then ``enqueue(plan)`` books the run (same session: the calling run's, else ``session``;
    same ``memory_scope``; depth + 1) and the tool answers ``{"scheduled": true,
    "in_minutes": n, "run_id": <what enqueue returned>}``. An enqueue that fails (no job
    runtime, Redis down) is reported as ``"cannot schedule the follow-up: ..."``.
    Its effect is ``internal``, so read-only heartbeats may book follow-ups too.
    """

    __slots__ = ("_enqueue", "depth", "description", "effect", "input_schema", "max_delay",
                 "max_minutes", "memory_scope", "name", "sequential", "session")  # fmt: skip

    MAX_CHAIN: ClassVar[int] = MAX_CHAIN
    MAX_PROMPT_CHARS: ClassVar[int] = MAX_FOLLOWUP_PROMPT_CHARS

    name: str
    description: str
    input_schema: dict[str, JsonValue]
    effect: ToolEffect
    sequential: bool

    def __init__(
        self,
        enqueue: Enqueue,
        *,
        max_delay: timedelta,
        depth: int = 0,
        session: str | None = None,
        memory_scope: str | None = None,
    ) -> None:
        if not callable(enqueue):
            raise AgentError.config(f"FollowupTool: enqueue must be callable, got {enqueue!r}")
        if not isinstance(max_delay, timedelta) or max_delay < timedelta(minutes=1):
            raise AgentError.config(
                f"FollowupTool: max_delay must be a timedelta of at least one minute, got "
                f"{max_delay!r}"
            )
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise AgentError.config(f"FollowupTool: depth must be an int >= 0, got {depth!r}")
        self._enqueue = enqueue
        self.max_delay = max_delay
        self.max_minutes = int(max_delay.total_seconds()) // 60
        self.depth = depth
        self.session = session
        self.memory_scope = memory_scope
        self.name = "schedule_followup"
        self.description = _FOLLOWUP_DESCRIPTION
        self.effect = ToolEffect.INTERNAL
        self.sequential = False
        self.input_schema = {
            "type": "object",
            "properties": {
                "delay_minutes": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": self.max_minutes,
                    "description": "Minutes from now until the follow-up run starts.",
                },
                "prompt": {
                    "type": "string",
                    "maxLength": MAX_FOLLOWUP_PROMPT_CHARS,
                    "description": "What your future self should do, with every detail it needs.",
                },
            },
            "required": ["delay_minutes", "prompt"],
        }

    def validate(self, arguments: JsonValue) -> str | None:
        """Always None: :meth:`execute` checks the arguments, so the model gets the exact
        texts of the reference, in its order."""
        return None

    def plan(self, arguments: JsonValue, ctx: ToolContext) -> FollowupPlan:
        """Check ``arguments`` and build the follow-up; raise an :class:`AgentError` of kind
        ``tool`` with the text for the model when they are not acceptable."""
        if self.depth + 1 > MAX_CHAIN:
            raise AgentError.tool(
                f"this run is already {self.depth} follow-ups deep; finish now and report "
                "instead of scheduling another"
            )
        given: Mapping[str, JsonValue] = arguments if isinstance(arguments, dict) else {}
        minutes = _whole_number(given.get("delay_minutes"))
        if minutes is None or not 1 <= minutes <= self.max_minutes:
            raise AgentError.tool(
                f"delay_minutes must be a whole number from 1 to {self.max_minutes}"
            )
        prompt = given.get("prompt")
        prompt = prompt.strip() if isinstance(prompt, str) else ""
        if not prompt:
            raise AgentError.tool("give a `prompt` for the follow-up run")
        if len(prompt) > MAX_FOLLOWUP_PROMPT_CHARS:
            raise AgentError.tool(
                f"the follow-up prompt must be at most {MAX_FOLLOWUP_PROMPT_CHARS} characters"
            )
        return FollowupPlan(
            delay_seconds=minutes * 60,
            prompt=prompt,
            depth=self.depth + 1,
            session=ctx.session_id if ctx.session_id is not None else self.session,
            memory_scope=self.memory_scope,
            parent_run_id=ctx.run_id,
            step=ctx.step,
            call_id=ctx.call_id,
        )

    async def execute(self, arguments: JsonValue, ctx: ToolContext) -> dict[str, JsonValue]:
        """Book the follow-up; see the class docstring for the answer and the errors."""
        plan = self.plan(arguments, ctx)
        try:
            run_id = await self._enqueue(plan)
        except AgentError as error:
            raise AgentError.tool(f"cannot schedule the follow-up: {error.message}") from None
        except Exception as error:
            raise AgentError.tool(f"cannot schedule the follow-up: {describe(error)}") from None
        return {"scheduled": True, "in_minutes": plan.delay_seconds // 60, "run_id": run_id}

    def __repr__(self) -> str:
        return (
            f"FollowupTool(max_delay={self.max_delay!r}, depth={self.depth}, "
            f"session={self.session!r}, memory_scope={self.memory_scope!r})"
        )
