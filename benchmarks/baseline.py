"""The baselines: the smallest correct hand-written agent loop, on httpx and on raw asyncio.

Post the conversation, parse the tool calls, run the tool, append the call and its result,
repeat until the model answers with text; both wires, whole replies or streamed ones. The loop
is written once and sends through an :class:`Http`:

* :class:`HttpxHttp`, one shared ``httpx.AsyncClient`` (httpx's own transport unless given
  another): **the hand loop**, what a developer writes with httpx;
* :class:`RawHttp`, HTTP/1.1 written by hand on asyncio streams, kept-alive connections and
  ``Content-Length`` bodies and nothing else (what the model server sends): **the floor loop**,
  the least an asyncio client can do for the same conversation;
* :class:`AiohttpHttp`, one ``aiohttp.ClientSession``: **the aiohttp floor**, the least a
  client on the library's default engine can do (it tells the engine's cost from the
  library's).

Both encode the whole conversation for every request (``json.dumps``, as a hand loop does) and
decode the answer with ``json.loads``; the tool is the same sync function. This is what the
benchmarks compare ``Agent`` to, in the same run.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

import httpx

__all__ = [
    "ANTHROPIC_TOOLS",
    "OPENAI_TOOLS",
    "SYSTEM",
    "AiohttpHttp",
    "Http",
    "HttpxHttp",
    "RawHttp",
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

Tool = Callable[[dict[str, Any]], dict[str, Any]]


def lookup(arguments: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's tool."""
    return {"value": arguments["i"]}


class Http(Protocol):
    """How a loop posts a JSON body: for the whole answer, or for the lines of a stream."""

    async def post_json(self, url: str, body: dict[str, Any]) -> Any: ...

    def post_lines(self, url: str, body: dict[str, Any]) -> AsyncIterator[str]: ...

    async def aclose(self) -> None: ...


def new_client(transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    """The one shared client (plain httpx defaults unless a transport is given)."""
    return httpx.AsyncClient(
        timeout=60.0, headers={"anthropic-version": "2023-06-01"}, transport=transport
    )


class HttpxHttp:
    """Posts through one ``httpx.AsyncClient``: ``client.post(url, json=body)``."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.client = new_client(transport)

    async def post_json(self, url: str, body: dict[str, Any]) -> Any:
        response = await self.client.post(url, json=body)
        response.raise_for_status()
        return response.json()

    async def post_lines(self, url: str, body: dict[str, Any]) -> AsyncIterator[str]:
        async with self.client.stream("POST", url, json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                yield line

    async def aclose(self) -> None:
        await self.client.aclose()


class RawHttp:
    """HTTP/1.1 by hand on asyncio streams: a request's bytes written at once, the answer read
    by its ``Content-Length``; idle connections kept for the next request (as many as there
    are requests in flight). No chunked bodies, no redirects, no TLS: the floor, not a client.
    """

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self._prefix = f"{parts.scheme}://{parts.netloc}"
        self._head = (
            f"host: {parts.netloc}\r\ncontent-type: application/json\r\n"
            "anthropic-version: 2023-06-01\r\ncontent-length: "
        ).encode()
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def _post(self, url: str, body: dict[str, Any]) -> bytes:
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        path = url.removeprefix(self._prefix)
        if self._idle:
            reader, writer = self._idle.pop()
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        writer.write(
            b"POST %s HTTP/1.1\r\n%s%d\r\n\r\n%s" % (path.encode(), self._head, len(data), data)
        )
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"the model server answered {head[:40]!r}")
        at = head.lower().find(b"content-length: ")
        answer = await reader.readexactly(int(head[at + 16 : head.find(b"\r\n", at)]))
        self._idle.append((reader, writer))
        return answer

    async def post_json(self, url: str, body: dict[str, Any]) -> Any:
        return json.loads(await self._post(url, body))

    async def post_lines(self, url: str, body: dict[str, Any]) -> AsyncIterator[str]:
        for line in (await self._post(url, body)).decode().split("\n"):
            yield line

    async def aclose(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


class AiohttpHttp:
    """Posts through one ``aiohttp.ClientSession`` (no httpx): the hand loop's work on the
    library's default engine, the least a client built on aiohttp does for the conversation."""

    def __init__(self, max_connections: int = 1000) -> None:
        self.max_connections = max_connections
        self._session: Any = None

    def _client(self) -> Any:
        if self._session is None:  # made inside the event loop that uses it
            import aiohttp

            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections),
                cookie_jar=aiohttp.DummyCookieJar(),
                headers={"anthropic-version": "2023-06-01"},
            )
        return self._session

    async def _post(self, url: str, body: dict[str, Any]) -> bytes:
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        headers = {"content-type": "application/json"}
        async with self._client().post(url, data=data, headers=headers) as response:
            response.raise_for_status()
            answer: bytes = await response.read()
        return answer

    async def post_json(self, url: str, body: dict[str, Any]) -> Any:
        return json.loads(await self._post(url, body))

    async def post_lines(self, url: str, body: dict[str, Any]) -> AsyncIterator[str]:
        for line in (await self._post(url, body)).decode().split("\n"):
            yield line

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


async def openai_loop(
    http: Http, base_url: str, prompt: str, *, stream: bool = False, tool: Tool = lookup
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
            message = await _openai_streamed(http, url, body)
        else:
            message = (await http.post_json(url, body))["choices"][0]["message"]
        messages.append(message)
        calls = message.get("tool_calls")
        if not calls:
            return rounds
        for call in calls:
            result = tool(json.loads(call["function"]["arguments"]))
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}
            )
        rounds += 1


async def _openai_streamed(http: Http, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """The assistant message the chunks of a streamed reply add up to."""
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    async for line in http.post_lines(url, body):
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
    http: Http, base_url: str, prompt: str, *, stream: bool = False, tool: Tool = lookup
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
            content = await _anthropic_streamed(http, url, body)
        else:
            content = (await http.post_json(url, body))["content"]
        messages.append({"role": "assistant", "content": content})
        uses = [block for block in content if block["type"] == "tool_use"]
        if not uses:
            return rounds
        results = [
            {
                "type": "tool_result",
                "tool_use_id": block["id"],
                "content": json.dumps(tool(block["input"])),
            }
            for block in uses
        ]
        messages.append({"role": "user", "content": results})
        rounds += 1


async def _anthropic_streamed(http: Http, url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The content blocks the events of a streamed reply add up to."""
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, list[str]] = {}
    async for line in http.post_lines(url, body):
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
