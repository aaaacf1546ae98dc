"""A stream cut midway, in both wire clients, on recorded streams cut short.

Before anything was yielded the whole request is made again (the caller has seen nothing);
once output was yielded, the stream ends with a StreamInterrupted error and no StreamDone, so
the partial reply reaches no transcript and the caller (a background run's retry) may make the
whole call again.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

import httpx
import pytest

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.messages import ChatMessage
from agent_plugin.providers.anthropic import AnthropicClient
from agent_plugin.providers.base import ChatRequest, StreamDone, StreamEvent, TextDelta
from agent_plugin.providers.openai import OpenAICompatibleClient
from agent_plugin.providers.retry import RetryNotice, RetryPolicy, interrupted
from tests.wire import answer, done, load, replay, sse_body

KEY = "sk-test-stream-retry-0123456789"
NOW = RetryPolicy(max_attempts=3, base_delay=0.0, max_delay=0.0)

Client = AnthropicClient | OpenAICompatibleClient


def anthropic(handler: Callable[[httpx.Request], httpx.Response]) -> Client:
    return AnthropicClient(api_key=KEY, retry=NOW, transport=httpx.MockTransport(handler))


def openai(handler: Callable[[httpx.Request], httpx.Response]) -> Client:
    return OpenAICompatibleClient(
        base_url="http://llm.test/v1",
        api_key=KEY,
        retry=NOW,
        transport=httpx.MockTransport(handler),
    )


# (client, recording, the first line that yields output: the stream is cut before or after it)
STREAMS = [
    (anthropic, "anthropic__stream_text__llm-anthropic", '"text_delta"'),
    (anthropic, "anthropic__stream_server_tool_code_execution__pydantic-ai", '"thinking_delta"'),
    (openai, "openai-compatible__stream_text__mirascope", '"content":"420"'),
    (openai, "openai-compatible__mistral-stream_thinking_parts__pydantic-ai", '"type":"thinking"'),
]
IDS = [name.split("__")[1] for _, name, _ in STREAMS]


def cut(fixture: dict[str, Any], marker: str, *, keep_it: bool) -> httpx.Response:
    """The recorded stream cut off before (or just after) the first line holding ``marker``."""
    lines = fixture["response"]["sse"]
    at = next(i for i, line in enumerate(lines) if marker in line)
    kept = lines[: at + 2 if keep_it else at]  # a data line and the blank line after it
    return answer(fixture, ("\n".join(kept) + "\n").encode())


async def events_until_error(client: Client) -> tuple[list[StreamEvent], AgentError | None]:
    seen: list[StreamEvent] = []
    request = ChatRequest(messages=[ChatMessage.user("hi")], on_retry=NOTICES.append)
    try:
        async with aclosing(client):
            async for event in client.stream(request):
                seen.append(event)
    except AgentError as error:
        return seen, error
    return seen, None


NOTICES: list[RetryNotice] = []


@pytest.fixture(autouse=True)
def _fresh_notices() -> None:
    NOTICES.clear()


@pytest.mark.parametrize(("make", "name", "marker"), STREAMS, ids=IDS)
async def test_a_stream_cut_before_any_output_is_made_again(
    make: Callable[..., Client], name: str, marker: str
) -> None:
    fixture = load(name)
    sent: list[httpx.Request] = []
    client = make(replay(cut(fixture, marker, keep_it=False), fixture, sent=sent))
    seen, error = await events_until_error(client)
    assert error is None
    assert len(sent) == 2
    assert sent[0].content == sent[1].content  # the same request, again
    assert [(n.attempt, n.error.kind) for n in NOTICES] == [(1, ErrorKind.TRANSPORT)]
    # what the caller got is exactly the whole recording, once
    whole = make(replay(fixture))
    assert seen == (await events_until_error(whole))[0]


@pytest.mark.parametrize(("make", "name", "marker"), STREAMS, ids=IDS)
async def test_a_stream_cut_after_output_ends_interrupted(
    make: Callable[..., Client], name: str, marker: str
) -> None:
    fixture = load(name)
    sent: list[httpx.Request] = []
    client = make(replay(cut(fixture, marker, keep_it=True), fixture, sent=sent))
    seen, error = await events_until_error(client)
    assert error is not None
    assert error.kind is ErrorKind.STREAM_INTERRUPTED
    assert error.retryable
    assert "stream ended early" in error.message
    assert "that part was discarded" in error.message
    assert len(sent) == 1  # not repeated under the caller's feet
    assert NOTICES == []
    assert seen  # the output before the cut was delivered
    assert not any(isinstance(e, StreamDone) for e in seen)  # and never became a reply


OVERLOADED = "anthropic__stream_error_overloaded__documented-example"


async def test_an_overloaded_error_event_after_output_ends_interrupted() -> None:
    """Anthropic's documented mid-stream ``overloaded_error`` event, after text."""
    fixture = load(OVERLOADED)
    seen, error = await events_until_error(anthropic(replay(fixture)))
    assert [e for e in seen if isinstance(e, TextDelta)] == [TextDelta("Hello"), TextDelta("!")]
    assert error is not None
    assert (error.kind, error.status) == (ErrorKind.STREAM_INTERRUPTED, 529)
    assert "overloaded_error" in error.message


