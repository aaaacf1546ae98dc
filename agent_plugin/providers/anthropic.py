"""The Anthropic Messages API (``POST /v1/messages``) over plain httpx.

:meth:`AnthropicClient.build_body` (neutral request -> JSON body) is the request side and is
tested against recorded traffic; :mod:`~agent_plugin.providers.anthropic_replies` reads the
replies, whole or streamed. :meth:`AnthropicClient.encode_body` is what is sent: the same
body as bytes, where each message (and the tool list) is encoded once per client and reused by
every later request.

Tools Anthropic runs itself (web search, web fetch, code execution) are declared with
:class:`ServerTool`; their calls and results come back in the reply and are sent back
unchanged. A turn the server pauses (``stop_reason: "pause_turn"``, a long server-tool loop)
is continued here, by sending the reply so far back, so the caller gets one whole reply.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import httpx

from agent_plugin.errors import AgentError
from agent_plugin.messages import (
    ChatMessage,
    ContentPart,
    Image,
    ImagePart,
    ProviderBlockPart,
    RedactedThinkingPart,
    Role,
    ServerToolCallPart,
    ServerToolResultPart,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolDefinition,
    ToolResultPart,
)
from agent_plugin.providers.anthropic_replies import (
    PAUSE_TURN,
    PROVIDER,
    SERVER_RESULTS,
    StreamAssembler,
    container_of,
    parse_response,
)
from agent_plugin.providers.base import (
    ChatRequest,
    ChatResponse,
    StreamDone,
    StreamEvent,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStarted,
    merge_extra_body,
)
from agent_plugin.providers.encoding import (
    EncodedCache,
    EncodedPrefixes,
    RawJson,
    dumps,
    encode_json,
)
from agent_plugin.providers.engines import DEFAULT_LIMITS
from agent_plugin.providers.http import HttpTransport, model_ids, require_key
from agent_plugin.providers.retry import RetryPolicy, interrupted, retry_stream
from agent_plugin.redaction import REDACTED

__all__ = [
    "ANTHROPIC_VERSION",
    "DEFAULT_MAX_TOKENS",
    "PAUSE_TURN_LIMIT",
    "AnthropicClient",
    "ServerTool",
    "parse_response",
]

ANTHROPIC_VERSION: Final = "2023-06-01"
DEFAULT_MAX_TOKENS: Final = 1024
MESSAGES_PATH: Final = "/v1/messages"
MODELS_PATH: Final = "/v1/models"
PAUSE_TURN_LIMIT: Final = 10
"""Continuations of one paused turn at most; a turn still paused then is returned as it stands
(``raw_stop_reason`` ``"pause_turn"``, stop reason unknown)."""

_EPHEMERAL: Final[Mapping[str, str]] = {"type": "ephemeral"}

_TOOL_CHOICE: Final[Mapping[str, dict[str, str]]] = {
    "auto": {"type": "auto"},
    "required": {"type": "any"},
    "none": {"type": "none"},
}

# Block types that may carry ``cache_control`` (thinking blocks may not; blocks kept whole are
# not marked, since what they accept is not known here).
_CACHEABLE: Final = frozenset(
    {"text", "image", "tool_use", "tool_result", "server_tool_use", *SERVER_RESULTS}
)


@dataclass(frozen=True, slots=True)
class ServerTool:
    """A tool Anthropic runs on its side, declared in the ``tools`` of every request.

    ``type`` is the versioned tool type and ``name`` its name, as Anthropic's tool reference
    gives them; ``options`` are the tool's other fields (``max_uses``, ``allowed_domains``, ...);
    ``beta`` is the ``anthropic-beta`` flag the tool needs, if any. The constructors below give
    the documented declarations; any other tool is a plain ``ServerTool(type, name)``.
    """

    type: str
    name: str
    options: Mapping[str, Any] = field(default_factory=dict)
    beta: str | None = None

    def __post_init__(self) -> None:
        if not self.type or not self.name:
            raise AgentError.config("a ServerTool needs its type and its name")
        if {"type", "name"} & set(self.options):
            raise AgentError.config("ServerTool options must not repeat its type or name")

    @classmethod
    def web_search(cls, *, max_uses: int | None = None, **options: Any) -> ServerTool:
        """Web search (``web_search_20250305``); options as documented (``allowed_domains``,
        ``blocked_domains``, ``user_location``)."""
        return cls("web_search_20250305", "web_search", _options(max_uses, options))

    @classmethod
    def web_fetch(cls, *, max_uses: int | None = None, **options: Any) -> ServerTool:
        """Web fetch (``web_fetch_20250910``, beta ``web-fetch-2025-09-10``)."""
        return cls(
            "web_fetch_20250910", "web_fetch", _options(max_uses, options), "web-fetch-2025-09-10"
        )

    @classmethod
    def code_execution(cls) -> ServerTool:
        """Code execution (``code_execution_20250825``, beta ``code-execution-2025-08-25``)."""
        return cls("code_execution_20250825", "code_execution", {}, "code-execution-2025-08-25")

    def wire(self) -> dict[str, Any]:
        """The tool's entry in a request's ``tools`` array."""
        return {"type": self.type, "name": self.name, **self.options}


def _options(max_uses: int | None, options: Mapping[str, Any]) -> dict[str, Any]:
    return {**({} if max_uses is None else {"max_uses": max_uses}), **options}


class AnthropicClient:
    """An :class:`~agent_plugin.providers.base.LlmClient` for the Anthropic Messages API.

    ``prompt_caching`` (overridable per request) marks three of Anthropic's four cache
    breakpoints: the system text, the last tool definition and the last block of the last
    message. ``server_tools`` are declared after the request's own tools in every
    request (their beta flags go in the ``anthropic-beta`` header). The key goes out in
    ``x-api-key`` only and never appears in ``repr`` or in an error; it is required for
    ``api.anthropic.com`` (a Config error otherwise), not for other base URLs (a proxy, a test
    server). ``transport`` and ``limits`` as for
    :class:`~agent_plugin.providers.openai.OpenAICompatibleClient`.
    """

    def __init__(
        self,
        *,
        model: str = "claude-sonnet-4-5",
        base_url: str = "https://api.anthropic.com",
        api_key: str | None = None,
        timeout: float = 60.0,
        prompt_caching: bool = True,
        server_tools: Sequence[ServerTool] = (),
        retry: RetryPolicy = RetryPolicy(),  # noqa: B008 - frozen value object
        transport: httpx.AsyncBaseTransport | None = None,
        limits: httpx.Limits = DEFAULT_LIMITS,
    ) -> None:
        require_key(PROVIDER, base_url, api_key)
        self.model = model
        self.prompt_caching = prompt_caching
        self.server_tools = tuple(server_tools)
        self._api_key = api_key or None
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        betas = sorted({tool.beta for tool in self.server_tools if tool.beta})
        if betas:
            headers["anthropic-beta"] = ",".join(betas)
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
            limits=limits,
        )
        self._server_tools = [tool.wire() for tool in self.server_tools]
        # the encoded messages of each conversation this client carries on, and the encodings
        # of the tool tuples it has sent, unmarked; the tool list with its cache marker is kept
        # apart
        self._messages = EncodedPrefixes(_encoded_message)
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
        """Send the request and return the whole reply, a paused turn continued."""
        native = request.response_format
        request = _through_a_tool(request)
        turn: ChatResponse | None = None
        container: str | None = None
        for _ in range(PAUSE_TURN_LIMIT + 1):
            sent = request if turn is None else _continued(request, turn, container)
            data = await self._http.post_json(
                MESSAGES_PATH,
                self.encode_body(sent, stream=False),
                deadline=request.deadline,
                on_retry=request.on_retry,
            )
            try:
                reply = parse_response(data)
            except AgentError as error:
                raise self._http.scrub_error(error) from None
            turn = reply if turn is None else _joined(turn, reply)
            container = container_of(data) or container
            if reply.raw_stop_reason != PAUSE_TURN:
                break
        assert turn is not None  # the loop runs at least once
        return turn if native is None else _as_text(turn, native.name)

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """Send the request with ``stream: true``; yield deltas, then one :class:`StreamDone`.

        A request that fails before any delta was yielded is retried like :meth:`chat` (a
        stream cut before its ``message_stop``, an ``overloaded_error`` event, a failed open);
        once deltas were yielded, a failure worth retrying ends the stream with a
        StreamInterrupted error (:func:`~agent_plugin.providers.retry.interrupted`) and no
        :class:`StreamDone`, so the partial reply reaches no transcript. Other errors (an
        error event the server will repeat) are raised as they are. A paused turn is
        continued in the same stream.
        """
        native = request.response_format
        request = _through_a_tool(request)
        native_calls: set[int] = set()
        turn: ChatResponse | None = None
        container: str | None = None
        shown = False
        try:
            for _ in range(PAUSE_TURN_LIMIT + 1):
                sent = request if turn is None else _continued(request, turn, container)
                calls = 0 if turn is None else len(turn.tool_calls)
                reply: ChatResponse | None = None
                events = retry_stream(
                    functools.partial(self._stream_once, sent, calls),
                    self._http.retry,
                    deadline=request.deadline,
                    on_retry=request.on_retry,
                )
                # closing the attempts early (the caller stopped) releases the connection
                async with contextlib.aclosing(events):
                    async for event in events:
                        if isinstance(event, _Finished):
                            reply, container = event.response, event.container or container
                            continue
                        shown = True
                        if native is not None:  # the forced tool's input is the reply's text
                            if isinstance(event, ToolCallStarted) and event.name == native.name:
                                native_calls.add(event.index)
                                continue
                            if (
                                isinstance(event, ToolCallArgumentsDelta)
                                and event.index in native_calls
                            ):
                                yield TextDelta(event.fragment)
                                continue
                        yield event
                assert reply is not None  # every attempt ends with _Finished or raises
                turn = reply if turn is None else _joined(turn, reply)
                if reply.raw_stop_reason != PAUSE_TURN:
                    break
        except AgentError as error:
            raise self._http.scrub_error(interrupted(error) if shown else error) from None
        assert turn is not None
        yield StreamDone(turn if native is None else _as_text(turn, native.name))

    async def _stream_once(
        self, request: ChatRequest, first_tool_call: int
    ) -> AsyncIterator[StreamEvent | _Finished]:
        """One streamed request: its deltas, then the reply it adds up to."""
        assembler = StreamAssembler(first_tool_call=first_tool_call)
        events = self._http.post_sse(MESSAGES_PATH, self.encode_body(request, stream=True))
        # closing the event generator early releases the connection
        async with contextlib.aclosing(events):
            async for sse in events:
                for event in assembler.feed(sse):
                    yield event
                if assembler.finished:
                    break
        yield _Finished(assembler.response(), assembler.container)

    async def list_models(self) -> list[str]:
        """Ids from ``GET /v1/models``."""
        return model_ids(await self._http.get_json(MODELS_PATH), PROVIDER)

    def build_body(self, request: ChatRequest, *, stream: bool) -> dict[str, Any]:
        """The JSON body for ``request``.

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
        tools += [dict(tool) for tool in self._server_tools]
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

        Messages are frozen, so a conversation's messages are encoded once: a request that
        holds the messages of an earlier one, the same objects in the same order, reuses their
        bytes and encodes only the messages after them
        (:class:`~agent_plugin.providers.encoding.EncodedPrefixes`); the tool list is reused
        when it is the same tuple (the agent's ``ToolRegistry.definitions()``). The last
        message, which carries the cache marker, the options and the new messages are encoded
        per call. A message's content list must not be edited in place once it has been sent:
        put a new message in its slot instead.
        """
        caching = self._caching(request)
        history = request.messages
        prefix = self._messages.encoded(history)
        # a system message encodes to nothing (it is sent apart), as does a message without
        # blocks: the system text is found among those few, not by reading every message's role
        system = _system_text(prefix.skipped)
        data = prefix.data
        if caching and prefix.last_index >= 0:
            # the last message sent carries a cache marker: encoded afresh, after the others
            marked = _encoded_message(history[prefix.last_index], marked=True)
            messages = RawJson(b"[", memoryview(data)[: prefix.last], marked, b"]")
        else:
            messages = RawJson(b"[", data, b"]")
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
        choice, sequential = request.tool_choice, request.parallel_tool_calls is False
        if (request.tools or self._server_tools) and (choice is not None or sequential):
            known = _TOOL_CHOICE.get(choice or "auto")
            wire: dict[str, Any] = (
                {"type": "tool", "name": choice} if known is None else dict(known)
            )
            if sequential and wire["type"] != "none":
                wire["disable_parallel_tool_use"] = True
            body["tool_choice"] = wire
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
            wire = [_tool(tool) for tool in tools] + [dict(tool) for tool in self._server_tools]
            if caching and wire:
                wire[-1]["cache_control"] = dict(_EPHEMERAL)
            data = dumps(wire)
            if cacheable:
                cache.put(tools, data)
        return data


# --- native structured output: through a tool ------------------------------------------------


def _through_a_tool(request: ChatRequest) -> ChatRequest:
    """A request for native structured output as Anthropic takes one: a tool whose input is
    the answer, which the reply must call (the only tool: that tool; beside the agent's own
    tools: any tool, so the agent may still call them first). Extended thinking refuses a
    forced tool, so the two together are a Config error."""
    fmt = request.response_format
    if fmt is None:
        return request
    if "thinking" in request.extra_body:
        raise AgentError.config(
            "anthropic takes native structured output only through a forced tool, which "
            "extended thinking refuses: use output_mode='tool' (or 'prompted') with thinking"
        )
    answer = ToolDefinition(
        name=fmt.name,
        description=fmt.description or f"Give the final answer as {fmt.name}.",
        input_schema=dict(fmt.schema),
    )
    return dataclasses.replace(
        request,
        tools=(*request.tools, answer),
        tool_choice=fmt.name if not request.tools else "required",
        response_format=None,
    )


def _as_text(reply: ChatResponse, name: str) -> ChatResponse:
    """``reply`` with the answer tool's call turned into the text it stands for (its input as
    JSON), so the transcript holds no call that nothing answers."""
    content: list[ContentPart] = []
    answered = False
    for part in reply.content:
        if isinstance(part, ToolCallPart) and part.tool_call.name == name:
            call = part.tool_call
            content.append(TextPart(text=call.raw_arguments or dumps(call.arguments).decode()))
            answered = True
        else:
            content.append(part)
    if not answered:
        return reply
    others = any(isinstance(part, ToolCallPart) for part in content)
    stop = reply.stop_reason if others else StopReason.END_TURN
    return reply.model_copy(update={"content": content, "stop_reason": stop})


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
    if isinstance(part, RedactedThinkingPart):
        return {"type": "redacted_thinking", "data": part.redacted_thinking.data}
    if isinstance(part, ServerToolCallPart):
        server_call = part.server_tool_call
        return {
            "type": "server_tool_use",
            "id": server_call.id,
            "name": server_call.name,
            "input": server_call.arguments,
        }
    if isinstance(part, ServerToolResultPart):
        server_result = part.server_tool_result
        return {
            "type": server_result.type,
            "tool_use_id": server_result.tool_call_id,
            "content": server_result.content,
        }
    if isinstance(part, ProviderBlockPart) and part.provider_block.provider == PROVIDER:
        return dict(part.provider_block.data)  # a copy of the block, as the provider sent it
    return None  # a block of another provider means nothing here


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
        if block["type"] in _CACHEABLE:
            block["cache_control"] = dict(_EPHEMERAL)
            return


# --- a paused turn ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Finished:
    """The end of one streamed request: the reply and the container it ran in."""

    response: ChatResponse
    container: str | None


def _continued(request: ChatRequest, turn: ChatResponse, container: str | None) -> ChatRequest:
    """The request that continues a paused ``turn``: the reply so far sent back as it is, as
    Anthropic documents, in the code-execution container it ran in (unless the request names
    one)."""
    extra = request.extra_body
    if container is not None and "container" not in extra:
        extra = {**extra, "container": container}
    paused = ChatMessage(role=Role.ASSISTANT, content=list(turn.content))
    return dataclasses.replace(request, messages=[*request.messages, paused], extra_body=extra)


def _joined(turn: ChatResponse, more: ChatResponse) -> ChatResponse:
    """A paused ``turn`` and its continuation as one reply (the usage of every request)."""
    return more.model_copy(
        update={"content": [*turn.content, *more.content], "usage": turn.usage + more.usage}
    )
