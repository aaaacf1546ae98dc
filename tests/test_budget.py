"""Token estimates, history truncation and the run budget [reference §1.8, AP-19, AP-20].

``truncate_history`` is checked three ways: the seed's named invariants as properties over
generated transcripts, an independent model of the exact expected output, and the seed's explicit
example (``truncation_keeps_the_task_and_drops_orphaned_results``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_plugin.agent import Agent
from agent_plugin.budget import (
    MAX_CALL_TOKENS,
    MIN_USEFUL_REMAINING,
    Budget,
    estimate_message,
    estimate_messages,
    estimate_tokens,
    truncate_history,
)
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.messages import (
    ChatMessage,
    Image,
    ImagePart,
    Role,
    TextPart,
    TokenUsage,
    ToolCall,
    ToolCallPart,
    ToolResult,
    ToolResultPart,
)
from agent_plugin.outcomes import BudgetExhausted
from agent_plugin.pricing import ModelPrice, Prices
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.telemetry import Telemetry
from agent_plugin.tools import tool

# --- estimates ---------------------------------------------------------------------------------


def test_estimate_tokens_examples() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abc") == 0
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcdefgh") == 2
    assert estimate_tokens("a" * 4001) == 1000


def test_estimate_tokens_counts_utf8_bytes_not_characters() -> None:
    assert estimate_tokens("é") == 0  # 2 bytes
    assert estimate_tokens("éé") == 1  # 4 bytes
    assert estimate_tokens("日本") == 1  # 6 bytes
    assert estimate_tokens("日本語のテキスト") == 6  # 8 chars x 3 bytes
    assert estimate_tokens("🙂") == 1  # 4 bytes


@given(st.text(max_size=200))
@settings(max_examples=50)
def test_estimate_tokens_is_a_quarter_of_the_utf8_length(text: str) -> None:
    assert estimate_tokens(text) == len(text.encode("utf-8")) // 4


def test_estimate_message_adds_four_per_message() -> None:
    assert estimate_message(ChatMessage.user("")) == 4
    assert estimate_message(ChatMessage.user("abcdefgh")) == 6
    assert estimate_message(ChatMessage(role=Role.ASSISTANT, content=[])) == 4
    two_parts = ChatMessage(
        role=Role.USER, content=[TextPart(text="abcd"), TextPart(text="abcdefgh")]
    )
    assert estimate_message(two_parts) == 4 + 1 + 2


def test_estimate_message_prices_a_tool_call_as_name_plus_compact_json() -> None:
    arguments = {"city": "Zürich", "days": [1, 2, 3], "units": {"temp": "C"}}
    compact = json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)
    assert " " not in compact
    call = ToolCall(id="c1", name="get_weather", arguments=arguments)
    message = ChatMessage(role=Role.ASSISTANT, content=[ToolCallPart(tool_call=call)])
    expected = 4 + estimate_tokens("get_weather") + estimate_tokens(compact)
    assert estimate_message(message) == expected
    # the call id is not priced
    renamed = call.model_copy(update={"id": "a-much-longer-call-identifier"})
    assert (
        estimate_message(
            ChatMessage(role=Role.ASSISTANT, content=[ToolCallPart(tool_call=renamed)])
        )
        == expected
    )


def test_estimate_message_prices_raw_arguments_as_sent() -> None:
    raw = '{"city": "Oslo", broken'
    call = ToolCall(id="c1", name="lookup", arguments={}, raw_arguments=raw)
    message = ChatMessage(role=Role.ASSISTANT, content=[ToolCallPart(tool_call=call)])
    assert estimate_message(message) == 4 + estimate_tokens("lookup") + estimate_tokens(raw)


def test_estimate_message_prices_a_tool_result_by_its_content() -> None:
    content = '{"temp":4,"sky":"clear"}'
    message = ChatMessage.tool_results([ToolResult(tool_call_id="c1", content=content)])
    assert estimate_message(message) == 4 + estimate_tokens(content)
    error = ChatMessage.tool_results(
        [ToolResult(tool_call_id="c1", content=content, is_error=True)]
    )
    assert estimate_message(error) == estimate_message(message)


def test_estimate_message_mixed_parts() -> None:
    call = ToolCall(id="c1", name="abcd", arguments={"k": "v"})  # {"k":"v"} is 9 bytes
    message = ChatMessage(
        role=Role.ASSISTANT,
        content=[
            TextPart(text="x" * 40),
            ToolCallPart(tool_call=call),
            ImagePart(image=Image(url="https://example.com/cat.png")),
        ],
    )
    assert estimate_message(message) == 4 + 10 + 1 + 2


def test_estimate_messages_sums_the_messages() -> None:
    assert estimate_messages([]) == 0
    messages = [ChatMessage.system("a" * 8), ChatMessage.user("b" * 12), ChatMessage.user("")]
    assert estimate_messages(messages) == (4 + 2) + (4 + 3) + 4
    assert estimate_messages(messages) == sum(estimate_message(m) for m in messages)


# --- generated transcripts ---------------------------------------------------------------------

_CHARS = "abcdefgh日é "


def _text(size: int) -> str:
    """Filler text of ``size`` characters, mixing 1-, 2- and 3-byte UTF-8."""
    return (_CHARS * (size // len(_CHARS) + 1))[:size]


_sizes = st.integers(0, 80)
_kinds = st.sampled_from(["user", "assistant", "round", "round", "stray"])
_blocks = st.lists(st.tuples(_kinds, _sizes, st.integers(1, 3), st.booleans()), max_size=12)


def _build(systems: list[int], blocks: list[tuple[str, int, int, bool]]) -> list[ChatMessage]:
    """A transcript: system messages first, then users, assistants, call rounds and strays.

    A "round" is an assistant turn with 1-3 calls (sometimes with text) and the tool message
    answering all of them; a "stray" is a tool message not right after the call it names.
    """
    messages = [ChatMessage.system(_text(size)) for size in systems]
    for n, (kind, size, calls, with_text) in enumerate(blocks):
        if kind == "user":
            messages.append(ChatMessage.user(_text(size)))
        elif kind == "assistant":
            messages.append(ChatMessage.assistant(_text(size)))
        elif kind == "round":
            tool_calls = [
                ToolCall(id=f"call_{n}_{k}", name="search", arguments={"q": _text(size + k)})
                for k in range(calls)
            ]
            content: list[TextPart | ToolCallPart] = (
                [TextPart(text="thinking")] if with_text else []
            )
            content.extend(ToolCallPart(tool_call=c) for c in tool_calls)
            messages.append(ChatMessage(role=Role.ASSISTANT, content=list(content)))
            messages.append(
                ChatMessage.tool_results(
                    [ToolResult(tool_call_id=c.id, content=_text(size)) for c in tool_calls]
                )
            )
        else:
            # a result for a call that never existed, or a second answer to an earlier one
            call_id = f"call_{n - 1}_0" if with_text else f"gone_{n}"
            stray = ToolResult(tool_call_id=call_id, content=_text(size))
            messages.append(ChatMessage.tool_results([stray]))
    return messages


@st.composite
def transcripts(draw: st.DrawFn, strays: bool = True) -> list[ChatMessage]:
    systems = draw(st.lists(_sizes, max_size=2))
    blocks = draw(_blocks)
    if not strays:
        blocks = [b for b in blocks if b[0] != "stray"]
    return _build(systems, blocks)


@st.composite
def transcripts_and_budgets(draw: st.DrawFn) -> tuple[list[ChatMessage], int]:
    messages = draw(transcripts())
    total = estimate_messages(messages)
    return messages, draw(st.integers(0, total + 10))


def _indices(output: Sequence[ChatMessage], messages: Sequence[ChatMessage]) -> list[int]:
    """Where each output message sits in the input (by identity); fails if one is not there."""
    position = {id(m): i for i, m in enumerate(messages)}
    assert all(id(m) in position for m in output), "truncation invented a message"
    return [position[id(m)] for m in output]


def _answers(previous: ChatMessage, results: ChatMessage) -> bool:
    if previous.role is not Role.ASSISTANT:
        return False
    call_ids = {c.id for c in previous.tool_calls}
    return all(
        p.tool_result.tool_call_id in call_ids
        for p in results.content
        if isinstance(p, ToolResultPart)
    )


def _anchor(messages: Sequence[ChatMessage], budget: int) -> int | None:
    """The task anchor's index: the first non-system message, if a user message that fits."""
    system_cost = estimate_messages([m for m in messages if m.role is Role.SYSTEM])
    first = next((i for i, m in enumerate(messages) if m.role is not Role.SYSTEM), None)
    if first is None or messages[first].role is not Role.USER:
        return None
    if system_cost + estimate_message(messages[first]) > budget:
        return None
    return first


