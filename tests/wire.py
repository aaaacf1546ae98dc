"""Recorded provider traffic in ``tests/fixtures/wire`` (its README names each source).

Besides loading the recordings: :func:`replay` answers a client's requests with them, and a
small reference of each streaming protocol, written apart from the clients from the providers'
documentation, turns a recorded stream into the whole body it adds up to
(:func:`anthropic_folded`, :func:`openai_folded`) and a whole body into the stream a server
sends for it (:func:`anthropic_stream`, :func:`openai_stream`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import httpx

from agent_plugin.providers.base import (
    ChatRequest,
    ChatResponse,
    LlmClient,
    StreamDone,
    StreamEvent,
)

WIRE_DIR = Path(__file__).resolve().parent / "fixtures" / "wire"

Handler = Callable[[httpx.Request], httpx.Response]


def fixture_names(provider: str | None = None) -> list[str]:
    """File names (without ``.json``) of every fixture, or of one provider's."""
    names = sorted(p.stem for p in WIRE_DIR.glob("*.json"))
    if provider is not None:
        names = [n for n in names if n.startswith(provider + "__")]
    return names


@cache
def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((WIRE_DIR / f"{name}.json").read_text())
    return data


def sse_body(fixture: dict[str, Any]) -> bytes:
    """The recorded streaming body, byte for byte where the source kept it."""
    response = fixture["response"]
    if "sse" in response:
        return "\n".join(response["sse"]).encode()
    # fixture-file streams kept only each event's data payload
    return "".join(f"data: {payload}\n\n" for payload in response["sse_data"]).encode()


def is_stream(fixture: dict[str, Any]) -> bool:
    return "sse" in fixture["response"] or "sse_data" in fixture["response"]


def response_bytes(fixture: dict[str, Any]) -> bytes:
    """The recorded response body as it came over the wire (as near as the source kept it)."""
    response = fixture["response"]
    if is_stream(fixture):
        return sse_body(fixture)
    if response.get("body_raw") is not None:
        return str(response["body_raw"]).encode()
    return json.dumps(response["body"]).encode()


def answer(fixture: dict[str, Any], content: bytes | None = None) -> httpx.Response:
    """The recorded status, headers and body (or ``content`` instead of the body)."""
    response = fixture["response"]
    body = response_bytes(fixture) if content is None else content
    return httpx.Response(response["status"], headers=response["headers"], content=body)


