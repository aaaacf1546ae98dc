"""Background runs on arq: the ``agent_run`` and ``agent_resume`` jobs, tracked run records,
approvals over HTTP, step checkpoints and one writer per session [SPEC §6].

An app enqueues a run and answers at once; a worker (the standard arq CLI) runs it::

    handle = await agent.enqueue_run_tracked("Summarise the open tickets", session="ops")
    # -> RunHandle(run_id="run_…", status_path="/agent/runs/run_…")

    $ arq yourapp.worker.WorkerSettings      # WorkerSettings = plugin.worker_settings()

**Records.** Every run has a row in the database (:class:`~agent_plugin.storage.SqlRunStore`)
before its job reaches Redis, so ``GET {prefix}/runs/{run_id}`` answers at once and long after
arq forgot the job: ``queued``, ``in_progress`` (with ``step N of M`` progress [AP-49]),
``awaiting_approval`` (with the calls that wait), ``complete`` (with the outcome summary),
``failed`` (with the typed error) or ``cancelled``. The run id (128 random bits) is minted when
the :class:`AgentRunArgs` are built and is the arq job id, so enqueueing a run twice is a no-op
and every retry keeps its id [AP-47, AP-48]. The job payload in Redis is only the run id: the
prompt and the overrides stay in the database, and out of arq's log lines.

**Checkpoints** [HV-01]. A run writes its journal (:mod:`agent_plugin.journal`) to the database
as it goes: every model reply with the policy's verdicts, every tool result. A delivery that
finds a journal (a retry, or a worker that died) continues from it: recorded replies are not
asked for again and finished calls never run again. Only the call in flight when a worker died
runs a second time, with the same ``run_id`` and ``call_id`` so the tool can deduplicate it.

**Crashed workers.** While a job runs, its worker keeps arq's in-progress key of the job alive
for :attr:`JobOptions.lease` seconds at a time, and the run's lease in the database too. A
worker that dies stops renewing both, and any worker picks the job up again within the lease
(not after arq's whole job timeout). A worker killed in the instant between arq's claim and the
first renewal leaves a claim as long as the job timeout; every worker looks for such claims each
lease and cuts them to the lease (:meth:`RunQueue.release_abandoned_claims`), so that run too
continues within two leases. A delivery whose claim in Redis vanished while its worker lives
(Redis restarted) keeps the run: the lease in the database turns the second delivery away until
it lapses, and a delivery that finds its lease taken over stops at once.

**Lost jobs.** Once every ``reconcile_every`` seconds one worker of the fleet compares the
records with Redis and queues again the job of any queued or in-progress run that has none
(:meth:`RunQueue.reconcile`): Redis lost its data, arq dropped a job waiting longer than a day,
or the app died between recording a run and enqueueing it.

**Retries.** ``agent_run`` retries retryable failures (RateLimited, Unavailable, Transport) up
to :attr:`JobOptions.max_attempts` attempts with exponential backoff that honours the
provider's ``Retry-After``; any other error fails the run at once. ``agent_resume`` never
retries an error: approved calls may act on the world [AP-47]. Both continue from their
checkpoints after a crash, which never repeats a finished call.

**Sessions.** A run in a session holds a Redis lock for the session (``SET NX PX``, renewed while
the run goes on, released at the end, expiring on its own if the worker dies). The
``session_lock`` setting picks what a second run for a busy session does: ``queue`` (it waits
its turn) or ``reject`` (enqueueing it answers 409).

**Reports** [AP-43]. A run enqueued with ``deliver=True`` (heartbeat ticks and follow-ups always
are) reports how it ended to the runtime's :class:`~agent_plugin.proactive.Delivery` when its
job ends: the answer unless it is silent (``HEARTBEAT_OK``), or the calls a pause waits on.
The source is the run's origin (``job``, ``heartbeat``, ``followup``), or ``resume`` for the
``agent_resume`` job after approval. The report goes out after the run's record is written and
its session released; a delivery that fails or hangs is logged and never fails, retries or
re-runs the job. Delivery is at least once: a worker that dies while delivering is replaced by
one that delivers again (same :attr:`~agent_plugin.proactive.Report.key`, for the receiver to
drop).

**Heartbeat** [AP-44, AP-45]. With a :class:`~agent_plugin.proactive.Heartbeat`, the worker
settings register the arq cron job ``agent_heartbeat`` (:func:`agent_heartbeat`). A tick is
cheap: it only *enqueues* the check-in as a tracked ``agent_run`` (origin ``heartbeat``,
delivery on), so the check-in gets what every background run has (a record to poll, the
session lock, retries, checkpoints), and the tick job never waits for a model. A fleet
heartbeat's tick is one arq job per schedule time for every worker (arq's unique cron job id,
``agent_heartbeat:<time>``), and its run id derives from that id, so a second enqueue of the
same tick is a no-op. A tick is skipped while a run of the heartbeat's session is active (see
:meth:`RunQueue.session_active`); skips are logged and counted in Redis
(:meth:`RunQueue.heartbeat_stats`). Ticks missed while no worker ran are not replayed: arq
computes a cron job's next time from the moment the worker starts (``run_at_startup=False``),
so after downtime the heartbeat resumes at its next scheduled time with one tick, not one per
missed time. A worker that keeps running but stalls (its event loop blocked, its process
paused) does catch up: arq then enqueues the ticks it missed meanwhile, one per poll. The
check-in runs under :meth:`AgentRuntime.heartbeat_policy
<agent_plugin.plugin.AgentRuntime.heartbeat_policy>` (read-only unless ``allow_actions``).

**Follow-ups** [AP-46]. The ``schedule_followup`` tool books a delayed tracked run through
:meth:`RunQueue.enqueue_followup`: same session and memory scope, delivery on, origin
``followup``, one link deeper, with a run id derived from the booking call (a retried call books
it once). A follow-up never holds its session while it waits; when due it queues behind the
session's active run like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Literal,
    NoReturn,
    TypeAlias,
    TypedDict,
    Unpack,
    cast,
)

import sqlalchemy as sa
from arq.connections import ArqRedis, RedisSettings, create_pool
from arq.constants import in_progress_key_prefix, job_key_prefix, result_key_prefix
from arq.cron import CronJob, cron
from arq.jobs import SerializationError, deserialize_job_raw
from arq.worker import Retry, func
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis.asyncio.retry import Retry as RedisRetry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from agent_plugin.agent import Agent, EventSink
from agent_plugin.cancellation import CancelToken, stop_task
from agent_plugin.config import mask_url
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import AgentEvent, OutcomeSummary, RetryScheduled, RunEnded
from agent_plugin.ids import new_run_id
from agent_plugin.journal import (
    Appended,
    JournalEntry,
    Replied,
    RoundDone,
    RunJournal,
    Started,
    recover,
)
from agent_plugin.live import ControlWatcher, RunControlChannel, RunEventStream
from agent_plugin.outcomes import (
    AgentOutcome,
    ApprovalDecision,
    AwaitingApproval,
    RunState,
)
from agent_plugin.proactive import (
    DEFAULT_DELIVERY_TIMEOUT,
    HEARTBEAT_TASK,
    FollowupPlan,
    Heartbeat,
    ReportSource,
    TickResult,
    TickStatus,
    deliver_outcome,
    heartbeat_tick,
)
from agent_plugin.redaction import redact_text, scrub
from agent_plugin.sessions import MessageEntry, resume_in_session, run_in_session
from agent_plugin.steering import Steering
from agent_plugin.storage.models import RunRow
from agent_plugin.storage.runs import RunRecord, RunStatus, SqlRunStore, StalledRun

if TYPE_CHECKING:
    from agent_plugin.plugin import AgentPlugin, AgentRuntime

__all__ = [
    "AGENT_HEARTBEAT",
    "AGENT_RESUME",
    "AGENT_RUN",
    "AgentResumeArgs",
    "AgentRunArgs",
    "HeartbeatStats",
    "JobOptions",
    "RunFields",
    "RunHandle",
    "RunOrigin",
    "RunQueue",
    "SessionLock",
    "agent_heartbeat",
    "agent_resume",
    "agent_run",
    "heartbeat_cron",
    "progress_of",
    "run_args",
    "tick_run_id",
    "worker_settings",
]

logger = logging.getLogger("agent_plugin.jobs")

AGENT_RUN: Final = "agent_run"
"""The arq function name of a run."""
AGENT_RESUME: Final = "agent_resume"
"""The arq function name of a resume after approval."""
AGENT_HEARTBEAT: Final = HEARTBEAT_TASK
"""The arq cron job name of a heartbeat tick."""

RunOrigin: TypeAlias = Literal["request", "followup", "heartbeat"]
"""Who started a run: an app request, an agent-booked follow-up, or a heartbeat tick."""

_RUN_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
_RUNTIME_KEY: Final = "agent_runtime"


# --- arguments ------------------------------------------------------------------------------


class AgentRunArgs(BaseModel):
    """What an ``agent_run`` job runs [reference §1.19].

    Every field but ``prompt`` has a default, so old payloads still decode. ``run_id`` is
    minted when the arguments are built (or decoded without one), and it is the arq job id:
    the same arguments enqueued twice make one run, and a retry keeps the id tools see.
    ``system_prompt`` and ``max_steps`` override the settings for this run; ``memory_scope``
    ``None`` is the default scope ``"agent"``.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    prompt: str = Field(min_length=1)
    system_prompt: str | None = None
    max_steps: int | None = Field(default=None, ge=1, le=1000)
    session: str | None = Field(default=None, min_length=1, max_length=255)
    memory_scope: str | None = Field(default=None, min_length=1, max_length=255)
    deliver: bool = False
    origin: RunOrigin = "request"
    run_id: str = Field(default_factory=new_run_id, pattern=_RUN_ID_PATTERN)
    followup_depth: int = Field(default=0, ge=0)


