"""Cancel and steering requests from any process to the worker running a run:
:class:`RunControlChannel` (one run's keys and pub/sub channel) and :class:`ControlWatcher`
(one pub/sub connection for every run of a process). Keys (default prefix ``agent:run:``):
``<run_id>:cancel`` (the reason), ``<run_id>:steer`` (queued messages, with their mode),
``<run_id>:queued`` (how many messages were sent and have not joined the run yet: the bound)
and ``<run_id>:control`` (the channel that wakes the worker up).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline, PubSub
from redis.exceptions import RedisError

from agent_plugin.cancellation import CancelToken, stop_task
from agent_plugin.live.streams import DEFAULT_PREFIX
from agent_plugin.steering import MESSAGE_MODES, MessageMode, Steering, queue_full

logger = logging.getLogger("agent_plugin.live")

AlsoQueue = Callable[[Pipeline], object]
"""Queues commands of the caller's own on a run's first look at its control channel (the
same transaction: no round trip of their own); their replies are not read."""


# --- cancel and steer across workers ---------------------------------------------------------


class RunControlChannel:
    """Cancel and steering requests for one run, from any process to the one running it.

    Requests are stored in Redis (so a worker that starts later still sees them) and announced
    on a pub/sub channel (so the running worker reacts at once). Keys live ``ttl`` seconds.
    """

    def __init__(
        self, redis: Redis, run_id: str, *, prefix: str = DEFAULT_PREFIX, ttl: int = 86_400
    ) -> None:
        self.redis = redis
        self.run_id = run_id
        self.ttl = ttl
        self.cancel_key = f"{prefix}{run_id}:cancel"
        self.steer_key = f"{prefix}{run_id}:steer"
        self.queued_key = f"{prefix}{run_id}:queued"
        self.channel = f"{prefix}{run_id}:control"

    def __repr__(self) -> str:
        return f"RunControlChannel(run_id={self.run_id!r})"

    async def request_cancel(self, reason: str = "cancelled") -> None:
        """Ask the run to stop; it ends ``cancelled`` with ``reason`` at its next boundary."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(self.cancel_key, reason, ex=self.ttl)
        pipe.publish(self.channel, "cancel")
        await pipe.execute()

    async def send_steering(
        self, text: str, mode: MessageMode | None = None, *, limit: int | None = None
    ) -> None:
        """Queue a user message for the run, joining as ``mode`` says (``None``: the run's
        default); a ``conflict`` when ``limit`` messages wait already."""
        if limit is not None:
            pipe = self.redis.pipeline(transaction=True)
            pipe.incr(self.queued_key)
            pipe.expire(self.queued_key, self.ttl)
            count, _ = await pipe.execute()
            if int(count) > limit:
                await self.redis.decr(self.queued_key)
                raise queue_full(limit)
        pipe = self.redis.pipeline(transaction=True)
        pipe.rpush(self.steer_key, text if mode is None else json.dumps([_MODE_TAG, mode, text]))
        pipe.expire(self.steer_key, self.ttl)
        pipe.publish(self.channel, "steer")
        await pipe.execute()

    async def take_steering(self) -> list[str]:
        """Every queued steering message, oldest first; they are gone from Redis afterwards."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.lrange(self.steer_key, 0, -1)
        pipe.delete(self.steer_key)
        taken, _ = await pipe.execute()
        return [_message(item)[0] for item in taken]

    async def joined(self, count: int) -> None:
        """``count`` messages joined the run: they no longer count against the bound."""
        await self.redis.decrby(self.queued_key, count)

    async def apply(
        self, cancel: CancelToken, steering: Steering | None, *, also: AlsoQueue | None = None
    ) -> None:
        """Carry pending requests over to a local token and steering queue, in one round trip
        (the cancel request read, the steering messages taken); ``also`` queues commands of
        the caller's own in the same transaction, before those."""
        ask_cancel = not cancel.cancelled
        if not ask_cancel and steering is None and also is None:
            return
        pipe = self.redis.pipeline(transaction=True)
        if also is not None:
            also(pipe)
        theirs = len(pipe)
        if ask_cancel:
            pipe.get(self.cancel_key)
        if steering is not None:
            pipe.lrange(self.steer_key, 0, -1)
            pipe.delete(self.steer_key)
        replies = (await pipe.execute())[theirs:]
        reason = replies[0] if ask_cancel else None
        _carry(cancel, steering, reason, replies[-2] if steering is not None else [])


