"""A prototype httpx transport on raw asyncio protocols, to measure that lever in S3.

Not part of the library: it shows what an ``httpx.AsyncBaseTransport`` over a lean HTTP/1.1
engine would buy (the public API stays httpx: clients take it as ``transport=``). It keeps an
unbounded LIFO pool of keep-alive connections per origin, writes each request with one
``write``, parses the response head with byte searches and streams the body (content-length,
chunked or close-delimited). No proxies, no HTTP/2, no pipelining; TLS through asyncio.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator
from typing import Final

import httpx

__all__ = ["LeanTransport"]

_MAX_HEAD: Final = 64 * 1024


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection; its bytes land in a buffer a reader awaits."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.eof = False
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self.transport = None
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        """Until more bytes (or the end) arrive."""
        if self.eof:
            raise httpx.RemoteProtocolError("the server closed the connection")
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    @property
    def usable(self) -> bool:
        return self.transport is not None and not self.eof and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class _Body(httpx.AsyncByteStream):
    """The response body as it arrives; gives the connection back when read to its end."""

    def __init__(
        self,
        owner: LeanTransport,
        key: tuple[str, str, int],
        connection: _Connection,
        length: int | None,
        chunked: bool,
        keep_alive: bool,
    ) -> None:
        self._owner, self._key, self._connection = owner, key, connection
        self._length, self._chunked, self._keep_alive = length, chunked, keep_alive
        self._complete = False
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection = self._connection
        buffer = connection.buffer
        if self._chunked:
            async for piece in self._chunks():
                yield piece
        elif self._length is not None:
            remaining = self._length
            while remaining:
                if not buffer:
                    await connection.wait()
                    continue
                piece = bytes(buffer[:remaining])
                del buffer[: len(piece)]
                remaining -= len(piece)
                yield piece
        else:  # delimited by the end of the connection
            self._keep_alive = False
            while True:
                if buffer:
                    piece = bytes(buffer)
                    buffer.clear()
                    yield piece
                elif connection.eof:
                    break
                else:
                    await connection.wait()
        self._complete = True

    async def _chunks(self) -> AsyncIterator[bytes]:
        connection = self._connection
        buffer = connection.buffer
        while True:
            while (end := buffer.find(b"\r\n")) < 0:
                await connection.wait()
            size = int(bytes(buffer[:end]).split(b";", 1)[0], 16)
            del buffer[: end + 2]
            if size == 0:
                while (end := buffer.find(b"\r\n")) != 0:  # trailers, then the blank line
                    if end < 0:
                        await connection.wait()
                    else:
                        del buffer[: end + 2]
                del buffer[:2]
                return
            while len(buffer) < size + 2:
                await connection.wait()
            piece = bytes(buffer[:size])
            del buffer[: size + 2]
            yield piece

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._complete and self._keep_alive and self._connection.usable:
            self._owner._release(self._key, self._connection)
        else:
            self._connection.close()


class LeanTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over asyncio protocols with an unbounded keep-alive pool (prototype)."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self._idle: dict[tuple[str, str, int], deque[_Connection]] = {}
        self._ssl = ssl_context

    def _release(self, key: tuple[str, str, int], connection: _Connection) -> None:
        self._idle.setdefault(key, deque()).append(connection)

    async def _connection(self, key: tuple[str, str, int]) -> tuple[_Connection, bool]:
        """A connection to the origin, and whether it was pooled (so possibly stale)."""
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if connection.usable and not connection.buffer:
                return connection, True
            connection.close()
        scheme, host, port = key
        context: ssl.SSLContext | None = None
        if scheme == "https":
            context = self._ssl or ssl.create_default_context()
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await loop.create_connection(_Connection, host, port, ssl=context)
        except OSError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        return protocol, False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        port = url.port or (443 if url.scheme == "https" else 80)
        key = (url.scheme, url.host, port)
        body = await request.aread()
        head = [request.method.encode(), b" ", url.raw_path, b" HTTP/1.1\r\n"]
        if "host" not in request.headers:
            head.append(b"host: " + url.netloc + b"\r\n")
        for name, value in request.headers.raw:
            head += [name, b": ", value, b"\r\n"]
        if body and "content-length" not in request.headers:
            head.append(b"content-length: %d\r\n" % len(body))
        head.append(b"\r\n")
        message = b"".join(head) + body
        timeout = request.extensions.get("timeout", {}).get("read")
        for attempt in range(2):  # a pooled connection the server closed meanwhile: once more
            connection, reused = await self._connection(key)
            assert connection.transport is not None
            connection.transport.write(message)
            try:
                async with asyncio.timeout(timeout):
                    status, headers = await self._read_head(connection)
                break
            except httpx.RemoteProtocolError:
                connection.close()
                if attempt or not reused:
                    raise
            except TimeoutError:
                connection.close()
                raise httpx.ReadTimeout("timed out waiting for the response") from None
        lower = {name.lower(): value for name, value in headers}
        length = lower.get(b"content-length")
        chunked = b"chunked" in lower.get(b"transfer-encoding", b"").lower()
        keep_alive = lower.get(b"connection", b"").lower() != b"close"
        if request.method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            length = b"0"
        stream = _Body(
            self, key, connection, None if length is None else int(length), chunked, keep_alive
        )
        return httpx.Response(status, headers=headers, stream=stream, extensions={})

    @staticmethod
    async def _read_head(connection: _Connection) -> tuple[int, list[tuple[bytes, bytes]]]:
        buffer = connection.buffer
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            if len(buffer) > _MAX_HEAD:
                raise httpx.RemoteProtocolError("response head too large")
            await connection.wait()
        lines = bytes(buffer[:end]).split(b"\r\n")
        del buffer[: end + 4]
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise httpx.RemoteProtocolError(f"not an HTTP/1.1 status line: {lines[0]!r}")
        headers = []
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers.append((name.strip(), value.strip()))
        return int(parts[1]), headers

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
