"""HTTP plumbing shared by the wire clients: one pooled transport, errors, SSE, retries.

Also the small pieces both wire clients need in the same form: :func:`loads` (JSON text to a
value, or a Decode error), :func:`json_text`, :func:`needs_api_key` / :func:`require_key`,
:func:`model_ids` and :func:`sse_lines`. How a body becomes bytes is
:mod:`~agent_plugin.providers.encoding`; how bytes reach the network,
:mod:`~agent_plugin.providers.engines`.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import json
import re
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx

from agent_plugin.errors import BODY_LIMIT, AgentError, ErrorKind
from agent_plugin.pacing import heard_headers
from agent_plugin.providers.encoding import dumps
from agent_plugin.providers.engines import DEFAULT_LIMITS, Engine, HttpxEngine, Opened
from agent_plugin.providers.failures import failure_kind, failure_note
from agent_plugin.providers.retry import RetryNotice, RetryPolicy, parse_retry_after, retry_failed
from agent_plugin.redaction import REDACTED, scrub

__all__ = [
    "HttpTransport",
    "SseEvent",
    "iter_sse",
    "json_text",
    "loads",
    "model_ids",
    "needs_api_key",
    "require_key",
    "sse_lines",
]

_JSON_ERRORS: Final = (ValueError, RecursionError)  # RecursionError: absurdly deep nesting

# Hosts that never answer without a key; other base URLs (Ollama, vLLM, a proxy, a test
# server) may need none.
_KEYED_HOSTS: Final = frozenset({"api.openai.com", "api.anthropic.com"})


def loads(text: str | bytes, *, provider: str, what: str) -> Any:
    """The JSON value in ``text``; a Decode error naming ``what`` when it is not JSON.

    Nesting too deep for the parser counts as not JSON (it raises RecursionError, which must not
    escape a client).
    """
    try:
        return json.loads(text)
    except _JSON_ERRORS:
        raise AgentError.decode(f"{provider} {what} is not JSON", provider=provider) from None


def json_text(value: object) -> str:
    """``value`` as JSON text for an error body (``repr`` when it cannot be encoded)."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, *_JSON_ERRORS):
        return repr(value)


def needs_api_key(base_url: str) -> bool:
    """Whether ``base_url`` is a public OpenAI or Anthropic host, which refuses keyless calls."""
    return _host(base_url) in _KEYED_HOSTS


def require_key(provider: str, base_url: str, api_key: str | None) -> None:
    """Raise a Config error naming ``AGENT_API_KEY`` when :func:`needs_api_key` and no key."""
    if not api_key and needs_api_key(base_url):
        raise AgentError.config(
            f"{provider} at {_host(base_url)} needs an API key: set AGENT_API_KEY (or pass api_key)"
        )


def _host(base_url: str) -> str:
    try:
        return httpx.URL(base_url).host.lower()
    except httpx.InvalidURL:
        return ""  # not judged here; HttpTransport refuses it with a Config error


