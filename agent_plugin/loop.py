"""The loop of one run: call the model, gate and run the tools it asks for, repeat within budgets.

One iteration of a run::

    deadline? cancelled? budget left?  ->  truncate history, cap the output
    before_model hooks  ->  model call  ->  after_model hooks
    no tool calls       ->  record the answer, complete (or report token overshoot); a typed
                            output judges it: accepted, sent back to be fixed (a step), or
                            out of retries (``output_invalid``)
    tool calls          ->  record them (one step, unless they are all final-result calls),
                            gate each with the policy, pause for approval, or run the round
                            and append one tool message (final results judged there)

Budgets, the loop guard, the policy and the output are small objects this module calls; the
messages and their token estimates are a :class:`~agent_plugin.transcript.Transcript`, the
model call a :class:`~agent_plugin.model_call.ModelCaller`, the turn-level hooks
:mod:`agent_plugin.turns` and a round of tool calls a :class:`~agent_plugin.rounds.ToolRound`.
:class:`RunLoop` is the mutable state of one run or resume; what it needs of its agent is
:class:`LoopAgent` (:class:`~agent_plugin.agent.Agent` is one).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

from pydantic import JsonValue

from agent_plugin.budget import Budget
from agent_plugin.cancellation import RunCancelled
from agent_plugin.errors import AgentError, ErrorInfo, ErrorKind
from agent_plugin.events import (
    ApprovalRequired,
    Compacted,
    ModelRequestStarted,
    ModelResponded,
    RunEnded,
    RunStarted,
    Steered,
    TurnEnded,
    TurnStarted,
    pending_approvals,
    public_message,
)
from agent_plugin.hooks import (
    CancelRun,
    HookSet,
    PauseRun,
    RunControl,
    ToolOutput,
    TurnInfo,
)
from agent_plugin.logs import run_context
from agent_plugin.loop_guard import LoopGuard, LoopTracker, Stop, Warn, warning_note
from agent_plugin.messages import (
    ChatMessage,
    Role,
    TokenUsage,
    ToolCall,
    ToolDefinition,
    ToolResult,
    text_of,
    tool_calls_of,
    unique_call_ids,
)
from agent_plugin.model_call import DeadlinePassed, Interrupted, ModelCaller
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import (
    AgentOutcome,
    AgentTurn,
    Allowed,
    AwaitingApproval,
    BudgetExhausted,
    BudgetReason,
    Cancelled,
    Completed,
    Denied,
    Finished,
    Folded,
    LoopDetected,
    NeedsApproval,
    OutputInvalid,
    Paused,
    PendingCall,
    RunInfo,
    RunState,
    TurnSettings,
)
from agent_plugin.pacing import Pacer
from agent_plugin.policy import Deny, RequireApproval, ToolPolicy
from agent_plugin.providers.base import (
    ChatRequest,
    ChatResponse,
    LlmClient,
)
from agent_plugin.rounds import ToolRound
from agent_plugin.spend import Spending, WindowExhausted
from agent_plugin.tools import (
    ToolRegistry,
    error_payload,
)
from agent_plugin.transcript import Transcript
from agent_plugin.turns import TurnPlan, ask_turn_hooks

if TYPE_CHECKING:  # these load on first use, not with the core
    from agent_plugin.compaction import Compaction
    from agent_plugin.output import (
        Invalid,
        Output,
        OutputContext,
        OutputRun,
        Valid,
    )
    from agent_plugin.telemetry import Telemetry


__all__ = ["LoopAgent", "RunLoop"]

logger = logging.getLogger("agent_plugin")

_NOT_RUN: Final = error_payload("the run was cancelled before this call ran")


class LoopAgent(Protocol):
    """What a run's loop reads of its agent (an :class:`~agent_plugin.agent.Agent`)."""

    @property
    def model(self) -> LlmClient: ...

    @property
    def tools(self) -> ToolRegistry: ...

    @property
    def budget(self) -> Budget: ...

    @property
    def hook_set(self) -> HookSet: ...

    @property
    def policy(self) -> ToolPolicy: ...

    @property
    def loop_guard(self) -> LoopGuard: ...

    @property
    def max_duration(self) -> float | None: ...

    @property
    def parallel_tool_calls(self) -> bool: ...

    @property
    def per_tool_output_limit(self) -> int: ...

    @property
    def temperature(self) -> float | None: ...

    @property
    def output(self) -> Output[Any] | None: ...

    @property
    def output_label(self) -> str | None: ...

    @property
    def compaction(self) -> Compaction | None: ...

    @property
    def locked(self) -> bool: ...

    @property
    def telemetry(self) -> Telemetry: ...

    @property
    def spending(self) -> Spending | None: ...

    @property
    def pacer(self) -> Pacer | None: ...

    def definitions(self) -> tuple[ToolDefinition, ...]: ...

    async def system_message(self) -> ChatMessage | None: ...


