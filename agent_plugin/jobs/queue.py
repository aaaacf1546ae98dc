"""The enqueue side of background runs: :class:`RunQueue` records a run, puts its job on the
arq queue, accepts decisions for a paused run, cancels and steers runs from any process, and
reads their records and event streams. Workers run the jobs (:mod:`agent_plugin.jobs.worker`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Sequence
from datetime import datetime
from typing import Any, Final, cast

from arq.connections import ArqRedis, create_pool
from arq.constants import job_key_prefix
from pydantic import BaseModel, ConfigDict
from redis.asyncio import Redis
from redis.exceptions import RedisError

from agent_plugin.config import AgentSettings
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import RunEnded
from agent_plugin.jobs.args import RunArgs, RunHandle, idempotent_run_id
from agent_plugin.jobs.options import JobOptions
from agent_plugin.jobs.redis import (
    dumps,
    heartbeat_key,
    idempotency_key,
    loads,
    quietly,
    reaching_redis,
    redis_error,
    redis_settings,
)
from agent_plugin.jobs.scale import bound_connections, enqueue_job
from agent_plugin.live import RunControlChannel, RunEventStream, open_events
from agent_plugin.outcomes import ApprovalDecision
from agent_plugin.proactive import FollowupPlan
from agent_plugin.records import RunRecord, RunStatus
from agent_plugin.redaction import mask_url, redact_message
from agent_plugin.steering import MessageMode
from agent_plugin.storage import SqlRunStore
from agent_plugin.telemetry import trace_carrier

__all__ = ["AGENT_RESUME", "AGENT_RUN", "IDEMPOTENCY_TTL", "HeartbeatStats", "RunQueue"]

logger = logging.getLogger("agent_plugin.jobs")

IDEMPOTENCY_TTL: Final = 86_400
"""Seconds an ``Idempotency-Key`` is remembered: a day."""
READER_CLIENT_NAME: Final = "agent-events"
"""The Redis client name of the event readers' connections (``CLIENT LIST`` shows it)."""
READER_RETRY_AFTER: Final = 5.0
"""Seconds a reader turned away (``max_event_readers``) is told to wait."""

AGENT_RUN = "agent_run"
"""The arq function name of a run."""
AGENT_RESUME = "agent_resume"
"""The arq function name of a resume after approval."""


