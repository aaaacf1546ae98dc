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

Budgets, truncation, the loop guard, the policy and the output are small objects this module
calls. :class:`RunLoop` is the mutable state of one run or resume; what it needs of its agent
is :class:`LoopAgent` (:class:`~agent_plugin.agent.Agent` is one).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

from pydantic import JsonValue

from agent_plugin.budget import Budget, estimate_message, truncate_history
from agent_plugin.cancellation import RunCancelled, until_cancelled
from agent_plugin.errors import AgentError, ErrorInfo, ErrorKind, PrefixLocked
from agent_plugin.events import (
    ApprovalRequired,
    Compacted,
    ModelFallback,
    ModelRequestStarted,
    ModelResponded,
    OutputDelta,
    RunEnded,
    RunStarted,
    Steered,
    TextDeltaEvent,
    ThinkingDeltaEvent,
    ToolCallDeltaEvent,
    TurnEnded,
    TurnStarted,
    pending_approvals,
    public_message,
)
from agent_plugin.hooks import (
    CancelRun,
    HookSet,
    NextTurn,
    PauseRun,
    RunControl,
    ToolOutput,
    TurnInfo,
)
from agent_plugin.logs import run_context
from agent_plugin.loop_guard import LoopGuard, LoopTracker, Stop, Warn, warning_note
from agent_plugin.messages import (
    ChatMessage,
    ContentPart,
    Role,
    TokenUsage,
    ToolCall,
    ToolCallPart,
    ToolDefinition,
    ToolResult,
    text_of,
    tool_calls_of,
)
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
from agent_plugin.policy import Deny, RequireApproval, ToolPolicy
from agent_plugin.providers.base import (
    ChatRequest,
    ChatResponse,
    LlmClient,
    StreamDone,
    TextDelta,
    ThinkingDelta,
    ToolCallArgumentsDelta,
    ToolCallStarted,
)
from agent_plugin.providers.retry import RetryNotice
from agent_plugin.retrying import CallRetries
from agent_plugin.rounds import ToolRound
from agent_plugin.steering import Steering
from agent_plugin.tools import (
    ToolRegistry,
    error_payload,
)

if TYPE_CHECKING:  # these load on first use, not with the core
    from agent_plugin.compaction import Compaction
    from agent_plugin.output import (
        Invalid,
        Output,
        OutputContext,
        OutputRun,
        Valid,
    )
    from agent_plugin.providers.base import FallbackNotice
    from agent_plugin.telemetry import Telemetry


__all__ = ["LoopAgent", "RunLoop"]

logger = logging.getLogger("agent_plugin")

_NOT_RUN: Final = error_payload("the run was cancelled before this call ran")


class _DeadlinePassed(Exception):
    pass


