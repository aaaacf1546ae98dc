"""One round of tool calls: every call the model asked for in one turn.

Per call, in order: the gate's verdict (denied / rejected / already finished calls are answered
without running), the JSON and schema checks, the ``before_tool`` hooks (continue, modify,
block, pause, cancel), the unknown-tool check, execution (bounded by the run deadline), then
the ``after_tool`` hooks. Every failure becomes an ``{"error": "..."}`` payload for the model.

Parallel rounds prepare every call first (so a pause or cancel from a hook happens before
anything runs), start them together and collect results in call order; sequential rounds run
the whole pipeline call by call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final

from agent_plugin.cancellation import CancelToken, RunCancelled, until_cancelled
from agent_plugin.errors import AgentError
from agent_plugin.events import AgentEvent, ToolFinished, ToolProgress, ToolStarted
from agent_plugin.hooks import Block, CancelRun, HookSet, Modify, PauseRun, ToolOutput
from agent_plugin.messages import TokenUsage, ToolCall
from agent_plugin.outcomes import Denied, Finished, PendingCall, Rejected
from agent_plugin.redaction import redact
from agent_plugin.spend import RunSpend, parent_spend
from agent_plugin.tools import (
    ProgressSink,
    Tool,
    ToolContext,
    ToolRegistry,
    ToolReturn,
    canonical_json,
    error_payload,
    truncate_chars,
)

__all__ = ["CANCEL_GRACE", "RoundResult", "ToolRound", "child_usage_sink", "error_output"]

CANCEL_GRACE: Final = 0.5
"""Seconds running tools get to finish after a cancel before their outcome is 'unknown'."""

DEADLINE_PAYLOAD: Final = "the tool did not finish before the run deadline"
UNKNOWN_PAYLOAD: Final = (
    "the run was cancelled while this call was running; whether it completed, and what it "
    "changed, is unknown"
)

UsageSink = Callable[[TokenUsage], None]

child_usage_sink: ContextVar[UsageSink | None] = ContextVar("child_usage_sink", default=None)
"""Where tools that run models of their own (sub-agents) report the tokens they spent.