def _expected(messages: Sequence[ChatMessage], budget: int) -> list[ChatMessage]:
    """The reference §1.8 recipe written out plainly, with every orphaned result dropped."""
    system = [i for i, m in enumerate(messages) if m.role is Role.SYSTEM]
    anchor = _anchor(messages, budget)
    spent = estimate_messages([messages[i] for i in system])
    if anchor is not None:
        spent += estimate_message(messages[anchor])
    tail: list[int] = []
    for i in reversed(range(len(messages))):
        if i in system or i == anchor:
            continue
        cost = estimate_message(messages[i])
        if spent + cost > budget:
            break
        spent += cost
        tail.append(i)
    kept = sorted([*system, *([anchor] if anchor is not None else []), *tail])
    out: list[ChatMessage] = []
    for i in kept:
        message = messages[i]
        if message.role is Role.TOOL and not (out and _answers(out[-1], message)):
            continue
        out.append(message)
    return out


# --- truncate_history properties -----------------------------------------------------------------
# One generated case is checked against every invariant: generating transcripts is the slow
# part, so the seed's separate properties share their examples.


def _check_subsequence(messages: list[ChatMessage], output: list[ChatMessage]) -> None:
    indices = _indices(output, messages)
    assert indices == sorted(set(indices)), "output is not a subsequence of the input"


