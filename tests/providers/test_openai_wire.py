"""The OpenAI-compatible client against recorded real traffic (``tests/fixtures/wire``).

Every ``openai-compatible__*`` fixture has an explicit expectation below; responses are replayed
byte for byte through the real client (httpx.MockTransport with the recorded status, headers and
body), and recorded request bodies are rebuilt as a ChatRequest and compared with what we send.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_plugin.errors import BODY_LIMIT, AgentError, ErrorKind
from agent_plugin.messages import (
    ChatMessage,
    ContentPart,
    Image,
    ImagePart,
    JsonValue,
    RedactedThinking,
    RedactedThinkingPart,
    Role,
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
from agent_plugin.providers.anthropic import AnthropicClient
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
from agent_plugin.providers.openai import OpenAICompatibleClient, parse_response
from agent_plugin.providers.profiles import GENERIC, EndpointProfile, profile_for
from agent_plugin.providers.retry import RetryNotice, RetryPolicy
from agent_plugin.redaction import REDACTED
from tests.wire import (
    collect,
    fixture_names,
    is_stream,
    load,
    openai_folded,
    replay,
    response_bytes,
    sse_body,
)

PROVIDER = "openai-compatible"
KEY = "sk-test-0123456789abcdef"
NAMES = fixture_names(PROVIDER)


# --- expectations, one per fixture ----------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """A successful answer: what the parsed (or stream-aggregated) response must be."""

    stop: StopReason
    raw_stop: str | None
    usage: tuple[int, int, int]  # input, output, cache read
    text: str | None = None  # exact text, when given
    text_prefix: str = ""
    thinking_prefix: str | None = None  # None: no thinking part
    calls: tuple[tuple[str, str, JsonValue], ...] = ()  # id, name, arguments


@dataclass(frozen=True)
class Failure:
    """An error answer: the AgentError the client must raise."""

    kind: ErrorKind
    status: int
    says: str  # a piece of the provider's message


@dataclass(frozen=True)
class Models:
    count: int
    first: tuple[str, ...]


Expectation = Reply | Failure | Models

S = StopReason
EXPECTATIONS: dict[str, Expectation] = {
    "anthropic-openai-compat-text_basic__mirascope": Reply(
        S.END_TURN, "stop", (17, 15, 0), text="4200 + 42 = 4242"
    ),
    "cerebras-models_list__pydantic-ai": Models(3, ("gemma-4-31b", "gpt-oss-120b", "zai-glm-4.7")),
    "deepseek-reasoning_content__pydantic-ai": Reply(
        S.END_TURN,
        "stop",
        (12, 789, 0),
        text_prefix="Crossing the street safely involves careful observation",
        thinking_prefix="Okay, the user is asking how to cross the street.",
    ),
    "deepseek-stream_reasoning_content__dd-trace-py": Reply(
        S.END_TURN,
        "stop",
        (17, 47, 0),
        text="The product of 17 and 23 is 391.",
        thinking_prefix='We are asked: "What is 17 * 23?" This is a simple multiplication. '
        "17 * 23 = 391. I'll provide the answer.",
    ),
    "deepseek-tool_calls_parallel_with_reasoning__pydantic-ai": Reply(
        S.TOOL_USE,
        "tool_calls",
        (875, 79, 0),
        text="Let me get your name and roll the die!",
        thinking_prefix="Great, now I have access to the dice roll tool.",
        calls=(
            ("call_00_6edlnw3Z1MgeMfey687g8451", "get_player_name", {}),
            ("call_01_km02sac7sHxNDPATKLZy7705", "roll_dice", {}),
        ),
    ),
    "error_400_unsupported_parameter__mirascope": Failure(
        ErrorKind.PROVIDER, 400, "Unsupported parameter: 'stop'"
    ),
    "error_401_invalid_api_key__mirascope": Failure(
        ErrorKind.AUTHENTICATION, 401, "Incorrect API key provided"
    ),
    "error_401_on_stream_request__mirascope": Failure(
        ErrorKind.AUTHENTICATION, 401, "Incorrect API key provided"
    ),
    "error_404_model_not_found__mirascope": Failure(
        ErrorKind.PROVIDER, 404, "this-model-does-not-exist-12345"
    ),
    "error_500_server_error__issue-chatgpt-vscode-100": Failure(
        ErrorKind.UNAVAILABLE, 500, "The server had an error processing your request"
    ),
    "finish_function_call_legacy__openllmetry": Reply(
        S.TOOL_USE,
        "function_call",
        (82, 16, 0),
        calls=(("", "get_current_weather", {"location": "Boston"}),),
    ),
    "finish_length__mirascope": Reply(
        S.MAX_TOKENS, "length", (14, 50, 0), text_prefix="Certainly! Here is a list of all 50"
    ),
    "finish_length_reasoning_exhausted__mirascope": Reply(
        S.MAX_TOKENS, "length", (13, 50, 0), text=""
    ),
    "gemini-tool_call_empty_id__pydantic-ai": Reply(
        S.TOOL_USE, "tool_calls", (35, 12, 0), calls=(("", "get_current_time", {}),)
    ),
    "gemini-tool_result_followup__pydantic-ai": Reply(
        S.END_TURN, "stop", (66, 6, 0), text="The current time is Noon."
    ),
    "groq-error_400_tool_use_failed__pydantic-ai": Failure(
        ErrorKind.PROVIDER, 400, "tool_use_failed"
    ),
    "groq-error_404_model_not_found__pydantic-ai": Failure(
        ErrorKind.PROVIDER, 404, "model_not_found"
    ),
    "groq-stream_tool_call__pydantic-ai": Reply(
        S.TOOL_USE,
        "tool_calls",
        (304, 49, 0),
        text="",
        thinking_prefix='We need to call the function with correct parameter "name". '
        'Provide a name, e.g., "example".',
        calls=(
            (
                "fc_bfb39741-3748-4def-9886-a93fc9c64a90",
                "get_something_by_name",
                {"name": "example"},
            ),
        ),
    ),
    "groq-text_basic__openllmetry": Reply(
        S.END_TURN, "stop", (18, 43, 0), text_prefix="Here's a joke about OpenTelemetry"
    ),
    "hf-router-finish_length__pydantic-ai": Reply(
        S.MAX_TOKENS, "length", (4, 100, 0), text_prefix='<think>\nHmm, the user just said "hello"'
    ),
    "litellm-proxy-text_basic__dd-trace-py": Reply(
        S.END_TURN,
        "stop",
        (13, 24, 0),
        text="Not much, just here to help with any questions or tasks you may have. "
        "How can I assist you today?",
    ),
    "models_list__dd-trace-py": Models(112, ("text-search-babbage-doc-001", "curie-search-query")),
    "multiple_choices_n3__openai-python": Reply(
        S.END_TURN,
        "stop",
        (79, 44, 0),
        text='{"city":"San Francisco","temperature":64,"units":"f"}',
    ),
    "ollama-cloud-tool_call_single__pydantic-ai": Reply(
        S.TOOL_USE,
        "tool_calls",
        (206, 194, 0),
        text="",
        thinking_prefix='The conversation: user asked "What is the capital of France?"',
        calls=(("call_o2vnpxrw", "final_result", {"city": "Paris", "country": "France"}),),
    ),
    "ollama-structured_output_json_schema__pydantic-ai": Reply(
        S.END_TURN,
        "stop",
        (136, 15, 0),
        text='{ "city": "Paris", "country": "France" }',
        thinking_prefix="Okay, the user is asking for the capital of France.",
    ),
    "ollama-text_basic__mirascope": Reply(
        S.END_TURN, "stop", (21, 16, 0), text="4200 + 42 = 4242\n"
    ),
    "openrouter-error_429_upstream__pydantic-ai": Failure(
        ErrorKind.RATE_LIMITED, 429, "Provider returned error"
    ),
    "openrouter-stream_comments_and_midstream_error__pydantic-ai": Failure(
        ErrorKind.PROVIDER, 400, "Token limit reached"
    ),
    "openrouter-text_basic_usage_cost__dd-trace-py": Reply(
        S.END_TURN,
        "stop",
        (74, 21, 0),
        text="The capital of France is **Paris**.",
        thinking_prefix="Simple.",
    ),
    "openrouter-tool_call_single__pydantic-ai": Reply(
        S.TOOL_USE,
        "tool_calls",
        (134, 43, 0),
        text="",
        calls=(
            ("3sniiMddS", "divide", {"numerator": 123, "denominator": 456, "on_inf": "infinity"}),
        ),
    ),
    "refusal__mirascope": Reply(
        S.REFUSAL, "stop", (64, 13, 0), text="I'm very sorry, but I can't assist with that request."
    ),
    "stream_finish_length__mirascope": Reply(
        S.MAX_TOKENS, "length", (14, 50, 0), text_prefix="Here is a list of all 50 U.S. states"
    ),
    "stream_refusal__openai-python": Reply(
        S.REFUSAL, "stop", (79, 11, 0), text="I'm sorry, I can't assist with that request."
    ),
    "stream_text__mirascope": Reply(S.END_TURN, "stop", (16, 10, 0), text="4200 + 42 equals 4242."),
    "stream_text_no_usage__openllmetry": Reply(
        S.END_TURN,
        "stop",
        (0, 0, 0),
        text="Why did the opentelemetry developer go broke? \n"
        "Because they kept trying to trace their steps back too far!",
    ),
    "stream_tool_call__pydantic-ai": Reply(
        S.TOOL_USE,
        "tool_calls",
        (53, 15, 0),
        text="",
        calls=(("call_ZR5UUuTt3pf61kjwAJIYdVMj", "get_capital", {"country": "UK"}),),
    ),
    "stream_tool_calls_parallel__mirascope": Reply(
        S.TOOL_USE,
        "tool_calls",
        (75, 53, 0),
        text="",
        calls=(
            ("call_M26z19sncd7b4LBgzKRRbaUE", "secret_retrieval_tool", {"password": "mellon"}),
            ("call_KPXe5NX7IcKkaBUhc6dto2QV", "secret_retrieval_tool", {"password": "radiance"}),
        ),
    ),
    "stream_tool_result_followup__pydantic-ai": Reply(
        S.END_TURN, "stop", (78, 9, 0), text="The capital of the UK is London."
    ),
    "stream_usage_cached_tokens__dd-trace-py": Reply(
        S.MAX_TOKENS, "length", (1420, 100, 1280), text_prefix="Structuring a database schema"
    ),
    "text_basic__mirascope": Reply(S.END_TURN, "stop", (16, 12, 0), text="\\(4200 + 42 = 4242\\)."),
    "together-finish_reason_eos__openllmetry": Reply(
        S.UNKNOWN, "eos", (18, 35, 0), text_prefix=" Why don't we ever hear secrets"
    ),
    "tool_call_legacy_parameters_object__tgi": Reply(
        S.UNKNOWN,
        "eos_token",
        (316, 29, 0),
        text="",
        calls=(("0", "tools", {"format": "celsius", "location": "New York, NY", "num_days": 14}),),
    ),
    "tool_call_single__mirascope": Reply(
        S.TOOL_USE,
        "tool_calls",
        (71, 17, 0),
        text="",
        calls=(
            ("call_Usk6zffuhvy2YSSFmCyLHBlv", "passphrase_test_tool", {"passphrase": "portal"}),
        ),
    ),
    "tool_call_stop_finish_reason__tgi": Reply(
        S.TOOL_USE,
        "stop",
        (501, 29, 0),
        text="",
        calls=(("0", "get_current_weather", {"location": "Brooklyn, NY", "format": "fahrenheit"}),),
    ),
    "tool_calls_parallel__mirascope": Reply(
        S.TOOL_USE,
        "tool_calls",
        (75, 53, 0),
        text="",
        calls=(
            ("call_v6LacIrChvs6ITVpIZqy5tFc", "secret_retrieval_tool", {"password": "mellon"}),
            ("call_onyWzk4mLTGKzW9cthmf4Llq", "secret_retrieval_tool", {"password": "radiance"}),
        ),
    ),
    "tool_result_followup_error__mirascope": Reply(
        S.END_TURN,
        "stop",
        (113, 32, 0),
        text_prefix="It seems the passphrase you provided was incorrect.",
    ),
    "tool_results_followup_parallel__mirascope": Reply(
        S.END_TURN, "stop", (149, 32, 0), text_prefix="The secrets associated with the passwords"
    ),
    "usage_cached_tokens__mirascope": Reply(
        S.END_TURN, "stop", (3663, 117, 3584), text_prefix='"Ah, the most important meal of the day'
    ),
    "mistral-thinking_parts__pydantic-ai": Reply(
        S.END_TURN,
        "stop",
        (664, 747, 0),
        text_prefix="Crossing a river is quite different from crossing a street",
        thinking_prefix="**Analogizing crossing a river**",
    ),
    "mistral-stream_thinking_parts__pydantic-ai": Reply(
        S.END_TURN,
        "stop",
        (10, 232, 0),
        text_prefix="To cross the street safely, follow these steps:",
        thinking_prefix="Okay, the user is asking how to cross the street.",
    ),
    "error_429_insufficient_quota__issue-NextChat-3664": Failure(
        ErrorKind.OUT_OF_CREDIT, 429, "You exceeded your current quota"
    ),
    "deepseek-error_402_insufficient_balance__issue-aider-4851": Failure(
        ErrorKind.OUT_OF_CREDIT, 402, "Insufficient Balance"
    ),
    "error_400_context_length_exceeded__issue-chathub-126": Failure(
        ErrorKind.CONTEXT_TOO_LONG, 400, "maximum context length is 4097 tokens"
    ),
    "mistral-error_422_stream_options__issue-avante.nvim-2347": Failure(
        ErrorKind.PROVIDER, 422, "Extra inputs are not permitted"
    ),
    "vllm-text_basic__openllmetry": Reply(
        S.END_TURN,
        "stop",
        (43, 36, 0),
        text_prefix="Why did the OpenTelemetry metric go to therapy?",
    ),
}


def short(name: str) -> str:
    return name.removeprefix(PROVIDER + "__")


def test_every_fixture_has_an_explicit_expectation() -> None:
    assert NAMES, "no openai-compatible fixtures found"
    assert {short(n) for n in NAMES} == set(EXPECTATIONS)


# --- replaying recorded traffic through the real client -------------------------------------


def base_url_for(fixture: dict[str, Any]) -> str:
    """The base URL that makes the client hit the recorded path: on the recorded host where
    the recording kept it (so the client takes that host's profile), else on a test host."""
    url = fixture["request"]["url"] or "http://llm.test" + fixture["request"]["path"]
    url = url.split("?")[0]
    for suffix in ("/chat/completions", "/models"):
        if url.endswith(suffix):
            return url.removesuffix(suffix)
    raise AssertionError(url)


def replay_client(
    fixture: dict[str, Any],
    sent: list[httpx.Request] | None = None,
) -> OpenAICompatibleClient:
    return OpenAICompatibleClient(
        base_url=base_url_for(fixture),
        api_key=KEY,
        retry=RetryPolicy.never(),
        transport=httpx.MockTransport(replay(fixture, sent=sent)),
    )


def wants_stream(fixture: dict[str, Any]) -> bool:
    body = fixture["request"].get("body")
    return is_stream(fixture) or (isinstance(body, dict) and body.get("stream") is True)


def offline(_: httpx.Request) -> httpx.Response:
    raise AssertionError("this test must not send anything")


# build_body needs no network; a mock transport also skips building an SSL context per client.
# A test host: the generic profile.
BUILDER = OpenAICompatibleClient(
    base_url="http://llm.test/v1", api_key=KEY, transport=httpx.MockTransport(offline)
)


def builder_for(fixture: dict[str, Any]) -> OpenAICompatibleClient:
    """A client for ``build_body`` with the profile of the recording's host."""
    return OpenAICompatibleClient(
        base_url=base_url_for(fixture), api_key=KEY, transport=httpx.MockTransport(offline)
    )


def plain_request() -> ChatRequest:
    return ChatRequest(messages=[ChatMessage.user("hello")])


# --- rebuilding recorded requests -----------------------------------------------------------

# Options the neutral ChatRequest has no field for travel in extra_body, exactly as a user would
# send them.
VENDOR_OPTIONS = (
    "response_format",
    "seed",
    "presence_penalty",
    "user",
    "reasoning_effort",
    "thinking",
    "max_completion_tokens",
    "functions",
    "function_call",
    "top_p",
)

# Recorded top-level keys we deliberately do not send.
NOT_SENT: dict[str, str] = {
    "n": "we read choices[0] only, so we never ask for several choices (n=1 is the default)",
}

# Recorded message keys we deliberately do not send.
MESSAGE_KEYS_NOT_SENT: dict[str, str] = {
    "annotations": "mirascope echoes the previous reply's (empty) annotations",
}


def request_from_recorded(body: dict[str, Any]) -> ChatRequest:
    """The neutral request a caller would build for a recorded chat-completions body."""
    messages: list[ChatMessage] = []
    for message in body["messages"]:
        role = message["role"]
        if role == "tool":
            result = ToolResult(tool_call_id=message["tool_call_id"], content=message["content"])
            if messages and messages[-1].role is Role.TOOL:
                earlier = [
                    p.tool_result for p in messages[-1].content if isinstance(p, ToolResultPart)
                ]
                messages[-1] = ChatMessage.tool_results([*earlier, result])
            else:
                messages.append(ChatMessage.tool_results([result]))
        elif role == "assistant":
            parts: list[ContentPart] = []
            reasoning = message.get("reasoning_content", message.get("reasoning"))
            content = message.get("content")
            if isinstance(content, list):  # Mistral: thinking parts, then text parts
                reasoning = "".join(
                    t["text"] for p in content if p["type"] == "thinking" for t in p["thinking"]
                )
                content = "".join(p["text"] for p in content if p["type"] == "text")
            if reasoning is not None:
                parts.append(ThinkingPart(thinking=Thinking(text=reasoning)))
            if content:
                parts.append(TextPart(text=content))
            for call in message.get("tool_calls") or []:
                function = call["function"]
                parts.append(
                    ToolCallPart(
                        tool_call=ToolCall(
                            id=call["id"],
                            name=function["name"],
                            arguments=json.loads(function["arguments"]),
                        )
                    )
                )
            messages.append(ChatMessage(role=Role.ASSISTANT, content=parts))
        else:
            messages.append(ChatMessage.of_text(role, message["content"]))
    tools = body.get("tools")
    definitions = [
        ToolDefinition(
            name=tool["function"]["name"],
            description=tool["function"]["description"],
            input_schema=tool["function"]["parameters"],
        )
        for tool in (tools if isinstance(tools, list) else [])
    ]
    choice = body.get("tool_choice")
    return ChatRequest(
        messages=messages,
        tools=definitions,
        max_tokens=body.get("max_tokens"),
        temperature=body.get("temperature"),
        tool_choice=choice if isinstance(choice, str) else None,
        stop=body.get("stop") or [],
        model=body.get("model"),
        extra_body={k: body[k] for k in VENDOR_OPTIONS if body.get(k) is not None},
    )


def assert_matches_recording(
    ours: dict[str, Any], recorded: dict[str, Any], profile: EndpointProfile = GENERIC
) -> None:
    """Every key we send equals the recording; recorded keys we omit are documented, and
    so is each place where ``profile`` (the host's) says the field goes otherwise."""
    renamed = {"max_tokens": profile.max_tokens_field}
    for key, value in ours.items():
        theirs = next((k for k, v in renamed.items() if v == key and k in recorded), key)
        if key == "messages":
            assert len(value) == len(recorded["messages"])
            for mine, recorded_message in zip(value, recorded["messages"], strict=True):
                assert_message_matches(mine, recorded_message, profile)
        elif key == "tools":
            assert len(value) == len(recorded["tools"])
            for mine, recorded_tool in zip(value, recorded["tools"], strict=True):
                assert mine["type"] == recorded_tool["type"] == "function"
                assert set(recorded_tool["function"]) - set(mine["function"]) <= {"strict"}
                for field_name, field_value in mine["function"].items():
                    assert recorded_tool["function"][field_name] == field_value
        elif key == "model" and key not in recorded:
            pass  # TGI serves one model and was called without one
        elif key == "tool_choice" and key not in recorded:
            assert value == "auto"  # mirascope left it out; "auto" is the server's default
        elif key == "stream_options" and key not in recorded:
            # we ask for the usage chunk where the profile says [AG-23]; pydantic-ai's Groq
            # client and the reconstructed openai-python request left it out
            assert profile.stream_usage
            assert value == {"include_usage": True}
        else:
            assert recorded[theirs] == value, key
    for key in set(recorded) - set(ours):
        value = recorded[key]
        omitted = isinstance(value, str) and value.startswith("<omitted")
        defaulted = value is None or value is False or value == []  # unset / stream off / no tools
        moved = renamed.get(key) in ours
        refused = (key == "stream_options" and not profile.stream_usage) or (
            key == "tool_choice" and not profile.tool_choice and value == "auto"
        )
        assert key in NOT_SENT or omitted or defaulted or moved or refused, (
            f"recorded key {key!r} is not sent"
        )


def assert_message_matches(
    ours: dict[str, Any], recorded: dict[str, Any], profile: EndpointProfile = GENERIC
) -> None:
    for key, value in ours.items():
        if key == "content" and key not in recorded:
            assert value is None
            assert ours["role"] == "assistant"
        elif key == "role" and value != recorded["role"]:
            assert (recorded["role"], value) == ("system", profile.system_role)
        elif key == "content" and isinstance(value, list) and ours["role"] == "assistant":
            # Mistral's thinking parts: the same reasoning and text (we send one thinking part)
            assert profile.reasoning_field == "thinking"
            assert split_content(value) == split_content(recorded["content"])
        elif key == "tool_calls":
            assert len(value) == len(recorded["tool_calls"])
            for mine, theirs in zip(value, recorded["tool_calls"], strict=True):
                assert (mine["id"], mine["type"]) == (theirs["id"], theirs["type"])
                assert mine["function"]["name"] == theirs["function"]["name"]
                # we re-serialise parsed arguments, so compare them as JSON, not as text
                mine_args = json.loads(mine["function"]["arguments"])
                assert mine_args == json.loads(theirs["function"]["arguments"])
        else:
            assert recorded[key] == value, key
    for key in set(recorded) - set(ours):
        # null, [] and false are the defaults (pydantic-ai's Mistral client sends
        # tool_calls: [] and prefix: false)
        assert key in MESSAGE_KEYS_NOT_SENT or recorded[key] in (None, [], False), key


def split_content(content: list[dict[str, Any]]) -> tuple[str, str]:
    """The reasoning and the text of a content-part array."""
    thinking = "".join(t["text"] for p in content if p["type"] == "thinking" for t in p["thinking"])
    return thinking, "".join(p["text"] for p in content if p["type"] == "text")


def request_for(fixture: dict[str, Any]) -> ChatRequest:
    body = fixture["request"].get("body")
    if fixture["request"]["method"] == "POST" and isinstance(body, dict):
        return request_from_recorded(body)
    return plain_request()


REQUEST_FIXTURES = [
    n
    for n in NAMES
    if load(n)["request"]["method"] == "POST" and isinstance(load(n)["request"].get("body"), dict)
]


@pytest.mark.parametrize("name", REQUEST_FIXTURES, ids=short)
def test_build_body_matches_the_recorded_request(name: str) -> None:
    fixture = load(name)
    recorded = fixture["request"]["body"]
    builder = builder_for(fixture)
    ours = builder.build_body(request_for(fixture), stream=recorded.get("stream") is True)
    assert builder.profile == profile_for(fixture["request"]["url"] or "http://llm.test")
    assert_matches_recording(ours, recorded, builder.profile)


def test_request_fixtures_cover_the_request_shapes() -> None:
    shapes = {short(n).split("__")[0] for n in REQUEST_FIXTURES}
    for needed in (
        "tool_results_followup_parallel",
        "stream_tool_result_followup",
        "deepseek-tool_calls_parallel_with_reasoning",
        "gemini-tool_result_followup",
        "stream_usage_cached_tokens",
    ):
        assert needed in shapes


# --- the per-fixture replay -----------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES, ids=short)
async def test_fixture_replays_through_the_client(name: str) -> None:
    fixture = load(name)
    expected = EXPECTATIONS[short(name)]
    sent: list[httpx.Request] = []
    client = replay_client(fixture, sent)
    request = request_for(fixture)
    try:
        if isinstance(expected, Models):
            ids = await client.list_models()
            assert len(ids) == expected.count
            assert tuple(ids[: len(expected.first)]) == expected.first
            assert ids == [m["id"] for m in fixture["response"]["body"]["data"]]
        elif isinstance(expected, Failure):
            call = collect(client, request) if wants_stream(fixture) else client.chat(request)
            with pytest.raises(AgentError) as caught:
                await call
            check_failure(caught.value, expected, fixture)
        elif is_stream(fixture):
            events = await collect(client, request)
            response = check_events(events)
            check_reply(response, expected)
            assert response == parse_response(openai_folded(sse_body(fixture)))
        else:
            response = await client.chat(request)
            check_reply(response, expected)
            check_against_recorded_body(response, fixture["response"]["body"])
    finally:
        await client.aclose()
    assert len(sent) == 1
    assert sent[0].url.path == fixture["request"]["path"].split("?")[0]
    assert sent[0].method == fixture["request"]["method"]
    assert sent[0].headers["authorization"] == f"Bearer {KEY}"
    if sent[0].method == "POST":
        body = json.loads(sent[0].content)
        assert body == client.build_body(request, stream=wants_stream(fixture))
        if isinstance(fixture["request"].get("body"), dict):
            assert_matches_recording(body, fixture["request"]["body"], client.profile)


def check_reply(response: ChatResponse, expected: Reply) -> None:
    assert response.stop_reason is expected.stop
    assert response.raw_stop_reason == expected.raw_stop
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens) == expected.usage
    assert usage.cache_write_tokens == 0
    if expected.text is not None:
        assert response.text == expected.text
    assert response.text.startswith(expected.text_prefix)
    thinking = [p.thinking for p in response.content if isinstance(p, ThinkingPart)]
    if expected.thinking_prefix is None:
        assert thinking == []
    else:
        assert len(thinking) == 1
        assert thinking[0].text.startswith(expected.thinking_prefix)
        assert thinking[0].signature is None
        assert isinstance(response.content[0], ThinkingPart)  # reasoning comes first
    calls = [(c.id, c.name, c.arguments) for c in response.tool_calls]
    assert calls == list(expected.calls)
    assert all(c.raw_arguments is None for c in response.tool_calls)
    texts = [p for p in response.content if isinstance(p, TextPart)]
    assert all(p.text for p in texts)  # empty content never becomes a part


