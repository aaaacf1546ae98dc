"""The Anthropic Messages API (``POST /v1/messages``) over plain httpx.

Three pure pieces do the wire translation and are tested against recorded traffic:
:meth:`AnthropicClient.build_body` (neutral request -> JSON body), :func:`parse_response`
(JSON body -> :class:`ChatResponse`) and the stream assembler behind
:meth:`AnthropicClient.stream`, which folds the server-sent events back into the body
:func:`parse_response` reads, so a streamed reply and a whole one come out equal.
:meth:`AnthropicClient.encode_body` is what is sent: the same body as bytes, where each message
(and the tool list) is encoded once per client and reused by every later request.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
from pydantic import ValidationError

from agent_plugin.errors import BODY_LIMIT, AgentError, ErrorKind
from agent_plugin.messages import (
    ChatMessage,
    ContentPart,
    Image,
    ImagePart,
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
    ToolResultPart,
)
from agent_plugin.providers.base import (
    ChatRequest,
    ChatResponse,
    StreamDone,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallArgumentsDelta,
    ToolCallStarted,
    merge_extra_body,
)
from agent_plugin.providers.http import (
    EncodedCache,
    HttpTransport,
    RawJson,
    SseEvent,
    _model_ids,
    dumps,
    encode_json,
    json_text,
    loads,
    require_key,
)
from agent_plugin.providers.retry import RetryPolicy
from agent_plugin.redaction import REDACTED

__all__ = ["ANTHROPIC_VERSION", "DEFAULT_MAX_TOKENS", "AnthropicClient", "parse_response"]

PROVIDER: Final = "anthropic"
ANTHROPIC_VERSION: Final = "2023-06-01"
DEFAULT_MAX_TOKENS: Final = 1024
MESSAGES_PATH: Final = "/v1/messages"
MODELS_PATH: Final = "/v1/models"

_EPHEMERAL: Final[Mapping[str, str]] = {"type": "ephemeral"}

_STOP_REASONS: Final[Mapping[str, StopReason]] = {
    "end_turn": StopReason.END_TURN,
    "tool_use": StopReason.TOOL_USE,
    "max_tokens": StopReason.MAX_TOKENS,
    "stop_sequence": StopReason.STOP_SEQUENCE,
    "refusal": StopReason.REFUSAL,
}

_TOOL_CHOICE: Final[Mapping[str, dict[str, str]]] = {
    "auto": {"type": "auto"},
    "required": {"type": "any"},
    "none": {"type": "none"},
}

# The HTTP status Anthropic documents for each error type; an error reported inside a body or a
# stream is classified as if it had arrived with that status.
_ERROR_STATUS: Final[Mapping[str, int]] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}

# Block types that cannot carry ``cache_control``.
_UNCACHEABLE: Final = frozenset({"thinking", "redacted_thinking"})


class AnthropicClient:
    """An :class:`~agent_plugin.providers.base.LlmClient` for the Anthropic Messages API.

    ``prompt_caching`` (overridable per request) marks three of Anthropic's four cache
    breakpoints: the system text, the last tool definition and the last block of the last
    message [AP-13]. The key goes out in ``x-api-key`` only and never appears in ``repr`` or in an
    error; it is required for ``api.anthropic.com`` (a Config error otherwise), not for other
    base URLs (a proxy, a test server).
    """

    def __init__(
        self,
        *,
        model: str = "claude-sonnet-4-5",
        base_url: str = "https://api.anthropic.com",
        api_key: str | None = None,
        timeout: float = 60.0,
        prompt_caching: bool = True,
        retry: RetryPolicy = RetryPolicy(),  # noqa: B008 - frozen value object
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        require_key(PROVIDER, base_url, api_key)
        self.model = model
        self.prompt_caching = prompt_caching
        self._api_key = api_key or None
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        self._http = HttpTransport(
            PROVIDER,
            base_url,
            headers=headers,
            timeout=timeout,
            retry=retry,
            secret=self._api_key,
            transport=transport,
        )
        # encodings of the frozen messages and tool tuples this client has sent, unmarked; the
        # tool list with its cache marker is kept apart
        self._messages = EncodedCache()
        self._tools = EncodedCache(max_entries=16)
        self._marked_tools = EncodedCache(max_entries=16)

    @property
    def provider_name(self) -> str:
        return PROVIDER

    @property
    def base_url(self) -> str:
        return self._http.base_url

    def __repr__(self) -> str:
        key = repr(REDACTED) if self._api_key else "None"
        return (
            f"AnthropicClient(model={self.model!r}, base_url={self.base_url!r}, "
            f"api_key={key}, prompt_caching={self.prompt_caching!r})"
        )

    async def aclose(self) -> None:
        """Release the connection pool (and the encodings kept for later requests)."""
        for cache in (self._messages, self._tools, self._marked_tools):
            cache.clear()
        await self._http.aclose()

    async def chat(self, request: ChatRequest) -> ChatResponse:
        """Send the request and return the whole reply."""
        data = await self._http.post_json(
            MESSAGES_PATH,
            self.encode_body(request, stream=False),
            deadline=request.deadline,
            on_retry=request.on_retry,
        )
        try:
            return parse_response(data)
        except AgentError as error:
            raise self._http.scrub_error(error) from None

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """Send the request with ``stream: true``; yield deltas, then one :class:`StreamDone`.

        An error event inside the stream raises :class:`AgentError` after the deltas before it;
        a stream that ends without ``message_stop`` raises a Transport error.
        """
        assembler = _StreamAssembler()
        events = self._http.post_sse(
            MESSAGES_PATH,
            self.encode_body(request, stream=True),
            deadline=request.deadline,
            on_retry=request.on_retry,
        )
        try:
            # closing the event generator early releases the connection
            async with contextlib.aclosing(events):
                async for sse in events:
                    for event in assembler.feed(sse):
                        yield event
                    if assembler.finished:
                        break
            response = assembler.response()
        except AgentError as error:
            raise self._http.scrub_error(error) from None
        yield StreamDone(response)

    async def list_models(self) -> list[str]:
        """Ids from ``GET /v1/models``."""
        return _model_ids(await self._http.get_json(MODELS_PATH), PROVIDER)

    def build_body(self, request: ChatRequest, *, stream: bool) -> dict[str, Any]:
        """The JSON body for ``request`` (reference §1.4).

        Unsigned thinking (reasoning from another provider) and empty text parts are left out:
        Anthropic rejects both. ``tool_choice`` is sent only with tools (Anthropic rejects it
        otherwise); ``request.extra_body`` is merged last by :func:`merge_extra_body` (a ``None``
        value removes the key). Never mutates ``request``: every dict that gets a cache marker
        is built here, while tool schemas, tool inputs and extra values are shared with the
        request, not copied.
        """
        caching = self._caching(request)
        messages: list[dict[str, Any]] = [
            {"role": _wire_role(message.role), "content": blocks}
            for message in request.messages
            if message.role is not Role.SYSTEM and (blocks := _blocks(message))
        ]
        tools: list[dict[str, Any]] = [_tool(tool) for tool in request.tools]
        if caching:
            if tools:
                tools[-1]["cache_control"] = dict(_EPHEMERAL)
            if messages:
                _mark_last_block(messages[-1]["content"])
        system = _system_text(request.messages)
        return self._body(request, messages, tools, system, caching=caching, stream=stream)

    def encode_body(self, request: ChatRequest, *, stream: bool) -> bytes:
        """:meth:`build_body`'s body as the JSON bytes that are sent (the same bytes
        ``json.dumps`` would give for it, compact and UTF-8).

        Messages are frozen, so each one is encoded once and its bytes are reused by every later
        request that holds the same object; so is the tool list when it is a tuple (the agent's
        ``ToolRegistry.definitions()``). The last message, which carries the cache marker, the
        options and the new messages are encoded per call. A message's content list must not be
        edited in place once it has been sent: put a new message in its slot instead.
        """
        caching = self._caching(request)
        history = request.messages
        chunks = self._messages.encodings(history, _encoded_message)
        # a system message encodes to nothing (it is sent apart), as does a message without
        # blocks: the system text is found among those few, not by reading every message's role
        system = _system_text([m for m, data in zip(history, chunks, strict=True) if not data])
        if caching:  # the last message sent carries a cache marker: encode it afresh
            for index in range(len(chunks) - 1, -1, -1):
                if chunks[index]:
                    chunks[index] = _encoded_message(history[index], marked=True)
                    break
        messages = RawJson(b"[" + b",".join(filter(None, chunks)) + b"]")
        tools = RawJson(self._encoded_tools(request.tools, caching=caching))
        body = self._body(request, messages, tools, system, caching=caching, stream=stream)
        return encode_json(body)

    def _caching(self, request: ChatRequest) -> bool:
        return self.prompt_caching if request.prompt_caching is None else request.prompt_caching

    def _body(
        self,
        request: ChatRequest,
        messages: object,
        tools: object,
        system: str,
        *,
        caching: bool,
        stream: bool,
    ) -> dict[str, Any]:
        """The body around the given ``messages`` and ``tools`` values, extra_body merged."""
        body: dict[str, Any] = {
            "model": request.model or self.model,
            "max_tokens": request.max_tokens or DEFAULT_MAX_TOKENS,
            "messages": messages,
            "tools": tools,
        }
        if system:
            body["system"] = (
                [{"type": "text", "text": system, "cache_control": dict(_EPHEMERAL)}]
                if caching
                else system
            )
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.stop:
            body["stop_sequences"] = list(request.stop)
        if request.tools and request.tool_choice is not None:
            body["tool_choice"] = dict(
                _TOOL_CHOICE.get(request.tool_choice)
                or {"type": "tool", "name": request.tool_choice}
            )
        if stream:
            body["stream"] = True
        merge_extra_body(body, request.extra_body)
        return body

    def _encoded_tools(self, tools: Sequence[ToolDefinition], *, caching: bool) -> bytes:
        """The ``tools`` array; kept per tuple (a list may change, so it is encoded each time)."""
        cache = self._marked_tools if caching else self._tools
        cacheable = isinstance(tools, tuple)
        data = cache.get(tools) if cacheable else None
        if data is None:
            wire = [_tool(tool) for tool in tools]
            if caching and wire:
                wire[-1]["cache_control"] = dict(_EPHEMERAL)
            data = dumps(wire)
            if cacheable:
                cache.put(tools, data)
        return data


# --- request -------------------------------------------------------------------------------


_SYSTEM: Final = Role.SYSTEM  # a plain name: Role.SYSTEM is a slow lookup in a long loop
_ASSISTANT: Final = Role.ASSISTANT


def _wire_role(role: Role) -> str:
    return "assistant" if role is _ASSISTANT else "user"


def _system_text(messages: list[ChatMessage]) -> str:
    """The text of the system messages among ``messages``, joined with newlines."""
    return "\n".join(
        part.text
        for message in messages
        if message.role is _SYSTEM
        for part in message.content
        if isinstance(part, TextPart)
    )


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}


def _encoded_message(message: ChatMessage, *, marked: bool = False) -> bytes:
    """One message's wire JSON, with the cache marker on its last block when ``marked``;
    empty for a system message (sent apart) and for a message without blocks to send."""
    if message.role is _SYSTEM:
        return b""
    blocks = _blocks(message)
    if not blocks:
        return b""
    if marked:
        _mark_last_block(blocks)
    return dumps({"role": _wire_role(message.role), "content": blocks})


def _blocks(message: ChatMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for part in message.content:
        block = _block(part)
        if block is not None:
            blocks.append(block)
    return blocks


def _block(part: ContentPart) -> dict[str, Any] | None:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text} if part.text else None
    if isinstance(part, ToolCallPart):
        call = part.tool_call
        # Anthropic takes an object only; arguments that were not one (or not JSON) go as {}
        arguments = call.arguments if call.raw_arguments is None else {}
        return {
            "type": "tool_use",
            "id": call.id,
            "name": call.name,
            "input": arguments if isinstance(arguments, dict) else {},
        }
    if isinstance(part, ToolResultPart):
        result = part.tool_result
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": result.tool_call_id,
            "content": result.content,
        }
        if result.is_error:
            block["is_error"] = True
        return block
    if isinstance(part, ImagePart):
        return {"type": "image", "source": _image_source(part.image)}
    if isinstance(part, ThinkingPart):
        thinking = part.thinking
        if thinking.signature is None:
            return None
        return {"type": "thinking", "thinking": thinking.text, "signature": thinking.signature}
    return {"type": "redacted_thinking", "data": part.redacted_thinking.data}


def _image_source(image: Image) -> dict[str, str]:
    if image.url is not None:
        return {"type": "url", "url": image.url}
    if image.data is not None and image.media_type is not None:
        return {"type": "base64", "media_type": image.media_type, "data": image.data}
    raise AgentError.config("an image for Anthropic needs a url, or data with its media_type")


def _mark_last_block(blocks: list[dict[str, Any]]) -> None:
    """Put the cache marker on the last block that may carry one (thinking blocks may not).

    The blocks are the ones :func:`_block` just built, never the caller's objects.
    """
    for block in reversed(blocks):
        if block["type"] not in _UNCACHEABLE:
            block["cache_control"] = dict(_EPHEMERAL)
            return


# --- response ------------------------------------------------------------------------------


def parse_response(data: object) -> ChatResponse:
    """The reply in a ``/v1/messages`` response body.

    Raises only :class:`AgentError`: Decode for a body of the wrong shape, or the classified
    error when the body is Anthropic's ``{"type": "error", ...}`` envelope.
    """
    if not isinstance(data, dict):
        raise _decode("anthropic response is not a JSON object")
    if data.get("type") == "error":
        raise _error_from_payload(data)
    content = data.get("content")
    if not isinstance(content, list):
        raise _decode("anthropic response has no content blocks")
    parts = [part for block in content if (part := _part(block)) is not None]
    return _response(data, parts)


def _part(block: object) -> ContentPart | None:
    if not isinstance(block, dict):
        raise _decode("anthropic content block is not an object")
    kind = block.get("type")
    if kind == "text":
        return TextPart(text=_str(block, "text", ""))
    if kind == "tool_use":
        arguments = block.get("input")
        return _tool_call_part(
            _str(block, "id", ""), _str(block, "name", ""), {} if arguments is None else arguments
        )
    if kind == "thinking":
        return ThinkingPart(
            thinking=Thinking(
                text=_str(block, "thinking", ""), signature=_opt_str(block, "signature")
            )
        )
    if kind == "redacted_thinking":
        return RedactedThinkingPart(
            redacted_thinking=RedactedThinking(data=_str(block, "data", ""))
        )
    return None


def _response(message: Mapping[str, Any], parts: list[ContentPart]) -> ChatResponse:
    raw_stop = _opt_str(message, "stop_reason")
    stop = StopReason.UNKNOWN if raw_stop is None else _STOP_REASONS.get(raw_stop)
    try:
        return ChatResponse(
            content=parts,
            stop_reason=stop or StopReason.UNKNOWN,
            usage=_usage(message.get("usage")),
            model=_opt_str(message, "model"),
            id=_opt_str(message, "id"),
            raw_stop_reason=raw_stop,
        )
    except ValidationError as exc:
        raise _decode(f"anthropic response does not fit the message model: {exc}") from None


def _usage(raw: object) -> TokenUsage:
    """Anthropic's ``input_tokens`` excludes cached tokens; ours is the whole prompt [AP-14]."""
    if raw is None:
        return TokenUsage()
    if not isinstance(raw, dict):
        raise _decode("anthropic usage is not an object")
    fresh = _count(raw, "input_tokens")
    read = _count(raw, "cache_read_input_tokens")
    write = _count(raw, "cache_creation_input_tokens")
    return TokenUsage(
        input_tokens=fresh + read + write,
        output_tokens=_count(raw, "output_tokens"),
        cache_read_tokens=read,
        cache_write_tokens=write,
    )


