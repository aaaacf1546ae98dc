"""Health routes: ``GET {health_path}`` with the ``agent`` component (is the model provider
reachable?) and one component per toolset (``mcp:<server>``: is the MCP server connected?),
and ``GET {health_path}/ready`` with what serving needs: the ``database`` and, with background
runs on, ``redis`` (and ``workers``, when asked for: does any worker serve the queue?).

Every check is time-limited and cached, and concurrent requests share one check, so a slow or
failing dependency never makes a health route slow and a busy route never floods it. The
``agent`` component is health-only: a provider's bad minute does not take the app out of
rotation, and neither does a toolset's. An app with its own health route includes
:meth:`AgentHealth.check` in it (``docs/guide/routes-errors-health.md``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final, Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, JsonValue

from agent_plugin.errors import AgentError, describe
from agent_plugin.providers.base import LlmClient
from agent_plugin.redaction import redact_message

if TYPE_CHECKING:
    from agent_plugin.jobs import RunQueue
    from agent_plugin.runtime import AgentRuntime
    from agent_plugin.toolsets import LiveToolset

__all__ = [
    "NOT_STARTED",
    "AgentHealth",
    "ComponentHealth",
    "HealthReport",
    "HealthStatus",
    "health_router",
]

HealthStatus = Literal["UP", "DOWN"]

NOT_STARTED: Final = "agent plugin has not finished starting"
"""The ``error`` detail of the component before startup completed."""


class ComponentHealth(BaseModel):
    """One component of a health report."""

    model_config = ConfigDict(frozen=True)

    status: HealthStatus
    details: dict[str, JsonValue] = {}

    @classmethod
    def down(cls, error: str, **details: JsonValue) -> ComponentHealth:
        """A DOWN component; ``error`` is redacted (a provider's or a server's answer ends up
        in it, and a health report goes out over HTTP)."""
        return cls(status="DOWN", details={**details, "error": redact_message(error)})


class HealthReport(BaseModel):
    """A whole health answer: DOWN when any component is DOWN."""

    model_config = ConfigDict(frozen=True)

    status: HealthStatus
    components: dict[str, ComponentHealth] = {}

    @classmethod
    def of(cls, components: dict[str, ComponentHealth]) -> HealthReport:
        down = any(c.status == "DOWN" for c in components.values())
        return cls(status="DOWN" if down else "UP", components=components)


Probe = Callable[[], Awaitable[ComponentHealth]]


class _Cached:
    """One check, time-limited, cached for a while, and shared by concurrent callers."""

    def __init__(
        self,
        probe: Probe,
        *,
        name: str,
        health: AgentHealth,
        details: dict[str, JsonValue] | None = None,
    ) -> None:
        self.probe = probe
        self.name = name
        self.health = health
        self.details = details or {}
        self.result: tuple[float, ComponentHealth] | None = None
        self.lock = asyncio.Lock()

    def fresh(self) -> ComponentHealth | None:
        if self.result is None:
            return None
        at, result = self.result
        return result if self.health.clock() - at < self.health.cache_secs else None

    async def get(self) -> ComponentHealth:
        found = self.fresh()
        if found is not None:
            return found
        async with self.lock:
            found = self.fresh()
            if found is not None:
                return found
            try:
                async with asyncio.timeout(self.health.timeout_secs):
                    result = await self.probe()
            except TimeoutError:
                result = ComponentHealth.down(
                    f"{self.name} did not answer within {self.health.timeout_secs:g} s",
                    **self.details,
                )
            except Exception as error:  # a user's client may raise anything; health answers
                result = ComponentHealth.down(describe(error), **self.details)
            self.result = (self.health.clock(), result)
            return result


class AgentHealth:
    """The plugin's health components.

    * ``agent`` (:meth:`check`): the runtime's provider client lists its models; UP with the
      provider and the number of models, or DOWN with the error. Health-only.
    * one component per toolset of the runtime, named after it (``mcp:<server>``): the
      toolset's own answer. Health-only too.
    * readiness (:meth:`readiness`): ``database`` (a ``SELECT 1``), ``redis`` (a ``PING``, with
      background runs on) and, with ``workers=True``, ``workers``: whether a worker has
      written arq's health-check key of the agent's queue lately (an app with no worker still
      enqueues runs, so it is off by default).

    The plugin :meth:`attach` es its runtime at startup and :meth:`detach` es it at shutdown;
    before that every component is DOWN with ``agent plugin has not finished starting``.
    ``clock`` is for tests.
    """

    name: Final = "agent"
    """The ``agent`` component's name in a health report."""
    group: Final = "health"
    """The ``agent`` component is health-only: never part of readiness."""

    def __init__(
        self,
        *,
        cache_secs: float = 5.0,
        timeout_secs: float = 2.0,
        workers: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if cache_secs < 0:
            raise AgentError.config(f"cache_secs must not be negative, got {cache_secs}")
        if timeout_secs <= 0:
            raise AgentError.config(f"timeout_secs must be positive, got {timeout_secs}")
        self.cache_secs = cache_secs
        self.timeout_secs = timeout_secs
        self.workers = workers
        self.clock = clock
        self._runtime: AgentRuntime | None = None
        self._agent: _Cached | None = None
        self._toolsets: dict[str, _Cached] = {}
        self._ready: dict[str, _Cached] = {}

    def __repr__(self) -> str:
        state = f"provider={self._provider!r}" if self._runtime is not None else "not started"
        return f"AgentHealth({state}, cache_secs={self.cache_secs}, timeout={self.timeout_secs})"

    @property
    def started(self) -> bool:
        """Whether a runtime is attached (the plugin finished starting)."""
        return self._runtime is not None

    @property
    def client(self) -> LlmClient | None:
        """The client the ``agent`` component pings: the runtime's own."""
        return self._runtime.client if self._runtime is not None else None

    @property
    def _provider(self) -> str:
        return self._runtime.settings.provider if self._runtime is not None else ""

    def attach(self, runtime: AgentRuntime, queue: RunQueue | None = None) -> None:
        """Start reporting on ``runtime`` (and ``queue``); ignored when one is attached."""
        if self._runtime is not None:
            return
        self._runtime = runtime
        provider = runtime.settings.provider
        client = runtime.client
        self._agent = _Cached(
            lambda: _models(client, provider),
            name=provider,
            health=self,
            details={"provider": provider},
        )
        self._toolsets = {
            toolset.name: _Cached(_toolset_probe(toolset), name=toolset.name, health=self)
            for toolset in runtime.toolsets
        }
        ready: dict[str, _Cached] = {}
        database = runtime.database
        if database is not None:

            async def database_up() -> ComponentHealth:
                await database.check()
                return ComponentHealth(status="UP", details={"url": database.display_url})

            ready["database"] = _Cached(database_up, name="the database", health=self)
        if queue is not None:
            ready["redis"] = _Cached(lambda: _redis_up(queue), name="Redis", health=self)
            if self.workers:
                ready["workers"] = _Cached(
                    lambda: _workers_up(queue), name="the workers' health key", health=self
                )
        self._ready = ready

    def detach(self, runtime: AgentRuntime) -> None:
        """Stop reporting on ``runtime`` (back to DOWN, not started)."""
        if self._runtime is runtime:
            self._runtime = None
            self._agent = None
            self._toolsets = {}
            self._ready = {}

    async def check(self) -> ComponentHealth:
        """The ``agent`` component: cached for ``cache_secs``, at most ``timeout_secs`` to get."""
        if self._agent is None:
            return ComponentHealth.down(NOT_STARTED)
        return await self._agent.get()

    async def report(self) -> HealthReport:
        """The health route's answer: the ``agent`` component and the toolsets' components."""
        names = list(self._toolsets)
        checks = await asyncio.gather(self.check(), *(self._toolsets[n].get() for n in names))
        return HealthReport.of(dict(zip([self.name, *names], checks, strict=True)))

    async def readiness(self) -> HealthReport:
        """The readiness answer: DOWN before the plugin started, or when the database (or,
        with background runs on, Redis; with ``workers``, any worker) is out of reach."""
        if self._runtime is None:
            down = {"plugin": ComponentHealth.down(NOT_STARTED)}
            return HealthReport(status="DOWN", components=down)
        names = list(self._ready)
        results = await asyncio.gather(*(self._ready[name].get() for name in names))
        return HealthReport.of(dict(zip(names, results, strict=True)))


def _toolset_probe(toolset: LiveToolset) -> Probe:
    async def probe() -> ComponentHealth:
        health = await toolset.health()
        return ComponentHealth(status="UP" if health.up else "DOWN", details=dict(health.details))

    return probe


async def _models(client: LlmClient, provider: str) -> ComponentHealth:
    try:
        models = await client.list_models()
    except AgentError as error:
        return ComponentHealth.down(str(error), provider=provider)
    except Exception as error:  # a user's client may raise anything; health must answer
        return ComponentHealth.down(describe(error), provider=provider)
    return ComponentHealth(status="UP", details={"provider": provider, "models": len(models)})


async def _redis_up(queue: RunQueue) -> ComponentHealth:
    redis = await queue.redis()
    await redis.ping()
    return ComponentHealth(status="UP", details={"queue": queue.options.queue_name})


async def _workers_up(queue: RunQueue) -> ComponentHealth:
    from arq.constants import health_check_key_suffix  # a queue is configured: arq is loaded

    redis = await queue.redis()
    name = queue.options.queue_name
    beat = await redis.get(name + health_check_key_suffix)
    if beat is None:
        return ComponentHealth.down(f"no worker serves the queue {name!r}", queue=name)
    text = beat.decode() if isinstance(beat, bytes) else str(beat)
    return ComponentHealth(status="UP", details={"queue": name, "last": text})


def health_router(health: AgentHealth, path: str = "/health") -> APIRouter:
    """``GET {path}`` (with the agent component) and ``GET {path}/ready`` (what serving
    needs: the database, Redis, and the workers when asked for)."""
    router = APIRouter(tags=["health"], generate_unique_id_function=lambda route: route.name)

    @router.get(
        path,
        response_model=HealthReport,
        summary="Health, including the agent's model provider",
        responses={503: {"model": HealthReport, "description": "A component is DOWN"}},
    )
    async def agent_health() -> JSONResponse:
        return _answer(await health.report())

    @router.get(
        f"{path}/ready",
        response_model=HealthReport,
        summary="Readiness: the database and Redis; the model provider does not gate it",
        responses={503: {"model": HealthReport, "description": "A component is DOWN"}},
    )
    async def agent_readiness() -> JSONResponse:
        return _answer(await health.readiness())

    return router


def _answer(report: HealthReport) -> JSONResponse:
    return JSONResponse(
        report.model_dump(mode="json"), status_code=200 if report.status == "UP" else 503
    )
