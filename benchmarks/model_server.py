"""A scripted model server on 127.0.0.1 for the benchmarks: both wires, streaming and not.

It speaks the OpenAI-compatible wire (``POST /v1/chat/completions`` and ``/chat/completions``)
and Anthropic's (``POST /v1/messages``), with ``"stream": true`` or without. What it answers is
scripted by the request itself: the first user message carries a script such as
``STEPS=200 PARALLEL=2 LATENCY_MS=50``, and the server answers with ``PARALLEL`` calls to the
``lookup`` tool (arguments ``{"i": n}``, n counting up) until the conversation holds ``STEPS``
tool rounds, then with a final text. ``LATENCY_MS`` delays every answer.

The server keeps no state per conversation: the ids of the calls it makes are
``call_<round>_<k>``, so the last such id in a request tells how many rounds are done. It reads a
request with a handful of byte searches (no JSON parsing), so its cost per request stays small
and flat however long the conversation grows: ``GET /stats`` returns its own CPU time and
request count, which the suite reads around every measurement to show it is never the
bottleneck. ``GET /v1/models`` and ``/models`` list one model.

Plain asyncio streams, HTTP/1.1 keep-alive. Run it in its own process::

    python benchmarks/model_server.py --port 0 --cpu 1   # prints "PORT <n>", serves until killed

or from Python with :class:`ServerProcess`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import http.client
import json
import os
import re
import resource
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = ["Script", "ServerProcess", "ServerStats", "answer", "parse_script", "serve"]

MODEL: Final = "bench-model"
TOOL: Final = "lookup"

_SCRIPT_MARK: Final = b"STEPS="
_SCRIPT: Final = re.compile(rb"(STEPS|PARALLEL|LATENCY_MS)=(\d+)")
_CALL_ID: Final = re.compile(rb"call_(\d+)_")
_USAGE_OPENAI: Final = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
_USAGE_ANTHROPIC: Final = {"input_tokens": 10, "output_tokens": 5}


@dataclass(frozen=True, slots=True)
class Script:
    """What a conversation asked for: tool rounds, calls per round, latency per answer."""

    steps: int = 1
    parallel: int = 1
    latency_ms: int = 0


_scripts: dict[bytes, Script] = {}


def parse_script(body: bytes) -> Script:
    """The script in a request body (defaults when it has none). Cached by its text."""
    start = body.find(_SCRIPT_MARK)
    if start < 0:
        return Script()
    window = body[start : start + 80]
    script = _scripts.get(window)
    if script is None:
        values = {key.decode(): int(value) for key, value in _SCRIPT.findall(window)}
        script = Script(
            steps=values.get("STEPS", 1),
            parallel=max(1, values.get("PARALLEL", 1)),
            latency_ms=values.get("LATENCY_MS", 0),
        )
        if len(_scripts) < 1024:
            _scripts[window] = script
    return script


def rounds_done(body: bytes) -> int:
    """How many tool rounds the conversation holds: one more than the last call id's round."""
    end = body.rfind(b"call_")
    if end < 0:
        return 0
    match = _CALL_ID.match(body, end)
    return int(match.group(1)) + 1 if match else 0


def is_stream(body: bytes) -> bool:
    """Whether the body asks for a stream. Only its first and last few hundred bytes are read:
    clients put ``stream`` before or after the conversation, never inside it."""
    for part in (body[:512], body[-2048:]):
        at = part.rfind(b'"stream"')
        if at >= 0:
            return part[at + 8 : at + 16].lstrip(b" :").startswith(b"true")
    return False


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def _calls(round_: int, parallel: int) -> list[tuple[str, str]]:
    """``(id, arguments JSON)`` of the calls of round ``round_``."""
    return [(f"call_{round_}_{k}", f'{{"i":{round_ * parallel + k}}}') for k in range(parallel)]


def _final_text(round_: int) -> str:
    return f"done after {round_} rounds"


# --- OpenAI-compatible ---------------------------------------------------------------------


def openai_body(round_: int, script: Script) -> bytes:
    if round_ < script.steps:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": TOOL, "arguments": args}}
                for cid, args in _calls(round_, script.parallel)
            ],
        }
        finish = "tool_calls"
    else:
        message = {"role": "assistant", "content": _final_text(round_)}
        finish = "stop"
    return _dumps(
        {
            "id": f"chatcmpl-{round_}",
            "object": "chat.completion",
            "created": 0,
            "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": _USAGE_OPENAI,
        }
    ).encode()


