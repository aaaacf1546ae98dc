"""Rules every client keeps the same way: extra_body, tool-call indexes, keys, JSON, model lists."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import httpx
import pytest

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.messages import ChatMessage, TextPart, ToolCall, ToolCallPart, ToolDefinition
from agent_plugin.providers.anthropic import AnthropicClient
from agent_plugin.providers.base import (
    ChatRequest,
    ChatResponse,
    LlmClient,
    StreamDone,
    StreamEvent,
    ToolCallArgumentsDelta,
    ToolCallStarted,
    merge_extra_body,
)
from agent_plugin.providers.http import json_text, loads, model_ids, needs_api_key, require_key
from agent_plugin.providers.openai import OpenAICompatibleClient
from agent_plugin.providers.retry import RetryPolicy
from agent_plugin.providers.scripted import ScriptedModel
from agent_plugin.redaction import REDACTED

KEY = "sk-test-0123456789abcdefghij"
Handler = Callable[[httpx.Request], httpx.Response]
WEATHER = ToolDefinition(
    name="get_weather",
    description="Weather for a city.",
    input_schema={"type": "object", "properties": {"city": {"type": "string"}}},
)


def openai(handler: Handler, **kwargs: Any) -> OpenAICompatibleClient:
    return OpenAICompatibleClient(
        api_key=KEY, retry=RetryPolicy.never(), transport=httpx.MockTransport(handler), **kwargs
    )


def anthropic(handler: Handler, **kwargs: Any) -> AnthropicClient:
    return AnthropicClient(
        api_key=KEY, retry=RetryPolicy.never(), transport=httpx.MockTransport(handler), **kwargs
    )


def offline(_: httpx.Request) -> httpx.Response:
    raise AssertionError("nothing is sent")


Client = OpenAICompatibleClient | AnthropicClient
MAKERS: list[Callable[[Handler], Client]] = [openai, anthropic]
IDS = ["openai", "anthropic"]


# --- extra_body and tool_choice --------------------------------------------------------------


def test_merge_extra_body_sets_replaces_and_removes() -> None:
    body: dict[str, Any] = {"model": "m", "max_tokens": 10, "temperature": 0.5}
    nested = {"type": "enabled"}
    merge_extra_body(body, {"max_tokens": None, "temperature": 0.0, "thinking": nested, "x": None})
    assert body == {"model": "m", "temperature": 0.0, "thinking": nested}
    assert body["thinking"] is nested


@pytest.mark.parametrize("make", MAKERS, ids=IDS)
async def test_a_none_in_extra_body_removes_the_key_in_every_client(
    make: Callable[[Handler], Client],
) -> None:
    client = make(offline)
    request = ChatRequest(
        messages=[ChatMessage.user("x")],
        max_tokens=100,
        temperature=0.2,
        extra_body={"max_tokens": None, "temperature": None, "absent": None, "seed": 3},
    )
    async with aclosing(client):
        body = client.build_body(request, stream=False)
    assert "max_tokens" not in body
    assert "temperature" not in body
    assert "absent" not in body
    assert body["seed"] == 3
    assert "null" not in json.dumps(body)


@pytest.mark.parametrize("make", MAKERS, ids=IDS)
async def test_tool_choice_goes_only_with_tools(make: Callable[[Handler], Client]) -> None:
    client = make(offline)
    async with aclosing(client):
        bare = client.build_body(
            ChatRequest(messages=[ChatMessage.user("x")], tool_choice="required"), stream=False
        )
        armed = client.build_body(
            ChatRequest(messages=[ChatMessage.user("x")], tools=[WEATHER], tool_choice="required"),
            stream=False,
        )
    assert "tool_choice" not in bare
    assert "tool_choice" in armed


# --- ToolCallStarted.index: the call's place among the reply's tool calls -------------------

CALLS = [("c1", "get_weather", {"city": "Oslo"}), ("c2", "get_weather", {"city": "Rome"})]


def openai_stream(_: httpx.Request) -> httpx.Response:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return "data: " + json.dumps({"id": "r", "model": "m", "choices": [choice]}) + "\n\n"

    body = chunk({"content": "Checking both."})
    for n, (call_id, name, arguments) in enumerate(CALLS):
        function = {"name": name, "arguments": json.dumps(arguments)}
        body += chunk({"tool_calls": [{"index": n, "id": call_id, "function": function}]})
    body += chunk({}, "tool_calls") + "data: [DONE]\n\n"
    return httpx.Response(200, content=body.encode())


def anthropic_stream(_: httpx.Request) -> httpx.Response:
    def event(payload: dict[str, Any]) -> str:
        return f"event: {payload['type']}\ndata: {json.dumps(payload)}\n\n"

    message = {"id": "m", "model": "c", "content": [], "usage": {"input_tokens": 1}}
    body = event({"type": "message_start", "message": message})
    body += event(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    )
    body += event(
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "Checking both."},
        }
    )
    for n, (call_id, name, arguments) in enumerate(CALLS, start=1):  # blocks 1 and 2
        start = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        body += event({"type": "content_block_start", "index": n, "content_block": start})
        delta = {"type": "input_json_delta", "partial_json": json.dumps(arguments)}
        body += event({"type": "content_block_delta", "index": n, "delta": delta})
    body += event({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {}})
    body += event({"type": "message_stop"})
    return httpx.Response(200, content=body.encode())


def scripted() -> ScriptedModel:
    reply = ChatResponse(
        content=[
            TextPart(text="Checking both."),
            *[
                ToolCallPart(tool_call=ToolCall(id=call_id, name=name, arguments=arguments))
                for call_id, name, arguments in CALLS
            ],
        ]
    )
    return ScriptedModel([reply])


@pytest.mark.parametrize(
    "make",
    [lambda: openai(openai_stream), lambda: anthropic(anthropic_stream), scripted],
    ids=["openai", "anthropic", "scripted"],
)
async def test_stream_index_is_the_position_among_the_tool_calls(
    make: Callable[[], LlmClient],
) -> None:
    client = make()
    events: list[StreamEvent] = [
        event async for event in client.stream(ChatRequest(messages=[ChatMessage.user("x")]))
    ]
    await client.aclose()
    done = events[-1]
    assert isinstance(done, StreamDone)
    calls = done.response.tool_calls
    assert [(c.id, c.arguments) for c in calls] == [(i, a) for i, _, a in CALLS]
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    assert [e.index for e in started] == [0, 1]  # text came first, yet the calls are 0 and 1
    for event in started:
        assert calls[event.index].id == event.id
        fragments = [
            e.fragment
            for e in events
            if isinstance(e, ToolCallArgumentsDelta) and e.index == event.index
        ]
        assert json.loads("".join(fragments)) == calls[event.index].arguments


# --- keys -----------------------------------------------------------------------------------


@pytest.mark.parametrize("make", MAKERS, ids=IDS)
async def test_reprs_show_the_one_marker(make: Callable[[Handler], Client]) -> None:
    client = make(offline)
    async with aclosing(client):
        assert f"api_key='{REDACTED}'" in repr(client)
        assert KEY not in repr(client)


@pytest.mark.parametrize(
    ("provider", "base_url"),
    [
        ("openai-compatible", "https://api.openai.com/v1"),
        ("anthropic", "https://api.anthropic.com"),
    ],
)
def test_require_key_for_the_public_hosts(provider: str, base_url: str) -> None:
    with pytest.raises(AgentError) as caught:
        require_key(provider, base_url, None)
    assert caught.value.kind is ErrorKind.CONFIG
    assert "AGENT_API_KEY" in caught.value.message
    require_key(provider, base_url, KEY)
    require_key(provider, "http://localhost:11434/v1", None)
    require_key(provider, "https://api.openai.com.example.test/v1", None)  # a different host
    assert needs_api_key(base_url)
    assert not needs_api_key("http://localhost:11434/v1")
    assert not needs_api_key("http://h:abc")  # not a URL: left for the first request to report


# --- JSON ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["{", "", "[" * 100_000, b"\xff"])
def test_loads_turns_every_failure_into_a_decode_error(text: str | bytes) -> None:
    with pytest.raises(AgentError) as caught:
        loads(text, provider="p", what="stream chunk")
    assert caught.value.kind is ErrorKind.DECODE
    assert caught.value.provider == "p"
    assert caught.value.message == "p stream chunk is not JSON"


def test_loads_and_json_text() -> None:
    assert loads('{"a": [1, "é"]}', provider="p", what="x") == {"a": [1, "é"]}
    assert json_text({"a": "é"}) == '{"a": "é"}'
    assert json_text({"x": "y" * 2000}).endswith('"}')  # whole: AgentError cuts the body
    assert json_text({1j}) == "{1j}"  # not JSON: its repr


# --- model lists -----------------------------------------------------------------------------


def testmodel_ids() -> None:
    assert model_ids({"data": [{"id": "a"}, {"id": "b", "x": 1}]}, "p") == ["a", "b"]
    for bad, says in [
        ({"data": {}}, "p model list has no data array"),
        ([], "p model list has no data array"),
        ({"data": [{"id": 1}]}, "p model list entry has no id"),
    ]:
        with pytest.raises(AgentError) as caught:
            model_ids(bad, "p")
        assert (caught.value.kind, caught.value.message) == (ErrorKind.DECODE, says)


@pytest.mark.parametrize(
    ("make", "provider"),
    [(openai, "openai-compatible"), (anthropic, "anthropic")],
    ids=IDS,
)
async def test_both_clients_read_model_lists_alike(
    make: Callable[[Handler], Client], provider: str
) -> None:
    answers = [{"data": [{"id": "m1"}, {"id": "m2"}]}, {"models": []}]
    client = make(lambda _: httpx.Response(200, json=answers.pop(0)))
    async with aclosing(client):
        assert await client.list_models() == ["m1", "m2"]
        with pytest.raises(AgentError) as caught:
            await client.list_models()
    assert caught.value.message == f"{provider} model list has no data array"
