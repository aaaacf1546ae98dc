"""Reading Anthropic replies (``anthropic_replies``): whole bodies, streams, their edge cases.

The recorded replies themselves are replayed in ``test_anthropic_wire.py``; here are the
shapes no recording holds (malformed events, unknown blocks, deep nesting, errors mid-stream)
and the fuzzing of both parsers, seeded with the recordings.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_plugin.errors import BODY_LIMIT, AgentError, ErrorKind
from agent_plugin.messages import (
    ChatMessage,
    ProviderBlock,
    ProviderBlockPart,
    RedactedThinking,
    RedactedThinkingPart,
    ServerToolCall,
    ServerToolCallPart,
    ServerToolResult,
    ServerToolResultPart,
    StopReason,
    TextPart,
    TokenUsage,
    ToolCall,
    ToolCallPart,
)
from agent_plugin.providers.anthropic import AnthropicClient, parse_response
from agent_plugin.providers.base import (
    ChatRequest,
    ChatResponse,
    StreamEvent,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStarted,
)
from agent_plugin.providers.retry import RetryPolicy
from agent_plugin.redaction import REDACTED
from tests.wire import collect, done, fixture_names, is_stream, load, sse_body

KEY = "sk-ant-api03-test-key-0123456789abcdef"
Handler = Callable[[httpx.Request], httpx.Response]
TEXT_REPLY = load("anthropic__text_basic__mirascope")["response"]["body"]


def client_for(handler: Handler, **kwargs: Any) -> AnthropicClient:
    kwargs.setdefault("api_key", KEY)
    kwargs.setdefault("retry", RetryPolicy.never())
    return AnthropicClient(transport=httpx.MockTransport(handler), **kwargs)


def sse(*payloads: dict[str, Any] | str) -> bytes:
    """An Anthropic-style SSE body: ``event:`` named after the payload's type."""
    out = []
    for payload in payloads:
        if isinstance(payload, str):
            out.append(f"data: {payload}\n\n")
        else:
            out.append(f"event: {payload['type']}\ndata: {json.dumps(payload)}\n\n")
    return "".join(out).encode()


def hello() -> ChatRequest:
    return ChatRequest(messages=[ChatMessage.user("hi")])


def usage(inp: int, out: int, read: int = 0, write: int = 0) -> TokenUsage:
    return TokenUsage(
        input_tokens=inp, output_tokens=out, cache_read_tokens=read, cache_write_tokens=write
    )


# --- whole bodies ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("end_turn", StopReason.END_TURN),
        ("tool_use", StopReason.TOOL_USE),
        ("max_tokens", StopReason.MAX_TOKENS),
        ("stop_sequence", StopReason.STOP_SEQUENCE),
        ("refusal", StopReason.REFUSAL),
        ("pause_turn", StopReason.UNKNOWN),
        (None, StopReason.UNKNOWN),
    ],
)
def test_stop_reasons(raw: str | None, reason: StopReason) -> None:
    response = parse_response({"content": [], "stop_reason": raw})
    assert response.stop_reason is reason
    assert response.raw_stop_reason == raw


def test_parse_response_defaults_and_kept_blocks() -> None:
    """Every block is kept: server tool blocks typed, unknown ones whole; only a block
    without a type (which nothing could send back) is left out."""
    unknown = {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "f", "server_name": "s"}
    called_from_code = {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_2",
        "content": [],
        "caller": {"type": "code_execution_20250825", "tool_id": "srvtoolu_0"},
    }
    response = parse_response(
        {
            "content": [
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
                {"type": "tool_use"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "hi", "citations": None},
                {"type": "web_search_tool_result", "content": []},
                unknown,
                called_from_code,
                {"no": "type"},
            ],
            "stop_reason": "tool_use",
            "usage": {
                "input_tokens": 3,
                "output_tokens": 2,
                "cache_read_input_tokens": None,
                "cache_creation_input_tokens": None,
                "server_tool_use": {"web_search_requests": 1},
            },
        }
    )
    assert response.content == [
        ServerToolCallPart(
            server_tool_call=ServerToolCall(id="srvtoolu_1", name="web_search", arguments={})
        ),
        ToolCallPart(tool_call=ToolCall(id="", name="", arguments={})),
        RedactedThinkingPart(redacted_thinking=RedactedThinking(data="opaque")),
        TextPart(text="hi"),
        ServerToolResultPart(
            server_tool_result=ServerToolResult(
                tool_call_id="", type="web_search_tool_result", content=[]
            )
        ),
        ProviderBlockPart(provider_block=ProviderBlock(provider="anthropic", data=unknown)),
        ProviderBlockPart(
            provider_block=ProviderBlock(provider="anthropic", data=called_from_code)
        ),
    ]
    assert response.tool_calls == [ToolCall(id="", name="", arguments={})]  # server ones aside
    assert response.usage == usage(3, 2)
    assert response.model is None
    assert response.id is None
    assert parse_response({"content": []}).usage == TokenUsage()