class AgentResumeArgs(BaseModel):
    """A resume of a paused run: the run and the reviewers' decisions.

    The paused :class:`~agent_plugin.outcomes.RunState` never travels with them: it stays in
    the run's record, so a client cannot forge one. The memory scope, overrides and session
    come from the run's record too.
    """

    model_config = ConfigDict(frozen=True)

    run_id: str = Field(pattern=_RUN_ID_PATTERN)
    decisions: list[ApprovalDecision] = Field(default_factory=list)


class RunFields(TypedDict, total=False):
    """The optional fields of :class:`AgentRunArgs`, as keyword arguments of the enqueue API."""

    system_prompt: str | None
    max_steps: int | None
    session: str | None
    memory_scope: str | None
    deliver: bool
    origin: RunOrigin
    run_id: str
    followup_depth: int


def run_args(args: AgentRunArgs | str, **fields: Unpack[RunFields]) -> AgentRunArgs:
    """``args`` as given, or built from a prompt, with ``fields`` applied (validated).

    Raises a ``config`` :class:`AgentError` naming the bad field.
    """
    try:
        if isinstance(args, AgentRunArgs):
            if not fields:
                return args
            return AgentRunArgs.model_validate({**args.model_dump(), **fields})
        return AgentRunArgs.model_validate({"prompt": args, **fields})
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'args'}: {e['msg']}"
            for e in error.errors(include_url=False)
        )
        raise AgentError.config(f"bad run arguments: {problems}") from None


class RunHandle(BaseModel):
    """What enqueueing a tracked run answers: its id and where to poll it."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    status_path: str = Field(examples=["/agent/runs/run_0123456789abcdef0123456789abcdef"])


# --- options --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobOptions:
    """How background runs are queued and run; the app and its workers must agree on them.

    * ``queue_name``: the arq queue (Redis sorted set) of the agent's jobs.
    * ``job_timeout``: seconds one delivery of a job may take, waiting for its session
      included; ``None``: ``max_run_secs + 60`` when that is set, else 1800.
    * ``max_attempts``: attempts of a run that fails with a retryable error [AP-47].
    * ``retry_backoff``: seconds before the first retry; doubled for each later one (with
      jitter), never less than the provider's ``Retry-After``, at most ``max_backoff``.
    * ``max_deliveries``: how many times a run may be started (its retries and restarts after
      a crashed worker included) before it is failed as interrupted too often. Deliveries
      that never start it (Redis or the database out of reach) do not count: those are tried
      again each lease until they can.
    * ``lease``: seconds a job's claim in Redis, its run's lease in the database and its
      session lock live without renewal: how soon another worker continues the run of a
      worker that died.
    * ``reconcile_every``: seconds between a worker's checks for runs whose job vanished from
      Redis (:meth:`RunQueue.reconcile`; one worker of the fleet checks at a time), and how
      long a queued run must sit unchanged before its missing job counts as lost.
    * ``keep_result``: seconds arq keeps a job's (small) result; the run record stays.
    * ``max_jobs``, ``poll_delay``: the worker's concurrency and queue polling interval.
    * ``key_prefix``: prefix of the plugin's own Redis keys (session locks, retry counters,
      and under ``{key_prefix}run:`` each run's event stream and control keys).
    * ``events``: publish each background run's events to its Redis stream (read by
      ``GET {prefix}/runs/{run_id}/events``); ``events_maxlen`` bounds the stream,
      ``events_ttl`` is how long it stays after the run ends.
    """

    queue_name: str = "arq:queue"
    job_timeout: float | None = None
    max_attempts: int = 3
    retry_backoff: float = 1.0
    max_backoff: float = 60.0
    max_deliveries: int = 20
    lease: float = 15.0
    reconcile_every: float = 60.0
    keep_result: float = 3600.0
    max_jobs: int = 10
    poll_delay: float = 0.5
    key_prefix: str = "agent:"
    events: bool = True
    events_maxlen: int = 1000
    events_ttl: int = 3600

    @property
    def live_prefix(self) -> str:
        """The prefix of the runs' event streams and control keys (:mod:`agent_plugin.live`)."""
        return f"{self.key_prefix}run:"

    def __post_init__(self) -> None:
        checks = {
            "max_attempts": self.max_attempts >= 1,
            "max_deliveries": self.max_deliveries >= 1,
            "max_jobs": self.max_jobs >= 1,
            "lease": self.lease >= 0.3,
            "reconcile_every": self.reconcile_every >= 1,
            "retry_backoff": self.retry_backoff >= 0,
            "max_backoff": self.max_backoff >= 0,
            "keep_result": self.keep_result >= 0,
            "poll_delay": self.poll_delay > 0,
            "job_timeout": self.job_timeout is None or self.job_timeout > 0,
            "queue_name": bool(self.queue_name.strip()),
            "events_maxlen": self.events_maxlen >= 1,
            "events_ttl": self.events_ttl >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise AgentError.config(f"bad JobOptions: {', '.join(bad)} out of range")

    def timeout_for(self, max_run_secs: int | None) -> float:
        """The job timeout in seconds, resolved against the ``max_run_secs`` setting."""
        if self.job_timeout is not None:
            return self.job_timeout
        return float(max_run_secs + 60) if max_run_secs is not None else 1800.0

    def backoff(self, retry: int, retry_after: float | None) -> float:
        """Seconds before retry number ``retry`` (1, 2, ...)."""
        base = self.retry_backoff * 2.0 ** (retry - 1)
        delay = base * random.uniform(0.5, 1.0)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return min(delay, self.max_backoff)


# --- redis ----------------------------------------------------------------------------------


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), default=str).encode()


def _loads(data: bytes) -> Any:
    return json.loads(data)


def redis_settings(url: str, *, worker: bool) -> RedisSettings:
    """arq's connection settings for ``url``.

    A worker keeps trying through a Redis restart (about 15 s); an app gives up after a few
    fast tries, so a request fails quickly with a clear error instead. The tries cover
    connecting too: while Redis restarts, a new connection (or one found closed and opened
    again) is refused with a plain ``OSError``, which redis-py does not retry by default, and
    arq's worker loop dies of the first one it meets.
    """
    settings = RedisSettings.from_dsn(url)
    if worker:
        retry = RedisRetry(ExponentialBackoff(cap=1.0, base=0.05), 20)
        return dataclasses.replace(
            settings, retry=retry, retry_on_error=list(_RETRIED), conn_retries=10
        )
    retry = RedisRetry(ExponentialBackoff(cap=0.2, base=0.05), 2)
    return dataclasses.replace(settings, retry=retry, retry_on_error=list(_RETRIED), conn_retries=0)


_RETRIED: Final = (RedisConnectionError, RedisTimeoutError, OSError)
"""The errors a Redis command is tried again on: a lost connection, a timeout, and a refused
connection while Redis restarts (a plain ``OSError``). redis-py retries only the errors listed
in ``retry_on_error`` (a ``retry`` policy alone retries nothing), and arq's own commands (taking
a job, recording its result) must ride through a restart, or the worker process dies."""


def _redis_error(url: str, error: BaseException) -> AgentError:
    password = RedisSettings.from_dsn(url).password
    detail = scrub(f"{type(error).__name__}: {error}", password)
    return AgentError(
        ErrorKind.UNAVAILABLE,
        f"cannot reach Redis at {mask_url(url)} for background runs: {detail}",
    )


_CLAIM: Final = """
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 2
end
if holder then return 0 end
redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
_RENEW: Final = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE: Final = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


class SessionLock:
    """One writer per session: a Redis key holding the id of the run that owns the session.

    ``claim`` takes a free lock or renews one the same run already holds (a retried or
    re-delivered run gets its own lock back at once); every hold expires after ``ttl``
    seconds unless renewed, so a dead worker never blocks a session for long.
    """

    def __init__(self, redis: ArqRedis, session_id: str, run_id: str, *, prefix: str) -> None:
        self.redis = redis
        self.key = _lock_key(prefix, session_id)
        self.session_id = session_id
        self.run_id = run_id
        self.held = False
        self.taken = False
        """This holder took the lock when it was free (not a renewal of the same run's hold)."""

    def __repr__(self) -> str:
        return f"SessionLock(session={self.session_id!r}, run={self.run_id!r}, held={self.held})"

    async def claim(self, ttl: float) -> Literal[0, 1, 2]:
        """0: another run holds it; 1: taken now; 2: this run held it already (renewed)."""
        result = await self._eval(_CLAIM, str(_ms(ttl)))
        self.held = self.held or result != 0
        self.taken = self.taken or result == 1
        return 1 if result == 1 else 2 if result == 2 else 0

    async def renew(self, ttl: float) -> bool:
        """Extend a held lock; ``False`` if the lock is no longer this run's."""
        kept = bool(await self._eval(_RENEW, str(_ms(ttl))))
        self.held = kept
        return kept

    async def release(self) -> None:
        """Give the lock up (only if this run holds it)."""
        await self._eval(_RELEASE)
        self.held = False

    async def holder(self) -> str | None:
        """The run that holds the lock now, if any."""
        value = await self.redis.get(self.key)
        return value.decode() if isinstance(value, bytes) else value

    async def _eval(self, script: str, *args: str) -> int:
        reply = self.redis.eval(script, 1, self.key, self.run_id, *args)
        return int(await cast(Awaitable[Any], reply))

    async def wait(
        self,
        ttl: float,
        *,
        free: Callable[[], Awaitable[bool]] | None = None,
        poll_cap: float = 1.0,
    ) -> None:
        """Claim the lock, waiting with backoff while another run holds it.

        ``free`` is asked before a claim: while it answers ``False`` the lock is not taken even
        if nobody holds it (the run queue uses it to let a crashed run finish first). Bounded by
        the caller's time limit (the job timeout); cancellation-safe.
        """
        delay = 0.05
        while not ((free is None or await free()) and await self.claim(ttl)):
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, poll_cap)


