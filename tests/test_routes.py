"""The agent routes over HTTP, without a worker: listing runs, and what guards the routes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import Depends, FastAPI, Header, HTTPException

from agent_plugin import AgentPlugin, AppAgent
from agent_plugin.config import AgentSettings
from agent_plugin.ids import new_run_id
from agent_plugin.providers.scripted import ScriptedModel
from agent_plugin.sessions import InMemorySessionStore


def require_token(x_token: str | None = Header(default=None)) -> None:
    if x_token != "let-me-in":
        raise HTTPException(status_code=401, detail="no token")


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, AppAgent]]:
    plugin = AgentPlugin(
        model=ScriptedModel(default="done"),
        session_store=InMemorySessionStore(),
        jobs=True,
        settings=AgentSettings(
            provider="scripted", database_url=f"sqlite+aiosqlite:///{tmp_path / 'runs.db'}"
        ),
    )
    app = FastAPI()
    plugin.install(app, dependencies=[Depends(require_token)])
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=transport, base_url="http://app", headers={"x-token": "let-me-in"}
        ) as client,
    ):
        yield client, plugin.agent(app)


async def test_runs_are_listed_newest_first_with_a_cursor(
    served: tuple[httpx.AsyncClient, AppAgent],
) -> None:
    client, agent = served
    ids = [new_run_id() for _ in range(3)]
    for run_id in ids:
        await agent.jobs.store.create(
            run_id, origin="request", args={"prompt": "p"}, session_id="s"
        )
    first = await client.get("/agent/runs", params={"session": "s", "limit": 2})
    assert first.status_code == 200, first.text
    page = first.json()
    assert [r["run_id"] for r in page["runs"]] == [ids[2], ids[1]]
    assert page["runs"][0]["status"] == "queued"
    rest = await client.get("/agent/runs", params={"session": "s", "cursor": page["next_cursor"]})
    assert [r["run_id"] for r in rest.json()["runs"]] == [ids[0]]
    assert rest.json()["next_cursor"] is None
    assert (await agent.list_runs(session="s", status="queued")).runs[0].run_id == ids[2]
    bad = await client.get("/agent/runs", params={"cursor": "nonsense"})
    assert bad.status_code == 422
    assert bad.json()["kind"] == "invalid"
    unknown_status = await client.get("/agent/runs", params={"status": "sleeping"})
    assert unknown_status.status_code == 422


async def test_the_list_is_behind_the_routes_dependencies(
    served: tuple[httpx.AsyncClient, AppAgent],
) -> None:
    client, _ = served
    refused = await client.get("/agent/runs", headers={"x-token": "wrong"})
    assert refused.status_code == 401
    assert refused.headers["content-type"] == "application/problem+json"
