"""The Anthropic Messages client against recorded real traffic (``tests/fixtures/wire``).

Every ``anthropic__*`` fixture has an explicit expectation below. Success bodies and streams are
replayed byte for byte through the real client over ``httpx.MockTransport`` with the recorded
status and headers; recorded requests are rebuilt as :class:`ChatRequest`s and compared with what
``build_body`` sends.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from agent_plugin.errors import BODY_LIMIT, AgentError, ErrorKind
from agent_plugin.messages import (
    ChatMessage,
    ContentPart,
    Image,
    ImagePart,
    ProviderBlockPart,
    RedactedThinking,
    RedactedThinkingPart,
    Role,
    ServerToolCall,
    ServerToolCallPart,
    ServerToolResult,
    ServerToolResultPart,
    StopReason,
    TextPart,
    Thinking,
    ThinkingPart,
    TokenUsage,
    ToolCall,
    ToolCallPart,
    ToolDefinition,
    ToolResult,
    ToolResultPart,
)
from agent_plugin.providers.anthropic import (
    AnthropicClient,
    ServerTool,
    parse_response,
)
from agent_plugin.providers.base import (
    ChatRequest,
    ChatResponse,
    LlmClient,
    StreamDone,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallArgumentsDelta,
    ToolCallStarted,
)
from agent_plugin.providers.retry import RetryNotice, RetryPolicy
from agent_plugin.redaction import REDACTED
from tests.wire import (
    PAUSED_TURNS,
    anthropic_folded,
    collect,
    done,
    fixture_names,
    is_stream,
    load,
    replay,
    sse_body,
)
from tests.wire import sse as wire_sse

NAMES = fixture_names("anthropic")
KEY = "sk-ant-api03-test-key-0123456789abcdef"
Handler = Callable[[httpx.Request], httpx.Response]


def fx(short: str) -> dict[str, Any]:
    return load(f"anthropic__{short}")


def client_for(handler: Handler, **kwargs: Any) -> AnthropicClient:
    kwargs.setdefault("api_key", KEY)
    kwargs.setdefault("retry", RetryPolicy.never())
    return AnthropicClient(transport=httpx.MockTransport(handler), **kwargs)


def unreachable(request: httpx.Request) -> httpx.Response:
    raise AssertionError("build_body tests send nothing")


def builder(**kwargs: Any) -> AnthropicClient:
    """A client for the pure ``build_body``; its mock transport makes it cheap to create."""
    kwargs.setdefault("api_key", KEY)  # the public host needs one
    return AnthropicClient(transport=httpx.MockTransport(unreachable), **kwargs)


def sse(*payloads: dict[str, Any] | str) -> bytes:
    """An Anthropic-style SSE body: ``event:`` named after the payload's type."""
    return wire_sse(list(payloads), named=True)


def hello() -> ChatRequest:
    return ChatRequest(messages=[ChatMessage.user("hi")])


def recorded(name: str) -> Handler:
    """Answer with the recording (and, for a paused turn, then with its continuation)."""
    continued = PAUSED_TURNS.get(name)
    return replay(load(name), *([load(continued)] if continued else []))


# --- expectations for every fixture --------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """A successful reply: text (start and end), tool calls, stop reason, normalised usage."""

    starts: str
    stop: StopReason
    usage: TokenUsage
    model: str
    ends: str = ""
    calls: tuple[tuple[str, str, Any], ...] = ()
    thinking: str = ""  # start of the thinking text, when there is a thinking block
    signature: str = ""  # start of its signature
    server: dict[str, int] = field(default_factory=dict)  # server tool calls and results


@dataclass(frozen=True)
class Failure:
    kind: ErrorKind
    status: int
    says: str  # the provider's message, which must reach the error


def usage(inp: int, out: int, read: int = 0, write: int = 0) -> TokenUsage:
    return TokenUsage(
        input_tokens=inp, output_tokens=out, cache_read_tokens=read, cache_write_tokens=write
    )


SONNET4 = "claude-sonnet-4-20250514"
OPUS3 = "claude-3-opus-20240229"
HAIKU45 = "claude-haiku-4-5-20251001"
SONNET45 = "claude-sonnet-4-5-20250929"
SONNET46 = "claude-sonnet-4-6"
WEATHER_CALL = ("toolu_01DYJo37oETVsCdLTTcCWcdq", "get_weather", {"location": "San Francisco, CA"})
SECRETS_CALLS = (
    ("toolu_015cUijgET79LXjgeYQerN2h", "secret_retrieval_tool", {"password": "mellon"}),
    ("toolu_01XZTimPexA7h3EVKesnKt5T", "secret_retrieval_tool", {"password": "radiance"}),
)