_ARQ_MAX_TRIES: Final = 1_000_000
"""arq's own bound on the tries of an agent job: never reached, because arq drops a job past
it without calling the job, which would leave its run ``queued`` or ``in_progress`` for good.
A delivery that cannot reach Redis or the database is tried again each lease until it can;
:attr:`JobOptions.max_deliveries` bounds the deliveries that start the run."""

_SWEEP_LIMIT: Final = 1000
"""How many due jobs from the front of the queue each sweep for abandoned claims looks at."""

_RECONCILE_PAGE: Final = 500
"""How many stalled runs a reconciliation reads and checks at a time."""


def _now_ms() -> int:
    return int(time.time() * 1000)


def _job_function(data: bytes) -> str | None:
    """The function an arq job calls, from its stored data (None when it cannot be read)."""
    try:
        return deserialize_job_raw(data, deserializer=_loads)[0]
    except SerializationError:
        return None


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


# --- the queue: enqueueing, status, the runtime's side --------------------------------------


class RunQueue:
    """The background-run side of one :class:`~agent_plugin.plugin.AgentRuntime`.

    In an app it enqueues runs and resumes and reads their records; in a worker it runs them.
    The Redis connection opens on first use (an app that never enqueues never needs Redis)
    and a failure to reach Redis is an ``unavailable`` :class:`AgentError` naming the URL with
    its password hidden.
    """

    def __init__(
        self,
        runtime: AgentRuntime,
        store: SqlRunStore,
        options: JobOptions | None = None,
    ) -> None:
        self.runtime = runtime
        self.store = store
        self.options = options or JobOptions()
        self._redis: ArqRedis | None = None
        self._owns_redis = False
        self._connecting = asyncio.Lock()
        self._watcher: ControlWatcher | None = None
        self._sweeper: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"RunQueue(redis={mask_url(self.redis_url)!r}, queue={self.options.queue_name!r})"

    @property
    def redis_url(self) -> str:
        return self.runtime.settings.redis_url

    @property
    def job_timeout(self) -> float:
        return self.options.timeout_for(self.runtime.settings.max_run_secs)

    def status_path(self, run_id: str) -> str:
        """Where ``GET`` answers the run's record: ``{route_prefix}/runs/{run_id}``."""
        return f"{self.runtime.settings.route_prefix}/runs/{run_id}"

    def handle(self, run_id: str) -> RunHandle:
        return RunHandle(run_id=run_id, status_path=self.status_path(run_id))

    # --- redis -----------------------------------------------------------------------------

    def attach(self, redis: ArqRedis) -> None:
        """Use the worker's own arq connection (not closed by :meth:`aclose`)."""
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
                        job_serializer=_dumps,
                        job_deserializer=_loads,
                    )
                except (TimeoutError, RedisError, OSError) as error:
                    raise _redis_error(self.redis_url, error) from None
                self._owns_redis = True
            return self._redis

    def control_watcher(self, redis: ArqRedis) -> ControlWatcher:
        """The watcher that carries cancel and steering requests to the runs this process runs
        (one pub/sub connection for all of them; closed by :meth:`aclose`)."""
        if self._watcher is None:
            self._watcher = ControlWatcher(redis, prefix=self.options.live_prefix)
        return self._watcher

    # --- claims of workers that died -------------------------------------------------------

    async def release_abandoned_claims(self, redis: ArqRedis) -> list[str]:
        """Cut arq's claim on agent jobs whose worker died before renewing it; their job ids.

        arq claims a job with an in-progress key that lives as long as the job may take (the
        job timeout, 30 minutes by default); a running delivery cuts it to the lease at once
        and renews it. A worker killed between the two leaves a claim nobody renews, and the
        run would wait out the whole timeout. Such a claim is the only one to outlive twice
        the lease: cutting it to the lease frees the job for another worker within the lease,
        and a delivery just starting renews it anyway. Only due jobs of this queue that call
        ``agent_run`` or ``agent_resume`` are touched (the oldest 1000; claimed jobs are due
        and sit near the front).
        """
        lease = _ms(self.options.lease)
        ids = await redis.zrangebyscore(
            self.options.queue_name, "-inf", _now_ms(), start=0, num=_SWEEP_LIMIT
        )
        if not ids:
            return []
        names = [in_progress_key_prefix + job_id.decode() for job_id in ids]
        async with redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.pttl(name)
            ttls = await pipe.execute()
        long_held = [name for name, ttl in zip(names, ttls, strict=True) if ttl > 2 * lease]
        released: list[str] = []
        for name in long_held:
            job_id = name.removeprefix(in_progress_key_prefix)
            data = await redis.get(job_key_prefix + job_id)
            if data is None or _job_function(data) not in (AGENT_RUN, AGENT_RESUME):
                continue
            if await redis.pexpire(name, lease):
                released.append(job_id)
        if released:
            logger.warning(
                "claims of %d job(s) outlived their worker and now expire within %.0f s: %s",
                len(released),
                self.options.lease,
                ", ".join(released),
            )
        return released

    async def reconcile(self, redis: ArqRedis) -> list[str]:
        """Enqueue again the job of every run that should have one in Redis and has none;
        their run ids.

        A run is queued or in progress in the database while its job is gone when the app
        died between recording the run and enqueueing it, when Redis lost its data (a
        restart without persistence, a failover), or when arq dropped the job as expired
        (it waited longer than a day). Such a run would wait for good, its session blocked.
        The runs :meth:`SqlRunStore.stalled` finds (queued, due and unchanged for
        ``reconcile_every`` seconds, or in progress under a lease that ran out that long ago)
        get their job back, due at once and under the same job id, when Redis holds neither
        the job nor a claim on it. A delivery of a job that was not
        lost after all is refused by the run's lease or job id, so a reconciliation that
        races one does no harm.
        """
        restored: list[str] = []
        async for page in self.store.stalled(self.options.reconcile_every, page=_RECONCILE_PAGE):
            async with redis.pipeline(transaction=False) as pipe:
                for run in page:
                    pipe.exists(job_key_prefix + run.job_id, in_progress_key_prefix + run.job_id)
                present = await pipe.execute()
            for run, held in zip(page, present, strict=True):
                if not held and await self._restore_job(redis, run):
                    restored.append(run.run_id)
        if restored:
            logger.warning(
                "%d run(s) had lost their job and were queued again: %s",
                len(restored),
                ", ".join(restored),
            )
        return restored

    async def _restore_job(self, redis: ArqRedis, run: StalledRun) -> bool:
        """Put the run's job back on the queue (Redis holds neither the job nor a claim on it).

        arq refuses to enqueue a job id while it keeps a result for it, so a result left by an
        earlier delivery of the job (one that ended without moving the run on) goes first.
        """
        job_id = run.job_id
        await redis.delete(result_key_prefix + job_id)
        job = await redis.enqueue_job(
            AGENT_RESUME if run.resume else AGENT_RUN,
            run.run_id,
            _job_id=job_id,
            _queue_name=self.options.queue_name,
        )
        return job is not None

    def maintain(self, redis: ArqRedis) -> None:
        """Until :meth:`aclose`, run :meth:`release_abandoned_claims` every lease and
        :meth:`reconcile` every ``reconcile_every`` seconds (one worker of the fleet at a time,
        under a Redis lock); a worker starts this from its startup."""
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._maintain(redis), name="agent job upkeep")

    async def _maintain(self, redis: ArqRedis) -> None:
        every = self.options.reconcile_every
        reconciled = time.monotonic() - every  # once at startup too
        while True:
            try:
                await self.release_abandoned_claims(redis)
            except (TimeoutError, RedisError, OSError) as error:
                logger.warning("cannot check for abandoned job claims: %s", error)
            if time.monotonic() - reconciled >= every:
                reconciled = time.monotonic()
                try:
                    key = f"{self.options.key_prefix}reconciling"
                    if await redis.set(key, b"1", nx=True, px=_ms(every)):
                        await self.reconcile(redis)
                except (AgentError, TimeoutError, RedisError, OSError) as error:
                    logger.warning("cannot check for runs whose job was lost: %s", error)
            await asyncio.sleep(min(self.options.lease, every))

    async def aclose(self) -> None:
        """Stop watching control channels and close the connection this queue opened."""
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            await stop_task(sweeper)
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            await watcher.aclose()
        redis, self._redis = self._redis, None
        if redis is not None and self._owns_redis:
            await redis.aclose(close_connection_pool=True)

    @asynccontextmanager
    async def _reaching_redis(self) -> AsyncIterator[None]:
        try:
            yield
        except (TimeoutError, RedisError, OSError) as error:
            raise _redis_error(self.redis_url, error) from None

    # --- enqueueing ------------------------------------------------------------------------

    async def enqueue(
        self, args: AgentRunArgs, *, defer: float | None = None, claim_session: bool = True
    ) -> RunHandle:
        """Record the run (``queued``) and put its job on the queue, ``defer`` seconds later.

        A run id that exists already is a no-op (the run is enqueued again only while it is
        still queued, in case its job was lost). With ``session_lock = "reject"``, a session
        that another run holds answers ``CONFLICT``, and the run holds its session from now
        on; ``claim_session=False`` leaves the session free until the run starts (follow-ups).
        """
        redis = await self.redis()
        lock = self._claim_for(args.session, args.run_id) if claim_session else None
        claimed = 0
        if lock is not None:
            async with self._reaching_redis():
                claimed = await lock.claim((defer or 0) + self.job_timeout + self.options.lease)
            if not claimed:
                raise _session_busy(args.session)
        try:
            if claimed == 1:
                await self._refuse_busy_session(args.session, args.run_id)
            created = await self.store.create(
                args.run_id,
                origin=args.origin,
                args=args.model_dump(mode="json"),
                session_id=args.session,
                memory_scope=args.memory_scope,
                not_before=defer,
            )
            if not created:
                record = await self.store.get(args.run_id)
                if record is None or record.status is not RunStatus.QUEUED:
                    if lock is not None and claimed == 1:
                        await _quietly(lock.release())
                    return self.handle(args.run_id)
            try:
                async with self._reaching_redis():
                    await redis.enqueue_job(
                        AGENT_RUN,
                        args.run_id,
                        _job_id=args.run_id,
                        _queue_name=self.options.queue_name,
                        _defer_by=defer if defer else None,
                    )
            except AgentError:
                if created:  # unrecorded, so a retry (derived run ids too) can enqueue it
                    await _quietly(self.store.discard(args.run_id))
                raise
        except BaseException:
            if lock is not None and claimed == 1:
                await _quietly(lock.release())
            raise
        logger.info("run %s queued (origin %s)", args.run_id, args.origin)
        return self.handle(args.run_id)

    async def enqueue_resume(
        self, run_id: str, decisions: Sequence[ApprovalDecision] = ()
    ) -> RunHandle:
        """Accept the decisions for a paused run and enqueue ``agent_resume`` for it.

        The decisions are checked against the paused state kept in the run's record: each
        must name a call that awaits approval, and a pause takes decisions once. Anything else
        is ``CONFLICT`` (``NOT_FOUND`` for an unknown run).
        """
        redis = await self.redis()
        record = await self.store.get(run_id)
        if record is None:
            raise AgentError(ErrorKind.NOT_FOUND, f"no run {run_id!r}")
        lock = self._claim_for(record.session_id, run_id)
        claimed = 0
        if lock is not None:
            async with self._reaching_redis():
                claimed = await lock.claim(self.job_timeout + self.options.lease)
            if not claimed:
                raise _session_busy(record.session_id)
        job_id = f"{run_id}:resume:{uuid.uuid4().hex}"
        try:
            if claimed == 1:
                await self._refuse_busy_session(record.session_id, run_id)
            await self.store.take_paused_state(run_id, list(decisions), job_id=job_id)
            try:
                async with self._reaching_redis():
                    await redis.enqueue_job(
                        AGENT_RESUME,
                        run_id,
                        _job_id=job_id,
                        _queue_name=self.options.queue_name,
                    )
            except AgentError:
                # the run awaits approval again: the same decisions can be sent once more
                await _quietly(self.store.return_paused_state(run_id, record.outcome))
                raise
        except BaseException:
            if lock is not None and claimed == 1:
                await _quietly(lock.release())
            raise
        logger.info("run %s: %d decision(s) accepted, resume queued", run_id, len(decisions))
        return self.handle(run_id)

    async def enqueue_followup(self, plan: FollowupPlan) -> str:
        """Enqueue the delayed run of a booked follow-up and return its run id [AP-46].

        The run: ``plan.prompt`` in ``plan.session`` with ``plan.memory_scope``, delivery on,
        origin ``followup``, ``followup_depth = plan.depth``, under
        :meth:`~agent_plugin.proactive.FollowupPlan.derived_run_id` (a retried booking call
        books it once), deferred by ``plan.delay``. It does not claim its session while it
        waits (under ``session_lock = "reject"`` the calling run holds it anyway).
        """
        args = AgentRunArgs(
            prompt=plan.prompt,
            session=plan.session,
            memory_scope=plan.memory_scope,
            deliver=True,
            origin="followup",
            followup_depth=plan.depth,
            run_id=plan.derived_run_id(),
        )
        handle = await self.enqueue(args, defer=plan.delay.total_seconds(), claim_session=False)
        logger.info(
            "follow-up %s booked by run %s for %d s from now (depth %d)",
            handle.run_id,
            plan.parent_run_id,
            plan.delay_seconds,
            plan.depth,
        )
        return handle.run_id

    async def session_active(self, session: str | None) -> bool:
        """Whether a run of ``session`` is active: running (its session lock is held, or its
        record says ``in_progress``) or queued and due (waiting for a worker).

        A run booked for later (a follow-up, ``enqueue_run_in``) does not count until its time
        has come, nor does a run paused for approval. A heartbeat tick is skipped while this
        answers True. No session: False.
        """
        if session is None:
            return False
        redis = await self.redis()
        async with self._reaching_redis():
            if await redis.exists(_lock_key(self.options.key_prefix, session)):
                return True
        return await self._session_runs_active(redis, session)

    async def _session_runs_active(
        self, redis: ArqRedis, session: str, *, besides: str | None = None
    ) -> bool:
        """Whether the records show a run of ``session`` (other than ``besides``) in progress,
        or queued and due."""
        rows = RunRow.__table__.c
        query = (
            sa.select(rows.run_id, rows.job_id, rows.status)
            .where(
                rows.session_id == session,
                rows.status.in_([RunStatus.QUEUED.value, RunStatus.IN_PROGRESS.value]),
                rows.run_id != besides if besides is not None else sa.true(),
            )
            .limit(100)
        )
        async with self.store.database.read() as conn:
            found = (await conn.execute(query)).all()
        if any(status == RunStatus.IN_PROGRESS.value for _, _, status in found):
            return True
        queued = [job_id or run_id for run_id, job_id, _ in found]
        if not queued:
            return False
        async with self._reaching_redis(), redis.pipeline(transaction=False) as pipe:
            for job_id in queued:
                pipe.zscore(self.options.queue_name, job_id)
            scores = await pipe.execute()
        now_ms = time.time() * 1000
        return any(score is not None and float(score) <= now_ms for score in scores)

    async def _refuse_busy_session(self, session: str | None, run_id: str) -> None:
        """Under ``session_lock = "reject"``, after taking a free session lock: refuse the
        run if another run of the session is due or running all the same (its lock expired
        while it waited in a long queue, say)."""
        if session is not None and await self._session_runs_active(
            await self.redis(), session, besides=run_id
        ):
            raise _session_busy(session)

    # --- the heartbeat ---------------------------------------------------------------------

    async def tick(self, heartbeat: Heartbeat, tick_id: str) -> dict[str, Any]:
        """One heartbeat tick (what :func:`agent_heartbeat` does in a worker) [AP-45].

        Runs :func:`~agent_plugin.proactive.heartbeat_tick` with the runtime as the app
        state the precheck gets, :meth:`session_active` as the busy test and a ``start_run``
        that enqueues the check-in as a tracked ``agent_run`` (origin ``heartbeat``, delivery
        on) whose run id derives from ``tick_id``: the same tick enqueued twice is one run.
        The run's policy is not carried in the job; its worker derives it from the origin
        (:meth:`~agent_plugin.plugin.AgentRuntime.heartbeat_policy`). A session taken under
        ``session_lock = "reject"`` is a busy skip too. Never raises: a failing precheck or an
        unreachable Redis or database is logged and counted as ``failed``. Answers the status
        (``started``, ``skipped_busy``, ``skipped_precheck``, ``failed``) and the run id.
        """
        run_id = tick_run_id(self.options.queue_name, tick_id)

        async def start_run(
            prompt: str, session: str | None, memory_scope: str | None, policy: object
        ) -> RunHandle:
            args = AgentRunArgs(
                prompt=prompt,
                session=session,
                memory_scope=memory_scope,
                deliver=True,
                origin="heartbeat",
                run_id=run_id,
            )
            return await self.enqueue(args)

        try:
            result = await heartbeat_tick(
                heartbeat,
                self.runtime,
                start_run,
                app_policy=self.runtime.policy,
                is_busy=self.session_active,
            )
        except AgentError as error:
            if error.kind is not ErrorKind.CONFLICT:
                return await self._tick_failed(error.message)
            logger.info("heartbeat tick skipped: %s", error.message)
            result = TickResult(TickStatus.SKIPPED_BUSY)
        except Exception as error:  # a database or Redis failure, a bug in a precheck
            return await self._tick_failed(redact_text(f"{type(error).__name__}: {error}"))
        started = result.run.run_id if isinstance(result.run, RunHandle) else None
        if started is not None:
            logger.info("heartbeat tick started run %s", started)
        await self._count_tick(result.status.value, started)
        return {"status": result.status.value, "run_id": started}

    async def _tick_failed(self, message: str) -> dict[str, Any]:
        logger.warning("heartbeat tick failed: %s", message)
        await self._count_tick(_TICK_FAILED, None)
        return {"status": _TICK_FAILED, "error": message}

    @property
    def _heartbeat_key(self) -> str:
        return f"{self.options.key_prefix}heartbeat"

    async def _count_tick(self, status: str, run_id: str | None) -> None:
        """Count the tick in the Redis hash :meth:`heartbeat_stats` reads (best effort)."""
        try:
            redis = await self.redis()
            async with redis.pipeline(transaction=True) as pipe:
                pipe.hincrby(self._heartbeat_key, status, 1)
                pipe.hset(
                    self._heartbeat_key,
                    mapping={
                        "last_tick_at": datetime.now(UTC).isoformat(),
                        "last_status": status,
                        "last_run_id": run_id or "",
                    },
                )
                await pipe.execute()
        except (AgentError, RedisError, OSError, TimeoutError) as error:
            logger.warning("heartbeat tick (%s) not counted: %s", status, error)

    async def heartbeat_stats(self) -> HeartbeatStats:
        """What the heartbeat's ticks did, counted across every worker of this queue."""
        redis = await self.redis()
        async with self._reaching_redis():
            raw = await cast(Awaitable[dict[Any, Any]], redis.hgetall(self._heartbeat_key))
        values = {
            (k.decode() if isinstance(k, bytes) else str(k)): (
                v.decode() if isinstance(v, bytes) else str(v)
            )
            for k, v in raw.items()
        }
        return HeartbeatStats.model_validate(
            {key: value for key, value in values.items() if value != ""}
        )

    def _claim_for(self, session: str | None, run_id: str) -> SessionLock | None:
        if session is None or self.runtime.settings.session_lock != "reject":
            return None
        assert self._redis is not None
        return SessionLock(self._redis, session, run_id, prefix=self.options.key_prefix)

    async def get(self, run_id: str) -> RunRecord:
        """The run's public record; ``NOT_FOUND`` for an unknown id."""
        record = await self.store.get(run_id)
        if record is None:
            raise AgentError(ErrorKind.NOT_FOUND, f"no run {run_id!r}")
        return record

    # --- live runs: cancel and steer from any process ----------------------------------------

    def control(self, redis: ArqRedis, run_id: str) -> RunControlChannel:
        """The run's control channel (what the worker running it watches)."""
        return RunControlChannel(redis, run_id, prefix=self.options.live_prefix)

    async def cancel(self, run_id: str, reason: str = "cancelled") -> RunRecord:
        """Cancel a run that is queued, paused for approval or running, from any process.

        The request goes to the run's control channel first (a worker that starts it now sees
        it as it begins); a run nobody runs (queued, awaiting approval) is cancelled in its
        record at once, its arq job taken off the queue and its event readers given a
        ``run_end``; a running run ends ``cancelled`` at its next boundary, by its worker.
        ``CONFLICT`` for a finished run, ``NOT_FOUND`` for an unknown one. Answers the record
        as it is after the request.
        """
        record = await self.get(run_id)
        if record.status.finished:
            raise AgentError(
                ErrorKind.CONFLICT, f"run {run_id} is {record.status}: it cannot be cancelled"
            )
        redis = await self.redis()
        async with self._reaching_redis():
            await self.control(redis, run_id).request_cancel(reason)
        if record.status not in (RunStatus.QUEUED, RunStatus.AWAITING_APPROVAL):
            return record
        try:
            record = await self.store.cancel(run_id, reason)
        except AgentError as error:
            if error.kind is not ErrorKind.CONFLICT:
                raise
            record = await self.get(run_id)  # started meanwhile: the flag reaches its worker
            if record.status.finished and record.status is not RunStatus.CANCELLED:
                raise
            return record
        async with self._reaching_redis():
            pipe = redis.pipeline(transaction=False)
            pipe.zrem(self.options.queue_name, run_id)
            pipe.delete(job_key_prefix + run_id)
            await pipe.execute()
            if record.session_id is not None:  # claimed at enqueue; never held by a worker yet
                prefix = self.options.key_prefix
                await SessionLock(redis, record.session_id, run_id, prefix=prefix).release()
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

    async def steer(self, run_id: str, text: str) -> RunRecord:
        """Queue a user message that joins a running run before its next model call [OP-11].

        ``CONFLICT`` unless the run is ``in_progress``; ``NOT_FOUND`` for an unknown run.
        """
        record = await self.get(run_id)
        if record.status is not RunStatus.IN_PROGRESS:
            raise AgentError(
                ErrorKind.CONFLICT,
                f"run {run_id} is {record.status}: only a running run takes messages",
            )
        redis = await self.redis()
        async with self._reaching_redis():
            await self.control(redis, run_id).send_steering(text)
        return record