def _count(raw: Mapping[str, Any], key: str) -> int:
    value = raw.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _decode(f"anthropic usage.{key} is not a token count")
    return value


def _error_from_payload(payload: Mapping[str, Any]) -> AgentError:
    """The error for an ``{"type": "error", "error": {"type", "message"}}`` envelope.

    The client scrubs its key from the error (``HttpTransport.scrub_error``) before raising it.
    """
    error = payload.get("error")
    error_type = error.get("type") if isinstance(error, dict) else None
    detail = error.get("message") if isinstance(error, dict) else None
    status = _ERROR_STATUS.get(error_type) if isinstance(error_type, str) else None
    kind = ErrorKind.PROVIDER if status is None else ErrorKind.from_http_status(status)
    message = f"anthropic reported {error_type if isinstance(error_type, str) else 'an error'}"
    if isinstance(detail, str) and detail:
        message += f": {detail[:BODY_LIMIT]}"
    return AgentError(kind, message, provider=PROVIDER, status=status, body=json_text(payload))


# --- streaming -----------------------------------------------------------------------------


@dataclass(slots=True)
class _Block:
    """One content block as it streams in: its start object plus the deltas so far.

    ``position`` is a tool_use block's place among the reply's tool calls (the ``index`` of its
    stream events), which is not its content-block index.
    """

    start: dict[str, Any]
    position: int = -1
    chunks: list[str] = field(default_factory=list)
    signature: list[str] = field(default_factory=list)

    @property
    def kind(self) -> object:
        return self.start.get("type")

    def to_part(self) -> ContentPart | None:
        if self.kind == "text":
            return TextPart(text=_str(self.start, "text", "") + "".join(self.chunks))
        if self.kind == "thinking":
            signature = _opt_str(self.start, "signature")
            if self.signature:
                signature = (signature or "") + "".join(self.signature)
            thinking = _str(self.start, "thinking", "") + "".join(self.chunks)
            return ThinkingPart(thinking=Thinking(text=thinking, signature=signature))
        if self.kind == "tool_use":
            return self._tool_call_part()
        return _part(self.start)

    def _tool_call_part(self) -> ToolCallPart:
        call_id, name = _str(self.start, "id", ""), _str(self.start, "name", "")
        text = "".join(self.chunks)
        if not text.strip():
            initial = self.start.get("input")
            return _tool_call_part(call_id, name, initial if isinstance(initial, dict) else {})
        try:
            arguments = loads(text, provider=PROVIDER, what="tool_use input")
        except AgentError:  # kept as the model wrote it; the tool round reports it
            return _tool_call_part(call_id, name, {}, raw_arguments=text)
        return _tool_call_part(call_id, name, arguments)


