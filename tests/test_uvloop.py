"""Everything works on uvloop, the loop ``uvicorn[standard]`` serves on: a run with tools, a
stored session, and the plugin's routes (with their SSE) over HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from agent_plugin import AgentHandle, Completed
from agent_plugin.testing import ScriptedModel, tool_call
from agent_plugin.tools import ToolEffect, tool
from agent_plugin.web import AgentPlugin

uvloop = pytest.importorskip("uvloop")


@tool(effect=ToolEffect.READ_ONLY)
async def look(city: str) -> dict[str, str]:
    """Look a city up."""
    await asyncio.sleep(0)
    return {"city": city, "sky": "clear"}


def test_a_run_its_session_and_the_routes_on_uvloop(tmp_path: Path) -> None:
    async def main() -> None:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        (tmp_path / "agent.toml").write_text("[agent]\n", encoding="utf-8")
        model = ScriptedModel(default="noted")
        model.push(tool_call("look", {"city": "Oslo"}), "Oslo is clear.")
        plugin = AgentPlugin(
            tools=[look],
            model=model,
            environ={"AGENT_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'uv.db'}"},
            config_file=tmp_path / "agent.toml",
            jobs=False,
        )
        app = FastAPI()
        plugin.install(app, allow_anonymous=True)

        @app.post("/ask/stream")
        async def ask(agent: AgentHandle) -> object:
            return agent.stream("again", session="s1")

        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c,
        ):
            turn = await plugin.agent(app).chat("s1", "Weather in Oslo?")
            assert isinstance(turn.outcome, Completed)
            assert turn.outcome.text == "Oslo is clear."
            streamed = await c.post("/ask/stream")
            assert "event: run_end" in streamed.text
            assert (await c.get("/agent/tools")).json()[0]["name"] == "look"

    uvloop.run(main())
