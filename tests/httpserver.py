"""A small programmable HTTP/1.1 server on 127.0.0.1 for tests that need real sockets.

Queue one *action* per expected request; the server answers requests in arrival order with the
queued actions (or ``default`` when the queue is empty) and records every request it received::

    async with HttpServer() as server:
        server.queue(Reply(429, {"retry-after": "1"}), reply_json({"ok": True}))
        ...  # point a client at server.url
        assert len(server.requests) == 2

An action is one of the dataclasses below, or a callable that receives the
:class:`RecordedRequest` and returns an action (or an awaitable of one), which lets a test script
answers from what the client sent. Connections are kept alive between requests the way httpx
expects, and :attr:`RecordedRequest.connection` tells which connection carried a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

__all__ = [
    "Action",
    "Hang",
    "HttpServer",
    "RecordedRequest",
    "Reply",
    "Reset",
    "Stream",
    "Truncated",
    "reply_json",
    "sse",
    "sse_event",
]


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it."""

    method: str
    path: str
    headers: Mapping[str, str]  # names lower-cased; repeated headers joined with ", "
    body: bytes
    connection: int  # 1 for the first connection the server accepted, 2 for the next, ...

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Reply:
    """Answer with a status, headers and a body (sent with ``Content-Length``).

    A body that is cut short but still matches its length (``Reply(200, body='{"id": "x')``)
    is how a test sends complete-but-truncated JSON.
    """

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes | str = b""


@dataclass(frozen=True)
class Stream:
    """Answer with a chunked body sent piece by piece.

    Each item of ``chunks`` is sent as it comes: ``bytes``/``str`` are written and flushed as one
    HTTP chunk, a ``float`` sleeps that many seconds, an :class:`asyncio.Event` waits until the
    test sets it. ``end`` says how the response finishes: ``"complete"`` sends the terminating
    chunk (the connection stays open), ``"close"`` closes the connection without it, ``"reset"``
    aborts the connection with a TCP reset.
    """

    chunks: Sequence[bytes | str | float | asyncio.Event]
    status: int = 200
    headers: Mapping[str, str] = field(
        default_factory=lambda: {"content-type": "text/event-stream"}
    )
    end: Literal["complete", "close", "reset"] = "complete"


@dataclass(frozen=True)
class Reset:
    """Abort the connection with a TCP reset (``SO_LINGER`` 0) instead of answering."""


@dataclass(frozen=True)
class Hang:
    """Never answer; the connection stays open until the client gives up or the server stops."""


@dataclass(frozen=True)
class Truncated:
    """Announce ``Content-Length`` larger than the body, send the body, then close."""

    body: bytes | str
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=lambda: {"content-type": "application/json"})
    missing: int = 10


Action: TypeAlias = (
    Reply
    | Stream
    | Reset
    | Hang
    | Truncated
    | Callable[[RecordedRequest], "Action | Awaitable[Action]"]
)


def reply_json(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Reply:
    """A JSON :class:`Reply`."""
    return Reply(
        status,
        {"content-type": "application/json", **(headers or {})},
        json.dumps(data).encode(),
    )


def sse_event(data: Any, event: str | None = None) -> bytes:
    """One server-sent event; ``data`` that is not a string is sent as JSON."""
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event is not None else ""
    return (head + "".join(f"data: {line}\n" for line in text.split("\n")) + "\n").encode()


def sse(
    events: Iterable[bytes | str | float | asyncio.Event],
    *,
    status: int = 200,
    end: Literal["complete", "close", "reset"] = "complete",
) -> Stream:
    """A ``text/event-stream`` :class:`Stream`, one chunk per item (see :func:`sse_event`)."""
    return Stream(list(events), status=status, end=end)


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    413: "Content Too Large",
    418: "I'm a teapot",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    529: "Overloaded",
}


class HttpServer:
    """An HTTP/1.1 server on ``127.0.0.1`` and an ephemeral port, used as an async context manager.

    ``default`` answers requests that arrive when the queue is empty; without one the server
    answers ``418`` with a body saying so (a status no client retries).
    """

    def __init__(self, default: Action | None = None) -> None:
        self.default = default
        self.requests: list[RecordedRequest] = []
        self._actions: deque[Action] = deque()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._connections = 0
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pending(self) -> int:
        """How many queued actions were not used yet."""
        return len(self._actions)

    def queue(self, *actions: Action) -> None:
        self._actions.extend(actions)

    async def __aenter__(self) -> HttpServer:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for writer in list(self._writers):
            writer.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        task = asyncio.ensure_future(self._serve(self._connections, reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(
        self, connection: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._writers.add(writer)
        try:
            while True:
                request = await _read_request(reader, connection)
                if request is None:
                    break
                self.requests.append(request)
                action = await self._resolve(request)
                keep_open = await _perform(action, reader, writer)
                if not keep_open or request.headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            if not writer.transport.is_closing():
                writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _resolve(self, request: RecordedRequest) -> Action:
        if self._actions:
            action = self._actions.popleft()
        elif self.default is not None:
            action = self.default
        else:
            message = f"httpserver: no action queued for {request.method} {request.path}"
            return Reply(418, {"content-type": "text/plain"}, message)
        while callable(action):
            result = action(request)
            action = await result if isinstance(result, Awaitable) else result
        return action


async def _read_request(reader: asyncio.StreamReader, connection: int) -> RecordedRequest | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise
        return None
    request_line, *header_lines = head.decode("latin-1").split("\r\n")[:-2]
    method, target, _version = request_line.split(" ", 2)
    headers: dict[str, str] = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = await _read_chunked(reader)
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return RecordedRequest(method, target, headers, body, connection)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


def _head(status: int, headers: Mapping[str, str], extra: Mapping[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    lines += [f"{name}: {value}" for name, value in {**headers, **extra}.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else data


async def _perform(
    action: Action, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> bool:
    """Carry out ``action``; whether the connection can serve another request."""
    if isinstance(action, Reply):
        body = _bytes(action.body)
        writer.write(_head(action.status, action.headers, {"content-length": str(len(body))}))
        writer.write(body)
        await writer.drain()
        return True
    if isinstance(action, Stream):
        return await _stream(action, writer)
    if isinstance(action, Truncated):
        body = _bytes(action.body)
        length = str(len(body) + action.missing)
        writer.write(_head(action.status, action.headers, {"content-length": length}))
        writer.write(body)
        await writer.drain()
        return False
    if isinstance(action, Reset):
        _reset(writer)
        return False
    if isinstance(action, Hang):
        # Wait for the client to hang up (EOF) or for the server to stop (cancellation).
        while await reader.read(65536):
            pass
        return False
    raise TypeError(f"not an action: {action!r}")


async def _stream(action: Stream, writer: asyncio.StreamWriter) -> bool:
    writer.write(_head(action.status, action.headers, {"transfer-encoding": "chunked"}))
    await writer.drain()
    for item in action.chunks:
        if isinstance(item, asyncio.Event):
            await item.wait()
        elif isinstance(item, float | int):
            await asyncio.sleep(item)
        else:
            data = _bytes(item)
            if data:
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                await writer.drain()
    if action.end == "reset":
        _reset(writer)
        return False
    if action.end == "close":
        return False
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    return True


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
