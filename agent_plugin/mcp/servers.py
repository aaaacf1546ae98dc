"""Declared MCP servers: :class:`MCPServer`, what to connect to and how its tools behave, from
code (:meth:`MCPServer.stdio`, :meth:`MCPServer.http`) or from ``[[agent.mcp_servers]]``
tables (:func:`configured_servers`).

A declaration is plain data and needs no MCP SDK; :meth:`MCPServer.start` imports the SDK and
opens the server's connection (:mod:`agent_plugin.mcp.connection`).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agent_plugin.errors import AgentError
from agent_plugin.tools import ToolEffect
from agent_plugin.toolsets import LiveToolset

__all__ = ["MCPServer", "ProtocolMode", "TransportKind", "configured_servers"]

TransportKind = Literal["stdio", "http"]
"""How the plugin reaches a server: a subprocess's stdin/stdout, or Streamable HTTP."""

ProtocolMode = Literal["auto", "legacy"]
"""``auto``: ask the server for the 2026 protocol and fall back to the 2025 handshake;
``legacy``: start with the 2025 handshake (for servers that mishandle the question)."""

CONFIG_TABLE: Final = "[[agent.mcp_servers]]"

_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
_PREFIX: Final = re.compile(r"[A-Za-z0-9_-]{0,32}")
_VARIABLE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEADER: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_STDIO_ONLY: Final = ("args", "env", "pass_env", "cwd")
_HTTP_ONLY: Final = ("headers", "headers_env")
_FILE_REFUSED: Final = {
    "headers": "a header in a file would put a secret in the file: name the environment "
    "variable that holds it in headers_env instead",
}


