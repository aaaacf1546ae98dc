"""OpenAI-compatible chat completions (``POST {base}/chat/completions``) over httpx.

One client speaks to OpenAI and to every server that copies its protocol (Ollama, vLLM, Groq,
DeepSeek, OpenRouter, Together, TGI, LiteLLM, Gemini's and Anthropic's compatibility endpoints).
Three pure pieces do the wire translation and are tested against recorded traffic:
:meth:`OpenAICompatibleClient.build_body` (neutral request -> JSON body), :func:`parse_response`
(JSON body -> :class:`ChatResponse`) and the stream assembler, which folds chunks back into the
body :func:`parse_response` reads, so a streamed reply and a whole one come out equal. The
replies it reads leniently are listed in ``docs/guide/configuration.md``; what a request
may carry for a given server is its :class:`~agent_plugin.providers.profiles.EndpointProfile`."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
from pydantic import ValidationError

from agent_plugin.errors import BODY_LIMIT, AgentError, ErrorKind
from agent_plugin.messages import (
    TOKEN_MAX,
    ChatMessage,
    ContentPart,
    Image,
    ImagePart,
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
    text_of,
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
from agent_plugin.providers.encoding import (
    EncodedCache,
    EncodedPrefixes,
    RawJson,
    compact_json,
    dumps,
    encode_json,
)
from agent_plugin.providers.engines import DEFAULT_LIMITS
from agent_plugin.providers.failures import failure_kind, failure_note
from agent_plugin.providers.http import (
    HttpTransport,
    SseEvent,
    json_text,
    loads,
    model_ids,
    require_key,
)
from agent_plugin.providers.profiles import EndpointProfile, profile_for
from agent_plugin.providers.retry import RetryPolicy, interrupted, retry_stream
from agent_plugin.redaction import REDACTED

__all__ = ["PROVIDER", "OpenAICompatibleClient", "parse_response"]

PROVIDER: Final = "openai-compatible"
CHAT_PATH: Final = "/chat/completions"
MODELS_PATH: Final = "/models"

_TOOL_CHOICE_KEYWORDS: Final = frozenset({"auto", "none", "required"})
_REASONING_KEYS: Final = ("reasoning_content", "reasoning")


class OpenAICompatibleClient:
    """An :class:`~agent_plugin.providers.base.LlmClient` for OpenAI-compatible servers.

    ``api_key`` is sent as ``Authorization: Bearer <key>`` when given; it never appears in
    ``repr``, errors or logs. It is required for ``api.openai.com`` (a Config error otherwise);
    local servers (Ollama, vLLM, llama.cpp) usually need none. ``profile`` says what the
    endpoint accepts (default: the known profile of ``base_url``'s host, see
    :func:`~agent_plugin.providers.profiles.profile_for`). Requests go through
    :func:`~agent_plugin.providers.default_transport` (aiohttp, a pool of ``limits``, the
    environment's proxy) unless ``transport`` gives another httpx transport (httpx's own for
    HTTP/2, a test's ``MockTransport``).
    """

    def __init__(
        self,
        *,
        model: str = "gpt-4o-mini",
        base_url: str = "https://api.openai.com/v1",
        api_key: str | None = None,
        timeout: float = 60.0,
        profile: EndpointProfile | None = None,
        retry: RetryPolicy = RetryPolicy(),  # noqa: B008 - frozen, so sharing is safe
        transport: httpx.AsyncBaseTransport | None = None,
        limits: httpx.Limits = DEFAULT_LIMITS,
    ) -> None:
        require_key(PROVIDER, base_url, api_key)
        self.model = model
        self.profile = profile_for(base_url) if profile is None else profile
        self._api_key = api_key or None
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
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
        # the encoded messages of each conversation this client carries on, and the encodings
        # of the tool tuples it has sent (with and without strict schemas)
        self._messages = EncodedPrefixes(functools.partial(_encoded_message, profile=self.profile))
        self._tools = EncodedCache(max_entries=16)
        self._strict_tools = EncodedCache(max_entries=16)

    @property
    def provider_name(self) -> str:
        return PROVIDER

    @property
    def base_url(self) -> str:
        """The API's base URL (without any ``user:password@``, which is sent as Basic auth)."""
        return self._http.base_url

    def __repr__(self) -> str:
        key = repr(REDACTED) if self._api_key else "None"
        return (
            f"OpenAICompatibleClient(model={self.model!r}, base_url={self.base_url!r}, "
            f"api_key={key}, profile={self.profile.name!r})"
        )

    async def aclose(self) -> None:
        """Release the connection pool (and the encodings kept for later requests)."""
        for cache in (self._messages, self._tools, self._strict_tools):
            cache.clear()
        await self._http.aclose()

    def build_body(self, request: ChatRequest, *, stream: bool) -> dict[str, Any]:
        """The JSON body for ``request``, as the client's profile allows.

        ``tools`` and ``tool_choice`` are sent only when there are tools; the output cap (under
        the profile's name for it), ``temperature`` and ``stop`` only when set; a stream asks
        for the usage chunk where the profile says so. A request the endpoint cannot express
        is a Config error (see :class:`EndpointProfile`). ``request.extra_body`` is merged last
        by :func:`merge_extra_body` (a ``None`` value removes the key). Never mutates
        ``request``; tool schemas and extra values are shared with it, not copied.
        """
        strict = self._strict(request)
        tools = [_tool_definition(tool, strict=strict) for tool in request.tools]
        messages = [w for m in request.messages for w in _wire_messages(m, self.profile)]
        return self._body(request, messages, tools, stream=stream)

    def encode_body(self, request: ChatRequest, *, stream: bool) -> bytes:
        """:meth:`build_body`'s body as the JSON bytes that are sent (the same bytes
        ``json.dumps`` would give for it, compact and UTF-8).

        Messages are frozen, so a conversation's messages are encoded once: a request that
        holds the messages of an earlier one, the same objects in the same order, reuses their
        bytes and encodes only the messages after them
        (:class:`~agent_plugin.providers.encoding.EncodedPrefixes`); the tool list is reused
        when it is the same tuple (the agent's ``ToolRegistry.definitions()``). Only the
        options and the new messages are encoded per call. A message's content list must not
        be edited in place once it has been sent: put a new message in its slot instead.
        """
        # a tool message without results sends nothing (its encoding is empty)
        messages = RawJson(b"[", self._messages.encoded(request.messages).data, b"]")
        tools = RawJson(self._encoded_tools(request)) if request.tools else None
        return encode_json(self._body(request, messages, tools, stream=stream))

    def _strict(self, request: ChatRequest) -> bool:
        return request.strict_tools and self.profile.strict_tools

    def _body(
        self, request: ChatRequest, messages: object, tools: object, *, stream: bool
    ) -> dict[str, Any]:
        profile = self.profile
        body: dict[str, Any] = {"model": request.model or self.model, "messages": messages}
        if request.tools:
            body["tools"] = tools
            choice = request.tool_choice
            if profile.tool_choice:
                body["tool_choice"] = _tool_choice(choice)
            elif choice not in (None, "auto"):
                raise _unexpressible(profile, f"tool_choice {choice!r}")
            parallel = request.parallel_tool_calls
            if parallel is not None and profile.parallel_tool_calls:
                body["parallel_tool_calls"] = parallel
            elif parallel is False:
                raise _unexpressible(profile, "parallel_tool_calls: false")
        fmt = request.response_format
        if fmt is not None:
            if not profile.response_format:
                raise _unexpressible(profile, "response_format json_schema (native output)")
            schema: dict[str, Any] = {"name": fmt.name}
            if fmt.description:
                schema["description"] = fmt.description
            schema["schema"] = fmt.schema
            if fmt.strict and profile.strict_tools:
                schema["strict"] = True
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
        if request.max_tokens is not None:
            body[profile.max_tokens_field] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.stop:
            body["stop"] = list(request.stop)
        if stream:
            body["stream"] = True
            if profile.stream_usage:
                body["stream_options"] = {"include_usage": True}
        merge_extra_body(body, request.extra_body)
        return body

    def _encoded_tools(self, request: ChatRequest) -> bytes:
        """The ``tools`` array; kept per tuple (a list may change, so it is encoded each time)."""
        tools, strict = request.tools, self._strict(request)
        cache = self._strict_tools if strict else self._tools
        cacheable = isinstance(tools, tuple)
        data = cache.get(tools) if cacheable else None
        if data is None:
            data = dumps([_tool_definition(tool, strict=strict) for tool in tools])
            if cacheable:
                cache.put(tools, data)
        return data

    async def chat(self, request: ChatRequest) -> ChatResponse:
        """Send the request and return the whole reply."""
        data = await self._http.post_json(
            CHAT_PATH,
            self.encode_body(request, stream=False),
            deadline=request.deadline,
            on_retry=request.on_retry,
        )
        try:
            return parse_response(data, PROVIDER)
        except AgentError as error:
            raise self._http.scrub_error(error) from None

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """Send the request and yield deltas as they arrive, then one :class:`StreamDone`.

        A request that fails before any delta was yielded is retried like :meth:`chat` (a
        stream that stops without a finish reason and without ``[DONE]``, a failed open);
        once deltas were yielded, a failure worth retrying ends the stream with a
        StreamInterrupted error (:func:`~agent_plugin.providers.retry.interrupted`) and no
        :class:`StreamDone`, so the partial reply reaches no transcript. An error the server
        reports inside the stream is raised as it is, after the deltas before it.
        """
        attempt = functools.partial(self._stream_once, self.encode_body(request, stream=True))
        shown = False
        events = retry_stream(
            attempt, self._http.retry, deadline=request.deadline, on_retry=request.on_retry
        )
        try:
            # closing the attempts early (the caller stopped) releases the connection at once
            async with contextlib.aclosing(events):
                async for event in events:
                    shown = shown or not isinstance(event, StreamDone)
                    yield event
        except AgentError as error:
            raise self._http.scrub_error(interrupted(error) if shown else error) from None

    async def _stream_once(self, body: bytes) -> AsyncIterator[StreamEvent]:
        """One streamed request: its deltas, then its :class:`StreamDone`."""
        assembler = _StreamAssembler(PROVIDER)
        # closing the event generator early releases the connection
        async with contextlib.aclosing(self._http.post_sse(CHAT_PATH, body)) as events:
            async for event in events:
                for delta in assembler.feed(event):
                    yield delta
                if assembler.done:
                    break
        if not assembler.done and not assembler.finished:
            raise AgentError(
                ErrorKind.TRANSPORT,
                f"{PROVIDER} stream ended early (no finish reason and no [DONE])",
                provider=PROVIDER,
            )
        for delta in assembler.flush():
            yield delta
        yield StreamDone(assembler.response())

    async def list_models(self) -> list[str]:
        """Model ids from ``GET {base}/models`` (``{"data": [{"id": ...}]}``)."""
        return model_ids(await self._http.get_json(MODELS_PATH), PROVIDER)


# --- request -------------------------------------------------------------------------------


def _encoded_message(message: ChatMessage, *, profile: EndpointProfile) -> bytes:
    """The wire messages for one message as JSON, joined with commas (empty for none)."""
    return b",".join(dumps(wire) for wire in _wire_messages(message, profile))


def _wire_messages(message: ChatMessage, profile: EndpointProfile) -> list[dict[str, Any]]:
    """The wire messages for one message: one, or one per result for a tool message."""
    if message.role is Role.TOOL:
        return [
            {
                "role": "tool",
                "tool_call_id": part.tool_result.tool_call_id,
                "content": part.tool_result.content,
            }
            for part in message.content
            if isinstance(part, ToolResultPart)
        ]
    if message.role is Role.ASSISTANT:
        return [_assistant_message(message.content, profile)]
    if message.role is Role.SYSTEM:
        return [{"role": profile.system_role, "content": text_of(message.content)}]
    if message.role is Role.USER and any(isinstance(p, ImagePart) for p in message.content):
        if not profile.images:
            raise _unexpressible(profile, "an image")
        return [{"role": "user", "content": _content_array(message.content)}]
    return [{"role": message.role.value, "content": text_of(message.content)}]


def _assistant_message(parts: list[ContentPart], profile: EndpointProfile) -> dict[str, Any]:
    """Text (``""`` when there is none, ``null`` next to tool calls), tool calls, reasoning.

    Unsigned thinking (DeepSeek's ``reasoning_content``, the ``reasoning`` of Ollama and
    others, Mistral's thinking parts) is re-sent where the profile says, which DeepSeek needs
    within a tool-calling turn; signed (Anthropic) and redacted thinking, and other
    providers' blocks, mean nothing to these servers and are dropped.
    """
    text = text_of(parts)
    calls = [_wire_tool_call(p.tool_call) for p in parts if isinstance(p, ToolCallPart)]
    unsigned = [
        p.thinking.text
        for p in parts
        if isinstance(p, ThinkingPart) and p.thinking.signature is None
    ]
    thinking = "".join(unsigned)
    content: object = text or (None if calls else "")
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if unsigned and profile.send_reasoning:  # even empty: DeepSeek's own replies carry ""
        if profile.reasoning_field == "thinking":  # Mistral: a thinking part before the text
            chunk = {"type": "thinking", "thinking": [{"type": "text", "text": thinking}]}
            message["content"] = [chunk, *([{"type": "text", "text": text}] if text else [])]
        else:
            message[profile.reasoning_field] = thinking
    if calls:
        message["tool_calls"] = calls
    return message


def _wire_tool_call(call: ToolCall) -> dict[str, Any]:
    """The call as the model made it: its raw text when that was not JSON, else its JSON value
    (whatever kind of value it is) re-encoded."""
    if call.raw_arguments is not None:
        arguments = call.raw_arguments
    else:
        arguments = compact_json(call.arguments)
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }


def _content_array(parts: list[ContentPart]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, TextPart):
            out.append({"type": "text", "text": part.text})
        elif isinstance(part, ImagePart):
            out.append({"type": "image_url", "image_url": {"url": _image_url(part.image)}})
    return out


def _image_url(image: Image) -> str:
    if image.url is not None:
        return image.url
    if image.data is not None and image.media_type is not None:
        return f"data:{image.media_type};base64,{image.data}"
    raise AgentError.config("an image needs a url, or data together with its media_type")


def _tool_definition(tool: ToolDefinition, *, strict: bool) -> dict[str, Any]:
    function: dict[str, Any] = {
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.input_schema,
    }
    if strict:
        function["strict"] = True
    return {"type": "function", "function": function}


def _unexpressible(profile: EndpointProfile, what: str) -> AgentError:
    return AgentError.config(
        f"the {profile.name} endpoint does not take {what} (its EndpointProfile says so); "
        "leave it out of the request or pass another profile to the client"
    )


def _tool_choice(choice: str | None) -> str | dict[str, Any]:
    if choice is None:
        return "auto"
    if choice in _TOOL_CHOICE_KEYWORDS:
        return choice
    return {"type": "function", "function": {"name": choice}}


# --- response ------------------------------------------------------------------------------


def parse_response(data: object, provider: str = PROVIDER) -> ChatResponse:
    """A chat-completions body as a :class:`ChatResponse`.

    Raises only :class:`AgentError`: Decode when the body has the wrong shape, and the kind
    the server's own ``error`` object implies when it reported an error with status 200.
    Only ``choices[0]`` is read.
    """
    if not isinstance(data, dict):
        raise _decode(provider, "response body is not a JSON object")
    _raise_reported_error(data, provider)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise _decode(provider, "response has no choices")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise _decode(provider, "response choice is not an object")
    message = choice.get("message")
    if not isinstance(message, dict):
        raise _decode(provider, "response choice has no message")

    text, thought = _content(message.get("content"), provider)
    thinking = _reasoning(message) + thought
    refusal = message.get("refusal")
    refusal = refusal if isinstance(refusal, str) else ""
    calls = _tool_calls(message, provider)
    finish = choice.get("finish_reason")
    raw_stop = finish if isinstance(finish, str) else None

    parts: list[ContentPart] = []
    if thinking:
        parts.append(ThinkingPart(thinking=Thinking(text=thinking)))
    if text:
        parts.append(TextPart(text=text))
    if refusal:
        parts.append(TextPart(text=refusal))
    parts.extend(ToolCallPart(tool_call=call) for call in calls)
    try:
        return ChatResponse(
            content=parts,
            stop_reason=_stop_reason(raw_stop, tool_calls=bool(calls), refused=bool(refusal)),
            usage=_usage(data.get("usage")),
            model=_optional_id(data.get("model")),
            id=_optional_id(data.get("id")),
            raw_stop_reason=raw_stop,
        )
    except ValidationError as exc:
        raise _decode(provider, f"response does not fit the message model: {exc}") from None


