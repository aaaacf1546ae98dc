"""LeanTransport's HTTP/1.1 against a raw-bytes server on 127.0.0.1, with h11 as the oracle.

Every test scripts the exact bytes the server writes (split into pieces, with pauses, then
optionally a close or a reset), so framing, keep-alive, retries, timeouts and the pool are pinned
on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import ipaddress
import itertools
import json
import socket
import ssl
import string
import struct
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal, TypeAlias

import h11
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_plugin.providers import lean as lean_module
from agent_plugin.providers.lean import LeanTransport

# --- a raw-bytes scripted server -----------------------------------------------------------------

Step: TypeAlias = bytes | float | asyncio.Event | Literal["close", "abort", "hang"]
"""``bytes`` are written (and drained), a ``float`` sleeps, an event is waited for; ``"close"``
closes the connection (FIN), ``"abort"`` resets it (RST), ``"hang"`` reads until the client
hangs up. After the last step the server waits for the next request on the connection."""

Steps: TypeAlias = Sequence[Step]
Script: TypeAlias = Steps | Callable[["Seen"], Steps]

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@dataclass(frozen=True)
class Seen:
    """One request as it arrived: the connection (1 for the first accepted), head and body."""

    connection: int
    head: bytes
    body: bytes

    @property
    def request_line(self) -> bytes:
        return self.head.split(b"\r\n", 1)[0]

    @property
    def path(self) -> bytes:
        return self.request_line.split(b" ")[1]

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        lines = self.head[:-4].split(b"\r\n")[1:]
        return [(name, value.strip()) for name, _, value in (x.partition(b":") for x in lines)]

    def header(self, name: bytes) -> list[bytes]:
        return [value for key, value in self.headers if key.lower() == name.lower()]


class RawServer:
    """Answers each request with the next queued script (or ``default``), byte for byte."""

    def __init__(
        self,
        *scripts: Script,
        default: Script = (OK,),
        tls: ssl.SSLContext | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.scripts: deque[Script] = deque(scripts)
        self.default = default
        self.tls = tls
        self.host = host
        self.requests: list[Seen] = []
        self.accepted = 0
        self.open = 0
        self.max_open = 0
        self.client_eof: dict[int, asyncio.Event] = {}
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._readers: dict[int, asyncio.StreamReader] = {}

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def paths(self) -> list[tuple[int, bytes]]:
        return [(seen.connection, seen.path) for seen in self.requests]

    async def saw_eof(self, connection: int, within: float = 1.0) -> bool:
        """Whether the client closed ``connection`` (within ``within`` seconds), even while the
        server was busy with a script and not reading."""
        reader = self._readers[connection]

        def closed() -> bool:
            eof = self.client_eof[connection].is_set() or reader.at_eof()
            return eof or reader.exception() is not None

        try:
            await wait_until(closed, within)
        except TimeoutError:
            return False
        return True

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._accept, self.host, 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for writer in list(self._writers):
            writer.transport.abort()
        for _ in range(3):  # let the client's side see the resets before the loop ends
            await asyncio.sleep(0)
        await self._server.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.client_eof[self.accepted] = asyncio.Event()
        self._readers[self.accepted] = reader
        task = asyncio.ensure_future(self._serve(self.accepted, reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(
        self, number: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        eof = self.client_eof[number]
        self.open += 1
        self.max_open = max(self.max_open, self.open)
        self._writers.add(writer)
        try:
            while True:
                seen = await _read_request(number, reader)
                if seen is None:
                    eof.set()
                    return
                self.requests.append(seen)
                script = self.scripts.popleft() if self.scripts else self.default
                for step in script(seen) if callable(script) else script:
                    if isinstance(step, bytes):
                        writer.write(step)
                        await writer.drain()
                    elif isinstance(step, float | int):
                        await asyncio.sleep(step)
                    elif isinstance(step, asyncio.Event):
                        await step.wait()
                    elif step == "abort":
                        _reset(writer)
                        return
                    elif step == "hang":
                        while await reader.read(65536):
                            pass
                        eof.set()
                        return
                    else:
                        return  # "close": FIN, in finally
        except (ConnectionError, ssl.SSLError):
            eof.set()
        finally:
            self.open -= 1
            self._writers.discard(writer)
            if not writer.transport.is_closing():
                writer.close()


async def _read_request(number: int, reader: asyncio.StreamReader) -> Seen | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    seen = Seen(number, head, b"")
    if [value.lower() for value in seen.header(b"transfer-encoding")] == [b"chunked"]:
        parts = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        await reader.readuntil(b"\r\n")
        body = b"".join(parts)
    else:
        body = await reader.readexactly(int((seen.header(b"content-length") or [b"0"])[0]))
    return Seen(number, head, body)


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def response(
    body: bytes = b"ok", status: bytes = b"200 OK", *headers: bytes, version: bytes = b"HTTP/1.1"
) -> bytes:
    """A response framed by Content-Length, with extra raw header lines."""
    lines = [version + b" " + status, *headers, b"Content-Length: %d" % len(body)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def chunked(*chunks: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


def in_pieces(wire: bytes, size: int, pause: float = 0.001) -> list[Step]:
    steps: list[Step] = []
    for start in range(0, len(wire), size):
        steps += [wire[start : start + size], pause]
    return steps


# --- client helpers ------------------------------------------------------------------------------

TIMEOUTS = {"connect": 2.0, "read": 2.0, "write": 2.0, "pool": 2.0}


def timeouts(**overrides: float) -> dict[str, float]:
    return {**TIMEOUTS, **overrides}


def build(
    url: str,
    method: str = "GET",
    *,
    content: bytes | AsyncIterator[bytes] | None = None,
    headers: dict[str, str] | None = None,
    timing: Mapping[str, float | None] | None = None,
) -> httpx.Request:
    return httpx.Request(
        method,
        url,
        content=content,
        headers=headers,
        extensions={"timeout": TIMEOUTS if timing is None else timing},
    )


async def read_raw(response: httpx.Response) -> bytes:
    """The body as it came off the wire (no content decoding); the response is closed."""
    try:
        return b"".join([piece async for piece in response.aiter_raw()])
    finally:
        await response.aclose()


async def fetch(
    transport: LeanTransport,
    url: str,
    method: str = "GET",
    *,
    content: bytes | AsyncIterator[bytes] | None = None,
    headers: dict[str, str] | None = None,
    timing: Mapping[str, float | None] | None = None,
) -> tuple[httpx.Response, bytes]:
    request = build(url, method, content=content, headers=headers, timing=timing)
    response = await transport.handle_async_request(request)
    return response, await read_raw(response)


async def wait_until(predicate: Callable[[], bool], within: float = 1.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not true within {within} s")
        await asyncio.sleep(0.001)


MakeLean = Callable[..., LeanTransport]


@pytest.fixture
async def make() -> AsyncIterator[MakeLean]:
    made: list[LeanTransport] = []

    def factory(**options: object) -> LeanTransport:
        transport = LeanTransport(**options)  # type: ignore[arg-type]
        made.append(transport)
        return transport

    yield factory
    for transport in made:
        await transport.aclose()


@pytest.fixture
async def lean(make: MakeLean) -> LeanTransport:
    return make()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# --- framing, with h11 as the oracle -------------------------------------------------------------

TOKEN = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"
NAMES = st.text(TOKEN, min_size=1, max_size=12).filter(
    lambda name: name.lower() not in {"connection", "content-length", "transfer-encoding"}
)
VCHAR = rb"[\x21-\x7e\x80-\xff]"
VALUES = st.from_regex(rb"(%s(([ \t]|%s){0,20}%s)?)?" % (VCHAR, VCHAR, VCHAR), fullmatch=True)
OWS = st.sampled_from([b"", b" ", b"\t", b"  "])
FIELDS = st.lists(st.tuples(NAMES.map(str.encode), VALUES, OWS, OWS), max_size=6)
Framing: TypeAlias = Literal["length", "chunked", "close"]


@dataclass(frozen=True)
class Generated:
    method: str
    wire: bytes
    closes: bool  # the server closes after the response (its body ends with the connection)
    reusable: bool  # the connection may carry the next request


def _field(name: bytes, value: bytes, before: bytes, after: bytes) -> bytes:
    return name + b":" + before + value + after + b"\r\n"


@st.composite
def generated_responses(draw: st.DrawFn) -> Generated:
    method = draw(st.sampled_from(["GET", "GET", "HEAD"]))
    status = draw(st.sampled_from([200, 201, 204, 304, 404, 500]))
    framing: Framing = draw(st.sampled_from(["length", "chunked", "close"]))
    version = b"1.1" if framing == "chunked" else draw(st.sampled_from([b"1.1", b"1.0"]))
    reason = draw(st.sampled_from([b"", b"OK", b"Not  Found", b"odd\treason \xe9"]))
    body = draw(st.binary(max_size=3000))
    fields = [_field(*field) for field in draw(FIELDS)]
    interim = [
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
    ]
    prefix = b"".join(draw(st.lists(st.sampled_from(interim), max_size=2)))
    has_body = method != "HEAD" and status not in (204, 304)
    payload = b""
    if framing == "length":
        name = draw(st.sampled_from([b"Content-Length", b"content-length", b"CONTENT-LENGTH"]))
        fields.insert(draw(st.integers(0, len(fields))), b"%s: %d\r\n" % (name, len(body)))
        payload = body
    elif framing == "chunked":
        value = draw(st.sampled_from([b"chunked", b"Chunked"]))
        fields.insert(draw(st.integers(0, len(fields))), b"Transfer-Encoding: " + value + b"\r\n")
        cuts = sorted(draw(st.sets(st.integers(1, max(1, len(body) - 1)), max_size=5)))
        edges = [0, *(cut for cut in cuts if cut < len(body)), len(body)]
        for start, end in itertools.pairwise(edges):
            if end > start:
                size = draw(st.sampled_from([b"%x", b"%X", b"%04x"])) % (end - start)
                extension = draw(st.sampled_from([b"", b";a=b", b';name="q;v"', b";x"]))
                payload += size + extension + b"\r\n" + body[start:end] + b"\r\n"
        payload += draw(st.sampled_from([b"0", b"000", b"0;last=1"])) + b"\r\n"
        trailers = draw(st.lists(st.tuples(NAMES.map(str.encode), VALUES), max_size=2))
        payload += b"".join(_field(name, value, b" ", b"") for name, value in trailers)
        payload += b"\r\n"
    else:
        payload = body
    status_line = b"HTTP/%s %d" % (version, status) + (b" " + reason if reason else b"")
    head = prefix + status_line + b"\r\n" + b"".join(fields) + b"\r\n"
    wire = head + (payload if has_body else b"")
    closes = framing == "close" and has_body
    return Generated(method, wire, closes, reusable=version == b"1.1" and not closes)


def h11_parse(method: str, wire: bytes) -> tuple[h11.Response, bytes]:
    """What h11, as a client that sent ``method``, makes of ``wire`` followed by EOF."""
    connection = h11.Connection(h11.CLIENT)
    connection.send(h11.Request(method=method, target="/", headers=[("Host", "example")]))
    connection.send(h11.EndOfMessage())
    connection.receive_data(wire)
    connection.receive_data(b"")
    final: h11.Response | None = None
    body = bytearray()
    while True:
        event = connection.next_event()
        if isinstance(event, h11.Response):
            final = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert final is not None
            return final, bytes(body)
        elif not isinstance(event, h11.InformationalResponse):
            raise AssertionError(f"h11 did not expect {event!r}")


def _te_lowered(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [
        (name, value.lower() if name.lower() == b"transfer-encoding" else value)
        for name, value in headers
    ]


async def _lean_parse(case: Generated, cuts: list[int]) -> tuple[httpx.Response, bytes, bool]:
    steps: list[Step] = []
    for start, end in zip([0, *cuts], [*cuts, len(case.wire)], strict=True):
        steps += [case.wire[start:end], 0.001]
    if case.closes:
        steps.append("close")
    async with RawServer(steps) as server:
        transport = LeanTransport()
        try:
            answer, body = await fetch(transport, server.url + "/", case.method)
            second, _ = await fetch(transport, server.url + "/")
            assert second.status_code == 200
        finally:
            await transport.aclose()
        return answer, body, server.accepted == 1


@settings(max_examples=50, deadline=None)
@given(case=generated_responses(), data=st.data())
def test_generated_responses_parse_as_h11_parses_them(case: Generated, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(1, len(case.wire) - 1), max_size=8)))
    expected, expected_body = h11_parse(case.method, case.wire)
    answer, body, reused = asyncio.run(_lean_parse(case, cuts))
    assert answer.status_code == expected.status_code
    assert answer.extensions["reason_phrase"] == expected.reason
    assert answer.extensions["http_version"] == b"HTTP/" + expected.http_version
    # h11 lower-cases the value of Transfer-Encoding; LeanTransport passes it as it came
    assert _te_lowered(answer.headers.raw) == list(expected.headers.raw_items())
    assert body == expected_body
    assert reused is case.reusable


async def test_head_response_has_no_body_and_keeps_the_connection(lean: LeanTransport) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"
    chunked_head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    async with RawServer((head,), (chunked_head,), (OK,)) as server:
        answer, body = await fetch(lean, server.url, "HEAD")
        assert (answer.status_code, answer.headers["content-length"], body) == (200, "100", b"")
        answer, body = await fetch(lean, server.url, "HEAD")
        assert (answer.status_code, body) == (200, b"")
        answer, body = await fetch(lean, server.url)
        assert body == b"ok"
    assert server.accepted == 1


@pytest.mark.parametrize("status", [b"204 No Content", b"304 Not Modified"])
async def test_204_and_304_have_no_body_whatever_content_length_says(
    lean: LeanTransport, status: bytes
) -> None:
    head = b"HTTP/1.1 " + status + b"\r\nContent-Length: 7\r\n\r\n"
    async with RawServer((head,)) as server:
        _, body = await fetch(lean, server.url)
        assert body == b""
        _, body = await fetch(lean, server.url)
        assert body == b"ok"
    assert server.accepted == 1


async def test_interim_1xx_answers_are_skipped(lean: LeanTransport) -> None:
    wire = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nX-Final: yes\r\nContent-Length: 4\r\n\r\ndone"
    )
    async with RawServer(in_pieces(wire, 7)) as server:
        answer, body = await fetch(lean, server.url, "POST", content=b"x")
    assert answer.status_code == 201
    assert answer.headers.raw == [(b"X-Final", b"yes"), (b"Content-Length", b"4")]
    assert body == b"done"


async def test_101_switching_protocols_is_a_protocol_error(lean: LeanTransport) -> None:
    wire = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
    async with RawServer((wire,)) as server:
        with pytest.raises(httpx.RemoteProtocolError, match="switched protocols"):
            await fetch(lean, server.url)
        assert await server.saw_eof(1)  # the connection is not kept


async def test_response_metadata_and_header_order(lean: LeanTransport) -> None:
    wire = response(
        b"{}",
        b"404 Not Found Here",
        b"X-B: 2",
        b"x-a:1  ",
        b"Set-Cookie: a=1",
        b"Set-Cookie: b=2",
        b"X-Empty:",
    )
    async with RawServer((wire,)) as server:
        answer, body = await fetch(lean, server.url)
    assert answer.status_code == 404
    assert answer.reason_phrase == "Not Found Here"
    assert answer.http_version == "HTTP/1.1"
    assert answer.headers.raw == [
        (b"X-B", b"2"),
        (b"x-a", b"1"),
        (b"Set-Cookie", b"a=1"),
        (b"Set-Cookie", b"b=2"),
        (b"X-Empty", b""),
        (b"Content-Length", b"2"),
    ]
    assert answer.headers.get_list("set-cookie") == ["a=1", "b=2"]
    assert body == b"{}"


async def test_status_line_without_reason(lean: LeanTransport) -> None:
    async with RawServer((b"HTTP/1.1 500\r\nContent-Length: 1\r\n\r\nx",)) as server:
        answer, body = await fetch(lean, server.url)
    assert (answer.status_code, answer.extensions["reason_phrase"], body) == (500, b"", b"x")


async def test_chunked_body_with_extensions_and_trailers(lean: LeanTransport) -> None:
    wire = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'5;a=b\r\nhello\r\nA; name="v;w"\r\n, world!!!\r\n0\r\nX-Trailer: t\r\nX-Two: 2\r\n\r\n'
    )
    async with RawServer(in_pieces(wire, 3)) as server:
        _, body = await fetch(lean, server.url)
        assert body == b"hello, world!!!"
        _, body = await fetch(lean, server.url)
        assert body == b"ok"
    assert server.accepted == 1  # the trailers were consumed: the connection is clean


async def test_gzip_content_encoding_is_decoded_by_aread(lean: LeanTransport) -> None:
    text = b"hello gzip " * 200
    wire = response(gzip.compress(text), b"200 OK", b"Content-Encoding: gzip")
    async with RawServer(in_pieces(wire, 500)) as server:
        answer = await lean.handle_async_request(build(server.url))
        try:
            assert await answer.aread() == text
        finally:
            await answer.aclose()


# --- keep-alive ----------------------------------------------------------------------------------


async def test_sequential_requests_reuse_one_connection(lean: LeanTransport) -> None:
    async with RawServer() as server:
        for _ in range(3):
            _, body = await fetch(lean, server.url + "/x", "POST", content=b"abc")
            assert body == b"ok"
    assert server.accepted == 1
    assert [seen.body for seen in server.requests] == [b"abc"] * 3


@pytest.mark.parametrize(
    ("first", "reused"),
    [
        pytest.param(response(b"ok", b"200 OK", b"Connection: close"), False, id="close"),
        pytest.param(
            response(b"ok", b"200 OK", b"connection: Keep-Alive, CLOSE"), False, id="CLOSE"
        ),
        pytest.param(response(version=b"HTTP/1.0"), False, id="1.0"),
        pytest.param(
            response(b"ok", b"200 OK", b"Connection: keep-alive", version=b"HTTP/1.0"),
            True,
            id="1.0-keep-alive",
        ),
        pytest.param(response(b"ok", b"200 OK", b"Connection: keep-alive"), True, id="1.1"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n"
            b"2\r\nok\r\n0\r\n\r\n",
            False,
            id="te-and-cl",
        ),
        pytest.param(OK + b"extra", False, id="stray-bytes-after-body"),
    ],
)
async def test_connection_reuse_follows_the_response(
    lean: LeanTransport, first: bytes, reused: bool
) -> None:
    async with RawServer((first,)) as server:  # the server itself never closes here
        _, body = await fetch(lean, server.url)
        assert body == b"ok"
        _, body = await fetch(lean, server.url)
        assert body == b"ok"
        assert server.accepted == (1 if reused else 2)
        if not reused:
            assert await server.saw_eof(1)  # and the first connection is closed, not leaked


async def test_close_delimited_body_is_read_to_the_end_and_not_reused(lean: LeanTransport) -> None:
    wire = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + b"x" * 5000
    async with RawServer([*in_pieces(wire, 1000), "close"]) as server:
        _, body = await fetch(lean, server.url)
        assert body == b"x" * 5000
        _, body = await fetch(lean, server.url)
        assert body == b"ok"
    assert server.accepted == 2


async def test_unread_body_closed_early_closes_the_connection(lean: LeanTransport) -> None:
    async with RawServer((response(b"y" * 100_000),)) as server:
        answer = await lean.handle_async_request(build(server.url))
        async for _ in answer.aiter_raw():
            break
        await answer.aclose()
        assert await server.saw_eof(1)
        _, body = await fetch(lean, server.url)
        assert body == b"ok"
    assert server.accepted == 2


async def test_response_not_read_at_all_then_closed(lean: LeanTransport) -> None:
    async with RawServer((response(b"z" * 10),)) as server:
        answer = await lean.handle_async_request(build(server.url))
        await answer.aclose()
        await answer.aclose()  # twice is harmless
        assert await server.saw_eof(1)
        _, body = await fetch(lean, server.url)
        assert body == b"ok"
    assert server.accepted == 2


# --- stale connections ---------------------------------------------------------------------------


async def test_idle_connection_closed_by_the_server_is_replaced(lean: LeanTransport) -> None:
    async with RawServer((OK, "close")) as server:
        await fetch(lean, server.url + "/1")
        await asyncio.sleep(0.02)  # the client sees the FIN while the connection is idle
        _, body = await fetch(lean, server.url + "/2")
        assert body == b"ok"
    assert server.paths() == [(1, b"/1"), (2, b"/2")]


@pytest.mark.parametrize("end", ["close", "abort"])
async def test_reused_connection_closed_before_answering_is_retried_once(
    lean: LeanTransport, end: Literal["close", "abort"]
) -> None:
    async with RawServer((OK,), (end,)) as server:
        await fetch(lean, server.url + "/1")
        _, body = await fetch(lean, server.url + "/2", "POST", content=b"once")
        assert body == b"ok"
    assert server.paths() == [(1, b"/1"), (1, b"/2"), (2, b"/2")]


@pytest.mark.parametrize(
    ("end", "error"),
    [("close", httpx.RemoteProtocolError), ("abort", httpx.ReadError)],
)
async def test_fresh_connection_closed_before_answering_is_not_retried(
    lean: LeanTransport, end: Literal["close", "abort"], error: type[Exception]
) -> None:
    async with RawServer((end,)) as server:
        with pytest.raises(error):
            await fetch(lean, server.url, "POST", content=b"x")
    assert server.paths() == [(1, b"/")]


@pytest.mark.parametrize(
    "partial",
    [b"H", b"HTTP/1.1 200 OK\r\nContent-Le", b"HTTP/1.1 100 Continue\r\n\r\n"],
)
async def test_reused_connection_closed_mid_answer_is_not_retried(
    lean: LeanTransport, partial: bytes
) -> None:
    async with RawServer((OK,), (partial, "close")) as server:
        await fetch(lean, server.url + "/1")
        with pytest.raises(httpx.RemoteProtocolError):
            await fetch(lean, server.url + "/2", "POST", content=b"x")
    assert server.paths() == [(1, b"/1"), (1, b"/2")]  # seen once: no retry


async def test_a_post_the_server_held_before_closing_is_not_sent_again(
    lean: LeanTransport, monkeypatch: pytest.MonkeyPatch
) -> None:
    # past the stale window the server may have acted on it: the caller's retry policy decides
    monkeypatch.setattr(lean_module, "_STALE_WINDOW", 0.05)
    async with RawServer((OK,), (0.15, "close")) as server:
        await fetch(lean, server.url + "/1")
        with pytest.raises(httpx.RemoteProtocolError):
            await fetch(lean, server.url + "/2", "POST", content=b"x")
    assert server.paths() == [(1, b"/1"), (1, b"/2")]


async def test_an_idempotent_request_is_sent_again_even_after_the_window(
    lean: LeanTransport, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lean_module, "_STALE_WINDOW", 0.05)
    async with RawServer((OK,), (0.15, "close")) as server:
        await fetch(lean, server.url + "/1")
        _, body = await fetch(lean, server.url + "/2")
    assert body == b"ok"
    assert server.paths() == [(1, b"/1"), (1, b"/2"), (2, b"/2")]


async def test_connections_idle_past_the_expiry_close_while_newer_ones_serve(
    make: MakeLean,
) -> None:
    transport = make(keepalive_expiry=0.1)
    release = asyncio.Event()
    async with RawServer((release, OK), (release, OK), (release, OK)) as server:
        burst = [asyncio.create_task(fetch(transport, server.url)) for _ in range(3)]
        await wait_until(lambda: len(server.requests) == 3)
        release.set()
        await asyncio.gather(*burst)
        for _ in range(5):  # steady traffic keeps reusing the newest connection
            await fetch(transport, server.url)
            await asyncio.sleep(0.04)
        closed = [await server.saw_eof(n, within=0.3) for n in (1, 2, 3)]
    assert sorted(closed) == [False, True, True]


async def test_stale_retry_happens_once_on_a_fresh_connection(make: MakeLean) -> None:
    release = asyncio.Event()

    def script(seen: Seen) -> Steps:
        if seen.path == b"/warm":
            return (release, OK)
        return ("close",) if seen.connection <= 3 else (OK,)  # kept-alive ones all went stale

    transport = make(max_connections=3)
    async with RawServer(default=script) as server:
        warm = [asyncio.create_task(fetch(transport, server.url + "/warm")) for _ in range(3)]
        await wait_until(lambda: len(server.requests) == 3)
        release.set()
        await asyncio.gather(*warm)
        assert server.accepted == 3
        _, body = await fetch(transport, server.url + "/post", "POST", content=b"x")
        assert body == b"ok"
        posts = [connection for connection, path in server.paths() if path == b"/post"]
        assert posts == [3, 4]  # the newest idle one, then a new connection: not [3, 2, 1, 4]
        assert await server.saw_eof(1)  # the ones idle as long were dropped too
        assert await server.saw_eof(2)


# --- keep-alive expiry ---------------------------------------------------------------------------


async def test_idle_connection_expires(make: MakeLean) -> None:
    transport = make(keepalive_expiry=0.05)
    async with RawServer() as server:
        await fetch(transport, server.url)
        await fetch(transport, server.url)
        assert server.accepted == 1
        await asyncio.sleep(0.1)
        await fetch(transport, server.url)
        assert server.accepted == 2
        assert await server.saw_eof(1)  # the expired one was closed when it was found


async def test_keepalive_expiry_zero_never_reuses(make: MakeLean) -> None:
    transport = make(keepalive_expiry=0)
    async with RawServer() as server:
        await fetch(transport, server.url)
        await asyncio.sleep(0.001)
        await fetch(transport, server.url)
    assert server.accepted == 2


# --- the pool bound ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_connections": 0}, "max_connections"),
        ({"max_connections": -1}, "max_connections"),
        ({"keepalive_expiry": -0.1}, "keepalive_expiry"),
    ],
)
def test_invalid_options(options: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LeanTransport(**options)  # type: ignore[arg-type]


async def test_third_request_waits_for_a_free_connection(make: MakeLean) -> None:
    transport = make(max_connections=2)
    release = asyncio.Event()
    async with RawServer((release, OK), (release, OK)) as server:
        tasks = [asyncio.create_task(fetch(transport, server.url + f"/{n}")) for n in range(3)]
        await wait_until(lambda: len(server.requests) == 2)
        await asyncio.sleep(0.05)
        assert len(server.requests) == 2
        assert not any(task.done() for task in tasks)
        release.set()
        for _, body in await asyncio.gather(*tasks):
            assert body == b"ok"
    assert (server.accepted, server.max_open) == (2, 2)  # the third reused a freed connection


async def test_pool_timeout_while_connections_are_busy(make: MakeLean) -> None:
    transport = make(max_connections=2)
    release = asyncio.Event()
    async with RawServer((release, OK), (release, OK)) as server:
        busy = [asyncio.create_task(fetch(transport, server.url)) for _ in range(2)]
        await wait_until(lambda: len(server.requests) == 2)
        started = time.monotonic()
        with pytest.raises(httpx.PoolTimeout):
            await fetch(transport, server.url, timing=httpx.Timeout(2.0, pool=0.05).as_dict())
        assert 0.04 <= time.monotonic() - started < 0.5
        release.set()
        await asyncio.gather(*busy)
        assert len(server.requests) == 2


async def test_no_bound_with_max_connections_none(make: MakeLean) -> None:
    transport = make(max_connections=None)
    release = asyncio.Event()
    async with RawServer(default=(release, OK)) as server:
        tasks = [asyncio.create_task(fetch(transport, server.url)) for _ in range(6)]
        await wait_until(lambda: len(server.requests) == 6)
        release.set()
        await asyncio.gather(*tasks)
    assert server.max_open == 6


async def test_slots_are_given_back_after_every_kind_of_failure(make: MakeLean) -> None:
    transport = make(max_connections=2)
    release = asyncio.Event()
    routes: dict[bytes, Steps] = {
        b"/close": ("close",),
        b"/reset": ("abort",),
        b"/hang": ("hang",),
        b"/cut": (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "close"),
        b"/big": (response(b"b" * 200_000),),
        b"/101": (b"HTTP/1.1 101 Switching Protocols\r\n\r\n",),
        b"/garbage": (b"NOT HTTP\r\n\r\n",),
        b"/bad-length": (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",),
        b"/hold": (release, OK),
    }
    fast = timeouts(read=0.05, pool=0.05)
    async with RawServer(default=lambda seen: routes[seen.path]) as server:
        url = server.url
        for _ in range(2):
            for path in [b"/close", b"/reset", b"/101", b"/garbage", b"/bad-length"]:
                with pytest.raises(httpx.TransportError):
                    await fetch(transport, url + path.decode(), timing=fast)
            with pytest.raises(httpx.ReadTimeout):
                await fetch(transport, url + "/hang", timing=fast)
            with pytest.raises(httpx.RemoteProtocolError):
                await fetch(transport, url + "/cut", timing=fast)
            answer = await transport.handle_async_request(build(url + "/big", timing=fast))
            await answer.aclose()  # unread
            with pytest.raises(httpx.LocalProtocolError):
                await fetch(transport, url, headers={"x-bad": "a\nb"}, timing=fast)
            with pytest.raises(httpx.ConnectError):
                await fetch(transport, f"http://127.0.0.1:{free_port()}/", timing=fast)
            held = asyncio.create_task(fetch(transport, url + "/hold", timing=fast))
            await wait_until(lambda: server.requests[-1].path == b"/hold")
            held.cancel()
            with pytest.raises(asyncio.CancelledError):
                await held
            busy = [asyncio.create_task(fetch(transport, url + "/hold")) for _ in range(2)]
            await wait_until(lambda: [s.path for s in server.requests[-2:]] == [b"/hold"] * 2)
            with pytest.raises(httpx.PoolTimeout):
                await fetch(transport, url + "/close", timing=fast)
            release.set()
            await asyncio.gather(*busy)
            release.clear()
        # both slots are free: two held requests reach the server at once
        busy = [asyncio.create_task(fetch(transport, url + "/hold", timing=fast)) for _ in "ab"]
        await wait_until(lambda: [s.path for s in server.requests[-2:]] == [b"/hold"] * 2)
        release.set()
        await asyncio.gather(*busy)


async def test_many_concurrent_requests_share_a_bounded_pool(make: MakeLean) -> None:
    transport = make(max_connections=8)

    def answer(seen: Seen) -> Steps:
        body = seen.path * 50
        if int(seen.path[1:]) % 2:
            return in_pieces(chunked(body[:30], body[30:]), 40)
        return in_pieces(response(body), 64)

    async with RawServer(default=answer) as server:
        results = await asyncio.gather(*(fetch(transport, f"{server.url}/{n}") for n in range(200)))
    assert [body for _, body in results] == [f"/{n}".encode() * 50 for n in range(200)]
    assert server.max_open <= 8
    assert server.accepted <= 8  # every connection was reused, none wasted


async def test_cancellation_storm_leaves_no_slot_behind(make: MakeLean) -> None:
    transport = make(max_connections=4)
    release = asyncio.Event()

    def answer(seen: Seen) -> Steps:
        if seen.path == b"/hold":
            return (release, OK)
        return in_pieces(response(b"s" * 300), 50, pause=0.002)

    async with RawServer(default=answer) as server:
        tasks = [asyncio.create_task(fetch(transport, f"{server.url}/{n}")) for n in range(60)]
        for n, task in enumerate(tasks):
            if n % 3:
                await asyncio.sleep(0.001 * (n % 5))
                task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:  # cancelled, or complete and whole
            if not isinstance(result, asyncio.CancelledError):
                assert isinstance(result, tuple)
                assert result[1] == b"s" * 300
        held = [asyncio.create_task(fetch(transport, server.url + "/hold")) for _ in range(4)]
        await wait_until(lambda: sum(seen.path == b"/hold" for seen in server.requests) == 4)
        release.set()
        await asyncio.gather(*held)


# --- timeouts ------------------------------------------------------------------------------------


async def test_read_timeout_waiting_for_the_head(lean: LeanTransport) -> None:
    async with RawServer(("hang",)) as server:
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            await fetch(lean, server.url, timing=timeouts(read=0.1))
        assert 0.09 <= time.monotonic() - started < 0.6
        assert await server.saw_eof(1)


@pytest.mark.parametrize(
    "partial",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
        b"HTTP/1.1 200 OK\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nContent-Le",
    ],
    ids=["length", "chunked", "close-delimited", "head"],
)
async def test_read_timeout_between_pieces(lean: LeanTransport, partial: bytes) -> None:
    async with RawServer((partial, "hang")) as server:
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            await fetch(lean, server.url, timing=timeouts(read=0.1))
        assert 0.09 <= time.monotonic() - started < 0.6
        assert await server.saw_eof(1)


async def test_read_timeout_is_per_read_not_for_the_whole_body(lean: LeanTransport) -> None:
    wire = response(b"abcdefgh")
    async with RawServer(in_pieces(wire, 8, pause=0.04)) as server:
        _, body = await fetch(lean, server.url, timing=timeouts(read=0.15))
    assert body == b"abcdefgh"  # ~0.3 s in all, each wait under 0.15 s


async def test_an_unread_body_stops_the_socket_being_read(lean: LeanTransport) -> None:
    body = bytes(range(256)) * (8 * 4096)  # 8 MiB
    async with RawServer((response(body),)) as server:
        answer = await lean.handle_async_request(build(server.url))
        stream = answer.stream
        assert isinstance(stream, lean_module._Body)
        await asyncio.sleep(0.2)  # the server writes as fast as it may
        assert len(stream._connection.buffer) < 2 * lean_module._READ_AHEAD
        assert await read_raw(answer) == body  # reading resumes, nothing lost


async def test_a_host_idna_cannot_encode_is_a_connect_error(lean: LeanTransport) -> None:
    with pytest.raises(httpx.ConnectError):
        await fetch(lean, f"http://{'a' * 64}.example/")


async def test_connection_refused_is_a_connect_error(lean: LeanTransport) -> None:
    with pytest.raises(httpx.ConnectError):
        await fetch(lean, f"http://127.0.0.1:{free_port()}/")


async def test_unknown_host_is_a_connect_error(lean: LeanTransport) -> None:
    # a resolver that does not answer within the connect timeout makes it a ConnectTimeout
    with pytest.raises((httpx.ConnectError, httpx.ConnectTimeout)):
        await fetch(lean, "http://no-such-host.invalid/", timing=timeouts(connect=1.0))


async def test_connect_timeout_when_the_backlog_is_full(lean: LeanTransport) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers: list[socket.socket] = []
        try:
            for _ in range(8):  # fill the accept queue until a connect attempt stalls
                filler = socket.socket()
                fillers.append(filler)
                filler.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    filler.connect(("127.0.0.1", port))
                await asyncio.sleep(0.01)
                if filler.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 and not _connected(
                    filler
                ):
                    break
            else:
                pytest.skip("the kernel accepts every connection: cannot provoke a timeout")
            started = time.monotonic()
            with pytest.raises(httpx.ConnectTimeout):
                await fetch(lean, f"http://127.0.0.1:{port}/", timing=timeouts(connect=0.1))
            assert 0.09 <= time.monotonic() - started < 0.6
        finally:
            for filler in fillers:
                filler.close()


def _connected(sock: socket.socket) -> bool:
    try:
        sock.getpeername()
    except OSError:
        return False
    return True


async def test_write_timeout_when_the_server_does_not_read(lean: LeanTransport) -> None:
    stalled = asyncio.Event()

    async def never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await stalled.wait()
        writer.close()

    server = await asyncio.start_server(never_read, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        started = time.monotonic()
        with pytest.raises(httpx.WriteTimeout):
            await fetch(
                lean,
                f"http://127.0.0.1:{port}/",
                "POST",
                content=b"w" * 32_000_000,  # more than the socket buffers take
                timing=timeouts(write=0.1),
            )
        assert time.monotonic() - started < 1.5
    finally:
        stalled.set()
        server.close()
        await asyncio.sleep(0.01)
        await server.wait_closed()


async def test_a_write_timeout_drops_the_unsent_bytes_at_once(lean: LeanTransport) -> None:
    # close() would keep the socket and ~30 MB of buffers until the server read them all
    stalled = asyncio.Event()
    received: list[int] = []

    async def read_late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await stalled.wait()
        total = 0
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(1 << 20):
                total += len(chunk)
        received.append(total)
        writer.close()

    server = await asyncio.start_server(read_late, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(httpx.WriteTimeout):
            await fetch(
                lean,
                f"http://127.0.0.1:{port}/",
                "POST",
                content=b"w" * 32_000_000,
                timing=timeouts(write=0.1),
            )
        stalled.set()
        await wait_until(lambda: bool(received), within=2.0)
        assert received[0] < 32_000_000  # the rest was dropped, not sent on after the error
    finally:
        stalled.set()
        server.close()
        await server.wait_closed()


# --- protocol errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "wire",
    [
        b"FOO 200 OK\r\n\r\n",
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 20 OK\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 -20 OK\r\n\r\n",
        b"HTTP/1.1  200 OK\r\n\r\n",
        b"http/1.1 200 OK\r\n\r\n",
        b"HTTP/1.2 200 OK\r\n\r\n",
        b"ICY 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nNoColon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad Name: v\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nName : v\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n: empty-name\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n folded-first: v\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0x1\r\n\r\nx",
    ],
)
async def test_malformed_head_is_a_remote_protocol_error(lean: LeanTransport, wire: bytes) -> None:
    async with RawServer((wire,)) as server:
        with pytest.raises(httpx.RemoteProtocolError):
            await fetch(lean, server.url)
        _, body = await fetch(lean, server.url)  # the transport is still usable
        assert body == b"ok"
    assert server.accepted == 2


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\nx",
    ],
    ids=["conflicting", "not-a-number"],
)
async def test_rejected_content_length_closes_the_connection(
    lean: LeanTransport, wire: bytes
) -> None:
    async with RawServer((wire,)) as server:
        with pytest.raises(httpx.RemoteProtocolError):
            await fetch(lean, server.url)
        assert await server.saw_eof(1, within=0.2)


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/1.1 099 Odd\r\n\r\n" + OK,
        b"HTTP/1.1 000 Zero\r\n\r\n" + OK,
    ],
    ids=["099", "000"],
)
async def test_status_below_100_is_a_protocol_error(lean: LeanTransport, wire: bytes) -> None:
    async with RawServer((wire,)) as server:
        with pytest.raises(httpx.RemoteProtocolError):
            await fetch(lean, server.url)


@pytest.mark.parametrize(
    "line",
    [b"X-Nul: a\x00b", b"X-Lf: a\nInjected: yes", b"X-Cr: a\rb"],
    ids=["nul", "bare-lf", "bare-cr"],
)
async def test_control_characters_in_a_response_header_value(
    lean: LeanTransport, line: bytes
) -> None:
    async with RawServer((response(b"ok", b"200 OK", line),)) as server:
        try:
            answer, _ = await fetch(lean, server.url)
        except httpx.RemoteProtocolError:
            return
    for _, value in answer.headers.raw:
        assert not {0, 10, 13} & set(value)


async def test_obsolete_line_folding_is_unfolded_like_h11(lean: LeanTransport) -> None:
    wire = b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n  b\r\nContent-Length: 2\r\n\r\nok"
    expected, _ = h11_parse("GET", wire)
    async with RawServer((wire,)) as server:
        answer, _ = await fetch(lean, server.url)
    assert answer.headers["x-folded"] == expected.headers[0][1].decode()


FILLER = b"X-Filler: " + b"f" * 1000 + b"\r\n"


async def test_head_larger_than_64_kib_is_rejected(lean: LeanTransport) -> None:
    head = b"HTTP/1.1 200 OK\r\n" + FILLER * 70  # its end has not come yet
    steps = [*in_pieces(head, 8192), 0.05, b"Content-Length: 0\r\n\r\n"]
    async with RawServer(steps) as server:
        with pytest.raises(httpx.RemoteProtocolError, match="64 KiB"):
            await fetch(lean, server.url)
        assert await server.saw_eof(1)


async def test_head_larger_than_64_kib_is_rejected_even_when_complete(
    lean: LeanTransport,
) -> None:
    head = b"HTTP/1.1 200 OK\r\n" + FILLER * 70 + b"Content-Length: 2\r\n\r\nok"
    # 8 pieces of 8 KiB (exactly 64 KiB, so never more than the bound without an end), then
    # the rest with the end: the head is ~71 KB
    steps = [*in_pieces(head[:65536], 8192, pause=0.005), head[65536:]]
    async with RawServer(steps) as server:
        with pytest.raises(httpx.RemoteProtocolError, match="64 KiB"):
            await fetch(lean, server.url)


async def test_head_just_under_the_limit_is_fine(lean: LeanTransport) -> None:
    wire = b"HTTP/1.1 200 OK\r\n" + FILLER * 60 + b"Content-Length: 2\r\n\r\nok"
    async with RawServer(in_pieces(wire, 8192)) as server:
        answer, body = await fetch(lean, server.url)
    assert (len(answer.headers.get_list("x-filler")), body) == (60, b"ok")


async def test_lf_only_line_endings_are_not_accepted(lean: LeanTransport) -> None:
    async with RawServer((b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", "close")) as server:
        with pytest.raises(httpx.RemoteProtocolError):
            await fetch(lean, server.url)


@pytest.mark.parametrize(
    "chunks",
    [
        b"zz\r\nhello\r\n0\r\n\r\n",
        b"0x5\r\nhello\r\n0\r\n\r\n",
        b"+5\r\nhello\r\n0\r\n\r\n",
        b"-5\r\nhello\r\n0\r\n\r\n",
        b"1_0\r\nhello\r\n0\r\n\r\n",
        b" 5\r\nhello\r\n0\r\n\r\n",
        b"5 5\r\nhello\r\n0\r\n\r\n",
        b"\r\nhello\r\n0\r\n\r\n",
        b"12345678901234567\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhelloXX\r\n0\r\n\r\n",
        b"5\r\nhello0\r\n\r\n",
        b"5\r\nhello",
        b"5\r\nhel",
        b"5\r\nhello\r\n0\r\nX-Trailer: t\r\n",
        b"5\r\nhello\r\n",
        b"5" + b"0" * 5000,
    ],
)
async def test_malformed_chunked_body_is_a_remote_protocol_error(
    lean: LeanTransport, chunks: bytes
) -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    async with RawServer((head, *in_pieces(chunks, 1000), "close")) as server:
        answer = await lean.handle_async_request(build(server.url))
        with pytest.raises(httpx.RemoteProtocolError):
            await read_raw(answer)
        _, body = await fetch(lean, server.url)
        assert body == b"ok"
    assert server.accepted == 2


@pytest.mark.parametrize("end", ["close", "abort"])
async def test_eof_mid_body_with_content_length(
    lean: LeanTransport, end: Literal["close", "abort"]
) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"
    async with RawServer((head, 0.01, end)) as server:
        answer = await lean.handle_async_request(build(server.url))
        assert answer.status_code == 200
        error = httpx.RemoteProtocolError if end == "close" else httpx.ReadError
        with pytest.raises(error):
            await read_raw(answer)


async def test_reset_ends_a_close_delimited_body_with_a_read_error(lean: LeanTransport) -> None:
    async with RawServer((b"HTTP/1.1 200 OK\r\n\r\nabc", 0.01, "abort")) as server:
        answer = await lean.handle_async_request(build(server.url))
        with pytest.raises(httpx.ReadError):
            await read_raw(answer)


async def test_duplicate_equal_content_lengths_are_accepted(lean: LeanTransport) -> None:
    wire = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2, 2\r\n\r\nok"
    async with RawServer((wire,)) as server:
        _, body = await fetch(lean, server.url)
    assert body == b"ok"


@pytest.mark.parametrize("codings", [b"gzip, chunked", b"identity", b"chunked, chunked"])
async def test_transfer_codings_other_than_chunked_are_refused(
    lean: LeanTransport, codings: bytes
) -> None:
    # h11 refuses them too: read as chunked, "gzip, chunked" would hand over compressed bytes
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: " + codings + b"\r\n\r\n" + chunked(b"ok")
    async with RawServer((wire,)) as server:
        with pytest.raises(httpx.RemoteProtocolError, match="Transfer-Encoding"):
            await lean.handle_async_request(build(server.url))
        assert await server.saw_eof(1)


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x", "ws://127.0.0.1/x", "file:///etc/hosts"])
async def test_unsupported_scheme(lean: LeanTransport, url: str) -> None:
    with pytest.raises(httpx.UnsupportedProtocol):
        await lean.handle_async_request(build(url))


async def test_missing_host(lean: LeanTransport) -> None:
    with pytest.raises(httpx.UnsupportedProtocol):
        await lean.handle_async_request(build("http:///path"))


# --- the request on the wire ---------------------------------------------------------------------


async def test_request_head_and_body_on_the_wire(lean: LeanTransport) -> None:
    async with RawServer() as server:
        await fetch(lean, server.url + "/path?q=1", "POST", content=b"hello")
    [seen] = server.requests
    assert seen.head == (
        b"POST /path?q=1 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: 5\r\n\r\n" % server.port
    )
    assert seen.body == b"hello"


async def test_request_headers_are_sent_in_order_with_their_case(lean: LeanTransport) -> None:
    async with RawServer() as server:
        request = build(server.url + "/", "PUT", content=b"{}")
        request.headers["X-Custom"] = "Value With Spaces"
        request.headers["authorization"] = "Bearer t"
        await read_raw(await lean.handle_async_request(request))
    [seen] = server.requests
    assert seen.request_line == b"PUT / HTTP/1.1"
    assert seen.headers == [
        (b"Host", b"127.0.0.1:%d" % server.port),
        (b"Content-Length", b"2"),
        (b"X-Custom", b"Value With Spaces"),
        (b"authorization", b"Bearer t"),
    ]


@pytest.mark.parametrize(
    ("method", "length"),
    [("GET", None), ("HEAD", None), ("DELETE", b"0"), ("POST", b"0"), ("PUT", b"0")],
)
async def test_empty_body_content_length(
    lean: LeanTransport, method: str, length: bytes | None
) -> None:
    async with RawServer((response(b""),)) as server:
        await fetch(lean, server.url, method)
    [seen] = server.requests
    assert seen.header(b"content-length") == ([] if length is None else [length])


async def test_streamed_body_is_sent_whole_with_a_content_length(lean: LeanTransport) -> None:
    async def pieces() -> AsyncIterator[bytes]:
        for piece in (b"ab", b"", b"cde", b"f" * 10_000):
            await asyncio.sleep(0)
            yield piece

    async with RawServer() as server:
        request = build(server.url + "/up", "POST", content=pieces())
        assert request.headers["transfer-encoding"] == "chunked"  # what httpx would send
        await read_raw(await lean.handle_async_request(request))
    [seen] = server.requests
    assert seen.header(b"transfer-encoding") == []
    assert seen.header(b"content-length") == [b"10005"]
    assert seen.body == b"abcde" + b"f" * 10_000


async def test_missing_host_header_is_added(lean: LeanTransport) -> None:
    async with RawServer() as server:
        request = build(server.url + "/h")
        del request.headers["host"]
        await read_raw(await lean.handle_async_request(request))
    [seen] = server.requests
    assert seen.header(b"host") == [b"127.0.0.1:%d" % server.port]


async def test_ipv6_literal_host() -> None:
    try:
        probe = await asyncio.start_server(lambda reader, writer: None, "::1", 0)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    probe.close()
    async with RawServer(host="::1") as server, LeanTransport() as transport:
        _, body = await fetch(transport, server.url + "/six")
    assert body == b"ok"
    [seen] = server.requests
    assert seen.header(b"host") == [b"[::1]:%d" % server.port]


async def test_wrong_content_length_header_is_corrected(lean: LeanTransport) -> None:
    async with RawServer() as server:
        request = build(server.url, "POST", content=b"abc")
        request.headers["Content-Length"] = "99"
        await read_raw(await lean.handle_async_request(request))
    [seen] = server.requests
    assert (seen.header(b"content-length"), seen.body) == ([b"3"], b"abc")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X-Bad", "a\r\nInjected: yes"),
        ("X-Bad", "a\nb"),
        ("X-Bad", "a\rb"),
        ("X-Bad", "a\x00b"),
        ("X-Bad", "trailing\r\n"),
        ("Bad Name", "v"),
        ("Bad:Name", "v"),
        ("Bad\r\nName", "v"),
        ("", "v"),
        ("Host", "127.0.0.1\r\nX: y"),
    ],
)
async def test_unsendable_header_is_a_local_protocol_error(
    lean: LeanTransport, name: str, value: str
) -> None:
    async with RawServer() as server:
        request = build(server.url)
        request.headers[name] = value
        with pytest.raises(httpx.LocalProtocolError):
            await lean.handle_async_request(request)
        await asyncio.sleep(0.01)
        assert (server.accepted, server.requests) == (0, [])  # nothing was sent
        _, body = await fetch(lean, server.url)  # and no slot or connection was lost
        assert body == b"ok"


@pytest.mark.parametrize("method", ["G T", "GET /admin", "G\tT", "GÉT"])
async def test_method_that_is_not_a_token_is_a_local_protocol_error(
    lean: LeanTransport, method: str
) -> None:
    async with RawServer() as server:
        with pytest.raises(httpx.LocalProtocolError):
            await fetch(lean, server.url, method)


async def test_request_with_connection_close_does_not_reuse_the_connection(
    lean: LeanTransport,
) -> None:
    async with RawServer() as server:  # the server ignores the client's wish and stays open
        await fetch(lean, server.url, headers={"Connection": "close"})
        await fetch(lean, server.url)
    assert server.accepted == 2


# --- cancellation --------------------------------------------------------------------------------


async def test_cancelled_request_frees_its_slot_and_closes_its_connection(
    make: MakeLean,
) -> None:
    transport = make(max_connections=1)
    release = asyncio.Event()
    async with RawServer((release, OK)) as server:
        task = asyncio.create_task(fetch(transport, server.url + "/held"))
        await wait_until(lambda: len(server.requests) == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await server.saw_eof(1)
        _, body = await fetch(transport, server.url + "/next", timing=timeouts(pool=0.05))
        assert body == b"ok"
        release.set()
    assert server.paths() == [(1, b"/held"), (2, b"/next")]


async def test_cancelled_while_waiting_for_a_slot(make: MakeLean) -> None:
    transport = make(max_connections=1)
    release = asyncio.Event()
    async with RawServer((release, OK)) as server:
        busy = asyncio.create_task(fetch(transport, server.url + "/busy"))
        await wait_until(lambda: len(server.requests) == 1)
        waiting = asyncio.create_task(fetch(transport, server.url + "/waiting"))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        release.set()
        await busy
        _, body = await fetch(transport, server.url + "/next", timing=timeouts(pool=0.05))
        assert body == b"ok"
    assert server.paths() == [(1, b"/busy"), (1, b"/next")]


async def test_cancelled_while_reading_the_body(make: MakeLean) -> None:
    transport = make(max_connections=1)
    release = asyncio.Event()
    async with RawServer((b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab", release, b"cd")) as (
        server
    ):
        task = asyncio.create_task(fetch(transport, server.url + "/slow"))
        await wait_until(lambda: len(server.requests) == 1)
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await server.saw_eof(1)
        release.set()
        _, body = await fetch(transport, server.url + "/next", timing=timeouts(pool=0.05))
        assert body == b"ok"
    assert server.accepted == 2


# --- TLS -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tls:
    server: ssl.SSLContext
    client: ssl.SSLContext
    folder: Path  # cert.pem and key.pem of the server
    ca_pem: str


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    """A throwaway CA and a certificate for localhost / 127.0.0.1 signed by it."""
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("lean-transport test CA"))
        .issuer_name(_name("lean-transport test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    folder: Path = tmp_path_factory.mktemp("tls")
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    ca_pem = ca.public_bytes(serialization.Encoding.PEM).decode()
    client = ssl.create_default_context(cadata=ca_pem)
    return Tls(server, client, folder, ca_pem)


async def test_https_with_a_trusted_ca(make: MakeLean, tls: Tls) -> None:
    transport = make(verify=tls.client)
    chunks = chunked(b"secure", b" hello")
    async with RawServer((chunks,), tls=tls.server) as server:
        url = f"https://localhost:{server.port}/"
        answer, body = await fetch(transport, url)
        assert (answer.status_code, body) == (200, b"secure hello")
        _, body = await fetch(transport, url)
        assert body == b"ok"
        assert server.accepted == 1  # kept alive over TLS too
        [first, _] = server.requests
        assert first.header(b"host") == [b"localhost:%d" % server.port]


async def test_https_close_delimited_body(make: MakeLean, tls: Tls) -> None:
    transport = make(verify=tls.client)
    wire = b"HTTP/1.1 200 OK\r\n\r\n" + b"t" * 3000
    async with RawServer([*in_pieces(wire, 1000), "close"], tls=tls.server) as server:
        _, body = await fetch(transport, f"https://127.0.0.1:{server.port}/")
    assert body == b"t" * 3000


async def test_https_with_default_verification_rejects_an_unknown_ca(
    lean: LeanTransport, tls: Tls
) -> None:
    async with RawServer(tls=tls.server) as server:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await fetch(lean, f"https://localhost:{server.port}/")
        assert server.requests == []


async def test_https_refuses_a_protocol_other_than_http11_chosen_by_alpn(
    make: MakeLean, tls: Tls
) -> None:
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(tls.folder / "cert.pem", tls.folder / "key.pem")
    server_context.set_alpn_protocols(["h2"])
    client_context = ssl.create_default_context(cadata=tls.ca_pem)
    client_context.set_alpn_protocols(["h2", "http/1.1"])  # a context shared with an h2 client
    transport = make(verify=client_context)
    async with RawServer(tls=server_context) as server:
        with pytest.raises(httpx.ConnectError, match=r"only HTTP/1\.1"):
            await fetch(transport, f"https://localhost:{server.port}/")
        assert server.requests == []


async def test_https_without_verification(make: MakeLean, tls: Tls) -> None:
    transport = make(verify=False)
    async with RawServer(tls=tls.server) as server:
        answer, body = await fetch(transport, f"https://localhost:{server.port}/")
    assert (answer.status_code, body) == (200, b"ok")


async def test_plain_http_to_a_tls_server_fails_cleanly(lean: LeanTransport, tls: Tls) -> None:
    async with RawServer(tls=tls.server) as server:
        with pytest.raises(httpx.TransportError):
            await fetch(lean, f"http://127.0.0.1:{server.port}/", timing=timeouts(read=0.5))


# --- closing the transport -----------------------------------------------------------------------


async def test_aclose_closes_idle_connections_then_refuses_requests() -> None:
    transport = LeanTransport()
    async with RawServer() as server:
        await fetch(transport, server.url)
        assert "idle_connections=1" in repr(transport)
        await transport.aclose()
        assert await server.saw_eof(1)
        assert "closed=True" in repr(transport)
        with pytest.raises(RuntimeError, match="closed"):
            await fetch(transport, server.url)
        await transport.aclose()  # twice is harmless
    assert server.accepted == 1


async def test_aclose_while_a_response_is_open_closes_its_connection_when_done() -> None:
    transport = LeanTransport()
    async with RawServer() as server:
        answer = await transport.handle_async_request(build(server.url))
        await transport.aclose()
        assert await read_raw(answer) == b"ok"
        assert await server.saw_eof(1)


async def test_aclose_refuses_a_request_that_was_waiting_for_a_slot() -> None:
    transport = LeanTransport(max_connections=1)
    release = asyncio.Event()
    async with RawServer((release, OK)) as server:
        busy = asyncio.create_task(fetch(transport, server.url))
        await wait_until(lambda: len(server.requests) == 1)
        waiting = asyncio.create_task(fetch(transport, server.url))
        await asyncio.sleep(0.01)
        await transport.aclose()
        release.set()
        await busy
        with pytest.raises(RuntimeError, match="closed"):
            await waiting
    assert (server.accepted, len(server.requests)) == (1, 1)


async def test_transport_as_async_context_manager() -> None:
    async with RawServer() as server:
        async with LeanTransport() as transport:
            await fetch(transport, server.url)
        assert await server.saw_eof(1)


# --- through httpx.AsyncClient -------------------------------------------------------------------


async def test_through_async_client() -> None:
    def echo(seen: Seen) -> Steps:
        body = seen.request_line + b"|" + seen.body
        return (response(body, b"200 OK", b"Content-Type: text/plain"),)

    async with RawServer(default=echo) as server:
        async with httpx.AsyncClient(transport=LeanTransport(), base_url=server.url) as client:
            got = await client.get("/a", params={"q": "1"})
            assert (got.status_code, got.text) == (200, "GET /a?q=1 HTTP/1.1|")
            got = await client.post("/b", json={"k": "v"})
            line, _, sent = got.text.partition("|")
            assert (line, json.loads(sent)) == ("POST /b HTTP/1.1", {"k": "v"})
            async with client.stream("PUT", "/c", content=b"streamed") as streamed:
                text = b"".join([piece async for piece in streamed.aiter_bytes()])
            assert text == b"PUT /c HTTP/1.1|streamed"
            assert streamed.http_version == "HTTP/1.1"
        assert await server.saw_eof(1)
    assert server.accepted == 1


async def test_async_client_timeout_is_applied() -> None:
    async with RawServer(("hang",)) as server:
        transport = LeanTransport()
        async with httpx.AsyncClient(transport=transport, timeout=0.1) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.get(server.url)
