"""How background runs are queued and run: :class:`JobOptions`, shared by the app and its
workers."""

from __future__ import annotations

import random
from dataclasses import dataclass

from agent_plugin.errors import AgentError

__all__ = ["JobOptions"]


@dataclass(frozen=True, slots=True)
class JobOptions:
    """How background runs are queued and run; the app and its workers must agree on them.

    * ``queue_name``: the arq queue (Redis sorted set) of the agent's jobs; its own, not arq's
      shared default ``arq:queue``, so an app's own arq jobs and the agent's workers never take
      each other's jobs.
    * ``job_timeout``: seconds one delivery of a job may take, waiting for its session
      included; ``None``: ``max_run_secs + 60`` when that is set, else 1800.
    * ``max_attempts``: attempts of a run that fails with a retryable error.
    * ``retry_backoff``: seconds before the first retry; doubled for each later one (with
      jitter), never less than the provider's ``Retry-After``, at most ``max_backoff``.
    * ``max_deliveries``: how many times a run may be started (its retries and restarts after
      a crashed worker included) before it is failed as interrupted too often. Deliveries
      that never start it (Redis or the database out of reach) do not count: those are tried
      again each lease until they can.
    * ``lease``: seconds a job's claim in Redis and its run's lease in the database live
      without renewal: how soon another worker continues the run of a worker that died
      (and, in a session, how long that run holds its session meanwhile).
    * ``reconcile_every``: seconds between a worker's checks for runs whose job vanished from
      Redis (one worker of the fleet checks at a time), and how
      long a queued run must sit unchanged before its missing job counts as lost.
    * ``keep_result``: seconds arq keeps a job's (small) result; the run record stays.
    * ``max_jobs``: how many runs one worker runs at once. A run spends nearly all its time
      waiting for the model, so the default is sized for waiting, not for CPU: hundreds per
      process (lower it for runs whose tools use the CPU).
    * ``poll_delay``: seconds between a worker's reads of the queue; a poll starts as many due
      runs as the worker has free slots (never rereading the runs that are running).
    * ``max_redis_connections``: the Redis connections one process opens for its runs, its
      queue and arq's own work, shared by every run (a command waits for a free one); the
      event readers of an app and a worker's control watcher hold theirs apart.
    * ``key_prefix``: prefix of the plugin's own Redis keys (retry counters, report markers,
      and under ``{key_prefix}run:`` each run's event stream and control keys).
    * ``events``: publish each background run's events to its Redis stream (read by
      ``GET {prefix}/runs/{run_id}/events``); ``events_maxlen`` bounds the stream,
      ``events_ttl`` is how long it stays after the run ends.
    * ``max_event_readers``: event streams one app process serves at once (each holds a
      Redis connection of a pool of that size, apart from the app's other Redis work);
      one more is answered 503 with ``Retry-After``, so readers can never use up Redis's
      connections, which the workers need.
    * ``max_queued_messages``: messages a running run holds at most before they join it
      (``POST {prefix}/runs/{run_id}/messages``); one more is a ``conflict``.
    """

    queue_name: str = "agent:queue"
    job_timeout: float | None = None
    max_attempts: int = 3
    retry_backoff: float = 1.0
    max_backoff: float = 60.0
    max_deliveries: int = 20
    lease: float = 15.0
    reconcile_every: float = 60.0
    keep_result: float = 3600.0
    max_jobs: int = 200
    poll_delay: float = 0.5
    max_redis_connections: int = 50
    key_prefix: str = "agent:"
    events: bool = True
    events_maxlen: int = 1000
    events_ttl: int = 3600
    max_event_readers: int = 200
    max_queued_messages: int = 32

    @property
    def live_prefix(self) -> str:
        """The prefix of the runs' event streams and control keys (:mod:`agent_plugin.live`)."""
        return f"{self.key_prefix}run:"

    def __post_init__(self) -> None:
        checks = {
            "max_attempts": self.max_attempts >= 1,
            "max_deliveries": self.max_deliveries >= 1,
            "max_jobs": self.max_jobs >= 1,
            "max_redis_connections": self.max_redis_connections >= 2,
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
            "max_event_readers": self.max_event_readers >= 1,
            "max_queued_messages": self.max_queued_messages >= 1,
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