def _check_system_messages_survive(messages: list[ChatMessage], output: list[ChatMessage]) -> None:
    system = [m for m in messages if m.role is Role.SYSTEM]
    kept = [m for m in output if m.role is Role.SYSTEM]
    assert len(kept) == len(system)
    assert all(a is b for a, b in zip(kept, system, strict=True))


def _check_never_exceeds_budget(
    messages: list[ChatMessage], output: list[ChatMessage], budget: int
) -> None:
    """Seed property ``truncation_never_exceeds_budget``."""
    system_cost = estimate_messages([m for m in messages if m.role is Role.SYSTEM])
    if system_cost <= budget:
        assert estimate_messages(output) <= budget
    else:
        # system messages alone exceed the budget: they are all that is sent
        assert all(m.role is Role.SYSTEM for m in output)


def _check_never_orphans_tool_results(output: list[ChatMessage]) -> None:
    """Seed property ``truncation_never_orphans_tool_results``."""
    first = next((m for m in output if m.role is not Role.SYSTEM), None)
    assert first is None or first.role is not Role.TOOL, "a tool result comes first"
    for i, message in enumerate(output):
        if message.role is Role.TOOL:
            assert i > 0, "the output starts with a tool result"
            assert _answers(output[i - 1], message), "a tool result lost its call"


def _check_task_anchor(messages: list[ChatMessage], output: list[ChatMessage], budget: int) -> None:
    anchor = _anchor(messages, budget)
    if anchor is not None:
        first = next(m for m in output if m.role is not Role.SYSTEM)
        assert first is messages[anchor], "the task anchor was dropped"


def _check_tail_is_contiguous(
    messages: list[ChatMessage], output: list[ChatMessage], budget: int
) -> None:
    """Between the oldest kept tail message and the end, only orphaned results are missing."""
    anchor = _anchor(messages, budget)
    kept = set(_indices(output, messages))
    tail = [i for i in kept if messages[i].role is not Role.SYSTEM and i != anchor]
    if not tail:
        return
    for i in range(min(tail), len(messages)):
        if i in kept or i == anchor or messages[i].role is Role.SYSTEM:
            continue
        assert messages[i].role is Role.TOOL, f"message {i} is missing from the kept tail"
        assert not (i - 1 in kept and _answers(messages[i - 1], messages[i]))
    last = len(messages) - 1
    assert last in kept or messages[last].role is Role.TOOL


@given(transcripts_and_budgets())
@settings(max_examples=200, deadline=None)
def test_truncation_properties(case: tuple[list[ChatMessage], int]) -> None:
    messages, budget = case
    output = truncate_history(messages, budget)
    _check_subsequence(messages, output)
    _check_system_messages_survive(messages, output)
    _check_never_exceeds_budget(messages, output, budget)
    _check_never_orphans_tool_results(output)
    _check_task_anchor(messages, output, budget)
    _check_tail_is_contiguous(messages, output, budget)
    # the exact answer, from the reference recipe written out independently
    assert _indices(output, messages) == _indices(_expected(messages, budget), messages)
    # precomputed costs give the same answer
    costs = [estimate_message(m) for m in messages]
    assert _indices(truncate_history(messages, budget, costs), messages) == _indices(
        output, messages
    )


@given(transcripts(strays=False))
@settings(max_examples=50, deadline=None)
def test_a_valid_transcript_that_fits_is_sent_whole(messages: list[ChatMessage]) -> None:
    output = truncate_history(messages, estimate_messages(messages))
    assert _indices(output, messages) == list(range(len(messages)))