EXPECTED: dict[str, Reply | Failure] = {
    "anthropic__error_400_invalid_request__dd-trace-py": Failure(
        ErrorKind.PROVIDER, 400, "Input does not match the expected shape"
    ),
    "anthropic__error_400_tool_result_without_tool_use__vercel-ai": Failure(
        ErrorKind.PROVIDER, 400, "unexpected `tool_use_id` found in `tool_result` blocks"
    ),
    "anthropic__error_401_authentication__dd-trace-py": Failure(
        ErrorKind.AUTHENTICATION, 401, "invalid x-api-key"
    ),
    "anthropic__error_401_on_stream_request__dd-trace-py": Failure(
        ErrorKind.AUTHENTICATION, 401, "invalid x-api-key"
    ),
    "anthropic__error_404_model_not_found__mirascope": Failure(
        ErrorKind.PROVIDER, 404, "model: this-model-does-not-exist-12345"
    ),
    "anthropic__error_429_rate_limit__issue-claude-code-71634": Failure(
        ErrorKind.RATE_LIMITED, 429, "Rate limited"
    ),
    "anthropic__error_500_api_error__issue-claude-code-45350": Failure(
        ErrorKind.UNAVAILABLE, 500, "Internal server error"
    ),
    "anthropic__error_500_api_error_null_request_id__issue-claude-code-11592": Failure(
        ErrorKind.UNAVAILABLE, 500, "Internal server error"
    ),
    "anthropic__error_529_overloaded__issue-cline-52": Failure(
        ErrorKind.UNAVAILABLE, 529, "Overloaded"
    ),
    "anthropic__prompt_cache_read__dd-trace-py": Reply(
        "A **system** is an organized collection",
        StopReason.MAX_TOKENS,
        usage(11 + 2055, 100, read=2055),
        SONNET4,
        ends="The external context in",
    ),
    "anthropic__prompt_cache_write_1h_ttl__dd-trace-py": Reply(
        "Here are the key principles for designing scalable systems",
        StopReason.MAX_TOKENS,
        usage(17 + 2056, 100, write=2056),
        SONNET4,
        ends="Use microservices architecture where",
    ),
    "anthropic__prompt_cache_write__dd-trace-py": Reply(
        "Here are the key principles for designing scalable systems",
        StopReason.MAX_TOKENS,
        usage(18 + 2055, 100, write=2055),
        SONNET4,
        ends="- Implement clear",
    ),
    "anthropic__stop_max_tokens__mirascope": Reply(
        "Here are all 50 U.S. states",
        StopReason.MAX_TOKENS,
        usage(15, 50),
        SONNET4,
        ends="8. Delaware\n9",
    ),
    "anthropic__stop_refusal__vercel-ai": Reply(
        "", StopReason.REFUSAL, usage(18, 5), "claude-fable-5"
    ),
    "anthropic__stream_max_tokens__mirascope": Reply(
        "Here are all 50 U.S. states",
        StopReason.MAX_TOKENS,
        usage(15, 50),
        SONNET4,
        ends="8. Delaware\n9",
    ),
    # message_start carries the cache read; message_delta only output_tokens
    "anthropic__stream_prompt_cache_read__dd-trace-py": Reply(
        "A **system** is an organized collection",
        StopReason.MAX_TOKENS,
        usage(11 + 1031, 100, read=1031),
        SONNET4,
        ends="The external context in",
    ),
    "anthropic__stream_refusal__vercel-ai": Reply(
        "", StopReason.REFUSAL, usage(18, 5), "claude-fable-5"
    ),
    "anthropic__stream_stop_sequence_prefill__llm-anthropic": Reply(
        "\ndef pelican():\n",
        StopReason.STOP_SEQUENCE,
        usage(16, 28),
        HAIKU45,
        ends='throat pouch for catching fish."\n',
    ),
    "anthropic__stream_text__llm-anthropic": Reply(
        "- Captain\n- Scoop", StopReason.END_TURN, usage(17, 10), "claude-sonnet-4-5-20250929"
    ),
    "anthropic__stream_thinking__openllmetry": Reply(
        "The letter 'r' appears 3 times",
        StopReason.END_TURN,
        usage(52, 216),
        "claude-3-7-sonnet-20250219",
        thinking="Let me count the occurrences of the letter 'r'",
        signature="ErUBCkYIARgCIkCepoF8",
    ),
    "anthropic__stream_tool_result_followup__mirascope": Reply(
        "Here are the secrets retrieved for each password",
        StopReason.END_TURN,
        usage(602, 52),
        SONNET4,
        ends="Both secrets have been successfully retrieved!",
    ),
    "anthropic__stream_tool_use__dd-trace-py": Reply(
        "<thinking>\nThe get_weather tool is relevant",
        StopReason.TOOL_USE,
        usage(599, 135),
        OPUS3,
        ends="</thinking>",
        calls=(WEATHER_CALL,),
    ),
    "anthropic__stream_tool_use_parallel__mirascope": Reply(
        "I'll retrieve the secrets for both passwords you provided.",
        StopReason.TOOL_USE,
        usage(416, 109),
        SONNET4,
        calls=SECRETS_CALLS,
    ),
    "anthropic__text_basic__mirascope": Reply(
        "4200 + 42 = 4242", StopReason.END_TURN, usage(17, 15), SONNET4
    ),
    "anthropic__thinking_then_tool_use__pydantic-ai": Reply(
        "I'll help you find the largest city in your country.",
        StopReason.TOOL_USE,
        usage(398, 155),
        SONNET4,
        calls=(("toolu_01YGzqpRE16Vricda3Aqcejo", "get_user_country", {}),),
        thinking="The user is asking about the largest city",
        signature="EqEECkYICxgCKkAo3UA4",
    ),
    "anthropic__thinking_tool_result_followup__pydantic-ai": Reply(
        "Based on the information that you're from Mexico",
        StopReason.END_TURN,
        usage(566, 126),
        SONNET4,
        ends="cultural center of Mexico.",
    ),
    "anthropic__tool_result_failure_followup__mirascope": Reply(
        "The passphrase 'portal' was incorrect.",
        StopReason.TOOL_USE,
        usage(525, 96),
        SONNET4,
        calls=(("toolu_0135hLPfnXk1XhtLSdxAuHnF", "passphrase_test_tool", {"passphrase": "cake"}),),
    ),
    "anthropic__tool_result_followup__dd-trace-py": Reply(
        "Based on the result from the get_weather tool",
        StopReason.END_TURN,
        usage(768, 29),
        OPUS3,
        ends="is 73°F.",
    ),
    "anthropic__tool_results_followup_parallel__pydantic-ai": Reply(
        "Based on the retrieved information",
        StopReason.END_TURN,
        usage(771, 77),
        HAIKU45,
        ends="the youngest among the four family members.",
    ),
    "anthropic__tool_use_parallel__pydantic-ai": Reply(
        "I'll help you find out who is the youngest",
        StopReason.TOOL_USE,
        usage(423, 202),
        HAIKU45,
        calls=tuple(
            (call_id, "retrieve_entity_info", {"name": person})
            for call_id, person in [
                ("toolu_0167cfEnoQaPviGdVXA95zcu", "Alice"),
                ("toolu_01EEe2V5HD1Ac4rKiUR4HD2T", "Bob"),
                ("toolu_01XFyAjstT3966qvRynZyVPo", "Charlie"),
                ("toolu_013mnQZbgtK2oe3Mo3XKJsx3", "Daisy"),
            ]
        ),
    ),
    "anthropic__tool_use_single__dd-trace-py": Reply(
        "<thinking>\nThe get_weather tool is directly relevant",
        StopReason.TOOL_USE,
        usage(599, 152),
        OPUS3,
        ends="</thinking>",
        calls=(WEATHER_CALL,),
    ),
}