async def test_an_overloaded_error_event_before_output_is_made_again() -> None:
    fixture = load(OVERLOADED)
    lines = [line for line in fixture["response"]["sse"] if "content_block_delta" not in line]
    overloaded_first = answer(fixture, "\n".join(lines).encode())
    whole = load("anthropic__stream_text__llm-anthropic")
    seen, error = await events_until_error(anthropic(replay(overloaded_first, whole)))
    assert error is None
    assert done(seen).text == "".join(e.text for e in seen if isinstance(e, TextDelta))
    assert [(n.error.kind, n.error.status) for n in NOTICES] == [(ErrorKind.UNAVAILABLE, 529)]


async def test_a_paused_turn_cut_in_its_continuation_ends_interrupted() -> None:
    """The continuation of a paused turn is a new request, retried while it showed nothing;
    but the caller has seen the paused part already, so failing for good is an interruption."""
    first = load("anthropic__stream_pause_turn_web_search__pydantic-ai")
    then = load("anthropic__stream_pause_turn_continuation__pydantic-ai")
    lines = then["response"]["sse"]
    stop = next(i for i, line in enumerate(lines) if "content_block_start" in line)
    broken = answer(then, "\n".join(lines[:stop]).encode())
    sent: list[httpx.Request] = []
    seen, error = await events_until_error(
        anthropic(replay(first, broken, broken, broken, sent=sent))
    )
    assert len(sent) == 4  # the first request, then the continuation three times (the policy)
    assert [n.attempt for n in NOTICES] == [1, 2]
    assert error is not None
    assert error.kind is ErrorKind.STREAM_INTERRUPTED
    assert any(isinstance(e, TextDelta) for e in seen)
    assert not any(isinstance(e, StreamDone) for e in seen)


def test_interrupted_keeps_what_the_error_said_and_leaves_final_errors_alone() -> None:
    cause = AgentError(
        ErrorKind.UNAVAILABLE, "busy", provider="anthropic", status=529, retry_after=2.0, body="b"
    )
    error = interrupted(cause)
    assert (error.kind, error.provider, error.status, error.retry_after, error.body) == (
        ErrorKind.STREAM_INTERRUPTED,
        "anthropic",
        529,
        2.0,
        "b",
    )
    assert "[Unavailable] busy" in error.message
    assert interrupted(error) is error
    final = AgentError(ErrorKind.PROVIDER, "bad request", status=400)
    assert interrupted(final) is final


def test_the_cut_recordings_are_cut_where_output_starts() -> None:
    """The test's own cuts: before the marker nothing is output, after it something is."""
    for _, name, marker in STREAMS:
        fixture = load(name)
        before = cut(fixture, marker, keep_it=False).content
        after = cut(fixture, marker, keep_it=True).content
        assert marker.encode() not in before
        assert marker.encode() in after
        assert sse_body(fixture).startswith(before)


class Recorded(httpx.AsyncByteStream):
    """A recorded body served in its lines; remembers whether it was closed."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for line in self.body.splitlines(keepends=True):
            yield line

    async def aclose(self) -> None:
        self.closed = True


@pytest.mark.parametrize(("make", "name", "marker"), STREAMS, ids=IDS)
async def test_a_caller_that_stops_early_closes_the_response_at_once(
    make: Callable[..., Client], name: str, marker: str
) -> None:
    fixture = load(name)
    body = Recorded(sse_body(fixture))
    client = make(
        lambda _: httpx.Response(200, headers=fixture["response"]["headers"], stream=body)
    )
    async with aclosing(client):
        events = client.stream(ChatRequest(messages=[ChatMessage.user("hi")]))
        assert isinstance(events, AsyncGenerator)
        async with aclosing(events):
            await anext(events)
        assert body.closed  # not left for the garbage collector