def test_costs_passed_by_the_caller_are_used() -> None:
    messages = [ChatMessage.user("task"), ChatMessage.assistant("a"), ChatMessage.user("b")]
    # claimed costs make the middle message too big to keep, the newest fits
    output = truncate_history(messages, 20, costs=[5, 100, 5])
    assert output == [messages[0], messages[2]]


# --- truncate_history examples -------------------------------------------------------------------


def _round(call_id: str, arguments: str, result: str) -> list[ChatMessage]:
    call = ToolCall(id=call_id, name="search", arguments={"q": arguments})
    return [
        ChatMessage(role=Role.ASSISTANT, content=[ToolCallPart(tool_call=call)]),
        ChatMessage.tool_results([ToolResult(tool_call_id=call_id, content=result)]),
    ]


def test_truncation_keeps_the_task_and_drops_orphaned_results() -> None:
    system = ChatMessage.system("You are terse.")
    task = ChatMessage.user("Find the weather in Oslo.")
    call, result = _round("c1", "x" * 400, "4 degrees")
    answer = ChatMessage.assistant("It is 4 degrees.")
    follow_up = ChatMessage.user("And tomorrow?")
    messages = [system, task, call, result, answer, follow_up]
    # the budget fits everything but the big call: the tail starts at its result
    budget = estimate_messages([system, task, result, answer, follow_up])
    assert estimate_message(call) > 100

    output = truncate_history(messages, budget)

    assert output == [system, task, answer, follow_up]
    assert all(m.role is not Role.TOOL for m in output)
    assert estimate_messages(output) <= budget


def test_the_task_is_kept_even_when_the_middle_is_cut() -> None:
    task = ChatMessage.user("the task " * 10)
    rounds = [m for i in range(5) for m in _round(f"c{i}", "q" * 40, "r" * 40)]
    final = ChatMessage.user("continue")
    messages = [ChatMessage.system("sys"), task, *rounds, final]
    budget = estimate_messages([messages[0], task, *rounds[-2:], final])

    output = truncate_history(messages, budget)

    assert output == [messages[0], task, *rounds[-2:], final]


def test_a_task_that_does_not_fit_is_not_kept() -> None:
    system = ChatMessage.system("sys")
    task = ChatMessage.user("t" * 400)
    newest = ChatMessage.user("short")
    budget = estimate_messages([system, newest])
    assert truncate_history([system, task, newest], budget) == [system, newest]


def test_a_first_assistant_message_is_not_an_anchor() -> None:
    messages = [ChatMessage.assistant("a" * 80), ChatMessage.user("b"), ChatMessage.user("c")]
    budget = estimate_messages(messages[1:])
    assert truncate_history(messages, budget) == messages[1:]


def test_system_messages_over_budget_are_still_kept() -> None:
    system = ChatMessage.system("s" * 400)
    messages = [system, ChatMessage.user("task"), ChatMessage.assistant("answer")]
    assert truncate_history(messages, 10) == [system]
    assert truncate_history(messages, 0) == [system]


def test_zero_budget_without_system_sends_nothing() -> None:
    assert truncate_history([ChatMessage.user("hello")], 0) == []
    assert truncate_history([], 0) == []


def test_leading_results_are_dropped_even_when_everything_fits() -> None:
    *_, orphan = _round("gone", "q", "result")
    messages = [ChatMessage.system("sys"), orphan, ChatMessage.user("next")]
    output = truncate_history(messages, 10_000)
    assert output == [messages[0], messages[2]]


def test_tail_starting_with_a_result_keeps_later_answered_rounds() -> None:
    first_call, first_result = _round("c1", "a" * 200, "first")
    second_call, second_result = _round("c2", "b", "second")
    messages = [first_call, first_result, second_call, second_result]
    budget = estimate_messages(messages[1:])
    assert truncate_history(messages, budget) == [second_call, second_result]


# --- Budget ---------------------------------------------------------------------------------------


def test_budget_defaults() -> None:
    budget = Budget()
    assert (budget.max_steps, budget.max_tokens) == (10, 32_000)
    assert MIN_USEFUL_REMAINING == 512
    assert MAX_CALL_TOKENS == 4096


def test_budget_steps_exhaust_at_the_limit() -> None:
    budget = Budget(max_steps=3, max_tokens=10_000)
    assert budget.exhausted(2, TokenUsage()) is None
    assert budget.exhausted(3, TokenUsage()) == "steps"
    assert budget.exhausted(4, TokenUsage()) == "steps"


def test_budget_steps_are_reported_before_tokens() -> None:
    budget = Budget(max_steps=1, max_tokens=1_000)
    assert budget.exhausted(1, TokenUsage(input_tokens=1_000)) == "steps"