EXPECTED.update(
    {
        "anthropic__server_tool_code_execution__pydantic-ai": Reply(
            "3 * 12390 = **37,170**",
            StopReason.END_TURN,
            usage(4612, 80),
            SONNET45,
            ends="3 * 12390 = **37,170**",
            server={"call:bash_code_execution": 1, "result:bash_code_execution_tool_result": 1},
        ),
        "anthropic__server_tool_result_followup__pydantic-ai": Reply(
            "4 * 12390 = **49,560**",
            StopReason.END_TURN,
            usage(4840, 80),
            SONNET45,
            ends="4 * 12390 = **49,560**",
            server={"call:bash_code_execution": 1, "result:bash_code_execution_tool_result": 1},
        ),
        "anthropic__stream_server_tool_code_execution__pydantic-ai": Reply(
            "I'll calculate that expression for you right away!",
            StopReason.END_TURN,
            usage(4714, 304),
            SONNET46,
            ends="Answer: **-428,330,955.97745**",
            thinking="Let me calculate this mathematical expre",
            signature="EusBClsIDRgCKkBpzetW",
            server={"call:bash_code_execution": 1, "result:bash_code_execution_tool_result": 1},
        ),
        "anthropic__server_tool_text_editor__pydantic-ai": Reply(
            "Sure! I'll do both steps simultaneously -- creatin",
            StopReason.END_TURN,
            usage(10490, 469),
            SONNET46,
            ends="`\n\nEverything looks perfect! 🎉",
            server={
                "call:text_editor_code_execution": 4,
                "result:text_editor_code_execution_tool_result": 4,
            },
        ),
        "anthropic__server_tool_web_search__pydantic-ai": Reply(
            "Based on the search results, here's the weather in",
            StopReason.END_TURN,
            usage(8984, 520),
            SONNET4,
            ends="ould limit outdoor activities.",
            thinking="The user is asking about the weather in ",
            signature="Et0ECkYIBxgCKkCXTXBK",
            server={"call:web_search": 1, "result:web_search_tool_result": 1},
        ),
        "anthropic__server_tool_web_search_followup__pydantic-ai": Reply(
            "Based on the search results, here's the weather in",
            StopReason.END_TURN,
            usage(19859, 544),
            SONNET4,
            ends="ities should take precautions.",
            thinking="The user is now asking about the weather",
            signature="EqgCCkYIBxgCKkAhyrWt",
            server={"call:web_search": 1, "result:web_search_tool_result": 1},
        ),
        "anthropic__stream_server_tool_web_search__pydantic-ai": Reply(
            "Let me search for more specific breaking news stor",
            StopReason.END_TURN,
            usage(31772, 644),
            SONNET4,
            ends="tions affecting North America.",
            server={"call:web_search": 2, "result:web_search_tool_result": 2},
        ),
        "anthropic__pause_turn_web_search__pydantic-ai": Reply(
            "I'll run these searches for you one at a time. Let",
            StopReason.END_TURN,
            usage(896017, 2037),
            SONNET45,
            ends="nformation from February 2026.",
            thinking="The user wants me to run 15 separate web",
            signature="Es4DCkYICxgCKkB5MhEE",
            server={"call:web_search": 15, "result:web_search_tool_result": 15},
        ),
        "anthropic__pause_turn_continuation__pydantic-ai": Reply(
            "Let me complete the final searches:Now let me comp",
            StopReason.END_TURN,
            usage(494549, 1245),
            SONNET45,
            ends="nformation from February 2026.",
            server={"result:web_search_tool_result": 5, "call:web_search": 4},
        ),
        "anthropic__stream_pause_turn_web_search__pydantic-ai": Reply(
            "I'll run these searches one at a time as requested",
            StopReason.END_TURN,
            usage(887029, 2253),
            SONNET45,
            ends="e been completed as requested.",
            thinking="The user wants me to run a series of web",
            signature="EuwJCm4IDxgCKkBjID0+",
            server={"call:web_search": 15, "result:web_search_tool_result": 15},
        ),
        "anthropic__stream_pause_turn_continuation__pydantic-ai": Reply(
            "Let me continue with the remaining searches as req",
            StopReason.END_TURN,
            usage(482529, 1310),
            SONNET45,
            ends="e been completed as requested.",
            server={"result:web_search_tool_result": 5, "call:web_search": 4},
        ),
        "anthropic__error_400_prompt_too_long__issue-exe.dev-62": Failure(
            ErrorKind.CONTEXT_TOO_LONG, 400, "prompt is too long: 200251 tokens > 200000 maximum"
        ),
        "anthropic__error_400_credit_balance_too_low__issue-claude-code-66314": Failure(
            ErrorKind.OUT_OF_CREDIT,
            400,
            "Your credit balance is too low to access the Anthropic API",
        ),
    }
)

REPLIES = [n for n in NAMES if isinstance(EXPECTED.get(n), Reply)]
FAILURES = [n for n in NAMES if isinstance(EXPECTED.get(n), Failure)]


# fixtures whose expectation lives with the behaviour they are for
ELSEWHERE = {
    # a 200 stream that breaks off with an error event: test_stream_retry.py
    "anthropic__stream_error_overloaded__documented-example",
}


def test_every_anthropic_fixture_has_an_expectation() -> None:
    assert NAMES, "no anthropic fixtures found"
    assert set(EXPECTED) == set(NAMES) - ELSEWHERE
    assert set(NAMES) >= ELSEWHERE
    # each fixture is classified the way its recording is: an error status or a reply
    for name in EXPECTED:
        failed = load(name)["response"]["status"] >= 400
        assert isinstance(EXPECTED[name], Failure) is failed, name


def check_server_parts(response: ChatResponse, want: Reply, fixture: dict[str, Any]) -> None:
    """Server tool calls and results, counted, each result after its call (a continued turn's
    first result answers a call of the reply it continues); none kept whole."""
    seen: Counter[str] = Counter()
    body = fixture["request"].get("body") or {}
    continued = body.get("messages", [{}])[-1] if isinstance(body, dict) else {}
    called = {
        block["id"]
        for block in (continued.get("content") if continued.get("role") == "assistant" else [])
        if block["type"] == "server_tool_use"
    }
    for part in response.content:
        if isinstance(part, ServerToolCallPart):
            seen[f"call:{part.server_tool_call.name}"] += 1
            called.add(part.server_tool_call.id)
        elif isinstance(part, ServerToolResultPart):
            seen[f"result:{part.server_tool_result.type}"] += 1
            assert part.server_tool_result.tool_call_id in called
        assert not isinstance(part, ProviderBlockPart)  # every recorded block is a known one
    assert dict(seen) == want.server


def check_reply(
    response: ChatResponse, want: Reply, fixture: dict[str, Any], name: str = ""
) -> None:
    assert response.text.startswith(want.starts)
    assert response.text.endswith(want.ends)
    assert response.stop_reason is want.stop
    assert response.usage == want.usage
    assert response.model == want.model
    if not is_stream(fixture):  # a paused turn's id is its continuation's
        last = load(PAUSED_TURNS[name]) if name in PAUSED_TURNS else fixture
        assert response.id == last["response"]["body"]["id"]
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == list(want.calls)
    check_server_parts(response, want, fixture)
    assert all(c.raw_arguments is None for c in response.tool_calls)
    thinking = [p.thinking for p in response.content if isinstance(p, ThinkingPart)]
    if want.thinking:
        assert len(thinking) == 1
        assert thinking[0].text.startswith(want.thinking)
        assert thinking[0].signature is not None
        assert thinking[0].signature.startswith(want.signature)
        # reasoning comes before the text it led to [AG-27]
        assert isinstance(response.content[0], ThinkingPart)
    else:
        assert thinking == []


@pytest.mark.parametrize("name", REPLIES)
async def test_recorded_reply_through_the_client(name: str) -> None:
    fixture = load(name)
    want = EXPECTED[name]
    assert isinstance(want, Reply)
    async with aclosing(client_for(recorded(name))) as client:
        if is_stream(fixture):
            events = await collect(client, hello())
            response = done(events)
            check_stream_events(events, response)
        else:
            response = await client.chat(hello())
            if name not in PAUSED_TURNS:
                assert response == parse_response(fixture["response"]["body"])
    check_reply(response, want, fixture, name)