def model_ids(data: object, provider: str) -> list[str]:
    """The ids in a model list ``{"data": [{"id": ...}, ...]}`` (OpenAI's and Anthropic's shape)."""
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise AgentError.decode(f"{provider} model list has no data array", provider=provider)
    ids: list[str] = []
    for item in items:
        model_id = item.get("id") if isinstance(item, dict) else None
        if not isinstance(model_id, str):
            raise AgentError.decode(f"{provider} model list entry has no id", provider=provider)
        ids.append(model_id)
    return ids


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One server-sent event: its ``event:`` name (None when it had none) and its data."""

    event: str | None
    data: str


async def iter_sse(lines: AsyncIterator[str]) -> AsyncGenerator[SseEvent, None]:
    """Server-sent events from a stream of lines (the WHATWG rules, minus ``id`` and ``retry``).

    Comment lines (``: ...``) are skipped; one space after a field's colon is dropped and the
    rest of the value is kept as sent (trailing whitespace included); several ``data:`` lines
    join with newlines. An event is dispatched at a blank line or at the end of the stream, and
    only when it carried data.
    """
    event: str | None = None
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield SseEvent(event, "\n".join(data))
            event, data = None, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value or None
    if data:
        yield SseEvent(event, "\n".join(data))


_LINE_END = re.compile(r"\r\n|\r|\n")


class _LineSplitter:
    """Splits text fed in pieces into lines at CRLF, LF or CR; drops one leading BOM.

    Each piece is scanned once, so a long line arriving in many small pieces costs linear time.
    A line ending in CR is passed on at once; an LF at the start of the next piece then belongs to
    that CR and is skipped.
    """

    def __init__(self) -> None:
        self._pending: list[str] = []  # pieces of the unfinished line, no line end among them
        self._after_cr = False
        self._started = False

    def feed(self, text: str) -> list[str]:
        if not text:
            return []
        if not self._started:
            self._started = True
            text = text.removeprefix("\ufeff")
        if self._after_cr and text.startswith("\n"):
            text = text[1:]
        self._after_cr = text.endswith("\r")
        lines: list[str] = []
        start = 0
        for match in _LINE_END.finditer(text):
            self._pending.append(text[start : match.start()])
            lines.append("".join(self._pending))
            self._pending.clear()
            start = match.end()
        if start < len(text):
            self._pending.append(text[start:])
        return lines

    def close(self) -> list[str]:
        """The unfinished last line, if it has any text."""
        rest = "".join(self._pending)
        self._pending.clear()
        return [rest] if rest else []


async def sse_lines(chunks: AsyncIterator[bytes]) -> AsyncGenerator[str, None]:
    """The lines of an event stream: UTF-8, split at CRLF, LF or CR only, one leading BOM dropped.

    (``httpx``'s own line splitting also breaks at U+2028, form feeds and the like, which may
    appear raw inside a JSON string in a ``data:`` line.)
    """
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    splitter = _LineSplitter()
    async for chunk in chunks:
        for line in splitter.feed(decoder.decode(chunk)):
            yield line
    for line in [*splitter.feed(decoder.decode(b"", final=True)), *splitter.close()]:
        yield line


class HttpTransport:
    """One pooled connection pool for one provider, with retries and typed errors.

    Requests go to an :class:`~agent_plugin.providers.engines.Engine`, never through an
    :class:`httpx.AsyncClient`: a provider call needs none of the client's layers (cookies,
    auth flows, redirects, base-URL merging), and they cost more CPU per request than the
    rest of a step. Without a ``transport`` it is the default one
    (:func:`~agent_plugin.providers.aiohttp_engine.default_transport`: aiohttp behind
    httpx-aiohttp's transport, a pool of ``limits``, certificates checked, through the proxy
    the environment names for ``base_url``: ``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY``,
    ``NO_PROXY``). A given ``transport`` is used as it is (httpx ignores the environment's
    proxies then, too): an ``httpx_aiohttp.AiohttpTransport`` is sent through its aiohttp
    session directly, any other httpx transport gets :class:`httpx.Request` objects.

    Every failure leaves as an :class:`AgentError`: a non-2xx status is classified by
    :meth:`ErrorKind.from_http_status` with the provider's name, the status, ``Retry-After`` and
    at most 500 characters of the body; timeouts and connection failures are Transport; a body
    that is not JSON is Decode. The transport owns the provider's ``secret`` (the API key): it is
    scrubbed from every error made here, and :meth:`scrub_error` does the same for the errors a
    client finds inside a successful answer.
    """

    def __init__(
        self,
        provider: str,
        base_url: str,
        *,
        headers: Mapping[str, str],
        timeout: float,
        retry: RetryPolicy,
        secret: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        limits: httpx.Limits = DEFAULT_LIMITS,
    ) -> None:
        self.provider = provider
        try:
            url = httpx.URL(base_url.rstrip("/"))
        except httpx.InvalidURL as exc:
            raise AgentError.config(f"{provider} base_url is not a valid URL: {exc}") from None
        common = httpx.Headers(_DEFAULT_HEADERS)
        common.update(headers)  # names compare case-insensitively, as AsyncClient merged them
        secrets = [secret] if secret else []
        if url.userinfo:  # user:password@ in the URL is Basic auth, as httpx reads it
            if "authorization" not in common:
                token = _basic_token(url)
                common["authorization"] = "Basic " + token
                # a server that echoes the header back must not get the password into an
                # error: registered, it is redacted by value, but not in its base64 form, and
                # a short pair's token is too short for the pattern of Basic values
                if url.password:
                    secrets.append(token)
            url = url.copy_with(username=None, password=None)
        self.base_url = str(url)
        self.retry = retry
        if transport is None:
            from agent_plugin.providers.aiohttp_engine import default_transport
            from agent_plugin.providers.proxies import environment_proxy

            transport = default_transport(self.base_url, limits=limits)
            # the proxy's credentials travel as Proxy-Authorization (with every request, for
            # an http:// base URL), and a proxy's 407 may echo them; no one registered them
            secrets += _proxy_secrets(environment_proxy(self.base_url))
        self._secrets = tuple(secrets)
        post = httpx.Headers(common)
        post["content-type"] = "application/json"
        sse = httpx.Headers(post)
        sse["accept"] = "text/event-stream"
        kinds = {"GET": common, "POST": post, "SSE": sse}
        self._engine = _engine_for(transport, self.base_url, kinds, timeout)
        self._closed = False

    def __repr__(self) -> str:
        return f"HttpTransport(provider={self.provider!r}, base_url={self.base_url!r})"

    @property
    def transport(self) -> httpx.AsyncBaseTransport:
        """The httpx transport the requests go through (the default one, or the one given)."""
        return self._engine.transport

    async def aclose(self) -> None:
        """Close the pooled connections; requests after this fail."""
        self._closed = True
        await self._engine.aclose()

    def get_json(
        self,
        path: str,
        *,
        deadline: float | None = None,
        on_retry: Callable[[RetryNotice], None] | None = None,
    ) -> Awaitable[Any]:
        """The JSON body of a GET, retried like :meth:`post_json`."""
        return self._json("GET", path, None, deadline, on_retry)

    def post_json(
        self,
        path: str,
        body: Mapping[str, Any] | bytes,
        *,
        deadline: float | None = None,
        on_retry: Callable[[RetryNotice], None] | None = None,
    ) -> Awaitable[Any]:
        """The JSON body of a POST of ``body``; retryable failures are retried per the policy.

        ``body`` is a mapping to encode, or JSON already encoded (sent as given). ``deadline``
        (event-loop time) stops retrying when the next wait would pass it; ``on_retry`` hears of
        each retry. (It returns the request's coroutine rather than being one: a coroutine
        fewer alive across every model call.)
        """
        return self._json("POST", path, _encode(body), deadline, on_retry)

    async def _json(
        self,
        method: str,
        path: str,
        content: bytes | None,
        deadline: float | None = None,
        on_retry: Callable[[RetryNotice], None] | None = None,
        *,
        retrying: bool = False,
    ) -> Any:
        """One attempt; the first (``retrying`` false) hands a failure to the retries, so a call
        that succeeds at once (nearly every one) builds nothing for them."""
        started = 0.0 if retrying else asyncio.get_running_loop().time()
        try:
            self._check_open()
            try:
                status, headers, data = await self._engine.exchange(method, path, method, content)
            except httpx.HTTPError as exc:
                raise self._transport_error(exc) from None
            if (listener := heard_headers.get()) is not None:
                listener(headers)
            return self._decoded(status, headers, data)
        except AgentError as error:
            if retrying:
                raise
            return await retry_failed(
                error,
                lambda: self._json(method, path, content, retrying=True),
                self.retry,
                started=started,
                deadline=deadline,
                on_retry=on_retry,
            )

    async def post_sse(
        self, path: str, body: Mapping[str, Any] | bytes
    ) -> AsyncGenerator[SseEvent, None]:
        """Server-sent events of one streaming POST of ``body`` (a mapping, or encoded JSON).

        Not retried here: what counts is whether the *caller* has shown anything yet, so the
        wire clients retry whole attempts with :func:`~agent_plugin.providers.retry.retry_stream`.
        A non-2xx answer raises its classified error before any event; a failure while reading
        is a Transport error. The request is sent on the first ``anext``. This is an async
        generator: a caller that stops early should ``aclose()`` it (or use
        :func:`contextlib.aclosing`) to free the connection at once.
        """
        content = _encode(body)
        self._check_open()
        try:
            response = await self._engine.open("POST", path, "SSE", content)
        except httpx.HTTPError as exc:
            raise self._transport_error(exc) from None
        if (listener := heard_headers.get()) is not None:
            listener(response.headers)
        if not 200 <= response.status < 300:
            try:
                text = _text(await response.read(), response.headers)
            except httpx.HTTPError as exc:
                raise self._transport_error(exc) from None
            finally:
                await response.aclose()
            raise self._status_error(response.status, text, response.headers)
        chunks = response.chunks()
        lines = sse_lines(chunks)
        events = iter_sse(lines)
        try:
            while True:
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    return
                except httpx.HTTPError as exc:
                    raise self._transport_error(exc) from None
                yield event
        except GeneratorExit:
            # the caller stopped reading, normally at the stream's end marker: read what is
            # left of the body, if it has not all arrived, so the connection goes back to the
            # pool, not to waste
            if not response.complete():
                await _drain(events)
            raise
        finally:
            await _close_stream(response, chunks, lines, events)

    def _check_open(self) -> None:
        if self._closed:
            raise AgentError(
                ErrorKind.INTERNAL, f"the {self.provider} client is closed", provider=self.provider
            )

    def _decoded(self, status: int, headers: Mapping[str, str], data: bytes) -> Any:
        """The JSON value of a 2xx answer's body; the classified error of any other answer."""
        if not 200 <= status < 300:
            raise self._status_error(status, _text(data, headers), headers)
        try:
            return json.loads(data)
        except _JSON_ERRORS as exc:
            text = self._scrub(_text(data, headers).strip())
            raise AgentError(
                ErrorKind.DECODE,
                f"{self.provider} answered {status} with a body that is not JSON"
                f" ({exc}): {text[:BODY_LIMIT]}",
                provider=self.provider,
                status=status,
                body=text,
            ) from None

    def scrub_error(self, error: AgentError) -> AgentError:
        """``error`` without the secret in its message or body (servers echo keys back).

        The same error when there is nothing to remove. A body cut at its length limit may end
        in the first part of the secret; that part goes too.
        """
        if not self._secrets:
            return error
        message, body = error.message, error.body
        for secret in self._secrets:
            message = _scrub_cut(message, secret)
            if body is not None:
                body = _scrub_cut(body, secret)
        if message == error.message and body == error.body:
            return error
        return AgentError(
            error.kind,
            message,
            provider=error.provider,
            status=error.status,
            retry_after=error.retry_after,
            body=body,
        )

    def _scrub(self, text: str) -> str:
        """``text`` without the transport's secrets (the key, the Basic token of the URL's
        password) and the known ones."""
        for secret in self._secrets or (None,):
            text = scrub(text, secret)
        return text

    def _status_error(self, status: int, body: str, headers: Mapping[str, str]) -> AgentError:
        """The error for a non-2xx answer: "<provider> answered <status>: <≤500 chars of body>",
        of the kind the status and the body say together (:func:`failure_kind`), with a note
        on what that kind means when it has one."""
        text = self._scrub(body.strip())
        kind = failure_kind(status, text)
        note = failure_note(kind)
        message = f"{self.provider} answered {status}" + (f" ({note})" if note else "")
        message += f": {text[:BODY_LIMIT]}" if text else ""
        return AgentError(
            kind,
            message,
            provider=self.provider,
            status=status,
            retry_after=parse_retry_after(headers),
            body=text,
        )

    def _transport_error(self, exc: httpx.HTTPError) -> AgentError:
        kind = ErrorKind.DECODE if isinstance(exc, httpx.DecodingError) else ErrorKind.TRANSPORT
        what = type(exc).__name__
        detail = self._scrub(str(exc))
        message = f"{self.provider} request failed ({what})" + (f": {detail}" if detail else "")
        return AgentError(kind, message, provider=self.provider)


