"""Toolsets: tools that come from a long-lived connection (an MCP server), opened once per
runtime and shared by every run of the process.

A :class:`Toolset` is a declaration, plain data saying what to connect to
(:class:`agent_plugin.mcp.MCPServer` is one). The runtime starts each when it opens (the app's
lifespan, each worker's startup) and holds the :class:`LiveToolset` it answers until it closes.
An agent the runtime builds offers the model its own tools and every live toolset's current
:meth:`~LiveToolset.tools`; a toolset whose list changed bumps its
:attr:`~LiveToolset.revision`, and the runtime's next agents get the new list (a run that is
going keeps the tools it started with). :func:`gather_tools` is that merge, in one place: the
runtime's own tools win a name, then toolsets in declaration order. ``docs/guide/mcp.md``
tells the story.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from pydantic import JsonValue

from agent_plugin.errors import AgentError
from agent_plugin.tools import Tool

__all__ = [
    "LiveToolset",
    "Toolset",
    "ToolsetHealth",
    "close_toolsets",
    "gather_tools",
    "start_toolsets",
]

logger = logging.getLogger("agent_plugin")


@dataclass(frozen=True, slots=True)
class ToolsetHealth:
    """How a live toolset is doing: ``up`` or not, and details for the health route (on a
    toolset that is down, ``details["error"]`` says why)."""

    up: bool
    details: Mapping[str, JsonValue] = field(default_factory=dict)


@runtime_checkable
class LiveToolset(Protocol):
    """A started toolset: its current tools, a revision that changes with them, its health."""

    @property
    def name(self) -> str:
        """The toolset's name in logs and in the health report (``mcp:<server>``)."""
        ...

    @property
    def revision(self) -> int:
        """Changes whenever :meth:`tools` would answer differently."""
        ...

    def tools(self) -> Sequence[Tool]:
        """The tools it offers now, in a stable order (sorted by name)."""
        ...

    async def health(self) -> ToolsetHealth:
        """Whether it works now; may talk to the other side, so callers bound it in time."""
        ...

    async def aclose(self) -> None:
        """Close its connections and whatever it started (subprocesses)."""
        ...


@runtime_checkable
class Toolset(Protocol):
    """What an app declares: something that can be started into a :class:`LiveToolset`."""

    @property
    def name(self) -> str: ...

    async def start(self, environ: Mapping[str, str]) -> LiveToolset:
        """Start it; ``environ`` is the process environment (or the plugin's replacement).

        Raises an :class:`AgentError` only when the process must not run without it.
        """
        ...


async def start_toolsets(
    toolsets: Iterable[Toolset], environ: Mapping[str, str]
) -> list[LiveToolset]:
    """Start every toolset at once; when one fails, close the others and raise its error."""
    declared = list(toolsets)
    for item in declared:
        if not isinstance(item, Toolset):
            raise AgentError.config(
                f"{item!r} is not a toolset: it needs a name and an async start(environ) "
                "(MCPServer.stdio(...) or MCPServer.http(...))"
            )
    names = [item.name for item in declared]
    for name in names:
        if names.count(name) > 1:
            raise AgentError.config(f"two toolsets are named {name!r}")
    results = await asyncio.gather(
        *(item.start(environ) for item in declared), return_exceptions=True
    )
    live = [result for result in results if isinstance(result, LiveToolset)]
    failed = [result for result in results if isinstance(result, BaseException)]
    if failed:
        await close_toolsets(live)
        raise failed[0]
    return live


async def close_toolsets(toolsets: Iterable[LiveToolset]) -> None:
    """Close every toolset, even when closing one fails (that is logged)."""
    for toolset in toolsets:
        try:
            await toolset.aclose()
        except Exception as error:  # closing must not stop the rest of the shutdown
            logger.warning("closing the toolset %s failed: %s", toolset.name, error)


def gather_tools(
    own: Sequence[Tool],
    toolsets: Sequence[LiveToolset],
    *,
    reserved: Collection[str] = (),
    strict: bool,
) -> list[Tool]:
    """``own`` and the toolsets' current tools, every name once.

    A toolset's tool whose name is taken (by ``own``, by ``reserved`` names such as the agent's
    ``memory`` tool, or by an earlier toolset) is a ``config`` error when ``strict`` (at
    startup), and is left out with a warning otherwise (a list that changed later).
    """
    tools = list(own)
    taken = {tool.name: "the app's own tools" for tool in own}
    taken.update(dict.fromkeys(reserved, "the agent's built-in tools"))
    for toolset in toolsets:
        for tool in toolset.tools():
            holder = taken.get(tool.name)
            if holder is None:
                taken[tool.name] = f"toolset {toolset.name}"
                tools.append(tool)
                continue
            problem = (
                f"the tool {tool.name!r} of toolset {toolset.name} has the name of a tool of "
                f"{holder}: give the server another tool_prefix"
            )
            if strict:
                raise AgentError.config(problem)
            logger.warning("%s; it is left out", problem)
    return tools
