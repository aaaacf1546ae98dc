"""How a provider transport's requests reach the network: an :class:`Engine`.

:class:`~agent_plugin.providers.http.HttpTransport` keeps the rules (retries, typed errors,
SSE); an engine only sends one request and hands back the answer. Two engines exist:
:class:`HttpxEngine` runs any :class:`httpx.AsyncBaseTransport` (httpx's own, with HTTP/2 if
asked; ``httpx.MockTransport``; a user's own), and the default,
:class:`~agent_plugin.providers.aiohttp_engine.AiohttpEngine`, sends through the aiohttp session
behind an ``httpx_aiohttp.AiohttpTransport`` without building httpx's request and response
objects. Both report a failure as the :class:`httpx.HTTPError` httpx would raise, so the
transport classifies failures one way whatever the engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Final, NamedTuple, Protocol

import httpx

__all__ = ["DEFAULT_LIMITS", "Engine", "HttpxEngine", "Opened", "Reply"]

DEFAULT_LIMITS: Final = httpx.Limits(
    max_connections=1000, max_keepalive_connections=100, keepalive_expiry=5.0
)
"""The connection pool of a provider client: as the official OpenAI and Anthropic SDKs size it,
for hundreds of runs sharing one client."""


class Reply(NamedTuple):
    """A whole answer: its status, its headers (names compared case-insensitively) and its
    body, content-decoded."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class Opened(Protocol):
    """An answer whose body is still to be read (a stream)."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body, content-decoded, in pieces as they arrive."""
        ...

    async def read(self) -> bytes:
        """The whole body (of an error answer)."""
        ...

    def complete(self) -> bool:
        """Whether the whole body has arrived (the connection can go back to the pool)."""
        ...

    async def aclose(self) -> None:
        """Give the connection back to the pool (or drop it, if the body was not read)."""
        ...


class Engine(Protocol):
    """Sends requests to one base URL with a fixed set of headers per kind of request.

    ``kind`` names the header set: ``"GET"``, ``"POST"`` (a JSON body) or ``"SSE"`` (a JSON
    body, an event stream asked for). Failures raise :class:`httpx.HTTPError`.
    """

    @property
    def transport(self) -> httpx.AsyncBaseTransport:
        """The httpx transport behind the engine."""
        ...

    async def exchange(self, method: str, path: str, kind: str, body: bytes | None) -> Reply:
        """Send one request and read its whole answer."""
        ...

    async def open(self, method: str, path: str, kind: str, body: bytes | None) -> Opened:
        """Send one request and return as soon as the answer's head has arrived."""
        ...

    async def aclose(self) -> None:
        """Close the pooled connections."""
        ...


class HttpxEngine:
    """An engine over any httpx transport: an :class:`httpx.Request` per request, sent to the
    transport directly (an ``AsyncClient``'s cookies, auth flows and redirects are not needed).
    """

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport,
        base_url: str,
        headers: Mapping[str, Mapping[str, str]],
        timeout: float,
    ) -> None:
        self.transport = transport
        self._base_url = base_url
        self._headers = {kind: httpx.Headers(values) for kind, values in headers.items()}
        self._extensions = {"timeout": httpx.Timeout(timeout).as_dict()}
        self._urls: dict[str, httpx.URL] = {}

    def _request(self, method: str, path: str, kind: str, body: bytes | None) -> httpx.Request:
        url = self._urls.get(path)
        if url is None:  # parsed once per path (httpx parses a string on every request)
            url = self._urls[path] = httpx.URL(self._base_url + path)
        return httpx.Request(
            method, url, headers=self._headers[kind], content=body, extensions=self._extensions
        )

    async def exchange(self, method: str, path: str, kind: str, body: bytes | None) -> Reply:
        response = await self.transport.handle_async_request(
            self._request(method, path, kind, body)
        )
        try:
            data = await response.aread()
        finally:
            await response.aclose()
        return Reply(response.status_code, response.headers, data)

    async def open(self, method: str, path: str, kind: str, body: bytes | None) -> Opened:
        response = await self.transport.handle_async_request(
            self._request(method, path, kind, body)
        )
        return _HttpxOpened(response)

    async def aclose(self) -> None:
        await self.transport.aclose()


class _HttpxOpened:
    __slots__ = ("_done", "_response")

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._done = False

    @property
    def status(self) -> int:
        return self._response.status_code

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers

    async def chunks(self) -> AsyncIterator[bytes]:
        body = self._response.aiter_bytes()
        try:
            async for chunk in body:
                yield chunk
            self._done = True  # (httpx's is_stream_consumed is set when reading starts)
        finally:  # closed here, not by the event loop's finalizer
            close = getattr(body, "aclose", None)
            if close is not None:
                await close()

    async def read(self) -> bytes:
        return await self._response.aread()

    def complete(self) -> bool:
        return self._done

    async def aclose(self) -> None:
        await self._response.aclose()
