"""Spending windows in Redis, shared by every worker: :class:`RedisLedger`.

Each window has two keys under ``{prefix}budget:``: ``<key>:spent`` (the US dollars settled)
and ``<key>:holds`` (a sorted set of open holds, ``<id>|<amount>`` scored by when they lapse,
so a worker that dies mid-call frees its hold). One Lua script checks every window and holds
in all of them or none; another replaces a hold by the call's cost. Day windows' keys expire.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final, cast

from redis.asyncio import Redis
from redis.exceptions import RedisError

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.spend import Hold, Refused, Window

__all__ = ["RedisLedger"]

_RESERVE: Final = """
local amount = tonumber(ARGV[1])
local now = tonumber(ARGV[3])
local n = #KEYS / 2
local busy = nil
for i = 1, n do
  local holds = KEYS[2 * i]
  redis.call('ZREMRANGEBYSCORE', holds, '-inf', now)
  local spent = tonumber(redis.call('GET', KEYS[2 * i - 1]) or '0')
  local used = spent
  for _, member in ipairs(redis.call('ZRANGE', holds, 0, -1)) do
    used = used + tonumber(string.match(member, '|(.*)$'))
  end
  local limit = tonumber(ARGV[3 + 2 * i])
  if spent + amount > limit then
    return {i, tostring(used), 0, tostring(spent)}
  end
  if used + amount > limit and busy == nil then
    busy = {i, tostring(used), 1, tostring(spent)}
  end
end
if busy ~= nil then
  return busy
end
for i = 1, n do
  redis.call('ZADD', KEYS[2 * i], ARGV[4], ARGV[2])
  local ttl = tonumber(ARGV[4 + 2 * i])
  if ttl > 0 then
    redis.call('EXPIRE', KEYS[2 * i], ttl)
  end
end
return {0, '0', 0, '0'}
"""
"""KEYS: per window, its spent and holds keys. ARGV: amount, member, now and lapse (ms),
then per window its limit and key TTL (0: none). Returns ``{0, ...}`` or the refusing window's
number, what it has spent and held, whether it is only busy, and what it has spent."""

_SETTLE: Final = """
local out = {}
for i = 1, #KEYS / 2 do
  redis.call('ZREM', KEYS[2 * i], ARGV[1])
  out[i] = redis.call('INCRBYFLOAT', KEYS[2 * i - 1], ARGV[2])
  local ttl = tonumber(ARGV[2 + i])
  if ttl > 0 and redis.call('TTL', KEYS[2 * i - 1]) < 0 then
    redis.call('EXPIRE', KEYS[2 * i - 1], ttl)
  end
end
return out
"""
"""KEYS: as for reserve. ARGV: the member, the cost, then per window its key TTL."""


class RedisLedger:
    """A :class:`~agent_plugin.spend.SpendLedger` in Redis under ``{prefix}budget:``.

    ``hold_secs``: how long a hold lasts when its call never settles (a worker died). The
    ledger does not own ``redis`` unless ``owns`` says so (then :meth:`aclose` closes it).
    Redis failing is an ``unavailable`` :class:`~agent_plugin.errors.AgentError`.
    """

    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str = "agent:",
        hold_secs: float = 900.0,
        owns: bool = False,
    ) -> None:
        self.redis = redis
        self.prefix = f"{prefix}budget:"
        self.hold_secs = hold_secs
        self.owns = owns
        self._reserve = redis.register_script(_RESERVE)
        self._settle = redis.register_script(_SETTLE)

    def keys(self, windows: Sequence[Window]) -> list[str]:
        return [f"{self.prefix}{w.key}:{part}" for w in windows for part in ("spent", "holds")]

    async def reserve(self, windows: Sequence[Window], amount: float) -> Hold | Refused:
        hold = Hold(tuple(windows), amount)
        now = int(time.time() * 1000)
        args: list[Any] = [repr(amount), _member(hold), now, now + int(self.hold_secs * 1000)]
        for window in windows:
            args += [repr(window.limit), window.ttl or 0]
        try:
            answer = cast(list[Any], await self._reserve(keys=self.keys(windows), args=args))
        except (RedisError, OSError) as error:
            raise _unavailable(error) from None
        refused = int(answer[0])
        if refused:
            window = windows[refused - 1]
            used, busy, spent = float(answer[1]), bool(int(answer[2])), float(answer[3])
            return Refused(window, used, spent, busy=busy)
        return hold

    async def settle(self, hold: Hold, cost: float) -> tuple[float, ...]:
        args: list[Any] = [_member(hold), repr(cost), *(w.ttl or 0 for w in hold.windows)]
        try:
            totals = cast(list[Any], await self._settle(keys=self.keys(hold.windows), args=args))
        except (RedisError, OSError) as error:
            raise _unavailable(error) from None
        return tuple(float(t) for t in totals)

    async def spent(self, window: Window) -> float:
        """What ``window`` has settled so far."""
        value = await self.redis.get(f"{self.prefix}{window.key}:spent")
        return float(value) if value is not None else 0.0

    async def aclose(self) -> None:
        if self.owns:
            await self.redis.aclose()


def _unavailable(error: Exception) -> AgentError:
    return AgentError(
        ErrorKind.UNAVAILABLE, f"the spending windows in Redis cannot be reached: {error}"
    )


def _member(hold: Hold) -> str:
    return f"{hold.id}|{hold.amount!r}"
