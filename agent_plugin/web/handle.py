"""What a route gets: :class:`AppAgent`, the app's agent ready to run, through the
:data:`AgentHandle` dependency (``agent: AgentHandle`` in a route's signature)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypeAlias

from fastapi import Depends, HTTPException, Request
from fastapi.responses import StreamingResponse
from typing_extensions import TypeVar

from agent_plugin import sessions
from agent_plugin.agent import Agent
from agent_plugin.branching import Branch, SessionLock
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import AgentEvent
from agent_plugin.jobs import RunArgs, RunHandle
from agent_plugin.jobs.args import checked_run_id
from agent_plugin.options import AgentOverrides, RunOptions
from agent_plugin.outcomes import AgentTurn, ApprovalDecision, CompactionReport, RunState
from agent_plugin.output import Output, OutputType
from agent_plugin.records import RunPage, RunRecord, RunStatus
from agent_plugin.runtime import AgentRuntime
from agent_plugin.steering import MessageMode
from agent_plugin.web.sse import local_events, sse_response

if TYPE_CHECKING:
    from agent_plugin.jobs import HeartbeatStats, RunQueue

__all__ = [
    "NOT_INSTALLED",
    "STATE_KEY",
    "AgentHandle",
    "AppAgent",
    "DisconnectPolicy",
    "get_app_agent",
]

logger = logging.getLogger("agent_plugin")

NOT_INSTALLED: Final = (
    "agent plugin is not installed or has not started: serve the app with the plugin's lifespan "
    "(FastAPI(lifespan=plugin.lifespan) or plugin.install(app))"
)

STATE_KEY: Final = "agent_plugin_app"
"""Where a running plugin keeps its :class:`AppAgent` on ``app.state``."""

DisconnectPolicy: TypeAlias = Literal["cancel", "continue"]
"""What a streamed run does when its client goes away: stop, or run to the end unobserved."""

T = TypeVar("T", default=str)


class AppAgent:
    """The app's agent, ready to run: what :data:`AgentHandle` gives a route.

    ``run`` is one task; ``chat`` continues a session (saved in the session store); both
    take ``scope``, the memory scope (one per user or tenant). ``resume`` continues a run
    paused for approval, saving to its session when it ran in one; ``stream`` answers with
    Server-Sent Events. ``enqueue`` queues a background run for an arq worker and
    ``enqueue_resume`` the resume of a paused one; ``run_status``, ``list_runs``, ``cancel`` and
    ``steer`` reach background runs from any process (``jobs.events`` reads a run's events).

    ``output_type=`` (a type, or an :class:`~agent_plugin.output.Output`) makes ``run``,
    ``chat``, ``resume`` and ``stream`` produce a validated value: ``await agent.run(prompt,
    output_type=Ticket)`` is an ``AgentTurn[Ticket]``. A background run names a registered
    output instead: ``enqueue(prompt, output="ticket")``.
    """

    def __init__(self, runtime: AgentRuntime, queue: RunQueue | None = None) -> None:
        self.runtime = runtime
        self.queue = queue

    def __repr__(self) -> str:
        return f"AppAgent({self.runtime!r}, background={'on' if self.queue else 'off'})"

    def agent(
        self,
        scope: str | None = None,
        *,
        session: str | None = None,
        output_type: OutputType[T] | Output[T] | None = None,
    ) -> Agent[T]:
        """The configured agent with the memory of ``scope`` (default ``"agent"``), producing
        ``output_type`` (default: text)."""
        overrides = AgentOverrides(memory_scope=scope, session=session)
        return self._agent_for(overrides, output_type)

    def tool_names(self) -> list[str]:
        """The names of the tools the agent offers the model, sorted."""
        return self.runtime.tool_names()

    def _agent_for(
        self, overrides: AgentOverrides, output: OutputType[Any] | Output[Any] | None = None
    ) -> Agent[Any]:
        book = self.queue.enqueue_followup if self.queue is not None else None
        return self.runtime.agent_for(overrides, book_followup=book, output=output)

    async def run(
        self,
        prompt: str,
        *,
        scope: str | None = None,
        options: RunOptions | None = None,
        output_type: OutputType[T] | Output[T] | None = None,
    ) -> AgentTurn[T]:
        """Run one task from scratch (producing ``output_type``, if given)."""
        return await self.agent(scope, output_type=output_type).run(prompt, options=options)

    async def chat(
        self,
        session: str,
        prompt: str,
        *,
        scope: str | None = None,
        options: RunOptions | None = None,
        output_type: OutputType[T] | Output[T] | None = None,
        branch: int | None = None,
    ) -> AgentTurn[T]:
        """Continue ``session`` with ``prompt`` (on the branch ending at entry ``branch``;
        default: the head); the turn is saved unless it paused. The session keeps the final
        output (a typed run's final-result call) for the next turn."""
        return await sessions.run(
            self.agent(scope, session=session, output_type=output_type),
            prompt,
            session=session,
            store=self.runtime.session_store,
            options=options,
            branch=branch,
        )

    async def branches(self, session: str) -> list[Branch]:
        """The branches of ``session``, one per leaf; ``not_found`` for a session without
        entries."""
        found = await sessions.branches(session, store=self.runtime.session_store)
        if not found:
            raise AgentError(ErrorKind.NOT_FOUND, f"session {session!r} has no entries")
        return found

    async def fork(self, session: str, at_seq: int) -> Branch:
        """Start a branch of ``session`` after entry ``at_seq`` (its next run continues it);
        ``not_found`` for an unknown entry, ``conflict`` before a locked session's lock."""
        return await sessions.fork(session, at_seq, store=self.runtime.session_store)

    async def lock(self, session: str, *, scope: str | None = None) -> SessionLock:
        """Lock ``session`` with the app's agent (of ``scope``): its runs must bring the same
        system prompt and tools, and its history up to now stays as it is."""
        return await sessions.lock(
            self.agent(scope, session=session), session, store=self.runtime.session_store
        )

    async def unlock(self, session: str) -> None:
        """Lift ``session``'s lock."""
        await sessions.unlock(session, store=self.runtime.session_store)

    async def compact(self, session: str, *, force: bool = True) -> CompactionReport | None:
        """Compact ``session`` now with the app's compaction settings (the defaults without);
        ``None``: nothing to fold. Raises ``CONFLICT`` if a turn was saved meanwhile."""
        return await sessions.compact(
            self.agent(session=session), session, store=self.runtime.session_store, force=force
        )

    async def resume(
        self,
        state: RunState,
        decisions: Iterable[ApprovalDecision] = (),
        *,
        scope: str | None = None,
        options: RunOptions | None = None,
        output_type: OutputType[T] | Output[T] | None = None,
    ) -> AgentTurn[T]:
        """Continue a paused run with the reviewers' decisions (saved to its session, if it
        ran in one); a typed run needs the ``output_type`` it was started with."""
        return await sessions.resume(
            self.agent(scope, session=state.session_id, output_type=output_type),
            state,
            decisions,
            store=self.runtime.session_store,
            options=options,
        )

    def stream(
        self,
        prompt: str,
        *,
        session: str | None = None,
        scope: str | None = None,
        on_disconnect: DisconnectPolicy = "cancel",
        output_type: OutputType[Any] | Output[Any] | None = None,
        branch: int | None = None,
    ) -> StreamingResponse:
        """Run a task (in ``session``, if given, on the branch ending at entry ``branch``:
        default its head) and stream its events as Server-Sent Events.

        Each event is one SSE message: ``id`` (1, 2, ...), ``event`` (the event's ``type``) and
        ``data`` (its JSON, redacted like every event that leaves the process); the last is
        ``run_end``. If the run fails before it starts, one ``error`` event carries the error.
        ``on_disconnect="cancel"`` stops the run when the client goes away; ``"continue"`` lets
        it finish (and save its session turn). With ``output_type``, ``output_delta`` events
        carry the output as it grows, and ``run_end``'s summary the validated value.
        """
        agent = self.agent(scope, session=session, output_type=output_type)
        store = self.runtime.session_store
        queue: asyncio.Queue[AgentEvent | BaseException | None] = asyncio.Queue()

        async def work() -> None:
            options = RunOptions(on_event=queue.put_nowait, stream=True)
            await sessions.run(
                agent, prompt, session=session, store=store, options=options, branch=branch
            )

        def finished(task: asyncio.Task[None]) -> None:
            error = None if task.cancelled() else task.exception()
            queue.put_nowait(error)

        async def events() -> AsyncIterator[AgentEvent | BaseException]:
            task = self.runtime.spawn(work())
            task.add_done_callback(finished)
            ended = False
            try:
                while True:
                    item = await queue.get()
                    if item is None or isinstance(item, BaseException):
                        if not ended:
                            yield item or AgentError(ErrorKind.INTERNAL, "the run stopped")
                        return
                    yield item
                    ended = ended or item.type == "run_end"
            finally:
                if on_disconnect == "cancel" and not task.done():
                    task.cancel()

        return sse_response(local_events(events()), retry_ms=None)

    # --- background runs -----------------------------------------------------------------

    @property
    def jobs(self) -> RunQueue:
        """The background-run queue; a ``config`` error when background runs are off."""
        if self.queue is None:
            raise AgentError.config(
                "background runs are off for this plugin (jobs=False, or in-memory stores "
                "only): pass jobs=True to AgentPlugin"
            )
        return self.queue

    async def enqueue(
        self,
        prompt: str,
        *,
        session: str | None = None,
        scope: str | None = None,
        system_prompt: str | None = None,
        max_steps: int | None = None,
        deliver: bool = False,
        run_id: str | None = None,
        delay: float | timedelta | None = None,
        idempotency_key: str | None = None,
        output: str | None = None,
        message_mode: MessageMode | None = None,
        branch: int | None = None,
    ) -> RunHandle:
        """Queue a background run; answer its id and the path that reports its status.

        ``session`` and ``scope`` (the memory scope), ``system_prompt`` and ``max_steps`` set
        the run's agent (``branch``: the session entry it continues; default the head);
        ``output`` names a registered output type the run must produce (its record's outcome
        then holds the output as JSON; an unknown name is ``invalid``);
        ``message_mode`` is the mode of a message sent to the run without one (for a
        session's runs, the session's default: see :mod:`agent_plugin.steering`);
        ``deliver`` reports how it ended to the plugin's delivery; ``delay``
        (seconds or a timedelta) starts it later. The run's record exists (``queued``) before
        its job reaches Redis; the same ``run_id`` twice is one run. With ``idempotency_key``
        (instead of a ``run_id``) the same key and request are one run for a day, and the
        same key with another request is a ``conflict`` (see :meth:`RunQueue.enqueue_once`).
        ``unavailable`` when Redis cannot be reached, ``conflict`` for a busy session under
        ``session_lock = "reject"``, ``config`` for a bad argument (naming it).
        """
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        if seconds is not None and (not math.isfinite(seconds) or seconds < 0):
            raise AgentError.config(f"a run's delay must be 0 seconds or more, got {delay!r}")
        if output is not None:
            self.runtime.output_named(output)
        args = RunArgs.checked(
            prompt,
            overrides={
                "session": session,
                "memory_scope": scope,
                "system_prompt": system_prompt,
                "max_steps": max_steps,
                "output": output,
                "message_mode": message_mode,
                "branch": branch,
            },
            deliver=deliver,
        )
        if idempotency_key is not None:
            if run_id is not None:
                raise AgentError.config("give a run its run_id or an idempotency_key, not both")
            return await self.jobs.enqueue_once(idempotency_key, args, delay=seconds or None)
        return await self.jobs.enqueue(checked_run_id(run_id), args, delay=seconds or None)

    async def enqueue_resume(
        self, run_id: str, decisions: Iterable[ApprovalDecision] = ()
    ) -> RunHandle:
        """Accept reviewers' decisions for a paused background run and queue its resume.

        The paused state stays in the run's record; ``conflict`` when the run is not paused,
        a decision names a call that does not await approval, or the pause was decided
        already; ``not_found`` for an unknown run.
        """
        return await self.jobs.enqueue_resume(run_id, list(decisions))

    async def run_status(self, run_id: str) -> RunRecord:
        """The record of a background run; ``not_found`` for an unknown id."""
        return await self.jobs.get(run_id)

    async def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        session: str | None = None,
        origin: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> RunPage:
        """Background runs, newest first, ``limit`` at a time (at most 200), optionally of one
        ``status``, ``session`` or ``origin``; ``cursor`` is a page's ``next_cursor``."""
        return await self.jobs.store.list_runs(
            status=status, session_id=session, origin=origin, limit=limit, cursor=cursor
        )

    async def cancel(self, run_id: str, reason: str = "cancelled") -> RunRecord:
        """Cancel a queued, paused or running background run (see :meth:`RunQueue.cancel`)."""
        return await self.jobs.cancel(run_id, reason)

    async def steer(self, run_id: str, text: str, mode: MessageMode | None = None) -> RunRecord:
        """Send a message to a running background run; ``mode`` says when it joins (``None``:
        the run's ``message_mode``, else ``steer``: before its next model call)."""
        return await self.jobs.steer(run_id, text, mode)

    async def heartbeat_stats(self) -> HeartbeatStats:
        """How the heartbeat's ticks went, across every worker: started, skipped because the
        session was busy or the precheck said no, failed; and the latest tick."""
        return await self.jobs.heartbeat_stats()


def get_app_agent(request: Request) -> AppAgent:
    """The dependency behind :data:`AgentHandle`: 503 when the plugin is not running."""
    agent: Any = getattr(request.app.state, STATE_KEY, None)
    if not isinstance(agent, AppAgent):
        raise HTTPException(status_code=503, detail=NOT_INSTALLED)
    return agent


async def _app_agent(request: Request) -> AppAgent:
    # async, so FastAPI calls it in the event loop: a plain function dependency is sent to
    # the thread pool on every request, which costs more than the whole lookup
    return get_app_agent(request)


AgentHandle = Annotated[AppAgent, Depends(_app_agent)]
"""Write ``agent: AgentHandle`` in a route's signature to get the app's agent."""
