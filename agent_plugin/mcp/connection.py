"""One MCP server's session in this process: :class:`MCPConnection`, the server's
:class:`~agent_plugin.toolsets.LiveToolset`, shared by every run of the process.

A supervisor task owns the SDK's ``Client``. It connects, lists the tools, then watches: for
``notifications/tools/list_changed`` (on the 2026 protocol it holds a ``subscriptions/listen``
stream open to receive it), and for the end of the connection (the subprocess's output ended,
the listen stream dropped, a call or a health probe found the connection closed, the HTTP
transport failed). Then it waits, 0.5 s doubling up to 30 s, and connects again; the last tool
list stays offered meanwhile. A call made while the next attempt is near waits for it; one made
while the server is far from back fails at once, with a message the model reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from types import TracebackType
from typing import Any, Final, Literal, Protocol, Self

import anyio
import httpx2
from mcp import Client, StdioServerParameters, types
from mcp.client import Transport
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.mcp.tools import MCPTool, exposed_name
from agent_plugin.redaction import register_secret, unregister_secret
from agent_plugin.tools import ToolEffect
from agent_plugin.toolsets import ToolsetHealth

__all__ = ["BACKOFF_FIRST", "BACKOFF_MAX", "Declaration", "MCPConnection", "State", "describe"]

logger = logging.getLogger("agent_plugin.mcp")

State = Literal["connecting", "up", "down", "closed"]

BACKOFF_FIRST: Final = 0.5
"""Seconds before the first reconnection attempt; each failed attempt doubles it."""
BACKOFF_MAX: Final = 30.0
"""The longest wait between two attempts."""

_MAX_PAGES: Final = 100
_SSE_READ_SECS: Final = 300.0


def _client_info() -> types.Implementation:
    try:
        number = version("fastapi-agent-plugin")
    except PackageNotFoundError:
        number = "0"
    return types.Implementation(name="fastapi-agent-plugin", version=number)


class Declaration(Protocol):
    """What a connection reads of its server's declaration: an :class:`~agent_plugin.mcp.MCPServer`
    (frozen: every member is a read-only property here)."""

    @property
    def name(self) -> str: ...
    @property
    def transport(self) -> Literal["stdio", "http"]: ...
    @property
    def command(self) -> str | None: ...
    @property
    def args(self) -> tuple[str, ...]: ...
    @property
    def cwd(self) -> str | None: ...
    @property
    def url(self) -> str | None: ...
    @property
    def protocol(self) -> Literal["auto", "legacy"]: ...
    @property
    def timeout(self) -> float: ...
    @property
    def connect_timeout(self) -> float: ...
    @property
    def required(self) -> bool: ...
    @property
    def prefix(self) -> str: ...

    def effect_for(
        self, tool_name: str, *, read_only: bool | None = None, destructive: bool | None = None
    ) -> ToolEffect: ...


class _Lost:
    """The end of one connection: set once, with the first reason given, which ``on_end``
    hears at once."""

    def __init__(self, on_end: Callable[[_Lost], None]) -> None:
        self.event = asyncio.Event()
        self.reason = ""
        self._on_end = on_end

    def set(self, reason: str) -> None:
        if not self.event.is_set():
            self.reason = reason
            self.event.set()
            self._on_end(self)


class _WatchedRead:
    """A transport's read stream that reports its end: how a server whose process exited (or
    closed its output) is noticed while nobody is calling it."""

    def __init__(self, inner: Any, lost: _Lost, reason: str) -> None:
        self._inner = inner
        self._lost = lost
        self._reason = reason

    @property
    def last_context(self) -> Any:
        """The sender's context variables, for the SDK's dispatcher (when the stream has it)."""
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._lost.set(self._reason)
            raise
        return item

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedRead:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self._inner.__anext__()
        except StopAsyncIteration:
            self._lost.set(self._reason)
            raise
        return item

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        result: bool | None = await self._inner.__aexit__(exc_type, exc_val, exc_tb)
        return result


class _WatchedTransport(contextlib.AbstractAsyncContextManager[Any]):
    """A transport whose read stream is a :class:`_WatchedRead`."""

    def __init__(self, inner: Transport, lost: _Lost, reason: str) -> None:
        self._inner = inner
        self._lost = lost
        self._reason = reason

    async def __aenter__(self) -> tuple[_WatchedRead, Any]:
        read, write = await self._inner.__aenter__()
        return _WatchedRead(read, self._lost, self._reason), write

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        return await self._inner.__aexit__(exc_type, exc_val, exc_tb)


class MCPConnection:
    """The live connection to one :class:`~agent_plugin.mcp.MCPServer`: its tools, its calls,
    its health, reconnected with backoff when it drops. Built by :meth:`MCPServer.start
    <agent_plugin.mcp.MCPServer.start>` with the HTTP ``headers`` or the subprocess's ``env``
    it resolved, and the ``secrets`` among them (redacted until :meth:`aclose`); :meth:`aclose`
    ends the session and the subprocess.
    """

    def __init__(
        self,
        server: Declaration,
        *,
        headers: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        secrets: Sequence[str] = (),
    ) -> None:
        self.server = server
        self._headers = dict(headers or {})
        self._env = dict(env or {})
        self._secrets = [value for value in secrets if register_secret(value)]
        self._tools: tuple[MCPTool, ...] = ()
        self._fingerprints: tuple[tuple[str, str, str, str], ...] = ()
        self._revision = 0
        self._skipped: tuple[str, ...] = ()
        self._state: State = "connecting"
        self._reason = "not connected yet"
        self._client: Client | None = None
        self._lost: _Lost | None = None
        self._protocol: str | None = None
        self._connects = 0
        self._retry_at: float | None = None
        self._up = asyncio.Event()
        self._tried = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return (
            f"MCPConnection({self.server.name!r}, {self.server.transport}, {self._state}, "
            f"tools={[tool.name for tool in self._tools]!r})"
        )

    # --- the LiveToolset protocol -------------------------------------------------------

    @property
    def name(self) -> str:
        return f"mcp:{self.server.name}"

    @property
    def revision(self) -> int:
        return self._revision

    @property
    def state(self) -> State:
        return self._state

    def tools(self) -> Sequence[MCPTool]:
        """The server's tools as last listed, sorted by name (kept while it reconnects)."""
        return self._tools

    async def health(self) -> ToolsetHealth:
        """UP when connected and a ``tools/list`` probe is answered; else DOWN with the reason."""
        details: dict[str, Any] = {
            "transport": self.server.transport,
            "tools": len(self._tools),
            "connects": self._connects,
        }
        if self.server.url is not None:
            details["url"] = self.server.url.split("?", 1)[0]
        if self._skipped:
            details["skipped"] = list(self._skipped)
        client = self._client
        if client is None or self._state != "up":
            return ToolsetHealth(False, {**details, "state": self._state, "error": self._reason})
        details["protocol"] = self._protocol
        try:
            await client.list_tools(cache_mode="bypass")
        except Exception as error:  # the probe's failure is the report
            reason = describe(error)
            if _closed(error):
                self._lose(client, reason)
            return ToolsetHealth(False, {**details, "state": "failing", "error": reason})
        return ToolsetHealth(True, details)

    async def aclose(self) -> None:
        """Stop reconnecting, close the session and end the subprocess."""
        self._state = "closed"
        self._reason = "the connection is closed"
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for secret in self._secrets:
            unregister_secret(secret)
        self._secrets = []

    # --- starting and calling -----------------------------------------------------------

    async def start(self) -> None:
        """Start the supervisor and wait until connected, at most ``connect_timeout`` (trying
        again with backoff meanwhile); a ``required`` server that is not up by then is an
        ``unavailable`` error."""
        self._task = asyncio.create_task(self._supervise(), name=f"agent_plugin {self.name}")
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.server.connect_timeout):
                    await self._up.wait()
        except BaseException:
            await self.aclose()
            raise
        if self._state == "up":
            return
        reason = self._reason if self._tried.is_set() else "it did not answer in time"
        if self.server.required:
            await self.aclose()
            raise AgentError(
                ErrorKind.UNAVAILABLE,
                f"the required MCP server {self.server.name!r} cannot be reached: {reason}",
            )
        logger.warning(
            "MCP server %r cannot be reached (%s); trying again in the background",
            self.server.name,
            reason,
        )

    async def call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Call the server's tool ``name`` (its own name) within the server's ``timeout``."""
        client = await self._connected()
        timeout = self.server.timeout
        label = f"the MCP server {self.server.name!r}"
        try:
            return await client.call_tool(name, arguments, read_timeout_seconds=timeout)
        except MCPError as error:
            if error.code == types.REQUEST_TIMEOUT:
                raise AgentError.tool(f"{label} did not answer within {timeout:g} s") from None
            if error.code != types.CONNECTION_CLOSED:
                raise AgentError.tool(f"{label} refused the call: {error.error.message}") from None
            self._lose(client, "the connection closed during a call")
            raise AgentError.tool(
                f"the connection to {label} closed during the call, so whether the tool ran "
                "is unknown; it is being reconnected"
            ) from None
        except Exception as error:  # a broken session (HTTP) or an answer that is not MCP
            reason = describe(error)
            if _closed(error):
                self._lose(client, reason)
            raise AgentError.tool(f"calling {label} failed: {reason}") from None

    async def _connected(self) -> Client:
        """The client when connected; waits for an attempt that is under way or near."""
        client = self._client
        if client is not None and self._state == "up":
            return client
        wait = self._wait_for_attempt()
        if wait is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._up.wait()
            client = self._client
            if client is not None and self._state == "up":
                return client
        raise AgentError.tool(
            f"the MCP server {self.server.name!r} is not connected ({self._reason}); try again "
            "later"
        )

    def _wait_for_attempt(self) -> float | None:
        """How long a call may wait for the connection, or None when it should not wait."""
        limit = self.server.connect_timeout
        if self._state == "connecting":
            return limit
        if self._state == "down" and self._retry_at is not None:
            due = self._retry_at - asyncio.get_running_loop().time()
            if due <= limit:
                return max(due, 0.0) + limit
        return None

    def _lose(self, client: Client, reason: str) -> None:
        """End the connection ``client`` belongs to (if it is the current one)."""
        if self._client is client and self._lost is not None:
            self._lost.set(reason)

    def _ended(self, lost: _Lost) -> None:
        """The connection of ``lost`` ended: stop offering it to calls at once (the supervisor
        closes it and schedules the next attempt)."""
        if self._lost is lost and self._state == "up":
            self._client = None
            self._up.clear()
            self._state = "down"
            self._reason = lost.reason
            self._retry_at = asyncio.get_running_loop().time() + BACKOFF_FIRST

    # --- the supervisor -----------------------------------------------------------------

    async def _supervise(self) -> None:
        attempt = 0
        loop = asyncio.get_running_loop()
        while True:
            self._state = "connecting"
            self._retry_at = None
            lost = _Lost(self._ended)
            self._lost = lost
            connects = self._connects
            try:
                await self._session(lost)
                reason = lost.reason or "the connection ended"
            except Exception as error:  # every failure is a reason to try again later
                reason = describe(error)
            finally:
                self._client = None
                self._up.clear()
            was_up = self._connects > connects
            self._state = "down"
            self._reason = reason
            self._tried.set()
            if was_up:
                attempt = 0
                logger.warning("MCP server %r disconnected: %s", self.server.name, reason)
            else:
                logger.info("MCP server %r: connecting failed: %s", self.server.name, reason)
            delay = min(BACKOFF_FIRST * 2**attempt, BACKOFF_MAX)
            attempt += 1
            self._retry_at = loop.time() + delay
            await asyncio.sleep(delay)

    async def _session(self, lost: _Lost) -> None:
        """One connection, from connecting to its end (returns when ``lost`` is set)."""
        self._changed.clear()
        async with contextlib.AsyncExitStack() as stack:
            client = Client(
                _WatchedTransport(await self._transport(stack), lost, self._end_reason()),
                mode=self.server.protocol,
                message_handler=self._on_message,
                read_timeout_seconds=self.server.connect_timeout,
                client_info=_client_info(),
            )
            await stack.enter_async_context(client)
            self._install(await self._list(client))
            self._client = client
            self._protocol = client.protocol_version
            self._connects += 1
            self._state = "up"
            self._up.set()
            self._tried.set()
            logger.info(
                "MCP server %r connected (%s, protocol %s): %d tools",
                self.server.name,
                self.server.transport,
                self._protocol,
                len(self._tools),
            )
            async with anyio.create_task_group() as group:
                group.start_soon(self._follow_changes, client, lost)
                capabilities = client.server_capabilities.tools
                if capabilities is not None and capabilities.list_changed:
                    group.start_soon(self._listen, client, lost)
                await lost.event.wait()
                group.cancel_scope.cancel()

    async def _transport(self, stack: contextlib.AsyncExitStack) -> Transport:
        server = self.server
        if server.command is not None:
            parameters = StdioServerParameters(
                command=server.command,
                args=list(server.args),
                env=self._env or None,
                cwd=server.cwd,
            )
            return stdio_client(parameters)
        assert server.url is not None
        timeout = httpx2.Timeout(server.connect_timeout, read=max(server.timeout, _SSE_READ_SECS))
        http = httpx2.AsyncClient(headers=self._headers, timeout=timeout)
        await stack.enter_async_context(http)
        return streamable_http_client(server.url, http_client=http)

    def _end_reason(self) -> str:
        if self.server.transport == "stdio":
            return "the server's process exited or closed its output"
        return "the HTTP connection ended"

    async def _list(self, client: Client) -> list[types.Tool]:
        tools: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools

    def _install(self, specs: list[types.Tool]) -> None:
        """Make ``specs`` the offered tools; the revision moves only when they changed.

        Two tools offered under one name is a ``config`` error (the listing is refused)."""
        built: dict[str, MCPTool] = {}
        skipped: list[str] = []
        for spec in specs:
            name = exposed_name(self.server.prefix, spec.name)
            if name is None:
                skipped.append(f"{spec.name}: the name is too long for a tool name")
                continue
            if name in built:
                raise AgentError.config(
                    f"MCP server {self.server.name!r}: the tools {built[name].remote_name!r} "
                    f"and {spec.name!r} would both be called {name!r}"
                )
            hints = spec.annotations
            effect = self.server.effect_for(
                spec.name,
                read_only=hints.read_only_hint if hints is not None else None,
                destructive=hints.destructive_hint if hints is not None else None,
            )
            try:
                built[name] = MCPTool(spec, name=name, effect=effect, call=self.call)
            except AgentError as error:
                skipped.append(f"{spec.name}: {error.message}")
        for problem in skipped:
            logger.warning("MCP server %r: tool left out: %s", self.server.name, problem)
        self._skipped = tuple(skipped)
        tools = tuple(sorted(built.values(), key=lambda tool: tool.name))
        fingerprints = tuple(tool.fingerprint() for tool in tools)
        if fingerprints != self._fingerprints:
            self._tools = tools
            self._fingerprints = fingerprints
            self._revision += 1

    async def _on_message(self, message: Any) -> None:
        """The SDK's message handler: notes a changed tool list."""
        if isinstance(message, types.ToolListChangedNotification):
            self._changed.set()
        elif isinstance(message, Exception):
            logger.debug("MCP server %r: transport error: %s", self.server.name, message)

    async def _follow_changes(self, client: Client, lost: _Lost) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            try:
                self._install(await self._list(client))
            except AgentError as error:
                logger.warning("MCP server %r: new tool list refused: %s", self.server.name, error)
            except Exception as error:  # listing failed: the connection may be gone
                if _closed(error):
                    lost.set(describe(error))
                    return
                logger.warning("MCP server %r: relisting failed: %s", self.server.name, error)

    async def _listen(self, client: Client, lost: _Lost) -> None:
        """Hold a 2026 ``subscriptions/listen`` stream for tool list changes (a 2025 session
        receives them without one)."""
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                # a change between the first listing and the subscription's ack came before
                # the stream could carry it (listen has no replay): list once more
                self._changed.set()
                async for _event in subscription:
                    self._changed.set()
        except ListenNotSupportedError:
            return
        except SubscriptionLost:
            lost.set("the server's listen stream dropped")
            return
        except (MCPError, TimeoutError) as error:
            if _closed(error):
                lost.set(describe(error))
            else:
                logger.info("MCP server %r: no listen stream: %s", self.server.name, error)
            return
        lost.set("the server ended its listen stream")


def _closed(error: BaseException) -> bool:
    """Whether ``error`` says the connection is gone (not just that one request failed)."""
    leaf = _leaf(error)
    if isinstance(leaf, MCPError):
        return leaf.code == types.CONNECTION_CLOSED
    gone = (httpx2.TransportError, OSError, anyio.BrokenResourceError, anyio.ClosedResourceError)
    return isinstance(leaf, gone) or (isinstance(leaf, RuntimeError) and "context" in str(leaf))


def _leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def describe(error: BaseException) -> str:
    """A short reason for ``error``: the first failure inside exception groups, with its kind
    when its message alone would not say it."""
    leaf = _leaf(error)
    if isinstance(leaf, MCPError):
        return leaf.error.message
    if isinstance(leaf, AgentError):
        return leaf.message
    text = str(leaf).strip()
    kind = type(leaf).__name__
    return f"{kind}: {text}" if text else kind