_TICK_FAILED: Final = "failed"


class HeartbeatStats(BaseModel):
    """The heartbeat's ticks so far, counted in Redis across every worker of a queue
    (:meth:`RunQueue.heartbeat_stats`): how many started a check-in run, were skipped (a
    run of the session was active; the precheck said no) or failed, and the latest tick."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    started: int = 0
    skipped_busy: int = 0
    skipped_precheck: int = 0
    failed: int = 0
    last_tick_at: datetime | None = None
    last_status: str | None = None
    last_run_id: str | None = None


def tick_run_id(queue_name: str, tick_id: str) -> str:
    """The run id of a heartbeat tick's check-in: ``run_`` and 32 hex digits derived from the
    queue and the tick's arq job id (the same for every worker that enqueues a fleet tick)."""
    seed = f"heartbeat:{queue_name}:{tick_id}"
    return f"run_{hashlib.sha256(seed.encode('utf-8')).hexdigest()[:32]}"


def _lock_key(prefix: str, session: str) -> str:
    return f"{prefix}session-lock:{session}"


def _session_busy(session: str | None) -> AgentError:
    return AgentError(
        ErrorKind.CONFLICT,
        f"session {session!r} already has an active background run; try again when it has "
        "finished (session_lock = reject)",
    )


async def _quietly(work: Any) -> None:
    """Best-effort clean-up: log a failure instead of hiding the error being handled."""
    try:
        await work
    except Exception as error:
        logger.warning("clean-up failed: %s", error)