class HeartbeatStats(BaseModel):
    """The heartbeat's ticks so far, counted in Redis across every worker of a queue: how
    many started a check-in run, were skipped (a run of the session was active; the precheck
    said no) or failed, and the latest tick."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    started: int = 0
    skipped_busy: int = 0
    skipped_precheck: int = 0
    failed: int = 0
    last_tick_at: datetime | None = None
    last_status: str | None = None
    last_run_id: str | None = None


class RunQueue:
    """Background runs seen from an app (or a worker that enqueues follow-ups and ticks).

    Built from the settings (Redis URL, route prefix, session policy), the run store and
    the :class:`JobOptions`. The Redis connection opens on first use (an app that never
    enqueues never needs Redis); a failure to reach it is an ``unavailable``
    :class:`AgentError` naming the URL with its password hidden.
    """

    def __init__(
        self, settings: AgentSettings, store: SqlRunStore, options: JobOptions | None = None
    ) -> None:
        self.settings = settings
        self.store = store
        self.options = options or JobOptions()
        self._redis: ArqRedis | None = None
        self._owns_redis = False
        self._connecting = asyncio.Lock()
        self._readers_redis: Redis | None = None
        self.readers = 0
        """Event streams this queue serves now (at most ``options.max_event_readers``)."""

    def __repr__(self) -> str:
        return f"RunQueue(redis={mask_url(self.redis_url)!r}, queue={self.options.queue_name!r})"

    @property
    def redis_url(self) -> str:
        return self.settings.redis_url

    @property
    def job_timeout(self) -> float:
        return self.options.timeout_for(self.settings.max_run_secs)

    def handle(self, run_id: str) -> RunHandle:
        """The run's id and where ``GET`` answers its record (``{route_prefix}/runs/{id}``)."""
        return RunHandle(run_id=run_id, status_path=f"{self.settings.route_prefix}/runs/{run_id}")

    # --- redis -----------------------------------------------------------------------------

    def attach(self, redis: ArqRedis) -> None:
        """Use a worker's own arq connection (not closed by :meth:`aclose`)."""
        self._redis = redis
        self._owns_redis = False

    async def redis(self) -> ArqRedis:
        """The arq connection, opened on first use."""
        if self._redis is not None:
            return self._redis
        async with self._connecting:
            if self._redis is None:
                try:
                    self._redis = await create_pool(
                        redis_settings(self.redis_url, worker=False),
                        default_queue_name=self.options.queue_name,
                        job_serializer=dumps,
                        job_deserializer=loads,
                    )
                    await bound_connections(self._redis, self.options.max_redis_connections)
                except (TimeoutError, RedisError, OSError) as error:
                    raise redis_error(self.redis_url, error) from None
                self._owns_redis = True
            return self._redis

    def _reader_redis(self) -> Redis:
        """The connections event readers block on: a pool of ``max_event_readers`` of its
        own, so readers never take the connections enqueueing and cancelling need."""
        if self._readers_redis is None:
            settings = redis_settings(self.redis_url, worker=False)
            self._readers_redis = Redis.from_url(
                self.redis_url,
                socket_connect_timeout=settings.conn_timeout,
                retry=settings.retry,
                retry_on_error=settings.retry_on_error,
                max_connections=self.options.max_event_readers,
                client_name=READER_CLIENT_NAME,
            )
        return self._readers_redis

    async def aclose(self) -> None:
        """Close the connections this queue opened."""
        redis, self._redis = self._redis, None
        readers, self._readers_redis = self._readers_redis, None
        if readers is not None:
            await readers.aclose(close_connection_pool=True)
        if redis is not None and self._owns_redis:
            await redis.aclose(close_connection_pool=True)

    def _reaching_redis(self) -> contextlib.AbstractAsyncContextManager[None]:
        return reaching_redis(self.redis_url)

    # --- enqueueing ------------------------------------------------------------------------

    async def enqueue(
        self,
        run_id: str,
        args: RunArgs,
        *,
        delay: float | None = None,
        claim_session: bool = True,
    ) -> RunHandle:
        """Record the run (``queued``) and put its job on the queue, ``delay`` seconds later.

        A run id that exists already is a no-op (the run is enqueued again only while it is
        still queued, in case its job was lost). With ``session_lock = "reject"``, a session
        another run holds (as the records say) answers ``CONFLICT``, and the run holds its
        session from now on; ``claim_session=False`` leaves the session free until the run is
        due (follow-ups). A run whose job cannot be queued is not recorded, so the same id can
        be enqueued again.
        """
        redis = await self.redis()
        if not args.trace and (carrier := trace_carrier()):
            args = args.model_copy(update={"trace": carrier})
        session = args.overrides.session
        created = await self.store.create(
            run_id,
            origin=args.origin,
            args=args.model_dump(mode="json"),
            session_id=session,
            memory_scope=args.overrides.memory_scope,
            not_before=delay,
        )
        if not created:
            record = await self.store.get(run_id)
            if record is None or record.status is not RunStatus.QUEUED:
                return self.handle(run_id)
        try:
            if created and claim_session and await self._rejected(session, run_id):
                raise _session_busy(session)
            async with self._reaching_redis():
                await enqueue_job(
                    redis,
                    AGENT_RUN,
                    run_id,
                    job_id=run_id,
                    queue_name=self.options.queue_name,
                    defer_by=delay,
                )
        except BaseException:  # (a cancelled request too: a refused run must not stay queued)
            if created:  # unrecorded, so a retry (derived run ids too) can enqueue it again
                await quietly(asyncio.shield(self.store.discard(run_id)))
            raise
        logger.info("run %s queued (origin %s)", run_id, args.origin)
        return self.handle(run_id)

    async def enqueue_once(
        self, key: str, args: RunArgs, *, delay: float | None = None
    ) -> RunHandle:
        """:meth:`enqueue` under an idempotency key: the same ``key`` with the same ``args``
        and ``delay`` is the same run, however often it is sent (a client retrying after a
        timeout); the same ``key`` with anything else is a ``CONFLICT``.

        The run id is derived from the key, and Redis remembers a fingerprint of the request
        for :data:`IDEMPOTENCY_TTL` seconds (by the key's hash). A first attempt that failed
        halfway is completed by the next.
        """
        request = json.dumps(
            {"args": args.model_dump(mode="json"), "delay": delay}, sort_keys=True
        ).encode("utf-8")
        fingerprint = hashlib.sha256(request).hexdigest()
        run_id = idempotent_run_id(key)
        redis = await self.redis()
        remembered = idempotency_key(self.options.key_prefix, key)
        async with self._reaching_redis():
            first = await redis.set(remembered, fingerprint, nx=True, ex=IDEMPOTENCY_TTL)
            seen = None if first else await redis.get(remembered)
        if seen is not None and seen.decode() != fingerprint:
            raise AgentError(
                ErrorKind.CONFLICT,
                "this Idempotency-Key was used for a different request; use a new key for a "
                "new run",
            )
        try:
            return await self.enqueue(run_id, args, delay=delay)
        except AgentError:
            if first:  # nothing was queued under the key: let the client try it again
                async with self._reaching_redis():
                    await redis.delete(remembered)
            raise

    async def enqueue_resume(
        self, run_id: str, decisions: Sequence[ApprovalDecision] = ()
    ) -> RunHandle:
        """Accept the decisions for a paused run and enqueue ``agent_resume`` for it.

        The decisions are checked against the paused state kept in the run's record: each
        must name a call that awaits approval, and a pause takes decisions once. Anything else
        is ``CONFLICT`` (``NOT_FOUND`` for an unknown run).
        """
        redis = await self.redis()
        record = await self.get(run_id)
        job_id = f"{run_id}:resume:{uuid.uuid4().hex}"
        await self.store.take_paused_state(run_id, list(decisions), job_id=job_id)
        try:
            if await self._rejected(record.session_id, run_id):
                raise _session_busy(record.session_id)
            async with self._reaching_redis():
                await redis.enqueue_job(
                    AGENT_RESUME,
                    run_id,
                    _job_id=job_id,
                    _queue_name=self.options.queue_name,
                    **_trace_kwargs(),
                )
        except BaseException:
            # the run awaits approval again: the same decisions can be sent once more
            await quietly(asyncio.shield(self.store.return_paused_state(run_id, record.outcome)))
            raise
        logger.info("run %s: %d decision(s) accepted, resume queued", run_id, len(decisions))
        return self.handle(run_id)

    async def enqueue_followup(self, plan: FollowupPlan) -> str:
        """Enqueue the delayed run of a booked follow-up and return its run id.

        The run: ``plan.prompt`` in ``plan.session`` with ``plan.memory_scope``, delivery on,
        origin ``followup``, ``followup_depth = plan.depth``, under
        :meth:`~agent_plugin.proactive.FollowupPlan.derived_run_id` (a retried booking call
        books it once), deferred by ``plan.delay``. It does not claim its session while it
        waits (under ``session_lock = "reject"`` the calling run holds it anyway).
        """
        args = RunArgs.checked(
            plan.prompt,
            overrides={
                "session": plan.session,
                "memory_scope": plan.memory_scope,
                "followup_depth": plan.depth,
            },
            deliver=True,
            origin="followup",
        )
        handle = await self.enqueue(
            plan.derived_run_id(), args, delay=plan.delay.total_seconds(), claim_session=False
        )
        logger.info(
            "follow-up %s booked by run %s for %d s from now (depth %d)",
            handle.run_id,
            plan.parent_run_id,
            plan.delay_seconds,
            plan.depth,
        )
        return handle.run_id

    # --- sessions --------------------------------------------------------------------------

    async def session_active(self, session: str | None) -> bool:
        """Whether a run of ``session`` is active, as the records say: in progress, queued and
        due (waiting for a worker), or waiting for its retry or its resume.

        A run booked for later (a follow-up, a delayed run) does not count until its time has
        come, nor does a run paused for approval. No session: False.
        """
        if session is None:
            return False
        return await self.store.session_held(session)

    async def _rejected(self, session: str | None, run_id: str) -> bool:
        """Under ``session_lock = "reject"``, whether a run just queued in ``session`` is
        refused: another run holds the session (in progress, waiting, or queued before it).
        Asked after the run took its place in the session, so of two enqueues that race the
        later one always sees the earlier."""
        if session is None or self.settings.session_lock != "reject":
            return False
        return await self.store.session_held(session, besides=run_id, reserved=True)

    # --- records and events ----------------------------------------------------------------

    async def get(self, run_id: str) -> RunRecord:
        """The run's public record; ``NOT_FOUND`` for an unknown id."""
        record = await self.store.get(run_id)
        if record is None:
            raise AgentError(ErrorKind.NOT_FOUND, f"no run {run_id!r}")
        return record

    async def events(
        self, run_id: str, *, last_event_id: str | None = None, follow: bool = False
    ) -> AsyncIterator[tuple[str, dict[str, Any]]] | None:
        """The run's events after ``last_event_id`` as ``(entry id, event JSON)`` pairs, or
        ``None`` when the reader has seen the run's end already; ``NOT_FOUND`` for an unknown
        run. An end the stream lost comes from the run's record (see
        :func:`~agent_plugin.live.open_events`).

        At most ``max_event_readers`` streams are served at once: one more is
        ``UNAVAILABLE`` with a ``retry_after``. A stream holds its place until it ends or its
        reader closes it."""
        record = await self.get(run_id)
        if self.readers >= self.options.max_event_readers:
            raise AgentError(
                ErrorKind.UNAVAILABLE,
                f"{self.readers} event streams are being served, the most this app serves at "
                "once (max_event_readers); try again shortly",
                retry_after=READER_RETRY_AFTER,
            )

        async def recorded_end() -> RunEnded | None:
            try:
                now = await self.get(run_id)
            except AgentError as error:
                if error.kind is ErrorKind.NOT_FOUND:  # its record went (a discarded enqueue)
                    return RunEnded(run_id=run_id, error=error.info())
                # the stream goes on; the next check may do better
                logger.warning("run %s: cannot read its record: %s", run_id, error)
                return None
            return _end_of(now)

        ended = _end_of(record) if record.status.finished else None
        self.readers += 1
        try:
            async with self._reaching_redis():
                events = await open_events(
                    self._reader_redis(),
                    run_id,
                    ended=ended,
                    last_event_id=last_event_id,
                    follow=follow,
                    prefix=self.options.live_prefix,
                    recorded_end=recorded_end,
                )
        except BaseException:
            self.readers -= 1
            raise
        if events is None:
            self.readers -= 1
            return None
        return _ReaderPlace(self, events)

    # --- live runs: cancel and steer from any process ----------------------------------------

    def _control(self, redis: ArqRedis, run_id: str) -> RunControlChannel:
        return RunControlChannel(redis, run_id, prefix=self.options.live_prefix)

    async def cancel(self, run_id: str, reason: str = "cancelled") -> RunRecord:
        """Cancel a run that is queued, paused for approval or running, from any process.

        The request goes to the run's control channel first (a worker that starts it now sees
        it as it begins); a run nobody runs (queued, awaiting approval) is cancelled in its
        record at once, its arq job taken off the queue and its event readers given a
        ``run_end``; a running run ends ``cancelled`` at its next boundary, by its worker.
        ``CONFLICT`` for a finished run, ``NOT_FOUND`` for an unknown one. Answers the record
        as it is after the request. ``reason`` is redacted before it is stored, sent or logged.
        """
        reason = redact_message(reason)  # the rules of what is stored: assignments too
        record = await self.get(run_id)
        if record.status.finished:
            raise AgentError(
                ErrorKind.CONFLICT, f"run {run_id} is {record.status}: it cannot be cancelled"
            )
        redis = await self.redis()
        async with self._reaching_redis():
            await self._control(redis, run_id).request_cancel(reason)
        if record.status not in (RunStatus.QUEUED, RunStatus.AWAITING_APPROVAL):
            return record
        try:
            record, job_id = await self.store.cancel_waiting(run_id, reason)
        except AgentError as error:
            if error.kind is not ErrorKind.CONFLICT:
                raise
            record = await self.get(run_id)  # started meanwhile: the flag reaches its worker
            if record.status.finished and record.status is not RunStatus.CANCELLED:
                raise
            return record
        async with self._reaching_redis():
            pipe = redis.pipeline(transaction=False)
            for job in {run_id, job_id or run_id}:  # its own job, and its resume's if queued
                pipe.zrem(self.options.queue_name, job)
                pipe.delete(job_key_prefix + job)
            await pipe.execute()
        if self.options.events and record.outcome is not None:
            stream = RunEventStream(
                redis,
                run_id,
                prefix=self.options.live_prefix,
                maxlen=self.options.events_maxlen,
                ttl_after_end=self.options.events_ttl,
            )
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                await stream.publish(RunEnded(run_id=run_id, summary=record.outcome))
        logger.info("run %s cancelled before it ran: %s", run_id, reason)
        return record

    async def steer(self, run_id: str, text: str, mode: MessageMode | None = None) -> RunRecord:
        """Queue a user message for a running run, joining as ``mode`` says (``None``: the
        run's ``message_mode``, else before its next model call; see
        :mod:`agent_plugin.steering`).

        ``CONFLICT`` unless the run is ``in_progress``, or when it holds
        ``max_queued_messages`` already; ``NOT_FOUND`` for an unknown run. The message is
        redacted before it is queued, as a background run's prompt is before it is stored: it
        waits in Redis, and reaches the model as stored.
        """
        text = redact_message(text)
        record = await self.get(run_id)
        if record.status is not RunStatus.IN_PROGRESS:
            raise AgentError(
                ErrorKind.CONFLICT,
                f"run {run_id} is {record.status}: only a running run takes messages",
            )
        redis = await self.redis()
        async with self._reaching_redis():
            await self._control(redis, run_id).send_steering(
                text, mode, limit=self.options.max_queued_messages
            )
        return record

    # --- the heartbeat ---------------------------------------------------------------------

    async def heartbeat_stats(self) -> HeartbeatStats:
        """What the heartbeat's ticks did, counted across every worker of this queue."""
        redis = await self.redis()
        async with self._reaching_redis():
            raw = await cast(
                Awaitable[dict[Any, Any]],
                redis.hgetall(heartbeat_key(self.options.key_prefix)),
            )
        values = {
            (k.decode() if isinstance(k, bytes) else str(k)): (
                v.decode() if isinstance(v, bytes) else str(v)
            )
            for k, v in raw.items()
        }
        return HeartbeatStats.model_validate(
            {key: value for key, value in values.items() if value != ""}
        )


