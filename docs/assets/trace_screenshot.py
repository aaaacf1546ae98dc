"""Screenshots of real traces in a real viewer (Arize Phoenix) for docs/guide/observability.md.

It starts Phoenix on loopback, exports to it over OTLP/HTTP from this process (the app, its
requests traced by the FastAPI instrumentation) and from a real arq worker process (set up
from the standard ``OTEL_*`` variables only), runs (a) a foreground run with a tool call and
(b) a background run that pauses for approval and is resumed, and screenshots three trace views
with headless Chromium into ``trace-phoenix-{foreground,run,resume}.png`` beside it.
Nothing imports it; it needs packages the project does not depend on. Re-run it from the
repository root, in a virtualenv of its own, with a Redis to use (its keys are removed after):

    python -m venv /tmp/viewer-venv && apt-get install -y chromium
    /tmp/viewer-venv/bin/pip install ".[otel,cost]" arize-phoenix playwright \
        opentelemetry-exporter-otlp-proto-http opentelemetry-instrumentation-fastapi
    PYTHONPATH=. AGENT_REDIS_URL=redis://127.0.0.1:6379/0 \
        /tmp/viewer-venv/bin/python docs/assets/trace_screenshot.py

``--phoenix http://127.0.0.1:6006`` exports to a Phoenix already running (and leaves it);
``--chromium PATH`` names the browser (default ``/usr/bin/chromium``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent_plugin import Agent
from agent_plugin.jobs import JobOptions
from agent_plugin.messages import ChatMessage, Role, TokenUsage
from agent_plugin.policy import ASK, ToolRules
from agent_plugin.pricing import ModelPrice, Prices
from agent_plugin.telemetry import Telemetry
from agent_plugin.testing import FunctionModel, ModelCall, Reply, tool_call
from agent_plugin.tools import ToolEffect, tool
from agent_plugin.web import AgentPlugin

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PROJECT = "fastapi-agent-plugin"
MODEL = "gpt-4o-mini"
USAGE = TokenUsage(input_tokens=812, output_tokens=41, cache_read_tokens=512)
CONFIG = f"""[agent]
provider = "scripted"
max_steps = 8
trace_content = true

[agent.prices."{MODEL}"]
input = 0.15
output = 0.6
cache_read = 0.075
"""


@tool
async def get_weather(city: str) -> dict[str, Any]:
    """The weather in a city."""
    await asyncio.sleep(0.05)
    return {"city": city, "sky": "clear", "celsius": 21}


@tool(effect=ToolEffect.EXTERNAL)
async def send_email(to: str, body: str) -> str:
    """Send an email; a person approves it first."""
    await asyncio.sleep(0.03)
    return f"sent to {to}"


def plan(messages: list[ChatMessage], call: ModelCall) -> Reply:
    """The model: look up the weather, email it when asked to, then answer."""
    start = max(i for i, m in enumerate(messages) if m.role is Role.USER and not m.tool_calls)
    results = sum(1 for m in messages[start + 1 :] if m.role is Role.TOOL)
    wants_email = "email" in messages[start].text.lower()
    if results == 0:
        return [tool_call("get_weather", {"city": "Paris"}, id=f"w{start}")]
    if results == 1 and wants_email:
        body = "Paris: clear, 21 °C."
        return [tool_call("send_email", {"to": "ada@example.com", "body": body}, id=f"e{start}")]
    return "Ada has the forecast: clear and 21 °C." if wants_email else "Clear and 21 °C."


def model() -> FunctionModel:
    return FunctionModel(plan, usage=USAGE, models=(MODEL,))


def make_plugin() -> AgentPlugin:
    """The app's and the worker's plugin, from the ``AGENT_*`` and ``SHOT_*`` variables."""
    token = os.environ["SHOT_TOKEN"]
    return AgentPlugin(
        tools=[get_weather, send_email],
        policy=ToolRules().for_tool("send_email", ASK),
        model=model(),
        jobs=JobOptions(
            queue_name=f"trace-shot-{token}:queue",
            key_prefix=f"trace-shot-{token}:",
            poll_delay=0.05,
        ),
    )


def _configure_otel() -> Any:
    """A tracer provider exporting over OTLP/HTTP, from the ``OTEL_*`` variables alone."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


