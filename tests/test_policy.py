"""Tool policies [AP-28, AP-29]: AllowAll, ToolRules, Strictest and the decision JSON."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import pytest
from pydantic import ValidationError

from agent_plugin.messages import TokenUsage, ToolCall
from agent_plugin.outcomes import RunInfo
from agent_plugin.policy import (
    ALLOW,
    ASK,
    READ_ONLY_REASON,
    Allow,
    AllowAll,
    Deny,
    RequireApproval,
    Strictest,
    ToolDecision,
    ToolPolicy,
    ToolRules,
    decision_adapter,
    deny,
)
from agent_plugin.tools import Tool, ToolEffect

INFO = RunInfo(run_id="run-1", session_id=None, steps_used=0, max_steps=10, usage=TokenUsage())


@dataclass(frozen=True)
class FakeTool:
    """Policies read only a tool's name and effect."""

    name: str
    effect: ToolEffect


def call(name: str) -> ToolCall:
    return ToolCall(id=f"call-{name}", name=name, arguments={"x": 1})


def decide(policy: ToolPolicy, tool: FakeTool | None, name: str = "") -> ToolDecision:
    """Ask ``policy`` about a call of ``tool`` (or of ``name`` when the tool is unknown)."""
    tool_name = name or (tool.name if tool else "missing")
    return policy.decide(call(tool_name), cast("Tool | None", tool), INFO)


READER = FakeTool("lookup", ToolEffect.READ_ONLY)
NOTES = FakeTool("save_note", ToolEffect.INTERNAL)
WRITER = FakeTool("update_order", ToolEffect.WRITE)
MAILER = FakeTool("send_email", ToolEffect.EXTERNAL)
ALL_TOOLS = (READER, NOTES, WRITER, MAILER)


def test_allow_all_allows() -> None:
    policy = AllowAll()
    for tool in ALL_TOOLS:
        assert decide(policy, tool) == Allow()
    assert decide(policy, None, "no_such_tool") == Allow()
    # the hot path hands out the shared singleton instead of building a new decision
    assert decide(policy, WRITER) is ALLOW


def test_read_only_rules_gate_by_effect() -> None:
    policy = ToolRules.read_only()
    assert decide(policy, READER) is ALLOW
    assert decide(policy, NOTES) is ALLOW
    assert decide(policy, WRITER) == Deny(reason=READ_ONLY_REASON)
    assert decide(policy, MAILER) == Deny(reason=READ_ONLY_REASON)
    assert READ_ONLY_REASON == "this run may only read data and update its own notes"

    asking = ToolRules.ask_before_acting()
    assert decide(asking, READER) is ALLOW
    assert decide(asking, NOTES) is ALLOW
    assert decide(asking, WRITER) == RequireApproval(
        reason="update_order needs approval before it runs"
    )
    assert decide(asking, MAILER) == RequireApproval(
        reason="send_email needs approval before it runs"
    )


def test_name_rules_win_over_effect_rules() -> None:
    policy = (
        ToolRules.read_only()
        .for_tool("update_order", ALLOW)
        .for_tool("lookup", ASK)
        .for_tool("save_note", deny("notes are frozen"))
    )
    assert decide(policy, WRITER) is ALLOW
    assert decide(policy, READER) == RequireApproval(reason="lookup needs approval before it runs")
    assert decide(policy, NOTES) == Deny(reason="notes are frozen")
    # no name rule: the effect rule still applies
    assert decide(policy, MAILER) == Deny(reason=READ_ONLY_REASON)


def test_rules_are_immutable_builders() -> None:
    base = ToolRules.read_only()
    extended = base.for_tool("update_order", ALLOW).for_effect(ToolEffect.READ_ONLY, ASK)
    assert decide(base, WRITER) == Deny(reason=READ_ONLY_REASON)
    assert decide(base, READER) is ALLOW
    assert decide(extended, WRITER) is ALLOW
    assert isinstance(decide(extended, READER), RequireApproval)
    # a later rule for the same key replaces the earlier one
    assert decide(base.for_effect(ToolEffect.WRITE, ALLOW), WRITER) is ALLOW
    assert base == ToolRules.read_only()
    assert base != extended
    with pytest.raises(TypeError):
        base.by_name["x"] = ALLOW  # type: ignore[index]


