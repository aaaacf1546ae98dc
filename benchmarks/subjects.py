"""What the benchmarks run: the library and its two baselines, behind one shape.

A :class:`Subject` runs one conversation from a prompt against the model server and returns
the tool rounds it took. Who runs it:

* ``ours``: ``Agent`` with ``OpenAICompatibleClient`` / ``AnthropicClient`` in the default
  configuration (the default transport: aiohttp behind httpx-aiohttp) and a **sync** tool,
  as the peers' benchmarks declare it; large step and token budgets, nothing else changed;
* ``ours-async``: the same with the tool written ``async def``;
* ``hand``: the hand loop of :mod:`benchmarks.baseline` on one ``httpx.AsyncClient``;
* ``floor``: the same loop on :class:`benchmarks.baseline.RawHttp` (raw asyncio streams);
* ``floor-aiohttp``: the same loop on :class:`benchmarks.baseline.AiohttpHttp` (one aiohttp
  session, no httpx): the least a client on the library's default engine does.

The engine (``default``, ``httpx`` for httpx's own transport, ``aiohttp`` for httpx-aiohttp's)
picks what the requests go through: for ``ours``, ``default`` is the library's default and
``httpx`` is ``transport=httpx.AsyncHTTPTransport()``; for ``hand``, ``default`` and
``httpx`` are httpx's own and ``aiohttp`` is ``AiohttpTransport``. Every subject's tool can
record the CPU clock each time it is called (``marks``), which is how S4 times single steps.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from agent_plugin.agent import Agent
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import Completed
from agent_plugin.providers.anthropic import AnthropicClient
from agent_plugin.providers.openai import OpenAICompatibleClient
from agent_plugin.tools import FnTool
from benchmarks import baseline

__all__ = ["WHO", "Marks", "Subject", "label_of", "make_subject", "prompt_for"]

WHO = ("ours", "ours-async", "hand", "floor", "floor-aiohttp")
POOL = 1000
"""Connections every engine may open (the library's default pool)."""


def prompt_for(steps: int, parallel: int = 1, latency_ms: int = 0) -> str:
    return f"STEPS={steps} PARALLEL={parallel} LATENCY_MS={latency_ms} look the numbers up"


@dataclass
class Marks:
    """The CPU clock (``time.process_time()``) at the tool calls numbered in ``at`` (0 for the
    first call of a run), recorded while ``on``: a few marks per run, so that reading the
    clock costs the steps nothing measurable."""

    on: bool = False
    at: frozenset[int] = frozenset()
    calls: int = 0
    times: dict[int, float] = field(default_factory=dict)

    def start(self, at: frozenset[int]) -> None:
        self.on, self.at, self.calls = True, at, 0
        self.times.clear()


@dataclass
class Subject:
    """One thing under test: runs a conversation from a prompt, returns its tool rounds."""

    label: str
    run: Callable[[str], Awaitable[int]]
    close: Callable[[], Awaitable[None]]
    marks: Marks


def label_of(who: str, wire: str, *, stream: bool = False, engine: str = "default") -> str:
    label = f"{who} {wire}{' stream' if stream else ''}"
    return label if engine == "default" else f"{label} [{engine}]"


def make_subject(
    who: str, wire: str, url: str, *, stream: bool = False, engine: str = "default"
) -> Subject:
    label = label_of(who, wire, stream=stream, engine=engine)
    marks = Marks()
    times, clock = marks.times, time.process_time

    def tool(arguments: dict[str, Any]) -> dict[str, Any]:
        if marks.on:
            if marks.calls in marks.at:
                times[marks.calls] = clock()
            marks.calls += 1
        return baseline.lookup(arguments)

    if who in ("hand", "floor", "floor-aiohttp"):
        http: baseline.Http
        if who == "floor":
            http = baseline.RawHttp(url)
        elif who == "floor-aiohttp":
            http = baseline.AiohttpHttp(POOL)
        else:
            http = baseline.HttpxHttp(_hand_engine(engine))
        loop = baseline.openai_loop if wire == "openai" else baseline.anthropic_loop

        async def run_loop(prompt: str) -> int:
            return await loop(http, url, prompt, stream=stream, tool=tool)

        return Subject(label, run_loop, http.aclose, marks)

    async def async_tool(arguments: dict[str, Any]) -> dict[str, Any]:
        return tool(arguments)

    lookup = FnTool(
        "lookup",
        "Looks a number up.",
        baseline.SCHEMA,
        async_tool if who == "ours-async" else tool,
    )
    transport = httpx.AsyncHTTPTransport() if engine == "httpx" else None
    model: OpenAICompatibleClient | AnthropicClient
    if wire == "openai":
        model = OpenAICompatibleClient(
            model="bench-model", base_url=url + "/v1", transport=transport
        )
    else:
        model = AnthropicClient(model="bench-model", base_url=url, transport=transport)
    agent = Agent(
        model,
        tools=[lookup],
        system_prompt=baseline.SYSTEM,
        max_steps=10_000,
        max_tokens=10**9,
    )
    options = RunOptions(stream=stream)

    async def run_ours(prompt: str) -> int:
        turn = await agent.run(prompt, options=options)
        if not isinstance(turn.outcome, Completed):
            raise RuntimeError(f"{label}: the run ended {turn.outcome!r}")
        return turn.outcome.steps_used

    return Subject(label, run_ours, model.aclose, marks)


def _hand_engine(engine: str) -> httpx.AsyncBaseTransport | None:
    if engine == "aiohttp":
        from httpx_aiohttp import AiohttpTransport

        return AiohttpTransport(limits=httpx.Limits(max_connections=POOL))
    return None  # httpx.AsyncClient's own transport, as a hand loop gets it
