"""A listing cursor is opaque: one a client forged (decoding to a run id or a time no
listing gives) is ``cursor is not one a listing of runs gave``, a 422 like any other bad
cursor, on either database; never a 500, nor the database's own complaint."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from agent_plugin import AgentPlugin
from agent_plugin.config import AgentSettings
from agent_plugin.providers.scripted import ScriptedModel
from agent_plugin.sessions import InMemorySessionStore
from agent_plugin.storage import Database
from tests.test_storage import POSTGRES_URL

BAD_CURSOR = "cursor is not one a listing of runs gave"


def forged(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


FORGED = {
    "NUL in the run id": forged(json.dumps(["2026-01-01T00:00:00+00:00", "run_\u0000x"]).encode()),
    "lone surrogate": forged(b'["2026-01-01T00:00:00+00:00", "run_\\ud800"]'),
    "year 1": forged(json.dumps(["0001-01-01T00:00:00+14:00", "run_x"]).encode()),
    "year 9999": forged(json.dumps(["9999-12-31T23:59:59-14:00", "run_x"]).encode()),
}


async def _client(url: str) -> AsyncIterator[httpx.AsyncClient]:
    plugin = AgentPlugin(
        model=ScriptedModel(default="done"),
        session_store=InMemorySessionStore(),
        jobs=True,
        settings=AgentSettings(provider="scripted", database_url=url),
        auto_migrate=True,
    )
    app = FastAPI()
    plugin.install(app, runs_route=True, allow_anonymous=True)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://app") as http,
    ):
        yield http


@pytest.fixture
async def sqlite(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async for client in _client(f"sqlite+aiosqlite:///{tmp_path / 'runs.db'}"):
        yield client


@pytest.fixture
async def postgres() -> AsyncIterator[httpx.AsyncClient]:
    name = f"agent_cursor_{uuid.uuid4().hex[:8]}"
    admin = Database(POSTGRES_URL)
    try:
        async with admin.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        async for client in _client(POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"):
            yield client
    finally:
        async with admin.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin.dispose()


def _refused(response: httpx.Response) -> None:
    assert response.status_code == 422, response.text
    assert response.json()["kind"] == "invalid"
    assert response.json()["detail"] == BAD_CURSOR


@pytest.mark.parametrize("what", sorted(FORGED))
async def test_a_forged_cursor_on_sqlite(sqlite: httpx.AsyncClient, what: str) -> None:
    _refused(await sqlite.get("/agent/runs", params={"cursor": FORGED[what]}))


@pytest.mark.parametrize("what", sorted(FORGED))
async def test_a_forged_cursor_on_postgres(postgres: httpx.AsyncClient, what: str) -> None:
    _refused(await postgres.get("/agent/runs", params={"cursor": FORGED[what]}))