def check_stream_events(events: list[StreamEvent], response: ChatResponse) -> None:
    """The deltas add up to the aggregate: text, thinking and each tool call's JSON."""
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == response.text
    thinking = "".join(e.text for e in events if isinstance(e, ThinkingDelta))
    assert thinking == "".join(
        p.thinking.text for p in response.content if isinstance(p, ThinkingPart)
    )
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    assert [(e.index, e.id, e.name) for e in started] == [
        (position, c.id, c.name) for position, c in enumerate(response.tool_calls)
    ]
    for start, call in zip(started, response.tool_calls, strict=True):
        fragments = [
            e.fragment
            for e in events
            if isinstance(e, ToolCallArgumentsDelta) and e.index == start.index
        ]
        assert json.loads("".join(fragments) or "{}") == call.arguments
        positions = [
            i
            for i, e in enumerate(events)
            if isinstance(e, ToolCallArgumentsDelta) and e.index == start.index
        ]
        assert all(events.index(start) < i for i in positions)


@pytest.mark.parametrize("name", FAILURES)
@pytest.mark.parametrize("streaming", [False, True], ids=["chat", "stream"])
async def test_recorded_error_is_classified(name: str, streaming: bool) -> None:
    fixture = load(name)
    want = EXPECTED[name]
    assert isinstance(want, Failure)
    async with aclosing(client_for(replay(fixture))) as client:
        with pytest.raises(AgentError) as caught:
            await (collect(client, hello()) if streaming else client.chat(hello()))
    error = caught.value
    assert error.kind is want.kind
    assert error.status == want.status
    assert error.provider == "anthropic"
    assert error.body is not None
    assert len(error.body) <= BODY_LIMIT
    assert want.says in error.body
    assert want.says in str(error)
    assert "anthropic" in str(error)
    assert str(want.status) in str(error)
    assert error.retry_after is None  # none of these recordings kept a retry-after header
    assert KEY not in str(error)
    assert KEY not in (error.body or "")


async def test_retry_after_is_read_from_the_headers_of_an_error() -> None:
    fixture = copy.deepcopy(fx("error_429_rate_limit__issue-claude-code-71634"))
    # the issue report kept only the body; the header is what Anthropic sends with a 429
    fixture["response"]["headers"] = {"retry-after": "7", "content-type": "application/json"}
    async with aclosing(client_for(replay(fixture))) as client:
        with pytest.raises(AgentError) as caught:
            await client.chat(hello())
    assert caught.value.kind is ErrorKind.RATE_LIMITED
    assert caught.value.retry_after == 7.0


def test_error_envelope_in_a_200_body_is_an_error() -> None:
    body = fx("error_529_overloaded__issue-cline-52")["response"]["body"]
    with pytest.raises(AgentError) as caught:
        parse_response(body)
    assert caught.value.kind is ErrorKind.UNAVAILABLE
    assert caught.value.status == 529
    assert "Overloaded" in str(caught.value)
    body = fx("error_500_api_error_null_request_id__issue-claude-code-11592")["response"]["body"]
    with pytest.raises(AgentError) as caught:
        parse_response(body)
    assert caught.value.kind is ErrorKind.UNAVAILABLE


# --- streams compared with their non-streaming twins ---------------------------------------


async def streamed(short: str) -> ChatResponse:
    async with aclosing(client_for(replay(fx(short)))) as client:
        return done(await collect(client, hello()))


# Recordings of the same prompt made whole and streamed, and what legitimately differs between
# the two calls (beyond the message id, which every call has its own).
TWINS = [
    ("stop_max_tokens__mirascope", "stream_max_tokens__mirascope", ()),
    ("stop_refusal__vercel-ai", "stream_refusal__vercel-ai", ()),
    # recorded with a different cached system prompt, so the cache read differs
    ("prompt_cache_read__dd-trace-py", "stream_prompt_cache_read__dd-trace-py", ("usage",)),
]


@pytest.mark.parametrize(("whole", "stream", "differs"), TWINS, ids=[t[1] for t in TWINS])
async def test_stream_equals_its_non_streaming_twin(
    whole: str, stream: str, differs: tuple[str, ...]
) -> None:
    reply = parse_response(fx(whole)["response"]["body"])
    aggregate = await streamed(stream)
    assert aggregate.id != reply.id
    same = ("content", "stop_reason", "raw_stop_reason", "model", "usage")
    for name in same:
        if name not in differs:
            assert getattr(aggregate, name) == getattr(reply, name), name
    assert set(differs) <= set(same)


async def test_a_refusal_has_no_content_whole_or_streamed() -> None:
    assert parse_response(fx("stop_refusal__vercel-ai")["response"]["body"]).content == []
    assert (await streamed("stream_refusal__vercel-ai")).content == []


def test_the_cache_read_twins_differ_only_in_the_cache_read() -> None:
    whole = parse_response(fx("prompt_cache_read__dd-trace-py")["response"]["body"])
    streamed_body = anthropic_folded(sse_body(fx("stream_prompt_cache_read__dd-trace-py")))
    assert (whole.usage.cache_read_tokens, streamed_body["usage"]["cache_read_input_tokens"]) == (
        2055,
        1031,
    )


async def test_streamed_tool_calls_are_resent_as_the_recorded_follow_up() -> None:
    """The parallel tool-use stream, sent back, is the assistant turn of the recorded follow-up."""
    aggregate = await streamed("stream_tool_use_parallel__mirascope")
    follow_up = fx("stream_tool_result_followup__mirascope")["request"]["body"]
    client = builder(prompt_caching=False)
    body = client.build_body(
        ChatRequest(messages=[ChatMessage(role=Role.ASSISTANT, content=aggregate.content)]),
        stream=True,
    )
    assert body["messages"] == [follow_up["messages"][1]]
    await client.aclose()


async def test_stream_events_arrive_in_wire_order_for_parallel_tools() -> None:
    async with aclosing(client_for(replay(fx("stream_tool_use_parallel__mirascope")))) as client:
        events = await collect(client, hello())
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "TextDelta"
    # the calls sit in content blocks 1 and 2 (after the text); their events count tool calls
    assert [e for e in events if isinstance(e, ToolCallStarted)] == [
        ToolCallStarted(0, "toolu_015cUijgET79LXjgeYQerN2h", "secret_retrieval_tool"),
        ToolCallStarted(1, "toolu_01XZTimPexA7h3EVKesnKt5T", "secret_retrieval_tool"),
    ]
    fragments = {
        index: "".join(
            e.fragment for e in events if isinstance(e, ToolCallArgumentsDelta) and e.index == index
        )
        for index in (0, 1)
    }
    assert fragments == {0: '{"password": "mellon"}', 1: '{"password": "radiance"}'}
    # the empty first input_json_delta of each block is not passed on
    assert all(e.fragment for e in events if isinstance(e, ToolCallArgumentsDelta))
    assert isinstance(events[-1], StreamDone)


# --- recorded requests rebuilt ---------------------------------------------------------------


