"""A run's messages with their estimated tokens: what each request sends, within budget.

The estimates are kept beside the messages, so a step's history costs a sum it already
has, not an estimate of every message again. The first :attr:`Transcript.history_length`
messages are the history the run was given (a session's); a fold replaces the head of that
history with one summary and leaves the run's own messages as they are.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agent_plugin.budget import estimate_message, truncate_history
from agent_plugin.cancellation import CancelToken, until_cancelled
from agent_plugin.errors import AgentError
from agent_plugin.messages import ChatMessage

if TYPE_CHECKING:
    from agent_plugin.compaction import Compaction, CompactionResult
    from agent_plugin.outcomes import Folded
    from agent_plugin.providers.base import LlmClient

logger = logging.getLogger("agent_plugin")

__all__ = ["Transcript"]


class Transcript:
    """The messages of one run or resume, their token estimates, and what was folded."""

    __slots__ = ("costs", "folded", "history_length", "messages", "total_cost")

    def __init__(
        self, messages: list[ChatMessage], *, history_length: int, folded: Folded | None
    ) -> None:
        self.messages = messages
        self.costs = [estimate_message(m) for m in messages]
        self.total_cost = sum(self.costs)
        self.history_length = history_length
        self.folded = folded

    def append(self, message: ChatMessage) -> None:
        cost = estimate_message(message)
        self.messages.append(message)
        self.costs.append(cost)
        self.total_cost += cost

    def window(
        self, system: ChatMessage | None, system_cost: int, remaining: int
    ) -> tuple[list[ChatMessage], int]:
        """The messages to send after ``system`` and their estimated tokens, truncated to
        ``remaining`` when all of them would not fit."""
        head = [system] if system is not None else []
        total = system_cost + self.total_cost
        if total <= remaining:
            return [*head, *self.messages], total
        costs = [system_cost] * len(head) + self.costs
        history = truncate_history([*head, *self.messages], remaining, costs)
        return history, sum(estimate_message(m) for m in history)

    def fold(self, result: CompactionResult) -> None:
        """Replace the messages ``result`` summarized with its summary, and count them in
        :attr:`folded` (a run folded twice reports both folds as one)."""
        from agent_plugin.compaction import summary_message
        from agent_plugin.outcomes import CompactionReport, Folded

        split = result.split
        before = self.folded.report.summarized_messages - 1 if self.folded is not None else 0
        self.messages[:split] = [summary_message(result.summary)]
        self.costs[:split] = [estimate_message(self.messages[0])]
        self.total_cost = sum(self.costs)
        self.history_length -= split - 1
        report = result.report
        self.folded = Folded(
            summary=result.summary,
            report=CompactionReport(
                summarized_messages=before + split,
                tokens_before=report.tokens_before,
                tokens_after=report.tokens_after,
                usage=report.usage,
            ),
        )

    async def fold_history(
        self, compaction: Compaction, model: LlmClient, cancel: CancelToken | None
    ) -> CompactionResult | None:
        """Fold the head of the history the run was given into one summary (the run's own
        messages are kept), as a context overflow needs; ``None`` when nothing was folded (no
        history, nothing to fold, or the summary could not be made: logged)."""
        if self.history_length < 1:
            return None
        summarize = compaction.compact(
            model, self.messages, force=True, keep_from=self.history_length
        )
        try:
            result = await until_cancelled(summarize, cancel)
        except AgentError as error:
            logger.warning("the history could not be folded: %s", error)
            return None
        if result is not None:
            self.fold(result)
        return result