A round sets it while its calls run (tool tasks copy the context, so parallel calls see it);
the run adds what is reported to its usage, so it counts against the run's token budget.
:class:`~agent_plugin.delegate.AgentTool` reports each child run once, when it has finished,
failed or been cancelled, and unsets the sink while the child runs, so a grandchild reports to
the child's loop, never straight to the grandparent.
"""

Answered = tuple[ToolCall, ToolOutput]
"""A call (as it was run: after hooks) and what the model will be told about it."""


def error_output(message: str) -> ToolOutput:
    return ToolOutput(error_payload(message), is_error=True)


@dataclass(slots=True)
class RoundResult:
    """The calls answered so far, in call order, and why the round stopped early (if it did).

    ``control`` is a hook's pause or cancel, seen before call ``len(answered)`` ran;
    ``cancelled`` means the run's cancel token fired while calls were running.
    """

    answered: list[Answered] = field(default_factory=list)
    control: PauseRun | CancelRun | None = None
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class _Ready:
    """A call that passed every check and hook and will be executed."""

    tool: Tool
    call: ToolCall


class ToolRound:
    """Runs rounds of gated calls for one run."""

    def __init__(
        self,
        *,
        tools: ToolRegistry,
        hooks: HookSet,
        output_limit: int,
        parallel: bool,
        run_id: str,
        session_id: str | None,
        deadline: float | None,
        cancel: CancelToken | None,
        emit: Callable[[AgentEvent], None] | None,
        on_child_usage: UsageSink | None = None,
        on_tool_done: Callable[[int, ToolCall, ToolOutput], Awaitable[None]] | None = None,
        traced: Callable[[ToolCall, Awaitable[ToolOutput]], Awaitable[ToolOutput]] | None = None,
        spend: RunSpend | None = None,
    ) -> None:
        self.traced = traced
        self.spend = spend
        """The run's spending windows, which its sub-agents spend from too."""
        self.on_child_usage = on_child_usage
        self.on_tool_done = on_tool_done
        self.tools = tools
        self.hooks = hooks
        self.output_limit = output_limit
        self.parallel = parallel
        self.run_id = run_id
        self.session_id = session_id
        self.deadline = deadline
        self.cancel = cancel
        self.emit = emit

    async def run(self, pending: list[PendingCall], step: int) -> RoundResult:
        token = child_usage_sink.set(self.on_child_usage)
        spending = parent_spend.set(self.spend)
        try:
            return await self._run(pending, step)
        finally:
            parent_spend.reset(spending)
            child_usage_sink.reset(token)

    async def _run(self, pending: list[PendingCall], step: int) -> RoundResult:
        contexts = [
            ToolContext(
                run_id=self.run_id,
                call_id=p.call.id,
                session_id=self.session_id,
                step=step,
                progress=self._progress_of(p.call),
            )
            for p in pending
        ]
        sequential = not self.parallel or any(
            (tool := self.tools.get(p.call.name)) is not None and tool.sequential for p in pending
        )
        if sequential or len(pending) == 1:
            return await self._one_by_one(pending, contexts)
        return await self._together(pending, contexts)

    def _progress_of(self, call: ToolCall) -> ProgressSink | None:
        """The call's progress reports, as ``tool_progress`` events on the run's stream."""
        emit = self.emit
        if emit is None:
            return None

        def report(fraction: float, message: str | None) -> None:
            emit(
                ToolProgress(
                    run_id=self.run_id,
                    call_id=call.id,
                    name=call.name,
                    fraction=fraction,
                    message=message,
                )
            )

        return report

    async def _one_by_one(
        self, pending: list[PendingCall], contexts: list[ToolContext]
    ) -> RoundResult:
        result = RoundResult()
        for position, (item, ctx) in enumerate(zip(pending, contexts, strict=True)):
            prepared = await self._prepare(item, ctx)
            if isinstance(prepared, PauseRun | CancelRun):
                result.control = prepared
                return result
            call = prepared.call if isinstance(prepared, _Ready) else prepared[0]
            self._started(call)
            if isinstance(prepared, _Ready):
                try:
                    output = await until_cancelled(
                        self._invoke(prepared, ctx, position), self.cancel
                    )
                except RunCancelled:
                    output = error_output(UNKNOWN_PAYLOAD)
                    self._report(call, output)
                    result.answered.append((call, output))
                    result.cancelled = True
                    return result
            else:
                output = prepared[1]
            await self._finished(call, output, ctx)
            result.answered.append((call, output))
        return result

    async def _together(
        self, pending: list[PendingCall], contexts: list[ToolContext]
    ) -> RoundResult:
        prepared_all: list[_Ready | Answered] = []
        for item, ctx in zip(pending, contexts, strict=True):
            prepared = await self._prepare(item, ctx)
            if isinstance(prepared, PauseRun | CancelRun):
                return RoundResult(control=prepared)
            prepared_all.append(prepared)
        for prepared in prepared_all:
            self._started(prepared.call if isinstance(prepared, _Ready) else prepared[0])
        tasks = {
            i: asyncio.ensure_future(self._invoke(p, contexts[i], i))
            for i, p in enumerate(prepared_all)
            if isinstance(p, _Ready)
        }
        cancelled = await self._wait(list(tasks.values())) if tasks else False
        result = RoundResult(cancelled=cancelled)
        for i, prepared in enumerate(prepared_all):
            if not isinstance(prepared, _Ready):
                result.answered.append(prepared)
                continue
            task = tasks[i]
            done = task.done() and not task.cancelled()
            output = task.result() if done else error_output(UNKNOWN_PAYLOAD)
            result.answered.append((prepared.call, output))
        for (call, output), ctx in zip(result.answered, contexts, strict=True):
            if cancelled:
                self._report(call, output)  # no more hooks once the run is cancelled
            else:
                await self._finished(call, output, ctx)
        return result

    async def _wait(self, tasks: list[asyncio.Future[ToolOutput]]) -> bool:
        """Wait for every task; if the run is cancelled first, give the rest a grace period
        and report ``True``."""
        if self.cancel is None:
            await asyncio.wait(tasks)
            return False
        waiter = asyncio.ensure_future(self.cancel.wait())
        try:
            remaining: set[asyncio.Future[Any]] = set(tasks)
            while remaining:
                done, _ = await asyncio.wait(
                    remaining | {waiter}, return_when=asyncio.FIRST_COMPLETED
                )
                remaining -= done
                if waiter in done:
                    break
            else:
                return False
        finally:
            waiter.cancel()
        unfinished = [t for t in tasks if not t.done()]
        for task in unfinished:
            task.cancel()
        if unfinished:
            await asyncio.wait(unfinished, timeout=CANCEL_GRACE)
        return True

    async def _prepare(
        self, item: PendingCall, ctx: ToolContext
    ) -> _Ready | Answered | PauseRun | CancelRun:
        """Apply the gate's verdict, the argument checks and the ``before_tool`` hooks."""
        call = item.call
        status = item.status
        if isinstance(status, Finished):
            return call, ToolOutput(status.content, status.is_error)
        if isinstance(status, Denied):
            return call, error_output(f"denied by policy: {status.reason}")
        if isinstance(status, Rejected):
            return call, error_output(f"a reviewer rejected this call: {status.reason}")
        if call.raw_arguments is not None:
            return call, error_output(f"tool arguments were not valid JSON: {_json_error(call)}")
        tool = self.tools.get(call.name)
        if tool is not None and (problem := tool.validate(call.arguments)) is not None:
            return call, error_output(f"schema validation failed: {problem}")
        modified = False
        for before in self.hooks.before_tool:
            verdict = await before(call, ctx)
            if isinstance(verdict, Modify):
                call = call.model_copy(update={"arguments": verdict.arguments})
                modified = True
            elif isinstance(verdict, Block):
                return call, error_output(f"blocked by hook: {verdict.reason}")
            elif isinstance(verdict, PauseRun | CancelRun):
                return verdict
        if tool is None:
            return call, error_output(f'unknown tool "{call.name}"')
        if modified and (problem := tool.validate(call.arguments)) is not None:
            return call, error_output(f"schema validation failed: {problem}")
        return _Ready(tool, call)

    async def _invoke(self, ready: _Ready, ctx: ToolContext, position: int) -> ToolOutput:
        """Execute one call and journal its result as soon as it is known."""
        execution = self._execute(ready, ctx)
        traced = self.traced
        output = await (execution if traced is None else traced(ready.call, execution))
        if self.on_tool_done is not None:
            await self.on_tool_done(position, ready.call, output)
        return output

    async def _execute(self, ready: _Ready, ctx: ToolContext) -> ToolOutput:
        """Execute one call; every failure becomes an error payload for the model."""
        try:
            if self.deadline is None:
                value = await ready.tool.execute(ready.call.arguments, ctx)
            else:
                async with asyncio.timeout_at(self.deadline) as scope:
                    try:
                        value = await ready.tool.execute(ready.call.arguments, ctx)
                    except TimeoutError:
                        if scope.expired():
                            raise
                        return error_output("the tool timed out")
        except TimeoutError:
            return error_output(DEADLINE_PAYLOAD)
        except AgentError as error:
            return error_output(error.message)
        except Exception as error:  # a tool's failure is information for the model
            return error_output(str(error) or type(error).__name__)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # the run, or whoever awaits it, is being cancelled
            # nothing cancels this task: the tool's own (an inner task of it was cancelled),
            # which would otherwise end the whole run as if it were cancelled
            return error_output("the tool failed: CancelledError")
        terminate = False
        if isinstance(value, ToolReturn):
            terminate = value.terminate
            value = value.value
        try:
            content = canonical_json(value)
        except AgentError as error:
            return error_output(error.message)
        return ToolOutput(truncate_chars(content, self.output_limit), False, terminate)

    def _started(self, call: ToolCall) -> None:
        if self.emit is not None:
            self.emit(
                ToolStarted(
                    run_id=self.run_id,
                    call_id=call.id,
                    name=call.name,
                    arguments=redact(call.arguments),
                )
            )

    async def _finished(self, call: ToolCall, output: ToolOutput, ctx: ToolContext) -> None:
        for after in self.hooks.after_tool:
            await after(call, output, ctx)
        self._report(call, output)

    def _report(self, call: ToolCall, output: ToolOutput) -> None:
        if self.emit is not None:
            self.emit(
                ToolFinished(
                    run_id=self.run_id,
                    call_id=call.id,
                    name=call.name,
                    content=output.content,
                    is_error=output.is_error,
                    terminate=output.terminate,
                )
            )


def _json_error(call: ToolCall) -> str:
    try:
        json.loads(call.raw_arguments or "")
    except ValueError as error:
        return str(error)
    return "not a JSON value"