def part_from_block(block: dict[str, Any]) -> ContentPart:
    kind = block["type"]
    if kind == "text":
        return TextPart(text=block["text"])
    if kind == "tool_use":
        return ToolCallPart(
            tool_call=ToolCall(id=block["id"], name=block["name"], arguments=block["input"])
        )
    if kind == "tool_result":
        content = block["content"]
        if isinstance(content, list):
            content = "".join(b["text"] for b in content)
        return ToolResultPart(
            tool_result=ToolResult(
                tool_call_id=block["tool_use_id"],
                content=content,
                is_error=bool(block.get("is_error")),
            )
        )
    if kind == "server_tool_use":
        call = ServerToolCall(id=block["id"], name=block["name"], arguments=block["input"])
        return ServerToolCallPart(server_tool_call=call)
    if kind.endswith("_tool_result"):
        result = ServerToolResult(
            tool_call_id=block["tool_use_id"], type=kind, content=block["content"]
        )
        return ServerToolResultPart(server_tool_result=result)
    assert kind == "thinking", kind
    return ThinkingPart(thinking=Thinking(text=block["thinking"], signature=block["signature"]))


def server_tools_of(recorded: dict[str, Any]) -> list[ServerTool]:
    """The server tools a recorded request declares (typed tools; the app's have a schema)."""
    return [
        ServerTool(
            t["type"],
            t["name"],
            {k: v for k, v in t.items() if k not in ("type", "name") and v is not None},
        )
        for t in recorded.get("tools", [])
        if "input_schema" not in t
    ]


TOOL_CHOICE_BACK = {"auto": "auto", "any": "required", "none": "none"}


def conversation(recorded: dict[str, Any], *, caching: bool) -> ChatRequest:
    """The neutral conversation an agent would hold when it sends ``recorded``."""
    messages: list[ChatMessage] = []
    system = recorded.get("system")
    if isinstance(system, str):
        messages.append(ChatMessage.system(system))
    for block in system if isinstance(system, list) else []:
        messages.append(ChatMessage.system(block["text"]))
    for message in recorded["messages"]:
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        parts = [part_from_block(b) for b in blocks]
        if message["role"] == "assistant":
            role = Role.ASSISTANT
        elif all(isinstance(p, ToolResultPart) for p in parts):
            role = Role.TOOL
        else:
            role = Role.USER
        messages.append(ChatMessage(role=role, content=parts))
    choice = recorded.get("tool_choice")
    return ChatRequest(
        messages=messages,
        tools=[
            ToolDefinition(
                name=t["name"], description=t["description"], input_schema=t["input_schema"]
            )
            for t in recorded.get("tools", [])
            if "input_schema" in t
        ],
        max_tokens=recorded["max_tokens"],
        temperature=recorded.get("temperature"),
        stop=recorded.get("stop_sequences", []),
        tool_choice=None
        if choice is None
        else TOOL_CHOICE_BACK.get(choice["type"], choice.get("name")),
        model=recorded["model"],
        prompt_caching=caching,
        extra_body={k: recorded[k] for k in ("thinking", "container") if k in recorded},
    )


def clean(value: Any) -> Any:
    """``value`` without null-valued keys and the defaults ``is_error: false``, a tool_result's
    list of text blocks as their text."""
    if isinstance(value, dict):
        out = {k: clean(v) for k, v in value.items() if v is not None}
        if out.get("is_error") is False:
            del out["is_error"]
        if out.get("type") == "tool_result" and isinstance(out["content"], list):
            out["content"] = "".join(b["text"] for b in out["content"])
        return out
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


def normalised(recorded: dict[str, Any]) -> dict[str, Any]:
    """The recorded body in the equivalent form we send. Each rewrite means the same to the API:

    * ``"content": "text"`` is shorthand for one text block; we always send blocks.
    * a tool_result whose content is a list of text blocks equals their text as a string.
    * keys with a null value are absent (``cache_control: null``, ``citations: null``);
      ``is_error: false`` and ``stream: false`` are the defaults, which we leave out.
    * we always send ``tools`` (§1.4: the key is present, maybe ``[]``).
    * a ``system`` list of one text block without a cache marker is that text as a string.
    """

    body: dict[str, Any] = clean(copy.deepcopy(recorded))
    for message in body["messages"]:
        if isinstance(message["content"], str):
            message["content"] = [{"type": "text", "text": message["content"]}]
    if body.get("stream") is False:
        del body["stream"]
    body.setdefault("tools", [])
    system = body.get("system")
    if isinstance(system, list) and len(system) == 1 and "cache_control" not in system[0]:
        body["system"] = system[0]["text"]
    return body


