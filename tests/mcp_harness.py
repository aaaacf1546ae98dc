"""The MCP tests' side of ``tests/mcp_server.py``: the server declared as a stdio server (the
plugin starts it), or run as a Streamable HTTP server in a subprocess of the test (so a test
can kill it and start it again at the same URL); its log; waiting for a condition."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from agent_plugin.mcp import MCPServer

ROOT: Final = Path(__file__).resolve().parent.parent
SERVER: Final = ROOT / "tests" / "mcp_server.py"
TOKEN: Final = "Bearer mcp-test-token-5f0c2a"
"""The header value the HTTP server requires (``Authorization``)."""


def stdio_server(name: str = "files", *, log: Path | None = None, **options: Any) -> MCPServer:
    """The tests' server as a stdio server, logging its calls to ``log``."""
    args = [str(SERVER), "stdio", *(["--log", str(log)] if log is not None else [])]
    return MCPServer.stdio(name, sys.executable, args, **options)


@dataclass(frozen=True)
class Call:
    """One line of the server's log: who served which tool with which argument."""

    pid: int
    ppid: int
    tool: str
    argument: str


def calls(log: Path, tool: str | None = None) -> list[Call]:
    """The log's lines (only ``tool`` ones if given)."""
    if not log.exists():
        return []
    found = []
    for line in log.read_text().splitlines():
        pid, ppid, name, argument = line.split(" ", 3)
        if tool is None or name == tool:
            found.append(Call(int(pid), int(ppid), name, argument))
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie child counts as ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().split(") ", 1)[1].startswith("Z"))


class HttpMCP:
    """The tests' server over Streamable HTTP on a port of its own, requiring
    ``Authorization: <TOKEN>``."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def declaration(self, name: str = "web", **options: Any) -> MCPServer:
        """The server as the app declares it: the token comes from ``MCP_TOKEN``."""
        options.setdefault("headers_env", {"Authorization": "MCP_TOKEN"})
        return MCPServer.http(name, self.url, **options)

    def start(self, timeout: float = 30.0) -> None:
        command = [sys.executable, str(SERVER), "http", "--port", str(self.port)]
        command += ["--log", str(self.log), "--header", f"Authorization={TOKEN}"]
        self.process = subprocess.Popen(command, cwd=ROOT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the MCP server exited with {self.process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            except OSError:
                time.sleep(0.05)
                continue
            return
        raise AssertionError(f"the MCP server did not listen on {self.port} in {timeout} s")

    def kill(self) -> None:
        """SIGKILL: the server dies at once."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


async def eventually(check: Callable[[], Any], within: float = 20.0) -> Any:
    """Poll ``check`` (sync or async) until it answers something truthy; that answer."""
    deadline = time.monotonic() + within
    while True:
        answer = check()
        if asyncio.iscoroutine(answer):
            answer = await answer
        if answer:
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {within} s: {check}")
        await asyncio.sleep(0.05)
