"""The trace of a background run crosses the queue: a real arq worker process (its SDK set up by
``tests/otel_worker.py``, exporting spans and metrics to files) runs the run, and its spans
join the enqueueing request's trace; a resume joins the decision request's trace and links to
the paused run's span. The worker's metrics count the runs, the queue wait, the retries and
the heartbeat's ticks (it ticks every second)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.jobs_app import JobsEnv, WorkerProcess, clean_redis, jobs_env, make_app, make_plugin

pytestmark = pytest.mark.timeout(90)


class Files:
    def __init__(self, env: JobsEnv, spans: Path, metrics: Path) -> None:
        self.env = env
        self.spans_file = spans
        self.metrics_file = metrics

    def spans(self) -> list[dict[str, Any]]:
        if not self.spans_file.exists():
            return []
        return [json.loads(line) for line in self.spans_file.read_text().splitlines() if line]

    def metric_points(self) -> dict[str, list[dict[str, Any]]]:
        """The latest export's data points, by metric name."""
        if not self.metrics_file.exists():
            return {}
        lines = [line for line in self.metrics_file.read_text().splitlines() if line]
        if not lines:
            return {}
        found: dict[str, list[dict[str, Any]]] = {}
        for resource in json.loads(lines[-1])["resource_metrics"]:
            for scope in resource["scope_metrics"]:
                for metric in scope["metrics"]:
                    found.setdefault(metric["name"], []).extend(metric["data"]["data_points"])
        return found


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Files]:
    directory = tmp_path_factory.mktemp("telemetry_jobs")
    env = jobs_env(directory, heartbeat="every:1")
    spans, metrics = directory / "spans.jsonl", directory / "metrics.jsonl"
    worker = WorkerProcess(
        env,
        settings="tests.otel_worker.WorkerSettings",
        extra={"OTEL_TEST_SPANS": str(spans), "OTEL_TEST_METRICS": str(metrics)},
    )
    worker.start()
    try:
        yield Files(env, spans, metrics)
    finally:
        worker.stop()
        clean_redis(env)


@pytest.fixture
async def client(files: Files) -> AsyncIterator[httpx.AsyncClient]:
    plugin = make_plugin(files.env.environ)
    app = make_app(plugin, runs_route=True)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as http,
    ):
        yield http