def check_against_recorded_body(response: ChatResponse, body: dict[str, Any]) -> None:
    """The parsed reply says what the recorded body says (read here without the parser)."""
    message = body["choices"][0]["message"]
    content = message.get("content")
    if isinstance(content, list):  # Mistral's content parts
        thinking, content = split_content(content)
        assert [p.thinking.text for p in response.content if isinstance(p, ThinkingPart)] == [
            thinking
        ]
    assert response.text == (content or "") + (message.get("refusal") or "")
    recorded_calls = message.get("tool_calls") or []
    if message.get("function_call"):
        recorded_calls = [{"id": "", "function": message["function_call"]}]
    assert len(response.tool_calls) == len(recorded_calls)
    for call, raw in zip(response.tool_calls, recorded_calls, strict=True):
        assert (call.id, call.name) == (str(raw["id"]), raw["function"]["name"])
        arguments = raw["function"].get("arguments", raw["function"].get("parameters"))
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        assert call.arguments == arguments
    assert response.model == body["model"]
    assert response.id == body.get("id")
    assert response.usage.input_tokens == body["usage"]["prompt_tokens"]
    assert response.usage.output_tokens == body["usage"]["completion_tokens"]
    assert parse_response(body) == response


def check_failure(error: AgentError, expected: Failure, fixture: dict[str, Any]) -> None:
    assert error.kind is expected.kind
    assert error.status == expected.status
    assert error.provider == PROVIDER
    assert expected.says in error.message
    assert error.body is not None
    assert len(error.body) <= BODY_LIMIT
    assert expected.says in error.body
    assert error.retry_after is None  # none of the recorded error answers carries Retry-After
    if fixture["response"]["status"] != 200:
        assert f"{PROVIDER} answered {expected.status}" in error.message
        assert error.body == response_bytes(fixture).decode().strip()[:BODY_LIMIT]


