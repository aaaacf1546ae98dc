"""The tools of a run, by name, and their definitions in a stable order."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from agent_plugin.errors import AgentError, PrefixLocked
from agent_plugin.messages import ToolDefinition
from agent_plugin.tools.base import (
    TOOL_MEMBERS,
    Tool,
    check_name,
    definition_of,
)

__all__ = ["ToolRegistry"]


class ToolRegistry:
    """The tools of a run, by name.

    :meth:`definitions` is sorted by name and cached until the next change, so calling it every
    step costs nothing and the prompt's tool block stays identical between calls. A
    :meth:`lock` ed registry refuses changes (:class:`~agent_plugin.errors.PrefixLocked`).
    """

    __slots__ = ("_definitions", "_locked", "_tools")

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._definitions: tuple[ToolDefinition, ...] | None = None
        self._locked = False
        for item in tools:
            self.add(item)

    @property
    def locked(self) -> bool:
        return self._locked

    def lock(self) -> None:
        """Refuse every change from now on (the definitions are made now, once)."""
        self.definitions()
        self._locked = True

    def unlock(self) -> None:
        self._locked = False

    def _check_unlocked(self, change: str) -> None:
        if self._locked:
            raise PrefixLocked(change)

    def add(self, tool: Tool) -> None:
        """Register ``tool``; a second tool with the same name is an error."""
        self._check_unlocked("adding a tool")
        name = checked_tool(tool).name
        if name in self._tools:
            raise AgentError.config(f"a tool named {name!r} is already registered")
        self._tools[name] = tool
        self._definitions = None

    def remove(self, name: str) -> Tool:
        """Unregister and return the tool called ``name``; it must exist."""
        self._check_unlocked("removing a tool")
        try:
            removed = self._tools.pop(name)
        except KeyError:
            raise AgentError.config(f"no tool named {name!r} is registered") from None
        self._definitions = None
        return removed

    def replace(self, tool: Tool) -> Tool:
        """Swap in ``tool`` for the registered tool of the same name; return the old one."""
        self._check_unlocked("replacing a tool")
        name = checked_tool(tool).name
        old = self._tools.get(name)
        if old is None:
            raise AgentError.config(f"no tool named {name!r} is registered to replace")
        self._tools[name] = tool
        self._definitions = None
        return old

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._tools)

    def definitions(self) -> tuple[ToolDefinition, ...]:
        """The tool definitions sorted by name: the same tuple until the next change.

        A tuple of frozen definitions, so a hook that edits ``request.tools`` cannot change it.
        """
        if self._definitions is None:
            self._definitions = tuple(definition_of(tool) for tool in self)
        return self._definitions

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        """The tools, sorted by name."""
        return iter([self._tools[name] for name in sorted(self._tools)])

    def __repr__(self) -> str:
        return f"ToolRegistry({self.names()!r})"


def checked_tool(value: object) -> Tool:
    if not isinstance(value, Tool):
        missing = [member for member in TOOL_MEMBERS if not hasattr(value, member)]
        raise AgentError.config(f"{value!r} is not a Tool: missing {', '.join(missing)}")
    check_name(value.name, f"tool {value.name!r}")
    return value