def test_unknown_tools_fall_back_to_name_rules_then_allow() -> None:
    deny_every_effect = ToolRules(by_effect={effect: deny("effect rule") for effect in ToolEffect})
    policy = deny_every_effect.for_tool("ghost", ASK).for_tool("phantom", deny("never"))
    # the agent does not know these tools: only name rules apply
    assert decide(policy, None, "ghost") == RequireApproval(
        reason="ghost needs approval before it runs"
    )
    assert decide(policy, None, "phantom") == Deny(reason="never")
    assert decide(policy, None, "no_such_tool") is ALLOW
    # the same effect rules do apply to a known tool
    assert decide(policy, READER) == Deny(reason="effect rule")


def test_decisions_serialize_with_a_tag() -> None:
    assert deny("r").model_dump() == {"decision": "deny", "reason": "r"}
    assert decision_adapter.dump_python(deny("r"), mode="json") == {
        "decision": "deny",
        "reason": "r",
    }
    assert decision_adapter.dump_python(ALLOW, mode="json") == {"decision": "allow"}
    asking = RequireApproval(reason="why")
    assert decision_adapter.dump_python(asking, mode="json") == {
        "decision": "require_approval",
        "reason": "why",
    }
    for decision in (ALLOW, asking, deny("r")):
        restored = decision_adapter.validate_json(decision_adapter.dump_json(decision))
        assert restored == decision
        assert type(restored) is type(decision)
    assert decision_adapter.validate_python({"decision": "deny", "reason": "r"}) == deny("r")
    with pytest.raises(ValidationError):
        decision_adapter.validate_python({"decision": "maybe"})
    with pytest.raises(ValidationError):
        decision_adapter.validate_python({"decision": "deny"})  # a denial needs a reason
    with pytest.raises(ValidationError):
        ALLOW.decision = "deny"  # type: ignore[misc]  # decisions are frozen


def test_strictest_keeps_the_strictest_answer() -> None:
    policy = Strictest(
        [AllowAll(), ToolRules().for_tool("send", ASK), ToolRules().for_tool("wipe", deny("no"))]
    )
    assert decide(policy, FakeTool("other", ToolEffect.WRITE)) is ALLOW
    assert decide(policy, FakeTool("send", ToolEffect.EXTERNAL)) == RequireApproval(
        reason="send needs approval before it runs"
    )
    assert decide(policy, FakeTool("wipe", ToolEffect.WRITE)) == Deny(reason="no")
    assert decide(Strictest([]), FakeTool("wipe", ToolEffect.WRITE)) is ALLOW


class Recording:
    """A user's own policy: no base class, just ``decide``."""

    def __init__(self, answer: ToolDecision) -> None:
        self.answer = answer
        self.seen: list[str] = []

    def decide(self, call: ToolCall, tool: Tool | None, info: RunInfo) -> ToolDecision:
        self.seen.append(call.name)
        return self.answer


def test_strictest_returns_a_denial_at_once_and_keeps_the_first_approval() -> None:
    first_ask = Recording(RequireApproval(reason="first"))
    second_ask = Recording(RequireApproval(reason="second"))
    denier = Recording(deny("stop"))
    after_denial = Recording(ALLOW)
    policy = Strictest([first_ask, second_ask, denier, after_denial])
    assert decide(policy, WRITER) == Deny(reason="stop")
    assert after_denial.seen == []  # a denial ends the search

    policy = Strictest([AllowAll(), first_ask, second_ask])
    assert decide(policy, WRITER) == RequireApproval(reason="first")
    assert second_ask.seen == ["update_order", "update_order"]  # still asked: it could deny


def test_heartbeat_style_combination_keeps_the_app_policy() -> None:
    """Strictest([app, read_only()]): an app 'ask' survives, read-only still denies writes."""
    app = ToolRules().for_tool("lookup", ASK)
    policy = Strictest([app, ToolRules.read_only()])
    assert decide(policy, READER) == RequireApproval(reason="lookup needs approval before it runs")
    assert decide(policy, NOTES) is ALLOW
    assert decide(policy, WRITER) == Deny(reason=READ_ONLY_REASON)