def check_events(events: list[StreamEvent]) -> ChatResponse:
    """Stream invariants; returns the aggregate."""
    assert events, "no events"
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert not any(isinstance(e, StreamDone) for e in events[:-1])
    response = done.response
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == response.text
    thinking = "".join(e.text for e in events if isinstance(e, ThinkingDelta))
    assert thinking == "".join(
        p.thinking.text for p in response.content if isinstance(p, ThinkingPart)
    )
    starts = [e for e in events if isinstance(e, ToolCallStarted)]
    calls = response.tool_calls
    assert [(s.index, s.id, s.name) for s in starts] == [
        (i, c.id, c.name) for i, c in enumerate(calls)
    ]
    for index, call in enumerate(calls):
        positions = [
            n
            for n, e in enumerate(events)
            if isinstance(e, ToolCallArgumentsDelta) and e.index == index
        ]
        start = events.index(starts[index])
        assert all(p > start for p in positions)
        fragments = "".join(
            e.fragment for e in events if isinstance(e, ToolCallArgumentsDelta) and e.index == index
        )
        if call.raw_arguments is not None:
            assert fragments == call.raw_arguments
        elif fragments.strip():
            parsed = json.loads(fragments)
            assert (parsed if parsed is not None else {}) == call.arguments
    return response


