"""Every error of the agent routes is problem details: validation, malformed and oversized
requests, the plugin's own errors; the OpenAPI schema documents them, with readable ids."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from agent_plugin import AgentPlugin
from agent_plugin.config import AgentSettings
from agent_plugin.providers.scripted import ScriptedModel
from agent_plugin.sessions import InMemorySessionStore
from agent_plugin.web.problems import PROBLEM_MEDIA_TYPE, PROBLEM_TYPE_PREFIX

LIMIT = 4096


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    plugin = AgentPlugin(
        model=ScriptedModel(default="done"),
        session_store=InMemorySessionStore(),
        jobs=True,
        settings=AgentSettings(
            provider="scripted",
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'runs.db'}",
            max_request_bytes=LIMIT,
        ),
    )
    app = FastAPI()
    plugin.install(app, runs_route=True)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://app") as http,
    ):
        yield http


def problem_of(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM_MEDIA_TYPE
    body: dict[str, Any] = response.json()
    assert (body["status"], body["kind"], body["type"]) == (
        status,
        kind,
        PROBLEM_TYPE_PREFIX + kind,
    )
    return body


async def test_a_request_that_does_not_validate_names_each_field(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/agent/runs", json={"prompt": "", "session": 5, "extra": 1})
    body = problem_of(response, 422, "invalid")
    fields = {tuple(e["loc"]) for e in body["errors"]}
    assert fields == {("body", "prompt"), ("body", "session"), ("body", "extra")}
    assert body["detail"].startswith("body.prompt: ")
    assert "(and 2 more)" in body["detail"]


async def test_a_refused_value_is_echoed_only_as_a_short_excerpt(
    client: httpx.AsyncClient,
) -> None:
    text = "x" * 3000
    response = await client.post("/agent/runs", json={"prompt": {"text": text}})
    body = problem_of(response, 422, "invalid")
    [error] = body["errors"]
    assert len(error["input"]) <= 81
    assert len(response.content) < 1000


_PASSWORD = "Hunter2-Http-9d1e"  # no familiar shape: only its field's name gives it away
_KEY = "sk-ant-" + "Wc4nAry9XcV4bN8pR3tY6wZ1kA9b3Q"


@pytest.mark.parametrize(
    "body",
    [
        {"password": _PASSWORD},  # refused as an extra field, and echoed whole: no prompt
        {"prompt": "go", "options": {"api_key": _PASSWORD}},
        {"prompt": {"text": "x", "token": _PASSWORD}},
    ],
    ids=["extra field", "nested extra", "wrong type"],
)
async def test_a_refused_secret_field_is_not_echoed(
    client: httpx.AsyncClient, body: dict[str, Any]
) -> None:
    response = await client.post("/agent/runs", json=body)
    problem_of(response, 422, "invalid")
    assert _PASSWORD not in response.text


async def test_a_key_cut_at_the_excerpts_end_is_not_echoed_in_part(
    client: httpx.AsyncClient,
) -> None:
    """The excerpt was cut before it was redacted: a key cut short no longer matched its
    pattern, and its first characters were echoed."""
    for pad in range(0, 80, 3):
        response = await client.post("/agent/runs", json={"a": "x" * pad, "k": _KEY})
        problem_of(response, 422, "invalid")
        assert _KEY[:12] not in response.text, pad


@pytest.mark.parametrize(
    "raw",
    [
        b'{"prompt": NaN}',
        b'{"prompt": Infinity}',
        b'{"prompt": "ok", "session": "\\ud800"}',
        b'{"prompt": "ok", "session": "a\\u0000b"}',
    ],
    ids=["NaN", "Infinity", "lone surrogate", "NUL"],
)
async def test_values_json_cannot_carry_everywhere_are_a_422_not_a_500(
    client: httpx.AsyncClient, raw: bytes
) -> None:
    response = await client.post(
        "/agent/runs", content=raw, headers={"content-type": "application/json"}
    )
    problem_of(response, 422, "invalid")


async def test_a_nul_in_free_text_is_kept_out_of_the_stores_not_refused(
    client: httpx.AsyncClient,
) -> None:
    raw = b'{"prompt": "a\\u0000b"}'
    response = await client.post(
        "/agent/runs", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 202, response.text
    record = await client.get(response.json()["status_path"])
    assert record.status_code == 200


async def test_malformed_json_is_a_problem_too(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/agent/runs", content=b'{"prompt": ', headers={"content-type": "application/json"}
    )
    problem_of(response, 422, "invalid")


async def test_a_body_over_the_limit_is_refused_by_its_length(client: httpx.AsyncClient) -> None:
    response = await client.post("/agent/runs", json={"prompt": "x" * (2 * LIMIT)})
    body = problem_of(response, 413, "invalid")
    assert str(LIMIT) in body["detail"]


async def test_a_chunked_body_is_refused_while_it_is_read(client: httpx.AsyncClient) -> None:
    sent = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal sent
        yield b'{"prompt": "'
        for _ in range(1000):  # 1 MB if it were all read
            sent += 1
            yield b"x" * 1024
        yield b'"}'

    response = await client.post(
        "/agent/runs", content=chunks(), headers={"content-type": "application/json"}
    )
    problem_of(response, 413, "invalid")
    assert sent < 1000  # the reading stopped at the limit, not at the end of the body


async def test_the_plugins_own_404_405_and_422_are_problems(client: httpx.AsyncClient) -> None:
    unknown = await client.get("/agent/runs/run_nosuchrun")
    problem_of(unknown, 404, "not_found")
    bad_event_id = await client.get(
        "/agent/runs/run_nosuchrun/events", headers={"last-event-id": "nonsense"}
    )
    problem_of(bad_event_id, 422, "invalid")  # the schema says what an event id is
    not_a_run_id = await client.get("/agent/runs/%00nope")
    problem_of(not_a_run_id, 422, "invalid")
    # A path with a GET and a POST route names both, whichever method was refused.
    wrong_method = await client.delete("/agent/runs")
    problem_of(wrong_method, 405, "invalid")
    assert wrong_method.headers["allow"] == "GET, POST"


async def test_the_schema_documents_problems_and_readable_operation_ids(
    client: httpx.AsyncClient,
) -> None:
    schema = (await client.get("/openapi.json")).json()
    assert "Problem" in schema["components"]["schemas"]
    operations = {
        operation["operationId"]: (path, method, operation)
        for path, methods in schema["paths"].items()
        for method, operation in methods.items()
    }
    agent_ids = {name for name in operations if name.startswith("agent_")}
    assert {
        "agent_list_tools",
        "agent_get_run",
        "agent_decide_run",
        "agent_start_run",
        "agent_run_events",
        "agent_cancel_run",
        "agent_steer_run",
        "agent_health",
        "agent_readiness",
    } <= agent_ids
    for name in agent_ids - {"agent_health", "agent_readiness"}:
        path, _method, operation = operations[name]
        assert path.startswith("/agent/")
        errors = {code: r for code, r in operation["responses"].items() if code >= "400"}
        assert errors, name
        for code, response in errors.items():
            content = response["content"][PROBLEM_MEDIA_TYPE]["schema"]
            assert content == {"$ref": "#/components/schemas/Problem"}, (name, code)
    assert json.dumps(schema).count("HTTPValidationError") == 0