def openai_stream(round_: int, script: Script) -> bytes:
    head = (
        f'{{"id":"chatcmpl-{round_}","object":"chat.completion.chunk","created":0,'
        f'"model":"{MODEL}","choices":'
    )
    role = '[{"index":0,"delta":{"role":"assistant","content":null},"finish_reason":null}]}'
    chunks = [head + role]
    if round_ < script.steps:
        for k, (cid, args) in enumerate(_calls(round_, script.parallel)):
            start = {
                "index": k,
                "id": cid,
                "type": "function",
                "function": {"name": TOOL, "arguments": ""},
            }
            more = {"index": k, "function": {"arguments": args}}
            for call in (start, more):
                delta = _dumps({"tool_calls": [call]})
                chunks.append(head + f'[{{"index":0,"delta":{delta},"finish_reason":null}}]}}')
        finish = "tool_calls"
    else:
        delta = _dumps({"content": _final_text(round_)})
        chunks.append(head + f'[{{"index":0,"delta":{delta},"finish_reason":null}}]}}')
        finish = "stop"
    chunks.append(head + f'[{{"index":0,"delta":{{}},"finish_reason":"{finish}"}}]}}')
    chunks.append(head + f'[],"usage":{_dumps(_USAGE_OPENAI)}}}')
    chunks.append("[DONE]")
    return "".join(f"data: {chunk}\n\n" for chunk in chunks).encode()


# --- Anthropic -----------------------------------------------------------------------------


def anthropic_body(round_: int, script: Script) -> bytes:
    blocks: list[dict[str, Any]]
    if round_ < script.steps:
        blocks = [
            {"type": "tool_use", "id": cid, "name": TOOL, "input": json.loads(args)}
            for cid, args in _calls(round_, script.parallel)
        ]
        stop = "tool_use"
    else:
        blocks = [{"type": "text", "text": _final_text(round_)}]
        stop = "end_turn"
    return _dumps(
        {
            "id": f"msg_{round_}",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": blocks,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": _USAGE_ANTHROPIC,
        }
    ).encode()


def anthropic_stream(round_: int, script: Script) -> bytes:
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": f"msg_{round_}",
                    "type": "message",
                    "role": "assistant",
                    "model": MODEL,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 10, "output_tokens": 1},
                },
            },
        )
    ]
    if round_ < script.steps:
        for k, (cid, args) in enumerate(_calls(round_, script.parallel)):
            block = {"type": "tool_use", "id": cid, "name": TOOL, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": args}
            events += [
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": k, "content_block": block},
                ),
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": k, "delta": delta},
                ),
                ("content_block_stop", {"type": "content_block_stop", "index": k}),
            ]
        stop = "tool_use"
    else:
        block = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": _final_text(round_)}
        events += [
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": block},
            ),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ]
        stop = "end_turn"
    events += [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 5},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return "".join(f"event: {name}\ndata: {_dumps(data)}\n\n" for name, data in events).encode()


# --- HTTP ----------------------------------------------------------------------------------

_BUILDERS: Final = {
    (False, False): openai_body,
    (False, True): openai_stream,
    (True, False): anthropic_body,
    (True, True): anthropic_stream,
}


@functools.lru_cache(maxsize=1 << 16)
def _answer(anthropic: bool, stream: bool, round_: int, script: Script) -> bytes:
    content_type = b"text/event-stream" if stream else b"application/json"
    return _response(b"200 OK", content_type, _BUILDERS[anthropic, stream](round_, script))


def answer(path: bytes, body: bytes) -> tuple[Script, bytes]:
    """The script of a POST of ``body`` to a chat ``path``, and the whole HTTP response to it.

    Responses are built once per (wire, streaming, round, script) and then reused.
    """
    script = parse_script(body)
    return script, _answer(path.endswith(b"/messages"), is_stream(body), rounds_done(body), script)


def _response(status: bytes, content_type: bytes, body: bytes) -> bytes:
    return b"".join(
        [
            b"HTTP/1.1 ",
            status,
            b"\r\ncontent-type: ",
            content_type,
            b"\r\ncontent-length: ",
            str(len(body)).encode(),
            b"\r\n\r\n",
            body,
        ]
    )


_MODELS: Final = _response(
    b"200 OK", b"application/json", _dumps({"data": [{"id": MODEL}]}).encode()
)
_NOT_FOUND: Final = _response(b"404 Not Found", b"text/plain", b"not found")
_LENGTH_REQUIRED: Final = _response(b"411 Length Required", b"text/plain", b"content-length")
_CHAT_PATHS: Final = frozenset({b"/v1/chat/completions", b"/chat/completions", b"/v1/messages"})