# --- recorded conversations carried forward -------------------------------------------------


def tools_of(body: dict[str, Any]) -> list[ToolDefinition]:
    return request_from_recorded(body).tools


async def test_streamed_tool_call_then_result_is_the_recorded_followup() -> None:
    """stream_tool_call's reply + the tool result == stream_tool_result_followup's request."""
    first = load(f"{PROVIDER}__stream_tool_call__pydantic-ai")
    followup = load(f"{PROVIDER}__stream_tool_result_followup__pydantic-ai")["request"]["body"]
    client = replay_client(first)
    user = ChatMessage.user("What is the capital of the UK? Use the tool, then answer.")
    tools = tools_of(first["request"]["body"])
    events = await collect(client, ChatRequest(messages=[user], tools=tools))
    await client.aclose()
    reply = check_events(events)
    transcript = [
        user,
        ChatMessage(role=Role.ASSISTANT, content=reply.content),
        ChatMessage.tool_results(
            [ToolResult(tool_call_id=reply.tool_calls[0].id, content="London")]
        ),
    ]
    body = BUILDER.build_body(ChatRequest(messages=transcript, tools=tools), stream=True)
    assert body["model"] == "gpt-4o-mini"  # the client's default model, as recorded
    assert body["messages"][1]["content"] is None  # tool calls and no text: null, as recorded
    assert_matches_recording(body, followup)


@pytest.mark.parametrize(
    ("call", "followup", "results"),
    [
        (
            "tool_calls_parallel__mirascope",
            "tool_results_followup_parallel__mirascope",
            ["Welcome to Moria!", "Life before Death"],
        ),
        (
            "tool_call_single__mirascope",
            "tool_result_followup_error__mirascope",
            ["Incorrect passhrase: The correct passphrase is 'cake'. Try again."],
        ),
    ],
)
async def test_tool_call_reply_then_results_is_the_recorded_followup(
    call: str, followup: str, results: list[str]
) -> None:
    first = load(f"{PROVIDER}__{call}")
    recorded = load(f"{PROVIDER}__{followup}")["request"]["body"]
    request = request_from_recorded(first["request"]["body"])
    client = replay_client(first)
    reply = await client.chat(request)
    await client.aclose()
    request.messages += [
        ChatMessage(role=Role.ASSISTANT, content=reply.content),
        ChatMessage.tool_results(
            [
                ToolResult(tool_call_id=c.id, content=r)
                for c, r in zip(reply.tool_calls, results, strict=True)
            ]
        ),
    ]
    assert_matches_recording(client.build_body(request, stream=False), recorded, client.profile)


async def test_stream_and_whole_twins_agree() -> None:
    """The same parallel-tool-call conversation, recorded streamed and whole."""
    whole = await chat_fixture("tool_calls_parallel__mirascope")
    client = replay_client(load(f"{PROVIDER}__stream_tool_calls_parallel__mirascope"))
    streamed = check_events(await collect(client, plain_request()))
    await client.aclose()
    assert [(c.name, c.arguments) for c in streamed.tool_calls] == [
        (c.name, c.arguments) for c in whole.tool_calls
    ]
    assert (streamed.stop_reason, streamed.usage) == (whole.stop_reason, whole.usage)


async def chat_fixture(name: str) -> ChatResponse:
    client = replay_client(load(f"{PROVIDER}__{name}"))
    try:
        return await client.chat(plain_request())
    finally:
        await client.aclose()


