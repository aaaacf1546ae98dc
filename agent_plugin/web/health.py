"""Health routes: the ``agent`` component (is the model provider reachable?) and one
component per toolset (``mcp:<server>``: is the MCP server connected?) on
``GET {health_path}``, and readiness on ``GET {health_path}/ready``.

A check is time-limited and cached, and concurrent requests share one check, so a slow or
failing provider never makes a health route slow and a busy route never floods the provider.
The component is health-only: it never gates readiness. A toolset's component is its own
answer (an MCP server's costs one ``tools/list``), also time-limited, never gating readiness.
An app with its own health route includes :meth:`AgentHealth.check` in it instead
(``docs/deployment.md``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Final, Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, JsonValue

from agent_plugin.errors import AgentError
from agent_plugin.providers.base import LlmClient
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


class HealthReport(BaseModel):
    """A whole health answer: DOWN when any component is DOWN."""

    model_config = ConfigDict(frozen=True)

    status: HealthStatus
    components: dict[str, ComponentHealth] = {}

    @classmethod
    def of(cls, components: dict[str, ComponentHealth]) -> HealthReport:
        down = any(c.status == "DOWN" for c in components.values())
        return cls(status="DOWN" if down else "UP", components=components)


class AgentHealth:
    """The ``agent`` health component, pinging ``list_models`` on the runtime's client.

    The plugin :meth:`attach` es its client at startup (the first attached client wins, like the
    runtime it belongs to) and :meth:`detach` es it at shutdown. ``clock`` is for tests.
    """

    name: Final = "agent"
    """The component's name in a health report."""
    group: Final = "health"
    """Health-only: shown on the health route, never part of readiness."""

    def __init__(
        self,
        *,
        cache_secs: float = 5.0,
        timeout_secs: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if cache_secs < 0:
            raise AgentError.config(f"cache_secs must not be negative, got {cache_secs}")
        if timeout_secs <= 0:
            raise AgentError.config(f"timeout_secs must be positive, got {timeout_secs}")
        self.cache_secs = cache_secs
        self.timeout_secs = timeout_secs
        self._clock = clock
        self._client: LlmClient | None = None
        self._provider = ""
        self._cached: tuple[float, ComponentHealth] | None = None
        self._lock = asyncio.Lock()
        self._toolsets: tuple[LiveToolset, ...] = ()

    def __repr__(self) -> str:
        state = f"provider={self._provider!r}" if self._client is not None else "not started"
        return f"AgentHealth({state}, cache_secs={self.cache_secs}, timeout={self.timeout_secs})"

    @property
    def started(self) -> bool:
        """Whether a runtime's client is attached (the plugin finished starting)."""
        return self._client is not None

    @property
    def client(self) -> LlmClient | None:
        """The client the check pings: the runtime's own."""
        return self._client

    def attach(
        self, client: LlmClient, provider: str, *, toolsets: Sequence[LiveToolset] = ()
    ) -> None:
        """Start reporting on ``client`` (and ``toolsets``, a component each); ignored when a
        client is already attached."""
        if self._client is None:
            self._client = client
            self._provider = provider
            self._cached = None
            self._lock = asyncio.Lock()  # bound to the loop the app now runs in
            self._toolsets = tuple(toolsets)

    def detach(self, client: LlmClient) -> None:
        """Stop reporting on ``client`` (back to DOWN, not started)."""
        if self._client is client:
            self._client = None
            self._provider = ""
            self._cached = None
            self._toolsets = ()

    async def check(self) -> ComponentHealth:
        """The component's state: cached for ``cache_secs``, at most ``timeout_secs`` to get."""
        client = self._client
        if client is None:
            return ComponentHealth(status="DOWN", details={"error": NOT_STARTED})
        fresh = self._fresh(client)
        if fresh is not None:
            return fresh
        async with self._lock:
            fresh = self._fresh(client)
            if fresh is not None:
                return fresh
            result = await self._ping(client, self._provider)
            if self._client is client:
                self._cached = (self._clock(), result)
            return result

    async def report(self) -> HealthReport:
        """The health route's answer: the ``agent`` component and the toolsets' components."""
        checks = await asyncio.gather(self.check(), *map(self._toolset, self._toolsets))
        names = [self.name, *(toolset.name for toolset in self._toolsets)]
        return HealthReport.of(dict(zip(names, checks, strict=True)))

    async def _toolset(self, toolset: LiveToolset) -> ComponentHealth:
        """A toolset's component: its own health, at most ``timeout_secs`` to get."""
        try:
            async with asyncio.timeout(self.timeout_secs):
                health = await toolset.health()
        except TimeoutError:
            error = f"{toolset.name} did not answer within {self.timeout_secs:g} s"
        except Exception as exc:  # a toolset may raise anything; health must answer
            error = f"{type(exc).__name__}: {exc}"
        else:
            return ComponentHealth(
                status="UP" if health.up else "DOWN", details=dict(health.details)
            )
        return ComponentHealth(status="DOWN", details={"error": error})

    def readiness(self) -> HealthReport:
        """The readiness answer: UP once the plugin started; the agent component is left out."""
        return HealthReport(status="UP" if self.started else "DOWN")

    def _fresh(self, client: LlmClient) -> ComponentHealth | None:
        cached = self._cached
        if cached is None or self._client is not client:
            return None
        at, result = cached
        return result if self._clock() - at < self.cache_secs else None

    async def _ping(self, client: LlmClient, provider: str) -> ComponentHealth:
        try:
            async with asyncio.timeout(self.timeout_secs):
                models = await client.list_models()
        except TimeoutError:
            error = f"{provider} did not answer within {self.timeout_secs:g} s"
        except AgentError as exc:
            error = str(exc)
        except Exception as exc:  # a user's client may raise anything; health must answer
            error = f"{type(exc).__name__}: {exc}"
        else:
            return ComponentHealth(
                status="UP", details={"provider": provider, "models": len(models)}
            )
        return ComponentHealth(status="DOWN", details={"provider": provider, "error": error})


def health_router(health: AgentHealth, path: str = "/health") -> APIRouter:
    """``GET {path}`` (with the agent component) and ``GET {path}/ready`` (without it)."""
    router = APIRouter(tags=["health"])

    @router.get(
        path,
        response_model=HealthReport,
        summary="Health, including the agent's model provider",
        responses={503: {"model": HealthReport, "description": "A component is DOWN"}},
    )
    async def agent_health() -> JSONResponse:
        report = await health.report()
        return _answer(report)

    @router.get(
        f"{path}/ready",
        response_model=HealthReport,
        summary="Readiness; the model provider does not gate it",
        responses={503: {"model": HealthReport, "description": "The plugin has not started"}},
    )
    async def agent_readiness() -> JSONResponse:
        return _answer(health.readiness())

    return router


def _answer(report: HealthReport) -> JSONResponse:
    return JSONResponse(
        report.model_dump(mode="json"), status_code=200 if report.status == "UP" else 503
    )
