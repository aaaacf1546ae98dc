"""Tools from MCP servers: :class:`MCPServer` declares one (:mod:`~agent_plugin.mcp.servers`),
:mod:`~agent_plugin.mcp.connection` keeps its session for the process, and
:mod:`~agent_plugin.mcp.tools` turns its tools into the agent's. ``docs/guide/mcp.md`` tells
the story.

Importing this package does not import the MCP SDK (the ``mcp`` extra); starting a server does.
"""

from agent_plugin.mcp.servers import MCPServer, ProtocolMode, TransportKind, configured_servers

__all__ = ["MCPServer", "ProtocolMode", "TransportKind", "configured_servers"]