def cache_marks(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, cache_control) for every block that carries a cache marker."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "cache_control":
                yield path, item
            else:
                yield from cache_marks(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from cache_marks(item, f"{path}.{i}")


def unmarked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [unmarked(v) for v in value]
    return value


@dataclass(frozen=True)
class Recorded:
    """How to rebuild a recorded request: caching on or off, and where the markers sit.

    ``recorded`` is where the recording put cache markers; ``ours`` is where our rule (system,
    last tool, last block of the last message) puts them. Where they differ, the comment on the
    case says why.
    """

    caching: bool = False
    recorded: frozenset[str] = frozenset()
    ours: frozenset[str] = frozenset()


SYSTEM_ONLY = frozenset({"system.0"})
SYSTEM_AND_PROMPT = frozenset({"system.0", "messages.0.content.0"})

REQUESTS: dict[str, Recorded] = {
    "error_401_authentication__dd-trace-py": Recorded(),
    "error_401_on_stream_request__dd-trace-py": Recorded(),
    "error_404_model_not_found__mirascope": Recorded(),
    # dd-trace marked only the system block; our rule also marks the end of the conversation
    # (the user's question), a breakpoint the recording did not use.
    "prompt_cache_read__dd-trace-py": Recorded(True, SYSTEM_ONLY, SYSTEM_AND_PROMPT),
    "prompt_cache_write__dd-trace-py": Recorded(True, SYSTEM_ONLY, SYSTEM_AND_PROMPT),
    # as above; the recording also asked for a 1-hour TTL, we always send the default 5-minute
    # {"type": "ephemeral"} (the TTL option is not part of our rule).
    "prompt_cache_write_1h_ttl__dd-trace-py": Recorded(True, SYSTEM_ONLY, SYSTEM_AND_PROMPT),
    "stream_prompt_cache_read__dd-trace-py": Recorded(True, SYSTEM_ONLY, SYSTEM_AND_PROMPT),
    "stop_max_tokens__mirascope": Recorded(),
    "stream_max_tokens__mirascope": Recorded(),
    "stream_stop_sequence_prefill__llm-anthropic": Recorded(),
    "stream_text__llm-anthropic": Recorded(),
    "stream_thinking__openllmetry": Recorded(),
    # mirascope marks exactly what our rule marks: system, last tool, last tool_result
    "stream_tool_result_followup__mirascope": Recorded(
        True,
        frozenset({"system.0", "tools.0", "messages.2.content.1"}),
        frozenset({"system.0", "tools.0", "messages.2.content.1"}),
    ),
    "stream_tool_use__dd-trace-py": Recorded(),
    # mirascope marked system and tool but not the first user message; our rule marks it too
    "stream_tool_use_parallel__mirascope": Recorded(
        True,
        frozenset({"system.0", "tools.0"}),
        frozenset({"system.0", "tools.0", "messages.0.content.0"}),
    ),
    "text_basic__mirascope": Recorded(),
    "thinking_then_tool_use__pydantic-ai": Recorded(),
    "thinking_tool_result_followup__pydantic-ai": Recorded(),
    "tool_result_failure_followup__mirascope": Recorded(
        True,
        frozenset({"tools.0", "messages.2.content.0"}),
        frozenset({"tools.0", "messages.2.content.0"}),
    ),
    "tool_result_followup__dd-trace-py": Recorded(),
    "tool_results_followup_parallel__pydantic-ai": Recorded(),
    "tool_use_parallel__pydantic-ai": Recorded(),
    "tool_use_single__dd-trace-py": Recorded(),
    # server tools declared through ServerTool, their blocks sent back as they came
    "server_tool_code_execution__pydantic-ai": Recorded(),
    "server_tool_result_followup__pydantic-ai": Recorded(),
    "server_tool_text_editor__pydantic-ai": Recorded(),
    "server_tool_web_search__pydantic-ai": Recorded(),
    "server_tool_web_search_followup__pydantic-ai": Recorded(),
    "stream_server_tool_code_execution__pydantic-ai": Recorded(),
    "stream_server_tool_web_search__pydantic-ai": Recorded(),
    "pause_turn_web_search__pydantic-ai": Recorded(),
    "pause_turn_continuation__pydantic-ai": Recorded(),
    "stream_pause_turn_web_search__pydantic-ai": Recorded(),
    "stream_pause_turn_continuation__pydantic-ai": Recorded(),
}


def test_every_recorded_request_is_rebuilt() -> None:
    with_body = {
        n.removeprefix("anthropic__") for n in NAMES if load(n)["request"].get("body") is not None
    }
    # the dd-trace 400 recording sent a deliberately malformed body (a bare string as a
    # message), which no ChatRequest can express
    assert with_body - set(REQUESTS) == {"error_400_invalid_request__dd-trace-py"}
    assert set(REQUESTS) <= with_body


@pytest.mark.parametrize("short", sorted(REQUESTS))
def test_build_body_matches_the_recorded_request(short: str) -> None:
    case = REQUESTS[short]
    recorded = fx(short)["request"]["body"]
    # the request's caching flag must win over the client's
    client = builder(prompt_caching=not case.caching, server_tools=server_tools_of(recorded))
    request = conversation(recorded, caching=case.caching)
    before = copy.deepcopy(request)
    ours = client.build_body(request, stream=recorded.get("stream") is True)
    want = normalised(recorded)

    # server tool results go back as they came, nulls inside them (page_age) included
    assert unmarked(clean(ours)) == unmarked(want)
    assert list(ours)[:4] == ["model", "max_tokens", "messages", "tools"]
    assert {path for path, _ in cache_marks(want)} == case.recorded
    assert {path for path, _ in cache_marks(ours)} == case.ours
    assert all(mark == {"type": "ephemeral"} for _, mark in cache_marks(ours))
    # where both put a marker the recorded one is ours, except the TTL variant
    for path, mark in cache_marks(want):
        if "ttl" not in mark:
            assert mark == {"type": "ephemeral"}, path
    if case.caching and "system" in ours:
        assert isinstance(ours["system"], list)
    elif "system" in ours:
        assert isinstance(ours["system"], str)
    assert request == before  # build_body left the caller's objects alone


# --- extended thinking round trip [AG-27] ---------------------------------------------------


async def test_signed_thinking_is_resent_unchanged_before_the_tool_use() -> None:
    first = fx("thinking_then_tool_use__pydantic-ai")
    async with aclosing(client_for(replay(first))) as client:
        reply = await client.chat(hello())
    assert [type(p).__name__ for p in reply.content] == ["ThinkingPart", "TextPart", "ToolCallPart"]
    call = reply.tool_calls[0]

    recorded_first = first["request"]["body"]
    request = ChatRequest(
        messages=[
            ChatMessage.user("What is the largest city in the user country?"),
            ChatMessage(role=Role.ASSISTANT, content=reply.content),
            ChatMessage.tool_results([ToolResult(tool_call_id=call.id, content="Mexico")]),
        ],
        tools=[
            ToolDefinition(
                name="get_user_country",
                description="",
                input_schema={"additionalProperties": False, "properties": {}, "type": "object"},
            )
        ],
        max_tokens=4096,
        tool_choice="auto",
        model="claude-sonnet-4-0",
        prompt_caching=False,
        extra_body={"thinking": {"budget_tokens": 3000, "type": "enabled"}},
    )
    body = builder().build_body(request, stream=False)

    assistant = body["messages"][1]["content"]
    assert [b["type"] for b in assistant] == ["thinking", "text", "tool_use"]
    assert assistant[0] == first["response"]["body"]["content"][0]  # signature byte for byte
    assert body["tools"] == recorded_first["tools"]
    follow_up = fx("thinking_tool_result_followup__pydantic-ai")["request"]["body"]
    assert body == normalised(follow_up)


# --- seed cases -----------------------------------------------------------------------------


WEATHER = ToolDefinition(
    name="get_weather",
    description="Weather for a city",
    input_schema={"type": "object", "properties": {"city": {"type": "string"}}},
)
CLOCK = ToolDefinition(
    name="clock", description="The time", input_schema={"type": "object", "properties": {}}
)


def weather_conversation() -> list[ChatMessage]:
    return [
        ChatMessage.system("Be brief."),
        ChatMessage.user("Weather in Paris?"),
        ChatMessage(
            role=Role.ASSISTANT,
            content=[
                TextPart(text="Checking."),
                ToolCallPart(
                    tool_call=ToolCall(
                        id="toolu_1", name="get_weather", arguments={"city": "Paris"}
                    )
                ),
            ],
        ),
        ChatMessage.tool_results([ToolResult(tool_call_id="toolu_1", content='{"temp": 21}')]),
    ]


class Capture:
    """A transport handler that records each request and answers with ``reply``."""

    def __init__(self, reply: dict[str, Any], status: int = 200) -> None:
        self.reply = reply
        self.status = status
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(self.status, json=self.reply)

    @property
    def body(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.requests[-1].content)
        return data


TEXT_REPLY = fx("text_basic__mirascope")["response"]["body"]


async def test_request_wire_format() -> None:
    """AP-12: path, headers, top-level system, user first, tool_use/tool_result, max_tokens."""
    capture = Capture(TEXT_REPLY)
    async with aclosing(client_for(capture, prompt_caching=False)) as client:
        response = await client.chat(ChatRequest(messages=weather_conversation(), tools=[WEATHER]))
    assert response.text == "4200 + 42 = 4242"
    sent = capture.requests[0]
    assert sent.method == "POST"
    assert sent.url == "https://api.anthropic.com/v1/messages"
    assert sent.headers["x-api-key"] == KEY
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert sent.headers["content-type"] == "application/json"
    assert "authorization" not in sent.headers
    assert capture.body == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": '{"temp": 21}'}
                ],
            },
        ],
        "tools": [
            {
                "name": "get_weather",
                "description": "Weather for a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
            }
        ],
    }


