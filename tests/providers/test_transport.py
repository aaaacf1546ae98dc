"""HttpTransport against a real HTTP server on 127.0.0.1: statuses, retries, timeouts, SSE."""

from __future__ import annotations

import asyncio
import gzip
import inspect
import json
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing

import httpx
import pytest

from agent_plugin.errors import BODY_LIMIT, AgentError, ErrorKind
from agent_plugin.providers.aiohttp_engine import default_transport
from agent_plugin.providers.http import HttpTransport, SseEvent
from agent_plugin.providers.proxies import environment_proxy
from agent_plugin.providers.retry import RetryNotice, RetryPolicy, retry_stream
from agent_plugin.redaction import REDACTED
from tests.httpserver import (
    Hang,
    HttpServer,
    RecordedRequest,
    Reply,
    Reset,
    Stream,
    Truncated,
    reply_json,
    sse,
    sse_event,
)

PROVIDER = "openai-compatible"
SECRET = "sk-test-0123456789abcdef"
FAST = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02)
BODY = {"model": "m", "messages": [{"role": "user", "content": "héllo"}]}
OK = {"id": "chatcmpl-1", "choices": []}

MakeTransport = Callable[..., HttpTransport]


def _plain_http() -> httpx.AsyncHTTPTransport:
    """A connection pool for plain HTTP that skips loading the CA bundle (~40 ms per client)."""
    return httpx.AsyncHTTPTransport(verify=False)


def _aiohttp(url: str) -> httpx.AsyncBaseTransport:
    """The default engine (aiohttp behind httpx-aiohttp), as a wire client makes it."""
    return default_transport(url, verify=False)


ENGINES: dict[str, Callable[[str], httpx.AsyncBaseTransport]] = {
    "httpx": lambda _: _plain_http(),
    "aiohttp": _aiohttp,
}


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    async with HttpServer() as running:
        yield running


@pytest.fixture(params=sorted(ENGINES))
async def make_transport(
    server: HttpServer, request: pytest.FixtureRequest
) -> AsyncIterator[MakeTransport]:
    """HttpTransports on httpx's own engine, and (a second run of every test) on the default
    one, aiohttp behind httpx-aiohttp's transport."""
    engine = ENGINES[request.param]
    made: list[HttpTransport] = []

    def make(retry: RetryPolicy = FAST, timeout: float = 5.0) -> HttpTransport:
        transport = HttpTransport(
            PROVIDER,
            server.url + "/v1/",
            headers={"authorization": f"Bearer {SECRET}"},
            timeout=timeout,
            retry=retry,
            secret=SECRET,
            transport=engine(server.url),
        )
        made.append(transport)
        return transport

    yield make
    for transport in made:
        await transport.aclose()


def _error(status: int, message: str = "nope") -> Reply:
    body = json.dumps({"error": {"message": message, "type": "x"}})
    return Reply(status, {"content-type": "application/json"}, body)


def _generator(events: AsyncGenerator[SseEvent, None]) -> AsyncGenerator[SseEvent, None]:
    assert inspect.isasyncgen(events)  # post_sse promises an async generator: it can be closed
    return events


async def _collect(events: AsyncGenerator[SseEvent, None]) -> list[SseEvent]:
    async with aclosing(_generator(events)) as stream:
        return [event async for event in stream]


def retried_sse(
    transport: HttpTransport, notices: list[RetryNotice]
) -> AsyncGenerator[SseEvent, None]:
    """A stream of ``/x`` retried as the wire clients retry one: whole attempts, while nothing
    has been read (``post_sse`` itself makes one attempt)."""
    return retry_stream(
        lambda: transport.post_sse("/x", BODY), transport.retry, on_retry=notices.append
    )


async def _read_into(seen: list[SseEvent], events: AsyncGenerator[SseEvent, None]) -> None:
    async with aclosing(_generator(events)) as stream:
        async for event in stream:
            seen.append(event)


# --- plain JSON calls ----------------------------------------------------------------------