@pytest.mark.parametrize(
    "body",
    [
        {"id": "msg_1", "type": "message"},
        {"content": None},
        {"content": {"type": "text"}},
        [],
        "message",
        None,
    ],
)
def test_a_body_without_content_blocks_is_a_decode_error(body: object) -> None:
    with pytest.raises(AgentError) as caught:
        parse_response(body)
    assert caught.value.kind is ErrorKind.DECODE
    if isinstance(body, dict):
        assert "no content blocks" in str(caught.value)


# --- stream edge cases ----------------------------------------------------------------------


MESSAGE_START = {
    "type": "message_start",
    "message": {
        "id": "msg_s",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 10, "cache_read_input_tokens": 1000, "output_tokens": 1},
    },
}
TEXT_START = {
    "type": "content_block_start",
    "index": 0,
    "content_block": {"type": "text", "text": ""},
}
TEXT_DELTA = {
    "type": "content_block_delta",
    "index": 0,
    "delta": {"type": "text_delta", "text": "Hel"},
}
BLOCK_STOP = {"type": "content_block_stop", "index": 0}
MESSAGE_DELTA = {
    "type": "message_delta",
    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
    "usage": {"output_tokens": 7},
}
MESSAGE_STOP = {"type": "message_stop"}


async def stream_of(body: bytes) -> list[StreamEvent]:
    def handler(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["stream"] is True
        assert request.headers["accept"] == "text/event-stream"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    async with aclosing(client_for(handler)) as client:
        return await collect(client, hello())


async def drain(events: AsyncIterator[StreamEvent], into: list[StreamEvent]) -> None:
    async for event in events:
        into.append(event)


INTERRUPTED = ErrorKind.STREAM_INTERRUPTED


@pytest.mark.parametrize(
    ("error_type", "kind", "after_output", "status"),
    [
        ("overloaded_error", ErrorKind.UNAVAILABLE, INTERRUPTED, 529),
        ("rate_limit_error", ErrorKind.RATE_LIMITED, INTERRUPTED, 429),
        ("api_error", ErrorKind.UNAVAILABLE, INTERRUPTED, 500),
        ("authentication_error", ErrorKind.AUTHENTICATION, ErrorKind.AUTHENTICATION, 401),
        ("invalid_request_error", ErrorKind.PROVIDER, ErrorKind.PROVIDER, 400),
        ("some_new_error", ErrorKind.PROVIDER, ErrorKind.PROVIDER, None),
    ],
)
@pytest.mark.parametrize("delivered", [False, True], ids=["before_output", "after_output"])
async def test_error_event_mid_stream(
    error_type: str, kind: ErrorKind, after_output: ErrorKind, status: int | None, delivered: bool
) -> None:
    """Before any output the event's own kind (retried by a policy that retries); after
    output a retryable one becomes StreamInterrupted, with the event's status and message."""
    error = {"type": "error", "error": {"type": error_type, "message": "Overloaded right now"}}
    shown = [TEXT_DELTA] if delivered else []
    body = sse(MESSAGE_START, TEXT_START, *shown, error, MESSAGE_STOP)
    seen: list[StreamEvent] = []
    async with aclosing(client_for(lambda r: httpx.Response(200, content=body))) as client:
        with pytest.raises(AgentError) as caught:
            await drain(client.stream(hello()), seen)
    assert seen == ([TextDelta("Hel")] if delivered else [])  # nothing after the error
    assert caught.value.kind is (after_output if delivered else kind)
    assert caught.value.status == status
    assert caught.value.provider == "anthropic"
    assert "Overloaded right now" in str(caught.value)
    assert error_type in str(caught.value)


@pytest.mark.parametrize(
    ("cut", "kind"),
    [
        ((MESSAGE_START, TEXT_START), ErrorKind.TRANSPORT),  # nothing shown yet
        ((MESSAGE_START, TEXT_START, TEXT_DELTA, BLOCK_STOP, MESSAGE_DELTA), INTERRUPTED),
    ],
    ids=["before_output", "after_output"],
)
async def test_stream_ending_without_message_stop(
    cut: tuple[dict[str, Any], ...], kind: ErrorKind
) -> None:
    with pytest.raises(AgentError) as caught:
        await stream_of(sse(*cut))
    assert caught.value.kind is kind
    assert "stream ended early" in str(caught.value)
    assert caught.value.retryable  # the whole call may be made again


async def test_invalid_json_in_a_stream_is_a_decode_error() -> None:
    with pytest.raises(AgentError) as caught:
        await stream_of(sse(MESSAGE_START, '{"type":"content_block_start", "index": 0,'))
    assert caught.value.kind is ErrorKind.DECODE


async def test_a_delta_for_a_block_before_the_latest_is_a_decode_error() -> None:
    """Blocks stream one at a time: a delta of block 0 after block 1 began would show its text
    out of its place (the garbled-recordings fuzz found one, two lines swapped)."""
    second = {**TEXT_START, "index": 1}
    late = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}}
    with pytest.raises(AgentError) as caught:
        await stream_of(sse(MESSAGE_START, TEXT_START, second, late, MESSAGE_STOP))
    assert caught.value.kind is ErrorKind.DECODE
    assert "delta for block 0 after block 1 began" in str(caught.value)


