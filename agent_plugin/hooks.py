"""Lifecycle hooks: observe a run, edit requests and calls, block calls, pause or cancel,
end a run after a turn or prepare the next one.

Subclass :class:`AgentHooks` and override what you need; every method is optional and async,
hooks run in registration order, and only overridden methods cost anything per step. In one
turn: ``before_model``, ``after_model``, ``before_tool`` and ``after_tool`` per call, then
``should_stop_after_turn`` and ``prepare_next_turn``; ``on_outcome`` once the run returns.
``PauseRun`` / ``CancelRun`` from ``before_model``, ``after_model`` or ``before_tool`` stop the
run there. The order and the boundaries in full: ``docs/guide/agent-loop.md``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from pydantic import JsonValue

from agent_plugin.messages import ChatMessage, TokenUsage, ToolCall
from agent_plugin.outcomes import AgentOutcome, RunInfo
from agent_plugin.providers.base import ChatRequest, ChatResponse

if TYPE_CHECKING:
    from agent_plugin.tools import ToolContext

__all__ = [
    "AgentHooks",
    "Block",
    "CancelRun",
    "Continue",
    "HookSet",
    "Modify",
    "NextTurn",
    "PauseRun",
    "RunControl",
    "ToolHookResult",
    "ToolOutput",
    "TurnInfo",
]


@dataclass(frozen=True, slots=True)
class PauseRun:
    """Stop at this boundary with a ``paused`` outcome that ``resume`` continues."""

    reason: str = "paused by a hook"


@dataclass(frozen=True, slots=True)
class CancelRun:
    """End the run at this boundary with a ``cancelled`` outcome."""

    reason: str = "cancelled by a hook"


RunControl: TypeAlias = PauseRun | CancelRun


@dataclass(frozen=True, slots=True)
class Continue:
    """Run the call as it is."""


@dataclass(frozen=True, slots=True)
class Modify:
    """Run the call with these arguments instead (later hooks see them too)."""

    arguments: JsonValue


@dataclass(frozen=True, slots=True)
class Block:
    """Do not run the call; the model gets ``{"error": "blocked by hook: <reason>"}``."""

    reason: str


ToolHookResult: TypeAlias = Continue | Modify | Block | PauseRun | CancelRun


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """What a call produced, as the model will see it."""

    content: str
    is_error: bool = False
    terminate: bool = False


@dataclass(frozen=True, slots=True)
class TurnInfo:
    """A turn that just ended, as the turn-level hooks see it: its ``step``, the ``messages``
    it added (the model's reply, then the results of its calls, if any), the ``usage`` of its
    model call, and the run so far."""

    step: int
    messages: tuple[ChatMessage, ...]
    usage: TokenUsage
    run: RunInfo


@dataclass(frozen=True, slots=True)
class NextTurn:
    """What ``prepare_next_turn`` changes for the turns that follow.

    ``messages`` (user messages; text is wrapped) are added to the conversation and force
    another turn, even after a final answer. The rest hold from the next request on until a
    hook changes them again, and are kept in a paused run's state (``None`` keeps what is
    set): ``model`` (the name the wire client sends), ``tools`` (the names of the tools to
    offer; the final-result tools of a typed run are always offered), ``system_prompt_addition``
    (a section after the system prompt; ``""`` removes it) and ``extra_body`` (provider fields
    merged into the request body, say the thinking level: ``{"reasoning_effort": "high"}`` or
    Anthropic's ``{"thinking": {...}}``)."""

    messages: Sequence[str | ChatMessage] = ()
    model: str | None = None
    tools: Sequence[str] | None = None
    system_prompt_addition: str | None = None
    extra_body: Mapping[str, JsonValue] | None = None


class AgentHooks:
    """No-op defaults for every hook; override the ones you need."""

    async def before_model(self, request: ChatRequest, info: RunInfo) -> RunControl | None:
        """Called before each model request; may edit ``request`` in place."""
        return None

    async def after_model(self, response: ChatResponse, info: RunInfo) -> RunControl | None:
        """Called with each model reply."""
        return None

    async def before_tool(self, call: ToolCall, ctx: ToolContext) -> ToolHookResult | None:
        """Called before each allowed call; ``None`` means :class:`Continue`."""
        return None

    async def after_tool(self, call: ToolCall, output: ToolOutput, ctx: ToolContext) -> None:
        """Called after every call, including blocked, denied and rejected ones."""
        return

    async def should_stop_after_turn(self, turn: TurnInfo) -> bool:
        """Called after each turn the run would go on from (or end with an answer): ``True``
        ends the run at once, completed with the turn's text (a typed run without a valid
        output: ``output_invalid``), skipping ``prepare_next_turn`` and queued messages."""
        return False

    async def prepare_next_turn(self, turn: TurnInfo) -> NextTurn | None:
        """Called after each turn that did not stop the run: what the next turns change."""
        return None

    async def on_outcome(self, outcome: AgentOutcome, info: RunInfo) -> None:
        """Called once per run or resume that returns an outcome (pauses included)."""
        return


class HookSet:
    """The overridden methods of a list of hooks, in registration order.

    Methods a hook inherits from :class:`AgentHooks` unchanged are left out, so hooks that do
    not care about a point cost nothing there.
    """

    __slots__ = (
        "after_model",
        "after_tool",
        "after_turn",
        "before_model",
        "before_tool",
        "on_outcome",
        "prepare_next_turn",
        "should_stop_after_turn",
    )

    def __init__(self, hooks: list[AgentHooks]) -> None:
        def overriding(name: str) -> list[Any]:
            default = getattr(AgentHooks, name)
            return [getattr(h, name) for h in hooks if getattr(type(h), name, None) is not default]

        self.before_model = overriding("before_model")
        self.after_model = overriding("after_model")
        self.before_tool = overriding("before_tool")
        self.after_tool = overriding("after_tool")
        self.on_outcome = overriding("on_outcome")
        self.should_stop_after_turn = overriding("should_stop_after_turn")
        self.prepare_next_turn = overriding("prepare_next_turn")
        self.after_turn = bool(self.should_stop_after_turn or self.prepare_next_turn)
        """Whether any turn-level hook is there (else the loop skips the turn's report)."""
