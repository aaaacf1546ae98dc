"""A TCP proxy a test opens and cuts: the database (or any server) seen through it goes away
and comes back on command, as in a network partition or a server restart.

:class:`TcpProxy` listens on a free local port in a thread of its own and forwards every
connection to ``upstream``. :meth:`TcpProxy.cut` closes every connection through it and stops
listening (new connections are refused); :meth:`TcpProxy.open` listens again on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``upstream`` (host, port) until cut."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.cuts = 0
        self.connections = 0
        """Connections accepted so far."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread.start()

    def _call(self, coroutine: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(10)

    @property
    def listening(self) -> bool:
        return self._server is not None

    def open(self) -> None:
        """Listen (again) and forward new connections."""
        self._call(self._open())

    def cut(self) -> None:
        """Close every connection through the proxy and refuse new ones until :meth:`open`."""
        self._call(self._cut())
        self.cuts += 1

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._call(self._cut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @contextlib.contextmanager
    def cut_for(self) -> Iterator[None]:
        self.cut()
        try:
            yield
        finally:
            self.open()

    async def _open(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(
                self._serve, "127.0.0.1", self.port, reuse_address=True
            )

    async def _cut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(
            self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True
        )

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        finally:
            self._writers.discard(sink)
            sink.transport.abort()