DEEP = "[" * 100_000  # json.loads raises RecursionError on this, not ValueError


async def test_absurdly_nested_stream_event_is_a_decode_error() -> None:
    with pytest.raises(AgentError) as caught:
        await stream_of(sse(MESSAGE_START, TEXT_START) + f"data: {DEEP}\n\n".encode())
    assert caught.value.kind is ErrorKind.DECODE
    assert caught.value.provider == "anthropic"


async def test_absurdly_nested_tool_input_is_kept_raw() -> None:
    """Arguments that are not JSON (here: too deep to parse) stay as the model wrote them."""
    tool_start = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
    }
    deep = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "input_json_delta", "partial_json": DEEP},
    }
    events = await stream_of(sse(MESSAGE_START, tool_start, deep, MESSAGE_DELTA, MESSAGE_STOP))
    [call] = done(events).tool_calls
    assert (call.id, call.arguments, call.raw_arguments) == ("t1", {}, DEEP)


@pytest.mark.parametrize("streaming", [False, True], ids=["chat", "stream"])
async def test_tool_input_nested_too_deep_for_the_message_model_is_a_decode_error(
    streaming: bool,
) -> None:
    nested = '{"a":' * 300 + "1" + "}" * 300  # valid JSON, deeper than the message model takes
    if streaming:
        tool_start = {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
        }
        delta = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": nested},
        }
        call = stream_of(sse(MESSAGE_START, tool_start, delta, MESSAGE_DELTA, MESSAGE_STOP))
    else:
        block = {"type": "tool_use", "id": "t1", "name": "f", "input": json.loads(nested)}
        reply = {**TEXT_REPLY, "content": [block]}
        call = chat_once(lambda request: httpx.Response(200, json=reply))
    with pytest.raises(AgentError) as caught:
        await call
    assert caught.value.kind is ErrorKind.DECODE


async def chat_once(handler: Handler) -> ChatResponse:
    async with aclosing(client_for(handler)) as client:
        return await client.chat(hello())


@pytest.mark.parametrize("index", [0, 1])
async def test_a_block_started_out_of_order_is_a_decode_error(index: int) -> None:
    later = {"type": "content_block_start", "index": 2, "content_block": {"type": "text"}}
    again = {"type": "content_block_start", "index": index, "content_block": {"type": "text"}}
    with pytest.raises(AgentError) as caught:
        await stream_of(sse(MESSAGE_START, later, again, MESSAGE_DELTA, MESSAGE_STOP))
    assert caught.value.kind is ErrorKind.DECODE


