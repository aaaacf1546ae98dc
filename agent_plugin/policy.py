"""Tool policies: decide, before a tool runs, whether it may run, needs approval, or is refused.

A policy is anything with a ``decide(call, tool, info)`` method (:class:`ToolPolicy`), asked
once per tool call. :class:`AllowAll` is the default; :class:`ToolRules` has rules per tool
name (which win) and per :class:`~agent_plugin.tools.ToolEffect`::

    rules = ToolRules().for_tool("send_email", ASK).for_effect(ToolEffect.WRITE, deny("no"))

:class:`Strictest` combines policies and keeps the strictest answer. Decisions are frozen
pydantic models tagged by ``decision``, so they travel as JSON."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Final, Literal, Protocol, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from agent_plugin.messages import ToolCall
from agent_plugin.outcomes import RunInfo
from agent_plugin.tools import Tool, ToolEffect

__all__ = [
    "ALLOW",
    "ASK",
    "READ_ONLY_REASON",
    "Allow",
    "AllowAll",
    "Ask",
    "Deny",
    "RequireApproval",
    "Rule",
    "Strictest",
    "ToolDecision",
    "ToolPolicy",
    "ToolRules",
    "approval_reason",
    "decision_adapter",
    "deny",
]

READ_ONLY_REASON: Final = "this run may only read data and update its own notes"
"""Why :meth:`ToolRules.read_only` refuses a tool that writes or acts outside the app."""


# --- decisions -----------------------------------------------------------------------------


class _Decision(BaseModel):
    model_config = ConfigDict(frozen=True)


class Allow(_Decision):
    """The call runs."""

    decision: Literal["allow"] = "allow"


class RequireApproval(_Decision):
    """The run pauses until a reviewer approves, edits or rejects the call."""

    decision: Literal["require_approval"] = "require_approval"
    reason: str


class Deny(_Decision):
    """The call does not run; the model is told ``reason`` and the run goes on."""

    decision: Literal["deny"] = "deny"
    reason: str


ToolDecision: TypeAlias = Annotated[Allow | RequireApproval | Deny, Field(discriminator="decision")]
"""What a policy answers for one call; JSON-tagged by ``decision``."""

decision_adapter: TypeAdapter[ToolDecision] = TypeAdapter(
    ToolDecision, config=ConfigDict(defer_build=True)
)
"""``decision_adapter.validate_json(...)`` / ``.dump_json(...)`` for a decision on its own.