class _Interrupted(Exception):
    """An ``interrupt`` message came while the model was asked: ask again with it."""


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
        self.history_length = history_length
        self.session_version = session_version
        self.run_id = run_id
        self.session_id = session_id
        self.messages = messages
        self.costs = [estimate_message(m) for m in messages]
        self.total_cost = sum(self.costs)
        self.usage = usage
        self.steps_used = steps_used
        self.tracker = tracker
        self.cancel = options.cancel
        self.emit = options.on_event
        self.streaming = options.stream
        self.retries = CallRetries(run_id, self.emit) if self.emit is not None else None
        self.hooks = agent.hook_set
        self.compaction = options.compaction or agent.compaction
        self.folded = folded
        self.turn_settings = turn_settings
        self.offered: tuple[ToolDefinition, ...] | None = None
        """The tools offered under :attr:`turn_settings` (``None``: the agent's, as they are)."""
        self.system: ChatMessage | None = None  # set by execute(): preparing may need I/O
        self.base_system: ChatMessage | None = None
        self.system_cost = 0
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.deadline = loop.time() + agent.max_duration if agent.max_duration else None
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
        cost = estimate_message(message)
        self.messages.append(message)
        self.costs.append(cost)
        self.total_cost += cost

    def state(self, pending: list[PendingCall]) -> RunState:
        return RunState(
            run_id=self.run_id,
            session_id=self.session_id,
            messages=list(self.messages),
            usage=self.usage,
            steps_used=self.steps_used,
            pending=pending,
            recent_calls=self.tracker.recent,
            history_length=self.history_length,
            session_version=self.session_version,
            output=self.agent.output_label,
            output_retries=self.output.retries_used if self.output is not None else 0,
            folded=self.folded,
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

    def exhausted(self, reason: BudgetReason) -> BudgetExhausted:
        return BudgetExhausted(reason=reason, steps_used=self.steps_used, usage=self.usage)

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
            self.base_system = self.system = await self.agent.system_message()
            self.system_cost = estimate_message(self.system) if self.system else 0
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
            history_length=self.history_length,
            folded=self.folded,
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
                tools=agent.definitions() if self.offered is None else self.offered,
                response_format=agent.output.response_format if agent.output else None,
                max_tokens=output_cap,
                temperature=agent.temperature,
                deadline=self.deadline,
                on_retry=self.on_retry if self.emit is not None or self.telemetry.active else None,
                on_fallback=self.on_fallback,
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
                response = await self.answer(request)
            except _DeadlinePassed:
                return self.exhausted("deadline")
            except RunCancelled:
                return self.cancelled()
            except _Interrupted:
                continue  # the message joins at the top, and the model is asked again
            control = None
            for after in hooks.after_model:
                control = await after(response, info) or control

            self.usage = self.usage + response.usage
            budget.check_priced(response.usage, response.model or self.telemetry.model)
            overshoot = self.usage.total() > budget.max_tokens
            content = _with_call_ids(response.content)
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
        system = [self.system] if self.system is not None else []
        total = self.system_cost + self.total_cost
        if total <= remaining:
            return [*system, *self.messages], total
        costs = [self.system_cost] * len(system) + self.costs
        history = truncate_history([*system, *self.messages], remaining, costs)
        return history, sum(estimate_message(m) for m in history)

    # --- turn-level hooks ------------------------------------------------------------------

    async def turn_hooks(
        self, step: int, start: int, usage: TokenUsage
    ) -> Literal["stop", "more"] | None:
        """Ask the turn-level hooks about the turn whose messages start at ``start``: ``stop``
        (the run ends), ``more`` (they added messages: another turn) or ``None``."""
        hooks = self.hooks
        turn = TurnInfo(
            step=step, messages=tuple(self.messages[start:]), usage=usage, run=self.info()
        )
        for should_stop in hooks.should_stop_after_turn:
            if await should_stop(turn):
                return "stop"
        added: list[ChatMessage] = []
        settings = self.turn_settings
        for prepare in hooks.prepare_next_turn:
            prepared: NextTurn | None = await prepare(turn)
            if prepared is None:
                continue
            if self.agent.locked and (
                prepared.tools is not None or prepared.system_prompt_addition is not None
            ):
                raise PrefixLocked("a prepare_next_turn hook changing the tools or system prompt")
            added.extend(_user_message(m) for m in prepared.messages)
            self.turn_settings = _settled(self.turn_settings, prepared)
            self.settle()
        changed = self.turn_settings if self.turn_settings != settings else None
        for message in added:
            self.append(message)
        if self.journal is not None and (added or changed is not None):
            from agent_plugin.journal import Appended

            await self.journal.record(Appended(messages=added, turn_settings=changed))
        return "more" if added else None

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
        settings = self.turn_settings
        assert settings is not None
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
        output = self.output
        self.offered = tuple(
            d
            for d in self.agent.definitions()
            if d.name in wanted or (output is not None and output.owns(d.name))
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

    def on_retry(self, notice: RetryNotice) -> None:
        self.telemetry.retried(notice)
        if self.retries is not None:
            self.retries.scheduled(notice)

    def on_fallback(self, notice: FallbackNotice) -> None:
        self.telemetry.fell_back(notice)
        if self.emit is not None:
            self.emit(
                ModelFallback(
                    run_id=self.run_id,
                    from_model=notice.from_model,
                    to_model=notice.to_model,
                    error=notice.error.info(),
                )
            )

    # --- the model call --------------------------------------------------------------------

    async def answer(self, request: ChatRequest) -> ChatResponse:
        """The model's reply to ``request``: its retries closed by their end event, and a
        context overflow met by folding the history once and asking again."""
        retries = self.retries
        steering = self.steering
        folded = False
        while True:
            try:
                call = self.call_model(request)
                if steering is None:
                    response = await call
                else:
                    response = await self.interruptible(call, steering)
            except (_DeadlinePassed, RunCancelled, _Interrupted) as stop:
                if retries is not None:
                    retries.failed(
                        None, "deadline" if isinstance(stop, _DeadlinePassed) else "cancelled"
                    )
                raise
            except AgentError as error:
                if retries is not None:
                    retries.failed(error)
                if folded or error.kind is not ErrorKind.CONTEXT_TOO_LONG:
                    raise
                if not await self.fold_history():
                    raise
                folded = True
                # the same request with the folded history (a hook's edits to it are not kept)
                request.messages = self.history(self.agent.budget.remaining(self.usage))[0]
                continue
            if retries is not None:
                retries.succeeded()
            return response

    async def interruptible(
        self, call: Awaitable[ChatResponse], steering: Steering
    ) -> ChatResponse:
        """``call``, abandoned when an ``interrupt`` message comes first."""
        try:
            return await until_cancelled(call, steering.interrupt)
        except RunCancelled:
            if self.cancel is not None and self.cancel.cancelled:
                raise
            raise _Interrupted from None

    async def fold_history(self) -> bool:
        """Fold the head of the history the run was given into one summary (the run's own
        messages are kept); ``False`` when there is no compaction or nothing to fold."""
        compaction = self.compaction
        if compaction is None or self.history_length < 1 or self.agent.locked:
            return False  # (a locked agent's history is fixed: the error is raised)
        from agent_plugin.compaction import summary_message
        from agent_plugin.outcomes import CompactionReport, Folded

        try:
            result = await until_cancelled(
                compaction.compact(
                    self.agent.model, self.messages, force=True, keep_from=self.history_length
                ),
                self.cancel,
            )
        except AgentError as error:
            logger.warning("run %s: the history could not be folded: %s", self.run_id, error)
            return False
        if result is None:
            return False
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
        if self.emit is not None:
            self.emit(
                Compacted(
                    run_id=self.run_id,
                    session_id=self.session_id,
                    reason="overflow",
                    summarized_messages=split,
                    tokens_before=report.tokens_before,
                    tokens_after=report.tokens_after,
                )
            )
        return True

    def call_model(self, request: ChatRequest) -> Awaitable[ChatResponse]:
        """The model call, bounded by the deadline and the cancel token when the run has them
        (without them, the client's own call: a coroutine fewer alive across the call)."""
        call: Awaitable[ChatResponse] = self.telemetry.chat(
            self.consume_stream(request) if self.streaming else self.agent.model.chat(request),
            request,
        )
        if self.deadline is None and self.cancel is None:
            return call
        return self.bounded_call(call)

    async def bounded_call(self, call: Awaitable[ChatResponse]) -> ChatResponse:
        try:
            async with asyncio.timeout_at(self.deadline):
                return await until_cancelled(call, self.cancel)
        except TimeoutError:
            if self.deadline_passed():
                raise _DeadlinePassed from None
            raise

    async def consume_stream(self, request: ChatRequest) -> ChatResponse:
        emit = self.emit
        output = self.agent.output
        partial = None
        if output is not None and output.typed:
            from agent_plugin.output import OutputStream

            partial = OutputStream(output)
        events = self.agent.model.stream(request)
        try:
            async for event in events:
                if isinstance(event, StreamDone):
                    return event.response
                if emit is None:
                    continue
                grown = None
                if isinstance(event, TextDelta):
                    emit(TextDeltaEvent(run_id=self.run_id, text=event.text))
                    grown = partial.text_fragment(event.text) if partial is not None else None
                elif isinstance(event, ThinkingDelta):
                    emit(ThinkingDeltaEvent(run_id=self.run_id, text=event.text))
                elif isinstance(event, ToolCallStarted):
                    emit(
                        ToolCallDeltaEvent(
                            run_id=self.run_id, index=event.index, call_id=event.id, name=event.name
                        )
                    )
                    if partial is not None:
                        partial.call_started(event.index, event.name)
                elif isinstance(event, ToolCallArgumentsDelta) and partial is not None:
                    grown = partial.call_fragment(event.index, event.fragment)
                if isinstance(grown, tuple):
                    emit(OutputDelta(run_id=self.run_id, choice=grown[0], partial=grown[1]))
        finally:
            # closed here, at once: left to the event loop's finalizer, an unfinished async
            # generator costs a wake-up of the loop and a task of its own per model call
            close = getattr(events, "aclose", None)
            if close is not None:
                await close()
        raise AgentError.decode(
            f"the {self.agent.model.provider_name} stream ended without a final response"
        )

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


def _with_call_ids(content: list[ContentPart]) -> list[ContentPart]:
    """``content`` with a fresh id for every tool call whose id is empty or repeated.

    Some servers (Gemini's OpenAI-compatible endpoint) send ``""``; results are matched to
    calls by id, so each call of a turn needs its own.
    """
    seen: set[str] = set()
    fixed: list[ContentPart] | None = None
    for index, part in enumerate(content):
        if not isinstance(part, ToolCallPart):
            continue
        call = part.tool_call
        if call.id and call.id not in seen:
            seen.add(call.id)
            continue
        if fixed is None:
            fixed = list(content)
        new_id = f"call_{secrets.token_hex(6)}"
        seen.add(new_id)
        fixed[index] = ToolCallPart(tool_call=call.model_copy(update={"id": new_id}))
    return content if fixed is None else fixed


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


def _plain(content: str) -> str:
    try:
        value: JsonValue = json.loads(content)
    except ValueError:
        return content
    return value if isinstance(value, str) else content