@pytest.mark.parametrize("streaming", [False, True], ids=["chat", "stream"])
async def test_a_key_echoed_in_a_200_error_is_scrubbed_even_where_the_body_is_cut(
    streaming: bool,
) -> None:
    # the body keeps 500 characters: the echoed key starts 20 characters before that cut
    padding = "x" * (
        BODY_LIMIT - 20 - len('{"type": "error", "error": {"type": "api_error", "message": "')
    )
    echo = {"type": "error", "error": {"type": "api_error", "message": padding + KEY}}
    assert json.dumps(echo).index(KEY) == BODY_LIMIT - 20
    body = sse(MESSAGE_START, echo) if streaming else json.dumps(echo).encode()
    client = client_for(lambda request: httpx.Response(200, content=body))
    async with aclosing(client):
        with pytest.raises(AgentError) as caught:
            await (collect(client, hello()) if streaming else client.chat(hello()))
    error = caught.value
    assert (error.kind, error.status) == (ErrorKind.UNAVAILABLE, 500)
    assert error.body is not None
    assert error.body.endswith(REDACTED)
    assert KEY[:8] not in error.body
    assert error.message.endswith(REDACTED)
    assert KEY[:8] not in error.message


async def test_stream_assembly_details() -> None:
    """Unknown events, data-only lines, invalid tool JSON, and usage updates."""
    events = await stream_of(
        sse(
            MESSAGE_START,
            {"type": "ping"},
            TEXT_START,
            TEXT_DELTA,
            {"type": "content_block_delta", "index": 0, "delta": {"type": "citations_delta"}},
            {"type": "brand_new_event", "index": 99},
            BLOCK_STOP,
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
            },
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"a": '},
            },
            {"type": "content_block_stop", "index": 1},
            {
                "type": "content_block_start",
                "index": 2,
                "content_block": {"type": "tool_use", "id": "t2", "name": "g", "input": {}},
            },
            {"type": "content_block_stop", "index": 2},
            {
                "type": "content_block_start",
                "index": 3,
                "content_block": {"type": "redacted_thinking", "data": "opaque"},
            },
            {"type": "content_block_stop", "index": 3},
            MESSAGE_DELTA,
        )
        # the last event with no "event:" line, as the vercel fixture-file streams have it
        + b'data: {"type":"message_stop"}   \n\n'
        # the reply is complete at message_stop; whatever follows is not read
        + b"data: {not json\n\n"
    )
    response = done(events)
    assert response.content == [
        TextPart(text="Hel"),
        ToolCallPart(tool_call=ToolCall(id="t1", name="f", arguments={}, raw_arguments='{"a": ')),
        ToolCallPart(tool_call=ToolCall(id="t2", name="g", arguments={})),
        RedactedThinkingPart(redacted_thinking=RedactedThinking(data="opaque")),
    ]
    assert response.usage == TokenUsage(input_tokens=1010, output_tokens=7, cache_read_tokens=1000)
    assert response.stop_reason is StopReason.END_TURN
    # blocks 1 and 2 are the first and second tool call: their events say 0 and 1
    assert events[:-1] == [
        TextDelta("Hel"),
        ToolCallStarted(0, "t1", "f"),
        ToolCallArgumentsDelta(0, '{"a": '),
        ToolCallStarted(1, "t2", "g"),
    ]


async def test_message_delta_usage_replaces_the_start_counts() -> None:
    # newer servers repeat input and cache counts in message_delta; they are the final ones
    late = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {
            "input_tokens": 12,
            "cache_read_input_tokens": 1000,
            "cache_creation_input_tokens": 50,
            "output_tokens": 9,
        },
    }
    response = done(await stream_of(sse(MESSAGE_START, TEXT_START, TEXT_DELTA, late, MESSAGE_STOP)))
    assert response.usage == TokenUsage(
        input_tokens=1062, output_tokens=9, cache_read_tokens=1000, cache_write_tokens=50
    )
    assert response.stop_reason is StopReason.END_TURN


@pytest.mark.parametrize(
    "bad",
    [
        {"type": "content_block_delta", "index": 5, "delta": {"type": "text_delta", "text": "x"}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": "{}"},
        },
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 3}},
        {"type": "content_block_delta", "index": "0", "delta": {"type": "text_delta", "text": "x"}},
        {"type": "message_start", "message": "hello"},
        {"type": "message_delta", "usage": {"output_tokens": "many"}},
    ],
)
async def test_malformed_stream_events_are_decode_errors(bad: dict[str, Any]) -> None:
    with pytest.raises(AgentError) as caught:
        await stream_of(sse(MESSAGE_START, TEXT_START, bad, MESSAGE_DELTA, MESSAGE_STOP))
    assert caught.value.kind is ErrorKind.DECODE


