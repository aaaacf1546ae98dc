"""Anthropic's server-side tools and paused turns, against recorded traffic.

Web search and code execution run on Anthropic's side: their calls and results come back in the
reply (parsed, or kept whole), are sent back unchanged in later requests, and never reach the
agent as tool calls. A turn the server pauses (``pause_turn``) is continued by the client with
the reply so far. The recordings are pydantic-ai's (see ``tests/fixtures/wire/README.md``).
"""

from __future__ import annotations

import json
from contextlib import aclosing
from typing import Any

import httpx
import pytest

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.messages import (
    ChatMessage,
    ProviderBlock,
    ProviderBlockPart,
    Role,
    StopReason,
    TextPart,
)
from agent_plugin.providers.anthropic import PAUSE_TURN_LIMIT, ServerTool
from agent_plugin.providers.base import (
    ChatRequest,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStarted,
)
from tests.providers.test_anthropic_wire import (
    TEXT_REPLY,
    WEATHER,
    Capture,
    builder,
    clean,
    client_for,
    conversation,
    fx,
    hello,
    normalised,
    server_tools_of,
)
from tests.wire import PAUSED_TURNS, anthropic_folded, collect, done, load, replay, sse_body


def sent_body(request: httpx.Request) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(request.content)
    return body


async def test_server_tool_blocks_are_sent_back_as_the_recorded_follow_up() -> None:
    """A reply with server tool blocks, then the user's next question, is the recorded request
    of the next turn: the blocks go back as they came, the container named in extra_body."""
    first = fx("server_tool_code_execution__pydantic-ai")
    recorded = fx("server_tool_result_followup__pydantic-ai")["request"]["body"]
    request = conversation(first["request"]["body"], caching=False)
    tools = server_tools_of(first["request"]["body"])
    async with aclosing(client_for(replay(first), server_tools=tools)) as client:
        reply = await client.chat(request)
        request.messages += [
            ChatMessage(role=Role.ASSISTANT, content=reply.content),
            ChatMessage.user("And what about 4 * 12390?"),
        ]
        request.extra_body = {
            **request.extra_body,
            "container": first["response"]["body"]["container"]["id"],
        }
        ours = client.build_body(request, stream=False)
    assert [type(p).__name__ for p in reply.content] == [
        "ServerToolCallPart",
        "ServerToolResultPart",
        "TextPart",
    ]
    assert ours["messages"][1]["content"] == recorded["messages"][1]["content"]
    assert clean(ours) == normalised(recorded)


@pytest.mark.parametrize(
    "name",
    [
        "stream_server_tool_code_execution__pydantic-ai",
        "stream_server_tool_web_search__pydantic-ai",
    ],
)
async def test_a_streamed_server_tool_call_is_kept_and_announced_as_no_tool_call(name: str) -> None:
    """Its input arrives as input_json_delta fragments inside a server_tool_use block: they
    build the call's arguments and reach the caller as no ToolCall event (the agent runs
    nothing), and the reply sent back is the recorded block."""
    fixture = fx(name)
    async with aclosing(client_for(replay(fixture))) as client:
        events = await collect(client, hello())
    reply = done(events)
    assert not [e for e in events if isinstance(e, ToolCallStarted | ToolCallArgumentsDelta)]
    assert reply.tool_calls == []
    folded = anthropic_folded(sse_body(fixture))
    calls = [b for b in folded["content"] if b["type"] == "server_tool_use"]
    assert calls
    assert all(b["input"] for b in calls)  # the fragments added up to real input
    sent = builder(prompt_caching=False).build_body(
        ChatRequest(messages=[ChatMessage(role=Role.ASSISTANT, content=reply.content)]),
        stream=True,
    )
    assert clean(sent["messages"][0]["content"]) == clean(
        [b | ({"citations": None} if b["type"] == "text" else {}) for b in folded["content"]]
    )