async def test_no_key_means_no_key_header_and_base_url_is_trimmed() -> None:
    capture = Capture(TEXT_REPLY)
    client = AnthropicClient(
        base_url="http://127.0.0.1:9/proxy/", transport=httpx.MockTransport(capture)
    )
    async with aclosing(client):
        await client.chat(hello())
    assert capture.requests[0].url == "http://127.0.0.1:9/proxy/v1/messages"
    assert "x-api-key" not in capture.requests[0].headers
    assert capture.body["tools"] == []
    assert "system" not in capture.body


async def test_anthropic_prompt_caching_marks_breakpoints_and_counts_cache_tokens() -> None:
    """AP-13 + AP-14: three breakpoints with caching on, usage counts the cached prompt."""
    reply = {
        "id": "msg_1",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "usage": {
            "input_tokens": 10,
            "cache_read_input_tokens": 1000,
            "cache_creation_input_tokens": 100,
            "output_tokens": 5,
        },
    }
    capture = Capture(reply)
    tools = [WEATHER, CLOCK]
    request = ChatRequest(messages=weather_conversation(), tools=tools)
    async with aclosing(client_for(capture)) as client:  # caching is on by default
        response = await client.chat(request)
    body = capture.body
    assert body["system"] == [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
    ]
    assert "cache_control" not in body["tools"][0]
    assert body["tools"][1]["cache_control"] == {"type": "ephemeral"}
    assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert sorted(path for path, _ in cache_marks(body)) == [
        "messages.2.content.0",
        "system.0",
        "tools.1",
    ]
    # nothing of the caller's was touched: no marker leaked into the tool definitions
    assert all("cache_control" not in t.model_dump() for t in tools)
    assert response.usage == TokenUsage(
        input_tokens=1110, output_tokens=5, cache_read_tokens=1000, cache_write_tokens=100
    )
    assert response.usage.total() == 1115

    request.prompt_caching = False  # the request's setting wins over the client's
    plain = builder().build_body(request, stream=False)
    assert plain["system"] == "Be brief."
    assert list(cache_marks(plain)) == []


def test_caching_marker_skips_thinking_blocks_and_is_never_shared() -> None:
    client = builder()
    signed = ThinkingPart(thinking=Thinking(text="hm", signature="sig"))
    request = ChatRequest(
        messages=[
            ChatMessage.user("hi"),
            ChatMessage(
                role=Role.ASSISTANT,
                content=[
                    TextPart(text="pre"),
                    signed,
                    ToolCallPart(tool_call=ToolCall(id="t", name="get_weather", arguments={})),
                ],
            ),
        ],
        tools=[WEATHER],
    )
    first = client.build_body(request, stream=False)
    assert first["messages"][1]["content"] == [
        {"type": "text", "text": "pre"},
        {"type": "thinking", "thinking": "hm", "signature": "sig"},
        {
            "type": "tool_use",
            "id": "t",
            "name": "get_weather",
            "input": {},
            "cache_control": {"type": "ephemeral"},
        },
    ]
    # the markers and the dicts that carry them are the body's own: editing them leaves the
    # request (and the next body) alone
    before = copy.deepcopy(request)
    first["messages"][1]["content"][2]["cache_control"]["ttl"] = "1h"
    first["messages"][1]["content"][2]["id"] = "changed"
    first["tools"][0]["cache_control"]["ttl"] = "1h"
    first["tools"][0]["name"] = "changed"
    first["tools"].append({"name": "x"})
    assert request == before
    assert client.build_body(request, stream=False) != first

    # a thinking block cannot carry a cache marker: it goes on the block before it
    request.messages[1] = ChatMessage(role=Role.ASSISTANT, content=[TextPart(text="pre"), signed])
    last = client.build_body(request, stream=False)["messages"][1]["content"]
    assert last == [
        {"type": "text", "text": "pre", "cache_control": {"type": "ephemeral"}},
        {"type": "thinking", "thinking": "hm", "signature": "sig"},
    ]


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", {"type": "auto"}),
        ("required", {"type": "any"}),
        ("none", {"type": "none"}),
        ("get_weather", {"type": "tool", "name": "get_weather"}),
    ],
)
def test_tool_choice(choice: str, wire: dict[str, str]) -> None:
    body = builder().build_body(
        ChatRequest(messages=[ChatMessage.user("x")], tools=[WEATHER], tool_choice=choice),
        stream=False,
    )
    assert body["tool_choice"] == wire
    # Anthropic rejects tool_choice without tools, so it is only sent with them
    no_tools = ChatRequest(messages=[ChatMessage.user("x")], tool_choice=choice)
    body = builder().build_body(no_tools, stream=False)
    assert "tool_choice" not in body
    assert body["tools"] == []


