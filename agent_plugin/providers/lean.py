"""An httpx transport for many concurrent model calls: :class:`LeanTransport`.

httpx's own transport (httpcore) spends one to two milliseconds of CPU per request once hundreds
of runs share a client: its pool scans every connection and waiting request on each request,
and its HTTP/1.1 state machine is pure Python. Under 300 concurrent runs that CPU, not the
model's latency, sets the pace. ``LeanTransport`` speaks HTTP/1.1 over asyncio protocols with
a keep-alive pool per origin and parses responses with a few byte searches, so a request costs
a fraction of that; the public API stays httpx (it is an :class:`httpx.AsyncBaseTransport`)::

    plugin = AgentPlugin(http_transport=LeanTransport)
    client = OpenAICompatibleClient(model="gpt-4o-mini", transport=LeanTransport())

What it does: HTTP and HTTPS (certificates checked as httpx checks them, or with the
``verify`` context you give; IPv6 and IPv4 raced), keep-alive with an idle expiry, a bound on
connections, httpx's timeouts (connect, read, write, pool) from the request, bodies framed by
length, chunked or by the connection's end, interim ``1xx`` answers skipped, reading paused
while 1 MiB of an answer waits unread. A kept-alive connection that the server turns out to
have closed (it closes within a second of the request, before any byte of the answer) is
replaced and the request sent once more; later than that only idempotent requests are, since
the server may have acted on the request. A failed exchange drops its connection at once.
What it does not do: proxies, HTTP/2, upgrades, ``Expect: 100-continue``, streamed request
bodies (a body is read whole before it is sent, as the wire clients build it anyway). For
those, use httpx's own transport. One transport serves one event loop.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections.abc import AsyncIterator
from typing import Final

import httpx

__all__ = ["LeanTransport"]

_Origin = tuple[str, str, int]

_LIMIT_HEAD: Final = 64 * 1024
"""The longest response head (status line and headers) read before giving up."""

_LIMIT_CHUNK_LINE: Final = 4096
"""The longest chunk-size line (with extensions) or trailer line."""

_READ_AHEAD: Final = 1024 * 1024
"""Bytes received and not yet read beyond which the socket stops being read (TCP then slows
the server down, as when httpx reads on demand)."""

_STALE_WINDOW: Final = 1.0
"""Seconds after sending within which a kept-alive connection that closes without answering
counts as one the server had closed while it sat idle (it answers such a request at once with
its FIN or a reset), so the request goes again on a new connection. Later, the server may
have acted on the request: the error is raised, for the caller's own retry policy."""

_IDEMPOTENT: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})