def _decode(provider: str, what: str) -> AgentError:
    return AgentError.decode(f"{provider} {what}"[: BODY_LIMIT * 2], provider=provider)


def _raise_reported_error(data: Mapping[str, Any], provider: str) -> None:
    """Raise the error a server put in a 200 body or a stream chunk (OpenRouter does both)."""
    error = data.get("error")
    if not error:
        return
    message: object = error.get("message") if isinstance(error, dict) else error
    code: object = error.get("code") if isinstance(error, dict) else None
    status = _http_status(code)
    kind = failure_kind(status, error)
    note = failure_note(kind)
    body = json_text(error)
    detail = message if isinstance(message, str) and message else body
    raise AgentError(
        kind,
        f"{provider} reported an error" + (f" ({note})" if note else "") + f": "
        f"{detail[:BODY_LIMIT]}",
        provider=provider,
        status=status,
        body=body,
    )


def _http_status(code: object) -> int | None:
    if isinstance(code, str) and code.isascii() and code.isdigit() and len(code) == 3:
        code = int(code)
    if isinstance(code, int) and not isinstance(code, bool) and 100 <= code <= 599:
        return code
    return None


def _reasoning(message: Mapping[str, Any]) -> str:
    """DeepSeek's ``reasoning_content``, else the ``reasoning`` of Ollama, Groq, Cerebras,
    OpenRouter."""
    for key in _REASONING_KEYS:
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _content(content: object, provider: str) -> tuple[str, str]:
    """The text and the reasoning in a message's (or a delta's) ``content``: a string, or an
    array of content parts, where Mistral puts its reasoning in ``thinking`` parts."""
    if content is None:
        return "", ""
    if isinstance(content, str):
        return content, ""
    if not isinstance(content, list):
        raise _decode(provider, "message content is neither text nor null")
    text: list[str] = []
    thinking: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        kind = part.get("type", "text")
        if kind == "text" and isinstance(part.get("text"), str):
            text.append(part["text"])
        elif kind == "thinking":
            thinking.append(_thinking_text(part.get("thinking")))
    return "".join(text), "".join(thinking)