@pytest.mark.parametrize("streaming", [False, True], ids=["chat", "stream"])
async def test_a_paused_turn_is_continued_with_the_reply_so_far(streaming: bool) -> None:
    """pause_turn: the client sends the paused reply back as it is and returns one reply
    (both requests recorded; the second one is what the client sends)."""
    paused = (
        "stream_pause_turn_web_search__pydantic-ai"
        if streaming
        else "pause_turn_web_search__pydantic-ai"
    )
    name = f"anthropic__{paused}"
    first, then = load(name), load(PAUSED_TURNS[name])
    sent: list[httpx.Request] = []
    tools = server_tools_of(first["request"]["body"])
    request = conversation(first["request"]["body"], caching=False)
    async with aclosing(client_for(replay(first, then, sent=sent), server_tools=tools)) as client:
        if streaming:
            events = await collect(client, request)
            reply = done(events)
            assert "".join(e.text for e in events if isinstance(e, TextDelta)) == reply.text
        else:
            reply = await client.chat(request)
    assert len(sent) == 2
    assert clean(sent_body(sent[0])) == normalised(first["request"]["body"])
    continued = normalised(then["request"]["body"])
    if streaming:
        # the recording's own quirk: pydantic-ai re-sent one search result title with "-"
        # where the stream had "–" (the API reads the encrypted content, not the title)
        for block in continued["messages"][1]["content"]:
            for result in block["content"] if block["type"] == "web_search_tool_result" else []:
                if result["title"] == "San Francisco Bay Area weather forecast - NBC Bay Area":
                    result["title"] = "San Francisco Bay Area weather forecast – NBC Bay Area"
    assert clean(sent_body(sent[1])) == continued
    assert (reply.stop_reason, reply.raw_stop_reason) == (StopReason.END_TURN, "end_turn")
    # one reply: the paused part, then the continuation, the usage of both requests
    whole = [
        anthropic_folded(sse_body(f)) if streaming else f["response"]["body"] for f in (first, then)
    ]
    assert len(reply.content) == sum(len(w["content"]) for w in whole)
    assert reply.usage.output_tokens == sum(w["usage"]["output_tokens"] for w in whole)
    assert reply.id == whole[1]["id"]


async def test_a_turn_paused_for_ever_stops_after_the_limit() -> None:
    body = {**TEXT_REPLY, "stop_reason": "pause_turn"}
    capture = Capture(body)
    async with aclosing(client_for(capture)) as client:
        reply = await client.chat(hello())
    assert len(capture.requests) == PAUSE_TURN_LIMIT + 1
    assert (reply.stop_reason, reply.raw_stop_reason) == (StopReason.UNKNOWN, "pause_turn")
    assert reply.text == "4200 + 42 = 4242" * (PAUSE_TURN_LIMIT + 1)
    # every continuation carries the whole turn so far, after the caller's own messages
    assert [len(json.loads(r.content)["messages"]) for r in capture.requests] == [1] + [
        2
    ] * PAUSE_TURN_LIMIT


async def test_a_paused_turn_continues_in_its_container() -> None:
    """A paused code-execution turn goes on in the container it ran in, unless the request
    names one itself."""
    paused = {
        **fx("server_tool_code_execution__pydantic-ai")["response"]["body"],
        "stop_reason": "pause_turn",
    }
    answers = [httpx.Response(200, json=paused), httpx.Response(200, json=TEXT_REPLY)] * 2
    sent: list[httpx.Request] = []
    async with aclosing(client_for(replay(*answers, sent=sent))) as client:
        await client.chat(hello())
        await client.chat(
            ChatRequest(messages=[ChatMessage.user("hi")], extra_body={"container": "mine"})
        )
    assert [sent_body(r).get("container") for r in sent] == [
        None,
        paused["container"]["id"],
        "mine",
        "mine",
    ]


