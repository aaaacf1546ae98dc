"""Model fallback: FallbackClient moves on to the next model on each fallback kind (and on no
other), reports each switch as an event and a span event, streams fall back only before their
first event, and a transcript sent on to another provider carries none of the first's
thinking."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_plugin.agent import Agent
from agent_plugin.config import AgentSettings
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.events import AgentEvent
from agent_plugin.messages import (
    ChatMessage,
    Role,
    TextPart,
    Thinking,
    ThinkingPart,
)
from agent_plugin.options import DEFAULT_OVERRIDES, RunOptions
from agent_plugin.outcomes import Completed
from agent_plugin.pricing import ModelPrice, Prices
from agent_plugin.providers.anthropic import AnthropicClient
from agent_plugin.providers.base import ChatRequest, FallbackNotice, TextDelta
from agent_plugin.providers.fallback import FALLBACK_ON, FallbackClient, FallbackModel
from agent_plugin.providers.openai import OpenAICompatibleClient
from agent_plugin.providers.retry import RetryPolicy
from agent_plugin.providers.scripted import ScriptedModel
from agent_plugin.runtime import RuntimeSpec, open_runtime
from agent_plugin.sessions import InMemorySessionStore
from agent_plugin.telemetry import Telemetry


def _error(kind: ErrorKind) -> AgentError:
    return AgentError(kind, f"scripted {kind.value}", provider="scripted")


@pytest.mark.parametrize("kind", sorted(FALLBACK_ON))
async def test_each_fallback_kind_moves_on_to_the_next_model(kind: ErrorKind) -> None:
    first = ScriptedModel([_error(kind)], models=["big"])
    second = ScriptedModel(["from the second"], models=["small"])
    events: list[AgentEvent] = []
    agent = Agent(FallbackClient([first, second]))
    turn = await agent.run("hi", options=RunOptions(on_event=events.append))
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "from the second"
    (switch,) = [e for e in events if e.type == "model_fallback"]
    assert switch.model_dump(mode="json") == {
        "type": "model_fallback",
        "run_id": events[0].run_id,
        "from_model": "big",
        "to_model": "small",
        "error": switch.error.model_dump(mode="json"),
    }
    assert switch.error.kind is kind
    # every call starts from the first model again
    first.push("the first is back")
    assert (await agent.run("again")).outcome.text == "the first is back"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "kind", [k for k in ErrorKind if k not in FALLBACK_ON], ids=lambda k: k.value
)
async def test_other_kinds_are_raised_without_a_switch(kind: ErrorKind) -> None:
    second = ScriptedModel(["never"])
    client = FallbackClient([ScriptedModel([_error(kind)]), second])
    with pytest.raises(AgentError) as caught:
        await client.chat(ChatRequest(messages=[ChatMessage.user("hi")]))
    assert caught.value.kind is kind
    assert second.calls == 0


async def test_the_last_models_error_is_raised() -> None:
    client = FallbackClient(
        [
            ScriptedModel([_error(ErrorKind.UNAVAILABLE)]),
            ScriptedModel([_error(ErrorKind.RATE_LIMITED)]),
        ]
    )
    notices: list[FallbackNotice] = []
    request = ChatRequest(messages=[ChatMessage.user("hi")], on_fallback=notices.append)
    with pytest.raises(AgentError) as caught:
        await client.chat(request)
    assert caught.value.kind is ErrorKind.RATE_LIMITED
    assert [n.error.kind for n in notices] == [ErrorKind.UNAVAILABLE]


async def test_one_client_serves_several_models() -> None:
    seen: list[str | None] = []

    def answer(request: ChatRequest) -> Any:
        seen.append(request.model)
        if request.model != "small":
            return _error(ErrorKind.CONTEXT_TOO_LONG)
        return "fits"

    model = ScriptedModel(default=answer)
    client = FallbackClient([model, FallbackModel(model, "small")])
    response = await client.chat(ChatRequest(messages=[ChatMessage.user("long")]))
    assert response.text == "fits"
    assert seen == [None, "small"]
    assert client.model == "scripted"


async def test_a_stream_falls_back_before_its_first_event_only() -> None:
    client = FallbackClient([ScriptedModel([_error(ErrorKind.UNAVAILABLE)]), ScriptedModel(["ok"])])
    events = [e async for e in client.stream(ChatRequest(messages=[ChatMessage.user("hi")]))]
    assert isinstance(events[0], TextDelta)
    assert events[0].text == "ok"

    class Breaks(ScriptedModel):
        async def stream(self, request: ChatRequest) -> Any:
            yield TextDelta("half")
            raise _error(ErrorKind.UNAVAILABLE)

    second = ScriptedModel(["never"])
    broken = FallbackClient([Breaks(), second])
    seen: list[Any] = []

    async def consume() -> None:
        async for event in broken.stream(ChatRequest(messages=[ChatMessage.user("hi")])):
            seen.append(event)

    with pytest.raises(AgentError):
        await consume()
    assert [type(e) for e in seen] == [TextDelta]
    assert second.calls == 0


async def test_the_switch_is_a_span_event_and_priced_as_the_model_that_answered() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    prices = Prices({"small": ModelPrice(input=1.0, output=1.0)}, table=False)
    telemetry = Telemetry(tracer_provider=provider, prices=prices)
    client = FallbackClient(
        [
            ScriptedModel([_error(ErrorKind.UNAVAILABLE)], models=["big"]),
            FallbackModel(ScriptedModel(["ok"]), "small"),
        ]
    )
    turn = await Agent(client, telemetry=telemetry).run("hi")
    (chat,) = [s for s in exporter.get_finished_spans() if s.name == "chat big"]
    (event,) = [e for e in chat.events if e.name == "model_fallback"]
    assert dict(event.attributes or {}) == {
        "agent_plugin.fallback.from_model": "big",
        "agent_plugin.fallback.to_model": "small",
        "error.type": "unavailable",
    }
    assert dict(chat.attributes or {})["agent_plugin.fallback.model"] == "small"
    assert turn.outcome.usage.cost_usd == pytest.approx(15 / 1e6)  # 10 in, 5 out at $1/MTok
    provider.shutdown()


# --- across providers, on the wire -----------------------------------------------------------

_NO_RETRY = RetryPolicy(max_attempts=1)


def _transport(status: int, body: dict[str, Any], sent: list[dict[str, Any]]) -> Any:
    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handle)


_OPENAI_REPLY = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "gpt-4o-mini",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
_ANTHROPIC_REPLY = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-haiku-4-5",
    "content": [{"type": "text", "text": "hi"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 3, "output_tokens": 1},
}
_OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
_DOWN = {"error": {"message": "the server is down", "type": "server_error"}}


def _history(thinking: Thinking) -> list[ChatMessage]:
    return [
        ChatMessage.user("first"),
        ChatMessage(
            role=Role.ASSISTANT, content=[ThinkingPart(thinking=thinking), TextPart(text="one")]
        ),
        ChatMessage.user("second"),
    ]


async def test_anthropic_thinking_is_not_sent_to_an_openai_compatible_fallback() -> None:
    to_anthropic: list[dict[str, Any]] = []
    to_openai: list[dict[str, Any]] = []
    client = FallbackClient(
        [
            AnthropicClient(
                base_url="http://anthropic.test",
                retry=_NO_RETRY,
                transport=_transport(529, _OVERLOADED, to_anthropic),
            ),
            OpenAICompatibleClient(
                base_url="http://openai.test/v1",
                retry=_NO_RETRY,
                transport=_transport(200, _OPENAI_REPLY, to_openai),
            ),
        ]
    )
    signed = Thinking(text="secret reasoning", signature="sig-abc")
    response = await client.chat(ChatRequest(messages=_history(signed)))
    assert response.text == "hi"
    assert "sig-abc" in json.dumps(to_anthropic)  # the first provider got its own thinking
    (body,) = to_openai
    assert "secret reasoning" not in json.dumps(body)
    assert "sig-abc" not in json.dumps(body)
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    await client.aclose()


async def test_unsigned_reasoning_is_not_sent_to_an_anthropic_fallback() -> None:
    to_openai: list[dict[str, Any]] = []
    to_anthropic: list[dict[str, Any]] = []
    client = FallbackClient(
        [
            OpenAICompatibleClient(
                base_url="http://openai.test/v1",
                retry=_NO_RETRY,
                transport=_transport(503, _DOWN, to_openai),
            ),
            AnthropicClient(
                base_url="http://anthropic.test",
                retry=_NO_RETRY,
                transport=_transport(200, _ANTHROPIC_REPLY, to_anthropic),
            ),
        ]
    )
    response = await client.chat(ChatRequest(messages=_history(Thinking(text="mulling it"))))
    assert response.text == "hi"
    (body,) = to_anthropic
    assert "mulling it" not in json.dumps(body)
    assert all(
        block.get("type") != "thinking"
        for message in body["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
    )
    await client.aclose()


async def test_fallback_models_in_the_settings_wrap_the_client() -> None:
    seen: list[str | None] = []

    def answer(request: ChatRequest) -> Any:
        seen.append(request.model)
        return _error(ErrorKind.UNAVAILABLE) if request.model is None else f"{request.model}"

    settings = AgentSettings.load(
        {"provider": "scripted", "fallback_models": ["spare-1", "spare-2"]}, environ={}
    )
    spec = RuntimeSpec(model=ScriptedModel(default=answer), session_store=InMemorySessionStore())
    runtime = await open_runtime(spec, settings)
    try:
        assert isinstance(runtime.client, FallbackClient)
        turn = await runtime.agent_for(DEFAULT_OVERRIDES).run("hi")
    finally:
        await runtime.aclose()
    assert isinstance(turn.outcome, Completed)
    assert turn.outcome.text == "spare-1"
    assert seen == [None, "spare-1"]


def test_a_fallback_list_needs_a_model() -> None:
    with pytest.raises(AgentError) as caught:
        FallbackClient([])
    assert caught.value.kind is ErrorKind.CONFIG