def _thinking_text(value: object) -> str:
    """A Mistral thinking part's text: a list of text chunks (or, leniently, a string)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        return ""
    return "".join(
        chunk["text"]
        for chunk in value
        if isinstance(chunk, dict)
        and isinstance(chunk.get("text"), str)
        and chunk.get("type", "text") == "text"
    )


def _tool_calls(message: Mapping[str, Any], provider: str) -> list[ToolCall]:
    raw = message.get("tool_calls")
    if raw is not None and not isinstance(raw, list):
        raise _decode(provider, "message tool_calls is not an array")
    calls = [_tool_call(item, provider) for item in raw or []]
    legacy = message.get("function_call")
    if not calls and legacy is not None:
        if not isinstance(legacy, dict):
            raise _decode(provider, "message function_call is not an object")
        calls.append(_function_call("", legacy, provider))
    return calls


def _tool_call(item: object, provider: str) -> ToolCall:
    if not isinstance(item, dict):
        raise _decode(provider, "tool_call is not an object")
    function = item.get("function")
    if not isinstance(function, dict):
        raise _decode(provider, "tool_call has no function object")
    return _function_call(_call_id(item.get("id"), provider), function, provider)


def _call_id(value: object, provider: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):  # TGI 1.4 sends 0
        return str(value)
    raise _decode(provider, "tool_call id is neither text nor a number")


def _function_call(call_id: str, function: Mapping[str, Any], provider: str) -> ToolCall:
    name = function.get("name")
    if name is not None and not isinstance(name, str):
        raise _decode(provider, "tool_call function name is not text")
    arguments = function.get("arguments")
    if arguments is None:
        arguments = function.get("parameters")  # TGI 1.4: an object under another name
    raw: str | None = None
    if isinstance(arguments, str):
        if not arguments.strip():
            arguments = None
        else:
            try:
                arguments = loads(arguments, provider=provider, what="tool_call arguments")
            except AgentError:  # kept as the model wrote it; the tool round reports it
                raw, arguments = arguments, None
    try:
        return ToolCall(
            id=call_id,
            name=name or "",
            arguments={} if arguments is None else arguments,
            raw_arguments=raw,
        )
    except ValidationError as exc:
        raise _decode(provider, f"tool_call arguments are not JSON values: {exc}") from None


def _stop_reason(finish: str | None, *, tool_calls: bool, refused: bool) -> StopReason:
    if refused or finish == "content_filter":
        return StopReason.REFUSAL
    if finish in ("tool_calls", "function_call"):
        return StopReason.TOOL_USE
    if finish == "length":
        return StopReason.MAX_TOKENS
    if finish == "stop":  # TGI 3 says "stop" after a tool call
        return StopReason.TOOL_USE if tool_calls else StopReason.END_TURN
    return StopReason.UNKNOWN


def _usage(raw: object) -> TokenUsage:
    """OpenAI usage; cached prompt tokens from ``prompt_tokens_details`` or DeepSeek's fields."""
    if not isinstance(raw, dict):
        return TokenUsage()
    details = raw.get("prompt_tokens_details")
    if not isinstance(details, dict):
        details = {}
    cache_read = _count(details.get("cached_tokens"))
    if cache_read is None:
        cache_read = _count(raw.get("prompt_cache_hit_tokens"))  # DeepSeek
    if cache_read is None:
        cache_read = _count(raw.get("cached_tokens"))  # HF router (together)
    return TokenUsage(
        input_tokens=_count(raw.get("prompt_tokens")) or 0,
        output_tokens=_count(raw.get("completion_tokens")) or 0,
        cache_read_tokens=cache_read or 0,
        cache_write_tokens=_count(details.get("cache_write_tokens")) or 0,  # OpenRouter
    )


