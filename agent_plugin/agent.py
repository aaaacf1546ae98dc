"""The agent: a model, its tools and settings, and the doors into a run (run / resume /
stream, all taking RunOptions).

An :class:`Agent` is configuration; the loop that drives one run (call the model, gate and run
the tools it asks for, repeat within budgets) is :class:`~agent_plugin.loop.RunLoop`, one per
run or resume, so one agent serves any number of concurrent runs. A typed output
(:mod:`agent_plugin.output`) is part of the configuration: what the run must produce.

Memory, skills, step journals and sessions load with the first agent or run that uses them, not
with the core: ``import agent_plugin`` does not pay for features an app may never turn on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Final, Generic

from typing_extensions import TypeVar

from agent_plugin.budget import Budget
from agent_plugin.errors import AgentError, PrefixLocked
from agent_plugin.events import (
    AgentEvent,
    events_of,
    tee,
)
from agent_plugin.hooks import (
    AgentHooks,
    HookSet,
)
from agent_plugin.ids import DEFAULT_SCOPE, new_run_id
from agent_plugin.loop import RunLoop
from agent_plugin.loop_guard import LoopGuard
from agent_plugin.messages import (
    ChatMessage,
    Role,
    TokenUsage,
    ToolDefinition,
    repair_transcript,
)
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import (
    AgentTurn,
    ApprovalDecision,
    RunState,
)
from agent_plugin.policy import AllowAll, ToolPolicy
from agent_plugin.providers.base import (
    LlmClient,
)
from agent_plugin.tools import (
    Tool,
    ToolRegistry,
)

if TYPE_CHECKING:  # these load on first use, not with the core
    from agent_plugin.compaction import Compaction
    from agent_plugin.memory import MemoryStore
    from agent_plugin.output import (
        Output,
        OutputMode,
        OutputType,
        OutputValidator,
    )
    from agent_plugin.pacing import Pacer
    from agent_plugin.skills import Skill
    from agent_plugin.spend import BudgetWindows, Spending, SpendLedger
    from agent_plugin.telemetry import Telemetry

__all__ = ["Agent", "AgentOutputT"]

AgentOutputT = TypeVar("AgentOutputT", default=str)
"""The type of an agent's output: ``str`` unless ``output_type`` says otherwise."""

_NO_OPTIONS: Final = RunOptions()