class _StreamAssembler:
    """Folds Anthropic's stream events into deltas for the caller and the final reply."""

    def __init__(self) -> None:
        self._message: dict[str, Any] = {}
        self._usage: dict[str, Any] = {}
        self._blocks: dict[int, _Block] = {}  # by content-block index, in increasing order
        self._tool_calls = 0
        self.finished = False

    def feed(self, sse: SseEvent) -> list[StreamEvent]:
        payload = loads(sse.data, provider=PROVIDER, what="stream event")
        if not isinstance(payload, dict):
            raise _decode("anthropic sent a stream event that is not a JSON object")
        kind = payload.get("type")
        if not isinstance(kind, str):
            kind = sse.event
        if kind == "message_start":
            self._start_message(payload)
        elif kind == "content_block_start":
            return self._start_block(payload)
        elif kind == "content_block_delta":
            return self._delta(payload)
        elif kind == "message_delta":
            self._message_delta(payload)
        elif kind == "message_stop":
            self.finished = True
        elif kind == "error":
            raise _error_from_payload(payload)
        # ping, content_block_stop and event types added later carry nothing we need
        return []

    def response(self) -> ChatResponse:
        if not self.finished:
            raise AgentError(
                ErrorKind.TRANSPORT,
                "anthropic stream ended early (no message_stop)",
                provider=PROVIDER,
            )
        parts = [part for block in self._blocks.values() if (part := block.to_part()) is not None]
        return _response({**self._message, "usage": self._usage}, parts)

    def _start_message(self, payload: Mapping[str, Any]) -> None:
        message = payload.get("message")
        if not isinstance(message, dict):
            raise _decode("anthropic message_start has no message")
        usage = message.get("usage")
        if usage is not None and not isinstance(usage, dict):
            raise _decode("anthropic usage is not an object")
        self._message = message
        self._usage = dict(usage or {})
        _usage(self._usage)  # fail at the event that is wrong, not at the end

    def _start_block(self, payload: Mapping[str, Any]) -> list[StreamEvent]:
        index = _index(payload)
        start = payload.get("content_block")
        if not isinstance(start, dict):
            raise _decode("anthropic content_block_start has no content_block")
        if self._blocks and index <= next(reversed(self._blocks)):
            # blocks start in index order, each once; anything else would scramble the reply
            raise _decode(f"anthropic started block {index} after a block at or above it")
        block = _Block(start)
        self._blocks[index] = block
        if block.kind == "text" and (text := _str(start, "text", "")):
            return [TextDelta(text)]
        if block.kind == "thinking" and (thinking := _str(start, "thinking", "")):
            return [ThinkingDelta(thinking)]
        if block.kind == "tool_use":
            block.position = self._tool_calls
            self._tool_calls += 1
            return [ToolCallStarted(block.position, _str(start, "id", ""), _str(start, "name", ""))]
        return []

    def _delta(self, payload: Mapping[str, Any]) -> list[StreamEvent]:
        index = _index(payload)
        block = self._blocks.get(index)
        if block is None:
            raise _decode(f"anthropic sent a delta for block {index} before its start")
        delta = payload.get("delta")
        if not isinstance(delta, dict):
            raise _decode("anthropic content_block_delta has no delta")
        kind = delta.get("type")
        if kind == "text_delta":
            text = _delta_text(block, delta, "text", "text")
            return [TextDelta(text)] if text else []
        if kind == "thinking_delta":
            text = _delta_text(block, delta, "thinking", "thinking")
            return [ThinkingDelta(text)] if text else []
        if kind == "input_json_delta":
            text = _delta_text(block, delta, "tool_use", "partial_json")
            return [ToolCallArgumentsDelta(block.position, text)] if text else []
        if kind == "signature_delta":
            if block.kind != "thinking":
                raise _decode("anthropic sent a signature_delta outside a thinking block")
            block.signature.append(_str(delta, "signature", ""))
        # citations_delta and delta types added later do not change the reply we keep
        return []

    def _message_delta(self, payload: Mapping[str, Any]) -> None:
        delta = payload.get("delta")
        if delta is not None and not isinstance(delta, dict):
            raise _decode("anthropic message_delta has a delta that is not an object")
        if delta:
            for key in ("stop_reason", "stop_sequence"):
                if key in delta:
                    self._message[key] = delta[key]
        usage = payload.get("usage")
        if usage is None:
            return
        if not isinstance(usage, dict):
            raise _decode("anthropic usage is not an object")
        # Newer servers repeat the input and cache counts here; older ones send only output.
        self._usage.update({key: value for key, value in usage.items() if value is not None})
        _usage(self._usage)