_DEFAULT_HEADERS: Mapping[str, str] = {
    "accept": "*/*",
    "accept-encoding": "gzip, deflate",
    "user-agent": "fastapi-agent-plugin",
}


_DRAIN_SECONDS: Final = 0.5
"""How long a stream the caller left is read on, hoping to reuse its connection."""


async def _drain(events: AsyncGenerator[SseEvent, None]) -> None:
    with contextlib.suppress(Exception):
        async with asyncio.timeout(_DRAIN_SECONDS):
            async for _ in events:
                pass


async def _close_stream(
    response: Opened,
    chunks: AsyncIterator[bytes],
    lines: AsyncGenerator[str, None],
    events: AsyncGenerator[SseEvent, None],
) -> None:
    # each generator closed here, outermost first: one left unfinished would be closed by the
    # event loop's finalizer instead, with a wake-up of the loop and a task of its own
    await events.aclose()
    await lines.aclose()
    close = getattr(chunks, "aclose", None)
    if close is not None:
        await close()
    await response.aclose()


def _text(body: bytes, headers: Mapping[str, str]) -> str:
    """An answer's body as text: in the charset its content type names, else UTF-8 (a byte
    that does not decode becomes U+FFFD)."""
    _, _, params = headers.get("content-type", "").partition(";")
    charset = "utf-8"
    for param in params.split(";"):
        name, _, value = param.strip().partition("=")
        if name.lower() == "charset" and value:
            charset = value.strip("\"' ")
    try:
        return body.decode(charset, "replace")
    except LookupError:
        return body.decode("utf-8", "replace")