@dataclass(frozen=True, slots=True)
class _Watched:
    """One run a :class:`ControlWatcher` carries requests to."""

    channel: RunControlChannel
    cancel: CancelToken
    steering: Steering | None

    async def apply(self, also: AlsoQueue | None = None) -> None:
        await self.channel.apply(self.cancel, self.steering, also=also)


async def _apply_all(redis: Redis, targets: list[_Watched]) -> None:
    """:meth:`RunControlChannel.apply` for every run of ``targets`` in one transaction (one
    round trip, however many runs a worker watches: the periodic check of hundreds of runs
    would otherwise be hundreds of round trips a second)."""
    asking = [w for w in targets if not w.cancel.cancelled or w.steering is not None]
    if not asking:
        return
    pipe = redis.pipeline(transaction=True)
    for watched in asking:
        channel = watched.channel
        pipe.get(channel.cancel_key)
        if watched.steering is not None:
            pipe.lrange(channel.steer_key, 0, -1)
            pipe.delete(channel.steer_key)
    replies = iter(await pipe.execute())
    for watched in asking:
        reason = next(replies)
        messages = [] if watched.steering is None else next(replies)
        if watched.steering is not None:
            next(replies)  # the DEL's count
        _carry(watched.cancel, watched.steering, reason, messages)


def _carry(
    cancel: CancelToken,
    steering: Steering | None,
    reason: bytes | str | None,
    messages: list[bytes | str],
) -> None:
    """What one check of a run's channel read, carried to the run: the cancel request's reason
    (``None``: none), and the steering messages taken, each with its mode."""
    if reason is not None and not cancel.cancelled:
        cancel.cancel(_text(reason))
    if steering is not None:
        for item in messages:
            text, mode = _message(item)
            steering.send(text, mode)