@pytest.fixture
def tracer() -> Iterator[tuple[Any, InMemorySpanExporter]]:
    """The app side's own tracer (the test process sets no global provider)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("the app"), exporter
    provider.shutdown()


async def until(check: Any, what: str, within: float = 30.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + within
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(interval)


async def finished(http: httpx.AsyncClient, path: str, status: str) -> dict[str, Any]:
    async def poll() -> dict[str, Any]:
        while True:
            record: dict[str, Any] = (await http.get(path)).json()
            if record["status"] == status:
                return record
            assert record["status"] in ("queued", "in_progress"), record
            await asyncio.sleep(0.03)

    return await asyncio.wait_for(poll(), 30)


def of_run(spans: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["attributes"].get("agent_plugin.run.id") == run_id]


def hex_id(value: int, width: int) -> str:
    return f"0x{value:0{width}x}"


async def test_a_background_run_joins_the_enqueueing_requests_trace(
    files: Files, client: httpx.AsyncClient, tracer: tuple[Any, InMemorySpanExporter]
) -> None:
    app_tracer, _ = tracer
    prompt = json.dumps({"tag": "bg1", "rounds": [[["effect", "k1"]]], "answer": "ok"})
    with app_tracer.start_as_current_span("POST /agent/runs") as request_span:
        response = await client.post("/agent/runs", json={"prompt": prompt})
    assert response.status_code == 202, response.text
    handle = response.json()
    record = await finished(client, handle["status_path"], "complete")
    run_id = handle["run_id"]

    spans = await until(
        lambda: (
            (s := of_run(files.spans(), run_id))
            and any(x["name"] == "invoke_agent" for x in s)
            and s
        ),
        "the run's spans",
    )
    context = request_span.get_span_context()
    trace_id = hex_id(context.trace_id, 32)
    assert {s["context"]["trace_id"] for s in spans} == {trace_id}
    by_name = {s["name"]: s for s in spans}
    run = by_name["invoke_agent"]
    assert run["parent_id"] == hex_id(context.span_id, 16)
    assert run["attributes"]["agent_plugin.run.origin"] == "request"
    assert run["attributes"]["agent_plugin.run.status"] == "completed"
    chats = [s for s in spans if s["name"] == "chat scripted"]
    assert len(chats) == 2
    assert all(c["parent_id"] == run["context"]["span_id"] for c in chats)
    tool = by_name["execute_tool effect"]
    assert tool["parent_id"] == run["context"]["span_id"]
    assert record["outcome"]["usage"]["input_tokens"] == 20

    def request_metrics() -> dict[str, list[dict[str, Any]]] | None:
        """The latest export, once it counts a request's run (the heartbeat's runs, every
        second, may be exported first)."""
        points = files.metric_points()

        def by_request(name: str) -> list[dict[str, Any]]:
            return [
                p
                for p in points.get(name, [])
                if p["attributes"].get("agent_plugin.run.origin") == "request"
            ]

        finished = by_request("agent_plugin.runs.finished")
        waited = by_request("agent_plugin.run.queue_wait")
        if not (finished and waited and by_request("agent_plugin.runs.started")):
            return None
        return points

    points = await until(request_metrics, "the worker's metrics of a request's run")
    assert sum(p["count"] for p in points["agent_plugin.run.queue_wait"]) >= 1
    finished_points = points["agent_plugin.runs.finished"]
    assert any(p["attributes"]["agent_plugin.run.status"] == "completed" for p in finished_points)
    durations = points["gen_ai.client.operation.duration"]
    assert sum(p["count"] for p in durations) >= 2


async def test_a_resume_joins_the_decision_request_and_links_to_the_paused_run(
    files: Files, client: httpx.AsyncClient, tracer: tuple[Any, InMemorySpanExporter]
) -> None:
    app_tracer, _ = tracer
    prompt = json.dumps({"tag": "bg2", "rounds": [[["send", "x"]]], "answer": "sent"})
    with app_tracer.start_as_current_span("POST /agent/runs") as enqueue_span:
        handle = (await client.post("/agent/runs", json={"prompt": prompt})).json()
    path, run_id = handle["status_path"], handle["run_id"]
    paused = await finished(client, path, "awaiting_approval")
    (call,) = paused["awaiting"]
    first_trace = hex_id(enqueue_span.get_span_context().trace_id, 32)

    with app_tracer.start_as_current_span("POST decisions") as decision_span:
        accepted = await client.post(
            f"{path}/decisions",
            json=[{"call_id": call["call_id"], "approval": {"verdict": "approve"}}],
        )
    assert accepted.status_code == 202, accepted.text
    await finished(client, path, "complete")

    runs = await until(
        lambda: (
            len(r := [s for s in of_run(files.spans(), run_id) if s["name"] == "invoke_agent"]) == 2
            and r
        ),
        "both runs' spans",
    )
    paused_run, resumed_run = sorted(runs, key=lambda s: s["start_time"])
    assert paused_run["context"]["trace_id"] == first_trace
    assert paused_run["attributes"]["agent_plugin.run.status"] == "awaiting_approval"
    second_trace = hex_id(decision_span.get_span_context().trace_id, 32)
    assert resumed_run["context"]["trace_id"] == second_trace
    assert resumed_run["parent_id"] == hex_id(decision_span.get_span_context().span_id, 16)
    assert resumed_run["attributes"]["agent_plugin.run.resumed"] is True
    (link,) = resumed_run["links"]
    assert link["context"]["trace_id"] == first_trace
    assert link["context"]["span_id"] == paused_run["context"]["span_id"]
    names = {s["name"] for s in of_run(files.spans(), run_id)}
    assert {"await_approval", "resume_approval", "execute_tool send"} <= names


async def test_a_retried_run_is_counted_by_kind(files: Files, client: httpx.AsyncClient) -> None:
    prompt = json.dumps(
        {"tag": "bg3", "rounds": [], "answer": "ok", "fail": {"kind": "rate_limited", "times": 1}}
    )
    handle = (await client.post("/agent/runs", json={"prompt": prompt})).json()
    await finished(client, handle["status_path"], "complete")

    def retried() -> bool:
        points = files.metric_points().get("agent_plugin.retries", [])
        return any(
            p["attributes"] == {"agent_plugin.retry.scope": "run", "error.type": "rate_limited"}
            and p["value"] >= 1
            for p in points
        )

    assert await until(retried, "the run retry metric")


async def test_heartbeat_ticks_are_counted_by_result(files: Files) -> None:
    def ticked() -> list[dict[str, Any]]:
        return files.metric_points().get("agent_plugin.heartbeat.ticks", [])

    points = await until(ticked, "a heartbeat tick in the metrics")
    results = {p["attributes"]["agent_plugin.heartbeat.result"] for p in points}
    assert results <= {"started", "skipped_busy", "skipped_precheck", "failed"}
    assert "started" in results or "skipped_busy" in results
