"""The demo's MCP server: notes, kept in memory for as long as the server runs.

The demo app starts it as a stdio server (``MCPServer.stdio("notes", ...)`` in
``example_app/main.py``); any MCP client can run it the same way::

    python example_app/notes_server.py

Its tools say what they do with MCP annotations: ``list_notes`` only reads, ``add_note`` adds
and never destroys. The demo marks the server ``trusted``, so those hints set the tools'
effects: listing runs at once, adding waits for approval like the demo's other actions.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server: MCPServer = MCPServer("notes", instructions="Short notes to remember.", log_level="WARNING")
NOTES: list[str] = []


@server.tool(annotations=ToolAnnotations(read_only_hint=True), structured_output=False)
def list_notes() -> str:
    """The notes written so far, one a line."""
    return "\n".join(f"- {note}" for note in NOTES) or "(no notes yet)"


@server.tool(
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False),
    structured_output=False,
)
def add_note(text: str) -> str:
    """Write a note down."""
    NOTES.append(" ".join(text.split()))
    return f"noted ({len(NOTES)} notes)"


if __name__ == "__main__":
    server.run("stdio")