class Agent(Generic[AgentOutputT]):
    """A configured agent. Reusable and safe to share: every run keeps its own state.

    ``max_steps`` counts tool rounds (the final answer is free); ``max_tokens`` bounds the
    provider-reported usage of the run; ``max_duration`` is a wall-clock limit per run and per
    resume. Budget exhaustion, loops, approval pauses and cancellation are outcomes; provider
    failures and bad resume decisions raise :class:`AgentError`.

    ``output_type`` makes the run produce a validated value instead of text: an
    ``Agent(model, output_type=Ticket)`` is an ``Agent[Ticket]`` whose completed outcome holds
    a ``Ticket`` (an :class:`~agent_plugin.output.Output` says the mode, retries and
    validators in one value). ``output_mode`` is ``"tool"`` (the default: a final-result
    tool), ``"native"`` (the server's JSON-schema response format) or ``"prompted"`` (the
    schema in the system prompt); a reply that does not validate, or that one of
    ``output_validators`` rejects, goes back to the model at most ``output_retries`` times
    (default 2), and each such retry is a step. Then the run ends ``output_invalid``.

    ``max_cost_usd`` ends a run ``budget_exhausted`` (reason ``cost``) once its calls cost that
    much (checked before each call; every call must be priced, see :mod:`agent_plugin.pricing`).
    ``budget_windows`` (:class:`~agent_plugin.spend.BudgetWindows`) bound what runs spend
    together per session, per memory scope and per UTC day, kept in ``spend_ledger`` (default:
    a :class:`~agent_plugin.spend.LocalLedger` of this agent's own; across workers, a
    ``RedisLedger``); a window without room ends a run ``budget_exhausted`` (reason
    ``window``), after one wrap-up call if the windows say so.
    ``telemetry`` says where runs' spans and metrics go and how model calls are priced
    (default: OpenTelemetry's global providers, ``genai-prices`` where installed).
    ``pacer`` holds each model call back under requests- and tokens-per-minute limits
    (:mod:`agent_plugin.pacing`).
    """

    def __init__(
        self,
        model: LlmClient,
        *,
        tools: Iterable[Tool] = (),
        system_prompt: str | None = None,
        max_steps: int = 10,
        max_tokens: int = 32_000,
        max_cost_usd: float | None = None,
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
        output_type: OutputType[AgentOutputT] | Output[AgentOutputT] | None = None,
        output_mode: OutputMode | None = None,
        output_retries: int | None = None,
        output_validators: Iterable[OutputValidator[AgentOutputT]] = (),
        telemetry: Telemetry | None = None,
        pacer: Pacer | None = None,
        budget_windows: BudgetWindows | None = None,
        spend_ledger: SpendLedger | None = None,
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
        self.output: Output[AgentOutputT] | None = None
        """What a run must produce (``None``: plain text, no validators)."""
        validators = tuple(output_validators)
        if output_type is not None or output_mode or output_retries is not None or validators:
            from agent_plugin.output import Output

            self.output = Output.of(output_type, output_mode, output_retries, validators)
        reserved = self.output.tool_names() if self.output is not None else frozenset()
        for name in sorted(reserved & set(self.tools.names())):
            raise AgentError.config(f"a tool named {name!r} would hide the final-result tool")
        self._definitions: tuple[tuple[ToolDefinition, ...], tuple[ToolDefinition, ...]] | None
        self._definitions = None
        self._system_prompt = system_prompt
        self._locked = False
        self._frozen_system: tuple[ChatMessage | None] | None = None
        """A locked agent's system message, rendered once (``None``: not rendered yet)."""
        self._last_system: tuple[str, ChatMessage] | None = None
        """The last system message rendered, with its text: a run whose prompt renders the same
        text shares the message (one object, not one per run)."""
        self.budget = Budget(max_steps=max_steps, max_tokens=max_tokens, max_cost_usd=max_cost_usd)
        self.per_tool_output_limit = per_tool_output_limit
        self.temperature = temperature
        self.hooks = tuple(hooks)
        self.hook_set = HookSet(list(self.hooks))
        self.policy: ToolPolicy = policy if policy is not None else AllowAll()
        self.loop_guard = loop_guard if loop_guard is not None else LoopGuard()
        self.max_duration = max_duration
        self.parallel_tool_calls = parallel_tool_calls
        if telemetry is None:
            from agent_plugin.telemetry import default_telemetry

            telemetry = default_telemetry()
        self.telemetry: Telemetry = telemetry
        """Spans, metrics and prices of runs (:mod:`agent_plugin.telemetry`)."""
        self.pacer = pacer
        self.spending: Spending | None = None
        """The spending windows runs share, their ledger and scope (``None``: none)."""
        if budget_windows is not None and budget_windows.any:
            from agent_plugin.spend import LocalLedger, Spending

            ledger = spend_ledger if spend_ledger is not None else LocalLedger()
            self.spending = Spending(budget_windows, ledger, memory_scope)

    def __repr__(self) -> str:
        output = f", output={self.output.label}" if self.output is not None else ""
        return (
            f"Agent(model={self.model.provider_name!r}, tools={self.tools.names()!r}, "
            f"max_steps={self.budget.max_steps}, max_tokens={self.budget.max_tokens}{output})"
        )

    # --- the locked prefix -------------------------------------------------------------------

    @property
    def system_prompt(self) -> str | None:
        """The base system prompt (a locked agent refuses a new one)."""
        return self._system_prompt

    @system_prompt.setter
    def system_prompt(self, value: str | None) -> None:
        if self._locked:
            raise PrefixLocked("changing the system prompt")
        self._system_prompt = value

    @property
    def locked(self) -> bool:
        return self._locked

    def lock(self) -> Agent[AgentOutputT]:
        """Fix what every request of this agent starts with, so provider prompt caches keep
        hitting: from now on the system prompt, the tools and the history its runs send cannot
        change, and trying is a :class:`~agent_plugin.errors.PrefixLocked` error.

        The system message is rendered once, at the first run after the lock (memory edits
        reach it again only after :meth:`unlock`); sessions are not compacted by its runs
        (before a run, or when the model says the context is too long: the error is raised),
        and a ``prepare_next_turn`` hook may not change the tools or the system prompt.
        Returns the agent.
        """
        self.tools.lock()
        self._locked = True
        return self

    def unlock(self) -> Agent[AgentOutputT]:
        """Allow changes again; the next request may miss the provider's cache."""
        self._locked = False
        self._frozen_system = None
        self.tools.unlock()
        return self

    def definitions(self) -> tuple[ToolDefinition, ...]:
        """What the model is offered: the tools' definitions, then the final-result tools.

        The same tuple from call to call until the tools change (the prompt's tool block stays
        cacheable)."""
        tools = self.tools.definitions()
        extra = self.output.tool_definitions if self.output is not None else ()
        if not extra:
            return tools
        cached = self._definitions
        if cached is not None and cached[0] is tools:
            return cached[1]
        combined = (*tools, *extra)
        self._definitions = (tools, combined)
        return combined

    @property
    def output_label(self) -> str | None:
        """The label of the typed output runs produce (``Ticket``), ``None`` for plain text."""
        return self.output.label if self.output is not None and self.output.typed else None

    # --- entry points ----------------------------------------------------------------------

    async def run(
        self,
        prompt: str | ChatMessage,
        *,
        history: Sequence[ChatMessage] = (),
        options: RunOptions | None = None,
        session_id: str | None = None,
        session_version: int | None = None,
    ) -> AgentTurn[AgentOutputT]:
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
        run = RunLoop(
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
    ) -> AgentTurn[AgentOutputT]:
        """Continue a run that paused for approval (or was paused by a hook), or a run
        recovered from its journal (:func:`agent_plugin.journal.recover`).

        Each decision must name a call that awaits approval; a call without a decision is
        rejected with ``no decision was given``. Calls the policy allowed or denied keep that
        verdict: the policy is not asked again. The deadline starts afresh. The run keeps the
        state's id (``options.run_id`` is not used). The agent must produce the output type
        the run was started with (a ``config`` error otherwise).
        """
        if state.output != self.output_label:
            raise AgentError.config(
                f"run {state.run_id!r} must produce {state.output or 'plain text'}, and this "
                f"agent produces {self.output_label or 'plain text'}: resume it with an agent "
                "of the same output type"
            )
        pending = state.decided(decisions)
        run = RunLoop(
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
            output_retries=state.output_retries,
            folded=state.folded,
            turn_settings=state.turn_settings,
            paused_trace=state.trace,
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
        events and a typed output as ``output_delta`` events (``options.stream`` is implied;
        an ``options.on_event`` sink gets every event too). Leaving the iteration early
        cancels the run.
        """
        opts = options or _NO_OPTIONS
        return events_of(
            lambda sink: self.run(
                prompt,
                history=history,
                options=replace(opts, on_event=tee(sink, opts.on_event), stream=True),
            )
        )

    # --- preparation -----------------------------------------------------------------------

    async def system_message(self) -> ChatMessage | None:
        """The system prompt of a run, rebuilt for every run and every resume.

        Sections, in order: the base prompt, the skills index, the memory snapshot as of now,
        and a prompted-mode output's schema. The snapshot stays frozen for the whole run: edits
        made through the ``memory`` tool persist at once but reach the prompt from the next run
        (the prefix stays cacheable). A locked agent renders it once and keeps it.
        """
        if self._locked:
            if self._frozen_system is None:
                self._frozen_system = (await self._render_system(),)
            return self._frozen_system[0]
        return await self._render_system()

    async def _render_system(self) -> ChatMessage | None:
        sections = [self.system_prompt] if self.system_prompt else []
        if self.skills:
            from agent_plugin.skills import skills_index

            sections.append(skills_index(self.skills))
        if self.memory is not None:
            from agent_plugin.memory import render_snapshot

            sections.append(render_snapshot(await self.memory.load(self.memory_scope)))
        if self.output is not None and self.output.instructions is not None:
            sections.append(self.output.instructions)
        if not sections:
            return None
        text, last = "\n\n".join(sections), self._last_system
        if last is not None and last[0] == text:
            return last[1]  # messages are frozen: runs can share one
        message = ChatMessage.system(text)
        self._last_system = (text, message)
        return message
