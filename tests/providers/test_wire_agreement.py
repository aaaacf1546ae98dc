"""Streaming and non-streaming agree on every recording in ``tests/fixtures/wire``.

Each recorded chat answer goes through a client twice: as recorded, and converted to the
other form by the reference in :mod:`tests.wire` (a stream folded into the body it adds up to,
a body turned into the stream a server sends for it). ``chat`` and ``stream`` must then give
the same reply, or the same error. A paused turn is replayed with its recorded continuation.
"""

from __future__ import annotations

import json
from contextlib import aclosing
from typing import Any

import httpx
import pytest

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.messages import ChatMessage
from agent_plugin.providers.anthropic import AnthropicClient
from agent_plugin.providers.base import ChatRequest, ChatResponse, StreamDone
from agent_plugin.providers.openai import OpenAICompatibleClient
from agent_plugin.providers.retry import RetryPolicy
from tests.wire import (
    PAUSED_TURNS,
    answer,
    anthropic_folded,
    anthropic_stream,
    fixture_names,
    is_stream,
    load,
    openai_folded,
    openai_stream,
    replay,
    sse_body,
)

KEY = "sk-test-agreement-0123456789"


def chat_recordings() -> list[str]:
    """Every recorded chat call (the model lists are GETs, with no streaming form)."""
    return [n for n in fixture_names() if not load(n)["request"]["path"].endswith("/models")]


def test_the_agreement_covers_every_chat_recording() -> None:
    names = chat_recordings()
    assert len(names) == len(fixture_names()) - 2  # the OpenAI and Cerebras model lists
    assert all(is_stream(load(n)) == is_stream(load(PAUSED_TURNS[n])) for n in PAUSED_TURNS)


def converted(fixture: dict[str, Any]) -> httpx.Response:
    """The recorded answer in the other form: a stream as its whole body, a body as a stream."""
    anthropic = fixture["provider"] == "anthropic"
    status, headers = fixture["response"]["status"], dict(fixture["response"]["headers"])
    headers.pop("content-type", None)
    if status >= 400:  # an error answer is the same JSON body either way
        return answer(fixture)
    if is_stream(fixture):
        body = sse_body(fixture)
        whole = anthropic_folded(body) if anthropic else openai_folded(body)
        return httpx.Response(status, headers=headers, json=whole)
    recorded = fixture["response"]["body"]
    stream = anthropic_stream(recorded) if anthropic else openai_stream(recorded)
    return httpx.Response(
        status, headers={**headers, "content-type": "text/event-stream"}, content=stream
    )


def client(fixture: dict[str, Any], handler: Any) -> AnthropicClient | OpenAICompatibleClient:
    transport = httpx.MockTransport(handler)
    if fixture["provider"] == "anthropic":
        return AnthropicClient(api_key=KEY, retry=RetryPolicy.never(), transport=transport)
    return OpenAICompatibleClient(
        base_url="http://llm.test/v1", api_key=KEY, retry=RetryPolicy.never(), transport=transport
    )


async def reply(fixture: dict[str, Any], handler: Any, *, streaming: bool) -> ChatResponse:
    request = ChatRequest(messages=[ChatMessage.user("hi")])
    async with aclosing(client(fixture, handler)) as model:
        if not streaming:
            return await model.chat(request)
        events = [event async for event in model.stream(request)]
    assert [type(e) for e in events].count(StreamDone) == 1
    done = events[-1]
    assert isinstance(done, StreamDone)
    return done.response


async def outcome(
    fixture: dict[str, Any], handler: Any, *, streaming: bool
) -> ChatResponse | AgentError:
    try:
        return await reply(fixture, handler, streaming=streaming)
    except AgentError as error:
        return error


def same_error(one: AgentError, other: AgentError) -> bool:
    """The same error said by a stream and a whole answer: the same kind, status and provider
    (a stream broken off after output is interrupted where a whole answer has the retryable
    kind of the cause)."""
    kinds = {one.kind, other.kind}
    interrupted = ErrorKind.STREAM_INTERRUPTED in kinds
    same_kind = one.kind is other.kind or (interrupted and one.retryable and other.retryable)
    return same_kind and (one.status, one.provider) == (other.status, other.provider)


@pytest.mark.parametrize("name", chat_recordings())
async def test_streaming_and_non_streaming_agree(name: str) -> None:
    fixture = load(name)
    followed = [load(PAUSED_TURNS[name])] if name in PAUSED_TURNS else []
    streamed = is_stream(fixture)
    as_recorded = replay(fixture, *followed)
    other = replay(converted(fixture), *(converted(f) for f in followed))
    recorded_way = await outcome(fixture, as_recorded, streaming=streamed)
    other_way = await outcome(fixture, other, streaming=not streamed)
    if fixture["response"]["status"] >= 400 or name in ERROR_IN_A_200:
        assert isinstance(recorded_way, AgentError)
        assert isinstance(other_way, AgentError)
        assert same_error(recorded_way, other_way)
    else:
        assert isinstance(recorded_way, ChatResponse)
        assert recorded_way == other_way


# 200 answers that carry an error
ERROR_IN_A_200 = {
    "openai-compatible__openrouter-stream_comments_and_midstream_error__pydantic-ai",
    "anthropic__stream_error_overloaded__documented-example",
}


def test_the_converters_are_inverse_on_a_recorded_body() -> None:
    """The reference itself: a body streamed and folded back is the body (what the clients
    read of it), so the agreement above compares like with like."""
    body = load("anthropic__thinking_then_tool_use__pydantic-ai")["response"]["body"]
    folded = anthropic_folded(anthropic_stream(body))
    assert folded["content"] == body["content"]
    assert (folded["stop_reason"], folded["usage"]) == (body["stop_reason"], body["usage"])
    body = load("openai-compatible__tool_calls_parallel__mirascope")["response"]["body"]
    folded = openai_folded(openai_stream(body))
    message, recorded = folded["choices"][0]["message"], body["choices"][0]["message"]
    assert [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [
        json.loads(c["function"]["arguments"]) for c in recorded["tool_calls"]
    ]
    assert folded["usage"] == body["usage"]