def _count(value: object) -> int | None:
    if type(value) is int:  # what servers send (or None): decided at once
        return min(max(value, 0), TOKEN_MAX)
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return min(max(value, 0), TOKEN_MAX)
    return None


def _optional_id(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


# --- streaming -----------------------------------------------------------------------------


@dataclass(slots=True)
class _ToolCallBuffer:
    position: int
    id: object = None
    name: str | None = None
    fragments: list[str] = field(default_factory=list)
    whole: object = None
    announced: bool = False

    def wire(self) -> dict[str, Any]:
        arguments: object = "".join(self.fragments) if self.fragments else self.whole
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": arguments},
        }


class _StreamAssembler:
    """Folds chat-completion chunks into deltas and, at the end, the equivalent whole body.

    Only choice 0 is followed. Tool calls are assembled by their ``index``; id and name come
    from the first delta that carries them (Groq sends a whole call in one delta).
    """

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.done = False
        self.finished = False
        self._id: object = None
        self._model: object = None
        self._finish: object = None
        self._usage: object = None
        self._text: list[str] = []
        self._refusal: list[str] = []
        self._thinking: list[str] = []
        self._calls: list[_ToolCallBuffer] = []
        self._by_index: dict[object, _ToolCallBuffer] = {}

    def feed(self, event: SseEvent) -> list[StreamEvent]:
        """The deltas in one server-sent event; sets :attr:`done` at ``[DONE]``."""
        if event.data.strip() == "[DONE]":
            self.done = True
            return []
        chunk = loads(event.data, provider=self.provider, what="stream chunk")
        if event.event == "error":  # an SSE error event, whatever its payload looks like
            nested = chunk.get("error") if isinstance(chunk, dict) else None
            _raise_reported_error({"error": nested or chunk or event.data}, self.provider)
        if not isinstance(chunk, dict):
            raise _decode(self.provider, "stream chunk is not a JSON object")
        _raise_reported_error(chunk, self.provider)
        if self._id is None:
            self._id = chunk.get("id")
        if self._model is None:
            self._model = chunk.get("model")
        self._take_usage(chunk)
        choices = chunk.get("choices")
        if choices is None:
            return []
        if not isinstance(choices, list):
            raise _decode(self.provider, "stream chunk choices is not an array")
        deltas: list[StreamEvent] = []
        for choice in choices:
            if not isinstance(choice, dict):
                raise _decode(self.provider, "stream choice is not an object")
            if choice.get("index", 0) not in (0, None):
                continue
            delta = choice.get("delta")
            if delta is not None:
                if not isinstance(delta, dict):
                    raise _decode(self.provider, "stream delta is not an object")
                deltas.extend(self._delta(delta))
            finish = choice.get("finish_reason")
            if finish is not None:
                self._finish = finish
                self.finished = True
        return deltas

    def flush(self) -> list[StreamEvent]:
        """Starts for tool calls that never carried a name or arguments fragment."""
        return [self._announce(call) for call in self._calls if not call.announced]

    def response(self) -> ChatResponse:
        """The reply, parsed from the non-streaming body these chunks add up to."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._text) or None}
        if self._refusal:
            message["refusal"] = "".join(self._refusal)
        if self._thinking:
            message["reasoning_content"] = "".join(self._thinking)
        if self._calls:
            message["tool_calls"] = [call.wire() for call in self._calls]
        body = {
            "id": self._id,
            "model": self._model,
            "choices": [{"index": 0, "message": message, "finish_reason": self._finish}],
            "usage": self._usage,
        }
        return parse_response(body, self.provider)

    def _take_usage(self, chunk: Mapping[str, Any]) -> None:
        usage = chunk.get("usage")
        if not isinstance(usage, dict):
            groq = chunk.get("x_groq")
            usage = groq.get("usage") if isinstance(groq, dict) else None
        if isinstance(usage, dict):
            self._usage = usage

    def _delta(self, delta: Mapping[str, Any]) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for key in _REASONING_KEYS:
            value = delta.get(key)
            if isinstance(value, str) and value:
                self._thinking.append(value)
                out.append(ThinkingDelta(value))
                break
        content, thought = _content(delta.get("content"), self.provider)
        if thought:
            self._thinking.append(thought)
            out.append(ThinkingDelta(thought))
        if content:
            self._text.append(content)
            out.append(TextDelta(content))
        refusal = delta.get("refusal")
        if isinstance(refusal, str) and refusal:
            self._refusal.append(refusal)
            out.append(TextDelta(refusal))
        calls = delta.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise _decode(self.provider, "stream delta tool_calls is not an array")
            for item in calls:
                out.extend(self._tool_delta(item))
        legacy = delta.get("function_call")
        if legacy is not None and not calls:
            out.extend(self._tool_delta({"index": "function_call", "function": legacy}))
        return out

    def _tool_delta(self, item: object) -> list[StreamEvent]:
        if not isinstance(item, dict):
            raise _decode(self.provider, "stream tool_call delta is not an object")
        function = item.get("function")
        if function is None:
            function = {}
        if not isinstance(function, dict):
            raise _decode(self.provider, "stream tool_call function is not an object")
        call = self._buffer_for(item)
        out: list[StreamEvent] = []
        call_id = item.get("id")
        if call.id is None and call_id is not None:
            _call_id(call_id, self.provider)  # same type rule as a whole body
            call.id = call_id
        name = function.get("name")
        if name is not None and not isinstance(name, str):
            raise _decode(self.provider, "tool_call function name is not text")
        if call.name is None and name:
            call.name = name
        arguments = function.get("arguments")
        if arguments is None:
            arguments = function.get("parameters")
        fragment = ""
        if isinstance(arguments, str):
            call.fragments.append(arguments)
            fragment = arguments
        elif arguments is not None:
            call.whole = arguments
            fragment = json_text(arguments)
        if not call.announced and (call.name or fragment):
            out.append(self._announce(call))
        if fragment:
            out.append(ToolCallArgumentsDelta(call.position, fragment))
        return out

    def _buffer_for(self, item: Mapping[str, Any]) -> _ToolCallBuffer:
        index = item.get("index")
        if isinstance(index, bool) or not isinstance(index, int | str):
            # no usable index: a new call when a new id shows up, else the latest call
            call_id = item.get("id")
            last = self._calls[-1] if self._calls else None
            if last is not None and (call_id is None or call_id == last.id):
                return last
            index = ("position", len(self._calls))
        call = self._by_index.get(index)
        if call is None:
            call = _ToolCallBuffer(position=len(self._calls))
            self._calls.append(call)
            self._by_index[index] = call
        return call

    def _announce(self, call: _ToolCallBuffer) -> ToolCallStarted:
        call.announced = True
        call_id = _optional_id(call.id) or ""
        return ToolCallStarted(call.position, call_id, call.name or "")
