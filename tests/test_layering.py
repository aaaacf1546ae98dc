"""The core must import with the adapters' dependencies missing (DESIGN.md §2)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import textwrap

import pytest

import agent_plugin

BLOCKED = ("fastapi", "starlette", "arq", "redis", "sqlalchemy", "alembic")
ADAPTERS = (
    "agent_plugin.web",
    "agent_plugin.jobs",
    "agent_plugin.runtime",
    "agent_plugin.storage",
    "agent_plugin.live",
    "agent_plugin.mcp",
)


def core_modules() -> list[str]:
    names = [
        info.name for info in pkgutil.walk_packages(agent_plugin.__path__, prefix="agent_plugin.")
    ]
    return sorted(
        name for name in names if not any(name == a or name.startswith(a + ".") for a in ADAPTERS)
    )


def test_the_core_imports_without_web_jobs_or_storage_dependencies() -> None:
    modules = core_modules()
    assert "agent_plugin.agent" in modules
    script = textwrap.dedent(
        f"""
        import importlib, importlib.abc, sys

        BLOCKED = {BLOCKED!r}

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"the core imported {{name}}")
                return None

        sys.meta_path.insert(0, Block())
        for name in {modules!r}:
            importlib.import_module(name)
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        assert not leaked, leaked
        print("ok", len({modules!r}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


def test_the_block_really_blocks() -> None:
    """The same finder stops an installed package (httpx) and a core module that needs it."""
    script = textwrap.dedent(
        """
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "httpx":
                    raise ImportError(name)
                return None
        sys.meta_path.insert(0, Block())
        try:
            import agent_plugin.providers.http
        except ImportError as error:
            print("blocked", error)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert result.stdout.startswith("blocked httpx"), result.stdout + result.stderr


def test_importing_the_package_leaves_optional_features_unloaded() -> None:
    """``import agent_plugin`` loads the core only: memory, skills, journals, sessions, the wire
    clients, their HTTP engine, settings and the JSON Schema compiler load with their first use
    (issue 9)."""
    lazy = (
        "agent_plugin.memory",
        "agent_plugin.skills",
        "agent_plugin.journal",
        "agent_plugin.sessions",
        "agent_plugin.providers.openai",
        "agent_plugin.providers.anthropic",
        "agent_plugin.config",
        "fastjsonschema",
        "httpx",
        "aiohttp",
        "httpx_aiohttp",
        "pydantic_settings",
    )
    script = f"import sys, agent_plugin; print([m for m in {lazy!r} if m in sys.modules])"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_web_side_and_the_mcp_declarations_leave_the_mcp_sdk_unloaded() -> None:
    """``import agent_plugin.web`` and declaring an MCP server import no part of the MCP SDK
    (the ``mcp`` extra): only starting a server does (issue 22)."""
    script = textwrap.dedent(
        """
        import sys
        import agent_plugin, agent_plugin.web
        from agent_plugin.mcp import MCPServer
        MCPServer.stdio("files", "python", ["server.py"])
        MCPServer.http("docs", "https://example.com/mcp")
        sdk = ("mcp", "mcp_types", "httpx2", "jsonschema")
        print(sorted(m for m in sys.modules if m.split(".")[0] in sdk))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_starting_an_mcp_server_without_the_sdk_names_the_extra() -> None:
    script = textwrap.dedent(
        """
        import asyncio, sys
        sys.modules["mcp"] = None  # as if the mcp extra were not installed
        from agent_plugin.errors import AgentError
        from agent_plugin.mcp import MCPServer
        try:
            asyncio.run(MCPServer.stdio("files", "python").start({}))
        except AgentError as error:
            print(error.kind.value, error.message)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "config MCP server 'files': the MCP SDK is not installed: "
        "pip install 'fastapi-agent-plugin[mcp]'"
    )


def test_the_http_engine_loads_with_the_first_client_not_with_the_wire_modules() -> None:
    script = textwrap.dedent(
        """
        import sys
        from agent_plugin.providers.openai import OpenAICompatibleClient
        before = "aiohttp" in sys.modules
        OpenAICompatibleClient(base_url="http://127.0.0.1:9/v1")
        print(before, "aiohttp" in sys.modules)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]


def test_the_web_side_leaves_background_runs_and_the_http_engines_unloaded() -> None:
    """``import agent_plugin.web`` (and ``agent_plugin``) loads no part of background runs (arq,
    Redis, SQLAlchemy) nor of an HTTP engine: they load when a queue, a store or a client is
    opened (issue 20)."""
    heavy = ("sqlalchemy", "alembic", "arq", "redis", "aiohttp", "httpx_aiohttp", "httpx")
    modules = ("agent_plugin.jobs.queue", "agent_plugin.jobs.worker", "agent_plugin.storage")
    script = textwrap.dedent(
        f"""
        import sys
        import agent_plugin, agent_plugin.web
        from agent_plugin import AgentPlugin, JobOptions, RunHandle
        from agent_plugin.web import AgentHandle, AppAgent, health_router
        print(sorted({{m.split(".")[0] for m in sys.modules}} & set({heavy!r})))
        print(sorted(m for m in {modules!r} if m in sys.modules))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["[]", "[]"]


def test_the_lazy_names_of_jobs_and_live_are_the_modules_own() -> None:
    from agent_plugin import jobs, live
    from agent_plugin.jobs import queue, ticks, worker
    from agent_plugin.live import control

    assert jobs.RunQueue is queue.RunQueue
    assert jobs.HeartbeatStats is queue.HeartbeatStats
    assert jobs.heartbeat_cron is ticks.heartbeat_cron
    assert jobs.worker_settings is worker.worker_settings
    assert live.ControlWatcher is control.ControlWatcher
    assert live.watch is control.watch
    assert all(getattr(jobs, name) is not None for name in jobs.__all__)
    assert all(getattr(live, name) is not None for name in live.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        getattr(jobs, "nothing")  # noqa: B009
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        getattr(live, "nothing")  # noqa: B009