def mark_ready() -> None:
    Path(os.environ["SHOT_READY"]).write_text(str(os.getpid()))


def __getattr__(name: str) -> Any:
    """``WorkerSettings``, for ``python -m arq trace_screenshot.WorkerSettings``."""
    if name != "WorkerSettings":
        raise AttributeError(name)
    _configure_otel()
    settings = make_plugin().worker_settings()
    startup = settings.on_startup

    async def on_startup(ctx: dict[str, Any]) -> None:
        await startup(ctx)
        mark_ready()

    settings.on_startup = on_startup
    return settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Any, what: str, within: float = 60.0) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise SystemExit(f"gave up waiting for {what}")


def get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())
    except OSError:
        return None


def start_phoenix(directory: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port, grpc = free_port(), free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(directory),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc),
    }
    with (directory / "phoenix.out").open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "phoenix.server.main", "serve"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: get_json(f"{url}/v1/projects") is not None, "Phoenix to start", 120)
    return url, process


async def runs() -> str:
    """The two runs; the background run's id."""
    import httpx
    from fastapi import FastAPI
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    from agent_plugin.storage import Database

    provider = _configure_otel()
    database = Database(os.environ["AGENT_DATABASE_URL"])
    await database.migrate()
    await database.dispose()

    # (a) a foreground run, in the app's process
    telemetry = Telemetry(
        record_content=True,
        prices=Prices({MODEL: ModelPrice(input=0.15, output=0.6, cache_read=0.075)}),
    )
    foreground = Agent(model(), tools=[get_weather], telemetry=telemetry)
    outcome = await foreground.run("What is the weather in Paris?")
    print("foreground:", type(outcome).__name__)

    # (b) a background run on the worker: it pauses for approval and is resumed
    app = FastAPI()
    plugin = make_plugin()
    plugin.install(app, runs_route=True, allow_anonymous=True)
    FastAPIInstrumentor.instrument_app(
        app,
        exclude_spans=["receive", "send"],
        excluded_urls="agent/runs/run_[0-9a-f]+$",  # the status polls: a trace each
    )
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://app") as http,
    ):
        prompt = "Email Ada the weather in Paris."
        handle = (await http.post("/agent/runs", json={"prompt": prompt})).json()
        path = handle["status_path"]
        paused = await until_status(http, path, "awaiting_approval")
        decisions = [
            {"call_id": call["call_id"], "approval": {"verdict": "approve"}}
            for call in paused["awaiting"]
        ]
        accepted = await http.post(f"{path}/decisions", json=decisions)
        accepted.raise_for_status()
        done = await until_status(http, path, "complete")
        print("background:", done["status"], done["outcome"]["usage"])
    provider.force_flush()
    return handle["run_id"]


async def until_status(http: Any, path: str, status: str) -> dict[str, Any]:
    for _ in range(600):
        record: dict[str, Any] = (await http.get(path)).json()
        if record["status"] == status:
            return record
        if record["status"] not in ("queued", "in_progress", "awaiting_approval"):
            raise SystemExit(f"the run ended {record['status']}: {record}")
        await asyncio.sleep(0.05)
    raise SystemExit(f"the run did not reach {status}")


def spans_of(url: str, since: datetime) -> list[dict[str, Any]]:
    """The project's spans that started after ``since``."""
    found = get_json(f"{url}/v1/projects/{PROJECT}/spans?limit=1000")
    spans = found["data"] if found else []
    return [s for s in spans if datetime.fromisoformat(s["start_time"]) >= since]


SHOTS = {
    # file: (the trace's root span, the span shown (the first of that name), the height shown)
    "trace-phoenix-foreground.png": ("invoke_agent", "execute_tool get_weather", 800),
    "trace-phoenix-run.png": ("POST /agent/runs", "chat gpt-4o-mini", 1054),
    "trace-phoenix-resume.png": ("POST /agent/runs/{run_id}/decisions", "invoke_agent", 1054),
}