class ControlWatcher:
    """Cancel and steering requests for every run one process runs, over one pub/sub
    connection.

    A worker runs many runs at once: a connection, a ``SUBSCRIBE`` and an ``UNSUBSCRIBE`` per
    run would cost more than the requests they wait for (which are rare). The watcher
    subscribes once to the pattern of every run's control channel (``<prefix>*:control``),
    carries each notice to the runs of this process it names, and checks Redis for each of
    them every ``poll`` seconds anyway (a notice lost with a dropped connection is not a lost
    request). Redis trouble is logged and never ends a run. Start it (or let the first
    :meth:`watch` start it) and :meth:`aclose` it when the process stops.
    """

    def __init__(self, redis: Redis, *, prefix: str = DEFAULT_PREFIX, poll: float = 1.0) -> None:
        self.redis = redis
        self.prefix = prefix
        self.poll = poll
        self.pattern = _GLOB_SPECIAL.sub(r"\\\g<0>", prefix) + "*" + _CONTROL_SUFFIX
        self._runs: dict[str, list[_Watched]] = {}
        self._pubsub: PubSub | None = None
        self._task: asyncio.Task[None] | None = None
        self._starting = asyncio.Lock()

    def __repr__(self) -> str:
        return f"ControlWatcher(pattern={self.pattern!r}, runs={len(self._runs)})"

    async def start(self) -> None:
        """Subscribe (once) and start carrying notices; Redis errors propagate."""
        async with self._starting:
            if self._task is not None:
                return
            pubsub = self.redis.pubsub()
            try:
                await pubsub.psubscribe(self.pattern)
                # the subscription is in place before any run takes its first look
                await pubsub.get_message(timeout=_SUBSCRIBE_WAIT)
            except BaseException:
                await _close_pubsub(pubsub)
                raise
            self._pubsub = pubsub
            self._task = asyncio.ensure_future(self._listen(pubsub))

    @asynccontextmanager
    async def watch(
        self,
        run_id: str,
        cancel: CancelToken,
        steering: Steering | None = None,
        *,
        also: AlsoQueue | None = None,
    ) -> AsyncIterator[RunControlChannel]:
        """While inside, cancel and steering requests for ``run_id`` reach ``cancel`` and
        ``steering``: what was requested before is taken first (a cancel that came before the
        worker started), then each request as its notice arrives. ``also`` queues commands
        of the caller's own on that first look (see :meth:`RunControlChannel.apply`): a
        worker's delivery cuts its job's claim there."""
        await self.start()
        watched = _Watched(
            RunControlChannel(self.redis, run_id, prefix=self.prefix), cancel, steering
        )
        self._runs.setdefault(run_id, []).append(watched)
        try:
            await watched.apply(also)
            yield watched.channel
        finally:
            others = [w for w in self._runs.pop(run_id, []) if w is not watched]
            if others:
                self._runs[run_id] = others

    async def aclose(self) -> None:
        """Stop carrying notices and close the pub/sub connection."""
        task, self._task = self._task, None
        if task is not None:
            await stop_task(task)
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                await pubsub.punsubscribe(self.pattern)
            await _close_pubsub(pubsub)

    async def _listen(self, pubsub: PubSub) -> None:
        loop = asyncio.get_running_loop()
        next_check = loop.time() + self.poll
        failing = False
        while True:
            try:
                wait = max(next_check - loop.time(), 0.0)
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=wait)
                if message is not None:
                    for watched in self._runs.get(self._run_of(message.get("channel")), []):
                        await watched.apply()
                else:
                    targets = [w for watched in self._runs.values() for w in watched]
                    next_check = loop.time() + self.poll
                    await _apply_all(self.redis, targets)
                failing = False
            except (RedisError, OSError, TimeoutError) as error:
                if not failing:
                    logger.warning("control channels (%s): trouble: %s", self.pattern, error)
                failing = True
                await asyncio.sleep(self.poll)

    def _run_of(self, channel: object) -> str:
        name = _text(channel) if isinstance(channel, bytes | str) else ""
        if name.startswith(self.prefix) and name.endswith(_CONTROL_SUFFIX):
            return name[len(self.prefix) : -len(_CONTROL_SUFFIX)]
        return ""


_CONTROL_SUFFIX: Final = ":control"
_GLOB_SPECIAL: Final = re.compile(r"[*?\[\]\\]")
_SUBSCRIBE_WAIT: Final = 5.0


async def _close_pubsub(pubsub: PubSub) -> None:
    close: Callable[[], Awaitable[None]] = pubsub.aclose  # untyped in redis-py
    await close()


@asynccontextmanager
async def watch(
    redis: Redis,
    run_id: str,
    cancel: CancelToken,
    steering: Steering | None = None,
    *,
    prefix: str = DEFAULT_PREFIX,
    poll: float = 1.0,
) -> AsyncIterator[RunControlChannel]:
    """While inside, cancel and steering requests for ``run_id`` reach ``cancel`` and
    ``steering``: :meth:`ControlWatcher.watch` with a watcher (and a pub/sub connection) of
    its own. A process that runs many runs at once shares one :class:`ControlWatcher`.
    """
    watcher = ControlWatcher(redis, prefix=prefix, poll=poll)
    try:
        async with watcher.watch(run_id, cancel, steering) as channel:
            yield channel
    finally:
        await watcher.aclose()


_MODE_TAG: Final = "agent-message"


def _message(value: bytes | str) -> tuple[str, MessageMode | None]:
    """A queued message and its mode (``None``: the run's default; plain text is how a
    message without a mode, or from an older version, is stored)."""
    text = _text(value)
    if text.startswith(f'["{_MODE_TAG}",'):
        try:
            tag, mode, body = json.loads(text)
        except ValueError:
            return text, None
        if tag == _MODE_TAG and mode in MESSAGE_MODES and isinstance(body, str):
            return body, mode
    return text, None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
