"""The tests' MCP server, written with the MCP SDK's own server side (``tests/test_mcp*.py``).

One set of tools, served over either transport::

    python tests/mcp_server.py stdio [--log FILE]
    python tests/mcp_server.py http --port PORT [--log FILE] [--header NAME=VALUE]

Every tool call appends ``<pid> <parent pid> <tool> <argument>`` to the log file (one ``write``
of a short line), so a test can see which process served which call, and who started it.
``crash`` ends the process at once, mid-call, the way a crashing server does; ``learn`` adds a
tool and announces the change (``notifications/tools/list_changed``, on a listen stream for 2026
clients and on the session for earlier ones). ``--header NAME=VALUE`` makes the HTTP server
refuse requests without that header.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import struct
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel

server: MCPServer = MCPServer("tests", instructions="The tests' MCP server.", log_level="WARNING")
LOG: list[Path] = []


def log(tool: str, argument: object = "-") -> None:
    if LOG:
        line = f"{os.getpid()} {os.getppid()} {tool} {argument}\n".encode()
        fd = os.open(LOG[0], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


class Forecast(BaseModel):
    city: str
    celsius: int
    sky: str


@server.tool(structured_output=False)
def echo(text: str) -> str:
    """Repeat the text."""
    log("echo", text)
    return text


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def forecast(city: str, days: int = 1) -> Forecast:
    """Tomorrow's weather for a city (made up)."""
    log("forecast", city)
    return Forecast(city=city, celsius=10 + len(city) + days, sky="cloudy")


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
def erase(path: str) -> str:
    """Erase a file (pretends to)."""
    log("erase", path)
    return f"erased {path}"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
def append(path: str, line: str) -> str:
    """Append a line to a file (pretends to)."""
    log("append", path)
    return f"appended to {path}"


@server.tool(structured_output=False)
def fail(message: str) -> str:
    """Always fails with the message."""
    log("fail", message)
    raise ToolError(message)


@server.tool(structured_output=False)
async def slow(seconds: float) -> str:
    """Answer after a while."""
    log("slow_start", seconds)
    await asyncio.sleep(seconds)
    log("slow_end", seconds)
    return f"slept {seconds}"


@server.tool(structured_output=False)
def crash() -> str:
    """End the server's process in the middle of the call."""
    log("crash")
    os._exit(3)


@server.tool(structured_output=False)
def whoami() -> str:
    """The server's process id."""
    log("whoami")
    return str(os.getpid())


@server.tool(structured_output=False)
def picture() -> list[Any]:
    """A caption and a one-pixel PNG."""
    log("picture")
    return ["a red dot", Image(data=_png(), format="png")]


@server.tool(structured_output=False)
def shout(text: str) -> str:
    """The text in capitals, many times over."""
    log("shout", text)
    return text.upper() * 1000


def read_notes() -> str:
    """The notes (a name with a dot, which model providers refuse)."""
    log("notes.read")
    return "buy milk"


server.add_tool(read_notes, name="notes.read", structured_output=False)


@server.tool(structured_output=False)
async def learn(name: str, ctx: Context) -> str:
    """Add a tool called ``name`` that answers its name, and announce the new tool list."""
    log("learn", name)

    def learned() -> str:
        return f"I am {name}"

    server.add_tool(learned, name=name, description=f"Learned tool {name}.")
    await ctx.notify_tools_changed()  # 2026-07-28 clients: their listen stream
    await ctx.session.send_tool_list_changed()  # earlier clients: the session
    return f"learned {name}"


def _png() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00")
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def _guarded(app: Any, name: str, value: str) -> Callable[..., Awaitable[None]]:
    """``app`` behind a check of one request header (401 without it)."""
    wanted = (name.lower().encode(), value.encode())

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and wanted not in scope.get("headers", []):
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"missing credentials"})
            return
        await app(scope, receive, send)

    return guarded


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log")
    parser.add_argument("--header")
    options = parser.parse_args()
    if options.log:
        LOG.append(Path(options.log))
    log("started", options.transport)
    if options.transport == "stdio":
        server.run("stdio")
        return
    import uvicorn

    app: Any = server.streamable_http_app()
    if options.header:
        name, _, value = options.header.partition("=")
        app = _guarded(app, name, value)
    uvicorn.run(app, host="127.0.0.1", port=options.port, log_level="warning", lifespan="on")


if __name__ == "__main__":
    main()
