"""Errors typed by what they say (``providers/failures.py``), not only by their status."""

from __future__ import annotations

import json
from contextlib import aclosing
from typing import Any

import httpx
import pytest

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.messages import ChatMessage
from agent_plugin.providers.anthropic import AnthropicClient, parse_response
from agent_plugin.providers.base import ChatRequest
from agent_plugin.providers.failures import failure_kind, failure_note
from agent_plugin.providers.openai import OpenAICompatibleClient
from agent_plugin.providers.retry import RetryNotice, RetryPolicy
from tests.wire import collect, load, replay

CREDIT = ErrorKind.OUT_OF_CREDIT
CONTEXT = ErrorKind.CONTEXT_TOO_LONG

# Bodies of the recordings (tests/fixtures/wire) and what they are.
RECORDED = [
    ("openai-compatible__error_429_insufficient_quota__issue-NextChat-3664", CREDIT),
    ("openai-compatible__deepseek-error_402_insufficient_balance__issue-aider-4851", CREDIT),
    ("anthropic__error_400_credit_balance_too_low__issue-claude-code-66314", CREDIT),
    ("openai-compatible__error_400_context_length_exceeded__issue-chathub-126", CONTEXT),
    ("anthropic__error_400_prompt_too_long__issue-exe.dev-62", CONTEXT),
    # look-alikes that are not: a plain rate limit, a bad parameter, an overload
    ("openai-compatible__openrouter-error_429_upstream__pydantic-ai", ErrorKind.RATE_LIMITED),
    ("anthropic__error_429_rate_limit__issue-claude-code-71634", ErrorKind.RATE_LIMITED),
    ("openai-compatible__error_400_unsupported_parameter__mirascope", ErrorKind.PROVIDER),
    (
        "openai-compatible__mistral-error_422_stream_options__issue-avante.nvim-2347",
        ErrorKind.PROVIDER,
    ),
    ("anthropic__error_529_overloaded__issue-cline-52", ErrorKind.UNAVAILABLE),
]


@pytest.mark.parametrize(("name", "kind"), RECORDED, ids=[n.split("__")[1] for n, _ in RECORDED])
def test_recorded_error_bodies(name: str, kind: ErrorKind) -> None:
    response = load(name)["response"]
    status = response["status"]
    assert failure_kind(status, response["body"]) is kind
    text = response.get("body_raw") or json.dumps(response["body"])
    assert failure_kind(status, text) is kind  # the raw text reads the same


# The cousins' messages, as their servers word them (no recording of these was found).
COUSINS: list[tuple[int | None, Any, ErrorKind]] = [
    # vLLM's OpenAI server (BadRequestError) and DeepSeek word it as OpenAI once did
    (
        400,
        {
            "object": "error",
            "message": "This model's maximum context length is 4096 tokens. However, you "
            "requested 5000 tokens (4000 in the messages, 1000 in the completion).",
            "type": "BadRequestError",
            "code": 400,
        },
        CONTEXT,
    ),
    # OpenRouter: a numeric code, the text in message
    (
        400,
        {
            "error": {
                "code": 400,
                "message": "This endpoint's maximum context length is 131072 tokens. However, "
                "you requested about 141607 tokens.",
            }
        },
        CONTEXT,
    ),
    # OpenRouter passing on the upstream provider's own error in metadata.raw
    (
        400,
        {
            "error": {
                "code": 400,
                "message": "Provider returned error",
                "metadata": {"raw": "prompt is too long: 210000 tokens > 200000 maximum"},
            }
        },
        CONTEXT,
    ),
    # llama.cpp server
    (
        400,
        {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
            }
        },
        CONTEXT,
    ),
    # Mistral
    (
        400,
        {
            "object": "error",
            "message": "Prompt contains 40027 tokens and 0 draft tokens, too large for model "
            "with 32768 maximum context length",
            "type": "invalid_request_error",
        },
        CONTEXT,
    ),
    # OpenAI's newer wording, and the same error reported inside a 200 answer
    (
        400,
        {
            "error": {
                "code": "context_length_exceeded",
                "message": "Your input exceeds the context window of this model.",
            }
        },
        CONTEXT,
    ),
    (None, {"code": "context_length_exceeded", "message": "too long"}, CONTEXT),
    # OpenAI's quota in its older form (code null, type insufficient_quota)
    (
        429,
        {
            "error": {
                "type": "insufficient_quota",
                "code": None,
                "message": "You exceeded "
                "your current quota, please check your plan and billing details.",
            }
        },
        CREDIT,
    ),
    # OpenRouter out of credits
    (402, {"error": {"code": 402, "message": "Insufficient credits"}}, CREDIT),
    # Gemini's per-minute quota says "exceeded your current quota" too: a rate limit
    (
        429,
        {
            "error": {
                "code": 429,
                "message": "You exceeded your current quota, please check your plan and billing "
                "details.",
                "status": "RESOURCE_EXHAUSTED",
            }
        },
        ErrorKind.RATE_LIMITED,
    ),
    # a rate limit worded with tokens is still a rate limit
    (
        429,
        {"error": {"message": "Request too large: maximum context length exceeded per min"}},
        ErrorKind.RATE_LIMITED,
    ),
    # a server failure or a refused key keep their kind whatever the text says
    (500, {"error": {"message": "prompt is too long"}}, ErrorKind.UNAVAILABLE),
    (401, {"error": {"code": "insufficient_quota"}}, ErrorKind.AUTHENTICATION),
    # text that is not JSON is read as it is
    (400, "prompt is too long: 5 tokens > 4 maximum", CONTEXT),
    (400, "<html>Bad Request</html>", ErrorKind.PROVIDER),
    (400, "", ErrorKind.PROVIDER),
    (None, "plain", ErrorKind.PROVIDER),
    (413, {"error": {"type": "request_too_large"}}, ErrorKind.BUDGET),
]