def test_build_body_shares_schemas_and_inputs_and_marks_only_its_own_dicts() -> None:
    """No deep copies (they dominated build_body on long transcripts), and no writes either."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    tool = ToolDefinition(name="get_weather", description="Weather", input_schema=schema)
    call = ToolCall(id="t1", name="get_weather", arguments={"city": "Oslo", "days": [1, 2]})
    request = ChatRequest(
        messages=[
            ChatMessage.user("hi"),
            ChatMessage(role=Role.ASSISTANT, content=[ToolCallPart(tool_call=call)]),
        ],
        tools=[tool],
        extra_body={"metadata": {"user_id": "u1"}},
    )
    before = copy.deepcopy(request)
    body = builder().build_body(request, stream=False)
    wire_tool = body["tools"][0]
    wire_call = body["messages"][1]["content"][0]
    assert wire_tool["input_schema"] is tool.input_schema
    assert wire_call["input"] is call.arguments
    assert body["metadata"] is request.extra_body["metadata"]
    # both got a cache marker, on dicts build_body made; the shared values have none
    assert wire_tool["cache_control"] == wire_call["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in tool.input_schema
    assert isinstance(call.arguments, dict)
    assert "cache_control" not in call.arguments
    assert request == before


def test_optional_fields_only_when_set_and_extra_body_last() -> None:
    client = builder(model="claude-default", prompt_caching=False)
    bare = client.build_body(ChatRequest(messages=[ChatMessage.user("x")]), stream=False)
    assert set(bare) == {"model", "max_tokens", "messages", "tools"}
    assert bare["model"] == "claude-default"
    thinking = {"type": "enabled", "budget_tokens": 2000}
    request = ChatRequest(
        messages=[ChatMessage.user("x")],
        max_tokens=3000,
        temperature=0.0,
        stop=["END"],
        model="claude-other",
        extra_body={"thinking": thinking, "max_tokens": 5000},
    )
    full = client.build_body(request, stream=True)
    assert full["model"] == "claude-other"
    assert full["temperature"] == 0.0
    assert full["stop_sequences"] == ["END"]
    assert full["stream"] is True
    assert full["thinking"] == thinking
    assert full["max_tokens"] == 5000  # extra_body is merged last
    assert full["thinking"] is thinking  # shared, not copied

    # a None value removes the key, as for the OpenAI-compatible client
    request.extra_body = {"temperature": None, "stop_sequences": None, "top_k": 5}
    trimmed = client.build_body(request, stream=False)
    assert "temperature" not in trimmed
    assert "stop_sequences" not in trimmed
    assert trimmed["top_k"] == 5
    assert "null" not in json.dumps(trimmed)


def test_content_blocks_keep_their_kind_and_order() -> None:
    client = builder(prompt_caching=False)
    request = ChatRequest(
        messages=[
            ChatMessage.system("one"),
            ChatMessage.user("look"),
            ChatMessage(
                role=Role.USER,
                content=[
                    ImagePart(image=Image(url="https://example.com/cat.png")),
                    ImagePart(image=Image(data="aGk=", media_type="image/png")),
                ],
            ),
            ChatMessage(role=Role.USER, content=[TextPart(text="")]),  # no blocks -> skipped
            ChatMessage.system("two"),
            ChatMessage(
                role=Role.ASSISTANT,
                content=[
                    RedactedThinkingPart(redacted_thinking=RedactedThinking(data="opaque")),
                    ThinkingPart(thinking=Thinking(text="plan", signature="sig")),
                    ThinkingPart(thinking=Thinking(text="unsigned, from another provider")),
                    TextPart(text="calling"),
                    ToolCallPart(
                        tool_call=ToolCall(
                            id="t1", name="f", arguments={}, raw_arguments='{"broken'
                        )
                    ),
                ],
            ),
            ChatMessage.tool_results(
                [ToolResult(tool_call_id="t1", content="bad arguments", is_error=True)]
            ),
        ]
    )
    body = client.build_body(request, stream=False)
    assert body["system"] == "one\ntwo"
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "look"}]},
        {
            "role": "user",  # consecutive user messages are not merged
            "content": [
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "aGk="},
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "thinking", "thinking": "plan", "signature": "sig"},
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": "bad arguments",
                    "is_error": True,
                }
            ],
        },
    ]


def test_an_image_without_a_source_is_a_config_error() -> None:
    request = ChatRequest(
        messages=[ChatMessage(role=Role.USER, content=[ImagePart(image=Image())])]
    )
    with pytest.raises(AgentError) as caught:
        builder().build_body(request, stream=False)
    assert caught.value.kind is ErrorKind.CONFIG


@pytest.mark.parametrize(
    ("status", "kind"), [(401, ErrorKind.AUTHENTICATION), (403, ErrorKind.AUTHENTICATION)]
)
async def test_auth_failures_map_to_authentication_and_never_show_the_key(
    status: int, kind: ErrorKind
) -> None:
    # a server (or proxy) that echoes the key back must not get it into our error
    echo = {"type": "error", "error": {"type": "authentication_error", "message": f"bad key {KEY}"}}
    async with aclosing(client_for(Capture(echo, status=status))) as client:
        for call in (client.chat(hello()), collect(client, hello())):
            with pytest.raises(AgentError) as caught:
                await call
            error = caught.value
            assert error.kind is kind
            assert error.status == status
            assert not error.retryable
            text = f"{error} {error!r} {error.body} {error.info().model_dump_json()}"
            assert KEY not in text
            assert REDACTED in text


async def test_transport_failures_never_show_the_key() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"cannot reach host with {request.headers['x-api-key']}")

    async with aclosing(client_for(refuse)) as client:
        with pytest.raises(AgentError) as caught:
            await client.chat(hello())
    assert caught.value.kind is ErrorKind.TRANSPORT
    assert KEY not in str(caught.value)


async def test_list_models() -> None:
    capture = Capture(
        {
            "data": [{"id": "claude-sonnet-4-5", "type": "model"}, {"id": "claude-haiku-4-5"}],
            "has_more": False,
        }
    )
    async with aclosing(client_for(capture)) as client:
        assert await client.list_models() == ["claude-sonnet-4-5", "claude-haiku-4-5"]
    sent = capture.requests[0]
    assert sent.method == "GET"
    assert sent.url == "https://api.anthropic.com/v1/models"
    assert sent.headers["x-api-key"] == KEY
    assert sent.headers["anthropic-version"] == "2023-06-01"


@pytest.mark.parametrize("reply", [{"data": {}}, {"models": []}, {"data": [{"name": "x"}]}])
async def test_list_models_rejects_other_shapes(reply: dict[str, Any]) -> None:
    async with aclosing(client_for(Capture(reply))) as client:
        with pytest.raises(AgentError) as caught:
            await client.list_models()
    assert caught.value.kind is ErrorKind.DECODE


async def test_repr_redacts_the_key() -> None:
    client = builder(api_key=KEY)
    assert KEY not in repr(client)
    assert "api_key='[REDACTED]'" in repr(client)
    assert KEY not in str(client)
    assert client.provider_name == "anthropic"
    assert isinstance(client, LlmClient)
    await client.aclose()
    keyless = builder(api_key=None, base_url="http://127.0.0.1:9")
    assert "api_key=None" in repr(keyless)
    await keyless.aclose()


@pytest.mark.parametrize("key", [None, ""])
@pytest.mark.parametrize(
    "base_url",
    ["https://api.anthropic.com", "https://API.Anthropic.com:443/", "http://api.anthropic.com/x"],
)
def test_the_public_host_needs_a_key(key: str | None, base_url: str) -> None:
    with pytest.raises(AgentError) as caught:
        AnthropicClient(base_url=base_url, api_key=key, transport=httpx.MockTransport(unreachable))
    assert caught.value.kind is ErrorKind.CONFIG
    assert "AGENT_API_KEY" in caught.value.message
    assert "api.anthropic.com" in caught.value.message


async def test_other_hosts_need_no_key() -> None:
    for base_url in ("http://127.0.0.1:8080", "https://proxy.example.test", "http://anthropic.com"):
        client = builder(api_key=None, base_url=base_url)
        assert "api_key=None" in repr(client)
        await client.aclose()


async def test_retries_report_notices_and_use_the_request_deadline() -> None:
    overloaded = fx("error_529_overloaded__issue-cline-52")["response"]["body"]
    answers = [httpx.Response(529, json=overloaded), httpx.Response(200, json=TEXT_REPLY)]
    notices: list[RetryNotice] = []
    client = client_for(
        lambda request: answers.pop(0),
        retry=RetryPolicy(max_attempts=3, base_delay=0.0, max_delay=0.0),
    )
    async with aclosing(client):
        response = await client.chat(
            ChatRequest(messages=[ChatMessage.user("x")], on_retry=notices.append)
        )
        assert response.text == "4200 + 42 = 4242"
        assert [(n.attempt, n.error.kind) for n in notices] == [(1, ErrorKind.UNAVAILABLE)]

        answers[:] = [httpx.Response(529, json=overloaded)]
        past = asyncio.get_running_loop().time()  # a deadline already reached: no retry
        with pytest.raises(AgentError) as caught:
            await client.chat(ChatRequest(messages=[ChatMessage.user("x")], deadline=past))
        assert caught.value.status == 529