def _engine_for(
    transport: httpx.AsyncBaseTransport,
    base_url: str,
    headers: Mapping[str, Mapping[str, str]],
    timeout: float,
) -> Engine:
    """The engine for ``transport``: its aiohttp session for an httpx-aiohttp transport (such
    a transport exists only once httpx_aiohttp was imported), httpx's requests otherwise."""
    module = sys.modules.get("httpx_aiohttp")
    if module is not None and isinstance(transport, module.AiohttpTransport):
        from agent_plugin.providers.aiohttp_engine import AiohttpEngine

        return AiohttpEngine(transport, base_url, headers, timeout)
    return HttpxEngine(transport, base_url, headers, timeout)


# A secret cut short by a length limit leaves its first characters at the end of a text; this many
# or more of them are scrubbed too (fewer are only the public key prefix, like "sk-ant-").
_MIN_CUT_SECRET: Final = 8


def _scrub_cut(text: str, secret: str) -> str:
    text = scrub(text, secret)
    for size in range(min(len(secret) - 1, len(text)), _MIN_CUT_SECRET - 1, -1):
        if text.endswith(secret[:size]):
            return text[:-size] + REDACTED
    return text


def _basic_token(url: httpx.URL) -> str:
    """The Basic credentials of ``url``'s user and password, as httpx and aiohttp send them."""
    return base64.b64encode(f"{url.username}:{url.password}".encode()).decode("ascii")


def _proxy_secrets(proxy: str | None) -> list[str]:
    """What to scrub of a proxy URL's credentials: its password and their Basic token (each
    when at least :data:`_MIN_CUT_SECRET` long, so common text is never scrubbed)."""
    if proxy is None:
        return []
    try:
        url = httpx.URL(proxy)
    except httpx.InvalidURL:
        return []
    if not url.password:
        return []
    found = [url.password, _basic_token(url)]
    return [value for value in found if len(value) >= _MIN_CUT_SECRET]


def _encode(body: Mapping[str, Any] | bytes) -> bytes:
    return body if isinstance(body, bytes) else dumps(body)