async def stream_fixture(name: str) -> list[StreamEvent]:
    client = replay_client(load(f"{PROVIDER}__{name}"))
    try:
        return await collect(client, plain_request())
    finally:
        await client.aclose()


# --- the quirks, one named test each ---------------------------------------------------------


def body_with(message: dict[str, Any], finish: str | None = "stop", **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        **extra,
    }


async def test_quirk_content_null_next_to_tool_calls() -> None:
    reply = await chat_fixture("tool_call_single__mirascope")
    assert (
        load(f"{PROVIDER}__tool_call_single__mirascope")["response"]["body"]["choices"][0][
            "message"
        ]["content"]
        is None
    )
    assert [type(p).__name__ for p in reply.content] == ["ToolCallPart"]
    assert parse_response(body_with({"content": None})).content == []
    # Ollama and OpenRouter send "" instead of null: also no text part
    ollama = await chat_fixture("ollama-cloud-tool_call_single__pydantic-ai")
    assert [type(p).__name__ for p in ollama.content] == ["ThinkingPart", "ToolCallPart"]


async def test_quirk_tool_call_id_empty() -> None:
    reply = await chat_fixture("gemini-tool_call_empty_id__pydantic-ai")
    assert reply.tool_calls == [ToolCall(id="", name="get_current_time", arguments={})]
    missing = body_with({"tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]})
    assert parse_response(missing).tool_calls[0].id == ""


async def test_quirk_arguments_as_an_object() -> None:
    reply = await chat_fixture("tool_call_legacy_parameters_object__tgi")
    assert reply.tool_calls[0].arguments == {
        "format": "celsius",
        "location": "New York, NY",
        "num_days": 14,
    }
    given_object = body_with(
        {"tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {"x": [1, 2]}}}]}
    )
    assert parse_response(given_object).tool_calls[0].arguments == {"x": [1, 2]}


async def test_quirk_integer_tool_call_id() -> None:
    reply = await chat_fixture("tool_call_legacy_parameters_object__tgi")
    raw = load(f"{PROVIDER}__tool_call_legacy_parameters_object__tgi")["response"]["body"]
    assert raw["choices"][0]["message"]["tool_calls"][0]["id"] == 0
    assert reply.tool_calls[0].id == "0"


async def test_quirk_legacy_function_call() -> None:
    reply = await chat_fixture("finish_function_call_legacy__openllmetry")
    assert reply.stop_reason is StopReason.TOOL_USE
    assert reply.tool_calls == [
        ToolCall(id="", name="get_current_weather", arguments={"location": "Boston"})
    ]


async def test_quirk_refusal_whole_and_streamed() -> None:
    whole = await chat_fixture("refusal__mirascope")
    assert whole.stop_reason is StopReason.REFUSAL
    assert whole.raw_stop_reason == "stop"  # refusal is not a finish_reason on the wire
    assert whole.content == [TextPart(text="I'm very sorry, but I can't assist with that request.")]
    events = await stream_fixture("stream_refusal__openai-python")
    streamed = check_events(events)
    assert streamed.stop_reason is StopReason.REFUSAL
    assert streamed.content == [TextPart(text="I'm sorry, I can't assist with that request.")]
    assert parse_response(body_with({"content": "x"}, "content_filter")).stop_reason is (
        StopReason.REFUSAL
    )


async def test_quirk_unknown_finish_reason_eos() -> None:
    together = await chat_fixture("together-finish_reason_eos__openllmetry")
    assert (together.stop_reason, together.raw_stop_reason) == (StopReason.UNKNOWN, "eos")
    tgi = await chat_fixture("tool_call_legacy_parameters_object__tgi")
    assert (tgi.stop_reason, tgi.raw_stop_reason) == (StopReason.UNKNOWN, "eos_token")
    assert parse_response(body_with({"content": "x"}, None)).stop_reason is StopReason.UNKNOWN


async def test_quirk_stop_with_tool_calls_is_tool_use() -> None:
    reply = await chat_fixture("tool_call_stop_finish_reason__tgi")
    assert (reply.stop_reason, reply.raw_stop_reason) == (StopReason.TOOL_USE, "stop")


async def test_quirk_openrouter_comment_lines_and_midstream_error() -> None:
    fixture = load(f"{PROVIDER}__openrouter-stream_comments_and_midstream_error__pydantic-ai")
    assert fixture["response"]["sse"][0] == ": OPENROUTER PROCESSING"
    assert fixture["response"]["status"] == 200
    client = replay_client(fixture)
    seen: list[StreamEvent] = []

    async def consume() -> None:
        async for event in client.stream(plain_request()):
            seen.append(event)

    with pytest.raises(AgentError) as caught:
        await consume()
    await client.aclose()
    # the deltas before the error arrived (comments skipped), and no StreamDone
    assert seen == [ThinkingDelta("We need"), ThinkingDelta(" to respond to a greeting. The user")]
    error = caught.value
    assert (error.kind, error.status, error.provider) == (ErrorKind.PROVIDER, 400, PROVIDER)
    assert error.message == f"{PROVIDER} reported an error: Token limit reached"
    assert error.body == '{"code": 400, "message": "Token limit reached"}'


async def test_quirk_groq_whole_tool_call_in_one_chunk() -> None:
    events = await stream_fixture("groq-stream_tool_call__pydantic-ai")
    reply = check_events(events)
    calls = [e for e in events if isinstance(e, ToolCallStarted | ToolCallArgumentsDelta)]
    assert calls == [
        ToolCallStarted(0, "fc_bfb39741-3748-4def-9886-a93fc9c64a90", "get_something_by_name"),
        ToolCallArgumentsDelta(0, '{"name":"example"}'),
    ]
    assert reply.stop_reason is StopReason.TOOL_USE


async def test_quirk_several_choices_take_the_first() -> None:
    reply = await chat_fixture("multiple_choices_n3__openai-python")
    body = load(f"{PROVIDER}__multiple_choices_n3__openai-python")["response"]["body"]
    assert len(body["choices"]) == 3
    assert reply.text == body["choices"][0]["message"]["content"]


async def test_quirk_openrouter_whitespace_padded_body() -> None:
    fixture = load(f"{PROVIDER}__openrouter-text_basic_usage_cost__dd-trace-py")
    raw = fixture["response"]["body_raw"]
    assert raw.startswith("\n ")
    assert raw.lstrip().startswith("{")
    reply = await chat_fixture("openrouter-text_basic_usage_cost__dd-trace-py")
    assert reply.text == "The capital of France is **Paris**."


def test_quirk_arguments_that_are_not_json_are_kept_raw() -> None:
    bad = '{"city": "Par'
    reply = parse_response(
        body_with({"tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": bad}}]})
    )
    call = reply.tool_calls[0]
    assert (call.arguments, call.raw_arguments) == ({}, bad)
    # sent back unchanged, so the transcript stays what the model said
    body = BUILDER.build_body(
        ChatRequest(messages=[ChatMessage(role=Role.ASSISTANT, content=reply.content)]),
        stream=False,
    )
    assert body["messages"][0]["tool_calls"][0]["function"]["arguments"] == bad


@pytest.mark.parametrize(
    ("arguments", "wire"),
    [
        ([1, "two", None], '[1,"two",null]'),
        ("just text", '"just text"'),
        (42, "42"),
        (True, "true"),
        ({"city": "Zürich", "n": 1.5}, '{"city":"Zürich","n":1.5}'),
    ],
)
def test_tool_call_arguments_of_any_json_kind_are_resent_as_the_model_gave_them(
    arguments: JsonValue, wire: str
) -> None:
    """A model that answered ``[1, "two", null]`` sees exactly that in the transcript, not {}."""
    body = body_with(
        {
            "tool_calls": [
                {"id": "c1", "function": {"name": "f", "arguments": json.dumps(arguments)}}
            ]
        }
    )
    call = parse_response(body).tool_calls[0]
    assert (call.arguments, call.raw_arguments) == (arguments, None)
    resent = BUILDER.build_body(
        ChatRequest(
            messages=[ChatMessage(role=Role.ASSISTANT, content=[ToolCallPart(tool_call=call)])]
        ),
        stream=False,
    )
    assert resent["messages"][0]["tool_calls"][0]["function"]["arguments"] == wire


DEEP = "[" * 100_000  # json.loads raises RecursionError on this, not ValueError


