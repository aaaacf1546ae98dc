"""The same multi-step run through ScriptedModel and through both wire clients over real HTTP.

A local server on 127.0.0.1 answers with scripted replies rendered in each wire format, whole
and streamed. Every path must give the same outcome and the same transcript.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from agent_plugin.agent import Agent
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import AgentTurn, Completed
from agent_plugin.providers.anthropic import AnthropicClient
from agent_plugin.providers.base import LlmClient
from agent_plugin.providers.openai import OpenAICompatibleClient
from agent_plugin.providers.retry import RetryPolicy
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.tools import ToolEffect, tool
from tests.httpserver import HttpServer, RecordedRequest, Reply, reply_json, sse, sse_event

Step = str | list[tuple[str, str, dict[str, Any]]]
"""A scripted turn: final text, or tool calls as (id, name, arguments)."""

SCRIPT: list[Step] = [
    [("c1", "get_weather", {"city": "Oslo"})],
    [("c2", "get_weather", {"city": "Bergen"}), ("c3", "local_time", {"city": "Bergen"})],
    "Oslo is sunny; Bergen is rainy at 12:00.",
]
USAGE = {"input": 10, "output": 5}


@tool(effect=ToolEffect.READ_ONLY)
def get_weather(city: str) -> str:
    """The weather in a city."""
    return {"Oslo": "sunny", "Bergen": "rainy"}[city]


@tool(effect=ToolEffect.READ_ONLY)
async def local_time(city: str) -> dict[str, str]:
    """The local time in a city."""
    return {"city": city, "time": "12:00"}


def openai_body(step: Step) -> dict[str, Any]:
    usage = {"prompt_tokens": USAGE["input"], "completion_tokens": USAGE["output"]}
    if isinstance(step, str):
        message: dict[str, Any] = {"role": "assistant", "content": step}
        finish = "stop"
    else:
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                for i, n, a in step
            ],
        }
        finish = "tool_calls"
    return {
        "id": "chatcmpl-1",
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }


def openai_stream(step: Step) -> list[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse_event(
            {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        )

    events = [chunk({"role": "assistant", "content": ""})]
    if isinstance(step, str):
        events += [chunk({"content": step[:10]}), chunk({"content": step[10:]}), chunk({}, "stop")]
    else:
        for index, (call_id, name, arguments) in enumerate(step):
            text = json.dumps(arguments)
            start = {"index": index, "id": call_id, "type": "function"}
            events.append(
                chunk({"tool_calls": [{**start, "function": {"name": name, "arguments": ""}}]})
            )
            events.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": text[:5]}}]})
            )
            events.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": text[5:]}}]})
            )
        events.append(chunk({}, "tool_calls"))
    usage = {"prompt_tokens": USAGE["input"], "completion_tokens": USAGE["output"]}
    events.append(sse_event({"id": "c", "choices": [], "usage": usage}))
    events.append(b"data: [DONE]\n\n")
    return events


def anthropic_blocks(step: Step) -> list[dict[str, Any]]:
    if isinstance(step, str):
        return [{"type": "text", "text": step}]
    return [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in step]


def anthropic_body(step: Step) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": anthropic_blocks(step),
        "stop_reason": "end_turn" if isinstance(step, str) else "tool_use",
        "usage": {"input_tokens": USAGE["input"], "output_tokens": USAGE["output"]},
    }


def anthropic_stream(step: Step) -> list[bytes]:
    def event(name: str, data: dict[str, Any]) -> bytes:
        return sse_event({"type": name, **data}, event=name)

    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": []}
    events = [
        event(
            "message_start",
            {"message": {**message, "usage": {"input_tokens": USAGE["input"], "output_tokens": 1}}},
        ),
        event("ping", {}),
    ]
    for index, block in enumerate(anthropic_blocks(step)):
        if block["type"] == "text":
            events.append(
                event(
                    "content_block_start",
                    {"index": index, "content_block": {"type": "text", "text": ""}},
                )
            )
            for piece in (block["text"][:10], block["text"][10:]):
                events.append(
                    event(
                        "content_block_delta",
                        {"index": index, "delta": {"type": "text_delta", "text": piece}},
                    )
                )
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            events.append(event("content_block_start", {"index": index, "content_block": start}))
            text = json.dumps(block["input"])
            for piece in (text[:5], text[5:]):
                delta = {"type": "input_json_delta", "partial_json": piece}
                events.append(event("content_block_delta", {"index": index, "delta": delta}))
        events.append(event("content_block_stop", {"index": index}))
    stop = "end_turn" if isinstance(step, str) else "tool_use"
    events.append(
        event(
            "message_delta",
            {"delta": {"stop_reason": stop}, "usage": {"output_tokens": USAGE["output"]}},
        )
    )
    events.append(event("message_stop", {}))
    return events


def scripted_server(render: Callable[[Step], Reply | Any]) -> HttpServer:
    replies = iter(SCRIPT)

    def answer(request: RecordedRequest) -> Any:
        return render(next(replies))

    return HttpServer(default=answer)


RENDERERS: dict[str, tuple[str, Callable[[Step], Any]]] = {
    "openai": ("openai", lambda step: reply_json(openai_body(step))),
    "openai-stream": ("openai", lambda step: sse(openai_stream(step))),
    "anthropic": ("anthropic", lambda step: reply_json(anthropic_body(step))),
    "anthropic-stream": ("anthropic", lambda step: sse(anthropic_stream(step))),
}


def agent_for(model: LlmClient) -> Agent:
    return Agent(model, tools=[get_weather, local_time], system_prompt="Answer briefly.")


def scripted_turns() -> ScriptedModel:
    replies: list[Any] = []
    for step in SCRIPT:
        if isinstance(step, str):
            replies.append(step)
        else:
            replies.append([tool_call(n, a, id=i) for i, n, a in step])
    return ScriptedModel(replies)


def comparable(turn: AgentTurn) -> tuple[Any, list[dict[str, Any]]]:
    return turn.outcome.model_dump(), [m.model_dump(mode="json") for m in turn.messages]


async def test_every_path_gives_the_same_run() -> None:
    reference = await agent_for(scripted_turns()).run("Weather in Oslo and Bergen?")
    assert isinstance(reference.outcome, Completed)
    assert reference.outcome.steps_used == 2
    assert reference.outcome.usage.input_tokens == 30

    for name, (wire, render) in RENDERERS.items():
        async with scripted_server(render) as server:
            transport = httpx.AsyncHTTPTransport(retries=0)
            model: LlmClient
            if wire == "openai":
                model = OpenAICompatibleClient(
                    model="m", base_url=server.url, retry=RetryPolicy.never(), transport=transport
                )
            else:
                model = AnthropicClient(
                    model="m", base_url=server.url, retry=RetryPolicy.never(), transport=transport
                )
            try:
                turn = await agent_for(model).run(
                    "Weather in Oslo and Bergen?",
                    options=RunOptions(stream=name.endswith("stream")),
                )
            finally:
                await model.aclose()
        assert comparable(turn) == comparable(reference), name
        assert len(server.requests) == 3, name
        # one kept-alive connection for the whole run, streamed or not
        assert len({r.connection for r in server.requests}) == 1, name
        last = server.requests[-1].json()
        sent = json.dumps(last)
        assert "rainy" in sent, name  # the tool results reached the model
        assert "12:00" in sent, name
        if wire == "anthropic":
            assert last["system"][0]["text"] == "Answer briefly."
        else:
            assert last["messages"][0] == {"role": "system", "content": "Answer briefly."}


@pytest.mark.parametrize("name", ["openai-stream", "anthropic-stream"])
async def test_streamed_runs_emit_text_as_it_arrives(name: str) -> None:
    wire, render = RENDERERS[name]
    async with scripted_server(render) as server:
        model: LlmClient = (
            OpenAICompatibleClient(model="m", base_url=server.url)
            if wire == "openai"
            else AnthropicClient(model="m", base_url=server.url)
        )
        try:
            events = [e async for e in agent_for(model).stream("Weather?")]
        finally:
            await model.aclose()
    deltas = [e.text for e in events if e.type == "text_delta"]  # type: ignore[union-attr]
    assert len(deltas) == 2
    assert "".join(deltas) == SCRIPT[-1]
    assert events[-1].type == "run_end"
