"""Pacing model calls under requests- and tokens-per-minute limits, before the provider 429s.

A :class:`Pacer` keeps a token bucket per provider and model for each limit: it is full at
the limit, refills at the limit per ``per`` seconds, and each call takes one request and its
estimated tokens. :meth:`Pacer.acquire` reserves them and says how long to wait first;
:meth:`Pacer.observe` gives back the tokens the call did not use and lowers the buckets when
the provider's rate-limit headers say fewer remain. :class:`LocalPacer` keeps its buckets in
the process; :class:`~agent_plugin.live.pacing.RedisPacer` shares them across workers.
"""

from __future__ import annotations

import contextvars
import email.utils
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Literal, Protocol, TypeAlias, runtime_checkable

from agent_plugin.errors import AgentError

__all__ = [
    "NO_WAIT",
    "Heard",
    "LimitName",
    "LocalPacer",
    "PaceLimits",
    "PaceWait",
    "Pacer",
    "PacingConfig",
    "bucket_costs",
    "ceiling",
    "heard_headers",
    "heard_of",
    "read_rate_headers",
    "settlements",
]

LimitName: TypeAlias = Literal["requests", "tokens"]

heard_headers: contextvars.ContextVar[Callable[[Mapping[str, str]], None] | None] = (
    contextvars.ContextVar("agent_plugin_heard_headers", default=None)
)
"""Told the headers of every answer a provider's HTTP transport gets in this context."""


@dataclass(frozen=True, slots=True)
class PaceLimits:
    """At most ``requests`` calls and ``tokens`` tokens per ``per`` seconds (None: no limit)."""

    requests: float | None = None
    tokens: float | None = None
    per: float = 60.0

    def __post_init__(self) -> None:
        for name in ("requests", "tokens", "per"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int | float) or not value > 0):
                raise AgentError.config(f"a pacing limit's {name} must be a number > 0")

    @property
    def active(self) -> bool:
        return self.requests is not None or self.tokens is not None


@dataclass(frozen=True, slots=True)
class PacingConfig:
    """The limits of every model (``default``) and of the models named in ``models``."""

    default: PaceLimits = PaceLimits()
    models: Mapping[str, PaceLimits] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.default.active or any(limits.active for limits in self.models.values())

    def limits_for(self, model: str | None) -> PaceLimits:
        if model is not None:
            found = self.models.get(model)
            if found is not None:
                return found
        return self.default

    @classmethod
    def of(
        cls, rpm: int | None, tpm: int | None, models: Mapping[str, Mapping[str, object]]
    ) -> PacingConfig:
        """The configured limits: ``rpm`` and ``tpm`` per minute for every model, and
        ``{model: {"rpm": ..., "tpm": ...}}`` tables replacing them for one model."""
        per_model: dict[str, PaceLimits] = {}
        for model, table in models.items():
            unknown = sorted(set(table) - {"rpm", "tpm"})
            if unknown:
                raise AgentError.config(
                    f"the pacing of {model!r} takes rpm and tpm, got {sorted(table)}"
                )
            per_model[model] = PaceLimits(_number(table.get("rpm")), _number(table.get("tpm")))
        return cls(PaceLimits(rpm, tpm), per_model)


