"""One delivery of a run's job: start the run (or find it over or held elsewhere), drive it
from its checkpoints, record how it ended, and answer one :data:`Verdict`.

The verdict is the whole outcome of the delivery: :class:`Done` (the job ends, its run
recorded), :class:`RetryIn` (deliver the job again in so many seconds: a retry's backoff, or
Redis or the database out of reach) or :class:`Superseded` (another delivery holds the run;
come back later, touching nothing). The worker turns it into arq's answer in one place.

While the delivery runs, a :class:`~agent_plugin.jobs.keeper.Keeper` renews arq's claim on the
job and the run's lease in the database (the claim's first cut to the lease rides on the run's
first look at its control channel). A run of a session starts when its turn comes, as
the database says (which refuses to start two runs of a session at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Final, TypeAlias, TypeVar

from arq.connections import ArqRedis
from pydantic import ValidationError
from redis.exceptions import RedisError

from agent_plugin import sessions
from agent_plugin.agent import Agent
from agent_plugin.cancellation import CancelToken
from agent_plugin.errors import AgentError, ErrorKind, SessionTaken, describe
from agent_plugin.events import (
    AgentEvent,
    OutcomeSummary,
    RetryExhausted,
    RetryScheduled,
    RetrySucceeded,
    RunEnded,
    ToolProgress,
)
from agent_plugin.jobs.args import RunArgs
from agent_plugin.jobs.keeper import Keeper
from agent_plugin.jobs.progress import ProgressAtCheckpoints, ToolProgressWriter
from agent_plugin.jobs.queue import RunQueue
from agent_plugin.jobs.redis import quietly
from agent_plugin.journal import JournalEntry, Started, recover
from agent_plugin.live import (
    ControlWatcher,
    EventPublisher,
    RunControlChannel,
    RunEventStream,
    StreamWriter,
)
from agent_plugin.logs import run_context
from agent_plugin.options import EventSink, RunOptions
from agent_plugin.outages import keep_trying
from agent_plugin.outcomes import AgentOutcome, AwaitingApproval, RunState
from agent_plugin.proactive import DEFAULT_DELIVERY_TIMEOUT, ReportSource, deliver_outcome
from agent_plugin.records import RunRecord, RunStatus, status_of
from agent_plugin.runtime import AgentRuntime
from agent_plugin.steering import Steering
from agent_plugin.storage.leased_journal import LeasedRunJournal
from agent_plugin.telemetry import job_scope

__all__ = [
    "Attempt",
    "Done",
    "RetryIn",
    "Stage",
    "Superseded",
    "Verdict",
]

logger = logging.getLogger("agent_plugin.jobs")

T = TypeVar("T")

_REPORTABLE: Final = frozenset({RunStatus.COMPLETE, RunStatus.AWAITING_APPROVAL})
_MARKER_TTL: Final = 86_400
_TURN_POLL_CAP: Final = 1.0
"""Seconds between two looks at the session, at most, for a run waiting for its turn."""


# --- the verdict ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Done:
    """The job is over: arq records ``status``. ``ended`` is how the run ended (what its
    report tells, for a run with delivery on), when this delivery knows it."""

    status: str
    ended: AgentOutcome | OutcomeSummary | None = None


@dataclass(frozen=True, slots=True)
class RetryIn:
    """Deliver the job again in ``seconds``."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Superseded:
    """Another delivery holds the run, or waits out its backoff: everything is left to it.
    ``seconds``: come back then (the job must stay queued while that
    delivery lives); ``None``: the job is over."""

    seconds: float | None


Verdict: TypeAlias = Done | RetryIn | Superseded


class Stage(Enum):
    """How far a delivery got: whether it holds the run."""

    WAITING = "waiting"
    """Not started: waiting for the session's turn, or the start was refused."""
    RUNNING = "running"
    """This delivery started the run (:attr:`Attempt.attempt` is its number)."""
    SUPERSEDED = "superseded"
    """Another delivery took the run over."""


