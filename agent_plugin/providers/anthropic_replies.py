"""Reading Anthropic Messages replies: a whole ``/v1/messages`` body, or its event stream.

:func:`parse_response` turns a body into a :class:`ChatResponse`; :class:`StreamAssembler`
folds the server-sent events back into the body :func:`parse_response` reads, so a streamed
reply and a whole one come out equal. Every content block is kept: text, tool use and
thinking as the neutral parts, server-side tool calls and results (web search, code
execution, ...) as :class:`ServerToolCallPart` / :class:`ServerToolResultPart`, and any other
block whole, as a :class:`ProviderBlockPart` with its raw JSON, so a later request of the run
can send the conversation back as the provider wrote it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import ValidationError

from agent_plugin.errors import BODY_LIMIT, AgentError, ErrorKind
from agent_plugin.messages import (
    ContentPart,
    ProviderBlock,
    ProviderBlockPart,
    RedactedThinking,
    RedactedThinkingPart,
    ServerToolCall,
    ServerToolCallPart,
    ServerToolResult,
    ServerToolResultPart,
    StopReason,
    TextPart,
    Thinking,
    ThinkingPart,
    TokenUsage,
    ToolCall,
    ToolCallPart,
)
from agent_plugin.providers.base import (
    ChatResponse,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallArgumentsDelta,
    ToolCallStarted,
)
from agent_plugin.providers.failures import failure_kind, failure_note
from agent_plugin.providers.http import SseEvent, json_text, loads

__all__ = ["PAUSE_TURN", "PROVIDER", "StreamAssembler", "container_of", "parse_response"]

PROVIDER: Final = "anthropic"
PAUSE_TURN: Final = "pause_turn"
"""The stop reason of a turn the server paused (a long server-tool loop); it is continued."""

_STOP_REASONS: Final[Mapping[str, StopReason]] = {
    "end_turn": StopReason.END_TURN,
    "tool_use": StopReason.TOOL_USE,
    "max_tokens": StopReason.MAX_TOKENS,
    "stop_sequence": StopReason.STOP_SEQUENCE,
    "refusal": StopReason.REFUSAL,
}

# The HTTP status Anthropic documents for each error type; an error reported inside a body or a
# stream is classified as if it had arrived with that status.
_ERROR_STATUS: Final[Mapping[str, int]] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}

# Server-side tool result blocks with the documented shape {type, tool_use_id, content}; a
# block of these types with any other key (or a caller other than the model itself) is kept
# whole instead, so nothing of it is lost.
SERVER_RESULTS: Final = frozenset(
    {
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
    }
)
_SERVER_CALL_KEYS: Final = frozenset({"type", "id", "name", "input"})
_SERVER_RESULT_KEYS: Final = frozenset({"type", "tool_use_id", "content"})
_DIRECT: Final[Mapping[str, str]] = {"type": "direct"}


def parse_response(data: object) -> ChatResponse:
    """The reply in a ``/v1/messages`` response body.

    Raises only :class:`AgentError`: Decode for a body of the wrong shape, or the classified
    error when the body is Anthropic's ``{"type": "error", ...}`` envelope.
    """
    if not isinstance(data, dict):
        raise _decode("anthropic response is not a JSON object")
    if data.get("type") == "error":
        raise error_from_payload(data)
    content = data.get("content")
    if not isinstance(content, list):
        raise _decode("anthropic response has no content blocks")
    parts = [part for block in content if (part := _part(block)) is not None]
    return _response(data, parts)


def container_of(message: Mapping[str, Any]) -> str | None:
    """The id of the code-execution container a reply ran in (None: it used none)."""
    container = message.get("container")
    container_id = container.get("id") if isinstance(container, dict) else None
    return container_id if isinstance(container_id, str) else None


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
    if not isinstance(kind, str):
        return None  # nothing could send it back
    try:
        if kind == "server_tool_use" and (plain := _documented(block, _SERVER_CALL_KEYS)):
            arguments = plain.get("input")
            call = ServerToolCall(
                id=_str(plain, "id", ""),
                name=_str(plain, "name", ""),
                arguments={} if arguments is None else arguments,
            )
            return ServerToolCallPart(server_tool_call=call)
        if kind in SERVER_RESULTS and (plain := _documented(block, _SERVER_RESULT_KEYS)):
            result = ServerToolResult(
                tool_call_id=_str(plain, "tool_use_id", ""), type=kind, content=plain.get("content")
            )
            return ServerToolResultPart(server_tool_result=result)
        return ProviderBlockPart(provider_block=ProviderBlock(provider=PROVIDER, data=block))
    except ValidationError as exc:
        raise _decode(f"anthropic {kind} block does not fit the message model: {exc}") from None


def _documented(block: Mapping[str, Any], keys: frozenset[str]) -> dict[str, Any] | None:
    """``block`` without its default ``caller`` (``{"type": "direct"}``: the model called the
    tool itself) when what is left has only the documented ``keys``; else None."""
    if block.get("caller", _DIRECT) != _DIRECT:
        return None
    plain = {key: value for key, value in block.items() if key != "caller"}
    return plain if plain.keys() <= keys else None


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
    """Anthropic's ``input_tokens`` excludes cached tokens; ours is the whole prompt."""
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


