"""What a background run's record says about how far it is.

The record's progress moves at two kinds of moments. Before every model call it is written
with the checkpoint that precedes the call (:class:`ProgressAtCheckpoints`): ``step <n> of
<max>``, where ``n`` is the run's ``steps_used`` then. While a tool runs, the tool may report
how far it is (:meth:`~agent_plugin.tools.ToolContext.report_progress`);
:class:`ToolProgressWriter` writes those reports between the steps, at most a few a second,
and never behind a step's own progress. When the run ends, its record says the step it ended
on (a run paused after one round says ``step 1``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Final

from agent_plugin.errors import AgentError
from agent_plugin.events import ToolProgress
from agent_plugin.journal import Appended, JournalEntry, Replied, RoundDone, Started
from agent_plugin.outcomes import AgentOutcome

if TYPE_CHECKING:
    from agent_plugin.storage import SqlRunStore

__all__ = ["TOOL_PROGRESS_INTERVAL", "ProgressAtCheckpoints", "ToolProgressWriter", "progress_of"]

logger = logging.getLogger("agent_plugin.jobs")

TOOL_PROGRESS_INTERVAL: Final = 0.25
"""Seconds between two writes of a tool's progress to the run's record (the latest wins)."""


def progress_of(steps_used: int, max_steps: int) -> tuple[int, str]:
    """The percentage and message of a run at ``steps_used`` steps.

    ``min(steps, max) * 99 // max`` with ``max = max(max_steps, 1)`` (a run reads 100 only
    when it is complete), and ``"step <steps> of <max_steps>"``.
    """
    top = max(max_steps, 1)
    return min(steps_used, top) * 99 // top, f"step {steps_used} of {max_steps}"


class ProgressAtCheckpoints:
    """The run's progress, written with the checkpoint that comes before each model call.

    The model is asked only after a checkpoint of one of these: ``started`` (the run begins or
    resumes), ``round_done`` (a round of tool calls ended) or ``appended`` (steering joined),
    so writing ``progress_of(steps, max_steps)`` in the same transaction as those entries
    reports the progress before every model call without a transaction of its own.
    ``steps`` is what the latest ``started`` or ``replied`` entry counted: what the run's
    ``steps_used`` is when it next asks the model.
    """

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps
        self.steps = 0

    def __call__(self, entry: JournalEntry) -> tuple[int, str] | None:
        if isinstance(entry, Replied):
            self.steps = entry.steps_used
            return None
        if isinstance(entry, Started):
            self.steps = entry.state.steps_used
        elif not isinstance(entry, RoundDone | Appended):
            return None
        return progress_of(self.steps, self.max_steps)

    def of_tool(self, event: ToolProgress) -> tuple[int, str]:
        """A tool's report, as the run's progress: part of the way through the current step
        (the step the model's reply with the tool calls counted), and the tool's message."""
        top = max(self.max_steps, 1)
        done = min(max(self.steps - 1, 0) + event.fraction, top)
        said = event.message or f"{event.name} {round(event.fraction * 100)}%"
        return int(done * 99 / top), f"step {self.steps} of {self.max_steps}: {said}"

    def at_end(self, outcome: AgentOutcome) -> tuple[int, str]:
        """The progress of a run that ended with ``outcome``: the step it ended on."""
        return progress_of(outcome.steps_used, self.max_steps)


class ToolProgressWriter:
    """Writes a running tool's progress reports to the run's record, throttled.

    :meth:`report` never waits: the latest report is kept and one background task writes it,
    at most once per ``interval``, so a tool that reports a thousand times a second costs a
    few ``UPDATE`` s. The writes only move the progress forward (a report that lands after the
    step's own checkpoint changes nothing). Write errors are logged, never raised: progress
    never fails a run. :meth:`aclose` drops what is not written yet.
    """

    def __init__(
        self,
        store: SqlRunStore,
        run_id: str,
        rule: ProgressAtCheckpoints,
        *,
        interval: float = TOOL_PROGRESS_INTERVAL,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.rule = rule
        self.interval = interval
        self.writes = 0
        self._pending: tuple[int, str] | None = None
        self._task: asyncio.Task[None] | None = None
        self._last = float("-inf")

    def report(self, event: ToolProgress) -> None:
        self._pending = self.rule.of_tool(event)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._flush(), name=f"progress {self.run_id}")

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending is not None:
            wait = self._last + self.interval - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            pending, self._pending = self._pending, None
            if pending is None:
                return
            self._last = loop.time()
            pct, message = pending
            try:
                await self.store.progress(self.run_id, pct, message, forward_only=True)
            except AgentError as error:
                logger.warning("run %s: its progress was not written: %s", self.run_id, error)
            self.writes += 1

    async def aclose(self) -> None:
        self._pending = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
