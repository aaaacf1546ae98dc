"""Typed results over both wire protocols, whole and streamed, through the real clients on
httpx's mock transport: replies are recorded bodies (``tests/fixtures/wire``) with the
final answer put in, and the requests are read back as the wire carried them.

Tool and prompted mode need nothing new from the wire. Native mode is a ``response_format``
on the OpenAI-compatible wire and a tool the reply must call on Anthropic's."""

from __future__ import annotations

import copy
import json
from typing import Any, Literal

import httpx
import pytest
from pydantic import BaseModel, ConfigDict

from agent_plugin.agent import Agent
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import AgentEvent, OutputDelta, RunEnded
from agent_plugin.messages import ChatMessage
from agent_plugin.outcomes import AgentOutcome, Completed
from agent_plugin.providers.anthropic import AnthropicClient
from agent_plugin.providers.base import ChatRequest, LlmClient, ResponseFormat
from agent_plugin.providers.openai import OpenAICompatibleClient
from agent_plugin.providers.retry import RetryPolicy
from agent_plugin.tools import FnTool
from tests.wire import anthropic_stream, data_payloads, load, openai_stream, sse

Wire = Literal["openai", "anthropic"]
WIRES: list[Wire] = ["openai", "anthropic"]
KEY = "sk-test-0123456789abcdef0123456789"


class CityLocation(BaseModel):
    """Where a city is."""

    model_config = ConfigDict(extra="forbid")

    city: str
    country: str


PARIS = {"city": "Paris", "country": "France"}