class RunLoop:
    """The mutable state of one run or resume, and the loop that drives it."""

    def __init__(
        self,
        agent: LoopAgent,
        options: RunOptions,
        *,
        run_id: str,
        session_id: str | None,
        messages: list[ChatMessage],
        usage: TokenUsage,
        steps_used: int,
        tracker: LoopTracker,
        history_length: int,
        session_version: int | None,
        pending: list[PendingCall] | None = None,
        output_retries: int = 0,
        folded: Folded | None = None,
        turn_settings: TurnSettings | None = None,
        paused_trace: dict[str, str] | None = None,
    ) -> None:
        self.agent = agent
        self.telemetry = agent.telemetry.run(
            run_id=run_id, session_id=session_id, client=agent.model
        )
        self.paused_trace = paused_trace
        self.output: OutputRun | None = None
        if agent.output is not None:
            from agent_plugin.output import OutputRun

            self.output = OutputRun(agent.output, output_retries)
        self.journal = options.journal
        self.steering = options.steering
        self.initial_pending = pending or []
        self.session_version = session_version
        self.run_id = run_id
        self.session_id = session_id
        self.transcript = Transcript(messages, history_length=history_length, folded=folded)
        self.messages = messages  # the transcript's list, read on every step
        self.usage = usage
        self.steps_used = steps_used
        self.tracker = tracker
        self.cancel = options.cancel
        self.emit = options.on_event
        self.streaming = options.stream
        self.hooks = agent.hook_set
        self.compaction = (
            None if options.compaction is False else options.compaction or agent.compaction
        )
        self.turn_settings = turn_settings
        self.plan = TurnPlan()
        """The system prompt and the tools offered under :attr:`turn_settings`."""
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.deadline = loop.time() + agent.max_duration if agent.max_duration else None
        self.caller = ModelCaller(
            agent.model,
            run_id=run_id,
            telemetry=self.telemetry,
            output=agent.output,
            streaming=options.stream,
            emit=self.emit,
            deadline=self.deadline,
            cancel=self.cancel,
            steering=self.steering,
            refold=self.refold,
            pacer=agent.pacer,
            spending=agent.spending,
        )
        self.rounds = ToolRound(
            tools=agent.tools,
            hooks=self.hooks,
            output_limit=agent.per_tool_output_limit,
            parallel=agent.parallel_tool_calls,
            run_id=run_id,
            session_id=session_id,
            deadline=self.deadline,
            cancel=self.cancel,
            emit=self.emit,
            on_child_usage=self.add_usage,
            on_tool_done=self.tool_done if self.journal is not None else None,
            traced=self.telemetry.tool if self.telemetry.active else None,
            spend=self.caller.spend,
        )

    # --- bookkeeping -----------------------------------------------------------------------

    def info(self) -> RunInfo:
        return RunInfo(
            run_id=self.run_id,
            session_id=self.session_id,
            steps_used=self.steps_used,
            max_steps=self.agent.budget.max_steps,
            usage=self.usage,
        )

    async def take_steering(self) -> None:
        assert self.steering is not None
        messages = self.steering.drain()
        for message in messages:
            self.append(message)
        if self.journal is not None:
            from agent_plugin.journal import Appended

            await self.journal.record(Appended(messages=messages))
        if self.emit is not None:
            self.emit(Steered(run_id=self.run_id, messages=[m.text for m in messages]))

    async def take_followup(self) -> bool:
        """Let the next follow-up join a run that would end (``False``: none waits)."""
        if self.steering is None or not self.steering.following:
            return False
        messages = self.steering.take_followup()
        for message in messages:
            self.append(message)
        if self.journal is not None:
            from agent_plugin.journal import Appended

            await self.journal.record(Appended(messages=messages))
        if self.emit is not None:
            texts = [m.text for m in messages]
            self.emit(Steered(run_id=self.run_id, messages=texts, mode="followup"))
        return True

    async def tool_done(self, position: int, call: ToolCall, output: ToolOutput) -> None:
        assert self.journal is not None
        from agent_plugin.journal import ToolDone

        await self.journal.record(
            ToolDone(
                step=max(self.steps_used - 1, 0),
                position=position,
                call_id=call.id,
                content=output.content,
                is_error=output.is_error,
            )
        )

    def add_usage(self, usage: TokenUsage) -> None:
        """Tokens spent for this run elsewhere (sub-agents): they count against its budget."""
        self.usage = self.usage + usage

    def append(self, message: ChatMessage) -> None:
        self.transcript.append(message)

    def state(self, pending: list[PendingCall]) -> RunState:
        return RunState(
            run_id=self.run_id,
            session_id=self.session_id,
            messages=list(self.messages),
            usage=self.usage,
            steps_used=self.steps_used,
            pending=pending,
            recent_calls=self.tracker.recent,
            history_length=self.transcript.history_length,
            session_version=self.session_version,
            output=self.agent.output_label,
            output_retries=self.output.retries_used if self.output is not None else 0,
            folded=self.transcript.folded,
            turn_settings=self.turn_settings,
            trace=self.telemetry.carrier(),
        )

    def output_context(self) -> OutputContext:
        from agent_plugin.output import OutputContext

        assert self.output is not None
        return OutputContext(
            run_id=self.run_id,
            session_id=self.session_id,
            steps_used=self.steps_used,
            usage=self.usage,
            retries=self.output.retries_used,
            messages=tuple(self.messages),
        )

    def completed(self, text: str, verdict: Valid[Any] | None = None) -> Completed:
        if verdict is None:
            return Completed(text=text, steps_used=self.steps_used, usage=self.usage)
        return Completed(
            text=verdict.text, output=verdict.value, steps_used=self.steps_used, usage=self.usage
        )

    def invalid(self, verdict: Invalid) -> OutputInvalid:
        retries = self.output.retries_used if self.output is not None else 0
        return OutputInvalid(
            message=verdict.problems,
            retries=retries,
            steps_used=self.steps_used,
            usage=self.usage,
        )

    async def sent_back(self, verdict: Invalid) -> LoopDetected | None:
        """Answer a rejected text reply with the problems (the loop guard sees the answer
        like a call: the same answer rejected the same way is a loop)."""
        assert self.output is not None
        problems = verdict.problems
        repeat = self.tracker.record("", self.messages[-1].text, problems)
        if isinstance(repeat, Stop):
            return LoopDetected(
                tool="", repeats=repeat.repeats, steps_used=self.steps_used, usage=self.usage
            )
        repeats = repeat.repeats if isinstance(repeat, Warn) else None
        message = self.output.retry_message(problems, repeats=repeats)
        self.append(message)
        if self.journal is not None:
            from agent_plugin.journal import Appended

            await self.journal.record(Appended(messages=[message]))
        return None

    def exhausted(self, reason: BudgetReason, window: str | None = None) -> BudgetExhausted:
        return BudgetExhausted(
            reason=reason, window=window, steps_used=self.steps_used, usage=self.usage
        )

    def cancelled(self) -> Cancelled:
        reason = self.cancel.reason if self.cancel is not None else "cancelled"
        return Cancelled(reason=reason, steps_used=self.steps_used, usage=self.usage)

    def deadline_passed(self) -> bool:
        return self.deadline is not None and self.loop.time() >= self.deadline

    # --- the run as a whole ----------------------------------------------------------------

    async def execute(self, body: Awaitable[AgentOutcome], *, resumed: bool) -> AgentTurn:
        """Run ``body`` between ``run_start`` and exactly one ``run_end``."""
        with run_context(self.run_id, self.session_id):
            try:
                return await self.telemetry.run(
                    self._execute(body, resumed=resumed),
                    resumed=resumed,
                    pending=self.initial_pending,
                    paused_trace=self.paused_trace,
                )
            finally:
                # the rounds call back into this loop: cut the cycle, so the run's state goes
                # with its last reference rather than waiting for a full garbage collection
                self.rounds.on_child_usage = self.rounds.on_tool_done = None

    async def _execute(self, body: Awaitable[AgentOutcome], *, resumed: bool) -> AgentTurn:
        emit = self.emit
        if emit is not None:
            emit(RunStarted(run_id=self.run_id, session_id=self.session_id, resumed=resumed))
        try:
            self.plan.start(await self.agent.system_message())  # per run: may need I/O
            if self.turn_settings is not None:
                self.settle()
            await self.started(self.initial_pending)
            outcome = await body
            for hook in self.hooks.on_outcome:
                await hook(outcome, self.info())
        except AgentError as error:
            if emit is not None:
                emit(RunEnded(run_id=self.run_id, error=error.info()))
            raise
        except asyncio.CancelledError:
            if emit is not None:
                emit(RunEnded.of(self.run_id, self.cancelled()))
            raise
        except Exception as error:
            if emit is not None:
                message = f"{type(error).__name__}: {error}"
                emit(
                    RunEnded(
                        run_id=self.run_id,
                        error=ErrorInfo(kind=ErrorKind.INTERNAL, message=message),
                    )
                )
            raise
        if emit is not None:
            emit(RunEnded.of(self.run_id, outcome))
        return AgentTurn(
            outcome=outcome,
            messages=list(self.messages),
            history_length=self.transcript.history_length,
            folded=self.transcript.folded,
        )

    async def continue_from(self, pending: list[PendingCall]) -> AgentOutcome:
        """Resume: finish the paused round (if any), then drive on."""
        last = self.messages[-1] if self.messages else None
        if pending:
            outcome = await self.round(pending)
            if outcome is None and self.hooks.after_turn:
                outcome = await self.resumed_turn_over()
        elif last is not None and last.role is Role.ASSISTANT and last.tool_calls:
            outcome = await self.gate_and_run(last.tool_calls, reply_recorded=True)
            if outcome is None and self.hooks.after_turn:
                outcome = await self.resumed_turn_over()
        elif last is not None and last.role is Role.ASSISTANT:
            # recovered after the final answer was recorded: judge it (again) and end
            outcome = await self.conclude(await self.judge(last.text), last.text)
        elif self.output is not None and (accepted := self.output.accepted(self.messages)):
            return self.completed("", accepted)  # recovered after the final result's round
        else:
            outcome = None
        if outcome is not None:
            return outcome
        return await self.drive()

    async def judge(self, text: str) -> Valid[Any] | Invalid | None:
        """The output's verdict on a final answer in text (``None``: plain text, nothing to
        judge); sending it back to be fixed is a step."""
        if self.output is None:
            return None
        verdict = await self.output.check_text(text, self.output_context())
        if not verdict.accepted and not verdict.final:
            self.steps_used += 1
        return verdict

    async def conclude(
        self, verdict: Valid[Any] | Invalid | None, text: str
    ) -> AgentOutcome | None:
        """How a final answer ends the run (``None``: sent back, the run goes on)."""
        if verdict is None or verdict.accepted:
            return self.completed(text, verdict)
        if verdict.final:
            return self.invalid(verdict)
        return await self.sent_back(verdict)

    async def drive(self) -> AgentOutcome:
        agent = self.agent
        budget = agent.budget
        caller = self.caller
        while True:
            if self.deadline_passed():
                return self.exhausted("deadline")
            if self.cancel is not None and self.cancel.cancelled:
                return self.cancelled()
            reason = budget.exhausted(self.steps_used, self.usage)
            if reason is not None:
                return self.exhausted(reason)
            if self.steering is not None and self.steering.pending:
                await self.take_steering()
            remaining = budget.remaining(self.usage)
            history, history_tokens = self.history(remaining)
            if history_tokens > remaining or not any(m.role is not Role.SYSTEM for m in history):
                return self.exhausted("tokens")
            output_cap = budget.output_cap(remaining, history_tokens)
            if output_cap <= 0:
                return self.exhausted("tokens")

            step = self.steps_used
            if self.emit is not None:
                self.emit(TurnStarted(run_id=self.run_id, step=step))
            request = ChatRequest(
                messages=history,
                tools=agent.definitions() if self.plan.offered is None else self.plan.offered,
                response_format=agent.output.response_format if agent.output else None,
                max_tokens=output_cap,
                temperature=agent.temperature,
                deadline=self.deadline,
                on_retry=caller.on_retry if caller.observes_retries else None,
                on_fallback=caller.on_fallback,
            )
            if self.turn_settings is not None:
                request.model = self.turn_settings.model
                request.extra_body = dict(self.turn_settings.extra_body)
            hooks = self.hooks
            # what the model hooks are told, made only when there are any (it would otherwise
            # be one more object alive across every model call)
            info = self.info() if hooks.before_model or hooks.after_model else None
            for before in hooks.before_model:
                control = await before(request, info)
                if control is not None:
                    return self.stop(control, [])
            if self.emit is not None:
                self.emit(
                    ModelRequestStarted(
                        run_id=self.run_id,
                        step=step,
                        message_count=len(request.messages),
                        max_tokens=request.max_tokens,
                    )
                )
            try:
                response = await caller.answer(request)
            except DeadlinePassed:
                return self.exhausted("deadline")
            except RunCancelled:
                return self.cancelled()
            except Interrupted:
                continue  # the message joins at the top, and the model is asked again
            except WindowExhausted as spent:
                return self.exhausted("window", spent.window)
            control = None
            for after in hooks.after_model:
                control = await after(response, info) or control

            self.usage = self.usage + response.usage
            budget.check_priced(response.usage, response.model or self.telemetry.model)
            overshoot = self.usage.total() > budget.max_tokens
            content = unique_call_ids(response.content)
            calls = tool_calls_of(content)
            message = ChatMessage(role=Role.ASSISTANT, content=content)
            turn_from = len(self.messages)
            if not calls:
                self.append(message)
                self.responded(step, message, response)
                steered = self.steering is not None and self.steering.pending
                text = text_of(content)
                verdict = None if overshoot or steered else await self.judge(text)
                await self.replied(step, message, [])
                if overshoot:
                    return self.exhausted("tokens")
                if hooks.after_turn:
                    after = await self.turn_hooks(step, turn_from, response.usage)
                    if after == "stop":
                        return self.stopped(text, verdict)
                    if after == "more":
                        continue  # a hook added messages: they force another turn
                if steered:
                    continue  # a message arrived while the model answered: steering wins
                outcome = await self.conclude(verdict, text)
                if isinstance(outcome, Completed) and await self.take_followup():
                    continue  # the run would end: a follow-up continues it instead
                if outcome is not None:
                    return outcome
                continue
            if overshoot:
                # tool calls without results would corrupt the transcript: not recorded
                self.responded(step, message, response)
                return self.exhausted("tokens")
            if self.output is None or not self.output.only_final(calls):
                self.steps_used += 1  # a tool round; a final answer alone is free, as in text
            self.append(message)
            self.responded(step, message, response)
            if isinstance(control, CancelRun):
                self.record_cancelled([PendingCall(call=c, status=_ALLOWED) for c in calls], [])
                return self.stop(control, [])
            if control is not None:
                return self.stop(control, [])
            outcome = await self.gate_and_run(calls, step=step)
            if self.emit is not None:
                self.emit(TurnEnded(run_id=self.run_id, step=step))
            if outcome is not None:
                return outcome
            if (
                hooks.after_turn
                and await self.turn_hooks(step, turn_from, response.usage) == "stop"
            ):
                return self.stopped(text_of(content), None)

    def history(self, remaining: int) -> tuple[list[ChatMessage], int]:
        """The messages to send and their estimated tokens, within ``remaining``."""
        plan = self.plan
        return self.transcript.window(plan.system, plan.system_cost, remaining)

    # --- turn-level hooks ------------------------------------------------------------------

    async def turn_hooks(
        self, step: int, start: int, usage: TokenUsage
    ) -> Literal["stop", "more"] | None:
        """Ask the turn-level hooks about the turn whose messages start at ``start``: ``stop``
        (the run ends), ``more`` (they added messages: another turn) or ``None``."""
        turn = TurnInfo(
            step=step, messages=tuple(self.messages[start:]), usage=usage, run=self.info()
        )
        verdict = await ask_turn_hooks(
            self.hooks, turn, self.turn_settings, locked=self.agent.locked
        )
        if verdict.stop:
            return "stop"
        changed = verdict.settings if verdict.settings != self.turn_settings else None
        if changed is not None:
            self.turn_settings = changed
            self.settle()
        for message in verdict.added:
            self.append(message)
        if self.journal is not None and (verdict.added or changed is not None):
            from agent_plugin.journal import Appended

            await self.journal.record(Appended(messages=verdict.added, turn_settings=changed))
        return "more" if verdict.added else None

    async def resumed_turn_over(self) -> AgentOutcome | None:
        """The turn-level hooks of the turn a resume finished (its reply came before the
        pause, and its usage was told then: the report has none)."""
        start = max(i for i, m in enumerate(self.messages) if m.role is Role.ASSISTANT)
        step = max(self.steps_used - 1, 0)
        if await self.turn_hooks(step, start, TokenUsage()) == "stop":
            return self.stopped(self.messages[start].text, None)
        return None

    def settle(self) -> None:
        """Apply :attr:`turn_settings` to the system prompt and the tools offered."""
        assert self.turn_settings is not None
        output = self.output
        self.plan.settle(
            self.turn_settings,
            self.agent.definitions(),
            always_offered=output.owns if output is not None else _never,
        )

    def stopped(self, text: str, verdict: Valid[Any] | Invalid | None) -> AgentOutcome:
        """How a run a hook stopped after a turn ends: completed with the turn's text, or for
        a run that must produce an output and has none, ``output_invalid``."""
        if self.output is None:
            return self.completed(text)
        if verdict is not None and verdict.accepted:
            return self.completed(text, verdict)
        problems = (
            verdict.problems
            if verdict is not None
            else "a hook stopped the run before it produced its output"
        )
        retries = self.output.retries_used
        return OutputInvalid(
            message=problems, retries=retries, steps_used=self.steps_used, usage=self.usage
        )

    def responded(self, step: int, message: ChatMessage, response: ChatResponse) -> None:
        if self.emit is not None:
            self.emit(
                ModelResponded(
                    run_id=self.run_id,
                    step=step,
                    message=public_message(message),
                    stop_reason=response.stop_reason,
                    usage=response.usage,
                )
            )

    def stop(self, control: RunControl, pending: list[PendingCall]) -> AgentOutcome:
        if isinstance(control, CancelRun):
            return Cancelled(reason=control.reason, steps_used=self.steps_used, usage=self.usage)
        return Paused(reason=control.reason, state=self.state(pending))

    # --- the model call --------------------------------------------------------------------

    async def refold(self) -> list[ChatMessage] | None:
        """Fold the history after a context overflow: the messages to send instead, or
        ``None`` when it cannot be folded."""
        if not await self.fold_history():
            return None
        return self.history(self.agent.budget.remaining(self.usage))[0]

    async def fold_history(self) -> bool:
        """Fold the history the run was given after an overflow (see
        :meth:`~agent_plugin.transcript.Transcript.fold_history`); ``False`` when it was not."""
        compaction = self.compaction
        if compaction is None or self.agent.locked:
            return False  # (a locked agent's history is fixed: the error is raised)
        result = await self.transcript.fold_history(compaction, self.agent.model, self.cancel)
        if result is None:
            return False
        if self.emit is not None:
            report = result.report
            self.emit(
                Compacted(
                    run_id=self.run_id,
                    session_id=self.session_id,
                    reason="overflow",
                    summarized_messages=result.split,
                    tokens_before=report.tokens_before,
                    tokens_after=report.tokens_after,
                )
            )
        return True

    # --- tool rounds ---------------------------------------------------------------------

    async def gate_and_run(
        self, calls: list[ToolCall], *, step: int | None = None, reply_recorded: bool = False
    ) -> AgentOutcome | None:
        """Ask the policy about each call; pause for approval, or run the round.

        ``step`` is the reply's; ``reply_recorded``: the reply is already in the journal's
        starting state (a resumed run), so only the verdicts are journaled.
        """
        info = self.info()
        pending = [self.gate(call, info) for call in calls]
        if not reply_recorded:
            step = self.steps_used - 1 if step is None else step
            await self.replied(step, self.messages[-1], pending)
        else:
            await self.started(pending)
        if not any(isinstance(p.status, NeedsApproval) for p in pending):
            return await self.round(pending)
        outcome = AwaitingApproval(state=self.state(pending))
        if self.emit is not None:
            self.emit(ApprovalRequired(run_id=self.run_id, calls=pending_approvals(outcome)))
        return outcome

    async def started(self, pending: list[PendingCall]) -> None:
        """Journal the state the run (re)starts from, with ``pending`` as its open calls."""
        if self.journal is not None:
            from agent_plugin.journal import Started

            await self.journal.record(Started(state=self.state(pending)))

    async def replied(self, step: int, message: ChatMessage, pending: list[PendingCall]) -> None:
        if self.journal is not None:
            from agent_plugin.journal import Replied

            await self.journal.record(
                Replied(
                    step=step,
                    message=message,
                    usage=self.usage,
                    steps_used=self.steps_used,
                    recent_calls=self.tracker.recent,
                    pending=pending,
                    output_retries=self.output.retries_used if self.output is not None else 0,
                )
            )

    def gate(self, call: ToolCall, info: RunInfo) -> PendingCall:
        if self.output is not None and self.output.owns(call.name):
            return PendingCall(call=call, status=_ALLOWED)  # a final result needs no approval
        decision = self.agent.policy.decide(call, self.agent.tools.get(call.name), info)
        if isinstance(decision, RequireApproval):
            return PendingCall(call=call, status=NeedsApproval(reason=decision.reason))
        if isinstance(decision, Deny):
            return PendingCall(call=call, status=Denied(reason=decision.reason))
        return PendingCall(call=call, status=_ALLOWED)

    async def round(self, pending: list[PendingCall]) -> AgentOutcome | None:
        """Run one round of gated calls and append their results as one tool message.

        Final-result calls are not tools: they are judged when the round is recorded."""
        output = self.output
        tools = [p for p in pending if output is None or not output.owns(p.call.name)]
        result = await self.rounds.run(tools, step=max(self.steps_used - 1, 0)) if tools else None
        answered = result.answered if result is not None else []
        if result is not None and isinstance(result.control, PauseRun):
            ran = {call.id: (call, out) for call, out in answered}
            state = self.state(
                [
                    PendingCall(call=ran[p.call.id][0], status=_finished(ran[p.call.id][1]))
                    if p.call.id in ran
                    else p
                    for p in pending
                ]
            )
            return Paused(reason=result.control.reason, state=state)
        if result is not None and (isinstance(result.control, CancelRun) or result.cancelled):
            self.record_cancelled(pending, answered)
            if isinstance(result.control, CancelRun):
                return self.stop(result.control, [])
            return self.cancelled()
        return await self.record(pending, answered)

    async def record(
        self, pending: list[PendingCall], answered: list[tuple[ToolCall, ToolOutput]]
    ) -> AgentOutcome | None:
        """Append the round's results (loop-guard notes added) and decide whether to stop:
        an accepted final result completes the run, a loop stops it."""
        ran = {call.id: (call, output) for call, output in answered}
        finals = [p.call for p in pending if p.call.id not in ran]
        verdict: Valid[Any] | Invalid | None = None
        answers: dict[str, tuple[str, bool]] = {}
        if finals and self.output is not None:
            verdict, answers = await self.output.check_calls(finals, self.output_context())
        results: list[ToolResult] = []
        stop: Stop | None = None
        stopping_tool = ""
        for item in pending:
            call, output = ran.get(item.call.id) or (item.call, ToolOutput(*answers[item.call.id]))
            content = output.content
            repeat = self.tracker.record(call.name, call.arguments, content)
            if isinstance(repeat, Warn):
                content += warning_note(call.name, repeat.repeats)
            elif isinstance(repeat, Stop) and stop is None:
                stop, stopping_tool = repeat, call.name
            results.append(
                ToolResult(tool_call_id=item.call.id, content=content, is_error=output.is_error)
            )
        message = ChatMessage.tool_results(results)
        self.append(message)
        if self.journal is not None:
            from agent_plugin.journal import RoundDone

            await self.journal.record(RoundDone(step=max(self.steps_used - 1, 0), message=message))
        if verdict is not None and verdict.accepted:
            return self.completed("", verdict)
        if verdict is not None and not verdict.final and not answered:
            self.steps_used += 1  # final results sent back to be fixed: a step, as in text
        if stop is not None:
            return LoopDetected(
                tool=stopping_tool,
                repeats=stop.repeats,
                steps_used=self.steps_used,
                usage=self.usage,
            )
        if verdict is not None and verdict.final:
            return self.invalid(verdict)
        if answered and not finals and all(output.terminate for _, output in answered):
            text = "\n".join(_plain(output.content) for _, output in answered)
            if self.output is None:
                return self.completed(text)
            ended = self.output.check_result(text)
            return self.completed(text, ended) if ended.accepted else self.invalid(ended)
        return None

    def record_cancelled(
        self, pending: list[PendingCall], answered: list[tuple[ToolCall, ToolOutput]]
    ) -> None:
        """Answer every call of a cancelled round so the transcript stays valid."""
        ran = {call.id: output for call, output in answered}
        results = [
            ToolResult(tool_call_id=p.call.id, content=out.content, is_error=out.is_error)
            if (out := ran.get(p.call.id)) is not None
            else ToolResult(tool_call_id=p.call.id, content=_NOT_RUN, is_error=True)
            for p in pending
        ]
        self.append(ChatMessage.tool_results(results))


_ALLOWED: Final = Allowed()


def _finished(output: ToolOutput) -> Finished:
    return Finished(content=output.content, is_error=output.is_error)


def _never(name: str) -> bool:
    return False


def _plain(content: str) -> str:
    try:
        value: JsonValue = json.loads(content)
    except ValueError:
        return content
    return value if isinstance(value, str) else content