def error_from_payload(payload: Mapping[str, Any]) -> AgentError:
    """The error for an ``{"type": "error", "error": {"type", "message"}}`` envelope, of the
    kind its type's status and its message say together.

    The client scrubs its key from the error (``HttpTransport.scrub_error``) before raising it.
    """
    error = payload.get("error")
    error_type = error.get("type") if isinstance(error, dict) else None
    detail = error.get("message") if isinstance(error, dict) else None
    status = _ERROR_STATUS.get(error_type) if isinstance(error_type, str) else None
    kind = failure_kind(status, payload)
    message = f"anthropic reported {error_type if isinstance(error_type, str) else 'an error'}"
    if note := failure_note(kind):
        message += f" ({note})"
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

    @property
    def takes_input(self) -> bool:
        """Whether the block's ``input`` streams as ``input_json_delta`` fragments."""
        return self.kind in ("tool_use", "server_tool_use") or "input" in self.start

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
        if self.chunks:  # a server tool's input, or an unknown block's: the whole JSON
            text = "".join(self.chunks)
            arguments = loads(text, provider=PROVIDER, what=f"{self.kind} input") if text else {}
            return _part({**self.start, "input": arguments})
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


class StreamAssembler:
    """Folds Anthropic's stream events into deltas for the caller and the final reply.

    ``first_tool_call`` numbers the stream's tool calls from there (a continued turn counts on
    from the calls of the replies before it).
    """

    def __init__(self, *, first_tool_call: int = 0) -> None:
        self._message: dict[str, Any] = {}
        self._usage: dict[str, Any] = {}
        self._blocks: dict[int, _Block] = {}  # by content-block index, in increasing order
        self._tool_calls = first_tool_call
        self.finished = False

    @property
    def container(self) -> str | None:
        return container_of(self._message)

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
            raise error_from_payload(payload)
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
        if index != (latest := next(reversed(self._blocks))):
            # blocks stream one at a time: a late delta would show text out of its place
            raise _decode(f"anthropic sent a delta for block {index} after block {latest} began")
        delta = payload.get("delta")
        if not isinstance(delta, dict):
            raise _decode("anthropic content_block_delta has no delta")
        kind = delta.get("type")
        if kind == "text_delta":
            text = _delta_text(block, delta, block.kind == "text", "text")
            return [TextDelta(text)] if text else []
        if kind == "thinking_delta":
            text = _delta_text(block, delta, block.kind == "thinking", "thinking")
            return [ThinkingDelta(text)] if text else []
        if kind == "input_json_delta":
            text = _delta_text(block, delta, block.takes_input, "partial_json")
            if block.kind == "tool_use" and text:
                return [ToolCallArgumentsDelta(block.position, text)]
            return []
        if kind == "signature_delta":
            if block.kind != "thinking":
                raise _decode("anthropic sent a signature_delta outside a thinking block")
            block.signature.append(_str(delta, "signature", ""))
        # citations_delta (citations are not kept, whole or streamed) and delta types added
        # later do not change the reply we keep
        return []

    def _message_delta(self, payload: Mapping[str, Any]) -> None:
        delta = payload.get("delta")
        if delta is not None and not isinstance(delta, dict):
            raise _decode("anthropic message_delta has a delta that is not an object")
        if delta:
            for key in ("stop_reason", "stop_sequence", "container"):
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


def _delta_text(block: _Block, delta: Mapping[str, Any], fits: bool, key: str) -> str:
    if not fits:
        raise _decode(f"anthropic sent a {delta.get('type')} inside a {block.kind} block")
    text = delta.get(key)
    if not isinstance(text, str):
        raise _decode(f"anthropic {delta.get('type')} has no {key} text")
    block.chunks.append(text)
    return text


# --- small readers -------------------------------------------------------------------------


def _decode(message: str) -> AgentError:
    return AgentError.decode(message[: BODY_LIMIT * 2], provider=PROVIDER)


def _tool_call_part(
    call_id: str, name: str, arguments: object, *, raw_arguments: str | None = None
) -> ToolCallPart:
    """A tool-call part; arguments the message model refuses (say, nested too deep) are Decode."""
    try:
        call = ToolCall(id=call_id, name=name, arguments=arguments, raw_arguments=raw_arguments)
    except ValidationError as exc:
        raise _decode(f"anthropic tool_use input is not a JSON value: {exc}") from None
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
