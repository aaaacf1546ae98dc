"""The turn-level hooks of a run and what they leave for the turns that follow.

After each turn, ``should_stop_after_turn`` hooks may end the run and ``prepare_next_turn``
hooks may add user messages (forcing another turn) and change the run's
:class:`~agent_plugin.outcomes.TurnSettings`: the model, the tools offered, a section after the
system prompt and provider body fields. :func:`ask_turn_hooks` asks them;
:class:`TurnPlan` is what the settings make of the agent's system prompt and tools.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent_plugin.budget import estimate_message
from agent_plugin.errors import AgentError, PrefixLocked
from agent_plugin.hooks import HookSet, NextTurn, TurnInfo
from agent_plugin.messages import ChatMessage, Role, ToolDefinition
from agent_plugin.outcomes import TurnSettings

__all__ = ["TurnPlan", "TurnVerdict", "ask_turn_hooks"]


@dataclass(slots=True)
class TurnVerdict:
    """What the turn-level hooks said about a turn: ``stop`` (the run ends), the user
    ``added`` messages that force another turn, and the ``settings`` for the next turns."""

    stop: bool = False
    added: list[ChatMessage] = field(default_factory=list)
    settings: TurnSettings | None = None


async def ask_turn_hooks(
    hooks: HookSet, turn: TurnInfo, settings: TurnSettings | None, *, locked: bool
) -> TurnVerdict:
    """Ask ``hooks`` about ``turn``: the first ``should_stop_after_turn`` that says yes ends the
    run (no ``prepare_next_turn`` is asked); otherwise every ``prepare_next_turn`` in order,
    a later one's settings overriding an earlier one's field by field.

    A locked agent's tools and system prompt are fixed: a hook changing them is refused
    with :class:`~agent_plugin.errors.PrefixLocked`.
    """
    for should_stop in hooks.should_stop_after_turn:
        if await should_stop(turn):
            return TurnVerdict(stop=True, settings=settings)
    verdict = TurnVerdict(settings=settings)
    for prepare in hooks.prepare_next_turn:
        prepared: NextTurn | None = await prepare(turn)
        if prepared is None:
            continue
        if locked and (prepared.tools is not None or prepared.system_prompt_addition is not None):
            raise PrefixLocked("a prepare_next_turn hook changing the tools or system prompt")
        verdict.added.extend(_user_message(m) for m in prepared.messages)
        verdict.settings = _settled(verdict.settings, prepared)
    return verdict


@dataclass(slots=True)
class TurnPlan:
    """The system prompt and tools a run's next request offers, as its settings leave them.

    ``system`` is ``base_system`` with the settings' addition; ``offered`` is ``None`` while
    the agent's own tools are offered as they are (the common case: nothing is copied).
    """

    base_system: ChatMessage | None = None
    system: ChatMessage | None = None
    system_cost: int = 0
    offered: tuple[ToolDefinition, ...] | None = None

    def start(self, system: ChatMessage | None) -> None:
        """Begin from the agent's system prompt (made per run: preparing it may need I/O)."""
        self.base_system = self.system = system
        self.system_cost = estimate_message(system) if system is not None else 0

    def settle(
        self,
        settings: TurnSettings,
        definitions: tuple[ToolDefinition, ...],
        always_offered: Callable[[str], bool],
    ) -> None:
        """Apply ``settings`` to the system prompt and to the tools offered (of
        ``definitions``, keeping those ``always_offered`` says must stay: a typed run's
        final-result tools)."""
        addition = settings.system_prompt_addition
        base = self.base_system
        if addition:
            text = f"{base.text}\n\n{addition}" if base is not None else addition
            self.system = ChatMessage.system(text)
        else:
            self.system = base
        self.system_cost = estimate_message(self.system) if self.system is not None else 0
        names = settings.tools
        if names is None:
            self.offered = None
            return
        wanted = set(names)
        self.offered = tuple(d for d in definitions if d.name in wanted or always_offered(d.name))


def _user_message(message: str | ChatMessage) -> ChatMessage:
    if isinstance(message, str):
        return ChatMessage.user(message)
    if message.role is not Role.USER:
        raise AgentError.config(
            f"prepare_next_turn adds user messages, got a {message.role.value} message"
        )
    return message


def _settled(settings: TurnSettings | None, prepared: NextTurn) -> TurnSettings:
    """``settings`` with what ``prepared`` sets (``None`` fields keep theirs)."""
    current = settings or TurnSettings()
    changes: dict[str, Any] = {}
    if prepared.model is not None:
        changes["model"] = prepared.model
    if prepared.tools is not None:
        changes["tools"] = list(prepared.tools)
    if prepared.system_prompt_addition is not None:
        changes["system_prompt_addition"] = prepared.system_prompt_addition or None
    if prepared.extra_body is not None:
        changes["extra_body"] = dict(prepared.extra_body)
    return current.model_copy(update=changes) if changes else current