# --- fuzzing: only AgentError ever leaves the parsers ---------------------------------------

KEYS = st.sampled_from(
    [
        "type",
        "content",
        "text",
        "id",
        "name",
        "input",
        "thinking",
        "signature",
        "data",
        "usage",
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "stop_reason",
        "model",
        "error",
        "message",
    ]
)
TYPES = st.sampled_from(
    ["text", "tool_use", "thinking", "redacted_thinking", "error", "message", "image"]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | TYPES
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(KEYS | st.text(max_size=6), inner, max_size=5)
    ),
    max_leaves=15,
)
REPLIES = [n for n in fixture_names("anthropic") if load(n)["response"]["status"] == 200]
SUCCESS_BODIES = [load(n)["response"]["body"] for n in REPLIES if not is_stream(load(n))]
STREAM_BODIES = [sse_body(load(n)) for n in REPLIES if is_stream(load(n))]
FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def parse_or_agent_error(data: object) -> None:
    try:
        response = parse_response(data)
    except AgentError:
        return
    assert isinstance(response, ChatResponse)


@FUZZ
@given(JSON)
def test_parse_response_on_arbitrary_json_raises_only_agent_error(data: object) -> None:
    parse_or_agent_error(data)
    parse_or_agent_error({"content": [data]})
    parse_or_agent_error({"content": [], "usage": data, "stop_reason": data, "model": data})


def mutate(value: Any, data: st.DataObject) -> Any:
    """Replace, delete or recurse at one randomly chosen place in ``value``."""
    if isinstance(value, dict) and value:
        key = data.draw(st.sampled_from(sorted(value)))
        action = data.draw(st.sampled_from(["replace", "delete", "descend"]))
        if action == "delete":
            del value[key]
        elif action == "replace":
            value[key] = data.draw(JSON)
        else:
            value[key] = mutate(value[key], data)
        return value
    if isinstance(value, list) and value:
        i = data.draw(st.integers(0, len(value) - 1))
        value[i] = mutate(value[i], data) if data.draw(st.booleans()) else data.draw(JSON)
        return value
    return data.draw(JSON)


@FUZZ
@given(st.data())
def test_parse_response_on_mutated_real_bodies_raises_only_agent_error(data: st.DataObject) -> None:
    body = copy.deepcopy(data.draw(st.sampled_from(SUCCESS_BODIES)))
    for _ in range(data.draw(st.integers(1, 3))):
        body = mutate(body, data)
    parse_or_agent_error(body)


def garble(body: bytes, data: st.DataObject) -> bytes:
    how = data.draw(st.sampled_from(["truncate", "splice", "drop_line", "swap_lines"]))
    if how == "truncate":
        return body[: data.draw(st.integers(0, len(body)))]
    if how == "splice":
        at = data.draw(st.integers(0, len(body)))
        cut = data.draw(st.integers(0, 40))
        noise = data.draw(
            st.binary(max_size=20) | st.sampled_from([b"{", b"}", b'"', b"\n\n", b"data: "])
        )
        return body[:at] + noise + body[at + cut :]
    lines = body.split(b"\n")
    i = data.draw(st.integers(0, len(lines) - 1))
    if how == "drop_line":
        del lines[i]
    else:
        j = data.draw(st.integers(0, len(lines) - 1))
        lines[i], lines[j] = lines[j], lines[i]
    return b"\n".join(lines)


async def replay_stream(body: bytes) -> None:
    client = client_for(lambda request: httpx.Response(200, content=body))
    try:
        events = await collect(client, hello())
    except AgentError:
        return
    finally:
        await client.aclose()
    response = done(events)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == response.text


@FUZZ
@given(st.data())
def test_stream_parser_on_garbled_recordings_raises_only_agent_error(data: st.DataObject) -> None:
    body = data.draw(st.sampled_from(STREAM_BODIES))
    for _ in range(data.draw(st.integers(1, 3))):
        body = garble(body, data)
    asyncio.run(replay_stream(body))