def _session_busy(session: str | None) -> AgentError:
    """The error for a run refused because its session is busy (``session_lock = reject``)."""
    return AgentError(
        ErrorKind.CONFLICT,
        f"session {session!r} already has an active background run; try again when it has "
        "finished (session_lock = reject)",
    )


def _end_of(record: RunRecord) -> RunEnded | None:
    """The ``run_end`` a run's record stands for: finished, or paused with its summary; ``None``
    while it runs or waits."""
    paused = record.status is RunStatus.AWAITING_APPROVAL and record.outcome is not None
    if not (record.status.finished or paused):
        return None
    return RunEnded(run_id=record.run_id, summary=record.outcome, error=record.error)


class _ReaderPlace:
    """A run's events, holding one of :attr:`RunQueue.readers`' places until they end, fail,
    are closed or are dropped unread (whichever comes first gives the place back, once)."""

    def __init__(self, queue: RunQueue, events: AsyncIterator[tuple[str, dict[str, Any]]]) -> None:
        self.events = events
        self._release = weakref.finalize(self, _give_back, queue)

    def __aiter__(self) -> _ReaderPlace:
        return self

    async def __anext__(self) -> tuple[str, dict[str, Any]]:
        try:
            return await anext(self.events)
        except BaseException:  # the end, an error, or the reader went away (cancelled)
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self._release.alive:
            self._release()
            closing = getattr(self.events, "aclose", None)
            if closing is not None:
                await closing()


def _give_back(queue: RunQueue) -> None:
    queue.readers -= 1


def _trace_kwargs() -> dict[str, Any]:
    """The resume request's trace context for ``agent_resume`` (nothing without tracing)."""
    carrier = trace_carrier()
    return {"trace": carrier} if carrier else {}
