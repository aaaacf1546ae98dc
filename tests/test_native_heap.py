"""A worker gives the C heap's free pages back (``agent_plugin/jobs/upkeep.py``): its live memory
stays flat over thousands of runs, but glibc keeps what the runs freed until it is asked to
release it, and the worker's RSS grew by about 2 MB per 1,000 runs (S8)."""

from __future__ import annotations

import asyncio
import platform
import time
from pathlib import Path
from typing import Any
from unittest.mock import AsyncMock, MagicMock

import pytest

from agent_plugin.jobs import JobOptions
from agent_plugin.jobs import upkeep as upkeep_module
from agent_plugin.jobs.upkeep import Upkeep, trim_native_heap

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("fleet", [True, False])
async def test_every_upkeep_tick_trims_the_native_heap(
    monkeypatch: pytest.MonkeyPatch, fleet: bool
) -> None:
    # a worker without the fleet's upkeep (upkeep=False) trims its own heap all the same
    trims: list[float] = []
    monkeypatch.setattr(upkeep_module, "trim_native_heap", lambda: trims.append(0.0) or True)
    redis: Any = AsyncMock()
    redis.set.return_value = False  # another worker reconciles
    keeper = Upkeep(redis, MagicMock(), JobOptions(lease=0.3, reconcile_every=1))
    claims = AsyncMock(return_value=[])
    monkeypatch.setattr(keeper, "release_abandoned_claims", claims)
    keeper.start(fleet=fleet)
    try:
        deadline = time.monotonic() + 10
        while len(trims) < 2:
            assert time.monotonic() < deadline, "the upkeep never trimmed the heap"
            await asyncio.sleep(0.05)
    finally:
        await keeper.aclose()
    assert claims.await_count >= 2 if fleet else claims.await_count == 0


@glibc
def test_trimming_gives_freed_heap_pages_back_to_the_system() -> None:
    # blocks over 512 bytes come from malloc's heap; every 64th one stays alive, so the
    # heap cannot shrink from its top, and the freed pages between them stay in the RSS
    blocks = [bytearray(4000) for _ in range(40_000)]
    kept = blocks[::64]
    del blocks
    before = rss_kb()
    assert trim_native_heap()
    assert before - rss_kb() > 50_000, "trimming gave back less than 50 MB of 150 MB freed"
    assert len(kept) == 625


def test_no_trim_where_the_c_library_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upkeep_module, "_malloc_trim", lambda: None)
    assert trim_native_heap() is False