class MCPServer(BaseModel):
    """One MCP server the agent takes tools from: a stdio subprocess (``command`` and ``args``)
    or a Streamable HTTP endpoint (``url``, ``headers`` and ``headers_env``).

    * ``tool_prefix``: put before each of its tool names (default ``"<name>_"``; ``""`` for
      none). Names the model cannot use (characters other than letters, digits, ``_`` and
      ``-``) are written with ``_`` instead.
    * ``effect``: the :class:`~agent_plugin.tools.ToolEffect` of its tools (default
      ``external``: :meth:`ToolRules.ask_before_acting
      <agent_plugin.policy.ToolRules.ask_before_acting>` pauses before them);
      ``tool_effects`` overrides it per tool (keyed by the server's own tool name). Only when
      ``trusted`` do the server's annotations set a tool's effect: ``readOnlyHint`` makes it
      ``read_only``, ``destructiveHint`` false ``write``, true ``external``.
    * ``timeout``: seconds one call may take; ``connect_timeout``: seconds to wait for the
      connection at startup (and for each request while connecting).
    * ``required``: the app (or worker) does not start without it; otherwise a server that
      cannot be reached is a DOWN health component, retried with backoff.
    * stdio: the subprocess gets the MCP SDK's minimal environment (``PATH``, ``HOME``, ...),
      ``env`` (values) and ``pass_env`` (names of variables copied from the app's environment).
    * http: ``headers`` are sent as given; ``headers_env`` maps a header to the environment
      variable that holds its value (read at startup, redacted everywhere).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict, repr=False)
    pass_env: tuple[str, ...] = ()
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    headers_env: dict[str, str] = Field(default_factory=dict)
    tool_prefix: str | None = None
    effect: ToolEffect = ToolEffect.EXTERNAL
    tool_effects: dict[str, ToolEffect] = Field(default_factory=dict)
    trusted: bool = False
    timeout: float = Field(default=30.0, gt=0, le=86_400)
    connect_timeout: float = Field(default=10.0, gt=0, le=600)
    required: bool = False
    protocol: ProtocolMode = "auto"

    @classmethod
    def stdio(
        cls,
        name: str,
        command: str,
        args: Iterable[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        pass_env: Iterable[str] = (),
        cwd: str | None = None,
        tool_prefix: str | None = None,
        effect: ToolEffect | str = ToolEffect.EXTERNAL,
        tool_effects: Mapping[str, ToolEffect | str] | None = None,
        trusted: bool = False,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        required: bool = False,
        protocol: ProtocolMode = "auto",
    ) -> MCPServer:
        """A server the plugin runs as a subprocess and talks to over its stdin and stdout."""
        return cls.declare(
            name=name,
            command=command,
            args=tuple(args),
            env=dict(env or {}),
            pass_env=tuple(pass_env),
            cwd=cwd,
            tool_prefix=tool_prefix,
            effect=effect,
            tool_effects=dict(tool_effects or {}),
            trusted=trusted,
            timeout=timeout,
            connect_timeout=connect_timeout,
            required=required,
            protocol=protocol,
        )

    @classmethod
    def http(
        cls,
        name: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        headers_env: Mapping[str, str] | None = None,
        tool_prefix: str | None = None,
        effect: ToolEffect | str = ToolEffect.EXTERNAL,
        tool_effects: Mapping[str, ToolEffect | str] | None = None,
        trusted: bool = False,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        required: bool = False,
        protocol: ProtocolMode = "auto",
    ) -> MCPServer:
        """A server reached over Streamable HTTP at ``url`` (``https://.../mcp``)."""
        return cls.declare(
            name=name,
            url=url,
            headers=dict(headers or {}),
            headers_env=dict(headers_env or {}),
            tool_prefix=tool_prefix,
            effect=effect,
            tool_effects=dict(tool_effects or {}),
            trusted=trusted,
            timeout=timeout,
            connect_timeout=connect_timeout,
            required=required,
            protocol=protocol,
        )

    @classmethod
    def declare(cls, **values: Any) -> MCPServer:
        """Validate ``values`` into a server; a ``config`` :class:`AgentError` says what is
        wrong, naming the server."""
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            label = f"MCP server {values.get('name')!r}"
            raise AgentError.config(_describe(error, label)) from None

    # --- derived -----------------------------------------------------------------------

    @property
    def transport(self) -> TransportKind:
        return "stdio" if self.command is not None else "http"

    @property
    def prefix(self) -> str:
        """What its tool names start with."""
        return f"{self.name}_" if self.tool_prefix is None else self.tool_prefix

    def effect_for(
        self, tool_name: str, *, read_only: bool | None = None, destructive: bool | None = None
    ) -> ToolEffect:
        """The effect of the server's tool ``tool_name`` (its own name, without the prefix),
        given its annotations ``readOnlyHint`` and ``destructiveHint``."""
        override = self.tool_effects.get(tool_name)
        if override is not None:
            return override
        if self.trusted:
            if read_only is True:
                return ToolEffect.READ_ONLY
            if destructive is False:
                return ToolEffect.WRITE
            if destructive is True:
                return ToolEffect.EXTERNAL
        return self.effect

    def resolved_headers(self, environ: Mapping[str, str]) -> dict[str, str]:
        """``headers`` and the ``headers_env`` values read from ``environ``."""
        headers = dict(self.headers)
        for header, variable in self.headers_env.items():
            headers[header] = _required_variable(self, environ, variable, f"header {header}")
        return headers

    def resolved_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """``env`` and the ``pass_env`` variables copied from ``environ``."""
        env = dict(self.env)
        for variable in self.pass_env:
            env[variable] = _required_variable(self, environ, variable, "pass_env")
        return env

    # --- starting ----------------------------------------------------------------------

    async def start(self, environ: Mapping[str, str]) -> LiveToolset:
        """Connect (waiting at most ``connect_timeout``) and answer the live connection.

        Raises a ``config`` error when the MCP SDK is not installed or a variable is missing,
        and an ``unavailable`` one when a ``required`` server cannot be reached.
        """
        if importlib.util.find_spec("mcp") is None:
            raise AgentError.config(
                f"MCP server {self.name!r}: the MCP SDK is not installed: "
                "pip install 'fastapi-agent-plugin[mcp]'"
            )
        from agent_plugin.mcp.connection import MCPConnection

        headers = self.resolved_headers(environ) if self.transport == "http" else {}
        env = self.resolved_env(environ) if self.transport == "stdio" else {}
        secrets = [headers[name] for name in self.headers_env] + [env[v] for v in self.pass_env]
        connection = MCPConnection(self, headers=headers, env=env, secrets=secrets)
        await connection.start()
        return connection

    # --- validation --------------------------------------------------------------------

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if _NAME.fullmatch(value) is None:
            raise ValueError(
                "must be 1-32 letters, digits, '_' or '-', starting with a letter or digit"
            )
        return value

    @field_validator("tool_prefix")
    @classmethod
    def _check_prefix(cls, value: str | None) -> str | None:
        if value is not None and _PREFIX.fullmatch(value) is None:
            raise ValueError("must be at most 32 letters, digits, '_' or '-'")
        return value

    @field_validator("pass_env")
    @classmethod
    def _check_variables(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for variable in value:
            if _VARIABLE.fullmatch(variable) is None:
                raise ValueError(f"{variable!r} is not an environment variable name")
        return value

    @field_validator("headers_env")
    @classmethod
    def _check_header_variables(cls, value: dict[str, str]) -> dict[str, str]:
        for header, variable in value.items():
            if _HEADER.fullmatch(header) is None:
                raise ValueError(f"{header!r} is not a header name")
            if _VARIABLE.fullmatch(variable) is None:
                raise ValueError(f"{variable!r} (for {header}) is not an environment variable")
        return value

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, value: dict[str, str]) -> dict[str, str]:
        for header in value:
            if _HEADER.fullmatch(header) is None:
                raise ValueError(f"{header!r} is not a header name")
        return value

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip()
        try:
            parts = urlsplit(value)
            _ = parts.port
        except ValueError:
            raise ValueError("must be an http:// or https:// URL") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL")
        if parts.username is not None or parts.password is not None:
            raise ValueError(
                "must not carry credentials: send them in a header (headers_env names the "
                "environment variable that holds one)"
            )
        return value

    @model_validator(mode="after")
    def _check_transport(self) -> MCPServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (a stdio server) or url (an HTTP server)")
        if self.command is not None and not self.command.strip():
            raise ValueError("command must not be blank")
        given = self.model_fields_set
        wrong = _HTTP_ONLY if self.command is not None else _STDIO_ONLY
        misplaced = [key for key in wrong if key in given and getattr(self, key)]
        if misplaced:
            kind = "a stdio" if self.command is not None else "an HTTP"
            raise ValueError(f"{', '.join(misplaced)} cannot be given for {kind} server")
        return self


def configured_servers(tables: Sequence[Mapping[str, Any]]) -> list[MCPServer]:
    """The servers of the ``[[agent.mcp_servers]]`` tables (``AgentSettings.mcp_servers``).

    A table has the keys of :class:`MCPServer`, except ``headers`` (a file names the variables
    in ``headers_env``). A ``config`` error names the table and the key.
    """
    servers: list[MCPServer] = []
    for number, table in enumerate(tables, start=1):
        label = f"{CONFIG_TABLE} number {number} ({table.get('name', 'no name')!r})"
        for key, reason in _FILE_REFUSED.items():
            if key in table:
                raise AgentError.config(f"{label}: {key!r}: {reason}")
        try:
            servers.append(MCPServer.model_validate(dict(table)))
        except ValidationError as error:
            raise AgentError.config(_describe(error, label)) from None
    return servers


def _required_variable(
    server: MCPServer, environ: Mapping[str, str], variable: str, what: str
) -> str:
    value = environ.get(variable, "")
    if not value:
        raise AgentError.config(
            f"MCP server {server.name!r}: {what} comes from the environment variable "
            f"{variable}, which is not set"
        )
    return value


def _describe(error: ValidationError, label: str) -> str:
    problems = []
    for item in error.errors(include_url=False):
        where = ".".join(str(part) for part in item["loc"])
        message = str(item["msg"]).removeprefix("Value error, ")
        problems.append(f"{label}: {where + ': ' if where else ''}{message}")
    return "; ".join(problems)