class _Stats:
    requests = 0
    connections = 0
    bytes_in = 0  # request bodies


class _Connection(asyncio.Protocol):
    """One keep-alive connection. Requests are answered in order (clients do not pipeline, but
    a pipelining one is served correctly when latency is zero)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._head: bytes | None = None  # the head of a request whose body is still arriving
        self._length = 0
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        _Stats.connections += 1

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        while True:
            if self._head is None:
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(buffer[: end + 4])
                del buffer[: end + 4]
                at = head.lower().find(b"\r\ncontent-length:")
                if at < 0 and head.startswith(b"POST"):
                    self._write(_LENGTH_REQUIRED, close=True)
                    return
                self._head = head
                self._length = int(head[at + 17 : head.find(b"\r\n", at + 2)]) if at >= 0 else 0
            if len(buffer) < self._length:
                return
            head, self._head = self._head, None
            body = bytes(buffer[: self._length])
            del buffer[: self._length]
            self._request(head, body)

    def _request(self, head: bytes, body: bytes) -> None:
        _Stats.requests += 1
        _Stats.bytes_in += len(body)
        method, path, _ = head[: head.find(b"\r\n")].split(b" ", 2)
        close = b"\r\nconnection: close" in head.lower()
        if method == b"POST" and path in _CHAT_PATHS:
            script, response = answer(path, body)
            if script.latency_ms:
                asyncio.get_running_loop().call_later(
                    script.latency_ms / 1000, self._write, response, close
                )
                return
        elif method == b"GET" and path == b"/stats":
            usage = resource.getrusage(resource.RUSAGE_SELF)  # µs resolution (os.times: 10 ms)
            stats = {
                "user": usage.ru_utime,
                "system": usage.ru_stime,
                "requests": _Stats.requests,
                "connections": _Stats.connections,
                "bytes_in": _Stats.bytes_in,
            }
            response = _response(b"200 OK", b"application/json", _dumps(stats).encode())
        elif method == b"GET" and path in (b"/v1/models", b"/models"):
            response = _MODELS
        else:
            response = _NOT_FOUND
        self._write(response, close)

    def _write(self, response: bytes, close: bool) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.write(response)
        if close:
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


async def serve(host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
    """Start serving; the caller owns the returned server."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(_Connection, host, port, backlog=4096)


async def _main(port: int) -> None:
    server = await serve(port=port)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, os._exit, 0)  # nothing to clean up: leave at once
    async with server:
        await server.serve_forever()


def pin_to(cpu: int | None) -> None:
    """Run this process on one CPU, when the machine has it (Linux only)."""
    if cpu is None or not hasattr(os, "sched_setaffinity"):
        return
    if cpu in os.sched_getaffinity(0):
        os.sched_setaffinity(0, {cpu})


@dataclass(frozen=True, slots=True)
class ServerStats:
    """CPU seconds the server process has used (user and kernel), requests it has served,
    connections it has accepted and request-body bytes it has read."""

    user: float
    system: float
    requests: int
    connections: int
    bytes_in: int

    @property
    def cpu(self) -> float:
        return self.user + self.system


class ServerProcess:
    """The server in a child process (optionally pinned to one CPU); a context manager."""

    def __init__(self, cpu: int | None = None) -> None:
        args = [sys.executable, str(Path(__file__).resolve()), "--port", "0"]
        if cpu is not None:
            args += ["--cpu", str(cpu)]
        self._process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        assert self._process.stdout is not None
        line = self._process.stdout.readline().split()
        if len(line) != 2 or line[0] != "PORT":
            self.close()
            raise RuntimeError(f"the model server did not start: {line!r}")
        self.port = int(line[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def stats(self) -> ServerStats:
        """The server's counters so far (this request and its connection included)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.request("GET", "/stats")
            data = json.loads(connection.getresponse().read())
        finally:
            connection.close()
        return ServerStats(
            float(data["user"]),
            float(data["system"]),
            int(data["requests"]),
            int(data["connections"]),
            int(data["bytes_in"]),
        )

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cpu", type=int, default=None, help="pin the server to this CPU")
    options = parser.parse_args()
    pin_to(options.cpu)
    asyncio.run(_main(options.port))


if __name__ == "__main__":
    main()
