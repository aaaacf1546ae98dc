"""HTTP plumbing shared by the wire clients: one pooled httpx client, errors, SSE, retries."""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from agent_plugin.errors import BODY_LIMIT, AgentError, ErrorKind
from agent_plugin.providers.retry import RetryNotice, RetryPolicy, parse_retry_after, retry_call

__all__ = ["HttpTransport", "SseEvent", "iter_sse", "redact"]

REDACTED = "<redacted>"


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` replaced."""
    if secret and secret in text:
        return text.replace(secret, REDACTED)
    return text


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


async def _sse_lines(chunks: AsyncIterator[bytes]) -> AsyncGenerator[str, None]:
    """The lines of an event stream: UTF-8, split at CRLF, LF or CR only, one leading BOM dropped.

    (``httpx``'s own line splitting also breaks at U+2028, form feeds and the like, which may
    appear raw inside a JSON string in a ``data:`` line.)
    """
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    buffer = ""
    started = False
    async for chunk in chunks:
        buffer += decoder.decode(chunk)
        if not started and buffer:
            started = True
            buffer = buffer.removeprefix("\ufeff")
        start = 0
        for match in _LINE_END.finditer(buffer):
            if match.end() == len(buffer) and match.group() == "\r":
                break  # a "\n" may follow in the next chunk
            yield buffer[start : match.start()]
            start = match.end()
        buffer = buffer[start:]
    buffer += decoder.decode(b"", final=True)
    if not started:
        buffer = buffer.removeprefix("\ufeff")
    lines = _LINE_END.split(buffer)
    if lines[-1] == "":
        lines.pop()
    for line in lines:
        yield line


class HttpTransport:
    """One pooled :class:`httpx.AsyncClient` for one provider, with retries and typed errors.

    Every failure leaves as an :class:`AgentError`: a non-2xx status is classified by
    :meth:`ErrorKind.from_http_status` with the provider's name, the status, ``Retry-After`` and
    at most 500 characters of the body; timeouts and connection failures are Transport; a body
    that is not JSON is Decode. ``secret`` is scrubbed from every message.
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
    ) -> None:
        self.provider = provider
        self.base_url = base_url.rstrip("/")
        self.retry = retry
        self._secret = secret
        self._client = httpx.AsyncClient(
            headers=dict(headers),
            timeout=httpx.Timeout(timeout),
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"HttpTransport(provider={self.provider!r}, base_url={self.base_url!r})"

    async def aclose(self) -> None:
        """Close the pooled connections."""
        await self._client.aclose()

    async def get_json(
        self,
        path: str,
        *,
        deadline: float | None = None,
        on_retry: Callable[[RetryNotice], None] | None = None,
    ) -> Any:
        """The JSON body of a GET, retried like :meth:`post_json`."""
        return await retry_call(
            lambda: self._request_json("GET", path, None),
            self.retry,
            deadline=deadline,
            on_retry=on_retry,
        )

    async def post_json(
        self,
        path: str,
        body: Mapping[str, Any],
        *,
        deadline: float | None = None,
        on_retry: Callable[[RetryNotice], None] | None = None,
    ) -> Any:
        """The JSON body of a POST of ``body``; retryable failures are retried per the policy.

        ``deadline`` (event-loop time) stops retrying when the next wait would pass it;
        ``on_retry`` hears of each retry.
        """
        content = _encode(body)
        return await retry_call(
            lambda: self._request_json("POST", path, content),
            self.retry,
            deadline=deadline,
            on_retry=on_retry,
        )

    async def post_sse(
        self,
        path: str,
        body: Mapping[str, Any],
        *,
        deadline: float | None = None,
        on_retry: Callable[[RetryNotice], None] | None = None,
    ) -> AsyncIterator[SseEvent]:
        """Server-sent events of a streaming POST.

        Opening the stream and reading its first event are retried like any call (a stream
        that fails before producing anything has shown the caller nothing); once the first
        event has been yielded nothing is retried, so a caller never sees content twice, and a
        failure surfaces as a Transport error. This is an async generator: a caller that stops
        early should ``aclose()`` it (or use :func:`contextlib.aclosing`) to free the connection
        at once.
        """
        content = _encode(body)
        response, lines, events, first = await retry_call(
            lambda: self._open_stream(path, content),
            self.retry,
            deadline=deadline,
            on_retry=on_retry,
        )
        try:
            if first is None:
                return
            yield first
            while True:
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    return
                except httpx.HTTPError as exc:
                    raise self._transport_error(exc) from None
                yield event
        finally:
            await _close_stream(response, lines, events)

    async def _request_json(self, method: str, path: str, content: bytes | None) -> Any:
        try:
            response = await self._client.request(
                method,
                self.base_url + path,
                content=content,
                headers=_JSON_HEADERS if content is not None else None,
            )
        except httpx.HTTPError as exc:
            raise self._transport_error(exc) from None
        if not response.is_success:
            raise self.status_error(response.status_code, response.text, response.headers)
        try:
            return json.loads(response.content)
        except (ValueError, RecursionError) as exc:
            snippet = redact(response.text.strip(), self._secret)[:BODY_LIMIT]
            raise AgentError(
                ErrorKind.DECODE,
                f"{self.provider} answered {response.status_code} with a body that is not JSON"
                f" ({exc}): {snippet}",
                provider=self.provider,
                status=response.status_code,
                body=snippet,
            ) from None

    async def _open_stream(self, path: str, content: bytes) -> _OpenStream:
        """Send the request and read the first event (None when the stream has none)."""
        request = self._client.build_request(
            "POST", self.base_url + path, content=content, headers=_SSE_HEADERS
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise self._transport_error(exc) from None
        if not response.is_success:
            try:
                text = (await response.aread()).decode("utf-8", "replace")
            except httpx.HTTPError as exc:
                raise self._transport_error(exc) from None
            finally:
                await response.aclose()
            raise self.status_error(response.status_code, text, response.headers)
        lines = _sse_lines(response.aiter_bytes())
        events = iter_sse(lines)
        try:
            first = await anext(events, None)
        except httpx.HTTPError as exc:
            await _close_stream(response, lines, events)
            raise self._transport_error(exc) from None
        except BaseException:
            await _close_stream(response, lines, events)
            raise
        return response, lines, events, first

    def status_error(
        self, status: int, body: str, headers: Mapping[str, str] | None = None
    ) -> AgentError:
        """The error for a non-2xx answer (also used for errors reported inside a stream)."""
        body = redact(body.strip(), self._secret)[:BODY_LIMIT]
        message = f"{self.provider} answered {status}" + (f": {body}" if body else "")
        return AgentError(
            ErrorKind.from_http_status(status),
            message,
            provider=self.provider,
            status=status,
            retry_after=parse_retry_after(headers) if headers is not None else None,
            body=body,
        )

    def _transport_error(self, exc: httpx.HTTPError) -> AgentError:
        kind = ErrorKind.DECODE if isinstance(exc, httpx.DecodingError) else ErrorKind.TRANSPORT
        what = type(exc).__name__
        detail = redact(str(exc), self._secret)
        message = f"{self.provider} request failed ({what})" + (f": {detail}" if detail else "")
        return AgentError(kind, message, provider=self.provider)


_JSON_HEADERS: Mapping[str, str] = {"content-type": "application/json"}
_SSE_HEADERS: Mapping[str, str] = {
    "content-type": "application/json",
    "accept": "text/event-stream",
}


_OpenStream = tuple[
    httpx.Response, AsyncGenerator[str, None], AsyncGenerator[SseEvent, None], SseEvent | None
]


async def _close_stream(
    response: httpx.Response,
    lines: AsyncGenerator[str, None],
    events: AsyncGenerator[SseEvent, None],
) -> None:
    await events.aclose()
    await lines.aclose()
    await response.aclose()


def _encode(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