def replay(
    *answers: dict[str, Any] | httpx.Response, sent: list[httpx.Request] | None = None
) -> Handler:
    """A transport handler answering the n-th request with the n-th recording (or response);
    a request beyond them fails the test. ``sent`` collects the requests."""
    queue = list(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        if sent is not None:
            sent.append(request)
        assert queue, f"unexpected request {request.method} {request.url}"
        item = queue.pop(0)
        return item if isinstance(item, httpx.Response) else answer(item)

    return handler


def data_payloads(body: bytes) -> Iterator[dict[str, Any] | str]:
    """The ``data:`` payloads of an SSE body, one per event (JSON decoded where it is JSON)."""
    for event in body.decode().replace("\r\n", "\n").split("\n\n"):
        lines = [
            line[5:].removeprefix(" ") for line in event.split("\n") if line.startswith("data:")
        ]
        if not lines:
            continue
        text = "\n".join(lines)
        try:
            yield json.loads(text)
        except ValueError:
            yield text


def sse(payloads: list[dict[str, Any] | str], *, named: bool = False) -> bytes:
    """An SSE body of ``payloads`` (with ``event:`` lines named after each type when ``named``)."""
    out = []
    for payload in payloads:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        if named and isinstance(payload, dict):
            out.append(f"event: {payload['type']}\n")
        out.append(f"data: {data}\n\n")
    return "".join(out).encode()


# --- Anthropic: https://docs.anthropic.com/en/docs/build-with-claude/streaming ----------------

_TOOL_LIKE = ("tool_use", "server_tool_use")


def anthropic_folded(body: bytes) -> dict[str, Any]:
    """The ``/v1/messages`` body a recorded stream adds up to (its error, if it has one)."""
    message: dict[str, Any] = {}
    usage: dict[str, Any] = {}
    blocks: dict[int, dict[str, Any]] = {}
    inputs: dict[int, str] = {}
    for payload in data_payloads(body):
        assert isinstance(payload, dict), payload
        kind = payload["type"]
        if kind == "message_start":
            message = copy.deepcopy(payload["message"])
            usage = dict(message.get("usage") or {})
        elif kind == "content_block_start":
            blocks[payload["index"]] = copy.deepcopy(payload["content_block"])
        elif kind == "content_block_delta":
            block, delta = blocks[payload["index"]], payload["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = (block.get("signature") or "") + delta["signature"]
            elif delta["type"] == "input_json_delta":
                inputs[payload["index"]] = inputs.get(payload["index"], "") + delta["partial_json"]
            elif delta["type"] == "citations_delta":
                block.setdefault("citations", []).append(delta["citation"])
        elif kind == "message_delta":
            message.update(payload.get("delta") or {})
            usage.update({k: v for k, v in (payload.get("usage") or {}).items() if v is not None})
        elif kind == "message_stop":
            break
        elif kind == "error":  # what a whole answer says instead
            return payload
    for index, text in inputs.items():
        if text.strip():
            blocks[index]["input"] = json.loads(text)
    message["content"] = [blocks[index] for index in sorted(blocks)]
    message["usage"] = usage
    return message


def anthropic_stream(body: dict[str, Any]) -> bytes:
    """The event stream Anthropic sends for a whole ``/v1/messages`` body."""
    head = {k: v for k, v in body.items() if k not in ("content", "usage", "stop_reason")}
    usage = body.get("usage") or {}
    start_usage = {k: v for k, v in usage.items() if k != "output_tokens"} | {"output_tokens": 1}
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {**head, "content": [], "stop_reason": None, "usage": start_usage},
        }
    ]
    for index, block in enumerate(body["content"]):
        kind, deltas = block["type"], []
        if kind == "text":
            start = {"type": "text", "text": ""}
            if block["text"]:
                deltas.append({"type": "text_delta", "text": block["text"]})
            for citation in block.get("citations") or []:
                deltas.append({"type": "citations_delta", "citation": citation})
        elif kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas.append({"type": "thinking_delta", "thinking": block["thinking"]})
            if block.get("signature"):
                deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif kind in _TOOL_LIKE:
            start = {**block, "input": {}}
            if block.get("input"):
                deltas.append(
                    {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                )
        else:
            start = block
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    delta = {"stop_reason": body.get("stop_reason"), "stop_sequence": body.get("stop_sequence")}
    if "container" in body:
        delta["container"] = body["container"]
    events.append({"type": "message_delta", "delta": delta, "usage": usage})
    events.append({"type": "message_stop"})
    return sse(events, named=True)


# --- OpenAI chat completions: https://platform.openai.com/docs/api-reference/chat-streaming ---


def openai_folded(body: bytes) -> dict[str, Any]:
    """The chat-completions body a recorded stream adds up to (choice 0, merged naively).

    Reasoning goes under ``reasoning`` here whatever the stream called it, so both of the
    parser's reasoning fields are exercised; an error chunk makes the body an error body.
    """
    text = refusal = reasoning = ""
    calls: dict[int, dict[str, Any]] = {}
    finish = usage = chunk_id = model = error = None
    for chunk in data_payloads(body):
        if chunk == "[DONE]":
            break
        assert isinstance(chunk, dict), chunk
        if chunk.get("error"):
            error = chunk["error"]
            break
        chunk_id = chunk_id if chunk_id is not None else chunk.get("id")
        model = model or chunk.get("model")
        usage = chunk.get("usage") or (chunk.get("x_groq") or {}).get("usage") or usage
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content")
            for part in content if isinstance(content, list) else []:  # Mistral content parts
                if part.get("type") == "thinking":
                    reasoning += "".join(t["text"] for t in part["thinking"])
                elif part.get("type") == "text":
                    text += part["text"]
            text += content if isinstance(content, str) else ""
            refusal += delta.get("refusal") or ""
            reasoning += delta.get("reasoning_content") or delta.get("reasoning") or ""
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(call["index"], {"id": None, "name": None, "args": ""})
                slot["id"] = slot["id"] if slot["id"] is not None else call.get("id")
                slot["name"] = slot["name"] or call.get("function", {}).get("name")
                slot["args"] += call.get("function", {}).get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if refusal:
        message["refusal"] = refusal
    if reasoning:
        message["reasoning"] = reasoning
    if calls:
        message["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["args"]},
            }
            for _, c in sorted(calls.items())
        ]
    folded: dict[str, Any] = {
        "id": chunk_id,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }
    if error is not None:
        folded["error"] = error
    return folded


def openai_stream(body: dict[str, Any]) -> bytes:
    """The chunks an OpenAI-compatible server streams for a whole body (choice 0), then the
    usage chunk and ``[DONE]``."""
    choice = body["choices"][0]
    message = choice["message"]
    head = {"id": body.get("id"), "model": body.get("model"), "object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks: list[dict[str, Any] | str] = [chunk({"role": "assistant"})]
    for key in ("reasoning_content", "reasoning"):
        if isinstance(message.get(key), str) and message[key]:
            chunks.append(chunk({key: message[key]}))
            break
    content = message.get("content")
    if isinstance(content, list):
        chunks += [chunk({"content": [part]}) for part in content]
    elif content:
        chunks.append(chunk({"content": content}))
    if message.get("refusal"):
        chunks.append(chunk({"refusal": message["refusal"]}))
    for index, call in enumerate(message.get("tool_calls") or []):
        chunks.append(chunk({"tool_calls": [{"index": index, **call}]}))
    if message.get("function_call") and not message.get("tool_calls"):
        chunks.append(chunk({"function_call": message["function_call"]}))
    chunks.append(chunk({}, choice.get("finish_reason")))
    if body.get("usage") is not None:
        chunks.append({**head, "choices": [], "usage": body["usage"]})
    chunks.append("[DONE]")
    return sse(chunks)


# --- talking to a client ------------------------------------------------------------------

PAUSED_TURNS: dict[str, str] = {
    "anthropic__pause_turn_web_search__pydantic-ai": (
        "anthropic__pause_turn_continuation__pydantic-ai"
    ),
    "anthropic__stream_pause_turn_web_search__pydantic-ai": (
        "anthropic__stream_pause_turn_continuation__pydantic-ai"
    ),
}
"""A paused turn's recording -> the recording of the request that continued it."""


async def collect(client: LlmClient, request: ChatRequest) -> list[StreamEvent]:
    """Every event of ``client.stream(request)``."""
    return [event async for event in client.stream(request)]


def done(events: list[StreamEvent]) -> ChatResponse:
    """The reply of a finished stream: its one :class:`StreamDone`, which comes last."""
    assert sum(isinstance(e, StreamDone) for e in events) == 1
    last = events[-1]
    assert isinstance(last, StreamDone)
    return last.response