def test_budget_tokens_exhaust_below_the_useful_minimum() -> None:
    budget = Budget(max_steps=10, max_tokens=1_000)
    left_exactly = TokenUsage(input_tokens=1_000 - MIN_USEFUL_REMAINING - 10, output_tokens=10)
    assert budget.exhausted(0, left_exactly) is None
    one_short = TokenUsage(input_tokens=1_000 - MIN_USEFUL_REMAINING, output_tokens=1)
    assert budget.exhausted(0, one_short) == "tokens"
    assert budget.exhausted(0, TokenUsage(input_tokens=900, output_tokens=200)) == "tokens"
    # cache counts are part of input_tokens and are not charged again
    cached = TokenUsage(input_tokens=100, output_tokens=10, cache_read_tokens=400)
    assert budget.exhausted(0, cached) is None


def test_a_budget_that_could_never_make_a_call_is_refused() -> None:
    with pytest.raises(AgentError) as caught:
        Budget(max_tokens=MIN_USEFUL_REMAINING - 1)
    assert caught.value.kind is ErrorKind.CONFIG
    assert "max_tokens must be at least 512" in caught.value.message
    with pytest.raises(AgentError):
        Budget(max_steps=0)
    assert Budget(max_tokens=MIN_USEFUL_REMAINING).exhausted(0, TokenUsage()) is None


def test_budget_remaining_never_goes_negative() -> None:
    budget = Budget(max_tokens=1_000)
    assert budget.remaining(TokenUsage()) == 1_000
    assert budget.remaining(TokenUsage(input_tokens=300, output_tokens=200)) == 500
    assert budget.remaining(TokenUsage(input_tokens=900, output_tokens=200)) == 0


def test_output_cap() -> None:
    assert Budget.output_cap(32_000, 1_000) == MAX_CALL_TOKENS
    assert Budget.output_cap(5_000, 904) == MAX_CALL_TOKENS
    assert Budget.output_cap(5_000, 905) == 4_095
    assert Budget.output_cap(3_000, 1_000) == 2_000
    assert Budget.output_cap(1_000, 1_000) == 0
    assert Budget.output_cap(100, 200) <= 0


@given(st.integers(0, 100_000), st.integers(0, 100_000))
@settings(max_examples=50)
def test_output_cap_bounds(remaining: int, history: int) -> None:
    cap = Budget.output_cap(remaining, history)
    assert cap <= MAX_CALL_TOKENS
    assert cap <= remaining - history
    assert cap == MAX_CALL_TOKENS or cap == remaining - history


# --- the cost limit ------------------------------------------------------------------------


@tool
def work(n: int) -> int:
    """Work."""
    return n


def _priced_agent(model: ScriptedModel, max_cost_usd: float, **kwargs: Any) -> Agent[Any]:
    prices = Prices({"scripted": ModelPrice(input=1000.0, output=1000.0)}, table=False)
    return Agent(model, max_cost_usd=max_cost_usd, telemetry=Telemetry(prices=prices), **kwargs)


async def test_max_cost_usd_stops_the_run_at_most_one_call_past_it() -> None:
    # each call: 10 in + 5 out at $1000/MTok = $0.015; the limit is crossed by the 3rd call
    model = ScriptedModel([tool_call("work", {"n": i}) for i in range(10)])
    agent = _priced_agent(model, 0.04, tools=[work], max_steps=50)
    outcome = (await agent.run("go")).outcome
    assert isinstance(outcome, BudgetExhausted)
    assert outcome.reason == "cost"
    assert model.calls == 3
    assert outcome.usage.cost_usd == pytest.approx(0.045)
    assert outcome.usage.cost_usd - 0.04 <= 0.015 + 1e-12  # one call past it, at most


async def test_a_run_under_its_cost_limit_completes() -> None:
    outcome = (await _priced_agent(ScriptedModel(["hi"]), 1.0).run("go")).outcome
    assert outcome.status == "completed"
    assert outcome.usage.cost_usd == pytest.approx(0.015)


async def test_max_cost_usd_needs_priced_calls() -> None:
    agent = Agent(ScriptedModel(["hi"]), max_cost_usd=1.0)
    with pytest.raises(AgentError) as caught:
        await agent.run("go")
    assert caught.value.kind is ErrorKind.CONFIG
    assert "max_cost_usd" in caught.value.message
    assert "scripted" in caught.value.message


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_max_cost_usd_must_be_positive(bad: float) -> None:
    with pytest.raises(AgentError):
        Budget(max_cost_usd=bad)