def test_absurdly_nested_arguments_are_kept_raw() -> None:
    body = body_with({"tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": DEEP}}]})
    call = parse_response(body).tool_calls[0]
    assert (call.arguments, call.raw_arguments) == ({}, DEEP)


async def test_absurdly_nested_stream_chunk_is_a_decode_error() -> None:
    with pytest.raises(AgentError) as caught:
        await stream_bytes((chunk({"content": "a"}) + f"data: {DEEP}\n\n").encode())
    assert caught.value.kind is ErrorKind.DECODE
    assert caught.value.provider == PROVIDER


@pytest.mark.parametrize("arguments", ["null", "", "  ", None])
def test_quirk_null_or_missing_arguments_are_empty(arguments: str | None) -> None:
    function: dict[str, Any] = {"name": "f"}
    if arguments is not None:
        function["arguments"] = arguments
    reply = parse_response(body_with({"tool_calls": [{"id": "c", "function": function}]}))
    assert reply.tool_calls[0] == ToolCall(id="c", name="f", arguments={})


def test_error_object_in_a_200_body() -> None:
    upstream = body_with({"content": None}, error={"code": 502, "message": "upstream down"})
    with pytest.raises(AgentError) as caught:
        parse_response(upstream)
    assert (caught.value.kind, caught.value.status) == (ErrorKind.UNAVAILABLE, 502)
    assert "upstream down" in caught.value.message
    with pytest.raises(AgentError) as caught:
        parse_response({"error": {"code": "some_code", "message": "too bad"}})
    assert (caught.value.kind, caught.value.status) == (ErrorKind.PROVIDER, None)
    # what the error says decides where its status does not
    with pytest.raises(AgentError) as caught:
        parse_response({"error": {"code": "context_length_exceeded", "message": "too long"}})
    assert (caught.value.kind, caught.value.status) == (ErrorKind.CONTEXT_TOO_LONG, None)
    assert "longer than the model's context window" in caught.value.message
    with pytest.raises(AgentError) as caught:
        parse_response({"error": "plain text"})
    assert caught.value.kind is ErrorKind.PROVIDER
    assert parse_response(body_with({"content": "ok"}, error=None)).text == "ok"


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ([], "not a JSON object"),
        ({"choices": []}, "has no choices"),
        ({"id": "x"}, "has no choices"),
        ({"choices": [1]}, "not an object"),
        ({"choices": [{"finish_reason": "stop"}]}, "has no message"),
        (body_with({"content": 5}), "neither text nor null"),
        (body_with({"tool_calls": {"id": "x"}}), "not an array"),
        (body_with({"tool_calls": [{"id": "x"}]}), "no function"),
        (body_with({"tool_calls": [{"id": [1], "function": {}}]}), "id"),
        (body_with({"tool_calls": [{"function": {"name": 3}}]}), "name"),
        (body_with({"function_call": "f"}), "function_call"),
    ],
)
def test_bad_shapes_are_decode_errors(data: object, says: str) -> None:
    with pytest.raises(AgentError) as caught:
        parse_response(data, "my-server")
    assert caught.value.kind is ErrorKind.DECODE
    assert caught.value.provider == "my-server"
    assert says in caught.value.message


# --- streams: ends, garbage -------------------------------------------------------------------


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
    payload = {
        "id": "c",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return "data: " + json.dumps({**payload, **extra}) + "\n\n"


async def stream_bytes(content: bytes, request: ChatRequest | None = None) -> list[StreamEvent]:
    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=content)

    client = OpenAICompatibleClient(
        api_key=KEY, retry=RetryPolicy.never(), transport=httpx.MockTransport(handler)
    )
    try:
        return await collect(client, request or plain_request())
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("cut", "kind"),
    [
        (chunk({"role": "assistant", "content": ""}), ErrorKind.TRANSPORT),  # nothing shown
        (chunk({"content": "Hel"}), ErrorKind.STREAM_INTERRUPTED),
    ],
    ids=["before_output", "after_output"],
)
async def test_stream_ending_early(cut: str, kind: ErrorKind) -> None:
    with pytest.raises(AgentError) as caught:
        await stream_bytes(cut.encode())
    assert caught.value.kind is kind
    assert "stream ended early" in caught.value.message
    assert caught.value.retryable  # the whole call may be made again


async def test_stream_with_a_finish_reason_but_no_done_is_complete() -> None:
    events = await stream_bytes((chunk({"content": "Hi"}) + chunk({}, "stop")).encode())
    assert check_events(events).text == "Hi"


async def test_stream_invalid_json_is_a_decode_error() -> None:
    with pytest.raises(AgentError) as caught:
        await stream_bytes(b'data: {"choices": [\n\n')
    assert caught.value.kind is ErrorKind.DECODE


async def test_stream_assembles_calls_by_index_even_interleaved() -> None:
    body = (
        chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": ""}}]})
        + chunk(
            {"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g", "arguments": "{"}}]}
        )
        + chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"x":'}}]})
        + chunk({"tool_calls": [{"index": 1, "function": {"arguments": "}"}}]})
        + chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]})
        + chunk({}, "tool_calls")
        + 'data: {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}\n\n'
        + "data: [DONE]\n\n"
    )
    reply = check_events(await stream_bytes(body.encode()))
    assert reply.tool_calls == [
        ToolCall(id="a", name="f", arguments={"x": 1}),
        ToolCall(id="b", name="g", arguments={}),
    ]
    assert reply.usage == TokenUsage(input_tokens=9, output_tokens=4)


async def test_stream_follows_choice_zero_only() -> None:
    def two(a: dict[str, Any], b: dict[str, Any], finish: str | None = None) -> str:
        choices = [
            {"index": 1, "delta": b, "finish_reason": finish},
            {"index": 0, "delta": a, "finish_reason": finish},
        ]
        return "data: " + json.dumps({"id": "c", "choices": choices}) + "\n\n"

    body = two({"content": "A"}, {"content": "B"}) + two({}, {}, "stop") + "data: [DONE]\n\n"
    events = await stream_bytes(body.encode())
    assert check_events(events).text == "A"
    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta("A")]


async def test_stream_keeps_the_first_id_and_name_of_a_call() -> None:
    body = (
        chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": ""}}]})
        + chunk(
            {"tool_calls": [{"index": 0, "id": "z", "function": {"name": "g", "arguments": "{}"}}]}
        )
        + chunk({}, "tool_calls")
    )
    reply = check_events(await stream_bytes(body.encode()))
    assert reply.tool_calls == [ToolCall(id="a", name="f", arguments={})]


async def test_stream_tool_call_deltas_without_index() -> None:
    body = (
        chunk({"tool_calls": [{"id": "a", "function": {"name": "f", "arguments": '{"x"'}}]})
        + chunk({"tool_calls": [{"function": {"arguments": ":1}"}}]})
        + chunk({"tool_calls": [{"id": "b", "function": {"name": "g", "arguments": "{}"}}]})
        + chunk({}, "tool_calls")
    )
    reply = check_events(await stream_bytes(body.encode()))
    assert reply.tool_calls == [
        ToolCall(id="a", name="f", arguments={"x": 1}),
        ToolCall(id="b", name="g", arguments={}),
    ]


async def test_stream_arguments_given_as_a_long_object_arrive_whole() -> None:
    # TGI-style: the arguments come as an object, not text; the fragment is all of its JSON
    arguments = {"text": "é" * 2000}
    function = {"name": "f", "arguments": arguments}
    body = chunk({"tool_calls": [{"index": 0, "id": "a", "function": function}]})
    events = await stream_bytes((body + chunk({}, "tool_calls")).encode())
    reply = check_events(events)
    assert reply.tool_calls == [ToolCall(id="a", name="f", arguments=arguments)]
    [fragment] = [e.fragment for e in events if isinstance(e, ToolCallArgumentsDelta)]
    assert json.loads(fragment) == arguments