@pytest.mark.parametrize(("status", "body", "kind"), COUSINS)
def test_what_the_error_says_decides(status: int | None, body: Any, kind: ErrorKind) -> None:
    assert failure_kind(status, body) is kind


def test_notes_say_what_to_do() -> None:
    assert "out of credit" in (failure_note(CREDIT) or "")
    assert "retrying will not help" in (failure_note(CREDIT) or "")
    assert "context window" in (failure_note(CONTEXT) or "")
    assert failure_note(ErrorKind.PROVIDER) is None


FAST = RetryPolicy(max_attempts=4, base_delay=0.0, max_delay=0.0)


@pytest.mark.parametrize("streaming", [False, True], ids=["chat", "stream"])
@pytest.mark.parametrize(
    "name",
    [
        "openai-compatible__error_429_insufficient_quota__issue-NextChat-3664",
        "openai-compatible__deepseek-error_402_insufficient_balance__issue-aider-4851",
        "openai-compatible__error_400_context_length_exceeded__issue-chathub-126",
    ],
)
async def test_out_of_credit_and_too_long_are_not_retried(name: str, streaming: bool) -> None:
    """insufficient_quota comes as a 429, which a status alone would retry: it is not."""
    fixture = load(name)
    sent: list[httpx.Request] = []
    notices: list[RetryNotice] = []
    client = OpenAICompatibleClient(
        base_url="http://llm.test/v1",
        retry=FAST,
        transport=httpx.MockTransport(replay(*[fixture] * 4, sent=sent)),
    )
    request = ChatRequest(messages=[ChatMessage.user("hi")], on_retry=notices.append)
    async with aclosing(client):
        call = collect(client, request) if streaming else client.chat(request)
        with pytest.raises(AgentError) as caught:
            await call
    assert (len(sent), notices) == (1, [])
    error = caught.value
    assert not error.retryable
    assert error.http_status in (503, 413)
    assert f"answered {fixture['response']['status']} (" in error.message  # with its note


async def test_anthropic_says_out_of_credit_with_its_note() -> None:
    fixture = load("anthropic__error_400_credit_balance_too_low__issue-claude-code-66314")
    client = AnthropicClient(
        api_key="sk-ant-test-0123456789", retry=FAST, transport=httpx.MockTransport(replay(fixture))
    )
    async with aclosing(client):
        with pytest.raises(AgentError) as caught:
            await client.chat(ChatRequest(messages=[ChatMessage.user("hi")]))
    error = caught.value
    assert (error.kind, error.status, error.http_status) == (CREDIT, 400, 503)
    assert "the provider account is out of credit" in error.message
    assert "Your credit balance is too low" in error.message


@pytest.mark.parametrize(
    ("event", "kind"),
    [
        ({"type": "error", "error": {"type": "billing_error", "message": "no"}}, CREDIT),
        (
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 200100 tokens > 200000 maximum",
                },
            },
            CONTEXT,
        ),
    ],
)
def test_anthropic_error_envelopes_in_a_200_answer(event: dict[str, Any], kind: ErrorKind) -> None:
    with pytest.raises(AgentError) as caught:
        parse_response(event)
    assert caught.value.kind is kind
    assert failure_note(kind) in caught.value.message