@dataclass
class _Live:
    """What a delivery hands the running agent: its cancel token and steering queue (fed by
    the worker's :class:`~agent_plugin.live.ControlWatcher`) and its event sink (``None``: no
    events)."""

    cancel: CancelToken
    steering: Steering
    sink: EventSink | None


# --- one delivery ---------------------------------------------------------------------------


class Attempt:
    """One delivery of ``agent_run`` or (``resume``) ``agent_resume`` for one run."""

    def __init__(
        self,
        runtime: AgentRuntime,
        queue: RunQueue,
        redis: ArqRedis,
        watcher: ControlWatcher,
        run_id: str,
        *,
        job_id: str,
        events: StreamWriter | None = None,
        resume: bool = False,
        trace: dict[str, str] | None = None,
    ) -> None:
        self.runtime = runtime
        self.queue = queue
        self.store = queue.store
        self.options = queue.options
        self.redis = redis
        self.watcher = watcher
        self.run_id = run_id
        self.job_id = job_id
        self.resume = resume
        self.trace = trace
        """The resume request's trace context (a fresh run's is in its arguments)."""
        self.stage = Stage.WAITING
        self.attempt: int | None = None
        """The run's attempt number this delivery started (once :attr:`stage` is RUNNING)."""
        self.session: str | None = None
        self.live: _Live | None = None
        self.events = events
        """The worker's writer of event streams (None: the run's publisher writes its own)."""
        self.publisher: EventPublisher | None = None
        """The sink of the run's event stream (once something is published): the agent's
        events and how the run ended go through it, in order, and out before the job ends."""
        self.held_end: RunEnded | None = None
        """The agent's own ``run_end``: published once the record says how the run ended."""
        self.progress: ProgressAtCheckpoints | None = None
        """How far the run is, as its record says (set once it is driven)."""
        self.journal: LeasedRunJournal | None = None
        """The run's journal (set once it is driven): its writes renew the lease too."""
        self.keeper: Keeper | None = None
        """What renews arq's claim and the run's lease while the delivery runs: it cuts the
        claim to the lease on the run's first look at its control channel (see :meth:`_drive`),
        one round trip for both."""

    async def run(self) -> Verdict:
        """Deliver the job once, and report how the run ended when it has delivery on.

        Redis or the database out of reach: deliver it again a lease later (bounded by
        ``max_deliveries``) instead of letting arq drop it. A run that cannot even start (its
        stored arguments do not decode) raises its error.
        """
        with run_context(self.run_id):
            try:
                return await self._run()
            finally:
                if self.publisher is not None:  # what the run published goes out first
                    await self.publisher.aclose()
                # each holds this delivery back (a callback): let go of them, or every run
                # is a reference cycle, left to the cyclic garbage collector (full
                # collections, in a busy worker) instead of freed as the delivery ends
                self.keeper = self.journal = self.live = None

    async def _run(self) -> Verdict:
        keeper = self.keeper = Keeper(
            self.redis, self.job_id, self.options.lease, self._renew_lease, claim_at_once=False
        )
        async with keeper:
            try:
                try:
                    stored, started = await self._open()
                except AgentError as error:
                    if error.kind is not ErrorKind.NOT_FOUND:
                        raise
                    logger.warning("job %s: there is no run %s", self.job_id, self.run_id)
                    return Done("unknown")
                args = await self._args_of(stored, started)
                self.session = args.overrides.session
                with run_context(self.run_id, self.session):
                    verdict = await self._within_timeout(args, started)
            except (AgentError, RedisError, OSError, TimeoutError) as error:
                if isinstance(error, AgentError) and not error.retryable:
                    await self.fail_unstarted(error)
                    raise
                lease = self.options.lease
                logger.warning("run %s: %s; trying again in %g s", self.run_id, error, lease)
                return RetryIn(lease)
            if isinstance(verdict, Done) and args.deliver and verdict.ended is not None:
                await self._report(args, verdict.ended)
            return verdict

    async def _open(self) -> tuple[dict[str, object], RunRecord | None]:
        """The run's stored arguments and, for a run of no session, its start, in one
        transaction (a resume, or a run of a session, starts later: see
        :meth:`_start_and_drive`)."""
        if self.resume:
            return await self.store.args(self.run_id), None
        stored, started = await self.store.open_run(
            self.run_id, job_id=self.job_id, lease=self.options.lease
        )
        if started is not None:
            self.stage, self.attempt = Stage.RUNNING, started.attempt
        return stored, started

    async def _args_of(self, stored: dict[str, object], started: RunRecord | None) -> RunArgs:
        """The run's arguments; a run started with arguments that do not decode goes back to
        the queue first (see :meth:`fail_unstarted`)."""
        try:
            return _decoded(self.run_id, stored)
        except AgentError:
            if started is not None:
                await quietly(self.store.requeue(self.run_id, attempt=started.attempt))
                self.stage, self.attempt = Stage.WAITING, None
            raise

    async def _within_timeout(self, args: RunArgs, started: RunRecord | None) -> Verdict:
        timeout = self.queue.job_timeout
        limit = asyncio.timeout(timeout)
        try:
            try:
                async with limit:
                    return await self._start_and_drive(args, started)
            except TimeoutError:
                if not limit.expired():
                    raise
                if self.stage is Stage.WAITING and self.session is not None:
                    error = AgentError(
                        ErrorKind.CONFLICT,
                        f"session {self.session!r} stayed busy for {timeout:g} s",
                    )
                else:
                    error = AgentError(
                        ErrorKind.BUDGET,
                        f"the run did not finish within the job timeout ({timeout:g} s)",
                    )
                return await self._fail(error, self.attempt)
        except asyncio.CancelledError:  # the worker is shutting down; arq runs the job again
            if self.journal is not None:  # the results it has go first
                await asyncio.shield(quietly(self.journal.close()))
            if self.attempt is not None:  # (a run it never started may be another's to run)
                requeue = self.store.requeue(self.run_id, attempt=self.attempt)
                await asyncio.shield(quietly(requeue))
            raise

    async def _start_in_turn(self) -> RunRecord:
        """Start the run once it is its turn in its session (a run of no session at once).

        It is the run's turn when no other run of the session is in progress and none
        enqueued before it waits to run (for its retry too): runs of a session start in the
        order they were enqueued, as the database says (:meth:`SqlRunStore.session_turn
        <agent_plugin.storage.SqlRunStore.session_turn>`). The database also refuses a start
        while another run of the session is in progress (it started between the question and
        the start): the run waits on. Backs off up to a second; bounded by the job timeout.
        """
        delay = 0.05
        while True:
            if self.session is None or await self.store.session_turn(self.session, self.run_id):
                try:
                    return await self.store.start(
                        self.run_id,
                        job_id=self.job_id,
                        lease=self.options.lease,
                        resume=self.resume,
                    )
                except SessionTaken:
                    logger.info("run %s: its session was taken meanwhile; waiting", self.run_id)
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, _TURN_POLL_CAP)

    async def _start_and_drive(self, args: RunArgs, started: RunRecord | None) -> Verdict:
        try:
            record = started or await self._start_in_turn()
        except AgentError as error:  # a duplicate delivery of a run that moved on
            if error.kind not in (ErrorKind.CONFLICT, ErrorKind.NOT_FOUND):
                raise
            if error.retry_after is not None:  # held: by a live delivery, or a retry's backoff
                return self._held_elsewhere(error.retry_after, error)
            return await self._current_status()
        self.stage = Stage.RUNNING
        attempt = self.attempt = record.attempt
        if attempt == 1 and not self.resume and record.started_at is not None:
            wait = (record.started_at - record.created_at).total_seconds()
            self.runtime.telemetry.queue_waited(wait, args.origin)
        if attempt > self.options.max_deliveries:
            return await self._give_up(attempt)
        try:
            outcome = await self._drive(record, args)
            if self.journal is not None:
                await self.journal.close()
            ended_at = self.progress.at_end(outcome) if self.progress is not None else None
            record = await self._finish(outcome, attempt, ended_at)
            if attempt > 1:  # a retry: its retries end here
                await self._end_retries(None)
            await self._publish_end(self.held_end or RunEnded.of(self.run_id, outcome))
        except AgentError as error:
            return await self._failed(error, attempt)
        except Exception as error:  # a bug in app code (a hook, a policy, a store)
            message = describe(error)
            logger.error("run %s failed unexpectedly: %s", self.run_id, message)
            logger.debug("run %s: traceback", self.run_id, exc_info=True)
            return await self._failed(AgentError(ErrorKind.INTERNAL, message), attempt)
        logger.info("run %s %s", self.run_id, record.status)
        if attempt > 1:  # retries are counted only by attempts before this one
            await self._forget_retries()
        return Done(record.status, ended=outcome)

    async def _current_status(self) -> Verdict:
        current = await self.store.get(self.run_id)
        if current is None:
            return Done("unknown")
        await self._end_stream_of(current)
        reportable = current.outcome is not None and current.status in _REPORTABLE
        return Done(current.status, ended=current.outcome if reportable else None)

    async def _end_stream_of(self, record: RunRecord) -> None:
        """Give the event stream of a run found ended its ``run_end`` when it lacks one (the
        worker died between the record and the event): readers stop waiting, and the stream
        expires as after any end."""
        ended = record.status.finished or record.status is RunStatus.AWAITING_APPROVAL
        if not (self.options.events and ended):
            return
        stream = self._event_stream()
        try:
            last = await self.redis.xrevrange(stream.key, count=1)
        except (RedisError, OSError, TimeoutError) as error:
            logger.warning("run %s: cannot read its event stream: %s", self.run_id, error)
            return
        if not last or last[0][1].get(b"type") == b"run_end":
            return  # no stream (expired, or events were off), or it ended already
        logger.info("run %s: its event stream lacked its end; sent from the record", self.run_id)
        await self._publish_end(
            RunEnded(run_id=self.run_id, summary=record.outcome, error=record.error)
        )

    def _held_elsewhere(self, remaining: float, why: AgentError) -> Superseded:
        """The run is held by a live delivery (this job's claim in Redis vanished, or another
        job's delivery runs it) or waits for a retry's backoff: come back when that ends,
        leaving everything to its holder."""
        logger.info("run %s: %s", self.run_id, why.message)
        self.stage = Stage.SUPERSEDED
        return Superseded(max(remaining, 0.05) + random.uniform(0, 0.1))

    async def _superseded(self, why: object) -> Superseded:
        """A later delivery took this one's run over: everything is left to it, and while it
        runs the job stays queued under it (ending the job here would take it off the queue,
        and a crash of that delivery would then lose the run)."""
        logger.warning("run %s was taken over by another delivery: %s", self.run_id, why)
        self.stage = Stage.SUPERSEDED
        current = await self.store.get(self.run_id)
        if current is not None and current.status is RunStatus.IN_PROGRESS:
            return Superseded(2 * self.options.lease)
        return Superseded(None)

    async def _give_up(self, attempt: int) -> Verdict:
        """Fail a run started more often than ``max_deliveries`` (a run whose worker keeps
        dying: out of memory, say). Deliveries that never started it do not count."""
        error = AgentError(
            ErrorKind.UNAVAILABLE,
            f"the run was started {attempt - 1} times without finishing (its worker stopped "
            "each time); giving up",
        )
        return await self._fail(error, attempt)

    async def _fail(self, error: AgentError, attempt: int | None) -> Verdict:
        """Record that ``error`` ended the run and publish its end; a run a later delivery
        took over is left to that one."""
        try:
            await self._durably(
                "recording how it failed",
                lambda: self.store.fail(self.run_id, error.info(), attempt=attempt),
                landed=lambda record: record.status is RunStatus.FAILED,
            )
        except AgentError as refused:
            if refused.kind is not ErrorKind.CONFLICT:
                raise
            return await self._superseded(refused)
        await self._publish_end(RunEnded(run_id=self.run_id, error=error.info()))
        return Done(RunStatus.FAILED)

    async def _failed(self, error: AgentError, attempt: int) -> Verdict:
        """Record the error (or schedule a retry); if the database or Redis is down so that
        neither can be recorded, the whole delivery is tried again a lease later."""
        try:
            return await self._record_failure(error, attempt)
        except (AgentError, RedisError, OSError, TimeoutError) as trouble:
            if isinstance(trouble, AgentError) and not trouble.retryable:
                raise
            logger.warning("run %s: cannot record how it ended (%s); later", self.run_id, trouble)
            return RetryIn(self.options.lease)

    async def _record_failure(self, error: AgentError, attempt: int) -> Verdict:
        if not await self._persist("reading its record", lambda: self._still_ours(attempt)):
            return await self._superseded(error)
        try:
            return await self._record_own_failure(error, attempt)
        except AgentError as refused:  # taken over meanwhile: the moves are fenced by attempt
            if refused.kind is not ErrorKind.CONFLICT:
                raise
            return await self._superseded(refused)

    async def _record_own_failure(self, error: AgentError, attempt: int) -> Verdict:
        if _out_of_reach(error) and not self.resume:
            # the database (or Redis) stayed out of reach for a write the run could not keep
            # trying: deliver it again a lease later, from its checkpoints, using up none of
            # its attempts (max_deliveries bounds these)
            lease = self.options.lease
            await self._persist(
                "queueing it again",
                lambda: self.store.requeue(self.run_id, attempt=attempt, not_before=lease),
            )
            logger.warning("run %s: %s; delivered again in %g s", self.run_id, error, lease)
            return RetryIn(lease)
        if error.retryable and not self.resume:  # a resume's approved calls may act: no retry
            retries = int(await self.redis.incr(self._retries_key))
            await self.redis.expire(self._retries_key, 86_400)
            if retries == 1:  # when the retries began, for their end event
                await self.redis.set(self._since_key, repr(time.time()), nx=True, ex=86_400)
            if retries < self.options.max_attempts:
                self.runtime.telemetry.run_retried(error)
                delay = self.options.backoff(retries, error.retry_after)
                await self._persist(
                    "queueing its retry",
                    lambda: self.store.requeue(self.run_id, attempt=attempt, not_before=delay),
                )
                logger.info(
                    "run %s: %s; attempt %d of %d in %.1f s",
                    self.run_id,
                    error,
                    retries + 1,
                    self.options.max_attempts,
                    delay,
                )
                await self._publish_end(
                    RetryScheduled(
                        run_id=self.run_id,
                        attempt=retries + 1,
                        max_attempts=self.options.max_attempts,
                        wait_seconds=delay,
                        error=error.info(),
                    )
                )
                return RetryIn(delay)
        logger.warning("run %s failed: %s", self.run_id, error)
        await self._end_retries(error)
        verdict = await self._fail(error, attempt)
        await self._forget_retries()
        return verdict

    async def _still_ours(self, attempt: int) -> bool:
        record = await self.store.get(self.run_id)
        return (
            record is not None
            and record.status is RunStatus.IN_PROGRESS
            and record.attempt == attempt
        )

    # --- durable writes ---------------------------------------------------------------------

    def _holds_run(self) -> bool:
        """Whether this delivery still holds its run (no later delivery took it over)."""
        return self.stage is Stage.RUNNING

    async def _persist(self, what: str, write: Callable[[], Awaitable[T]]) -> T:
        """``write`` through a database outage: tried again with backoff for as long as this
        delivery holds its run (bounded by the job timeout around it), so what the run has
        done (a finished tool call's result, its end) is kept, never given up for a later
        delivery to do again. A delivery that was taken over stops trying at once."""
        cap = max(0.1, min(self.options.lease / 3, 2.0))
        return await keep_trying(
            f"run {self.run_id}: {what}", write, go_on=self._holds_run, max_delay=cap, log=logger
        )

    async def _durably(
        self,
        what: str,
        move: Callable[[], Awaitable[RunRecord]],
        *,
        landed: Callable[[RunRecord], bool],
    ) -> RunRecord:
        """:meth:`_persist` a move of the run's record that may have committed although it
        failed (the connection broke after the commit): a try that is then refused finds the
        record moved by this attempt as ``landed`` says, and counts it as done."""
        unsure = False

        async def attempt() -> RunRecord:
            nonlocal unsure
            try:
                return await move()
            except AgentError as error:
                if _out_of_reach(error):
                    unsure = True
                elif unsure and error.kind is ErrorKind.CONFLICT:
                    current = await self.store.get(self.run_id)
                    if current is not None and current.attempt == self.attempt and landed(current):
                        return current
                raise

        return await self._persist(what, attempt)

    async def _finish(
        self, outcome: AgentOutcome, attempt: int, progress: tuple[int, str] | None
    ) -> RunRecord:
        """Record how the run ended, through a database outage (see :meth:`_durably`)."""
        status = status_of(outcome)
        return await self._durably(
            "recording how it ended",
            lambda: self.store.finish(self.run_id, outcome, attempt=attempt, progress=progress),
            landed=lambda record: record.status is status,
        )

    async def _renew_lease(self) -> None:
        """Renew the run's lease (the keeper calls this); a run another delivery took over
        meanwhile is cancelled here, so this delivery stops at its next step instead of
        running on beside the new one (its checkpoints and its end are refused anyway)."""
        attempt, live = self.attempt, self.live
        if attempt is None or self.stage is not Stage.RUNNING:
            return
        journal = self.journal
        if journal is not None and time.monotonic() - journal.renewed_at < self.options.lease / 3:
            return  # a checkpoint renewed it just now
        if await self.store.renew_lease(self.run_id, attempt=attempt, lease=self.options.lease):
            return
        current = await self.store.get(self.run_id)
        if current is None or current.attempt == attempt:
            return  # it ended: the delivery is finishing
        logger.warning(
            "run %s was taken over by attempt %d; attempt %d stops",
            self.run_id,
            current.attempt,
            attempt,
        )
        self.stage = Stage.SUPERSEDED
        if live is not None:
            live.cancel.cancel("taken over by another delivery")

    async def fail_unstarted(self, error: AgentError) -> None:
        """Record ``error`` for a queued run that deliveries could not even start (its stored
        arguments do not decode, say), once ``max_attempts`` of them failed so: the reconciler
        would otherwise deliver it again and again while the record says ``queued``. (Not at
        the first: a worker of an older release, during an upgrade, may not read what a newer
        app stored, and the next delivery may reach a newer worker.)"""
        if self.stage is not Stage.WAITING:
            return
        try:
            record = await self.store.get(self.run_id)
            if record is None or record.status is not RunStatus.QUEUED:
                return
            key = f"{self.options.key_prefix}unstartable:{self.run_id}"
            failures = int(await self.redis.incr(key))
            await self.redis.expire(key, 86_400)
            if failures < self.options.max_attempts:
                logger.warning(
                    "run %s cannot start (%d of %d): %s",
                    self.run_id,
                    failures,
                    self.options.max_attempts,
                    error,
                )
                return
            await self.store.fail(self.run_id, error.info(), attempt=record.attempt)
            await self.redis.delete(key)
        except (AgentError, RedisError, OSError, TimeoutError) as trouble:
            logger.warning("run %s: cannot record that it failed: %s", self.run_id, trouble)
            return
        logger.warning("run %s failed before it could start: %s", self.run_id, error)
        await self._publish_end(RunEnded(run_id=self.run_id, error=error.info()))

    async def _forget_retries(self) -> None:
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            await self.redis.delete(self._retries_key, self._since_key)

    async def _end_retries(self, error: AgentError | None) -> None:
        """Publish how the run's retries ended (``error``: the last attempt's), if it had any:
        every ``retry`` event has its ``retry_succeeded`` or ``retry_exhausted``."""
        if not self.options.events:
            return
        try:
            failures, since = await self.redis.mget(self._retries_key, self._since_key)
        except (RedisError, OSError, TimeoutError) as trouble:
            logger.warning("run %s: cannot read its retries: %s", self.run_id, trouble)
            return
        if failures is None:
            return
        failed = int(failures)
        if error is not None and not (error.retryable and not self.resume):
            failed += 1  # this attempt's failure was not counted: it is not retried
        elapsed = max(time.time() - float(since), 0.0) if since is not None else 0.0
        event: AgentEvent
        if error is None:
            event = RetrySucceeded(run_id=self.run_id, attempts=failed + 1, elapsed_seconds=elapsed)
        else:
            event = RetryExhausted(
                run_id=self.run_id, attempts=failed, elapsed_seconds=elapsed, error=error.info()
            )
        await self._publish_end(event)

    @property
    def _retries_key(self) -> str:
        return f"{self.options.key_prefix}retries:{self.run_id}"

    @property
    def _since_key(self) -> str:
        return f"{self.options.key_prefix}retries_since:{self.run_id}"

    # --- reports ---------------------------------------------------------------------------

    async def _report(self, args: RunArgs, ended: AgentOutcome | OutcomeSummary) -> None:
        """Deliver how the run ended, once per job (at least once: a worker that dies while
        delivering is replaced by one that delivers again).

        A marker in Redis (per arq job id) says the report went out, so a re-delivered job
        that finds its run already ended reports only if its first delivery did not get to.
        """
        delivery = self.runtime.delivery
        source = ReportSource.RESUME if self.resume else ReportSource.for_origin(args.origin)
        marker = f"{self.options.key_prefix}reported:{self.job_id}"
        try:
            if await self.redis.exists(marker):
                return
        except (RedisError, OSError, TimeoutError) as error:
            logger.warning("run %s: cannot check its report marker (%s)", self.run_id, error)
        await deliver_outcome(
            delivery,
            ended,
            source=source,
            run_id=self.run_id,
            session_id=self.session,
            limit=_delivery_limit(delivery),
        )
        try:
            await self.redis.set(marker, b"1", ex=_MARKER_TTL)
        except (RedisError, OSError, TimeoutError) as error:
            logger.warning("run %s: cannot mark its report as sent (%s)", self.run_id, error)

    # --- events ----------------------------------------------------------------------------

    def _event_stream(self) -> RunEventStream:
        return self._publish().stream

    def _publish(self) -> EventPublisher:
        if self.publisher is None:
            stream = RunEventStream(
                self.redis,
                self.run_id,
                prefix=self.options.live_prefix,
                maxlen=self.options.events_maxlen,
                ttl_after_end=self.options.events_ttl,
            )
            self.publisher = stream.publisher(writer=self.events)
        return self.publisher

    async def _publish_end(self, event: AgentEvent) -> None:
        """Publish how the run ended (or that it will be retried) once its record says so:
        after every event the run published before; events never fail a run."""
        if self.options.events:
            self._publish()(event)

    # --- what the run does -----------------------------------------------------------------

    async def _drive(self, record: RunRecord, args: RunArgs) -> AgentOutcome:
        """Run :meth:`_drive_live` while the run's events go to its Redis stream (and its
        tools' progress reports to its record), and its control channel (cancel, steering)
        reaches its cancel token and steering queue."""
        agent = self.runtime.agent_for(args.overrides, book_followup=self.queue.enqueue_followup)
        rule = self.progress = ProgressAtCheckpoints(agent.budget.max_steps)
        async with contextlib.AsyncExitStack() as stack:
            tool_progress = ToolProgressWriter(self.store, self.run_id, rule)
            stack.push_async_callback(tool_progress.aclose)
            publish = self._publish() if self.options.events else None

            def sink(event: AgentEvent) -> None:
                if isinstance(event, RunEnded):  # published by _publish_end, see there
                    self.held_end = event
                    return
                if isinstance(event, ToolProgress):
                    tool_progress.report(event)
                if publish is not None:
                    publish(event)

            live = self.live = _Live(CancelToken(), self._steering(args, stack), sink)
            try:
                await stack.enter_async_context(
                    self.watcher.watch(
                        self.run_id,
                        live.cancel,
                        live.steering,
                        also=self.keeper.cut_claim if self.keeper is not None else None,
                    )
                )
            except (RedisError, OSError, TimeoutError) as error:
                logger.warning("run %s: cannot watch its control channel: %s", self.run_id, error)
            with job_scope(self.trace or args.trace, origin=args.origin):
                return await self._drive_live(record, args, agent, live)

    def _steering(self, args: RunArgs, stack: contextlib.AsyncExitStack) -> Steering:
        """The run's message queue: messages without a mode join as the run's
        ``message_mode`` says, and those that joined stop counting against the bound."""
        channel = RunControlChannel(self.redis, self.run_id, prefix=self.options.live_prefix)
        pending: set[asyncio.Task[None]] = set()
        joined_any = False

        def joined(count: int) -> None:
            nonlocal joined_any
            joined_any = True
            task = asyncio.ensure_future(quietly(channel.joined(count)))
            pending.add(task)
            task.add_done_callback(pending.discard)

        async def settle() -> None:
            if pending:
                await asyncio.wait(set(pending))
            if joined_any or steering.queued:  # (no message reached the run: nothing to count)
                await quietly(self.redis.delete(channel.queued_key))

        stack.push_async_callback(settle)
        mode = args.overrides.message_mode or "steer"
        steering = Steering(default_mode=mode, max_queued=None, on_taken=joined)
        return steering

    async def _drive_live(
        self, record: RunRecord, args: RunArgs, agent: Agent, live: _Live
    ) -> AgentOutcome:
        """Continue the run from wherever it is: a resume, a checkpoint, or the start."""
        store = self.store
        runtime = self.runtime
        first = record.attempt == 1  # never started before: no checkpoints, no pause
        entries, last_seq = ([], 0) if first else await store.checkpoints(self.run_id)
        journal = self.journal = store.run_journal(
            self.run_id,
            attempt=record.attempt,
            after_seq=last_seq,
            lease=self.options.lease,
            progress=self.progress,
            persist=self._persist,
            session=args.overrides.session is not None,
        )
        options = RunOptions(
            run_id=self.run_id,
            cancel=live.cancel,
            steering=live.steering,
            on_event=live.sink,
            journal=journal,
        )
        sessions_store = runtime.session_store
        pending = None if first else await store.pending_resume(self.run_id)
        if pending is not None and not _resume_began(entries, pending[0]):
            state, decisions = pending
            turn = await sessions.resume(
                agent, state, decisions, store=sessions_store, options=options
            )
            return turn.outcome
        recovered = recover(entries)
        if recovered is not None:
            if recovered.awaiting():  # it had paused for approval before the worker stopped
                return AwaitingApproval(state=recovered)
            turn = await sessions.resume(agent, recovered, store=sessions_store, options=options)
            return turn.outcome
        turn = await sessions.run(
            agent,
            args.prompt,
            session=args.overrides.session,
            store=sessions_store,
            options=options,
            branch=args.overrides.branch,
        )
        return turn.outcome


