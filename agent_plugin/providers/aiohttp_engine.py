"""The default engine: aiohttp, behind httpx-aiohttp's transport.

:func:`default_transport` is what a wire client sends with unless it is given a transport: an
``httpx_aiohttp.AiohttpTransport`` (so it is an httpx transport like any other) whose aiohttp
session keeps one pool of up to ``limits.max_connections`` connections, checks certificates
as httpx does (certifi, or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``), and goes through the proxy
the environment names for the base URL (:func:`~agent_plugin.providers.proxies.environment_proxy`;
a SOCKS proxy, which aiohttp does not speak, gets httpx's own transport instead).

:class:`AiohttpEngine` sends through that session (or the session of any ``AiohttpTransport``
given as ``transport=``) directly: no :class:`httpx.Request` or :class:`httpx.Response` is
built, and the body is read once, already decompressed. aiohttp's failures are raised as the
:class:`httpx.HTTPError` httpx would raise for them. aiohttp loads with the first client that
uses it, not with ``import agent_plugin``.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Final

import aiohttp
import httpx
from aiohttp.http_exceptions import ContentEncodingError
from httpx_aiohttp import AiohttpTransport
from multidict import CIMultiDict
from yarl import URL

from agent_plugin.providers.engines import DEFAULT_LIMITS, Reply
from agent_plugin.providers.proxies import environment_proxy

__all__ = ["AiohttpEngine", "default_transport"]

_AIOHTTP_PROXIES: Final = frozenset({"http", "https"})
_BROKEN: Final = (
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientPayloadError,
    aiohttp.ClientResponseError,
)


def default_transport(
    base_url: str,
    *,
    verify: bool | object = True,
    limits: httpx.Limits = DEFAULT_LIMITS,
    trust_env: bool = True,
) -> httpx.AsyncBaseTransport:
    """The transport a wire client gets by default, for requests to ``base_url``.

    ``verify`` is ``True`` (certificates checked), ``False`` or an :class:`ssl.SSLContext`;
    ``trust_env`` reads the proxy variables and ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``. Of
    ``limits``, aiohttp applies ``max_connections`` (``None``: no bound) and
    ``keepalive_expiry``; it has no separate bound on idle connections.
    """
    proxy = environment_proxy(base_url) if trust_env else None
    if proxy is not None and httpx.URL(proxy).scheme not in _AIOHTTP_PROXIES:
        return httpx.AsyncHTTPTransport(
            verify=verify,  # type: ignore[arg-type]
            trust_env=trust_env,
            limits=limits,
            proxy=proxy,
        )
    context = httpx.create_ssl_context(verify=verify, trust_env=trust_env)  # type: ignore[arg-type]

    def session() -> aiohttp.ClientSession:
        # made on the first request, inside the event loop that will use it
        connector = aiohttp.TCPConnector(
            limit=limits.max_connections or 0,
            keepalive_timeout=limits.keepalive_expiry or 0.0,
            ssl=context,
        )
        # a provider call keeps no cookies and reads no .netrc: the proxy is chosen above
        return aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False
        )

    return AiohttpTransport(
        verify=context,
        limits=limits,
        proxy=httpx.Proxy(proxy) if proxy is not None else None,
        client=session,
    )


class AiohttpEngine:
    """Sends requests through the aiohttp session of an ``AiohttpTransport``."""

    def __init__(
        self,
        transport: AiohttpTransport,
        base_url: str,
        headers: Mapping[str, Mapping[str, str]],
        timeout: float,
    ) -> None:
        self.transport = transport
        self._base_url = base_url
        self._headers = {kind: CIMultiDict(values) for kind, values in headers.items()}
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=timeout, sock_connect=timeout, sock_read=timeout
        )
        self._urls: dict[str, URL] = {}
        proxy = transport.proxy
        self._proxy: URL | None = None
        self._proxy_headers: CIMultiDict[str] | None = None
        if proxy is not None:
            self._proxy = URL(str(proxy.url))
            self._proxy_headers = _proxy_headers(proxy)
            credentials = self._proxy_headers.get("proxy-authorization")
            if credentials is not None and not base_url.startswith("https:"):
                # a plain-HTTP request goes to the proxy whole, its credentials with it
                # (aiohttp sends proxy_headers only with the CONNECT that opens an HTTPS tunnel)
                for values in self._headers.values():
                    values["proxy-authorization"] = credentials
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        session = self._session
        if session is None:
            # as AiohttpTransport does: make its session on first use, and keep it there
            client = self.transport.client
            if not isinstance(client, aiohttp.ClientSession):
                client = self.transport.client = self.transport.get_client()
            session = self._session = client
        return session

    def _request(
        self, method: str, path: str, kind: str, body: bytes | None
    ) -> Awaitable[aiohttp.ClientResponse]:
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = URL(self._base_url + path)
        return self._client().request(
            method,
            url,
            headers=self._headers[kind],
            data=body,
            allow_redirects=False,
            timeout=self._timeout,
            proxy=self._proxy,
            proxy_headers=self._proxy_headers,
        )

    async def exchange(self, method: str, path: str, kind: str, body: bytes | None) -> Reply:
        try:
            response = await self._request(method, path, kind, body)
            try:
                data = await response.read()
            finally:
                response.release()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise http_error(exc) from exc
        return Reply(response.status, response.headers, data)

    async def open(self, method: str, path: str, kind: str, body: bytes | None) -> _Opened:
        try:
            return _Opened(await self._request(method, path, kind, body))
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise http_error(exc) from exc

    async def aclose(self) -> None:
        await self.transport.aclose()


class _Opened:
    __slots__ = ("_response",)

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise http_error(exc) from exc

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise http_error(exc) from exc

    def complete(self) -> bool:
        return self._response.content.is_eof()

    async def aclose(self) -> None:
        # back to the pool when the body was read to its end; closed otherwise
        self._response.release()


def _proxy_headers(proxy: httpx.Proxy) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict(proxy.headers)
    if proxy.auth is not None and "proxy-authorization" not in headers:
        pair = ":".join(proxy.auth).encode()
        headers["proxy-authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
    return headers


def http_error(exc: BaseException) -> httpx.HTTPError:
    """The :class:`httpx.HTTPError` httpx raises for what aiohttp reported as ``exc``."""
    kind: type[httpx.HTTPError]
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        kind = httpx.ConnectTimeout
    elif isinstance(exc, TimeoutError):  # SocketTimeoutError, and any other
        kind = httpx.ReadTimeout
    elif isinstance(exc, aiohttp.ClientProxyConnectionError | aiohttp.ClientHttpProxyError):
        kind = httpx.ProxyError
    elif isinstance(exc, aiohttp.ClientConnectorError):
        kind = httpx.ConnectError
    elif isinstance(exc, aiohttp.ClientPayloadError) and _undecodable(exc):
        kind = httpx.DecodingError
    elif isinstance(exc, _BROKEN):
        kind = httpx.RemoteProtocolError  # the answer broke off, or was not HTTP
    elif isinstance(exc, aiohttp.ClientOSError | aiohttp.ClientConnectionResetError):
        kind = httpx.ReadError
    elif isinstance(exc, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        kind = httpx.UnsupportedProtocol
    else:
        kind = httpx.TransportError
    return kind(str(exc) or type(exc).__name__)


def _undecodable(exc: aiohttp.ClientPayloadError) -> bool:
    """Whether the payload failed to decompress (rather than arriving incomplete)."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ContentEncodingError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False