async def test_post_json_sends_the_body_and_headers(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    server.queue(reply_json(OK))
    assert await make_transport().post_json("/chat/completions", BODY) == OK
    [request] = server.requests
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert request.json() == BODY
    assert request.headers["authorization"] == f"Bearer {SECRET}"
    assert request.headers["content-type"] == "application/json"


async def test_post_json_sends_encoded_bytes_as_given_on_every_attempt(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    raw = '{"model": "m",  "messages":[{"role":"user","content":"héllo"}]}'.encode()
    server.queue(_error(503), reply_json(OK))
    assert await make_transport().post_json("/chat/completions", raw) == OK
    assert [request.body for request in server.requests] == [raw, raw]  # not re-encoded
    assert server.requests[1].headers["content-type"] == "application/json"


async def test_post_sse_sends_encoded_bytes_as_given(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    raw = json.dumps(BODY).encode()  # json.dumps' default spacing and \u escapes, kept
    server.queue(sse([sse_event({"n": 1}), sse_event("[DONE]")]))
    events = await _collect(make_transport().post_sse("/chat/completions", raw))
    assert events == [SseEvent(None, '{"n": 1}'), SseEvent(None, "[DONE]")]
    [request] = server.requests
    assert request.body == raw
    assert request.headers["accept"] == "text/event-stream"


async def test_429_with_retry_after_one_second_waits_then_succeeds(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    server.queue(Reply(429, {"retry-after": "1"}, "slow down"), reply_json(OK))
    notices: list[RetryNotice] = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    result = await make_transport().post_json("/chat/completions", BODY, on_retry=notices.append)
    elapsed = loop.time() - start
    assert result == OK
    assert 0.9 <= elapsed < 2.0
    [notice] = notices
    assert (notice.attempt, notice.max_attempts, notice.wait) == (1, 3, 1.0)
    assert notice.error.kind is ErrorKind.RATE_LIMITED
    assert (notice.error.status, notice.error.retry_after) == (429, 1.0)
    assert notice.error.message == f"{PROVIDER} answered 429: slow down"
    assert [r.json() for r in server.requests] == [BODY, BODY]


async def test_529_then_200_is_retried_with_backoff(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    server.queue(_error(529, "Overloaded"), reply_json(OK))
    notices: list[RetryNotice] = []
    assert await make_transport().post_json("/messages", BODY, on_retry=notices.append) == OK
    [notice] = notices
    assert notice.error.kind is ErrorKind.UNAVAILABLE
    assert notice.error.status == 529
    assert notice.error.retry_after is None
    assert 0.0 <= notice.wait <= FAST.base_delay
    assert len(server.requests) == 2


async def test_503_with_retry_after_ms_is_honoured(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    server.queue(Reply(503, {"retry-after-ms": "150", "retry-after": "30"}), reply_json(OK))
    notices: list[RetryNotice] = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await make_transport().post_json("/x", BODY, on_retry=notices.append) == OK
    assert loop.time() - start >= 0.14
    assert [n.wait for n in notices] == [0.15]
    assert notices[0].error.message == f"{PROVIDER} answered 503"


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504, 529])
async def test_retryable_statuses_are_retried(
    server: HttpServer, make_transport: MakeTransport, status: int
) -> None:
    server.queue(_error(status), reply_json(OK))
    assert await make_transport().post_json("/x", BODY) == OK
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, ErrorKind.PROVIDER),
        (401, ErrorKind.AUTHENTICATION),
        (403, ErrorKind.AUTHENTICATION),
        (404, ErrorKind.PROVIDER),
        (413, ErrorKind.BUDGET),
        (422, ErrorKind.PROVIDER),
    ],
)
async def test_other_4xx_are_not_retried(
    server: HttpServer, make_transport: MakeTransport, status: int, kind: ErrorKind
) -> None:
    body = json.dumps({"error": {"message": "bad request", "type": "invalid_request_error"}})
    server.queue(Reply(status, {"content-type": "application/json"}, body), reply_json(OK))
    notices: list[RetryNotice] = []
    with pytest.raises(AgentError) as caught:
        await make_transport().post_json("/x", BODY, on_retry=notices.append)
    error = caught.value
    assert (error.kind, error.status, error.provider) == (kind, status, PROVIDER)
    assert error.message == f"{PROVIDER} answered {status}: {body}"
    assert error.body == body
    assert len(server.requests) == 1
    assert server.pending == 1
    assert notices == []


async def test_error_body_is_cut_to_500_characters(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    body = "".join(chr(ord("a") + i % 26) for i in range(2000))
    server.queue(Reply(400, {"content-type": "text/plain"}, body))
    with pytest.raises(AgentError) as caught:
        await make_transport().post_json("/x", BODY)
    assert caught.value.message == f"{PROVIDER} answered 400: {body[:500]}"
    assert caught.value.body == body[:500]


async def test_an_echoed_secret_is_scrubbed_from_the_error(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    def echo(request: RecordedRequest) -> Reply:
        key = request.headers["authorization"].removeprefix("Bearer ")
        return Reply(401, {"content-type": "text/plain"}, f"Incorrect API key provided: {key}.")

    server.queue(echo)
    transport = make_transport()
    with pytest.raises(AgentError) as caught:
        await transport.post_json("/x", BODY)
    error = caught.value
    assert SECRET in server.requests[0].headers["authorization"]  # it really was echoed
    assert error.kind is ErrorKind.AUTHENTICATION
    assert error.message == f"{PROVIDER} answered 401: Incorrect API key provided: {REDACTED}."
    for text in (str(error), repr(error), error.body or "", error.info().model_dump_json()):
        assert SECRET not in text
    assert SECRET not in repr(transport)


def test_scrub_error_removes_the_secret_from_message_and_body() -> None:
    transport = HttpTransport(
        PROVIDER, "http://h", headers={}, timeout=1.0, retry=FAST, secret=SECRET
    )
    error = AgentError(
        ErrorKind.PROVIDER,
        f"{PROVIDER} reported an error: bad key {SECRET}",
        provider=PROVIDER,
        status=400,
        retry_after=3.0,
        body=f'{{"message": "bad key {SECRET}"}}',
    )
    scrubbed = transport.scrub_error(error)
    assert scrubbed.message == f"{PROVIDER} reported an error: bad key {REDACTED}"
    assert scrubbed.body == f'{{"message": "bad key {REDACTED}"}}'
    assert (scrubbed.kind, scrubbed.provider, scrubbed.status, scrubbed.retry_after) == (
        ErrorKind.PROVIDER,
        PROVIDER,
        400,
        3.0,
    )
    clean = AgentError(ErrorKind.PROVIDER, "nothing secret here", body="{}")
    assert transport.scrub_error(clean) is clean


def test_scrub_error_removes_a_secret_cut_short_by_the_body_limit() -> None:
    transport = HttpTransport(
        PROVIDER, "http://h", headers={}, timeout=1.0, retry=FAST, secret=SECRET
    )
    body = "x" * (BODY_LIMIT - 10) + SECRET  # AgentError keeps 500 characters: 10 of the key
    error = AgentError(ErrorKind.PROVIDER, "m", body=body)
    assert error.body == "x" * (BODY_LIMIT - 10) + SECRET[:10]
    assert transport.scrub_error(error).body == "x" * (BODY_LIMIT - 10) + REDACTED
    # a few characters (the public "sk-..." prefix) are not a secret and may stay
    short = AgentError(ErrorKind.PROVIDER, "m", body="x" * (BODY_LIMIT - 3) + SECRET)
    assert transport.scrub_error(short) is short


def test_without_a_secret_scrub_error_changes_nothing() -> None:
    transport = HttpTransport(PROVIDER, "http://h", headers={}, timeout=1.0, retry=FAST)
    error = AgentError(ErrorKind.PROVIDER, f"bad key {SECRET}")
    assert transport.scrub_error(error) is error


async def test_retry_after_longer_than_the_policy_allows_is_raised_at_once(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    # retrying after max_retry_after would be early: the server would only refuse again
    server.queue(Reply(429, {"retry-after": "120"}, "come back in two minutes"), reply_json(OK))
    notices: list[RetryNotice] = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(AgentError) as caught:
        await make_transport(RetryPolicy(max_retry_after=60.0)).post_json(
            "/x", BODY, on_retry=notices.append
        )
    assert loop.time() - start < 0.5
    assert (caught.value.kind, caught.value.retry_after) == (ErrorKind.RATE_LIMITED, 120.0)
    assert notices == []
    assert len(server.requests) == 1
    assert server.pending == 1


async def test_connection_reset_is_a_retried_transport_error(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    server.queue(Reset(), reply_json(OK))
    notices: list[RetryNotice] = []
    assert await make_transport().post_json("/x", BODY, on_retry=notices.append) == OK
    [notice] = notices
    assert notice.error.kind is ErrorKind.TRANSPORT
    assert notice.error.provider == PROVIDER
    assert notice.error.message.startswith(f"{PROVIDER} request failed (")
    assert len(server.requests) == 2


async def test_read_timeout_is_retried(server: HttpServer, make_transport: MakeTransport) -> None:
    server.queue(Hang(), reply_json(OK))
    notices: list[RetryNotice] = []
    transport = make_transport(timeout=0.2)
    assert await transport.post_json("/x", BODY, on_retry=notices.append) == OK
    assert [n.error.kind for n in notices] == [ErrorKind.TRANSPORT]
    assert "ReadTimeout" in notices[0].error.message


async def test_read_timeouts_give_up_after_max_attempts(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    server.queue(Hang(), Hang(), reply_json(OK))
    notices: list[RetryNotice] = []
    transport = make_transport(RetryPolicy(max_attempts=2, base_delay=0.01), timeout=0.2)
    with pytest.raises(AgentError) as caught:
        await transport.post_json("/x", BODY, on_retry=notices.append)
    assert caught.value.kind is ErrorKind.TRANSPORT
    assert "ReadTimeout" in caught.value.message
    assert len(notices) == 1
    assert len(server.requests) == 2
    assert server.pending == 1


async def test_connection_refused_is_transport_and_retried(
    make_transport: MakeTransport,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    transport = HttpTransport(
        PROVIDER, f"http://127.0.0.1:{port}", headers={}, timeout=1.0, retry=FAST
    )
    notices: list[RetryNotice] = []
    try:
        with pytest.raises(AgentError) as caught:
            await transport.get_json("/models", on_retry=notices.append)
    finally:
        await transport.aclose()
    assert caught.value.kind is ErrorKind.TRANSPORT
    assert "ConnectError" in caught.value.message
    assert len(notices) == FAST.max_attempts - 1


async def test_truncated_json_body_is_decode_and_not_retried(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    server.queue(Reply(200, {"content-type": "application/json"}, '{"id": "x", "cho'))
    server.queue(reply_json(OK))
    notices: list[RetryNotice] = []
    with pytest.raises(AgentError) as caught:
        await make_transport().post_json("/x", BODY, on_retry=notices.append)
    error = caught.value
    assert error.kind is ErrorKind.DECODE
    assert error.provider == PROVIDER
    assert error.message.startswith(f"{PROVIDER} answered 200 with a body that is not JSON")
    assert error.body == '{"id": "x", "cho'
    assert len(server.requests) == 1
    assert notices == []


async def test_body_cut_short_of_its_content_length_is_a_retried_transport_error(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    # The connection closed mid-body: nothing is wrong with the JSON, the network failed.
    server.queue(Truncated('{"id": "x", "cho'), reply_json(OK))
    notices: list[RetryNotice] = []
    assert await make_transport().post_json("/x", BODY, on_retry=notices.append) == OK
    assert [n.error.kind for n in notices] == [ErrorKind.TRANSPORT]
    assert "RemoteProtocolError" in notices[0].error.message


async def test_deadline_shorter_than_retry_after_raises_without_sleeping(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    server.queue(Reply(429, {"retry-after": "5"}, "later"), reply_json(OK))
    notices: list[RetryNotice] = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(AgentError) as caught:
        await make_transport().post_json("/x", BODY, deadline=start + 2.0, on_retry=notices.append)
    assert loop.time() - start < 0.5
    assert caught.value.kind is ErrorKind.RATE_LIMITED
    assert caught.value.retry_after == 5.0
    assert len(server.requests) == 1
    assert notices == []


async def test_deadline_stops_a_run_of_retries(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    server.queue(*[Reply(503, {"retry-after-ms": "200"}) for _ in range(5)])
    transport = make_transport(RetryPolicy(max_attempts=10))
    loop = asyncio.get_running_loop()
    with pytest.raises(AgentError) as caught:
        await transport.post_json("/x", BODY, deadline=loop.time() + 0.5)
    assert caught.value.kind is ErrorKind.UNAVAILABLE
    assert len(server.requests) == 3  # at ~0, ~0.2, ~0.4 s; the next would end past 0.5 s


async def test_get_json_reuses_one_kept_alive_connection(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    models = {"object": "list", "data": [{"id": "m", "object": "model"}]}
    server.queue(reply_json(models), _error(503), reply_json(models))
    transport = make_transport()
    assert await transport.get_json("/models") == models
    assert await transport.get_json("/models") == models
    assert [(r.method, r.path, r.body) for r in server.requests] == [("GET", "/v1/models", b"")] * 3
    assert {r.connection for r in server.requests} == {1}


# --- streams -------------------------------------------------------------------------------


async def test_stream_events_arrive_incrementally(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    gate = asyncio.Event()
    server.queue(
        sse(
            [
                ": OPENROUTER PROCESSING\n\n",
                sse_event({"n": 1}),
                gate,
                ": keep-alive\n\n",
                sse_event({"n": 2}, event="delta"),
                sse_event("[DONE]"),
            ]
        )
    )
    transport = make_transport()
    async with aclosing(_generator(transport.post_sse("/chat/completions", BODY))) as events:
        first = await asyncio.wait_for(anext(events), timeout=2.0)
        assert first == SseEvent(None, '{"n": 1}')
        assert not gate.is_set()  # the server has not sent the rest yet
        gate.set()
        rest = [event async for event in events]
    assert rest == [SseEvent("delta", '{"n": 2}'), SseEvent(None, "[DONE]")]
    [request] = server.requests
    assert request.headers["accept"] == "text/event-stream"
    assert request.json() == BODY


async def test_stream_lines_are_split_only_at_line_ends(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    payload = '{"t": "a\u2028b\x0cc\u00e9"}'
    raw = f"data: {payload}\r\n\r\ndata: padded   \r\rdata: last".encode()
    cut = raw.index(b"\xc3") + 1  # inside the two-byte UTF-8 sequence of "é"
    crlf = raw.index(b"\r\n") + 1  # between the CR and the LF of a line end
    server.queue(Stream([raw[:cut], 0.01, raw[cut:crlf], 0.01, raw[crlf:]]))
    events = await _collect(make_transport().post_sse("/x", BODY))
    assert events == [
        SseEvent(None, payload),
        SseEvent(None, "padded   "),
        SseEvent(None, "last"),
    ]


async def test_stream_429_on_opening_is_retried(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    server.queue(Reply(429, {"retry-after-ms": "20"}, "busy"), sse([sse_event("[DONE]")]))
    notices: list[RetryNotice] = []
    transport = make_transport()
    events = await _collect(retried_sse(transport, notices))
    assert events == [SseEvent(None, "[DONE]")]
    [notice] = notices
    assert (notice.attempt, notice.wait, notice.error.kind) == (1, 0.02, ErrorKind.RATE_LIMITED)
    assert notice.error.message == f"{PROVIDER} answered 429: busy"
    assert len(server.requests) == 2


async def test_post_sse_itself_makes_one_attempt(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    server.queue(Reply(429, {"retry-after-ms": "20"}, "busy"), sse([sse_event("[DONE]")]))
    with pytest.raises(AgentError) as caught:
        await _collect(make_transport().post_sse("/x", BODY))
    assert caught.value.kind is ErrorKind.RATE_LIMITED
    assert caught.value.retry_after == 0.02
    assert len(server.requests) == 1
    assert server.pending == 1


async def test_stream_401_is_raised_with_its_body_and_not_retried(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    server.queue(_error(401, "Incorrect API key"), sse([sse_event("[DONE]")]))
    with pytest.raises(AgentError) as caught:
        await _collect(make_transport().post_sse("/x", BODY))
    assert caught.value.kind is ErrorKind.AUTHENTICATION
    assert "Incorrect API key" in caught.value.message
    assert len(server.requests) == 1


@pytest.mark.parametrize("end", ["reset", "close"])
async def test_stream_drop_after_the_first_event_is_not_retried(
    server: HttpServer, make_transport: MakeTransport, end: str
) -> None:
    server.queue(
        Stream([sse_event({"n": 1}), 0.05, b'data: {"n": 2'], end=end),  # type: ignore[arg-type]
        sse([sse_event({"n": 1}), sse_event({"n": 2})]),
    )
    notices: list[RetryNotice] = []
    seen: list[SseEvent] = []
    transport = make_transport()
    with pytest.raises(AgentError) as caught:
        await _read_into(seen, retried_sse(transport, notices))
    assert seen == [SseEvent(None, '{"n": 1}')]
    assert caught.value.kind is ErrorKind.TRANSPORT
    assert caught.value.provider == PROVIDER
    assert notices == []
    assert len(server.requests) == 1
    assert server.pending == 1


async def test_stream_failing_before_its_first_event_is_retried(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    server.queue(
        Stream([": opening\n\n", b"data: {"], end="reset"),
        sse([sse_event({"n": 1}), sse_event("[DONE]")]),
    )
    notices: list[RetryNotice] = []
    events = await _collect(retried_sse(make_transport(), notices))
    assert events == [SseEvent(None, '{"n": 1}'), SseEvent(None, "[DONE]")]
    assert [n.error.kind for n in notices] == [ErrorKind.TRANSPORT]
    assert len(server.requests) == 2


async def test_stream_silent_past_the_read_timeout_is_retried(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    never = asyncio.Event()
    server.queue(Stream([never]), sse([sse_event("[DONE]")]))
    notices: list[RetryNotice] = []
    transport = make_transport(timeout=0.2)
    events = await _collect(retried_sse(transport, notices))
    assert events == [SseEvent(None, "[DONE]")]
    assert "ReadTimeout" in notices[0].error.message


async def test_stream_stalling_after_the_first_event_times_out_without_retry(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    never = asyncio.Event()
    server.queue(sse([sse_event({"n": 1}), never]), sse([sse_event("[DONE]")]))
    transport = make_transport(timeout=0.2)
    seen: list[SseEvent] = []
    with pytest.raises(AgentError) as caught:
        await _read_into(seen, transport.post_sse("/x", BODY))
    assert seen == [SseEvent(None, '{"n": 1}')]
    assert caught.value.kind is ErrorKind.TRANSPORT
    assert "ReadTimeout" in caught.value.message
    assert len(server.requests) == 1


async def test_stream_closed_early_by_the_caller_frees_the_connection(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    server.queue(sse([sse_event({"n": 1}), sse_event({"n": 2})]), reply_json(OK))
    transport = make_transport()
    async with aclosing(_generator(transport.post_sse("/x", BODY))) as events:
        assert await anext(events) == SseEvent(None, '{"n": 1}')
    assert await transport.post_json("/y", BODY) == OK
    assert len(server.requests) == 2
    assert {r.connection for r in server.requests} == {1}  # back in the pool, not dropped


# --- the test server itself ----------------------------------------------------------------


async def test_server_scripts_answers_from_the_request_and_flags_unplanned_ones(
    make_transport: MakeTransport,
) -> None:
    async def echo_model(request: RecordedRequest) -> Reply:
        await asyncio.sleep(0)
        return reply_json({"echo": request.json()["messages"][0]["content"]})

    async with HttpServer(default=echo_model) as scripted:
        transport = HttpTransport(
            PROVIDER, scripted.url, headers={}, timeout=5.0, retry=FAST, transport=_plain_http()
        )
        try:
            assert await transport.post_json("/chat", BODY) == {"echo": "héllo"}
            scripted.default = None
            with pytest.raises(AgentError) as caught:
                await transport.post_json("/chat", BODY)
        finally:
            await transport.aclose()
    assert caught.value.status == 418
    assert "no action queued for POST /chat" in caught.value.message
    assert len(scripted.requests) == 2


def test_a_request_that_is_not_json_is_a_typed_error() -> None:
    from agent_plugin.providers.encoding import dumps

    for bad in ({"x": {1, 2}}, {"text": "\ud800 lone surrogate"}):
        with pytest.raises(AgentError) as caught:
            dumps(bad)
        assert caught.value.kind is ErrorKind.CONFIG


# --- the default engine and the environment's proxies ----------------------------------------


def _default_engine(base_url: str) -> HttpTransport:
    return HttpTransport(PROVIDER, base_url, headers={}, timeout=5.0, retry=FAST)


async def test_without_a_transport_requests_go_through_the_environments_proxy(
    server: HttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the test server plays the proxy: a proxied plain-HTTP request names the whole URL
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", server.url)
    server.queue(reply_json(OK))
    transport = _default_engine("http://model.invalid/v1")
    try:
        assert await transport.post_json("/chat/completions", BODY) == OK
    finally:
        await transport.aclose()
    [request] = server.requests
    assert request.path == "http://model.invalid/v1/chat/completions"
    assert request.json() == BODY


async def test_no_proxy_sends_the_host_direct(
    server: HttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    server.queue(reply_json(OK))
    transport = _default_engine(server.url + "/v1")
    try:
        assert await transport.post_json("/chat/completions", BODY) == OK
    finally:
        await transport.aclose()
    assert [request.path for request in server.requests] == ["/v1/chat/completions"]


def test_environment_proxy_reads_the_usual_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("https_proxy", "proxy.corp:3128")
    monkeypatch.setenv("ALL_PROXY", "socks5://all.corp:1080")
    assert environment_proxy("https://api.openai.com/v1") == "http://proxy.corp:3128"
    assert environment_proxy("http://ollama:11434/v1") == "socks5://all.corp:1080"
    monkeypatch.setenv("NO_PROXY", ".openai.com")
    assert environment_proxy("https://api.openai.com/v1") is None
    monkeypatch.setenv("NO_PROXY", "*")
    assert environment_proxy("http://ollama:11434/v1") is None


async def test_requests_name_the_library_and_accept_compressed_answers(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    server.queue(reply_json(OK))
    await make_transport().post_json("/chat/completions", BODY)
    [request] = server.requests
    assert request.headers["user-agent"] == "fastapi-agent-plugin"
    assert request.headers["accept-encoding"] == "gzip, deflate"


async def test_a_gzip_answer_is_decoded(server: HttpServer, make_transport: MakeTransport) -> None:
    body = gzip.compress(json.dumps(OK).encode())
    server.queue(Reply(200, {"content-type": "application/json", "content-encoding": "gzip"}, body))
    assert await make_transport().post_json("/chat/completions", BODY) == OK


async def test_header_names_merge_case_insensitively(server: HttpServer) -> None:
    transport = HttpTransport(
        PROVIDER,
        server.url,
        headers={"User-Agent": "my-app", "Accept": "application/json"},
        timeout=5.0,
        retry=FAST,
        transport=_plain_http(),
    )
    server.queue(reply_json(OK), sse([sse_event({"a": 1})]))
    try:
        await transport.post_json("/x", BODY)
        await _collect(transport.post_sse("/x", BODY))
    finally:
        await transport.aclose()
    plain, stream = server.requests
    assert plain.headers["user-agent"] == "my-app"  # one value, not the default beside it
    assert plain.headers["accept"] == "application/json"
    assert stream.headers["accept"] == "text/event-stream"


async def test_credentials_in_the_base_url_are_sent_as_basic_auth(server: HttpServer) -> None:
    transport = HttpTransport(
        PROVIDER,
        server.url.replace("http://", "http://user:p%40ss@") + "/v1",
        headers={},
        timeout=5.0,
        retry=FAST,
        transport=_plain_http(),
    )
    server.queue(reply_json(OK))
    try:
        await transport.post_json("/chat/completions", BODY)
    finally:
        await transport.aclose()
    [request] = server.requests
    assert request.headers["authorization"] == "Basic dXNlcjpwQHNz"  # user:p@ss
    assert "p%40ss" not in repr(transport)
    assert "user" not in transport.base_url


@pytest.mark.parametrize("streaming", [False, True], ids=["json", "sse"])
async def test_a_basic_token_echoed_back_is_scrubbed_from_the_error(
    server: HttpServer, streaming: bool
) -> None:
    """The URL's password is registered by value, but a server that echoes the Authorization
    header sends it back base64-encoded, and ``a:pw123456`` makes a token too short for the
    pattern of Basic values: the transport, which made the token, scrubs it."""

    def echo(request: RecordedRequest) -> Reply:
        text = f"bad credentials: {request.headers['authorization']}"
        return Reply(401, {"content-type": "text/plain"}, text)

    server.queue(echo)
    transport = HttpTransport(
        PROVIDER,
        server.url.replace("http://", "http://a:pw123456@") + "/v1",
        headers={},
        timeout=5.0,
        retry=FAST,
        transport=_plain_http(),
    )
    try:
        request = _collect(transport.post_sse("/x", BODY)) if streaming else None
        with pytest.raises(AgentError) as caught:
            await (request or transport.post_json("/x", BODY))
    finally:
        await transport.aclose()
    token = "YTpwdzEyMzQ1Ng"  # base64 of a:pw123456, without its padding
    assert token in server.requests[0].headers["authorization"]  # it really was echoed
    assert caught.value.message == f"{PROVIDER} answered 401: bad credentials: Basic {REDACTED}"
    assert token not in (caught.value.body or "")


def test_an_invalid_base_url_is_a_config_error() -> None:
    with pytest.raises(AgentError) as caught:
        HttpTransport(PROVIDER, "http://[::1/v1", headers={}, timeout=5.0, retry=FAST)
    assert caught.value.kind is ErrorKind.CONFIG
    assert "base_url is not a valid URL" in caught.value.message


async def test_a_closed_transport_refuses_requests(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    transport = make_transport()
    await transport.aclose()
    with pytest.raises(AgentError, match="client is closed") as caught:
        await transport.post_json("/chat/completions", BODY)
    assert caught.value.kind is ErrorKind.INTERNAL
    assert server.requests == []


async def test_a_body_that_does_not_decompress_is_a_decode_error(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    broken = gzip.compress(json.dumps(OK).encode())[:-12] + b"not gzip at all"
    server.queue(
        Reply(200, {"content-type": "application/json", "content-encoding": "gzip"}, broken)
    )
    with pytest.raises(AgentError) as caught:
        await make_transport().post_json("/chat/completions", BODY)
    assert caught.value.kind is ErrorKind.DECODE
    assert len(server.requests) == 1  # not retried: the server would send the same again


async def test_an_error_body_is_read_in_its_charset(
    server: HttpServer, make_transport: MakeTransport
) -> None:
    body = "trop de requêtes".encode("latin-1")
    server.queue(Reply(400, {"content-type": "text/plain; charset=ISO-8859-1"}, body))
    with pytest.raises(AgentError) as caught:
        await make_transport().post_json("/x", BODY)
    assert caught.value.body == "trop de requêtes"


# --- the default engine ---------------------------------------------------------------------


async def test_the_default_engine_is_aiohttp_behind_httpx_aiohttp(server: HttpServer) -> None:
    from httpx_aiohttp import AiohttpTransport

    server.queue(reply_json(OK), reply_json(OK))
    transport = _default_engine(server.url)
    try:
        assert isinstance(transport.transport, AiohttpTransport)
        assert await transport.post_json("/x", BODY) == OK
        assert await transport.post_json("/x", BODY) == OK
    finally:
        await transport.aclose()
    assert [r.connection for r in server.requests] == [1, 1]  # one kept-alive connection


async def test_the_pool_is_bounded_by_the_limits(server: HttpServer) -> None:
    gate = asyncio.Event()

    async def held(_: RecordedRequest) -> Reply:
        await gate.wait()
        return reply_json(OK)

    server.queue(held, held, held)
    transport = HttpTransport(
        PROVIDER,
        server.url,
        headers={},
        timeout=5.0,
        retry=FAST,
        limits=httpx.Limits(max_connections=1),
    )
    try:
        calls = [asyncio.ensure_future(transport.post_json("/x", BODY)) for _ in range(3)]
        await asyncio.sleep(0.2)
        assert len(server.requests) == 1  # the others wait for the one connection
        gate.set()
        assert await asyncio.gather(*calls) == [OK] * 3
    finally:
        await transport.aclose()
    assert {r.connection for r in server.requests} == {1}


async def test_an_aiohttp_transport_of_ones_own_is_sent_through_its_session(
    server: HttpServer,
) -> None:
    import aiohttp
    from httpx_aiohttp import AiohttpTransport

    given = AiohttpTransport()
    server.queue(reply_json(OK), sse([sse_event({"n": 1})]))
    transport = HttpTransport(
        PROVIDER, server.url, headers={"x-app": "mine"}, timeout=5.0, retry=FAST, transport=given
    )
    try:
        assert await transport.post_json("/x", BODY) == OK
        assert await _collect(transport.post_sse("/x", BODY)) == [SseEvent(None, '{"n": 1}')]
        assert isinstance(given.client, aiohttp.ClientSession)  # made on first use, kept there
    finally:
        await transport.aclose()
    assert all(r.headers["x-app"] == "mine" for r in server.requests)
    assert given.client.closed


async def test_the_default_engine_sends_proxy_credentials_from_the_environment(
    server: HttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", server.url.replace("http://", "http://me:s%3Acret@"))
    server.queue(reply_json(OK))
    transport = _default_engine("http://model.invalid/v1")
    try:
        assert await transport.post_json("/chat/completions", BODY) == OK
    finally:
        await transport.aclose()
    [request] = server.requests
    assert request.path == "http://model.invalid/v1/chat/completions"
    assert request.headers["proxy-authorization"] == "Basic bWU6czpjcmV0"  # me:s:cret


async def test_proxy_credentials_a_proxy_echoes_are_scrubbed_from_the_error(
    server: HttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For an http:// base URL every request carries Proxy-Authorization; a proxy's 407 that
    echoes it got the proxy's password, base64-encoded, into the error (nobody registers a
    proxy's password, and the Basic pattern wants 16 characters or more)."""
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", server.url.replace("http://", "http://bob:Hunter2pw@"))

    def echo(request: RecordedRequest) -> Reply:
        sent = request.headers["proxy-authorization"]
        return Reply(407, {"content-type": "text/plain"}, f"who are you? you sent {sent}")

    server.queue(echo)
    transport = _default_engine("http://model.invalid/v1")
    try:
        with pytest.raises(AgentError) as caught:
            await transport.post_json("/chat/completions", BODY)
    finally:
        await transport.aclose()
    token = "Ym9iOkh1bnRlcjJwdw"  # bob:Hunter2pw, without its padding
    assert token in server.requests[0].headers["proxy-authorization"]  # it really was echoed
    expected = f"{PROVIDER} answered 407: who are you? you sent Basic {REDACTED}"
    assert caught.value.message == expected
    assert token not in (caught.value.body or "")


def test_a_socks_proxy_gets_httpx_own_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ALL_PROXY", "socks5://socks.invalid:1080")
    try:
        import socksio  # noqa: F401
    except ImportError:  # httpx's own refuses a SOCKS proxy without it, as it always did
        with pytest.raises(ImportError, match="socksio"):
            default_transport("https://api.openai.com/v1")
        return
    transport = default_transport("https://api.openai.com/v1")  # aiohttp speaks no SOCKS
    assert isinstance(transport, httpx.AsyncHTTPTransport)
