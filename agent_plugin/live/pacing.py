"""The pacing buckets of a fleet, in Redis: :class:`RedisPacer`.

One Lua script takes from (or settles) the requests and tokens buckets of a provider and model
at once, refilled by the time passed on Redis's own clock, so every worker and app sees the
same buckets. Keys: ``<prefix><provider>:<model>:requests`` and ``...:tokens`` (default
prefix ``agent:pacing:``), each a hash of its level and when it was set, expiring when full.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final, cast

from redis.asyncio import Redis
from redis.exceptions import RedisError

from agent_plugin.pacing import (
    NO_WAIT,
    LimitName,
    PaceLimits,
    PaceWait,
    PacingConfig,
    bucket_costs,
    settlements,
)

__all__ = ["DEFAULT_PACING_PREFIX", "RedisPacer"]

logger = logging.getLogger("agent_plugin.live")

DEFAULT_PACING_PREFIX: Final = "agent:pacing:"

# KEYS: the requests bucket, the tokens bucket. ARGV: op ("take" or "settle"), max_wait (< 0:
# any), then per bucket its capacity (0: not limited), refill per second, amount (take: the
# cost; settle: the most it may hold after) and what a settle gives back first. Returns
# {wait seconds, limit name, granted 1/0}.
_SCRIPT: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local op = ARGV[1]
local max_wait = tonumber(ARGV[2])
local names = {'requests', 'tokens'}
local wait, which = 0, ''
local levels = {}
for i = 1, 2 do
  local base = 4 * i - 1
  local capacity = tonumber(ARGV[base])
  if capacity > 0 then
    local rate = tonumber(ARGV[base + 1])
    local amount = tonumber(ARGV[base + 2])
    local saved = redis.call('HMGET', KEYS[i], 'level', 'at')
    local level = capacity
    if saved[1] then
      level = math.min(capacity, tonumber(saved[1]) + math.max(0, now - tonumber(saved[2])) * rate)
    end
    if op == 'take' then
      local need = (amount - level) / rate
      if need > wait then wait = need; which = names[i] end
      level = level - amount
    else
      level = math.min(level + tonumber(ARGV[base + 3]), capacity, amount)
    end
    levels[i] = {level, capacity, rate}
  end
end
if op == 'take' and max_wait >= 0 and wait > max_wait then
  return {tostring(wait), which, '0'}
end
for i = 1, 2 do
  local l = levels[i]
  if l then
    redis.call('HSET', KEYS[i], 'level', tostring(l[1]), 'at', tostring(now))
    redis.call('PEXPIRE', KEYS[i], math.ceil(((l[2] - l[1]) / l[3] + 1) * 1000))
  end
end
return {tostring(wait), which, '1'}
"""


class RedisPacer:
    """A :class:`~agent_plugin.pacing.Pacer` whose buckets every process shares in Redis.

    When Redis cannot be reached the call is not held back (a warning is logged): pacing
    slows a fleet down, it never stops one. :meth:`aclose` closes ``redis`` only when the
    pacer ``owns_redis`` (as one made by :meth:`from_url` does).
    """

    def __init__(
        self,
        redis: Redis,
        config: PacingConfig,
        *,
        prefix: str = DEFAULT_PACING_PREFIX,
        owns_redis: bool = False,
    ) -> None:
        self.redis = redis
        self.config = config
        self.prefix = prefix
        self.owns_redis = owns_redis
        self._script = redis.register_script(_SCRIPT)

    @classmethod
    def from_url(
        cls, url: str, config: PacingConfig, *, prefix: str = DEFAULT_PACING_PREFIX
    ) -> RedisPacer:
        """A pacer on its own connection pool to ``url`` (connected on first use)."""
        return cls(Redis.from_url(url), config, prefix=prefix, owns_redis=True)

    def __repr__(self) -> str:
        return f"RedisPacer(prefix={self.prefix!r}, {self.config!r})"

    def keys(self, provider: str, model: str) -> list[str]:
        """The requests and tokens buckets of ``provider`` and ``model``."""
        base = f"{self.prefix}{provider}:{model}:"
        return [base + "requests", base + "tokens"]

    async def acquire(
        self, provider: str, model: str, tokens: int, *, max_wait: float | None = None
    ) -> PaceWait:
        limits = self.config.limits_for(model)
        if not limits.active:
            return NO_WAIT
        amounts = {name: (cost, 0.0) for name, _, cost in bucket_costs(limits, tokens)}
        reply = await self._run(provider, model, "take", limits, amounts, max_wait)
        if reply is None:
            return NO_WAIT
        wait, which, granted = reply
        if not which:
            return NO_WAIT
        return PaceWait(wait, cast(LimitName, which), granted=granted)

    async def observe(
        self,
        provider: str,
        model: str,
        headers: Mapping[str, str] | None,
        *,
        unused_tokens: int = 0,
    ) -> None:
        limits = self.config.limits_for(model)
        changes = settlements(limits, headers, unused_tokens)
        if not changes:
            return
        amounts = {name: (top, give) for name, _, give, top in changes}
        await self._run(provider, model, "settle", limits, amounts, None)

    async def _run(
        self,
        provider: str,
        model: str,
        op: str,
        limits: PaceLimits,
        amounts: Mapping[LimitName, tuple[float, float]],
        max_wait: float | None,
    ) -> tuple[float, str, bool] | None:
        """Run the script on ``amounts`` (per bucket: the amount and what is given back; a
        limited bucket left out is settled to no change)."""
        args: list[str] = [op, repr(-1.0 if max_wait is None else max(max_wait, 0.0))]
        for name, capacity in (("requests", limits.requests), ("tokens", limits.tokens)):
            if capacity is None:
                args += ["0", "0", "0", "0"]
            else:
                amount, give = amounts.get(cast(LimitName, name), (float(capacity), 0.0))
                args += [repr(float(capacity)), repr(capacity / limits.per)]
                args += [repr(float(amount)), repr(float(give))]
        try:
            reply = await self._script(keys=self.keys(provider, model), args=args)
        except (RedisError, OSError) as error:
            logger.warning("pacing %s %s: Redis failed (%s); not waiting", provider, model, error)
            return None
        wait, which, granted = (_text(part) for part in reply)
        return max(float(wait), 0.0), which, granted == "1"

    async def aclose(self) -> None:
        if self.owns_redis:
            await self.redis.aclose()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