def openai_tool_reply(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(load("openai-compatible__tool_call_single__mirascope")["response"]["body"])
    call = body["choices"][0]["message"]["tool_calls"][0]
    call["function"] = {"name": name, "arguments": json.dumps(arguments)}
    return dict(body)


def openai_text_reply(text: str) -> dict[str, Any]:
    body = copy.deepcopy(load("openai-compatible__text_basic__mirascope")["response"]["body"])
    body["choices"][0]["message"]["content"] = text
    return dict(body)


def anthropic_tool_reply(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(load("anthropic__tool_use_single__dd-trace-py")["response"]["body"])
    body["content"] = [block for block in body["content"] if block["type"] == "tool_use"]
    body["content"][0].update(name=name, input=arguments)
    return dict(body)


def anthropic_text_reply(text: str) -> dict[str, Any]:
    body = copy.deepcopy(load("anthropic__text_basic__mirascope")["response"]["body"])
    body["content"] = [{"type": "text", "text": text}]
    return dict(body)


def pieces(text: str, size: int = 4) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def openai_chunked(body: dict[str, Any]) -> bytes:
    """The stream of ``body`` with text and tool-call arguments a few characters a chunk."""
    out: list[dict[str, Any] | str] = []
    for payload in data_payloads(openai_stream(body)):
        choices = payload.get("choices") if isinstance(payload, dict) else None
        delta = choices[0]["delta"] if choices else {}
        if isinstance(payload, dict) and delta.get("tool_calls"):
            (call,) = delta["tool_calls"]
            start = {**call, "function": {**call["function"], "arguments": ""}}
            out.append(_with_delta(payload, {"tool_calls": [start]}))
            for piece in pieces(call["function"]["arguments"]):
                more = {"index": call["index"], "function": {"arguments": piece}}
                out.append(_with_delta(payload, {"tool_calls": [more]}))
        elif isinstance(payload, dict) and isinstance(delta.get("content"), str):
            out += [_with_delta(payload, {"content": p}) for p in pieces(delta["content"])]
        else:
            out.append(payload)
    return sse(out)


def _with_delta(payload: dict[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
    choice = {**payload["choices"][0], "delta": delta}
    return {**payload, "choices": [choice]}


def anthropic_chunked(body: dict[str, Any]) -> bytes:
    out: list[dict[str, Any] | str] = []
    for payload in data_payloads(anthropic_stream(body)):
        delta = payload.get("delta") if isinstance(payload, dict) else None
        if isinstance(payload, dict) and payload["type"] == "content_block_delta":
            assert isinstance(delta, dict)
            key = "partial_json" if delta["type"] == "input_json_delta" else "text"
            out += [{**payload, "delta": {**delta, key: p}} for p in pieces(delta[key])]
        else:
            out.append(payload)
    return sse(out, named=True)


def client(wire: Wire, replies: list[dict[str, Any]], sent: list[dict[str, Any]]) -> LlmClient:
    queue = list(replies)

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        reply = queue.pop(0)
        if not body.get("stream"):
            return httpx.Response(200, json=reply)
        chunked = openai_chunked(reply) if wire == "openai" else anthropic_chunked(reply)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=chunked)

    transport = httpx.MockTransport(handler)
    if wire == "openai":
        return OpenAICompatibleClient(
            api_key=KEY, retry=RetryPolicy.never(), transport=transport, model="gpt-4o"
        )
    return AnthropicClient(api_key=KEY, retry=RetryPolicy.never(), transport=transport)


def tool_reply(wire: Wire, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return (openai_tool_reply if wire == "openai" else anthropic_tool_reply)(name, arguments)


def text_reply(wire: Wire, text: str) -> dict[str, Any]:
    return (openai_text_reply if wire == "openai" else anthropic_text_reply)(text)


def offered_tools(wire: Wire, body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The tools a request offers, by name: their JSON Schema."""
    if wire == "openai":
        return {t["function"]["name"]: t["function"]["parameters"] for t in body["tools"]}
    return {t["name"]: t["input_schema"] for t in body["tools"]}


def system_text(wire: Wire, body: dict[str, Any]) -> str:
    if wire == "openai":
        first = body["messages"][0]
        assert first["role"] in ("system", "developer")
        return str(first["content"])
    system = body["system"]
    return system if isinstance(system, str) else "".join(block["text"] for block in system)


async def run(agent: Agent[Any], streamed: bool) -> tuple[AgentOutcome, list[AgentEvent]]:
    if not streamed:
        return (await agent.run("Where were the 2024 olympics?")).outcome, []
    events = [event async for event in agent.stream("Where were the 2024 olympics?")]
    end = events[-1]
    assert isinstance(end, RunEnded)
    assert end.outcome is not None
    return end.outcome, events


def partials(events: list[AgentEvent]) -> list[Any]:
    return [event.partial for event in events if isinstance(event, OutputDelta)]


# --- tool mode -------------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("wire", WIRES)
async def test_tool_mode_over_the_wire(wire: Wire, streamed: bool) -> None:
    sent: list[dict[str, Any]] = []
    replies = [
        tool_reply(wire, "final_result", {"city": "Paris"}),  # country missing: sent back
        tool_reply(wire, "final_result", PARIS),
    ]
    agent = Agent(client(wire, replies, sent), output_type=CityLocation)
    outcome, events = await run(agent, streamed)
    assert isinstance(outcome, Completed)
    assert outcome.output == CityLocation(**PARIS)
    schema = offered_tools(wire, sent[0])["final_result"]
    assert schema["required"] == ["city", "country"]
    retry = sent[1]["messages"][-1]
    if wire == "openai":
        assert retry["role"] == "tool"
        assert "country: Field required" in retry["content"]
    else:
        (block,) = retry["content"]
        assert block["type"] == "tool_result"
        assert block["is_error"] is True
        assert "country: Field required" in json.dumps(block["content"])
    if streamed:
        grown = partials(events)
        assert grown[-1] == PARIS
        assert len(grown) >= 4  # it grew over several fragments


# --- prompted mode ---------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("wire", WIRES)
async def test_prompted_mode_over_the_wire(wire: Wire, streamed: bool) -> None:
    sent: list[dict[str, Any]] = []
    replies = [text_reply(wire, "Paris, France."), text_reply(wire, json.dumps(PARIS))]
    agent = Agent(
        client(wire, replies, sent),
        system_prompt="You answer in JSON.",
        output_type=CityLocation,
        output_mode="prompted",
    )
    outcome, events = await run(agent, streamed)
    assert isinstance(outcome, Completed)
    assert outcome.output.city == "Paris"
    system = system_text(wire, sent[0])
    assert system.startswith("You answer in JSON.\n\nGive your final answer as one JSON value")
    assert '"required": ["city", "country"]' in system
    assert not sent[0].get("tools")
    retry = sent[1]["messages"][-1]
    assert retry["role"] == "user"
    assert "the reply is not JSON" in json.dumps(retry["content"])
    if streamed:
        grown = partials(events)
        assert grown[-1] == PARIS
        assert {"city": "Paris"} in grown


# --- native mode -----------------------------------------------------------------------------


async def test_a_recorded_native_reply_is_read_as_the_output() -> None:
    """Ollama's answer to a ``json_schema`` response format (the recording's request asked for
    CityLocation), through the OpenAI-compatible client."""
    recorded = load("openai-compatible__ollama-structured_output_json_schema__pydantic-ai")
    sent: list[dict[str, Any]] = []
    agent = Agent(
        client("openai", [recorded["response"]["body"]], sent),
        output_type=CityLocation,
        output_mode="native",
    )
    outcome, _ = await run(agent, False)
    assert isinstance(outcome, Completed)
    assert outcome.output == CityLocation(**PARIS)
    assert not sent[0].get("tools")


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "stream"])
async def test_a_native_reply_in_text_streams_its_partials(streamed: bool) -> None:
    sent: list[dict[str, Any]] = []
    agent = Agent(
        client("openai", [openai_text_reply(json.dumps(PARIS))], sent),
        output_type=CityLocation,
        output_mode="native",
    )
    outcome, events = await run(agent, streamed)
    assert isinstance(outcome, Completed)
    assert outcome.output.country == "France"
    if streamed:
        assert partials(events)[-1] == PARIS


async def test_native_mode_sends_a_json_schema_response_format_on_the_openai_wire() -> None:
    sent: list[dict[str, Any]] = []
    agent = Agent(
        client("openai", [openai_text_reply(json.dumps(PARIS))], sent),
        output_type=CityLocation,
        output_mode="native",
    )
    await run(agent, False)
    assert sent[0]["response_format"] == {
        "type": "json_schema",
        "json_schema": {
            "name": "CityLocation",
            "description": "Give the final answer: Where a city is.",
            "schema": {
                "additionalProperties": False,
                "properties": {
                    "city": {"title": "City", "type": "string"},
                    "country": {"title": "Country", "type": "string"},
                },
                "required": ["city", "country"],
                "type": "object",
            },
            "strict": True,
        },
    }


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "stream"])
async def test_native_mode_goes_through_a_forced_tool_on_the_anthropic_wire(
    streamed: bool,
) -> None:
    sent: list[dict[str, Any]] = []
    reply = anthropic_tool_reply("CityLocation", PARIS)
    agent = Agent(
        client("anthropic", [reply], sent), output_type=CityLocation, output_mode="native"
    )
    outcome, events = await run(agent, streamed)
    assert offered_tools("anthropic", sent[0]) == {
        "CityLocation": {
            "additionalProperties": False,
            "properties": {
                "city": {"title": "City", "type": "string"},
                "country": {"title": "Country", "type": "string"},
            },
            "required": ["city", "country"],
            "type": "object",
        }
    }
    assert sent[0]["tool_choice"] == {"type": "tool", "name": "CityLocation"}
    assert isinstance(outcome, Completed)  # the forced tool's input came back as the text
    assert outcome.output == CityLocation(**PARIS)
    if streamed:
        assert partials(events)[-1] == PARIS


async def test_native_mode_on_anthropic_beside_the_agents_tools_requires_any_tool() -> None:
    sent: list[dict[str, Any]] = []
    look = FnTool("look", "Look.", {"type": "object"}, lambda arguments: "seen")
    agent = Agent(
        client("anthropic", [anthropic_tool_reply("CityLocation", PARIS)], sent),
        tools=[look],
        output_type=CityLocation,
        output_mode="native",
    )
    outcome, _ = await run(agent, False)
    assert sent[0]["tool_choice"] == {"type": "any"}
    assert set(offered_tools("anthropic", sent[0])) == {"look", "CityLocation"}
    assert isinstance(outcome, Completed)
    assert outcome.output == CityLocation(**PARIS)


async def test_native_mode_where_the_endpoint_cannot_take_it_is_a_config_error() -> None:
    sent: list[dict[str, Any]] = []
    deepseek = OpenAICompatibleClient(
        model="deepseek-chat",
        base_url="https://api.deepseek.com",
        api_key="sk-test-deepseek-1234",
        transport=httpx.MockTransport(lambda request: httpx.Response(500)),
    )
    agent = Agent(deepseek, output_type=CityLocation, output_mode="native")
    with pytest.raises(AgentError) as caught:
        await agent.run("Where?")
    assert caught.value.kind is ErrorKind.CONFIG
    assert "response_format" in str(caught.value)
    thinking = ChatRequest(
        messages=[ChatMessage.user("Where?")],
        response_format=ResponseFormat("CityLocation", {"type": "object"}),
        extra_body={"thinking": {"type": "enabled", "budget_tokens": 1024}},
    )
    with pytest.raises(AgentError, match="extended thinking"):
        await client("anthropic", [], sent).chat(thinking)
    assert sent == []  # refused before anything was sent