def screenshots(url: str, chromium: str, since: datetime) -> None:
    """Each trace of :data:`SHOTS`, one span selected, cropped to the trace's panel."""
    from playwright.sync_api import sync_playwright

    def complete() -> list[dict[str, Any]] | None:
        spans = spans_of(url, since)
        names = [s["name"] for s in spans]
        wanted = ["invoke_agent"] * 3 + ["resume_approval", "await_approval", "POST /agent/runs"]
        return spans if all(names.count(n) >= wanted.count(n) for n in set(wanted)) else None

    spans = wait_for(complete, "the spans in Phoenix")
    projects = get_json(f"{url}/v1/projects")["data"]
    project = next(p["id"] for p in projects if p["name"] == PROJECT)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1600, "height": 1100})
        for file, (root_name, shown_name, height) in SHOTS.items():
            root = next(s for s in spans if s["name"] == root_name and not s["parent_id"])
            trace_id = root["context"]["trace_id"]
            shown = min(
                (
                    s
                    for s in spans
                    if s["context"]["trace_id"] == trace_id and s["name"] == shown_name
                ),
                key=lambda s: str(s["start_time"]),
            )
            page.goto(
                f"{url}/projects/{project}/traces/{trace_id}?selectedSpanNodeId={shown['id']}",
                wait_until="networkidle",
            )
            page.get_by_role("tab", name="Attributes").click()
            page.wait_for_load_state("networkidle")
            page.wait_for_timeout(1500)
            page.screenshot(
                path=HERE / file, clip={"x": 400, "y": 46, "width": 1200, "height": height}
            )
            print("wrote", file)
        browser.close()


def clean_redis(url: str, token: str, run_id: str) -> None:
    """Remove the keys of this script's queue and of its run."""
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"*{token}*"))
    if run_id:
        keys += client.scan_iter(match=f"*{run_id}*")
    if keys:
        client.delete(*keys)
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phoenix", help="a running Phoenix's URL (default: start one)")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    from phoenix import __version__  # fail early: the viewer is not a project dependency

    print("Arize Phoenix", __version__)

    with tempfile.TemporaryDirectory(prefix="trace-shot-") as tmp:
        directory = Path(tmp)
        if args.phoenix:
            shoot(directory, args.phoenix.rstrip("/"), args.chromium)
            return
        url, phoenix = start_phoenix(directory)
        try:
            shoot(directory, url, args.chromium)
        finally:
            phoenix.send_signal(signal.SIGTERM)
            phoenix.wait(30)


def shoot(directory: Path, url: str, chromium: str) -> None:
    """The runs, exported to the Phoenix at ``url``, and the screenshots of their traces."""
    started = datetime.now(UTC)
    ready = directory / "worker.ready"
    config = directory / "agent.toml"
    config.write_text(CONFIG, encoding="utf-8")
    os.environ.update(
        {
            "AGENT_CONFIG_FILE": str(config),
            "AGENT_DATABASE_URL": f"sqlite+aiosqlite:///{directory / 'runs.db'}",
            "AGENT_REDIS_URL": os.environ.get("AGENT_REDIS_URL", "redis://127.0.0.1:6379/0"),
            "SHOT_TOKEN": uuid.uuid4().hex[:12],
            "SHOT_READY": str(ready),
            "OTEL_EXPORTER_OTLP_ENDPOINT": url,
            "OTEL_RESOURCE_ATTRIBUTES": f"openinference.project.name={PROJECT}",
        }
    )
    path = os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")])
    worker_env = {**os.environ, "OTEL_SERVICE_NAME": "agent-worker", "PYTHONPATH": path}
    os.environ["OTEL_SERVICE_NAME"] = "agent-app"
    with (directory / "worker.out").open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "arq", "trace_screenshot.WorkerSettings"],
            cwd=ROOT,
            env=worker_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    run_id = ""
    try:
        wait_for(ready.exists, "the worker to start")
        run_id = asyncio.run(runs())
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
        print((directory / "worker.out").read_text(errors="replace")[-2000:])
        clean_redis(os.environ["AGENT_REDIS_URL"], os.environ["SHOT_TOKEN"], run_id)
    screenshots(url, chromium, started)


if __name__ == "__main__":
    main()
