"""A provider's tool-call id has no length limit in the message model: a gateway may send one
longer than the journal's ``call_id`` column (255), and PostgreSQL refuses what SQLite takes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent_plugin.agent import Agent
from agent_plugin.ids import new_run_id
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import Completed
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.storage import Database, SqlRunStore
from agent_plugin.tools import tool
from tests.test_storage import PostgresSchema

LONG_ID = "call_" + "x" * 300


@tool
def lookup(city: str) -> dict[str, str]:
    """Look a city up."""
    return {"city": city, "weather": "sunny"}


@pytest.fixture
async def postgres() -> AsyncIterator[Database]:
    schema = PostgresSchema()
    await schema.create()
    database = schema.database()
    try:
        await database.migrate()
        yield database
    finally:
        await database.dispose()
        await schema.drop()


async def _journaled_run(database: Database) -> Any:
    store = SqlRunStore(database)
    run_id = new_run_id()
    await store.create(run_id, origin="request", args={})
    record = await store.start(run_id)
    model = ScriptedModel([tool_call("lookup", {"city": "Oslo"}, id=LONG_ID), "done"])
    journal = store.journal(run_id, attempt=record.attempt)
    return await Agent(model, tools=[lookup]).run(
        "weather?", options=RunOptions(run_id=run_id, journal=journal)
    )


async def test_a_tool_call_id_longer_than_255_is_journaled_on_postgres(
    postgres: Database,
) -> None:
    turn = await _journaled_run(postgres)
    assert isinstance(turn.outcome, Completed)
    assert turn.messages[1].content[0].tool_call.id == LONG_ID