def test_server_tools_are_declared_after_the_apps_tools() -> None:
    tools = [
        ServerTool.web_search(max_uses=3, allowed_domains=["example.com"]),
        ServerTool.code_execution(),
    ]
    client = builder(server_tools=tools)
    body = client.build_body(
        ChatRequest(messages=[ChatMessage.user("x")], tools=[WEATHER], tool_choice="auto"),
        stream=False,
    )
    assert body["tools"] == [
        {
            "name": "get_weather",
            "description": "Weather for a city",
            "input_schema": WEATHER.input_schema,
        },
        {
            "type": "web_search_20250305",
            "name": "web_search",
            "max_uses": 3,
            "allowed_domains": ["example.com"],
        },
        {
            "type": "code_execution_20250825",
            "name": "code_execution",
            "cache_control": {"type": "ephemeral"},
        },
    ]
    assert body["tool_choice"] == {"type": "auto"}
    # with server tools only, tool_choice still goes (pydantic-ai's recordings send it so)
    only = client.build_body(
        ChatRequest(messages=[ChatMessage.user("x")], tool_choice="none"), stream=False
    )
    assert only["tool_choice"] == {"type": "none"}
    assert [t["name"] for t in only["tools"]] == ["web_search", "code_execution"]
    assert (
        client.encode_body(
            ChatRequest(messages=[ChatMessage.user("x")], tools=(WEATHER,)), stream=False
        )
        == json.dumps(
            client.build_body(
                ChatRequest(messages=[ChatMessage.user("x")], tools=(WEATHER,)), stream=False
            ),
            separators=(",", ":"),
            ensure_ascii=False,
        ).encode()
    )


async def test_server_tools_beta_flags_go_in_the_beta_header() -> None:
    capture = Capture(TEXT_REPLY)
    tools = [ServerTool.code_execution(), ServerTool.web_fetch(), ServerTool.web_search()]
    async with aclosing(client_for(capture, server_tools=tools)) as client:
        await client.chat(hello())
    assert (
        capture.requests[0].headers["anthropic-beta"]
        == "code-execution-2025-08-25,web-fetch-2025-09-10"
    )
    plain = Capture(TEXT_REPLY)
    async with aclosing(client_for(plain, server_tools=[ServerTool.web_search()])) as client:
        await client.chat(hello())
    assert "anthropic-beta" not in plain.requests[0].headers


@pytest.mark.parametrize(
    ("args", "says"),
    [(("", "x"), "type and its name"), (("t", "x", {"name": "y"}), "repeat")],
)
def test_a_server_tool_is_checked_when_declared(args: tuple[Any, ...], says: str) -> None:
    with pytest.raises(AgentError) as caught:
        ServerTool(*args)
    assert caught.value.kind is ErrorKind.CONFIG
    assert says in caught.value.message


def test_parts_of_other_providers_are_not_sent_and_cache_markers_skip_kept_blocks() -> None:
    kept = {"type": "mcp_tool_use", "id": "m1", "name": "f", "server_name": "s", "input": {}}
    request = ChatRequest(
        messages=[
            ChatMessage.user("hi"),
            ChatMessage(
                role=Role.ASSISTANT,
                content=[
                    TextPart(text="calling"),
                    ProviderBlockPart(
                        provider_block=ProviderBlock(
                            provider="openai-responses", data={"type": "x"}
                        )
                    ),
                    ProviderBlockPart(
                        provider_block=ProviderBlock(provider="anthropic", data=kept)
                    ),
                ],
            ),
        ]
    )
    body = builder().build_body(request, stream=False)
    assert body["messages"][1]["content"] == [
        {"type": "text", "text": "calling", "cache_control": {"type": "ephemeral"}},
        kept,
    ]


def test_parallel_tool_calls_false_disables_parallel_tool_use() -> None:
    body = builder().build_body(
        ChatRequest(messages=[ChatMessage.user("x")], tools=[WEATHER], parallel_tool_calls=False),
        stream=False,
    )
    assert body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    named = builder().build_body(
        ChatRequest(
            messages=[ChatMessage.user("x")],
            tools=[WEATHER],
            tool_choice="get_weather",
            parallel_tool_calls=False,
        ),
        stream=False,
    )
    assert named["tool_choice"] == {
        "type": "tool",
        "name": "get_weather",
        "disable_parallel_tool_use": True,
    }
    never = builder().build_body(
        ChatRequest(
            messages=[ChatMessage.user("x")],
            tools=[WEATHER],
            tool_choice="none",
            parallel_tool_calls=False,
        ),
        stream=False,
    )
    assert never["tool_choice"] == {"type": "none"}