async def test_stream_legacy_function_call() -> None:
    body = (
        chunk(
            {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": ""}}
        )
        + chunk({"function_call": {"arguments": '{"a": 1}'}})
        + chunk({}, "function_call")
    )
    events = await stream_bytes(body.encode())
    reply = check_events(events)
    assert reply.tool_calls == [ToolCall(id="", name="f", arguments={"a": 1})]
    assert reply.stop_reason is StopReason.TOOL_USE
    assert events[0] == ToolCallStarted(0, "", "f")


@pytest.mark.parametrize(
    "payload", ['{"message": "overloaded"}', '{"error": {"message": "overloaded"}}', '"overloaded"']
)
async def test_stream_sse_error_event(payload: str) -> None:
    body = chunk({"content": "a"}) + f"event: error\ndata: {payload}\n\n"
    with pytest.raises(AgentError) as caught:
        await stream_bytes(body.encode())
    assert caught.value.kind is ErrorKind.PROVIDER
    assert "overloaded" in caught.value.message


async def test_stream_error_event_echoing_the_key_is_scrubbed() -> None:
    body = chunk({"content": "a"}) + "data: " + json.dumps({"error": {"message": f"bad {KEY}"}})
    with pytest.raises(AgentError) as caught:
        await stream_bytes((body + "\n\n").encode())
    assert KEY not in caught.value.message
    assert KEY not in (caught.value.body or "")
    assert REDACTED in caught.value.message


# --- seed cases (reference §1.4, AP-09..AP-11, AP-15, AG-23) ---------------------------------


def capture(
    reply: Callable[[httpx.Request], httpx.Response],
    *,
    api_key: str | None = KEY,
    retry: RetryPolicy | None = None,
    base_url: str = "https://api.example.test/v1/",
) -> tuple[OpenAICompatibleClient, list[httpx.Request]]:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return reply(request)

    client = OpenAICompatibleClient(
        model="gpt-4o",
        base_url=base_url,
        api_key=api_key,
        retry=retry or RetryPolicy.never(),
        transport=httpx.MockTransport(handler),
    )
    return client, sent


def ok(body: dict[str, Any]) -> Callable[[httpx.Request], httpx.Response]:
    return lambda _: httpx.Response(200, json=body)


WEATHER = ToolDefinition(
    name="get_weather",
    description="Weather for a city.",
    input_schema={"type": "object", "properties": {"city": {"type": "string"}}},
)


async def test_seed_request_shape() -> None:
    client, sent = capture(ok(body_with({"content": "hi"})))
    request = ChatRequest(
        messages=[ChatMessage.system("Be brief."), ChatMessage.user("Weather in Oslo?")],
        tools=[WEATHER],
        max_tokens=256,
    )
    await client.chat(request)
    await client.chat(ChatRequest(messages=[ChatMessage.user("hi")]))
    await client.aclose()
    assert str(sent[0].url) == "https://api.example.test/v1/chat/completions"
    assert sent[0].headers["authorization"] == f"Bearer {KEY}"
    assert sent[0].headers["content-type"] == "application/json"
    assert json.loads(sent[0].content) == {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Oslo?"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Weather for a city.",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                },
            }
        ],
        "tool_choice": "auto",
        "max_tokens": 256,
    }
    plain = json.loads(sent[1].content)
    assert "tools" not in plain
    assert "tool_choice" not in plain
    assert plain == {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


async def test_seed_no_key_no_authorization_header() -> None:
    client, sent = capture(ok(body_with({"content": "hi"})), api_key=None)
    await client.chat(plain_request())
    await client.aclose()
    assert "authorization" not in sent[0].headers


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        (None, "auto"),
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ("get_weather", {"type": "function", "function": {"name": "get_weather"}}),
    ],
)
def test_tool_choice(choice: str | None, wire: object) -> None:
    request = ChatRequest(messages=[ChatMessage.user("x")], tools=[WEATHER], tool_choice=choice)
    assert BUILDER.build_body(request, stream=False)["tool_choice"] == wire
    no_tools = ChatRequest(messages=[ChatMessage.user("x")], tool_choice=choice)
    assert "tool_choice" not in BUILDER.build_body(no_tools, stream=False)


def test_build_body_options_stream_and_extra_body() -> None:
    request = ChatRequest(
        messages=[ChatMessage.user("x")],
        max_tokens=10,
        temperature=0.0,
        stop=["END"],
        model="other-model",
        extra_body={"seed": 7, "max_tokens": None, "max_completion_tokens": 10},
    )
    body = BUILDER.build_body(request, stream=True)
    assert body == {
        "model": "other-model",
        "messages": [{"role": "user", "content": "x"}],
        "temperature": 0.0,
        "stop": ["END"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "seed": 7,
        "max_completion_tokens": 10,
    }


def test_build_body_message_conversion() -> None:
    call = ToolCall(id="c1", name="get_weather", arguments={"city": "Oslo"})
    request = ChatRequest(
        messages=[
            ChatMessage(role=Role.SYSTEM, content=[TextPart(text="a"), TextPart(text="b")]),
            ChatMessage(
                role=Role.USER,
                content=[
                    TextPart(text="look:"),
                    ImagePart(image=Image(url="https://img.test/a.png")),
                    ImagePart(image=Image(data="QUJD", media_type="image/jpeg")),
                ],
            ),
            ChatMessage(
                role=Role.ASSISTANT,
                content=[
                    ThinkingPart(thinking=Thinking(text="hmm")),
                    ThinkingPart(thinking=Thinking(text="signed", signature="sig")),
                    RedactedThinkingPart(redacted_thinking=RedactedThinking(data="x")),
                    TextPart(text="Checking."),
                    ToolCallPart(tool_call=call),
                ],
            ),
            ChatMessage.tool_results(
                [
                    ToolResult(tool_call_id="c1", content='{"temp": 3}'),
                    ToolResult(tool_call_id="c2", content='{"error": "x"}', is_error=True),
                ]
            ),
            ChatMessage(role=Role.ASSISTANT, content=[]),
        ]
    )
    messages = BUILDER.build_body(request, stream=False)["messages"]
    assert messages == [
        {"role": "system", "content": "ab"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look:"},
                {"type": "image_url", "image_url": {"url": "https://img.test/a.png"}},
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,QUJD"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "hmm",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 3}'},
        {"role": "tool", "tool_call_id": "c2", "content": '{"error": "x"}'},
        {"role": "assistant", "content": ""},
    ]


def test_image_without_url_or_media_type_is_a_config_error() -> None:
    request = ChatRequest(
        messages=[ChatMessage(role=Role.USER, content=[ImagePart(image=Image(data="QUJD"))])]
    )
    with pytest.raises(AgentError) as caught:
        BUILDER.build_body(request, stream=False)
    assert caught.value.kind is ErrorKind.CONFIG


async def test_seed_tool_call_round_trip_usage_42_17() -> None:
    body = body_with(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                }
            ],
        },
        "tool_calls",
    )
    body["usage"] = {
        "prompt_tokens": 42,
        "completion_tokens": 17,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    client, _ = capture(ok(body))
    reply = await client.chat(ChatRequest(messages=[ChatMessage.user("x")], tools=[WEATHER]))
    await client.aclose()
    assert reply.tool_calls == [
        ToolCall(id="call_1", name="get_weather", arguments={"city": "Oslo"})
    ]
    assert reply.stop_reason is StopReason.TOOL_USE
    assert reply.usage == TokenUsage(input_tokens=42, output_tokens=17)
    assert reply.usage.total() == 59


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (
            {
                "prompt_tokens": 2000,
                "completion_tokens": 5,
                "prompt_tokens_details": {"cached_tokens": 1536},
            },
            (2000, 5, 1536, 0),
        ),
        (
            {"prompt_tokens": 2000, "completion_tokens": 5, "prompt_cache_hit_tokens": 1536},
            (2000, 5, 1536, 0),
        ),
        (
            {
                "prompt_tokens": 2000,
                "completion_tokens": 5,
                "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 300},
            },
            (2000, 5, 0, 300),
        ),
        ({"prompt_tokens": -3, "completion_tokens": 2.0, "total_tokens": "x"}, (0, 2, 0, 0)),
        (None, (0, 0, 0, 0)),
        ("weird", (0, 0, 0, 0)),
    ],
)
def test_seed_cached_tokens(usage: object, expected: tuple[int, int, int, int]) -> None:
    body = body_with({"content": "x"})
    body["usage"] = usage
    got = parse_response(body).usage
    assert (
        got.input_tokens,
        got.output_tokens,
        got.cache_read_tokens,
        got.cache_write_tokens,
    ) == expected


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (401, ErrorKind.AUTHENTICATION),
        (403, ErrorKind.AUTHENTICATION),
        (429, ErrorKind.RATE_LIMITED),
        (413, ErrorKind.BUDGET),
        (408, ErrorKind.UNAVAILABLE),
        (500, ErrorKind.UNAVAILABLE),
        (529, ErrorKind.UNAVAILABLE),
        (400, ErrorKind.PROVIDER),
    ],
)
async def test_seed_errors_map_to_kinds(status: int, kind: ErrorKind) -> None:
    long_body = json.dumps({"error": {"message": "x" * 1000}})
    client, _ = capture(lambda _: httpx.Response(status, text=long_body))
    with pytest.raises(AgentError) as caught:
        await client.chat(plain_request())
    await client.aclose()
    error = caught.value
    assert (error.kind, error.status, error.provider) == (kind, status, PROVIDER)
    assert f"{PROVIDER} answered {status}" in error.message
    assert error.body == long_body[:BODY_LIMIT]