Built on first use (policies never need it), not when the package is imported."""

ALLOW: Final = Allow()
"""The one :class:`Allow` the shipped policies return, so allowing a call allocates nothing."""


def deny(reason: str) -> Deny:
    """A :class:`Deny` decision, also usable as a :class:`ToolRules` rule."""
    return Deny(reason=reason)


def approval_reason(tool_name: str) -> str:
    """The reason an :data:`ASK` rule gives: ``"<name> needs approval before it runs"``."""
    return f"{tool_name} needs approval before it runs"


# --- the protocol --------------------------------------------------------------------------


class ToolPolicy(Protocol):
    """Decides whether one tool call may run. Called on the agent's hot path: keep it cheap.

    ``tool`` is ``None`` when the model named a tool the agent does not have; an allowed unknown
    call is then answered with an "unknown tool" error by the agent.
    """

    def decide(self, call: ToolCall, tool: Tool | None, info: RunInfo) -> ToolDecision:
        """Answer :class:`Allow`, :class:`RequireApproval` or :class:`Deny` for ``call``."""
        ...


class AllowAll:
    """The default policy: every call runs."""

    __slots__ = ()

    def decide(self, call: ToolCall, tool: Tool | None, info: RunInfo) -> ToolDecision:
        """Always :data:`ALLOW`."""
        return ALLOW

    def __repr__(self) -> str:
        return "AllowAll()"


# --- rules ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ask:
    """Rule: the call needs approval (decided as :class:`RequireApproval`). Use :data:`ASK`."""


ASK: Final = Ask()
"""The rule that asks for approval before a tool runs."""

Rule: TypeAlias = Allow | Ask | Deny
"""One rule in :class:`ToolRules`: :data:`ALLOW`, :data:`ASK` or :func:`deny` ``(reason)``."""


class ToolRules:
    """Per-name and per-effect rules.

    Immutable: :meth:`for_tool` and :meth:`for_effect` return a new ``ToolRules`` with one rule
    added (or replaced), so a preset can be extended without changing it::

        policy = ToolRules.read_only().for_tool("save_note", ALLOW)

    Lookup order: the rule for the call's tool name; else, only when the tool is known, the rule
    for its effect; else allow. An :data:`ASK` rule answers :class:`RequireApproval` with the
    reason ``"<name> needs approval before it runs"``.
    """

    __slots__ = ("_by_effect", "_by_name")

    def __init__(
        self,
        by_name: Mapping[str, Rule] | None = None,
        by_effect: Mapping[ToolEffect, Rule] | None = None,
    ) -> None:
        self._by_name: Mapping[str, Rule] = MappingProxyType(dict(by_name or {}))
        self._by_effect: Mapping[ToolEffect, Rule] = MappingProxyType(dict(by_effect or {}))

    @classmethod
    def read_only(cls) -> ToolRules:
        """Deny tools that write or act outside the app; reading and internal tools run."""
        refuse = deny(READ_ONLY_REASON)
        return cls(by_effect={ToolEffect.WRITE: refuse, ToolEffect.EXTERNAL: refuse})

    @classmethod
    def ask_before_acting(cls) -> ToolRules:
        """Ask for approval before tools that write or act outside the app."""
        return cls(by_effect={ToolEffect.WRITE: ASK, ToolEffect.EXTERNAL: ASK})

    @property
    def by_name(self) -> Mapping[str, Rule]:
        """The rules keyed by tool name (read-only view)."""
        return self._by_name

    @property
    def by_effect(self) -> Mapping[ToolEffect, Rule]:
        """The rules keyed by tool effect (read-only view)."""
        return self._by_effect

    def for_tool(self, name: str, rule: Rule) -> ToolRules:
        """A copy with ``rule`` for the tool called ``name``."""
        return ToolRules({**self._by_name, name: rule}, self._by_effect)

    def for_effect(self, effect: ToolEffect, rule: Rule) -> ToolRules:
        """A copy with ``rule`` for every known tool whose effect is ``effect``."""
        return ToolRules(self._by_name, {**self._by_effect, ToolEffect(effect): rule})

    def rule_for(self, name: str, tool: Tool | None) -> Rule:
        """The rule that applies to a call of ``name`` (``tool`` is ``None`` if unknown)."""
        rule = self._by_name.get(name)
        if rule is None and tool is not None:
            rule = self._by_effect.get(tool.effect)
        return ALLOW if rule is None else rule

    def decide(self, call: ToolCall, tool: Tool | None, info: RunInfo) -> ToolDecision:
        """Apply the first matching rule (name, then effect) or allow."""
        rule = self.rule_for(call.name, tool)
        if isinstance(rule, Ask):
            return RequireApproval(reason=approval_reason(call.name))
        return rule

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ToolRules):
            return NotImplemented
        return self._by_name == other._by_name and self._by_effect == other._by_effect

    def __hash__(self) -> int:
        return hash((frozenset(self._by_name.items()), frozenset(self._by_effect.items())))

    def __repr__(self) -> str:
        return f"ToolRules(by_name={dict(self._by_name)!r}, by_effect={dict(self._by_effect)!r})"


# --- combining -----------------------------------------------------------------------------


class Strictest:
    """Asks each policy in order and keeps the strictest answer.

    Any :class:`Deny` is returned at once; otherwise the first :class:`RequireApproval`;
    otherwise :data:`ALLOW`. An empty list allows everything.
    """

    __slots__ = ("_policies",)

    def __init__(self, policies: Iterable[ToolPolicy]) -> None:
        self._policies: tuple[ToolPolicy, ...] = tuple(policies)

    @property
    def policies(self) -> tuple[ToolPolicy, ...]:
        """The combined policies, in the order they are asked."""
        return self._policies

    def decide(self, call: ToolCall, tool: Tool | None, info: RunInfo) -> ToolDecision:
        """Deny if any policy denies, else ask if any asks, else allow."""
        approval: RequireApproval | None = None
        for policy in self._policies:
            decision = policy.decide(call, tool, info)
            if isinstance(decision, Deny):
                return decision
            if approval is None and isinstance(decision, RequireApproval):
                approval = decision
        return ALLOW if approval is None else approval

    def __repr__(self) -> str:
        return f"Strictest({list(self._policies)!r})"