def _out_of_reach(error: AgentError) -> bool:
    """The database (or Redis) was out of reach: not the model provider's error."""
    return error.kind is ErrorKind.UNAVAILABLE and error.provider is None


def _decoded(run_id: str, stored: dict[str, object]) -> RunArgs:
    try:
        return RunArgs.model_validate(stored)
    except ValidationError as error:
        raise AgentError(
            ErrorKind.DECODE, f"run {run_id}: the stored arguments do not decode: {error}"
        ) from None


def _resume_began(entries: Sequence[JournalEntry], paused: RunState) -> bool:
    """Whether a resume of ``paused`` has checkpointed its start (so continue from there).

    A resume records ``started`` with the paused state's messages and the decisions applied
    (nothing awaits approval any more); the journal of the run before its pause does not.
    """
    latest = next((e for e in reversed(entries) if isinstance(e, Started)), None)
    return (
        latest is not None
        and latest.state.messages == paused.messages
        and not latest.state.awaiting()
    )


def _delivery_limit(delivery: object) -> float:
    """Seconds a report may take: the delivery's own ``timeout`` and a second, at most
    :data:`~agent_plugin.proactive.DEFAULT_DELIVERY_TIMEOUT` (the headroom the worker's job
    timeout leaves for it)."""
    own = getattr(delivery, "timeout", None)
    if isinstance(own, int | float) and not isinstance(own, bool) and 0 < own < float("inf"):
        return min(float(own) + 1.0, DEFAULT_DELIVERY_TIMEOUT)
    return DEFAULT_DELIVERY_TIMEOUT
