"""The agent routes over HTTP, without a worker: listing runs, and what guards the routes."""

from __future__ import annotations

import logging
import shutil
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI, Header, HTTPException

from agent_plugin import AgentPlugin, AppAgent, JobOptions
from agent_plugin.config import AgentSettings
from agent_plugin.ids import new_run_id
from agent_plugin.providers.scripted import ScriptedModel
from agent_plugin.redaction import REDACTED, redact_text
from agent_plugin.sessions import InMemorySessionStore
from agent_plugin.web.health import AgentHealth


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
    plugin.install(app, dependencies=[Depends(require_token)], runs_route=True)
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


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def plugin_for(directory: Path, **settings: Any) -> AgentPlugin:
    return AgentPlugin(
        model=ScriptedModel(default="done"),
        session_store=InMemorySessionStore(),
        jobs=JobOptions(queue_name=f"ready-{uuid.uuid4().hex}:queue"),
        health=AgentHealth(workers=True, cache_secs=0),
        settings=AgentSettings(
            provider="scripted",
            database_url=f"sqlite+aiosqlite:///{directory / 'runs.db'}",
            **settings,
        ),
    )


async def test_readiness_reports_the_database_redis_and_the_workers(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    directory.mkdir()
    plugin = plugin_for(directory)
    app = FastAPI()
    plugin.install(app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as client,
    ):
        ready = await client.get("/health/ready")
        assert ready.status_code == 503  # no worker serves this queue
        components = ready.json()["components"]
        assert components["database"]["status"] == "UP"
        assert components["redis"]["status"] == "UP"
        assert components["workers"]["status"] == "DOWN"
        assert "no worker serves the queue" in components["workers"]["details"]["error"]

        shutil.rmtree(directory)  # the database goes away under the running app
        await plugin.agent(app).runtime.database.dispose()  # type: ignore[union-attr]
        gone = (await client.get("/health/ready")).json()["components"]["database"]
        assert gone["status"] == "DOWN"
        assert "does not exist" in gone["details"]["error"]


async def test_readiness_is_down_with_the_reason_when_redis_cannot_be_reached(
    tmp_path: Path,
) -> None:
    plugin = plugin_for(tmp_path, redis_url=f"redis://:s3cret-pass@127.0.0.1:{closed_port()}/0")
    app = FastAPI()
    plugin.install(app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as client,
    ):
        ready = await client.get("/health/ready")
    assert ready.status_code == 503
    redis = ready.json()["components"]["redis"]
    assert redis["status"] == "DOWN"
    assert "cannot reach Redis" in redis["details"]["error"]
    assert "s3cret-pass" not in ready.text


async def test_an_apps_own_health_route_is_kept_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"mine": "yes"}

    with caplog.at_level(logging.WARNING, logger="agent_plugin"):
        plugin_for(tmp_path).install(app)
    assert "has its own route at /health" in caplog.text
    assert sum(getattr(r, "path", None) == "/health" for r in app.router.routes) == 1


async def test_the_start_up_line_says_where_everything_is_without_secrets(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key = "qz" + "7f" * 20  # a key of no familiar shape
    config = tmp_path / "agent.toml"
    config.write_text("[agent]\nmax_steps = 4\n")
    plugin = AgentPlugin(
        model=ScriptedModel(default="done"),
        session_store=InMemorySessionStore(),
        jobs=True,
        environ={
            "AGENT_PROVIDER": "scripted",
            "AGENT_API_KEY": key,
            "AGENT_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'runs.db'}",
            "AGENT_REDIS_URL": "redis://:hunter2-hunter2@127.0.0.1:6379/3",
        },
        config_file=config,
    )
    app = FastAPI()
    plugin.install(app)
    with caplog.at_level(logging.INFO, logger="agent_plugin"):
        async with app.router.lifespan_context(app):
            runtime = plugin.agent(app).runtime
            assert redact_text(f"the key is {key}.") == f"the key is {REDACTED}."
            assert "hunter2-hunter2" not in redact_text("pw hunter2-hunter2")
    [line] = [r.getMessage() for r in caplog.records if "agent plugin started" in r.getMessage()]
    assert "provider=scripted" in line
    assert f"database=sqlite+aiosqlite:///{tmp_path / 'runs.db'}" in line
    assert "redis=redis://:***@127.0.0.1:6379/3" in line
    assert "queue=agent:queue" in line
    assert f"settings={config} + environment AGENT_API_KEY" in line
    assert "AGENT_API_KEY" in line  # names, never values
    assert "AGENT_REDIS_URL" in line
    assert key not in caplog.text
    assert "hunter2" not in caplog.text
    assert runtime.describe() in line
    assert redact_text(f"the key is {key}.") == f"the key is {key}."  # closed: no longer known


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/agent/runs", {"prompt": "p", "session": "s", "branch": True}),
        ("/agent/runs", {"prompt": "p", "session": "s", "branch": "2"}),
        ("/agent/runs", {"prompt": "p", "session": "s", "branch": 2.5}),
        ("/agent/sessions/s/branches", {"at": True}),
        ("/agent/sessions/s/branches", {"at": "1"}),
        ("/agent/sessions/s/branches", {"at": 1.5}),
    ],
)
async def test_an_entry_number_must_be_a_json_integer(
    served: tuple[httpx.AsyncClient, AppAgent], path: str, body: dict[str, Any]
) -> None:
    # the schema says integer: a boolean or a string is refused, not coerced to an entry
    client, _ = served
    answer = await client.post(path, json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["kind"] == "invalid"


async def test_an_integral_number_is_an_entry_number(
    served: tuple[httpx.AsyncClient, AppAgent],
) -> None:
    # JSON Schema counts 2.0 as an integer, so the schema's promise holds for it: the branch
    # route answers as for 2 (the session has no entries here: 404, not 422)
    client, _ = served
    for at in (2, 2.0):
        answer = await client.post("/agent/sessions/s/branches", json={"at": at})
        assert answer.status_code == 404, answer.text
