"""Token estimates, history truncation and the run's step/token budget.

Estimates are a guardrail, never billing: ``len(utf8) // 4`` per text, plus 4 tokens per
message. Spending is tracked from the usage providers report.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from agent_plugin.errors import AgentError
from agent_plugin.messages import (
    ChatMessage,
    Role,
    TextPart,
    TokenUsage,
    ToolCallPart,
    ToolResultPart,
)
from agent_plugin.outcomes import BudgetReason

__all__ = [
    "MAX_CALL_TOKENS",
    "MIN_USEFUL_REMAINING",
    "Budget",
    "estimate_message",
    "estimate_messages",
    "estimate_tokens",
    "truncate_history",
]

MIN_USEFUL_REMAINING: Final = 512
"""Below this many tokens left, another model call is not worth making."""

MAX_CALL_TOKENS: Final = 4096
"""The ceiling of one call's output cap."""

MESSAGE_OVERHEAD: Final = 4


def estimate_tokens(text: str) -> int:
    return len(text.encode()) // 4


def estimate_message(message: ChatMessage) -> int:
    """Estimated tokens of one message, its 4-token overhead included."""
    cost = MESSAGE_OVERHEAD
    for part in message.content:
        if isinstance(part, TextPart):
            cost += estimate_tokens(part.text)
        elif isinstance(part, ToolCallPart):
            call = part.tool_call
            arguments = call.raw_arguments
            if arguments is None:
                arguments = json.dumps(call.arguments, separators=(",", ":"), ensure_ascii=False)
            cost += estimate_tokens(call.name) + estimate_tokens(arguments)
        elif isinstance(part, ToolResultPart):
            cost += estimate_tokens(part.tool_result.content)
    return cost


def estimate_messages(messages: Sequence[ChatMessage]) -> int:
    return sum(estimate_message(m) for m in messages)


def truncate_history(
    messages: Sequence[ChatMessage],
    budget: int,
    costs: Sequence[int] | None = None,
) -> list[ChatMessage]:
    """The messages to send when the whole history may not fit in ``budget`` tokens.

    Keeps every system message (even past the budget: the caller then reports exhaustion),
    the task (the first non-system message, when it is a user message that fits), and the
    longest contiguous newest tail that fits; never sends a tool result whose call was cut.
    Order is preserved. ``costs`` are precomputed per-message estimates, if the caller has them.
    """
    if costs is None:
        costs = [estimate_message(m) for m in messages]
    if sum(costs) <= budget:
        return _drop_unanswered_results(list(messages))
    return _drop_unanswered_results([messages[i] for i in _fit(messages, budget, costs)])


def _fit(messages: Sequence[ChatMessage], budget: int, costs: Sequence[int]) -> list[int]:
    spent = 0
    system: list[int] = []
    for i, message in enumerate(messages):
        if message.role is Role.SYSTEM:
            system.append(i)
            spent += costs[i]
    anchor: list[int] = []
    first = next((i for i, m in enumerate(messages) if m.role is not Role.SYSTEM), None)
    if first is not None and messages[first].role is Role.USER and spent + costs[first] <= budget:
        anchor.append(first)
        spent += costs[first]
    tail: list[int] = []
    for i in range(len(messages) - 1, -1, -1):
        if i in anchor or messages[i].role is Role.SYSTEM:
            continue
        if spent + costs[i] > budget:
            break
        spent += costs[i]
        tail.append(i)
    return sorted([*system, *anchor, *tail])


def _drop_unanswered_results(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Drop any tool message that does not directly follow the assistant turn it answers.

    The gap between the task anchor and the kept tail can separate a tool result from its
    call; providers reject such a result, so it goes too (and so does a run of them).
    """
    out: list[ChatMessage] = []
    for message in messages:
        if message.role is Role.TOOL and not (out and _answers(out[-1], message)):
            continue
        out.append(message)
    return out


def _answers(previous: ChatMessage, results: ChatMessage) -> bool:
    if previous.role is not Role.ASSISTANT:
        return False
    call_ids = {c.id for c in previous.tool_calls}
    return all(
        p.tool_result.tool_call_id in call_ids
        for p in results.content
        if isinstance(p, ToolResultPart)
    )


@dataclass(frozen=True, slots=True)
class Budget:
    """The step, token and cost limits of one run.

    ``max_steps`` counts tool rounds (a final answer is free); ``max_tokens`` bounds the sum of
    the provider-reported usage of every call; ``max_cost_usd`` the sum of their cost (checked
    before each call, so a run spends at most one call past it; every call must be priced).
    """

    max_steps: int = 10
    max_tokens: int = 32_000
    max_cost_usd: float | None = None

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise AgentError.config(f"max_steps must be at least 1, got {self.max_steps}")
        if self.max_tokens < MIN_USEFUL_REMAINING:
            raise AgentError.config(
                f"max_tokens must be at least {MIN_USEFUL_REMAINING} (a model call needs room "
                f"to answer), got {self.max_tokens}"
            )
        if self.max_cost_usd is not None and not self.max_cost_usd > 0:
            raise AgentError.config(f"max_cost_usd must be positive, got {self.max_cost_usd}")

    def exhausted(self, steps_used: int, usage: TokenUsage) -> BudgetReason | None:
        """Why no further model call may be made, or ``None``."""
        if steps_used >= self.max_steps:
            return "steps"
        if self.max_tokens - usage.total() < MIN_USEFUL_REMAINING:
            return "tokens"
        if self.max_cost_usd is not None and (usage.cost_usd or 0.0) >= self.max_cost_usd:
            return "cost"
        return None

    def check_priced(self, usage: TokenUsage, model: str | None) -> None:
        """A ``config`` error when the run has a cost limit and a call came back unpriced."""
        if self.max_cost_usd is not None and usage.cost_usd is None:
            raise AgentError.config(
                f"max_cost_usd needs the price of every call, and model {model!r} has none: "
                f'install the cost extra (genai-prices) or set [agent.prices."{model}"]'
            )

    def remaining(self, usage: TokenUsage) -> int:
        return max(self.max_tokens - usage.total(), 0)

    @staticmethod
    def output_cap(remaining: int, history_tokens: int) -> int:
        """The call's ``max_tokens``: what is left after reserving the history, at most 4096."""
        return min(remaining - history_tokens, MAX_CALL_TOKENS)
