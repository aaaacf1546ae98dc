"""What a model call costs in US dollars: :class:`ModelPrice` (per million tokens, input,
output, cache reads and cache writes priced apart) and :class:`Prices`, which answers a call's
cost from configured prices first, then from the maintained ``genai-prices`` table (the
``[cost]`` extra; loaded on first use, off the event loop).

``input_tokens`` counts the whole prompt, cache reads and writes included (as
:class:`~agent_plugin.messages.TokenUsage` does), so the uncached part is priced as input and
the cached parts at their own prices. A model neither source knows costs ``None``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from agent_plugin.errors import AgentError
from agent_plugin.messages import TokenUsage

__all__ = ["ModelPrice", "Prices"]

logger = logging.getLogger("agent_plugin.pricing")

_MILLION: Final = 1_000_000
_PROVIDER_IDS: Final = {"anthropic": "anthropic"}
"""Our provider names that name a genai-prices provider as they are; an OpenAI-compatible
endpoint is found by its base URL instead (OpenAI, Groq, OpenRouter, ...)."""


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """US dollars per million tokens. A cache price left ``None`` is the input price."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None

    def __post_init__(self) -> None:
        for name in ("input", "output", "cache_read", "cache_write"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int | float) or value < 0):
                raise AgentError.config(f"a model price's {name} must be a number >= 0")

    @classmethod
    def of(cls, model: str, table: Mapping[str, object]) -> ModelPrice:
        """A price from a config table (``input``, ``output``, ``cache_read``,
        ``cache_write``); a ``config`` error names a bad key."""
        unknown = sorted(set(table) - {"input", "output", "cache_read", "cache_write"})
        if unknown or "input" not in table or "output" not in table:
            raise AgentError.config(
                f"the price of {model!r} needs input and output (USD per million tokens), "
                f"and may have cache_read and cache_write; got {sorted(table)}"
            )
        values: dict[str, Any] = dict(table)
        return cls(**values)

    def cost(self, usage: TokenUsage) -> float:
        cache_read = self.input if self.cache_read is None else self.cache_read
        cache_write = self.input if self.cache_write is None else self.cache_write
        uncached = max(usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens, 0)
        return (
            uncached * self.input
            + usage.cache_read_tokens * cache_read
            + usage.cache_write_tokens * cache_write
            + usage.output_tokens * self.output
        ) / _MILLION


class Prices:
    """Prices model calls: ``overrides`` by model name first (a private deployment, a
    negotiated rate), then the ``genai-prices`` table when it is installed and ``table`` is
    true. Reusable across runs; lookups are remembered per provider and model."""

    def __init__(
        self, overrides: Mapping[str, ModelPrice] | None = None, *, table: bool = True
    ) -> None:
        self.overrides: dict[str, ModelPrice] = dict(overrides or {})
        self.table = table
        self._calc: Any = None  # genai_prices.calc_price, once loaded
        self._usage: Any = None  # genai_prices.Usage
        self._unknown: set[tuple[str, str | None, str]] = set()
        self._loaded = False

    def __repr__(self) -> str:
        return f"Prices(overrides={sorted(self.overrides)!r}, table={self.table})"

    @property
    def can_price(self) -> bool:
        """Whether any call could be priced (overrides, or the table where installed)."""
        if self.overrides:
            return True
        if not self.table:
            return False
        from importlib.util import find_spec

        return find_spec("genai_prices") is not None

    async def load(self) -> None:
        """Import the table (a few hundred milliseconds, once) in a thread."""
        if self._loaded or not self.table:
            return
        self._loaded = True
        try:
            module = await asyncio.to_thread(_import_table)
        except ImportError:
            return
        self._calc, self._usage = module

    def cost(
        self, usage: TokenUsage, *, model: str | None, provider: str, base_url: str | None = None
    ) -> float | None:
        """The call's cost in USD, or ``None`` for a model no price is known for."""
        if model is None:
            return None
        override = self.overrides.get(model)
        if override is not None:
            return override.cost(usage)
        calc = self._calc
        if calc is None:
            return None
        key = (provider, base_url, model)
        if key in self._unknown:
            return None
        provider_id = _PROVIDER_IDS.get(provider)
        where: dict[str, str] = (
            {"provider_id": provider_id}
            if provider_id is not None
            else {"provider_api_url": base_url}
            if base_url
            else {}
        )
        counts = self._usage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens,
        )
        try:
            return float(calc(counts, model, **where).total_price)
        except (LookupError, ValueError) as error:
            self._unknown.add(key)
            logger.info("no price for model %r (%s): %s", model, provider, error)
            return None


def _import_table() -> tuple[Any, Any]:
    from genai_prices import Usage, calc_price

    return calc_price, Usage
