"""Typed results of background runs, end to end: ``POST /agent/runs`` and ``enqueue`` name a
registered output, a real arq worker process runs it (tool and prompted mode, retries,
approvals), and the run's record holds the output as JSON that validates as the type."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.web import AgentPlugin
from tests.jobs_app import JobsEnv, Ticket, make_app, make_plugin

pytestmark = pytest.mark.timeout(60)

GOOD = {"title": "Printer on fire", "priority": 5}
BAD = {"title": "Printer on fire", "priority": 9}

RUNNING = ("queued", "in_progress")

_tags = iter(range(1_000_000))


def plan(**fields: Any) -> str:
    tag = f"o{next(_tags)}_{time.monotonic_ns() % 1_000_000}"
    return json.dumps({"tag": tag, **fields})


@asynccontextmanager
async def serve(env: JobsEnv) -> AsyncIterator[tuple[AgentPlugin, FastAPI, httpx.AsyncClient]]:
    plugin = make_plugin(env.environ)
    app = make_app(plugin, runs_route=True, allow_anonymous=True)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client,
    ):
        yield plugin, app, client


async def poll(
    client: httpx.AsyncClient,
    path: str,
    until: Callable[[dict[str, Any]], bool] = lambda r: (
        r["status"] not in ("queued", "in_progress")
    ),
    within: float = 20.0,
) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        response = await client.get(path)
        assert response.status_code == 200, response.text
        record: dict[str, Any] = response.json()
        if until(record):
            return record
        assert time.monotonic() < deadline, f"gave up waiting: {record}"
        await asyncio.sleep(0.05)


async def start(client: httpx.AsyncClient, prompt: str, **body: Any) -> str:
    response = await client.post("/agent/runs", json={"prompt": prompt, **body})
    assert response.status_code == 202, response.text
    return str(response.json()["status_path"])


async def test_a_run_started_over_http_ends_with_its_output_in_the_record(
    served_env: JobsEnv,
) -> None:
    async with serve(served_env) as (_, _, client):
        path = await start(
            client, plan(rounds=[[["effect", "a"]]], outputs=[BAD, GOOD]), output="ticket"
        )
        record = await poll(client, path)
    assert record["status"] == "complete", record
    outcome = record["outcome"]
    assert outcome["status"] == "completed"
    assert Ticket.model_validate(outcome["output"]) == Ticket(**GOOD)
    assert json.loads(outcome["text"]) == GOOD
    assert outcome["steps_used"] == 2  # the tool round and the retry; the answer is free


async def test_enqueue_names_an_output_and_a_prompted_one_works_the_same(
    served_env: JobsEnv,
) -> None:
    async with serve(served_env) as (plugin, app, client):
        agent = plugin.agent(app)
        handle = await agent.enqueue(plan(outputs=[GOOD]), output="ticket_prompted")
        record = await poll(client, handle.status_path)
    assert record["outcome"]["output"] == GOOD


async def test_a_run_that_never_gives_a_valid_output_ends_output_invalid(
    served_env: JobsEnv,
) -> None:
    async with serve(served_env) as (_, _, client):
        path = await start(client, plan(outputs=[BAD]), output="ticket")
        record = await poll(client, path)
    assert record["status"] == "complete"
    outcome = record["outcome"]
    assert outcome["status"] == "output_invalid"
    assert outcome["output"] is None
    assert "priority: Input should be less than or equal to 5" in outcome["reason"]


async def test_a_typed_run_paused_for_approval_keeps_its_output_type(
    served_env: JobsEnv,
) -> None:
    async with serve(served_env) as (_, _, client):
        path = await start(client, plan(rounds=[[["send", "x"]]], outputs=[GOOD]), output="ticket")
        paused = await poll(client, path)
        assert paused["status"] == "awaiting_approval", paused
        (call,) = paused["awaiting"]
        decided = await client.post(
            f"{path}/decisions",
            json=[{"call_id": call["call_id"], "approval": {"verdict": "approve"}}],
        )
        assert decided.status_code == 202, decided.text
        record = await poll(client, path, until=lambda r: r["status"] == "complete")
    assert Ticket.model_validate(record["outcome"]["output"]).priority == 5


async def test_an_unknown_output_is_refused_before_anything_is_queued(
    served_env: JobsEnv,
) -> None:
    async with serve(served_env) as (plugin, app, client):
        response = await client.post("/agent/runs", json={"prompt": "x", "output": "invoice"})
        assert response.status_code == 422
        assert "ticket" in response.text
        with pytest.raises(AgentError) as caught:
            await plugin.agent(app).enqueue("x", output="invoice")
    assert caught.value.kind is ErrorKind.INVALID
    assert "ticket, ticket_prompted" in caught.value.message


async def test_the_status_route_documents_the_registered_outputs(served_env: JobsEnv) -> None:
    async with serve(served_env) as (_, _, client):
        schema = (await client.get("/openapi.json")).json()
    components = schema["components"]["schemas"]
    record = schema["paths"]["/agent/runs/{run_id}"]["get"]["responses"]["200"]
    ref = record["content"]["application/json"]["schema"]["$ref"]
    assert ref == "#/components/schemas/RunRecord"
    output = components["OutcomeSummary"]["properties"]["output"]
    assert {"$ref": "#/components/schemas/Ticket"} in output["anyOf"]
    assert {"type": "null"} in output["anyOf"]  # a text run's
    assert components["Ticket"]["properties"]["priority"]["maximum"] == 5
    body = schema["paths"]["/agent/runs"]["post"]["requestBody"]["content"]["application/json"]
    request = components[body["schema"]["$ref"].rsplit("/", 1)[1]]
    names = next(o for o in request["properties"]["output"]["anyOf"] if "enum" in o)
    assert names["enum"] == ["ticket", "ticket_prompted"]
    page = schema["paths"]["/agent/runs"]["get"]["responses"]["200"]["content"]
    assert page["application/json"]["schema"]["$ref"] == "#/components/schemas/RunPage"
