"""Every ``/agent`` route of the demo app, fuzzed with schemathesis over real HTTP: no 5xx,
no response that breaks the schema, no schema-valid request refused, the documented status
codes only (issue #17, item 10).

The app runs under uvicorn in a subprocess, on a SQLite file of its own and a Redis database
the test empties before and after (so runs it queues never reach another test's workers).
The number of examples per route is bounded, so the whole test takes well under a minute.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from tests.jobs_app import ROOT
from tests.services import FUZZ_DB, redis_db

REDIS_DB_URL = redis_db(FUZZ_DB)
"""A Redis database of the fuzz test's own (the others use database 0)."""
EXAMPLES = 60


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def demo_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("fuzz")
    port = free_port()
    environ = {
        **os.environ,
        "AGENT_CONFIG_FILE": str(ROOT / "example_app" / "agent.toml"),
        "AGENT_DATABASE_URL": f"sqlite+aiosqlite:///{folder / 'fuzz.db'}",
        "AGENT_REDIS_URL": REDIS_DB_URL,
    }
    store = redis.Redis.from_url(REDIS_DB_URL)
    store.flushdb()
    output = (folder / "uvicorn.out").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "example_app.main:app", "--port", str(port)],
        cwd=ROOT,
        env=environ,
        stdout=output,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError((folder / "uvicorn.out").read_text(errors="replace"))
            time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(20)
        output.close()
        store.flushdb()
        store.close()


@pytest.fixture(scope="module")
def demo_schema(demo_url: str) -> Any:
    return schemathesis.openapi.from_url(f"{demo_url}/openapi.json")


schema = schemathesis.pytest.from_fixture("demo_schema")


@schema.include(path_regex="^/agent").parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_the_agent_routes_hold_their_schema(case: Any) -> None:
    refused_rightly = (
        # a cursor is opaque: one the fuzzer made up fits the schema, and is rightly refused
        bool((case.query or {}).get("cursor"))
        # schemathesis does not keep a string parameter's pattern: it sends NULs (1 case in
        # about 500) to ids whose schema says ^[^\u0000\ud800-\udfff]*$
        or any(unstorable(value) for value in _values(case))
        # a branch names an entry of a session: without one, the body is rightly refused
        or (
            isinstance(case.body, dict)
            and case.body.get("branch") is not None
            and case.body.get("session") is None
        )
    )
    case.call_and_validate(excluded_checks=[positive_data_acceptance] if refused_rightly else [])


def _values(case: Any) -> list[object]:
    """The ids a case names (free text with a NUL is accepted, as U+FFFD: it stays checked)."""
    body = case.body if isinstance(case.body, dict) else {}
    ids = [*(case.query or {}).values(), *(case.path_parameters or {}).values()]
    return [*ids, body.get("session")]


def unstorable(value: object) -> bool:
    return isinstance(value, str) and any(c == "\x00" or "\ud800" <= c <= "\udfff" for c in value)


def test_the_fuzzed_app_is_the_demo(demo_url: str) -> None:
    paths = httpx.get(f"{demo_url}/openapi.json").json()["paths"]
    agent = sorted(path for path in paths if path.startswith("/agent"))
    assert agent == [
        "/agent/runs",
        "/agent/runs/{run_id}",
        "/agent/runs/{run_id}/cancel",
        "/agent/runs/{run_id}/decisions",
        "/agent/runs/{run_id}/events",
        "/agent/runs/{run_id}/messages",
        "/agent/sessions/{session}/branches",
        "/agent/tools",
    ]
