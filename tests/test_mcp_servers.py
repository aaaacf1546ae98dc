"""Declared MCP servers: :class:`MCPServer` from code and from ``[[agent.mcp_servers]]`` tables,
the effects of their tools, the headers and environment they are given (issue 22)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_plugin.config import AgentSettings
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.mcp import MCPServer, configured_servers
from agent_plugin.tools import ToolEffect


def test_a_stdio_server_and_an_http_server_from_code() -> None:
    files = MCPServer.stdio("files", "python", ["server.py", "--quiet"], env={"LEVEL": "2"})
    assert (files.transport, files.command, files.args) == (
        "stdio",
        "python",
        ("server.py", "--quiet"),
    )
    assert (files.prefix, files.effect, files.timeout, files.required) == (
        "files_",
        ToolEffect.EXTERNAL,
        30.0,
        False,
    )
    docs = MCPServer.http(
        "docs", "https://docs.example.com/mcp", tool_prefix="", effect="read_only"
    )
    assert (docs.transport, docs.url, docs.prefix, docs.effect) == (
        "http",
        "https://docs.example.com/mcp",
        "",
        ToolEffect.READ_ONLY,
    )


def test_the_repr_shows_no_header_or_environment_value() -> None:
    server = MCPServer.http(
        "docs", "https://x.example/mcp", headers={"Authorization": "Bearer zzz"}
    )
    assert "zzz" not in repr(server)
    assert "secret-value" not in repr(MCPServer.stdio("s", "run", env={"TOKEN": "secret-value"}))


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"name": "bad name", "command": "x"}, "name: must be 1-32 letters"),
        ({"name": "both", "command": "x", "url": "https://a/mcp"}, "give either command"),
        ({"name": "neither"}, "give either command"),
        ({"name": "blank", "command": " "}, "command must not be blank"),
        (
            {"name": "s", "command": "x", "headers": {"A": "b"}},
            "headers cannot be given for a stdio",
        ),
        ({"name": "h", "url": "https://a/mcp", "args": ["x"]}, "args cannot be given for an HTTP"),
        ({"name": "h", "url": "ftp://a/mcp"}, "url: must be an http:// or https:// URL"),
        ({"name": "h", "url": "https://u:pw@a/mcp"}, "url: must not carry credentials"),
        ({"name": "h", "url": "https://a/mcp", "headers_env": {"A": "1X"}}, "not an environment"),
        ({"name": "s", "command": "x", "tool_prefix": "a.b"}, "tool_prefix: must be at most 32"),
        ({"name": "s", "command": "x", "effect": "loud"}, "effect: Input should be"),
        ({"name": "s", "command": "x", "timeout": 0}, "timeout: Input should be greater than 0"),
        ({"name": "s", "command": "x", "protocol": "2024"}, "protocol: Input should be"),
        ({"name": "s", "command": "x", "colour": "red"}, "colour: Extra inputs are not permitted"),
    ],
)
def test_a_bad_declaration_is_a_config_error_naming_the_server(
    values: dict[str, object], problem: str
) -> None:
    with pytest.raises(AgentError) as caught:
        MCPServer.declare(**values)
    assert caught.value.kind is ErrorKind.CONFIG
    assert caught.value.message.startswith(f"MCP server {values['name']!r}: ")
    assert problem in caught.value.message


def test_effects_come_from_the_override_then_trusted_annotations_then_the_server() -> None:
    untrusted = MCPServer.stdio("s", "x", effect="write", tool_effects={"wipe": "external"})
    assert untrusted.effect_for("lookup", read_only=True) is ToolEffect.WRITE
    assert untrusted.effect_for("wipe") is ToolEffect.EXTERNAL
    trusted = MCPServer.stdio("s", "x", trusted=True, tool_effects={"lookup": "internal"})
    assert trusted.effect_for("lookup", read_only=True) is ToolEffect.INTERNAL
    assert trusted.effect_for("search", read_only=True) is ToolEffect.READ_ONLY
    assert trusted.effect_for("append", read_only=False, destructive=False) is ToolEffect.WRITE
    assert trusted.effect_for("erase", read_only=False, destructive=True) is ToolEffect.EXTERNAL
    assert trusted.effect_for("plain") is ToolEffect.EXTERNAL


def test_headers_and_environment_are_read_from_the_environment() -> None:
    docs = MCPServer.http(
        "docs", "https://a/mcp", headers={"X-Team": "ops"}, headers_env={"Authorization": "TOK"}
    )
    assert docs.resolved_headers({"TOK": "Bearer 1"}) == {
        "X-Team": "ops",
        "Authorization": "Bearer 1",
    }
    with pytest.raises(
        AgentError, match="header Authorization comes from the environment variable TOK"
    ):
        docs.resolved_headers({})
    files = MCPServer.stdio("files", "x", env={"LEVEL": "2"}, pass_env=["API_KEY"])
    assert files.resolved_env({"API_KEY": "k", "OTHER": "o"}) == {"LEVEL": "2", "API_KEY": "k"}
    with pytest.raises(AgentError, match="pass_env comes from the environment variable API_KEY"):
        files.resolved_env({"API_KEY": ""})


def test_servers_from_mcp_servers_tables_in_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        """
        [agent]
        provider = "scripted"

        [[agent.mcp_servers]]
        name = "files"
        command = "python"
        args = ["server.py"]
        tool_prefix = "fs_"
        effect = "write"
        timeout = 5

        [[agent.mcp_servers]]
        name = "docs"
        url = "https://docs.example.com/mcp"
        headers_env = { Authorization = "DOCS_TOKEN" }
        trusted = true
        required = true
        """,
        encoding="utf-8",
    )
    settings = AgentSettings.load(config_file=config, environ={})
    files, docs = configured_servers(settings.mcp_servers)
    assert files == MCPServer.stdio(
        "files", "python", ["server.py"], tool_prefix="fs_", effect="write", timeout=5
    )
    assert docs == MCPServer.http(
        "docs",
        "https://docs.example.com/mcp",
        headers_env={"Authorization": "DOCS_TOKEN"},
        trusted=True,
        required=True,
    )


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        (
            {"name": "docs", "url": "https://a/mcp", "headers": {"Authorization": "x"}},
            "'headers': a header in a file would put a secret in the file",
        ),
        ({"name": "docs", "url": "https://a/mcp", "timout": 3}, "timout: Extra inputs"),
        ({"command": "x"}, "name: Field required"),
    ],
)
def test_a_bad_table_names_its_number_and_the_key(table: dict[str, object], problem: str) -> None:
    with pytest.raises(AgentError) as caught:
        configured_servers([{"name": "fine", "command": "x"}, table])
    label = f"[[agent.mcp_servers]] number 2 ({table.get('name', 'no name')!r})"
    assert caught.value.message.startswith(label)
    assert problem in caught.value.message
