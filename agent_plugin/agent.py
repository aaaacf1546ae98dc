"""The agent loop: call the model, gate and run the tools it asks for, repeat within budgets.

One iteration of a run::

    deadline? cancelled? budget left?  ->  truncate history, cap the output
    before_model hooks  ->  model call  ->  after_model hooks
    no tool calls       ->  record the answer, complete (or report token overshoot)
    tool calls          ->  record them (one step), gate each with the policy,
                            pause for approval, or run the round and append one tool message

Budgets, truncation, the loop guard and the policy are small objects this module calls; the
per-run state lives in :class:`_Run`, so one :class:`Agent` serves any number of concurrent runs.

Memory, skills, step journals and sessions load with the first agent or run that uses them, not
with the core: ``import agent_plugin`` does not pay for features an app may never turn on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Final

from pydantic import JsonValue

from agent_plugin.budget import Budget, estimate_message, truncate_history
from agent_plugin.cancellation import RunCancelled, until_cancelled
from agent_plugin.errors import AgentError, ErrorInfo, ErrorKind
from agent_plugin.events import (
    AgentEvent,
    ApprovalRequired,
    ModelRequestStarted,
    ModelResponded,
    RetryScheduled,
    RunEnded,
    RunStarted,
    Steered,
    TextDeltaEvent,
    ThinkingDeltaEvent,
    ToolCallDeltaEvent,
    TurnEnded,
    TurnStarted,
    pending_approvals,
)
from agent_plugin.hooks import (
    AgentHooks,
    CancelRun,
    HookSet,
    PauseRun,
    RunControl,
    ToolOutput,
)
from agent_plugin.ids import DEFAULT_SCOPE, new_run_id
from agent_plugin.logs import run_context
from agent_plugin.loop_guard import LoopGuard, LoopTracker, Stop, Warn, warning_note
from agent_plugin.messages import (
    ChatMessage,
    ContentPart,
    Role,
    TokenUsage,
    ToolCall,
    ToolCallPart,
    ToolResult,
    repair_transcript,
    text_of,
    tool_calls_of,
)
from agent_plugin.options import EventSink, RunOptions
from agent_plugin.outcomes import (
    AgentOutcome,
    AgentTurn,
    Allowed,
    Approval,
    ApprovalDecision,
    AwaitingApproval,
    BudgetExhausted,
    BudgetReason,
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
    RunInfo,
    RunState,
)
from agent_plugin.policy import AllowAll, Deny, RequireApproval, ToolPolicy
from agent_plugin.providers.base import (
    ChatRequest,
    ChatResponse,
    LlmClient,
    StreamDone,
    TextDelta,
    ThinkingDelta,
    ToolCallStarted,
)
from agent_plugin.providers.retry import RetryNotice
from agent_plugin.redaction import redact
from agent_plugin.rounds import ToolRound
from agent_plugin.tools import (
    Tool,
    ToolRegistry,
    error_payload,
)

if TYPE_CHECKING:  # these load on first use, not with the core
    from agent_plugin.compaction import Compaction
    from agent_plugin.memory import MemoryStore
    from agent_plugin.skills import Skill

__all__ = ["Agent"]

_NO_OPTIONS: Final = RunOptions()
_NOT_RUN: Final = error_payload("the run was cancelled before this call ran")


class _DeadlinePassed(Exception):
    pass


class Agent:
    """A configured agent. Reusable and safe to share: every run keeps its own state.

    ``max_steps`` counts tool rounds (the final answer is free); ``max_tokens`` bounds the
    provider-reported usage of the run; ``max_duration`` is a wall-clock limit per run and per
    resume. Budget exhaustion, loops, approval pauses and cancellation are outcomes; provider
    failures and bad resume decisions raise :class:`AgentError`.
    """

    def __init__(
        self,
        model: LlmClient,
        *,
        tools: Iterable[Tool] = (),
        system_prompt: str | None = None,
        max_steps: int = 10,
        max_tokens: int = 32_000,
        per_tool_output_limit: int = 8000,
        temperature: float | None = None,
        hooks: Iterable[AgentHooks] = (),
        policy: ToolPolicy | None = None,
        loop_guard: LoopGuard | None = None,
        max_duration: float | timedelta | None = None,
        parallel_tool_calls: bool = True,
        memory: MemoryStore | None = None,
        memory_scope: str = DEFAULT_SCOPE,
        skills: Sequence[Skill] = (),
        compaction: Compaction | None = None,
    ) -> None:
        if per_tool_output_limit < 1:
            raise AgentError.config(
                f"per_tool_output_limit must be at least 1, got {per_tool_output_limit}"
            )
        if isinstance(max_duration, timedelta):
            max_duration = max_duration.total_seconds()
        if max_duration is not None and max_duration <= 0:
            raise AgentError.config(f"max_duration must be positive, got {max_duration}")
        self.model = model
        self.memory = memory
        self.memory_scope = memory_scope
        self.skills = tuple(skills)
        self.compaction = compaction
        built_in: list[Tool] = []
        if self.skills:
            from agent_plugin.skills import LoadSkillTool

            built_in.append(LoadSkillTool(self.skills))
        if memory is not None:
            from agent_plugin.memory import MemoryTool

            built_in.append(MemoryTool(memory, memory_scope))
        self.tools = ToolRegistry([*tools, *built_in])
        self.system_prompt = system_prompt
        self.budget = Budget(max_steps=max_steps, max_tokens=max_tokens)
        self.per_tool_output_limit = per_tool_output_limit
        self.temperature = temperature
        self.hooks = tuple(hooks)
        self.hook_set = HookSet(list(self.hooks))
        self.policy: ToolPolicy = policy if policy is not None else AllowAll()
        self.loop_guard = loop_guard if loop_guard is not None else LoopGuard()
        self.max_duration = max_duration
        self.parallel_tool_calls = parallel_tool_calls

    def __repr__(self) -> str:
        return (
            f"Agent(model={self.model.provider_name!r}, tools={self.tools.names()!r}, "
            f"max_steps={self.budget.max_steps}, max_tokens={self.budget.max_tokens})"
        )

    # --- entry points ----------------------------------------------------------------------

    async def run(
        self,
        prompt: str | ChatMessage,
        *,
        history: Sequence[ChatMessage] = (),
        options: RunOptions | None = None,
        session_id: str | None = None,
        session_version: int | None = None,
    ) -> AgentTurn:
        """Run a task, after ``history`` if given, and return the outcome with the transcript.

        System messages in ``history`` are dropped (the agent supplies its own), and a
        transcript with unanswered calls or stray results is repaired first; the turn's
        ``new_messages`` are what this run added. ``session_id`` and ``session_version`` name
        the session the run belongs to and the version it started from (kept in a paused
        run's state; :func:`agent_plugin.sessions.run` sets them).
        """
        message = ChatMessage.user(prompt) if isinstance(prompt, str) else prompt
        if message.role is not Role.USER:
            raise AgentError.config(f"a prompt must be a user message, got {message.role.value}")
        opts = options or _NO_OPTIONS
        repaired = repair_transcript(list(history))
        run = _Run(
            self,
            opts,
            run_id=opts.run_id or new_run_id(),
            session_id=session_id,
            messages=[*repaired, message],
            history_length=len(repaired),
            session_version=session_version,
            usage=TokenUsage(),
            steps_used=0,
            tracker=self.loop_guard.tracker(),
        )
        return await run.execute(run.drive(), resumed=False)

    async def resume(
        self,
        state: RunState,
        decisions: Iterable[ApprovalDecision] = (),
        *,
        options: RunOptions | None = None,
    ) -> AgentTurn:
        """Continue a run that paused for approval (or was paused by a hook), or a run
        recovered from its journal (:func:`agent_plugin.journal.recover`).

        Each decision must name a call that awaits approval; a call without a decision is
        rejected with ``no decision was given``. Calls the policy allowed or denied keep that
        verdict: the policy is not asked again. The deadline starts afresh. The run keeps the
        state's id (``options.run_id`` is not used).
        """
        pending = _apply_decisions(state, list(decisions))
        run = _Run(
            self,
            options or _NO_OPTIONS,
            run_id=state.run_id,
            session_id=state.session_id,
            messages=list(state.messages),
            history_length=state.history_length,
            session_version=state.session_version,
            pending=pending,
            usage=state.usage,
            steps_used=state.steps_used,
            tracker=self.loop_guard.tracker(state.recent_calls),
        )
        return await run.execute(run.continue_from(pending), resumed=True)

    def stream(
        self,
        prompt: str | ChatMessage,
        *,
        history: Sequence[ChatMessage] = (),
        options: RunOptions | None = None,
    ) -> AsyncIterator[AgentEvent]:
        """Run a task and yield its events as they happen; the last one is ``run_end``.

        The model is called through ``LlmClient.stream``, so text arrives as ``text_delta``
        events (``options.stream`` is implied; an ``options.on_event`` sink gets every event
        too). Leaving the iteration early cancels the run.
        """
        opts = options or _NO_OPTIONS
        return _events_of(
            lambda sink: self.run(
                prompt,
                history=history,
                options=replace(opts, on_event=_tee(sink, opts.on_event), stream=True),
            )
        )

    # --- preparation -----------------------------------------------------------------------

    async def system_message(self) -> ChatMessage | None:
        """The system prompt of a run, rebuilt for every run and every resume.

        Sections, in order: the base prompt, the skills index, and the memory snapshot as of
        now. The snapshot stays frozen for the whole run: edits made through the ``memory`` tool
        persist at once but reach the prompt from the next run (the prefix stays cacheable).
        """
        sections = [self.system_prompt] if self.system_prompt else []
        if self.skills:
            from agent_plugin.skills import skills_index

            sections.append(skills_index(self.skills))
        if self.memory is not None:
            from agent_plugin.memory import render_snapshot

            sections.append(render_snapshot(await self.memory.load(self.memory_scope)))
        return ChatMessage.system("\n\n".join(sections)) if sections else None


def _apply_decisions(state: RunState, decisions: list[ApprovalDecision]) -> list[PendingCall]:
    awaiting = {p.call.id for p in state.awaiting()}
    for decision in decisions:
        if decision.call_id not in awaiting:
            raise AgentError.config(
                f"call {decision.call_id!r} is not awaiting approval in run {state.run_id!r}"
            )
    first: dict[str, Approval] = {}
    for decision in decisions:
        first.setdefault(decision.call_id, decision.approval)
    resolved: list[PendingCall] = []
    for pending in state.pending:
        if not isinstance(pending.status, NeedsApproval):
            resolved.append(pending)
            continue
        approval = first.get(pending.call.id)
        if approval is None:
            resolved.append(
                pending.model_copy(update={"status": Rejected(reason="no decision was given")})
            )
        elif isinstance(approval, Reject):
            resolved.append(pending.model_copy(update={"status": Rejected(reason=approval.reason)}))
        elif isinstance(approval, Edit):
            call = pending.call.model_copy(
                update={"arguments": approval.arguments, "raw_arguments": None}
            )
            resolved.append(PendingCall(call=call, status=Allowed()))
        else:
            resolved.append(pending.model_copy(update={"status": Allowed()}))
    return resolved


def _tee(first: EventSink, second: EventSink | None) -> EventSink:
    if second is None:
        return first

    def both(event: AgentEvent) -> None:
        first(event)
        second(event)

    return both


async def _events_of(
    start: Callable[[EventSink], Awaitable[AgentTurn]],
) -> AsyncIterator[AgentEvent]:
    queue: asyncio.Queue[AgentEvent] = asyncio.Queue()
    task = asyncio.ensure_future(start(queue.put_nowait))
    try:
        while True:
            event = await queue.get()
            yield event
            if isinstance(event, RunEnded):
                break
        await task
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, AgentError):
                await task


class _Run:
    """The mutable state of one run or resume, and the loop that drives it."""

    def __init__(
        self,
        agent: Agent,
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
    ) -> None:
        self.agent = agent
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
        self.hooks = agent.hook_set
        self.system: ChatMessage | None = None  # set by execute(): preparing may need I/O
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
        )

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
            return await self._execute(body, resumed=resumed)

    async def _execute(self, body: Awaitable[AgentOutcome], *, resumed: bool) -> AgentTurn:
        emit = self.emit
        if emit is not None:
            emit(RunStarted(run_id=self.run_id, session_id=self.session_id, resumed=resumed))
        try:
            self.system = await self.agent.system_message()
            self.system_cost = estimate_message(self.system) if self.system else 0
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
            outcome=outcome, messages=list(self.messages), history_length=self.history_length
        )

    async def continue_from(self, pending: list[PendingCall]) -> AgentOutcome:
        """Resume: finish the paused round (if any), then drive on."""
        last = self.messages[-1] if self.messages else None
        if pending:
            outcome = await self.round(pending)
        elif last is not None and last.role is Role.ASSISTANT and last.tool_calls:
            outcome = await self.gate_and_run(last.tool_calls, reply_recorded=True)
        elif last is not None and last.role is Role.ASSISTANT:
            # recovered after the final answer was recorded: the run is complete
            return Completed(text=last.text, steps_used=self.steps_used, usage=self.usage)
        else:
            outcome = None
        if outcome is not None:
            return outcome
        return await self.drive()

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
                tools=agent.tools.definitions(),
                max_tokens=output_cap,
                temperature=agent.temperature,
                deadline=self.deadline,
                on_retry=self.on_retry if self.emit is not None else None,
            )
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
                response = await self.call_model(request)
            except _DeadlinePassed:
                return self.exhausted("deadline")
            except RunCancelled:
                return self.cancelled()
            control = None
            for after in hooks.after_model:
                control = await after(response, info) or control

            self.usage = self.usage + response.usage
            overshoot = self.usage.total() > budget.max_tokens
            content = _with_call_ids(response.content)
            calls = tool_calls_of(content)
            message = ChatMessage(role=Role.ASSISTANT, content=content)
            if not calls:
                self.append(message)
                self.responded(step, message, response)
                await self.replied(step, message, [])
                if overshoot:
                    return self.exhausted("tokens")
                if self.steering is not None and self.steering.pending:
                    continue  # a message arrived while the model answered: steering wins
                return Completed(
                    text=text_of(content), steps_used=self.steps_used, usage=self.usage
                )
            if overshoot:
                # tool calls without results would corrupt the transcript: not recorded
                self.responded(step, message, response)
                return self.exhausted("tokens")
            self.steps_used += 1
            self.append(message)
            self.responded(step, message, response)
            if isinstance(control, CancelRun):
                self.record_cancelled([PendingCall(call=c, status=_ALLOWED) for c in calls], [])
                return self.stop(control, [])
            if control is not None:
                return self.stop(control, [])
            outcome = await self.gate_and_run(calls)
            if self.emit is not None:
                self.emit(TurnEnded(run_id=self.run_id, step=step))
            if outcome is not None:
                return outcome

    def history(self, remaining: int) -> tuple[list[ChatMessage], int]:
        """The messages to send and their estimated tokens, within ``remaining``."""
        system = [self.system] if self.system is not None else []
        total = self.system_cost + self.total_cost
        if total <= remaining:
            return [*system, *self.messages], total
        costs = [self.system_cost] * len(system) + self.costs
        history = truncate_history([*system, *self.messages], remaining, costs)
        return history, sum(estimate_message(m) for m in history)

    def responded(self, step: int, message: ChatMessage, response: ChatResponse) -> None:
        if self.emit is not None:
            self.emit(
                ModelResponded(
                    run_id=self.run_id,
                    step=step,
                    message=_public_message(message),
                    stop_reason=response.stop_reason,
                    usage=response.usage,
                )
            )

    def stop(self, control: RunControl, pending: list[PendingCall]) -> AgentOutcome:
        if isinstance(control, CancelRun):
            return Cancelled(reason=control.reason, steps_used=self.steps_used, usage=self.usage)
        return Paused(reason=control.reason, state=self.state(pending))

    def on_retry(self, notice: RetryNotice) -> None:
        if self.emit is not None:
            self.emit(
                RetryScheduled(
                    run_id=self.run_id,
                    attempt=notice.attempt,
                    max_attempts=notice.max_attempts,
                    wait_seconds=notice.wait,
                    error=notice.error.info(),
                )
            )

    # --- the model call --------------------------------------------------------------------

    def call_model(self, request: ChatRequest) -> Awaitable[ChatResponse]:
        """The model call, bounded by the deadline and the cancel token when the run has them
        (without them, the client's own call: a coroutine fewer alive across the call)."""
        call: Awaitable[ChatResponse] = (
            self.consume_stream(request) if self.streaming else self.agent.model.chat(request)
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
        events = self.agent.model.stream(request)
        try:
            async for event in events:
                if isinstance(event, StreamDone):
                    return event.response
                if emit is None:
                    continue
                if isinstance(event, TextDelta):
                    emit(TextDeltaEvent(run_id=self.run_id, text=event.text))
                elif isinstance(event, ThinkingDelta):
                    emit(ThinkingDeltaEvent(run_id=self.run_id, text=event.text))
                elif isinstance(event, ToolCallStarted):
                    emit(
                        ToolCallDeltaEvent(
                            run_id=self.run_id, index=event.index, call_id=event.id, name=event.name
                        )
                    )
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
        self, calls: list[ToolCall], *, reply_recorded: bool = False
    ) -> AgentOutcome | None:
        """Ask the policy about each call; pause for approval, or run the round.

        ``reply_recorded``: the reply is already in the journal's starting state (a resumed
        run), so only the verdicts are journaled.
        """
        info = self.info()
        pending = [self.gate(call, info) for call in calls]
        if not reply_recorded:
            await self.replied(self.steps_used - 1, self.messages[-1], pending)
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
                )
            )

    def gate(self, call: ToolCall, info: RunInfo) -> PendingCall:
        decision = self.agent.policy.decide(call, self.agent.tools.get(call.name), info)
        if isinstance(decision, RequireApproval):
            return PendingCall(call=call, status=NeedsApproval(reason=decision.reason))
        if isinstance(decision, Deny):
            return PendingCall(call=call, status=Denied(reason=decision.reason))
        return PendingCall(call=call, status=_ALLOWED)

    async def round(self, pending: list[PendingCall]) -> AgentOutcome | None:
        """Run one round of gated calls and append their results as one tool message."""
        result = await self.rounds.run(pending, step=max(self.steps_used - 1, 0))
        answered = result.answered
        if isinstance(result.control, PauseRun):
            finished = [
                PendingCall(call=call, status=Finished(content=out.content, is_error=out.is_error))
                for call, out in answered
            ]
            state = self.state(finished + pending[len(answered) :])
            return Paused(reason=result.control.reason, state=state)
        if isinstance(result.control, CancelRun) or result.cancelled:
            self.record_cancelled(pending, answered)
            if isinstance(result.control, CancelRun):
                return self.stop(result.control, [])
            return self.cancelled()
        return await self.record(pending, answered)

    async def record(
        self, pending: list[PendingCall], answered: list[tuple[ToolCall, ToolOutput]]
    ) -> AgentOutcome | None:
        """Append the round's results (loop-guard notes added) and decide whether to stop."""
        results: list[ToolResult] = []
        stop: Stop | None = None
        stopping_tool = ""
        for item, (call, output) in zip(pending, answered, strict=True):
            content = output.content
            verdict = self.tracker.record(call.name, call.arguments, content)
            if isinstance(verdict, Warn):
                content += warning_note(call.name, verdict.repeats)
            elif isinstance(verdict, Stop) and stop is None:
                stop, stopping_tool = verdict, call.name
            results.append(
                ToolResult(tool_call_id=item.call.id, content=content, is_error=output.is_error)
            )
        message = ChatMessage.tool_results(results)
        self.append(message)
        if self.journal is not None:
            from agent_plugin.journal import RoundDone

            await self.journal.record(RoundDone(step=self.steps_used - 1, message=message))
        if stop is not None:
            return LoopDetected(
                tool=stopping_tool,
                repeats=stop.repeats,
                steps_used=self.steps_used,
                usage=self.usage,
            )
        if answered and all(output.terminate for _, output in answered):
            text = "\n".join(_plain(output.content) for _, output in answered)
            return Completed(text=text, steps_used=self.steps_used, usage=self.usage)
        return None

    def record_cancelled(
        self, pending: list[PendingCall], answered: list[tuple[ToolCall, ToolOutput]]
    ) -> None:
        """Answer every call of a cancelled round so the transcript stays valid."""
        results = [
            ToolResult(tool_call_id=call.id, content=output.content, is_error=output.is_error)
            for call, output in answered
        ]
        results += [
            ToolResult(tool_call_id=p.call.id, content=_NOT_RUN, is_error=True)
            for p in pending[len(answered) :]
        ]
        self.append(ChatMessage.tool_results(results))


_ALLOWED: Final = Allowed()


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


def _plain(content: str) -> str:
    try:
        value: JsonValue = json.loads(content)
    except ValueError:
        return content
    return value if isinstance(value, str) else content


def _public_message(message: ChatMessage) -> ChatMessage:
    """The message with tool-call arguments redacted, for events."""
    if not message.tool_calls:
        return message
    return message.model_copy(
        update={
            "content": [
                ToolCallPart(
                    tool_call=p.tool_call.model_copy(
                        update={"arguments": redact(p.tool_call.arguments), "raw_arguments": None}
                    )
                )
                if isinstance(p, ToolCallPart)
                else p
                for p in message.content
            ]
        }
    )