def _delta_text(block: _Block, delta: Mapping[str, Any], block_kind: str, key: str) -> str:
    if block.kind != block_kind:
        raise _decode(f"anthropic sent a {delta.get('type')} inside a {block.kind} block")
    text = delta.get(key)
    if not isinstance(text, str):
        raise _decode(f"anthropic {delta.get('type')} has no {key} text")
    block.chunks.append(text)
    return text


# --- small readers -------------------------------------------------------------------------


def _decode(message: str) -> AgentError:
    return AgentError.decode(message, provider=PROVIDER)


def _tool_call_part(
    call_id: str, name: str, arguments: object, *, raw_arguments: str | None = None
) -> ToolCallPart:
    """A tool-call part; arguments the message model refuses (say, nested too deep) are Decode."""
    try:
        call = ToolCall(id=call_id, name=name, arguments=arguments, raw_arguments=raw_arguments)
    except ValidationError as exc:
        raise _decode(
            f"anthropic tool_use input is not a JSON value: {exc}"[: BODY_LIMIT * 2]
        ) from None
    return ToolCallPart(tool_call=call)


def _index(payload: Mapping[str, Any]) -> int:
    index = payload.get("index")
    if isinstance(index, bool) or not isinstance(index, int):
        raise _decode(f"anthropic {payload.get('type')} has no block index")
    return index


def _str(obj: Mapping[str, Any], key: str, default: str) -> str:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise _decode(f"anthropic field {key!r} is not a string")
    return value


def _opt_str(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise _decode(f"anthropic field {key!r} is not a string")
    return value