# --- progress -------------------------------------------------------------------------------


def progress_of(steps_used: int, max_steps: int) -> tuple[int, str]:
    """The percentage and message of a tracked run before a model call [AP-49].

    ``min(steps, max) * 99 // max`` with ``max = max(max_steps, 1)`` (a run reads 100 only
    when it is complete), and ``"step <steps> of <max_steps>"``.
    """
    top = max(max_steps, 1)
    return min(steps_used, top) * 99 // top, f"step {steps_used} of {max_steps}"


class _ProgressAtCheckpoints:
    """The run's progress, written with the checkpoint that comes before each model call.

    The model is asked only after a checkpoint of one of these: ``started`` (the run begins or
    resumes), ``round_done`` (a round of tool calls ended) or ``appended`` (steering joined),
    so writing ``progress_of(steps, max_steps)`` in the same transaction as those entries
    reports the progress before every model call without a transaction of its own [AP-49].
    ``steps`` is what the latest ``started`` or ``replied`` entry counted: what the run's
    ``steps_used`` is when it next asks the model. (A run that ends right after a round
    reports that round's step; then its record moves to how it ended.)
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


# --- one delivery of a job ------------------------------------------------------------------


class _Keeper:
    """Renews what a running job holds: arq's in-progress key of the job and its session lock,
    and the run's lease in the database once the delivery has started the run.

    The two are renewed by separate tasks, so a Redis outage (whose commands a worker retries
    for about 15 s) does not let the database lease lapse, which would let another worker take
    the run over when Redis is back, and a database outage does not cost the claim in Redis.
    """

    def __init__(
        self, redis: ArqRedis, job_id: str, lease: float, run_lease: Callable[[], Awaitable[None]]
    ) -> None:
        self.redis = redis
        self.key = in_progress_key_prefix + job_id
        self.lease = lease
        self.lock: SessionLock | None = None
        self.run_lease = run_lease
        """Renews the run's lease in the database (a no-op until the delivery started it)."""
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> _Keeper:
        await self._renew_claim()
        self._tasks = [
            asyncio.create_task(self._every_third_of_lease(self._renew_claim), name=self.key),
            asyncio.create_task(self._every_third_of_lease(self.run_lease), name=self.key),
        ]
        return self

    async def __aexit__(self, *_exc: object) -> None:
        for task in self._tasks:
            await stop_task(task)

    async def _every_third_of_lease(self, renew: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                await renew()
            except (AgentError, TimeoutError, RedisError, OSError) as error:
                logger.warning("cannot renew the lease of %s: %s", self.key, error)

    async def _renew_claim(self) -> None:
        # SET, not PEXPIRE: a claim deleted while this delivery lives (a superseded delivery of
        # the same job ended, a Redis restart lost it) comes back, so the job stays protected
        await self.redis.set(self.key, b"1", px=_ms(self.lease))
        lock = self.lock
        if lock is not None and lock.held and not await lock.renew(self.lease * 3):
            logger.warning("run %s lost the lock of session %r", lock.run_id, lock.session_id)


class _Delivery:
    """One delivery of ``agent_run`` or ``agent_resume`` for one run."""

    def __init__(
        self,
        queue: RunQueue,
        ctx: dict[str, Any],
        run_id: str,
        args: AgentRunArgs | None,
        *,
        retry_errors: bool,
        resume: bool = False,
    ) -> None:
        self.queue = queue
        self.store = queue.store
        self.options = queue.options
        self.redis: ArqRedis = ctx["redis"]
        self.job_id = str(ctx.get("job_id", run_id))
        self.run_id = run_id
        self.args = args
        self.retry_errors = retry_errors
        self.resume = resume
        """An ``agent_resume`` job: its report's source is ``resume``."""
        self.retry_delay: float | None = None
        """Set when the delivery ends with arq's ``Retry``: seconds until the next attempt."""
        self.superseded = False
        """Another delivery took the run over: the session lock is that delivery's."""
        self.run_over = False
        """The run had ended (or paused) before this delivery: its session lock is free."""
        self.attempt: int | None = None
        """The run's attempt this delivery started (``None`` before it started the run)."""
        self.session: str | None = None
        self.ended: AgentOutcome | OutcomeSummary | None = None
        """How the run ended (or, found ended by a re-delivery, its record's summary)."""
        self.live: _Live | None = None
        """The running agent's cancel token, steering and event sink."""
        self.stream: RunEventStream | None = None
        self.held_end: RunEnded | None = None
        """The agent's own ``run_end``: published once the record says how the run ended."""

    def result(self, status: RunStatus | str) -> dict[str, Any]:
        """The job's result in arq: the run id and its status; never the outcome or a secret."""
        return {"run_id": self.run_id, "status": str(status)}

    async def run(self) -> dict[str, Any]:
        keeper = _Keeper(self.redis, self.job_id, self.options.lease, self._renew_lease)
        async with keeper:
            args = self.args
            if args is not None:  # enqueued with its arguments: by hand, maybe without a record
                await self.store.create(
                    self.run_id,
                    origin=args.origin,
                    args=args.model_dump(mode="json"),
                    session_id=args.session,
                    memory_scope=args.memory_scope,
                    job_id=self.job_id,
                )
            else:
                args = await self._stored_args()
            session = args.session if args is not None else None
            if args is None:
                record = await self.store.get(self.run_id)
                if record is None:
                    logger.warning("job %s: there is no run %s", self.job_id, self.run_id)
                    return self.result("unknown")
                session = record.session_id
            self.session = session
            lock = None
            if session is not None:
                lock = SessionLock(self.redis, session, self.run_id, prefix=self.options.key_prefix)
                keeper.lock = lock
            result = await self._run_in_time(args, lock)
            if args is not None and args.deliver:
                await self._report(args)
            return result

    async def _report(self, args: AgentRunArgs) -> None:
        """Deliver how the run ended, once per job (at least once: see the module docs).

        A marker in Redis (per arq job id) says the report went out, so a re-delivered job
        that finds its run already ended reports only if its first delivery did not get to.
        """
        ended = self.ended
        if ended is None:
            return
        runtime = self.queue.runtime
        source = ReportSource.RESUME if self.resume else ReportSource.for_origin(args.origin)
        marker = f"{self.options.key_prefix}reported:{self.job_id}"
        try:
            if await self.redis.exists(marker):
                return
        except (RedisError, OSError, TimeoutError) as error:
            logger.warning("run %s: cannot check its report marker (%s)", self.run_id, error)
        await deliver_outcome(
            runtime.delivery,
            ended,
            source=source,
            run_id=self.run_id,
            session_id=self.session,
            limit=_delivery_limit(runtime.delivery),
        )
        try:
            await self.redis.set(marker, b"1", ex=_MARKER_TTL)
        except (RedisError, OSError, TimeoutError) as error:
            logger.warning("run %s: cannot mark its report as sent (%s)", self.run_id, error)

    @property
    def lock_ttl(self) -> float:
        """How long a session lock outlives a dead worker: three leases, so the run's own
        re-delivery (after one lease) normally takes it back first."""
        return self.options.lease * 3

    async def _session_free(self) -> bool:
        """No other run of the session is in progress (one that crashed holding the session
        must finish first: it continues from checkpoints made on the session as it was)."""
        session = self.session
        if session is None:
            return True
        rows = RunRow.__table__.c
        query = (
            sa.select(rows.run_id)
            .where(
                rows.session_id == session,
                rows.status == RunStatus.IN_PROGRESS.value,
                rows.run_id != self.run_id,
            )
            .limit(1)
        )
        async with self.store.database.read() as conn:
            return (await conn.execute(query)).first() is None

    async def _stored_args(self) -> AgentRunArgs | None:
        stored = await self.store.args(self.run_id)
        if stored is None:
            return None
        try:
            return AgentRunArgs.model_validate(stored)
        except ValidationError as error:
            raise AgentError(
                ErrorKind.DECODE, f"run {self.run_id}: the stored arguments do not decode: {error}"
            ) from None

    async def _run_in_time(
        self, args: AgentRunArgs | None, lock: SessionLock | None
    ) -> dict[str, Any]:
        timeout = self.queue.job_timeout
        limit = asyncio.timeout(timeout)
        waiting = lock is not None
        try:
            async with limit:
                if lock is not None:
                    await lock.wait(self.lock_ttl, free=self._session_free)
                    waiting = False
                return await self._start_and_drive(args)
        except TimeoutError:
            if not limit.expired():
                raise
            if waiting and lock is not None:
                error = AgentError(
                    ErrorKind.CONFLICT,
                    f"session {lock.session_id!r} stayed busy for {timeout:g} s",
                )
            else:
                error = AgentError(
                    ErrorKind.BUDGET,
                    f"the run did not finish within the job timeout ({timeout:g} s)",
                )
            return await self._fail(error, self.attempt)
        except asyncio.CancelledError:  # the worker is shutting down; arq runs the job again
            if self.attempt is not None:  # (a run it never started may be another's to run)
                requeue = self.store.requeue(self.run_id, attempt=self.attempt)
                await asyncio.shield(_quietly(requeue))
            raise
        finally:
            # the lock is this delivery's to give up if it ran the run, or took the lock itself
            # (it was free); otherwise it belongs to the run's enqueue or another delivery
            ours = self.attempt is not None or self.run_over or (lock is not None and lock.taken)
            if lock is not None and lock.held and ours and not self.superseded:
                if self.retry_delay is not None:  # keep the session through the backoff
                    await _quietly(lock.renew(self.retry_delay + self.lock_ttl))
                else:
                    await asyncio.shield(_quietly(lock.release()))

    async def _current_status(self) -> dict[str, Any]:
        current = await self.store.get(self.run_id)
        if current is None:
            return self.result("unknown")
        # ended, or paused with no resume queued: a lock held in the run's name is left over
        # from a delivery that died before releasing it
        self.run_over = current.status.finished or current.status is RunStatus.AWAITING_APPROVAL
        if current.outcome is not None and current.status in _REPORTABLE:
            self.ended = current.outcome  # a re-delivery: report it if the first did not
        await self._end_stream_of(current)
        return self.result(current.status)

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

    async def _start_and_drive(self, args: AgentRunArgs | None) -> dict[str, Any]:
        try:
            record = await self.store.start(
                self.run_id, job_id=self.job_id, lease=self.options.lease, resume=self.resume
            )
        except AgentError as error:  # a duplicate delivery of a run that moved on
            if error.kind not in (ErrorKind.CONFLICT, ErrorKind.NOT_FOUND):
                raise
            if error.retry_after is not None:  # held: by a live delivery, or a retry's backoff
                self._held_elsewhere(error.retry_after, error)
            return await self._current_status()
        attempt = self.attempt = record.attempt
        if attempt > self.options.max_deliveries:
            return await self._give_up(attempt)
        try:
            outcome = await self._drive(record, args)
            record = await self.store.finish(self.run_id, outcome, attempt=attempt)
            self.ended = outcome
            await self._publish_end(self.held_end or RunEnded.of(self.run_id, outcome))
        except AgentError as error:
            return await self._failed(error, attempt)
        except Exception as error:  # a bug in app code (a hook, a policy, a store)
            message = redact_text(f"{type(error).__name__}: {error}")
            logger.error("run %s failed unexpectedly: %s", self.run_id, message)
            logger.debug("run %s: traceback", self.run_id, exc_info=True)
            return await self._failed(AgentError(ErrorKind.INTERNAL, message), attempt)
        logger.info("run %s %s", self.run_id, record.status)
        if attempt > 1:  # retries are counted only by attempts before this one
            await self._forget_retries()
        return self.result(record.status)

    async def _give_up(self, attempt: int) -> dict[str, Any]:
        """Fail a run started more often than ``max_deliveries`` (a run whose worker keeps
        dying: out of memory, say). Deliveries that never started it do not count."""
        error = AgentError(
            ErrorKind.UNAVAILABLE,
            f"the run was started {attempt - 1} times without finishing (its worker stopped "
            "each time); giving up",
        )
        return await self._fail(error, attempt)

    async def _fail(self, error: AgentError, attempt: int | None) -> dict[str, Any]:
        """Record that ``error`` ended the run and publish its end; a run a later delivery
        took over is left to that one (see :meth:`_superseded`)."""
        try:
            await self.store.fail(self.run_id, error.info(), attempt=attempt)
        except AgentError as refused:
            if refused.kind is not ErrorKind.CONFLICT:
                raise
            return await self._superseded(refused)
        await self._publish_end(RunEnded(run_id=self.run_id, error=error.info()))
        return self.result(RunStatus.FAILED)

    def _held_elsewhere(self, remaining: float, why: AgentError) -> NoReturn:
        """The run is held by a live delivery (this job's claim in Redis vanished, or another
        job's delivery runs it) or waits for a retry's backoff: come back when that ends,
        leaving everything (the session lock too) to its holder."""
        logger.info("run %s: %s", self.run_id, why.message)
        self.superseded = True
        raise Retry(defer=max(remaining, 0.05) + random.uniform(0, 0.1))

    async def _renew_lease(self) -> None:
        """Renew the run's lease (the keeper calls this); a run another delivery took over
        meanwhile is cancelled here, so this delivery stops at its next step instead of
        running on beside the new one (its checkpoints and its end are refused anyway)."""
        attempt, live = self.attempt, self.live
        if attempt is None or self.superseded:
            return
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
        self.superseded = True
        if live is not None:
            live.cancel.cancel("taken over by another delivery")

    async def fail_unstarted(self, error: AgentError) -> None:
        """Record ``error`` for a queued run that deliveries could not even start (its stored
        arguments do not decode, say), once ``max_attempts`` of them failed so: the reconciler
        would otherwise deliver it again and again while the record says ``queued``. (Not at
        the first: a worker of an older release, during an upgrade, may not read what a newer
        app stored, and the next delivery may reach a newer worker.) The run's session lock,
        taken when it was enqueued, goes with it."""
        if self.attempt is not None or self.superseded:
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
            if record.session_id is not None:
                prefix = self.options.key_prefix
                await SessionLock(
                    self.redis, record.session_id, self.run_id, prefix=prefix
                ).release()
            await self.redis.delete(key)
        except (AgentError, RedisError, OSError, TimeoutError) as trouble:
            logger.warning("run %s: cannot record that it failed: %s", self.run_id, trouble)
            return
        logger.warning("run %s failed before it could start: %s", self.run_id, error)
        await self._publish_end(RunEnded(run_id=self.run_id, error=error.info()))

    async def _forget_retries(self) -> None:
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            await self.redis.delete(self._retries_key)

    @property
    def _retries_key(self) -> str:
        return f"{self.options.key_prefix}retries:{self.run_id}"

    async def _still_ours(self, attempt: int) -> bool:
        record = await self.store.get(self.run_id)
        return (
            record is not None
            and record.status is RunStatus.IN_PROGRESS
            and record.attempt == attempt
        )

    async def _failed(self, error: AgentError, attempt: int) -> dict[str, Any]:
        """Record the error (or schedule a retry); if the database or Redis is down so that
        neither can be recorded, the whole delivery is tried again later."""
        try:
            return await self._record_failure(error, attempt)
        except (AgentError, RedisError, OSError, TimeoutError) as trouble:
            if isinstance(trouble, AgentError) and not trouble.retryable:
                raise
            logger.warning("run %s: cannot record how it ended (%s); later", self.run_id, trouble)
            self.retry_delay = self.options.lease
            raise Retry(defer=self.options.lease) from None

    async def _superseded(self, why: object) -> dict[str, Any]:
        """A later delivery took this one's run over: everything is left to it (the session
        lock too), and while it runs the job stays queued under it (ending the job here would
        take it off the queue, and a crash of that delivery would then lose the run)."""
        logger.warning("run %s was taken over by another delivery: %s", self.run_id, why)
        self.superseded = True
        current = await self.store.get(self.run_id)
        if current is not None and current.status is RunStatus.IN_PROGRESS:
            raise Retry(defer=2 * self.options.lease)
        return self.result("superseded")

    async def _record_failure(self, error: AgentError, attempt: int) -> dict[str, Any]:
        if not await self._still_ours(attempt):
            return await self._superseded(error)
        try:
            return await self._record_own_failure(error, attempt)
        except AgentError as refused:  # taken over meanwhile: the moves are fenced by attempt
            if refused.kind is not ErrorKind.CONFLICT:
                raise
            return await self._superseded(refused)

    async def _record_own_failure(self, error: AgentError, attempt: int) -> dict[str, Any]:
        if error.retryable and self.retry_errors:
            retries = int(await self.redis.incr(self._retries_key))
            await self.redis.expire(self._retries_key, 86_400)
            if retries < self.options.max_attempts:
                delay = self.options.backoff(retries, error.retry_after)
                await self.store.requeue(self.run_id, attempt=attempt, not_before=delay)
                logger.info(
                    "run %s: %s; attempt %d of %d in %.1f s",
                    self.run_id,
                    error,
                    retries + 1,
                    self.options.max_attempts,
                    delay,
                )
                self.retry_delay = delay
                await self._publish_end(
                    RetryScheduled(
                        run_id=self.run_id,
                        attempt=retries + 1,
                        max_attempts=self.options.max_attempts,
                        wait_seconds=delay,
                        error=error.info(),
                    )
                )
                raise Retry(defer=delay)
        logger.warning("run %s failed: %s", self.run_id, error)
        ended = await self._fail(error, attempt)
        await self._forget_retries()
        return ended

    # --- what the run does -----------------------------------------------------------------

    def _event_stream(self) -> RunEventStream:
        if self.stream is None:
            self.stream = RunEventStream(
                self.redis,
                self.run_id,
                prefix=self.options.live_prefix,
                maxlen=self.options.events_maxlen,
                ttl_after_end=self.options.events_ttl,
            )
        return self.stream

    async def _publish_end(self, event: AgentEvent) -> None:
        """Publish how the run ended (or that it will be retried) once its record says so;
        events never fail a run."""
        if not self.options.events:
            return
        try:
            await self._event_stream().publish(event)
        except (RedisError, OSError, TimeoutError) as error:
            logger.warning(
                "run %s: its %s event was not published: %s", self.run_id, event.type, error
            )

    async def _drive(self, record: RunRecord, args: AgentRunArgs | None) -> AgentOutcome:
        """Run :meth:`_drive_live` while the run's events go to its Redis stream and its
        control channel (cancel, steering) reaches its :class:`CancelToken` and
        :class:`Steering`, from any process."""
        live = self.live = _Live(CancelToken(), Steering(), None)
        async with contextlib.AsyncExitStack() as stack:
            if self.options.events:
                publish = await stack.enter_async_context(self._event_stream().publisher())

                def sink(event: AgentEvent) -> None:
                    if isinstance(event, RunEnded):  # published by _publish_end, see there
                        self.held_end = event
                        return
                    publish(event)

                live.sink = sink
            watcher = self.queue.control_watcher(self.redis)
            try:
                await stack.enter_async_context(
                    watcher.watch(self.run_id, live.cancel, live.steering)
                )
            except (RedisError, OSError, TimeoutError) as error:
                logger.warning("run %s: cannot watch its control channel: %s", self.run_id, error)
            return await self._drive_live(record, args, live)

    async def _drive_live(
        self, record: RunRecord, args: AgentRunArgs | None, live: _Live
    ) -> AgentOutcome:
        """Continue the run from wherever it is: a resume, a checkpoint, or the start."""
        store = self.store
        runtime = self.queue.runtime
        heartbeat = args is not None and args.origin == "heartbeat"
        agent = runtime.agent_with(
            args.memory_scope if args is not None else record.memory_scope,
            system_prompt=args.system_prompt if args is not None else None,
            max_steps=args.max_steps if args is not None else None,
            policy=runtime.heartbeat_policy() if heartbeat else None,
            followup_depth=args.followup_depth if args is not None else 0,
            session=self.session,
        )
        journal = store.journal(
            self.run_id,
            attempt=record.attempt,
            progress=_ProgressAtCheckpoints(agent.budget.max_steps),
        )
        first = record.attempt == 1  # never started before: no checkpoints, no pause
        entries = [] if first else await store.journal_entries(self.run_id)
        pending = None if first else await store.pending_resume(self.run_id)
        if pending is not None and not _resume_began(entries, pending[0]):
            state, decisions = pending
            return await self._resume(agent, state, decisions, journal, live)
        recovered = recover(entries)
        if recovered is not None:
            if recovered.awaiting():  # it had paused for approval before the worker stopped
                return AwaitingApproval(state=recovered)
            return await self._resume(agent, recovered, [], journal, live)
        if args is None:
            raise AgentError(
                ErrorKind.DECODE, f"run {self.run_id} has neither arguments nor checkpoints"
            )
        if args.session is not None:
            turn = await run_in_session(
                agent,
                runtime.session_store,
                args.session,
                args.prompt,
                compaction=runtime.compaction,
                run_id=self.run_id,
                journal=journal,
                cancel=live.cancel,
                steering=live.steering,
                on_event=live.sink,
            )
            return turn.outcome
        alone = await agent.run_turn(
            [],
            args.prompt,
            run_id=self.run_id,
            journal=journal,
            cancel=live.cancel,
            steering=live.steering,
            on_event=live.sink,
        )
        return alone.outcome

    async def _resume(
        self,
        agent: Agent,
        state: RunState,
        decisions: Sequence[ApprovalDecision],
        journal: RunJournal,
        live: _Live,
    ) -> AgentOutcome:
        session_id, version = state.session_id, state.session_version
        if session_id is None or version is None:
            turn = await agent.resume(
                state,
                decisions,
                journal=journal,
                cancel=live.cancel,
                steering=live.steering,
                on_event=live.sink,
            )
            return turn.outcome
        store = self.queue.runtime.session_store
        mine = state.messages[state.history_length :]
        newer = await store.entries(session_id, after=version, limit=len(mine) + 1)
        if newer and [e.message for e in newer if isinstance(e, MessageEntry)] == mine:
            # the turn was saved just before the worker stopped: its outcome, without saving
            return (await agent.resume(state, decisions)).outcome
        turn = await resume_in_session(
            agent,
            store,
            state,
            decisions,
            journal=journal,
            cancel=live.cancel,
            steering=live.steering,
            on_event=live.sink,
        )
        return turn.outcome


@dataclass
class _Live:
    """What a delivery hands every agent call: the run's cancel token and steering queue
    (fed by the queue's :class:`~agent_plugin.live.ControlWatcher`) and its event sink
    (``None``: no events)."""

    cancel: CancelToken
    steering: Steering
    sink: EventSink | None


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


# --- the job functions ----------------------------------------------------------------------


def _queue_of(ctx: dict[str, Any]) -> RunQueue:
    runtime = ctx.get(_RUNTIME_KEY)
    jobs = getattr(runtime, "jobs", None)
    if not isinstance(jobs, RunQueue):
        raise AgentError(
            ErrorKind.UNAVAILABLE,
            "agent plugin is not installed in this worker: run it with the WorkerSettings "
            "from AgentPlugin.worker_settings()",
        )
    return jobs


_REPORTABLE: Final = frozenset({RunStatus.COMPLETE, RunStatus.AWAITING_APPROVAL})
_MARKER_TTL: Final = 86_400


def _delivery_limit(delivery: object) -> float:
    """Seconds a report may take: the delivery's own ``timeout`` and a second, at most
    :data:`~agent_plugin.proactive.DEFAULT_DELIVERY_TIMEOUT` (the headroom the worker's job
    timeout leaves for it)."""
    own = getattr(delivery, "timeout", None)
    if isinstance(own, int | float) and not isinstance(own, bool) and 0 < own < float("inf"):
        return min(float(own) + 1.0, DEFAULT_DELIVERY_TIMEOUT)
    return DEFAULT_DELIVERY_TIMEOUT


def _payload(payload: str) -> tuple[str, AgentRunArgs | None]:
    text = payload.strip()
    if not text.startswith("{"):
        return text, None
    try:
        args = AgentRunArgs.model_validate_json(text)
    except ValidationError as error:
        raise AgentError(ErrorKind.DECODE, f"bad agent_run arguments: {error}") from None
    return args.run_id, args


async def _deliver(delivery: _Delivery) -> dict[str, Any]:
    """Run one delivery; if Redis or the database is out of reach, deliver it again later
    (bounded by ``max_deliveries``) instead of letting arq drop the job."""
    try:
        return await delivery.run()
    except (AgentError, RedisError, OSError, TimeoutError) as error:
        if isinstance(error, AgentError) and not error.retryable:
            await delivery.fail_unstarted(error)
            raise
        lease = delivery.options.lease
        logger.warning("run %s: %s; trying again in %g s", delivery.run_id, error, lease)
        raise Retry(defer=lease) from None


async def agent_run(ctx: dict[str, Any], args_json: str) -> dict[str, Any]:
    """The arq job of a background run [AP-47].

    ``args_json`` is :class:`AgentRunArgs` as JSON, or only the run id when the run's record
    already holds its arguments (what :meth:`RunQueue.enqueue` sends). Records the outcome or
    the typed error in the run's record and answers ``{"run_id", "status"}``; retryable
    failures come back as arq ``Retry`` until the attempts are used up.
    """
    queue = _queue_of(ctx)
    run_id, args = _payload(args_json)
    return await _deliver(_Delivery(queue, ctx, run_id, args, retry_errors=True))


async def agent_resume(ctx: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The arq job that resumes a paused run with the decisions its record holds.

    Errors are never retried (approved calls may act on the world); a worker that died is
    replaced, and its successor continues from the checkpoints without repeating a call.
    """
    queue = _queue_of(ctx)
    delivery = _Delivery(queue, ctx, run_id.strip(), None, retry_errors=False, resume=True)
    return await _deliver(delivery)


async def agent_heartbeat(ctx: dict[str, Any]) -> dict[str, Any]:
    """The arq cron job ``agent_heartbeat``: one tick of the plugin's heartbeat [AP-45].

    See :meth:`RunQueue.tick`. In a worker where the plugin has not started (or that has no
    heartbeat) it does nothing but log a warning: a tick is never an error.
    """
    runtime = ctx.get(_RUNTIME_KEY)
    queue = getattr(runtime, "jobs", None)
    heartbeat = getattr(runtime, "heartbeat", None)
    if not isinstance(queue, RunQueue) or not isinstance(heartbeat, Heartbeat):
        logger.warning(
            "agent_heartbeat: the agent plugin has not started in this worker (or has no "
            "heartbeat); the tick does nothing"
        )
        return {"status": "not_started"}
    tick_id = str(ctx.get("job_id") or uuid.uuid4().hex)
    return await queue.tick(heartbeat, tick_id)


# --- the worker -----------------------------------------------------------------------------


_TICK_TIMEOUT: Final = 60.0
"""Seconds one heartbeat tick may take (a precheck and an enqueue)."""
_TICK_KEEP_RESULT: Final = 60.0
"""Seconds arq keeps a fleet tick's result, so a worker that enqueues the same tick late finds
it done (arq's enqueue is a no-op while the job or its result exists)."""


def heartbeat_cron(heartbeat: Heartbeat) -> CronJob:
    """The arq cron job of ``heartbeat``: :func:`agent_heartbeat` named ``agent_heartbeat`` on
    the heartbeat's schedule, unique across workers unless ``per_replica``.

    ``run_at_startup=False``: a worker that starts (after downtime too) waits for the next
    scheduled time, so ticks missed while no worker ran are not replayed (a running worker
    that stalled catches up, one tick per poll). Evaluate it in a worker whose
    ``timezone`` is :meth:`Heartbeat.tzinfo <agent_plugin.proactive.Heartbeat.tzinfo>`.
    """
    return cron(
        agent_heartbeat,
        name=AGENT_HEARTBEAT,
        unique=heartbeat.fleet,
        run_at_startup=False,
        timeout=_TICK_TIMEOUT,
        keep_result=_TICK_KEEP_RESULT if heartbeat.fleet else 0,
        max_tries=1,
        **heartbeat.cron_fields(),
    )


def worker_settings(plugin: AgentPlugin, options: JobOptions, **overrides: Any) -> type[Any]:
    """arq ``WorkerSettings`` for ``plugin``: see :meth:`AgentPlugin.worker_settings`."""
    settings = plugin.load_settings()
    timeout = options.timeout_for(settings.max_run_secs)
    # the run's own limit, then its report (bounded by _delivery_limit), then a margin
    job_timeout = timeout + DEFAULT_DELIVERY_TIMEOUT + 5

    async def on_startup(ctx: dict[str, Any]) -> None:
        runtime = await plugin.start_worker()
        queue = runtime.jobs
        if queue is None:  # pragma: no cover - start_worker turns jobs on
            raise AgentError.config("background runs are off for this plugin")
        queue.attach(ctx["redis"])
        queue.maintain(ctx["redis"])
        ctx[_RUNTIME_KEY] = runtime
        logger.info("agent worker started: %r, %r", runtime, queue)
        if runtime.heartbeat is not None:
            logger.info("agent heartbeat: %s", runtime.heartbeat.description())

    async def on_shutdown(ctx: dict[str, Any]) -> None:
        runtime = ctx.pop(_RUNTIME_KEY, None)
        if runtime is not None:
            await plugin.stop_worker(runtime)

    functions = [
        func(agent_run, name=AGENT_RUN, timeout=job_timeout, max_tries=_ARQ_MAX_TRIES),
        func(
            agent_resume,
            name=AGENT_RESUME,
            timeout=job_timeout,
            max_tries=_ARQ_MAX_TRIES,
        ),
    ]
    cron_jobs: list[CronJob] = list(overrides.pop("cron_jobs", None) or ())
    heartbeat = plugin.heartbeat
    if heartbeat is not None:
        zone = heartbeat.tzinfo()
        given = overrides.setdefault("timezone", zone)
        if given != zone:
            raise AgentError.config(
                f"the worker's timezone override {given!r} differs from the heartbeat's "
                f"({heartbeat.timezone}); arq evaluates every cron job in the worker's timezone, "
                "so leave it out (or give the heartbeat the same timezone)"
            )
        cron_jobs.insert(0, heartbeat_cron(heartbeat))
        logger.debug("heartbeat registered: %s", heartbeat.description())
    attributes: dict[str, Any] = {
        "__doc__": "arq worker settings built by AgentPlugin.worker_settings().",
        "functions": functions,
        "redis_settings": redis_settings(settings.redis_url, worker=True),
        "queue_name": options.queue_name,
        "on_startup": on_startup,
        "on_shutdown": on_shutdown,
        "cron_jobs": cron_jobs,
        "job_timeout": job_timeout,
        "max_tries": _ARQ_MAX_TRIES,
        "keep_result": options.keep_result,
        "max_jobs": options.max_jobs,
        "poll_delay": options.poll_delay,
        "job_serializer": _dumps,
        "job_deserializer": _loads,
        "health_check_interval": 60,
        **overrides,
    }
    return type("WorkerSettings", (), attributes)
