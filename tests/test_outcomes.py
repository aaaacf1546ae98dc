"""Outcomes, run state and approval decisions keep the seed's JSON and survive a round trip.

Reference §1.10: outcomes are tagged by ``status``, pending-call statuses by ``status``,
approvals by ``verdict``; clients must tolerate statuses they do not know.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import JsonValue, ValidationError

from agent_plugin.messages import ChatMessage, Role, TokenUsage, ToolCall, ToolCallPart, ToolResult
from agent_plugin.outcomes import (
    AgentOutcome,
    AgentTurn,
    Allowed,
    ApprovalDecision,
    Approve,
    AwaitingApproval,
    BudgetExhausted,
    Cancelled,
    Completed,
    Denied,
    Edit,
    Finished,
    LoopDetected,
    NeedsApproval,
    Paused,
    PendingCall,
    Reject,
    Rejected,
    RunState,
    UnknownOutcome,
    outcome_adapter,
)

USAGE = TokenUsage(input_tokens=20, output_tokens=10, cache_read_tokens=5)
USAGE_JSON: dict[str, Any] = {
    "input_tokens": 20,
    "output_tokens": 10,
    "cache_read_tokens": 5,
    "cache_write_tokens": 0,
}


def _call(call_id: str, **arguments: JsonValue) -> ToolCall:
    return ToolCall(id=call_id, name="act", arguments=dict(arguments))


def _state() -> RunState:
    calls = [_call(f"c{i}", city="Oslo") for i in range(5)]
    return RunState(
        run_id="run_0123",
        session_id="sess_1",
        messages=[
            ChatMessage.user("do things"),
            ChatMessage(role=Role.ASSISTANT, content=[ToolCallPart(tool_call=c) for c in calls]),
        ],
        usage=USAGE,
        steps_used=1,
        pending=[
            PendingCall(call=calls[0], status=Allowed()),
            PendingCall(call=calls[1], status=NeedsApproval(reason="acts on the world")),
            PendingCall(call=calls[2], status=Denied(reason="read-only run")),
            PendingCall(call=calls[3], status=Rejected(reason="not today")),
            PendingCall(call=calls[4], status=Finished(content='"done"', is_error=False)),
        ],
        recent_calls=[0, 7, 2**64 - 1],
    )


OUTCOMES: list[tuple[AgentOutcome, dict[str, Any]]] = [
    (
        Completed(text="It is 4 degrees.", steps_used=1, usage=USAGE),
        {"status": "completed", "text": "It is 4 degrees.", "steps_used": 1, "usage": USAGE_JSON},
    ),
    *[
        (
            BudgetExhausted(reason=reason, steps_used=3, usage=USAGE),
            {"status": "budget_exhausted", "reason": reason, "steps_used": 3, "usage": USAGE_JSON},
        )
        for reason in ("steps", "tokens", "deadline")
    ],
    (
        LoopDetected(tool="get_weather", repeats=5, steps_used=5, usage=USAGE),
        {
            "status": "loop_detected",
            "tool": "get_weather",
            "repeats": 5,
            "steps_used": 5,
            "usage": USAGE_JSON,
        },
    ),
    (
        AwaitingApproval(state=_state()),
        {"status": "awaiting_approval", "state": _state().model_dump(mode="json")},
    ),
    (
        Paused(reason="operator pause", state=_state()),
        {"status": "paused", "reason": "operator pause", "state": _state().model_dump(mode="json")},
    ),
    (
        Cancelled(reason="client went away", steps_used=2, usage=USAGE),
        {"status": "cancelled", "reason": "client went away", "steps_used": 2, "usage": USAGE_JSON},
    ),
]


@pytest.mark.parametrize(("outcome", "expected"), OUTCOMES, ids=lambda v: getattr(v, "status", ""))
def test_outcomes_round_trip_through_json(outcome: AgentOutcome, expected: dict[str, Any]) -> None:
    encoded = outcome_adapter.dump_json(outcome)
    assert json.loads(encoded) == expected
    decoded = outcome_adapter.validate_json(encoded)
    assert type(decoded) is type(outcome)
    assert decoded == outcome
    assert outcome_adapter.dump_json(decoded) == encoded
    # from plain python data (a JSON column) too
    assert outcome_adapter.validate_python(expected) == outcome


def test_outcome_helpers() -> None:
    completed, *_ = OUTCOMES[0]
    assert isinstance(completed, Completed)
    assert completed.is_completed()
    for outcome, _ in OUTCOMES[1:]:
        assert not outcome.is_completed()
        assert outcome.steps_used >= 1
    paused = Paused(reason="r", state=_state())
    assert paused.steps_used == 1
    assert paused.usage == USAGE
    awaiting = AwaitingApproval(state=_state())
    assert (awaiting.steps_used, awaiting.usage) == (1, USAGE)
    assert Cancelled(steps_used=0, usage=TokenUsage()).reason == "cancelled"


def test_run_state_json_uses_the_status_tag_for_every_pending_status() -> None:
    dumped = json.loads(_state().model_dump_json())
    statuses = [p["status"] for p in dumped["pending"]]
    assert statuses == [
        {"status": "allowed"},
        {"status": "needs_approval", "reason": "acts on the world"},
        {"status": "denied", "reason": "read-only run"},
        {"status": "rejected", "reason": "not today"},
        {"status": "finished", "content": '"done"', "is_error": False},
    ]
    assert dumped["pending"][0]["call"] == {
        "id": "c0",
        "name": "act",
        "arguments": {"city": "Oslo"},
    }
    assert dumped["recent_calls"] == [0, 7, 2**64 - 1]
    assert RunState.model_validate_json(_state().model_dump_json()) == _state()


def test_run_state_awaiting_lists_only_calls_needing_approval() -> None:
    awaiting = _state().awaiting()
    assert [p.call.id for p in awaiting] == ["c1"]
    assert RunState(run_id="r", messages=[]).awaiting() == []


def test_run_state_defaults_when_fields_are_absent() -> None:
    """State written before ``recent_calls`` (or other optional fields) existed still loads."""
    raw = {
        "run_id": "run_old",
        "session_id": None,
        "messages": [{"role": "user", "content": [{"text": "hi"}]}],
        "usage": {"input_tokens": 3, "output_tokens": 1},
        "steps_used": 1,
        "pending": [],
    }
    state = RunState.model_validate_json(json.dumps(raw))
    assert state.recent_calls == []
    assert state.usage == TokenUsage(input_tokens=3, output_tokens=1)
    minimal = RunState.model_validate_json('{"run_id":"r","messages":[]}')
    assert minimal == RunState(run_id="r", messages=[])
    assert (minimal.session_id, minimal.steps_used, minimal.pending) == (None, 0, [])
    assert minimal.usage == TokenUsage()


def test_unknown_pending_status_is_rejected() -> None:
    with pytest.raises(ValidationError):
        PendingCall.model_validate_json(
            '{"call":{"id":"c","name":"f"},"status":{"status":"exploded"}}'
        )


# --- unknown outcomes -----------------------------------------------------------------------------


def test_an_unknown_status_parses_as_unknown_outcome_keeping_its_fields() -> None:
    raw: dict[str, Any] = {
        "status": "handed_off",
        "to": "billing-agent",
        "ticket": {"id": 7, "tags": ["vip"]},
        "steps_used": 4,
        "usage": {"input_tokens": 9, "output_tokens": 2},
    }
    outcome = outcome_adapter.validate_json(json.dumps(raw))
    assert isinstance(outcome, UnknownOutcome)
    assert outcome.status == "handed_off"
    assert outcome.steps_used == 4
    assert outcome.usage == TokenUsage(input_tokens=9, output_tokens=2)
    assert outcome.model_extra == {"to": "billing-agent", "ticket": {"id": 7, "tags": ["vip"]}}
    assert not outcome.is_completed()
    # written back, nothing is lost
    again = json.loads(outcome_adapter.dump_json(outcome))
    assert again == {
        **raw,
        "usage": {**raw["usage"], "cache_read_tokens": 0, "cache_write_tokens": 0},
    }
    assert outcome_adapter.validate_json(outcome_adapter.dump_json(outcome)) == outcome


def test_an_unknown_status_without_counts_defaults_them() -> None:
    outcome = outcome_adapter.validate_json('{"status":"escalated"}')
    assert isinstance(outcome, UnknownOutcome)
    assert (outcome.steps_used, outcome.usage) == (0, TokenUsage())


def test_a_known_status_with_extra_fields_still_parses() -> None:
    outcome = outcome_adapter.validate_json(
        '{"status":"completed","text":"hi","steps_used":0,"usage":{},"cost_usd":0.01}'
    )
    assert outcome == Completed(text="hi", steps_used=0, usage=TokenUsage())


@pytest.mark.parametrize(
    "raw",
    [
        '{"text":"no status"}',
        '{"status":"completed","text":"missing counts"}',
        '{"status":"budget_exhausted","reason":"boredom","steps_used":1,"usage":{}}',
        '{"status":5}',
        "[1]",
        '"completed"',
    ],
)
def test_malformed_outcomes_are_rejected(raw: str) -> None:
    with pytest.raises(ValidationError):
        outcome_adapter.validate_json(raw)


@pytest.mark.parametrize("raw", ['{"status":["completed"]}', '{"status":{"a":1}}'])
def test_a_non_string_status_is_a_validation_error(raw: str) -> None:
    with pytest.raises(ValidationError):
        outcome_adapter.validate_json(raw)


# --- approvals ------------------------------------------------------------------------------------


def test_approval_helpers() -> None:
    assert ApprovalDecision.approve("c1") == ApprovalDecision(call_id="c1", approval=Approve())
    assert ApprovalDecision.reject("c2", "not today") == ApprovalDecision(
        call_id="c2", approval=Reject(reason="not today")
    )
    edit = ApprovalDecision.edit("c3", {"city": "Oslo"})
    assert edit == ApprovalDecision(call_id="c3", approval=Edit(arguments={"city": "Oslo"}))


@pytest.mark.parametrize(
    ("decision", "expected"),
    [
        (ApprovalDecision.approve("c1"), {"call_id": "c1", "approval": {"verdict": "approve"}}),
        (
            ApprovalDecision.reject("c2", "not today"),
            {"call_id": "c2", "approval": {"verdict": "reject", "reason": "not today"}},
        ),
        (
            ApprovalDecision.edit("c3", {"city": "Oslo", "days": [1, 2]}),
            {
                "call_id": "c3",
                "approval": {"verdict": "edit", "arguments": {"city": "Oslo", "days": [1, 2]}},
            },
        ),
        (
            ApprovalDecision.edit("c4", None),
            {"call_id": "c4", "approval": {"verdict": "edit", "arguments": None}},
        ),
    ],
)
def test_approval_decisions_json(decision: ApprovalDecision, expected: JsonValue) -> None:
    encoded = decision.model_dump_json()
    assert json.loads(encoded) == expected
    assert ApprovalDecision.model_validate_json(encoded) == decision


def test_unknown_verdicts_are_rejected() -> None:
    with pytest.raises(ValidationError):
        ApprovalDecision.model_validate_json('{"call_id":"c","approval":{"verdict":"maybe"}}')
    with pytest.raises(ValidationError):
        ApprovalDecision.model_validate_json('{"call_id":"c","approval":{"verdict":"reject"}}')


# --- generated run states -----------------------------------------------------------------------

_text = st.text(max_size=8)
_ids = st.text("abc123", min_size=1, max_size=4)
_arguments: st.SearchStrategy[JsonValue] = st.dictionaries(
    st.text("xyz", max_size=3),
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    max_size=3,
)
_tool_calls = st.builds(
    ToolCall, id=_ids, name=st.sampled_from(["read", "write"]), arguments=_arguments
)
_messages = st.one_of(
    st.builds(ChatMessage.user, _text),
    st.builds(ChatMessage.assistant, _text),
    st.builds(
        lambda calls: ChatMessage(
            role=Role.ASSISTANT, content=[ToolCallPart(tool_call=c) for c in calls]
        ),
        st.lists(_tool_calls, min_size=1, max_size=3),
    ),
    st.builds(
        ChatMessage.tool_results,
        st.lists(
            st.builds(ToolResult, tool_call_id=_ids, content=_text, is_error=st.booleans()),
            max_size=3,
        ),
    ),
)
_statuses = st.one_of(
    st.builds(Allowed),
    st.builds(NeedsApproval, reason=_text),
    st.builds(Denied, reason=_text),
    st.builds(Rejected, reason=_text),
    st.builds(Finished, content=_text, is_error=st.booleans()),
)
_counts = st.integers(0, 2**32 - 1)
_states = st.builds(
    RunState,
    run_id=_ids,
    session_id=st.none() | _ids,
    messages=st.lists(_messages, max_size=5),
    usage=st.builds(TokenUsage, input_tokens=_counts, output_tokens=_counts),
    steps_used=st.integers(0, 100),
    pending=st.lists(st.builds(PendingCall, call=_tool_calls, status=_statuses), max_size=4),
    recent_calls=st.lists(st.integers(0, 2**64 - 1), max_size=4),
)


@given(_states, st.sampled_from(["awaiting", "paused"]))
@settings(max_examples=60, deadline=None)
def test_generated_run_states_round_trip(state: RunState, kind: str) -> None:
    assert RunState.model_validate_json(state.model_dump_json()) == state
    outcome: AgentOutcome = (
        AwaitingApproval(state=state) if kind == "awaiting" else Paused(reason="p", state=state)
    )
    decoded = outcome_adapter.validate_json(outcome_adapter.dump_json(outcome))
    assert decoded == outcome
    assert isinstance(decoded, AwaitingApproval | Paused)
    assert decoded.state.awaiting() == state.awaiting()
    turn = AgentTurn(outcome=outcome, messages=state.messages)
    assert AgentTurn.model_validate_json(turn.model_dump_json()) == turn