_TOKEN: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEX: Final = re.compile(rb"[0-9A-Fa-f]{1,16}")
_STATUS: Final = re.compile(rb"[1-9][0-9][0-9]")
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
_NO_BODY_STATUS: Final = frozenset({204, 304})


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: the bytes it received, and a way to wait for more."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.received = False
        """Whether any byte arrived since the last request was written."""
        self.eof = False
        self.error: Exception | None = None
        self.idle_since = 0.0
        self.sent_at = 0.0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None

    # --- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.received = True
        if len(self.buffer) > _READ_AHEAD and not self._paused and self.transport is not None:
            self.transport.pause_reading()
            self._paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self.transport = None
        self._wake()
        self.resume_writing()

    def pause_writing(self) -> None:
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- used by the transport ---------------------------------------------------------------

    @property
    def reusable(self) -> bool:
        """Open, not half-closed by the server, and with no stray bytes waiting."""
        transport = self.transport
        return (
            transport is not None
            and not self.eof
            and not self.buffer
            and not transport.is_closing()
        )

    def send(self, data: bytes) -> None:
        transport = self.transport
        if transport is None:
            raise httpx.WriteError(_lost(self.error, "the connection was closed"))
        self.received = False
        self.sent_at = time.monotonic()
        transport.write(data)

    async def drain(self, seconds: float | None) -> None:
        """Until the kernel took what was written (only waits when asyncio paused writing)."""
        drained = self._drained
        if drained is None:
            return
        try:
            async with asyncio.timeout(seconds):
                await asyncio.shield(drained)
        except TimeoutError:
            self.abort()
            raise httpx.WriteTimeout("timed out sending the request") from None
        if self.transport is None:
            raise httpx.WriteError(_lost(self.error, "the connection was closed while sending"))

    async def receive(self, seconds: float | None, what: str) -> None:
        """Until more bytes arrive; the error for ``what`` was cut short when the server closed."""
        if self.eof:
            if self.error is not None:
                raise httpx.ReadError(_lost(self.error, what))
            raise httpx.RemoteProtocolError(what)
        if self._paused and self.transport is not None:
            self.transport.resume_reading()
            self._paused = False
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None if seconds is None else loop.call_later(seconds, _expire, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
            if waiter.done() and not waiter.cancelled():
                waiter.exception()  # a timeout that lost the race to a cancellation: seen

    def close(self) -> None:
        """Close once what was written is sent (an idle connection, or one read to its end)."""
        transport = self.transport
        if transport is not None:
            transport.close()
        self.eof = True

    def abort(self) -> None:
        """Close at once, dropping unsent bytes (a failed or abandoned exchange): a server that
        stopped reading must not keep the socket and its buffers alive."""
        transport = self.transport
        if transport is not None:
            transport.abort()
        self.eof = True


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(httpx.ReadTimeout("timed out waiting for the response"))


def _lost(error: BaseException | None, what: str) -> str:
    return f"{what}: {error}" if error is not None else what


def _take(buffer: bytearray, size: int) -> bytes:
    """The first ``size`` bytes of ``buffer`` (all of it when shorter), removed from it."""
    if size >= len(buffer):
        piece = bytes(buffer)
        buffer.clear()
        return piece
    with memoryview(buffer) as view:
        piece = view[:size].tobytes()  # one copy, not a bytearray slice and then bytes
    del buffer[:size]
    return piece


def _stale(method: str, connection: _Connection) -> bool:
    """Whether a kept-alive connection that closed before any answer may be retried."""
    return method in _IDEMPOTENT or time.monotonic() - connection.sent_at < _STALE_WINDOW


class _Slots:
    """The bound on connections in use, with httpx's pool timeout for a request that waits."""

    def __init__(self, limit: int | None) -> None:
        self._semaphore = None if limit is None else asyncio.Semaphore(limit)

    async def take(self, seconds: float | None) -> None:
        semaphore = self._semaphore
        if semaphore is None:
            return
        if not semaphore.locked():
            await semaphore.acquire()  # does not wait
            return
        try:
            async with asyncio.timeout(seconds):
                await semaphore.acquire()
        except TimeoutError:
            raise httpx.PoolTimeout("timed out waiting for a free connection") from None

    def give_back(self) -> None:
        if self._semaphore is not None:
            self._semaphore.release()


class LeanTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over asyncio protocols with a keep-alive pool per origin.

    * ``verify``: ``True`` checks certificates as httpx does (certifi's roots, or
      ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``); ``False`` does not check them; or an
      :class:`ssl.SSLContext` of your own.
    * ``max_connections``: requests in flight at once (and so connections per origin); a
      request beyond it waits for up to the request's pool timeout. ``None``: no bound.
    * ``keepalive_expiry``: seconds an idle connection is kept for reuse (httpx's default, 5).

    Errors are httpx's: :class:`httpx.ConnectError` / :class:`httpx.ConnectTimeout`,
    :class:`httpx.ReadTimeout`, :class:`httpx.WriteTimeout`, :class:`httpx.PoolTimeout`,
    :class:`httpx.ReadError` when the connection breaks, :class:`httpx.RemoteProtocolError`
    for an answer that is not HTTP/1.1 or ends early, :class:`httpx.UnsupportedProtocol` for a
    scheme other than http and https, :class:`httpx.LocalProtocolError` for a header that
    cannot be sent.
    """

    def __init__(
        self,
        *,
        verify: ssl.SSLContext | bool = True,
        max_connections: int | None = 100,
        keepalive_expiry: float = 5.0,
    ) -> None:
        if max_connections is not None and max_connections < 1:
            raise ValueError("max_connections must be at least 1 (or None for no bound)")
        if keepalive_expiry < 0:
            raise ValueError("keepalive_expiry must not be negative")
        self._verify = verify
        self._ssl: ssl.SSLContext | None = None
        self._slots = _Slots(max_connections)
        self._expiry = keepalive_expiry
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._closed = False

    def __repr__(self) -> str:
        idle = sum(len(connections) for connections in self._idle.values())
        return f"LeanTransport(idle_connections={idle}, closed={self._closed})"

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise RuntimeError("this LeanTransport is closed")
        url = request.url
        scheme = url.scheme
        port = _DEFAULT_PORTS.get(scheme)
        if port is None:
            raise httpx.UnsupportedProtocol(
                f"LeanTransport speaks http and https, not {scheme!r}"
                if scheme
                else "the request URL has no scheme"
            )
        host = url.raw_host.decode("ascii")  # IDNA-encoded; IPv6 without brackets
        if not host:
            raise httpx.UnsupportedProtocol("the request URL has no host")
        origin = (scheme, host, url.port or port)
        message, closing = _request_bytes(request, await _body(request))
        timeouts = request.extensions.get("timeout", {})
        await self._slots.take(timeouts.get("pool"))
        try:
            if self._closed:  # while this request waited for a slot
                raise RuntimeError("this LeanTransport is closed")
            return await self._exchange(request, origin, message, closing, timeouts)
        except BaseException:
            self._slots.give_back()
            raise

    async def _exchange(
        self,
        request: httpx.Request,
        origin: _Origin,
        message: bytes,
        closing: bool,
        timeouts: dict[str, float],
    ) -> httpx.Response:
        read_timeout = timeouts.get("read")
        reuse = True
        while True:
            connection = self._pooled(origin) if reuse else None
            reused = connection is not None
            if connection is None:
                connection = await self._connect(origin, timeouts.get("connect"))
            try:
                connection.send(message)
                await connection.drain(timeouts.get("write"))
                status, reason, version, headers = await _read_head(connection, read_timeout)
                length, keep_alive = _framing(request.method, status, version, headers)
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                connection.abort()
                if reused and not connection.received and _stale(request.method, connection):
                    # a kept-alive connection the server had closed (those idle as long or
                    # longer are likely closed too): once more, on a new connection
                    self._drop_idle(origin, connection.idle_since)
                    reuse = False
                    continue
                raise
            except BaseException:
                connection.abort()
                raise
            break
        stream = _Body(self, origin, connection, length, keep_alive and not closing, read_timeout)
        return httpx.Response(
            status,
            headers=headers,
            stream=stream,
            extensions={"http_version": version, "reason_phrase": reason},
        )

    def _pooled(self, origin: _Origin) -> _Connection | None:
        """The newest idle connection to ``origin`` fit for reuse; expired ones close."""
        idle = self._idle.get(origin)
        if not idle:
            return None
        self._drop_idle(origin, time.monotonic() - self._expiry)
        while idle:
            connection = idle.pop()
            if connection.reusable:
                return connection
            connection.close()
        return None

    def _drop_idle(self, origin: _Origin, since: float) -> None:
        """Close the idle connections to ``origin`` idle since ``since`` or longer (the list
        runs from the longest idle to the newest)."""
        idle = self._idle.get(origin, [])
        count = 0
        while count < len(idle) and idle[count].idle_since <= since:
            idle[count].close()
            count += 1
        del idle[:count]

    async def _connect(self, origin: _Origin, seconds: float | None) -> _Connection:
        scheme, host, port = origin
        context = self._context() if scheme == "https" else None
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(seconds):
                transport, connection = await loop.create_connection(
                    _Connection,
                    host,
                    port,
                    ssl=context,
                    server_hostname=host if context else None,
                    happy_eyeballs_delay=0.25,  # IPv6 and IPv4 raced, as httpx's engine does
                    interleave=1,
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"timed out connecting to {host}:{port}") from None
        except (OSError, UnicodeError) as exc:  # refused, unreachable, unknown host, TLS, IDNA
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        if context is not None:
            ssl_object = transport.get_extra_info("ssl_object")
            chosen = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
            if chosen not in (None, "http/1.1"):
                connection.abort()
                raise httpx.ConnectError(
                    f"{host}:{port} chose {chosen!r}; LeanTransport speaks only HTTP/1.1 (an SSL"
                    " context of your own must not offer other protocols by ALPN)"
                )
        return connection

    def _context(self) -> ssl.SSLContext:
        context = self._ssl
        if context is None:
            verify = self._verify
            if isinstance(verify, ssl.SSLContext):
                context = verify
            else:
                context = httpx.create_ssl_context(verify=verify)
                context.set_alpn_protocols(["http/1.1"])
            self._ssl = context
        return context

    def _release(
        self, origin: _Origin, connection: _Connection, *, complete: bool, reuse: bool
    ) -> None:
        """Called once per response: keep the connection for the next request, or close it
        (at once when its answer was left unfinished)."""
        self._slots.give_back()
        if reuse and complete and not self._closed and connection.reusable:
            now = connection.idle_since = time.monotonic()
            self._idle.setdefault(origin, []).append(connection)
            self._drop_idle(origin, now - self._expiry)
        elif complete:
            connection.close()
        else:
            connection.abort()

    async def aclose(self) -> None:
        """Close the idle connections; connections of unread answers close when those do."""
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


async def _body(request: httpx.Request) -> bytes:
    try:
        return request.content
    except httpx.RequestNotRead:
        return await request.aread()


def _request_bytes(request: httpx.Request, body: bytes) -> tuple[bytes, bool]:
    """The request line, headers and body as written on the wire, and whether the request
    asks to close the connection after the answer (``Connection: close``).

    A body is always sent with its length: a ``Transfer-Encoding`` the request carries (httpx
    adds one for streamed content) is replaced by ``Content-Length``, since the body was read
    whole. The method and header names must be tokens, and no value may hold CR, LF or NUL.
    """
    url = request.url
    method = request.method.encode("ascii", "replace")
    if _TOKEN.fullmatch(method) is None:
        raise httpx.LocalProtocolError(f"invalid request method {request.method!r}")
    parts = [method, b" ", url.raw_path, b" HTTP/1.1\r\n"]
    lines = 2  # the request line and the blank line that ends the head
    has_host = has_length = closing = False
    for name, value in request.headers.raw:
        lower = name.lower()
        if lower == b"transfer-encoding":
            continue
        if lower == b"content-length":
            if has_length:
                continue
            has_length = True
            value = b"%d" % len(body)
        elif lower == b"host":
            has_host = True
        elif lower == b"connection":
            closing = closing or b"close" in _tokens(value)
        if _TOKEN.fullmatch(name) is None:
            raise httpx.LocalProtocolError(f"invalid header name {name!r}")
        parts += (name, b": ", value, b"\r\n")
        lines += 1
    if not has_host:
        parts += (b"Host: ", url.netloc, b"\r\n")
        lines += 1
    if not has_length and (body or request.method not in ("GET", "HEAD")):
        parts.append(b"Content-Length: %d\r\n" % len(body))
        lines += 1
    parts.append(b"\r\n")
    head = b"".join(parts)
    # every line ends in the one CRLF added here: any other CR or LF came from a value
    if head.count(b"\r") != lines or head.count(b"\n") != lines or b"\0" in head:
        raise httpx.LocalProtocolError("a header value holds CR, LF or NUL")
    return head + body, closing


def _tokens(value: bytes) -> list[bytes]:
    """The lower-cased, non-empty items of a comma-separated header value."""
    return [item for token in value.lower().split(b",") if (item := token.strip(b" \t"))]


_Head = tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]


async def _read_head(connection: _Connection, seconds: float | None) -> _Head:
    """The status, reason, version and headers of the answer; interim ``1xx`` answers skipped."""
    buffer = connection.buffer
    searched = 0  # bytes known to hold no end of head but the last three
    while True:
        end = buffer.find(b"\r\n\r\n", searched)
        if end > _LIMIT_HEAD:
            raise httpx.RemoteProtocolError("the response head is larger than 64 KiB")
        if end < 0:
            if len(buffer) > _LIMIT_HEAD:
                raise httpx.RemoteProtocolError("the response head is larger than 64 KiB")
            searched = max(0, len(buffer) - 3)
            await connection.receive(
                seconds,
                "the server closed the connection before the response ended"
                if connection.buffer
                else "the server disconnected without sending a response",
            )
            continue
        head = _parse_head(_take(buffer, end))
        del buffer[:4]
        searched = 0
        if head[0] == 101:
            raise httpx.RemoteProtocolError("the server switched protocols, unasked")
        if head[0] < 200:
            continue  # 100 Continue, 103 Early Hints: the real answer follows
        return head


def _parse_head(data: bytes) -> _Head:
    crlf = data.count(b"\r\n")
    if data.count(b"\r") != crlf or data.count(b"\n") != crlf or b"\0" in data:
        raise httpx.RemoteProtocolError("the response head holds a bare CR or LF, or a NUL")
    lines = data.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or not _STATUS.fullmatch(code):
        raise httpx.RemoteProtocolError(f"not an HTTP/1.1 status line: {lines[0][:100]!r}")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t") and headers:  # obsolete line folding: one space (RFC 9112)
            name, value = headers[-1]
            headers[-1] = (name, (value + b" " + line.strip(b" \t")).strip(b" \t"))
            continue
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None:
            raise httpx.RemoteProtocolError(f"malformed response header line {line[:100]!r}")
        headers.append((name, value.strip(b" \t")))
    return int(code), reason, version, headers


def _framing(
    method: str, status: int, version: bytes, headers: list[tuple[bytes, bytes]]
) -> tuple[int | None, bool]:
    """How the body ends and whether the connection can be reused after it (RFC 9112 §6.3).

    The length is a byte count, ``-1`` for a chunked body, or ``None`` for a body that ends
    with the connection.
    """
    lengths: set[bytes] = set()
    codings: list[bytes] = []
    tokens: list[bytes] = []
    for name, value in headers:
        lower = name.lower()
        if lower == b"content-length":
            lengths.update(part.strip() for part in value.split(b","))
        elif lower == b"transfer-encoding":
            codings += _tokens(value)
        elif lower == b"connection":
            tokens += _tokens(value)
    keep_alive = b"close" not in tokens and (version == b"HTTP/1.1" or b"keep-alive" in tokens)
    if method == "HEAD" or status in _NO_BODY_STATUS:
        return 0, keep_alive
    if codings:
        if codings != [b"chunked"]:  # as h11: a body in another transfer coding is not read
            raise httpx.RemoteProtocolError(f"unsupported Transfer-Encoding {codings!r}")
        return -1, keep_alive and not lengths
    if lengths:
        if len(lengths) > 1 or not all(length.isdigit() for length in lengths):
            raise httpx.RemoteProtocolError(f"invalid Content-Length {sorted(lengths)!r}")
        return int(lengths.pop()), keep_alive
    return None, False


class _Body(httpx.AsyncByteStream):
    """The answer's body as it arrives; the connection goes back to the pool when it was read
    to its end and closed, and is closed otherwise."""

    def __init__(
        self,
        owner: LeanTransport,
        origin: _Origin,
        connection: _Connection,
        length: int | None,
        keep_alive: bool,
        timeout: float | None,
    ) -> None:
        self._owner = owner
        self._origin = origin
        self._connection = connection
        self._length = length
        self._keep_alive = keep_alive
        self._timeout = timeout
        self._complete = length == 0
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._complete:
            return
        length = self._length
        if length is None:
            pieces = self._until_closed()
        elif length < 0:
            pieces = self._chunks()
        else:
            pieces = self._exactly(length)
        async for piece in pieces:
            yield piece
        self._complete = True

    async def _more(self) -> None:
        await self._connection.receive(
            self._timeout, "the server closed the connection before the response body ended"
        )

    async def _exactly(self, remaining: int) -> AsyncIterator[bytes]:
        buffer = self._connection.buffer
        while remaining:
            if not buffer:
                await self._more()
                continue
            piece = _take(buffer, remaining)
            remaining -= len(piece)
            yield piece

    async def _until_closed(self) -> AsyncIterator[bytes]:
        connection = self._connection
        buffer = connection.buffer
        while True:
            if buffer:
                piece = bytes(buffer)
                buffer.clear()
                yield piece
            elif connection.eof:
                if connection.error is not None:
                    raise httpx.ReadError(_lost(connection.error, "the connection broke"))
                return
            else:
                await connection.receive(self._timeout, "unreachable")

    async def _line(self) -> bytes:
        buffer = self._connection.buffer
        while (end := buffer.find(b"\r\n")) < 0:
            if len(buffer) > _LIMIT_CHUNK_LINE:
                raise httpx.RemoteProtocolError("a chunk-size or trailer line is too long")
            await self._more()
        line = _take(buffer, end)
        del buffer[:2]
        return line

    async def _chunks(self) -> AsyncIterator[bytes]:
        while True:
            line = await self._line()
            digits = line.split(b";", 1)[0].rstrip(b" \t")
            if _HEX.fullmatch(digits) is None:
                raise httpx.RemoteProtocolError(f"invalid chunk size line {line[:100]!r}")
            size = int(digits, 16)
            if size == 0:
                while await self._line():  # trailers, until the blank line
                    pass
                return
            async for piece in self._exactly(size):
                yield piece
            if await self._line():
                raise httpx.RemoteProtocolError("a chunk is longer than its size says")

    async def aclose(self) -> None:
        if self._released:
            return
        self._released = True
        self._owner._release(
            self._origin, self._connection, complete=self._complete, reuse=self._keep_alive
        )
