"""Agents on the real wire clients over httpx's mock transport, answered with recorded
traffic (``tests/fixtures/wire``), for tests of the loop that look at the wire.

:func:`client` answers the n-th request with the n-th reply: a recorded fixture (its status,
headers and body), a reply body (sent whole, or as the provider's stream when the request
asks for one) or a ready ``httpx.Response``; every request body is kept, as bytes, in order.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from agent_plugin.providers.anthropic import AnthropicClient
from agent_plugin.providers.base import LlmClient
from agent_plugin.providers.openai import OpenAICompatibleClient
from agent_plugin.providers.retry import RetryPolicy
from tests.wire import answer, anthropic_stream, load, openai_stream

Wire = Literal["openai", "anthropic"]
WIRES: list[Wire] = ["openai", "anthropic"]
KEY = "sk-test-0123456789abcdef0123456789"

Reply = dict[str, Any] | httpx.Response

RATE_LIMITED = {
    "openai": "openai-compatible__openrouter-error_429_upstream__pydantic-ai",
    "anthropic": "anthropic__error_429_rate_limit__issue-claude-code-71634",
}
UNAVAILABLE = {
    "openai": "openai-compatible__error_500_server_error__issue-chatgpt-vscode-100",
    "anthropic": "anthropic__error_529_overloaded__issue-cline-52",
}
TOO_LONG = {
    "openai": "openai-compatible__error_400_context_length_exceeded__issue-chathub-126",
    "anthropic": "anthropic__error_400_prompt_too_long__issue-exe.dev-62",
}
UNAUTHORISED = {
    "openai": "openai-compatible__error_401_invalid_api_key__mirascope",
    "anthropic": "anthropic__error_401_authentication__dd-trace-py",
}


def recorded(name: str, **headers: str) -> httpx.Response:
    """The recorded answer of fixture ``name``, with ``headers`` added (``retry-after``)."""
    response = answer(load(name))
    response.headers.update(headers)
    return response


def text_reply(wire: Wire, text: str) -> dict[str, Any]:
    if wire == "openai":
        body = copy.deepcopy(load("openai-compatible__text_basic__mirascope")["response"]["body"])
        body["choices"][0]["message"]["content"] = text
        return dict(body)
    body = copy.deepcopy(load("anthropic__text_basic__mirascope")["response"]["body"])
    body["content"] = [{"type": "text", "text": text}]
    return dict(body)


def tool_reply(wire: Wire, name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    if wire == "openai":
        fixture = load("openai-compatible__tool_call_single__mirascope")
        body = copy.deepcopy(fixture["response"]["body"])
        call = body["choices"][0]["message"]["tool_calls"][0]
        call["id"] = call_id
        call["function"] = {"name": name, "arguments": json.dumps(arguments)}
        return dict(body)
    body = copy.deepcopy(load("anthropic__tool_use_single__dd-trace-py")["response"]["body"])
    body["content"] = [block for block in body["content"] if block["type"] == "tool_use"]
    body["content"][0].update(id=call_id, name=name, input=arguments)
    return dict(body)


@dataclass
class Recorder:
    """The request bodies a client sent, in order."""

    bodies: list[bytes] = field(default_factory=list)

    def json(self, index: int) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.bodies[index])
        return value


def client(
    wire: Wire, replies: list[Reply], sent: Recorder, *, retry: RetryPolicy | None = None
) -> LlmClient:
    queue = list(replies)

    def handler(request: httpx.Request) -> httpx.Response:
        sent.bodies.append(request.content)
        assert queue, f"unexpected request {request.method} {request.url}"
        reply = queue.pop(0)
        if isinstance(reply, httpx.Response):
            return reply
        if not json.loads(request.content).get("stream"):
            return httpx.Response(200, json=reply)
        stream = openai_stream(reply) if wire == "openai" else anthropic_stream(reply)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream)

    transport = httpx.MockTransport(handler)
    policy = retry or RetryPolicy.never()
    if wire == "openai":
        return OpenAICompatibleClient(
            api_key=KEY, retry=policy, transport=transport, model="gpt-4o"
        )
    return AnthropicClient(api_key=KEY, retry=policy, transport=transport)