def _number(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AgentError.config(f"a pacing limit must be a number > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class PaceWait:
    """How long a call waits before it is sent, for which limit (None: no wait), and whether
    its share was taken (``granted`` false: the wait was longer than allowed, nothing taken)."""

    seconds: float = 0.0
    limit: LimitName | None = None
    granted: bool = True


NO_WAIT: Final = PaceWait()


@dataclass(frozen=True, slots=True)
class Heard:
    """What a provider's rate-limit headers say: how many requests and tokens remain, and in
    how many seconds each limit is whole again (None: not said)."""

    requests_remaining: float | None = None
    requests_reset: float | None = None
    tokens_remaining: float | None = None
    tokens_reset: float | None = None


@runtime_checkable
class Pacer(Protocol):
    """Buckets of requests and tokens per provider and model (see the module's docstring)."""

    async def acquire(
        self, provider: str, model: str, tokens: int, *, max_wait: float | None = None
    ) -> PaceWait:
        """Take one request and ``tokens`` from the buckets of ``provider`` and ``model``; the
        wait before the call may be sent. A wait over ``max_wait`` takes nothing."""
        ...

    async def observe(
        self,
        provider: str,
        model: str,
        headers: Mapping[str, str] | None,
        *,
        unused_tokens: int = 0,
    ) -> None:
        """After a call: give back the ``unused_tokens`` of its estimate, then lower the
        buckets to what the provider's rate-limit ``headers`` say remains."""
        ...

    async def aclose(self) -> None: ...


# --- the bucket arithmetic (the Redis script does the same) ---------------------------------


@dataclass(slots=True)
class _Bucket:
    level: float
    at: float


def _refilled(bucket: _Bucket | None, capacity: float, rate: float, now: float) -> float:
    if bucket is None:
        return capacity
    return min(capacity, bucket.level + max(0.0, now - bucket.at) * rate)


def ceiling(remaining: float | None, reset: float | None, capacity: float, rate: float) -> float:
    """The most a bucket may hold after the provider said ``remaining`` are left and the limit
    is whole again in ``reset`` seconds (a bucket refilling at ``rate`` must not be whole
    sooner), but never below minus one whole bucket: a reset far away (a daily limit's) holds
    calls back for at most two of the bucket's windows, not for hours."""
    top = capacity
    if remaining is not None:
        top = min(top, remaining)
    if reset is not None:
        top = min(top, max(capacity - reset * rate, -capacity))
    return top


class LocalPacer:
    """A :class:`Pacer` whose buckets live in this process (an app without Redis)."""

    def __init__(self, config: PacingConfig) -> None:
        self.config = config
        self._buckets: dict[tuple[str, str, LimitName], _Bucket] = {}

    def __repr__(self) -> str:
        return f"LocalPacer({self.config!r})"

    def _now(self) -> float:
        return time.monotonic()

    async def acquire(
        self, provider: str, model: str, tokens: int, *, max_wait: float | None = None
    ) -> PaceWait:
        limits = self.config.limits_for(model)
        now = self._now()
        wait, which = 0.0, None
        levels: list[tuple[LimitName, float, float]] = []
        for name, capacity, cost in bucket_costs(limits, tokens):
            rate = capacity / limits.per
            level = _refilled(self._buckets.get((provider, model, name)), capacity, rate, now)
            need = (cost - level) / rate
            if need > wait:
                wait, which = need, name
            levels.append((name, level, cost))
        if max_wait is not None and wait > max_wait:
            return PaceWait(wait, which, granted=False)
        for name, level, cost in levels:
            self._buckets[(provider, model, name)] = _Bucket(level - cost, now)
        return PaceWait(wait, which) if which is not None else NO_WAIT

    async def observe(
        self,
        provider: str,
        model: str,
        headers: Mapping[str, str] | None,
        *,
        unused_tokens: int = 0,
    ) -> None:
        limits = self.config.limits_for(model)
        now = self._now()
        for name, capacity, give, top in settlements(limits, headers, unused_tokens):
            key = (provider, model, name)
            level = _refilled(self._buckets.get(key), capacity, capacity / limits.per, now)
            self._buckets[key] = _Bucket(min(level + give, capacity, top), now)

    async def aclose(self) -> None:
        self._buckets.clear()


def bucket_costs(limits: PaceLimits, tokens: int) -> list[tuple[LimitName, float, float]]:
    """The limited buckets as (name, capacity, this call's cost, at most the capacity)."""
    costs: list[tuple[LimitName, float, float]] = []
    if limits.requests is not None:
        costs.append(("requests", limits.requests, min(1.0, limits.requests)))
    if limits.tokens is not None:
        costs.append(("tokens", limits.tokens, min(float(tokens), limits.tokens)))
    return costs


def settlements(
    limits: PaceLimits, headers: Mapping[str, str] | None, unused_tokens: int
) -> list[tuple[LimitName, float, float, float]]:
    """What a call's end does to each limited bucket: (name, capacity, tokens given back, the
    most it may then hold); empty when it changes nothing."""
    heard = None if headers is None else read_rate_headers(headers)
    changes: list[tuple[LimitName, float, float, float]] = []
    for name, capacity, _ in bucket_costs(limits, 0):
        give = float(max(unused_tokens, 0)) if name == "tokens" else 0.0
        top = capacity
        if heard is not None:
            remaining, reset = heard_of(heard, name)
            top = ceiling(remaining, reset, capacity, capacity / limits.per)
        if give > 0 or top < capacity:
            changes.append((name, capacity, give, top))
    return changes


def heard_of(heard: Heard, name: LimitName) -> tuple[float | None, float | None]:
    if name == "requests":
        return heard.requests_remaining, heard.requests_reset
    return heard.tokens_remaining, heard.tokens_reset


# --- the providers' rate-limit headers ------------------------------------------------------

_DURATION: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|us|µs|ns|h|m|s)")
_UNITS: Final = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def _duration(text: str) -> float | None:
    """Seconds of an OpenAI reset (``"6m0s"``, ``"10.33s"``, ``"12ms"``, or bare seconds)."""
    text = text.strip()
    try:
        return max(float(text), 0.0)
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(a + b for a, b in parts) != text:
        return None
    return sum(float(amount) * _UNITS[unit] for amount, unit in parts)


def _moment(text: str, now: float) -> float | None:
    """Seconds from ``now`` (wall clock) to an Anthropic reset (an RFC 3339 time)."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp()
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text).timestamp()
        except (TypeError, ValueError):
            return None
    return max(when - now, 0.0)


def _count(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def read_rate_headers(headers: Mapping[str, str], now: float | None = None) -> Heard | None:
    """What OpenAI's ``x-ratelimit-*`` or Anthropic's ``anthropic-ratelimit-*`` headers say
    (names compared case-insensitively); None when there are none. ``now``: the wall clock
    Anthropic's reset times are read against (default: the current time)."""
    lower = {name.lower(): value for name, value in headers.items() if "ratelimit" in name.lower()}
    if not lower:
        return None
    if any(name.startswith("anthropic-ratelimit-") for name in lower):
        clock = time.time() if now is None else now

        def reset(name: str) -> float | None:
            value = lower.get(f"anthropic-ratelimit-{name}-reset")
            return None if value is None else _moment(value, clock)

        heard = Heard(
            requests_remaining=_count(lower.get("anthropic-ratelimit-requests-remaining")),
            requests_reset=reset("requests"),
            tokens_remaining=_count(lower.get("anthropic-ratelimit-tokens-remaining")),
            tokens_reset=reset("tokens"),
        )
    else:

        def duration(name: str) -> float | None:
            value = lower.get(f"x-ratelimit-reset-{name}")
            return None if value is None else _duration(value)

        heard = Heard(
            requests_remaining=_count(lower.get("x-ratelimit-remaining-requests")),
            requests_reset=duration("requests"),
            tokens_remaining=_count(lower.get("x-ratelimit-remaining-tokens")),
            tokens_reset=duration("tokens"),
        )
    return None if heard == Heard() else heard
