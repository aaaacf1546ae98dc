"""The baseline: the smallest correct hand-written agent loop on one shared httpx.AsyncClient.

Post the conversation, parse the tool calls, run the tool, append the call and its result,
repeat until the model answers with text. Both wires, whole replies or streamed ones. This is
what the benchmarks compare ``Agent`` to: the physical limit of an httpx loop in Python.
"""

from __future__ import annotations

import json
from typing import Any, Final

import httpx

__all__ = [
    "ANTHROPIC_TOOLS",
    "OPENAI_TOOLS",
    "SYSTEM",
    "anthropic_loop",
    "lookup",
    "new_client",
    "openai_loop",
]

SYSTEM: Final = "You look numbers up."
SCHEMA: Final = {"type": "object", "properties": {"i": {"type": "integer"}}, "required": ["i"]}
OPENAI_TOOLS: Final = [
    {
        "type": "function",
        "function": {"name": "lookup", "description": "Looks a number up.", "parameters": SCHEMA},
    }
]
ANTHROPIC_TOOLS: Final = [
    {"name": "lookup", "description": "Looks a number up.", "input_schema": SCHEMA}
]
MAX_TOKENS: Final = 1024


def lookup(arguments: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's tool."""
    return {"value": arguments["i"]}


def new_client(transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    """The one shared client (plain httpx defaults unless a transport is given)."""
    return httpx.AsyncClient(
        timeout=60.0, headers={"anthropic-version": "2023-06-01"}, transport=transport
    )


async def openai_loop(
    client: httpx.AsyncClient, base_url: str, prompt: str, *, stream: bool = False
) -> int:
    """Run one conversation on the OpenAI-compatible wire; the tool rounds it took."""
    url = base_url + "/v1/chat/completions"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": prompt},
    ]
    rounds = 0
    while True:
        body: dict[str, Any] = {
            "model": "bench-model",
            "messages": messages,
            "tools": OPENAI_TOOLS,
            "max_tokens": MAX_TOKENS,
        }
        if stream:
            body["stream"] = True
            message = await _openai_streamed(client, url, body)
        else:
            response = await client.post(url, json=body)
            response.raise_for_status()
            message = response.json()["choices"][0]["message"]
        messages.append(message)
        calls = message.get("tool_calls")
        if not calls:
            return rounds
        for call in calls:
            result = lookup(json.loads(call["function"]["arguments"]))
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}
            )
        rounds += 1


async def _openai_streamed(
    client: httpx.AsyncClient, url: str, body: dict[str, Any]
) -> dict[str, Any]:
    """The assistant message the chunks of a streamed reply add up to."""
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    async with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    text.append(delta["content"])
                for part in delta.get("tool_calls") or ():
                    call = calls.setdefault(
                        part["index"],
                        {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                    )
                    call["id"] = part.get("id") or call["id"]
                    function = part.get("function") or {}
                    call["function"]["name"] += function.get("name") or ""
                    call["function"]["arguments"] += function.get("arguments") or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    return message


async def anthropic_loop(
    client: httpx.AsyncClient, base_url: str, prompt: str, *, stream: bool = False
) -> int:
    """Run one conversation on Anthropic's wire; the tool rounds it took."""
    url = base_url + "/v1/messages"
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    rounds = 0
    while True:
        body: dict[str, Any] = {
            "model": "bench-model",
            "max_tokens": MAX_TOKENS,
            "system": SYSTEM,
            "messages": messages,
            "tools": ANTHROPIC_TOOLS,
        }
        if stream:
            body["stream"] = True
            content = await _anthropic_streamed(client, url, body)
        else:
            response = await client.post(url, json=body)
            response.raise_for_status()
            content = response.json()["content"]
        messages.append({"role": "assistant", "content": content})
        uses = [block for block in content if block["type"] == "tool_use"]
        if not uses:
            return rounds
        results = [
            {
                "type": "tool_result",
                "tool_use_id": block["id"],
                "content": json.dumps(lookup(block["input"])),
            }
            for block in uses
        ]
        messages.append({"role": "user", "content": results})
        rounds += 1


async def _anthropic_streamed(
    client: httpx.AsyncClient, url: str, body: dict[str, Any]
) -> list[dict[str, Any]]:
    """The content blocks the events of a streamed reply add up to."""
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, list[str]] = {}
    async with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            kind = event["type"]
            if kind == "content_block_start":
                blocks[event["index"]] = dict(event["content_block"])
                partial[event["index"]] = []
            elif kind == "content_block_delta":
                delta = event["delta"]
                if delta["type"] == "text_delta":
                    blocks[event["index"]]["text"] += delta["text"]
                elif delta["type"] == "input_json_delta":
                    partial[event["index"]].append(delta["partial_json"])
    for index, block in blocks.items():
        if block["type"] == "tool_use" and partial[index]:
            block["input"] = json.loads("".join(partial[index]))
    return [blocks[index] for index in sorted(blocks)]