async def test_retry_after_header_is_kept() -> None:
    client, _ = capture(lambda _: httpx.Response(429, headers={"retry-after": "7"}, text="{}"))
    with pytest.raises(AgentError) as caught:
        await client.chat(plain_request())
    await client.aclose()
    assert caught.value.retry_after == 7.0


async def test_retryable_fixture_error_is_retried_then_succeeds() -> None:
    failure = load(f"{PROVIDER}__error_500_server_error__issue-chatgpt-vscode-100")
    success = load(f"{PROVIDER}__text_basic__mirascope")
    answers = [
        httpx.Response(500, content=response_bytes(failure)),
        httpx.Response(200, content=response_bytes(success)),
    ]
    client, sent = capture(lambda _: answers.pop(0), retry=RetryPolicy(base_delay=0, max_delay=0))
    notices: list[RetryNotice] = []
    request = plain_request()
    request.on_retry = notices.append
    reply = await client.chat(request)
    await client.aclose()
    assert reply.text == "\\(4200 + 42 = 4242\\)."
    assert len(sent) == 2
    assert [(n.attempt, n.error.kind) for n in notices] == [(1, ErrorKind.UNAVAILABLE)]


async def test_seed_list_models() -> None:
    client, sent = capture(ok({"object": "list", "data": [{"id": "a"}, {"id": "b"}]}))
    assert await client.list_models() == ["a", "b"]
    await client.aclose()
    assert sent[0].method == "GET"
    assert str(sent[0].url) == "https://api.example.test/v1/models"
    assert sent[0].headers["authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize("body", [{"data": "x"}, {"models": []}, {"data": [{"name": "a"}]}, [1]])
async def test_list_models_bad_shapes_are_decode_errors(body: Any) -> None:
    client, _ = capture(lambda _: httpx.Response(200, json=body))
    with pytest.raises(AgentError) as caught:
        await client.list_models()
    await client.aclose()
    assert caught.value.kind is ErrorKind.DECODE


@pytest.mark.parametrize("key", [None, ""])
@pytest.mark.parametrize(
    "base_url",
    ["https://api.openai.com/v1", "https://API.OPENAI.COM:443/v1/", "http://api.openai.com"],
)
def test_the_public_host_needs_a_key(key: str | None, base_url: str) -> None:
    with pytest.raises(AgentError) as caught:
        OpenAICompatibleClient(
            base_url=base_url, api_key=key, transport=httpx.MockTransport(offline)
        )
    assert caught.value.kind is ErrorKind.CONFIG
    assert "AGENT_API_KEY" in caught.value.message
    assert "api.openai.com" in caught.value.message


async def test_local_servers_need_no_key() -> None:
    for base_url in ("http://localhost:11434/v1", "http://127.0.0.1:8000/v1", "https://openai.com"):
        client, sent = capture(ok(body_with({"content": "hi"})), api_key=None, base_url=base_url)
        assert (await client.chat(plain_request())).text == "hi"
        await client.aclose()
        assert "authorization" not in sent[0].headers


@pytest.mark.parametrize("client_class", [OpenAICompatibleClient, AnthropicClient])
def test_credentials_in_the_base_url_stay_out_of_repr(client_class: type[Any]) -> None:
    client = client_class(model="m", base_url="http://proxy-user:s3cret-pw@h/v1")
    assert "s3cret-pw" not in repr(client)
    assert client.base_url == "http://h/v1"


def test_seed_repr_redacts_the_key() -> None:
    client = OpenAICompatibleClient(model="m", base_url="http://h/v1/", api_key=KEY)
    text = repr(client)
    assert KEY not in text
    assert text == (
        "OpenAICompatibleClient(model='m', base_url='http://h/v1', api_key='[REDACTED]', "
        "profile='openai-compatible')"
    )
    assert client.provider_name == PROVIDER
    assert isinstance(client, LlmClient)


async def test_seed_key_never_appears_in_errors_even_when_echoed() -> None:
    echo = json.dumps({"error": {"message": f"Incorrect API key provided: {KEY}"}})
    client, _ = capture(lambda _: httpx.Response(401, text=echo))
    with pytest.raises(AgentError) as http_error:
        await client.chat(plain_request())
    await client.aclose()
    client, _ = capture(ok({"error": {"code": 401, "message": f"key {KEY} revoked"}}))
    with pytest.raises(AgentError) as body_error:
        await client.chat(plain_request())
    await client.aclose()
    for error in (http_error.value, body_error.value):
        assert error.kind is ErrorKind.AUTHENTICATION
        for text in (
            error.message,
            error.body or "",
            str(error),
            repr(error),
            error.info().model_dump_json(),
        ):
            assert KEY not in text
        assert REDACTED in error.message


# --- fuzz: only AgentError ever leaves the parsers --------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)

BODIES = [
    load(n)["response"]["body"]
    for n in NAMES
    if "body" in load(n)["response"] and isinstance(load(n)["response"]["body"], dict)
]


def keys_in(node: object) -> set[str]:
    if isinstance(node, dict):
        return set(node).union(*(keys_in(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(keys_in(v) for v in node))
    return set()


# every key the recorded bodies use, plus the ones only quirky servers send
KEYS = st.sampled_from(
    sorted(keys_in(BODIES) | {"error", "code", "function_call", "parameters", "reasoning"})
)


def children_of(node: object) -> list[tuple[Any, object]]:
    if isinstance(node, dict):
        return list(node.items())
    if isinstance(node, list):
        return list(enumerate(node))
    return []


@st.composite
def mutated_bodies(draw: st.DrawFn) -> object:
    body: Any = copy.deepcopy(draw(st.sampled_from(BODIES)))
    for _ in range(draw(st.integers(1, 4))):
        node = body
        while True:
            containers = [k for k, v in children_of(node) if isinstance(v, dict | list)]
            if not containers or not draw(st.booleans()):
                break
            node = node[containers[draw(st.integers(0, len(containers) - 1))]]
        if isinstance(node, dict):
            own = sorted(node)
            if draw(st.booleans()) and own:
                key = own[draw(st.integers(0, len(own) - 1))]
            else:
                key = draw(KEYS)
            if draw(st.booleans()):
                node.pop(key, None)
            else:
                node[key] = draw(json_values)
        elif isinstance(node, list) and node:
            node[draw(st.integers(0, len(node) - 1))] = draw(json_values)
    return body


def parse_or_agent_error(data: object) -> None:
    try:
        reply = parse_response(data)
    except AgentError:
        return  # the only exception type allowed out
    assert isinstance(reply, ChatResponse)
    reply.model_dump_json()  # the reply is plain data


@settings(max_examples=80, deadline=None)
@given(json_values)
def test_fuzz_parse_response_on_arbitrary_json(data: object) -> None:
    parse_or_agent_error(data)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_bodies())
def test_fuzz_parse_response_on_mutated_real_bodies(data: object) -> None:
    parse_or_agent_error(data)


STREAMS = [sse_body(load(n)) for n in NAMES if is_stream(load(n))]


@st.composite
def damaged_streams(draw: st.DrawFn) -> bytes:
    body = draw(st.sampled_from(STREAMS))
    cut = draw(st.integers(0, len(body)))
    how = draw(st.sampled_from(["truncate", "replace", "insert"]))
    if how == "truncate":
        return body[:cut]
    junk = draw(
        st.binary(max_size=12)
        | st.sampled_from([b"\n\n", b"data: ", b"data: [DONE]\n\n", b'{"error":1}', b"}", b"null"])
    )
    if how == "replace":
        return body[:cut] + junk + body[cut + len(junk) :]
    return body[:cut] + junk + body[cut:]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_streams())
def test_fuzz_stream_on_truncated_and_garbled_recordings(content: bytes) -> None:
    try:
        events = asyncio.run(stream_bytes(content))
    except AgentError:
        return
    check_events(events)
