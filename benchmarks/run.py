"""The benchmark suite (issue 9): ``python -m benchmarks.run`` or ``python benchmarks/run.py``.

Every scenario measures ``Agent`` (with ``OpenAICompatibleClient`` / ``AnthropicClient``) and
the hand-written httpx loop of :mod:`benchmarks.baseline` in the same run, against the scripted
model server of :mod:`benchmarks.model_server` in its own process, and reports ratios: on a
shared 2-core machine absolute timings drift, ratios of interleaved measurements much less.
The client runs pinned to CPU 0, the server to CPU 1 (when the machine has two).

* S1  one run of 200 sequential tool rounds, zero latency: wall and CPU µs per step.
* S2  2 parallel tool calls per round, 100 rounds.
* S3  300 concurrent runs × 5 model calls at 50 ms latency: total wall vs the ideal 250 ms,
      peak RSS per in-flight run; each variant in a fresh process.
* S4  marginal cost per step at 1, 10, 50, 200 steps over HTTP, and in process
      (:mod:`benchmarks.bench_loop`).
* S5  ``import agent_plugin`` in a fresh interpreter; the first request of a fresh app.
* S6  session append (``benchmarks/bench_sessions.py``, when present).
* S7  background runs through one arq worker vs arq's own no-op jobs (the target) and vs arq
      jobs that make only a run's durable writes, and the cost of step checkpoints
      (:mod:`benchmarks.bench_jobs`, in a subprocess).

Per-step figures are the minimum over repeats (the least disturbed run); medians are in the
JSON. CPU is ``time.process_time()`` of the client process; the server's own CPU per request
(user + kernel, read from its ``/stats``) is shown beside every figure. Results go to
``benchmarks/results/latest.md`` and ``latest.json``; the markdown is printed too. No timing is
ever asserted: ``--quick`` is a smoke run (smaller sizes, fewer repeats) for CI.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from agent_plugin.agent import Agent
from agent_plugin.options import RunOptions
from agent_plugin.outcomes import Completed
from agent_plugin.providers.anthropic import AnthropicClient
from agent_plugin.providers.openai import OpenAICompatibleClient
from agent_plugin.tools import FnTool
from benchmarks import baseline
from benchmarks.model_server import ServerProcess, pin_to

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
CLIENT_CPU, SERVER_CPU = 0, 1
WIRES = ("openai", "anthropic")


# --- subjects: ours and the baseline, behind one shape -----------------------------------------


async def _lookup(arguments: Any) -> Any:
    return baseline.lookup(arguments)


LOOKUP = FnTool("lookup", "Looks a number up.", baseline.SCHEMA, _lookup)


def make_transport(kind: str) -> httpx.AsyncBaseTransport | None:
    """The httpx transport of a variant: ``default`` (httpx's own, default pool limits),
    ``pool`` (httpx's own, 1000 connections kept alive), ``aiohttp`` (httpx-aiohttp) or
    ``lean`` (:class:`agent_plugin.providers.lean.LeanTransport`, the same bound)."""
    if kind == "default":
        return None
    if kind == "pool":
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
        return httpx.AsyncHTTPTransport(limits=limits)
    if kind == "aiohttp":
        from httpx_aiohttp import AiohttpTransport

        return AiohttpTransport(limits=httpx.Limits(max_connections=1000))
    raise ValueError(f"unknown transport {kind!r}")


def has_aiohttp_transport() -> bool:
    try:
        import httpx_aiohttp  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class Subject:
    """One thing under test: runs a conversation from a prompt, returns its tool rounds."""

    label: str
    run: Callable[[str], Awaitable[int]]
    close: Callable[[], Awaitable[None]]


def make_subject(
    who: str, wire: str, url: str, *, stream: bool = False, transport: str = "default"
) -> Subject:
    label = f"{who} {wire}{' stream' if stream else ''}"
    if transport != "default":
        label += f" [{transport}]"
    if who == "baseline":
        client = baseline.new_client(make_transport(transport))
        loop = baseline.openai_loop if wire == "openai" else baseline.anthropic_loop

        async def run_baseline(prompt: str) -> int:
            return await loop(client, url, prompt, stream=stream)

        return Subject(label, run_baseline, client.aclose)
    model: OpenAICompatibleClient | AnthropicClient
    if wire == "openai":
        model = OpenAICompatibleClient(
            model="bench-model", base_url=url + "/v1", transport=make_transport(transport)
        )
    else:
        model = AnthropicClient(
            model="bench-model", base_url=url, transport=make_transport(transport)
        )
    agent = Agent(
        model,
        tools=[LOOKUP],
        system_prompt=baseline.SYSTEM,
        max_steps=10_000,
        max_tokens=10**9,
    )

    async def run_ours(prompt: str) -> int:
        turn = await agent.run(prompt, options=RunOptions(stream=stream))
        if not isinstance(turn.outcome, Completed):
            raise RuntimeError(f"{label}: the run ended {turn.outcome!r}")
        return turn.outcome.steps_used

    return Subject(label, run_ours, model.aclose)


def prompt_for(steps: int, parallel: int = 1, latency_ms: int = 0) -> str:
    return f"STEPS={steps} PARALLEL={parallel} LATENCY_MS={latency_ms} look the numbers up"


# --- measuring ---------------------------------------------------------------------------------


@dataclass
class Sample:
    wall: float
    cpu: float
    server_cpu: float
    server_requests: int
    connections: int


@dataclass
class Series:
    """Repeated samples of one subject on one script."""

    samples: list[Sample] = field(default_factory=list)

    def best(self, attr: str) -> float:
        return min(float(getattr(s, attr)) for s in self.samples)

    def median(self, attr: str) -> float:
        return statistics.median(float(getattr(s, attr)) for s in self.samples)

    def connections_per_request(self) -> float:
        """New connections the client opened per request (0 when it reuses one)."""
        return statistics.median(s.connections / max(s.server_requests, 1) for s in self.samples)

    def server_cpu_per_request(self) -> float:
        return statistics.median(s.server_cpu / max(s.server_requests, 1) for s in self.samples)


async def sample(subject: Subject, prompt: str, rounds: int, server: ServerProcess) -> Sample:
    """One timed run, right after an untimed one-round run of the same subject: a CPU that sat
    idle (reading the server's stats, collecting garbage) runs its first request slowly, which
    would land on whichever sample came first. The server's CPU per request covers both."""
    gc.collect()
    before = server.stats()
    await subject.run(prompt_for(1))
    wall, cpu = time.perf_counter(), time.process_time()
    done = await subject.run(prompt)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after = server.stats()
    if done != rounds:
        raise RuntimeError(f"{subject.label}: {done} tool rounds, expected {rounds}")
    return Sample(
        wall,
        cpu,
        after.cpu - before.cpu,
        after.requests - before.requests - 1,
        after.connections - before.connections - 1,
    )


async def measure(
    subjects: list[Subject], prompt: str, rounds: int, repeats: int, server: ServerProcess
) -> dict[str, Series]:
    """Interleaved repeats (the order rotates), after one warm-up run of each subject."""
    for subject in subjects:
        await subject.run(prompt_for(1))
    series = {s.label: Series() for s in subjects}
    for repeat in range(repeats):
        shift = repeat % len(subjects)
        for subject in subjects[shift:] + subjects[:shift]:
            series[subject.label].samples.append(await sample(subject, prompt, rounds, server))
    return series


def ratio(ours: float, base: float) -> float:
    return ours / base if base > 0 else float("nan")


# --- S1 and S2: one long run ---------------------------------------------------------------


async def long_run(
    url: str, server: ServerProcess, *, steps: int, parallel: int, repeats: int, stream_too: bool
) -> list[dict[str, Any]]:
    rows = []
    modes = (False, True) if stream_too else (False,)
    for wire in WIRES:
        for stream in modes:
            ours = make_subject("ours", wire, url, stream=stream)
            base = make_subject("baseline", wire, url, stream=stream)
            try:
                series = await measure(
                    [ours, base], prompt_for(steps, parallel), steps, repeats, server
                )
            finally:
                await ours.close()
                await base.close()
            o, b = series[ours.label], series[base.label]
            rows.append(
                {
                    "wire": wire,
                    "mode": "stream" if stream else "whole",
                    "ours_wall_us": o.best("wall") / steps * 1e6,
                    "base_wall_us": b.best("wall") / steps * 1e6,
                    "wall_ratio": ratio(o.best("wall"), b.best("wall")),
                    "ours_cpu_us": o.best("cpu") / steps * 1e6,
                    "base_cpu_us": b.best("cpu") / steps * 1e6,
                    "cpu_ratio": ratio(o.best("cpu"), b.best("cpu")),
                    "median_wall_ratio": ratio(o.median("wall"), b.median("wall")),
                    "median_cpu_ratio": ratio(o.median("cpu"), b.median("cpu")),
                    "server_cpu_us_per_request": {
                        "ours": o.server_cpu_per_request() * 1e6,
                        "baseline": b.server_cpu_per_request() * 1e6,
                    },
                    "connections_per_request": {
                        "ours": o.connections_per_request(),
                        "baseline": b.connections_per_request(),
                    },
                    "repeats": repeats,
                }
            )
    return rows


# --- S3: many concurrent runs, each variant in a fresh process -----------------------------------


def _rss_kb() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


async def s3_child(
    variant: str, url: str, runs: int, steps: int, latency_ms: int
) -> dict[str, Any]:
    """One S3 measurement in this (fresh) process; ``variant`` is ``who:wire:transport``."""
    who, wire, transport = variant.split(":")
    subject = make_subject(who, wire, url, transport=transport)
    try:
        await subject.run(prompt_for(1))  # imports, first connection
        gc.collect()
        rss_before = _rss_kb()
        prompt = prompt_for(steps, 1, latency_ms)
        wall, cpu = time.perf_counter(), time.process_time()
        done = await asyncio.gather(*(subject.run(prompt) for _ in range(runs)))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    finally:
        await subject.close()
    if any(d != steps for d in done):
        raise RuntimeError(f"{variant}: some runs did not take {steps} rounds")
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "rss_before_kb": rss_before,
        "peak_rss_kb": peak,
        "kb_per_run": (peak - rss_before) / runs,
    }


def run_s3_variant(
    variant: str, server: ServerProcess, runs: int, steps: int, latency_ms: int
) -> dict[str, Any]:
    before = server.stats()
    command = [
        sys.executable,
        str(HERE / "run.py"),
        "--child-s3",
        variant,
        "--url",
        server.url,
        "--runs",
        str(runs),
        "--steps",
        str(steps),
        "--latency-ms",
        str(latency_ms),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    after = server.stats()
    if done.returncode != 0:
        raise RuntimeError(f"S3 {variant} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    requests = max(after.requests - before.requests - 1, 1)
    result["server_cpu_us_per_request"] = (after.cpu - before.cpu) / requests * 1e6
    result["connections_per_request"] = (after.connections - before.connections - 1) / requests
    return result


def s3(
    server: ServerProcess, *, runs: int, steps: int, latency_ms: int, repeats: int, quick: bool
) -> dict[str, Any]:
    calls = steps + 1
    ideal = calls * latency_ms / 1000
    variants = [
        "ours:openai:default",
        "baseline:openai:default",
        "ours:anthropic:default",
        "baseline:anthropic:default",
        "ours:openai:pool",
        "baseline:openai:pool",
    ]
    if has_aiohttp_transport():
        variants += ["ours:openai:aiohttp", "baseline:openai:aiohttp"]
    if quick:
        variants = [v for v in variants if ":openai:" in v and not v.endswith(":pool")]
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for repeat in range(repeats):
        for variant in variants:
            if repeat and variant.endswith(":pool"):
                continue  # slow (see the report), and one sample shows it
            results[variant].append(run_s3_variant(variant, server, runs, steps, latency_ms))
    rows = []
    for variant, samples in results.items():
        best = min(samples, key=lambda s: s["wall_s"])
        rows.append(
            {
                "variant": variant,
                "wall_s": best["wall_s"],
                "x_ideal": best["wall_s"] / ideal,
                "cpu_ms_per_request": best["cpu_s"] / (runs * calls) * 1e3,
                "kb_per_run": statistics.median(s["kb_per_run"] for s in samples),
                "server_cpu_us_per_request": statistics.median(
                    s["server_cpu_us_per_request"] for s in samples
                ),
                "connections_per_request": statistics.median(
                    s["connections_per_request"] for s in samples
                ),
                "walls_s": [s["wall_s"] for s in samples],
            }
        )
    return {
        "runs": runs,
        "calls_per_run": calls,
        "latency_ms": latency_ms,
        "ideal_s": ideal,
        "repeats": repeats,
        "rows": rows,
    }


# --- S4: flatness ------------------------------------------------------------------------------


async def s4_http(
    url: str,
    server: ServerProcess,
    *,
    steps_list: tuple[int, ...],
    wires: tuple[str, ...],
    repeats: int,
) -> list[dict[str, Any]]:
    """Marginal per-step cost (T(N) - T(0)) / N, T the least of the repeats, over HTTP."""
    rows = []
    for wire in wires:
        ours = make_subject("ours", wire, url)
        base = make_subject("baseline", wire, url)
        try:
            totals: dict[int, dict[str, Series]] = {}
            for steps in (0, *steps_list):
                more = 3 if steps <= 10 else 1  # small runs are cheap and noisier: sample more
                totals[steps] = await measure(
                    [ours, base], prompt_for(steps), steps, repeats * more, server
                )
        finally:
            await ours.close()
            await base.close()
        for who, subject in (("ours", ours), ("baseline", base)):
            fixed = totals[0][subject.label]
            for steps in steps_list:
                series = totals[steps][subject.label]
                rows.append(
                    {
                        "wire": wire,
                        "who": who,
                        "steps": steps,
                        "wall_us": (series.best("wall") - fixed.best("wall")) / steps * 1e6,
                        "cpu_us": (series.best("cpu") - fixed.best("cpu")) / steps * 1e6,
                    }
                )
    return rows


def flatness(rows: list[dict[str, Any]], wire: str, key: str) -> dict[str, float]:
    """Per-step at the most steps over per-step at 1 step, for ours and the baseline, and ours
    with the baseline's growth (the cost of the longer request itself) taken out."""

    def per(who: str) -> dict[int, float]:
        return {r["steps"]: r[key] for r in rows if r["wire"] == wire and r["who"] == who}

    ours, base = per("ours"), per("baseline")
    low, high = min(ours), max(ours)
    adjusted = (ours[high] - (base[high] - base[low])) / ours[low]
    return {
        "steps": high,
        "ours": ours[high] / ours[low],
        "baseline": base[high] / base[low],
        "ours_minus_request_growth": adjusted,
    }


async def s4_in_process(repeats: int) -> dict[str, Any]:
    from benchmarks import bench_loop

    bench_loop.REPEATS = repeats
    fixed, rows = await bench_loop.measure()
    return {
        "fixed": fixed,
        "rows": rows,
        "flatness": rows[-1]["agent_us"] / rows[0]["agent_us"],
        "repeats": repeats,
    }


# --- S5: import and first request ----------------------------------------------------------------

_IMPORT_PROBE = """
import json, sys, time
start = time.perf_counter()
import agent_plugin
took = time.perf_counter() - start
heavy = ("fastapi", "starlette", "sqlalchemy", "alembic", "asyncpg", "aiosqlite", "arq",
         "redis", "pydantic_settings", "httpx", "pydantic")
print(json.dumps({"s": took, "loaded": [m for m in heavy if m in sys.modules]}))
"""


def _cached_bytecode_env(pycache: str) -> dict[str, str]:
    """A fresh interpreter's environment with bytecode cached under ``pycache``.

    An installed package starts from bytecode (``pip install`` compiles every module), while a
    checkout run with ``PYTHONDONTWRITEBYTECODE=1`` (set in many containers, this one included)
    compiles the package's sources again on every start: tens of milliseconds that no user
    pays. The cache lives outside the source tree; its first run writes it and is not counted.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": pycache}


def s5(server: ServerProcess, *, repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="s5-pycache-") as pycache:
        cached = _cached_bytecode_env(pycache)
        environments = {"cached": cached, "as_is": dict(os.environ)}
        imports: dict[str, list[dict[str, Any]]] = {name: [] for name in environments}
        for attempt in range(repeats + 1):  # the first ones write the bytecode: not counted
            for name, env in environments.items():  # interleaved: the same noise for both
                done = subprocess.run(
                    [sys.executable, "-c", _IMPORT_PROBE],
                    capture_output=True,
                    text=True,
                    check=True,
                    env=env,
                )
                if attempt:
                    imports[name].append(json.loads(done.stdout))
        importtime = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", "import agent_plugin"],
            capture_output=True,
            text=True,
            check=True,
            env=cached,
        )
        apps = []
        for attempt in range(max(1, repeats // 3) + 1):  # the first one caches FastAPI's too
            done = subprocess.run(
                [sys.executable, str(HERE / "fresh_app.py"), server.url],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
                env=cached,
            )
            if done.returncode != 0:
                raise RuntimeError(f"fresh app failed:\n{done.stderr[-3000:]}")
            if attempt:
                apps.append(json.loads(done.stdout.strip().splitlines()[-1]))
    keys = ("import_s", "build_s", "startup_s", "first_request_s", "second_request_s")
    as_is = [i["s"] for i in imports["as_is"]]
    return {
        "import_s_median": statistics.median(i["s"] for i in imports["cached"]),
        "import_s_all": [i["s"] for i in imports["cached"]],
        "import_as_is_s_median": statistics.median(as_is),
        "import_as_is_s_all": as_is,
        "dont_write_bytecode": bool(os.environ.get("PYTHONDONTWRITEBYTECODE")),
        "loaded_by_import": imports["cached"][0]["loaded"],
        "slowest_imports": _slowest_imports(importtime.stderr),
        "fresh_app": {k: statistics.median(a[k] for a in apps) for k in keys},
        "imported_by_first_request": sorted(
            {m for a in apps for m in a["imported_by_first_request"]}
        ),
        "fresh_app_runs": len(apps),
    }


def _slowest_imports(report: str, top: int = 8) -> list[tuple[str, float]]:
    """The modules with the most import time of their own (``-X importtime``'s self column)."""
    own: list[tuple[str, float]] = []
    for line in report.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            own.append((parts[2].strip(), int(parts[0].rsplit(":", 1)[1]) / 1e6))
    return sorted(own, key=lambda item: -item[1])[:top]


# --- S6 ------------------------------------------------------------------------------------------


def s6(quick: bool) -> dict[str, Any]:
    """Runs benchmarks/bench_sessions.py (owned elsewhere) and keeps its printed tables, plus
    the append ratios from the results/sessions.json it writes, when that has them."""
    script = HERE / "bench_sessions.py"
    if not script.exists():
        return {"status": "not present: benchmarks/bench_sessions.py does not exist yet"}
    started = time.time()
    command = [sys.executable, str(script)]
    if quick and "--quick" in script.read_text():
        command.append("--quick")
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=30 if quick else 900, check=False
        )
    except subprocess.TimeoutExpired:
        return {"status": "timed out", "command": command}
    ratios: dict[str, float] = {}
    written = RESULTS / "sessions.json"
    if done.returncode == 0 and written.exists() and written.stat().st_mtime >= started:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            data = json.loads(written.read_text())
            ratios = {
                backend: float(values["ratio"])
                for backend, values in data.items()
                if isinstance(values, dict) and "ratio" in values
            }
    return {
        "status": "ran" if done.returncode == 0 else f"failed (exit {done.returncode})",
        "command": command[1:],
        "output": done.stdout.strip(),
        "append_ratios": ratios,
        "stderr_tail": done.stderr.strip()[-2000:] if done.returncode else "",
    }


# --- S7 ------------------------------------------------------------------------------------------


def s7(quick: bool) -> dict[str, Any]:
    """Runs benchmarks/bench_jobs.py (Redis, SQLite, PostgreSQL; its own process) and keeps the
    report it writes to results/jobs.json."""
    started = time.time()
    command = [sys.executable, str(HERE / "bench_jobs.py"), *(["--quick"] if quick else [])]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=90 if quick else 1200, check=False
        )
    except subprocess.TimeoutExpired:
        return {"status": "timed out", "command": command[1:]}
    written = RESULTS / "jobs.json"
    if done.returncode != 0 or not written.exists() or written.stat().st_mtime < started:
        return {
            "status": f"failed (exit {done.returncode})",
            "command": command[1:],
            "stderr_tail": done.stderr.strip()[-2000:],
        }
    return {"status": "ran", "command": command[1:], "report": json.loads(written.read_text())}


def s7_markdown(data: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """S7's section of the report (its tables, or why it did not run) and its target rows."""
    out = ["## S7: background runs through one arq worker", ""]
    if "report" not in data:
        out += [f"Status: {data['status']}.", ""]
        if data.get("stderr_tail"):
            out += ["```", data["stderr_tail"], "```", ""]
        return out, []
    from benchmarks import bench_jobs

    out += [bench_jobs.render(data["report"]), ""]
    return out, data["report"].get("targets") or bench_jobs.target_rows(data["report"])


# --- the server check --------------------------------------------------------------------------


async def server_check(server: ServerProcess, requests: int) -> dict[str, Any]:
    """The server alone, hit by a raw-socket client with a prebuilt 200-round request."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": baseline.SYSTEM},
        {"role": "user", "content": prompt_for(201)},
    ]
    for i in range(200):
        call = {
            "id": f"call_{i}_0",
            "type": "function",
            "function": {"name": "lookup", "arguments": json.dumps({"i": i})},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}_0", "content": "{}"})
    body = json.dumps({"model": "m", "messages": messages, "tools": baseline.OPENAI_TOOLS}).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    ) + body
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        before = server.stats()
        wall = time.perf_counter()
        for _ in range(requests):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            at = head.find(b"content-length: ")
            await reader.readexactly(int(head[at + 16 : head.find(b"\r\n", at)]))
        wall = time.perf_counter() - wall
        after = server.stats()
    finally:
        writer.close()
    served = after.requests - before.requests - 1
    return {
        "request_bytes": len(request),
        "round_trip_us": wall / requests * 1e6,
        "server_cpu_us_per_request": (after.cpu - before.cpu) / served * 1e6,
        "server_user_us_per_request": (after.user - before.user) / served * 1e6,
        "requests": served,
    }


# --- report --------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = ""
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "httpx": httpx.__version__,
        "load_average_at_start": os.getloadavg(),
    }


def _f(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def _x(value: float) -> str:
    return f"{value:.2f}×"


def _verdict(measured: float, target: float) -> str:
    """ "met", or how far over an upper-bound target the measurement is."""
    if measured <= target:
        return "met"
    return f"missed by {(measured / target - 1) * 100:.0f}% ({measured / target:.2f}× the target)"


def render(report: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    m = report["machine"]
    out = [
        f"# Benchmarks{' (quick smoke run)' if report['quick'] else ''}",
        "",
        f"Machine: {m['cpu']}, {m['cpus']} CPUs, Python {m['python']}, httpx {m['httpx']}, "
        f"load average (1 min) {m['load_average_at_start'][0]:.2f} at the start and "
        f"{m['load_average_at_end'][0]:.2f} at the end (above 1, other work shared the machine "
        "and absolute figures are inflated; ratios much less). Client pinned to CPU "
        f"{CLIENT_CPU}, model server (separate process) to CPU {SERVER_CPU}. Figures are the "
        "minimum over interleaved repeats; ratios are ours / baseline measured in the same run.",
        "",
    ]
    targets: list[dict[str, Any]] = []
    sc = report["scenarios"]

    check = sc["server_check"]
    out += [
        "## The model server alone",
        "",
        f"Raw-socket client, {check['requests']} keep-alive requests of "
        f"{check['request_bytes']:,} bytes (a 200-round conversation): round trip "
        f"{_f(check['round_trip_us'])} µs, server CPU {_f(check['server_cpu_us_per_request'])} µs "
        f"per request ({_f(check['server_user_us_per_request'])} µs of it in Python/user space).",
        "",
    ]

    for key, title, per in (
        ("S1", "S1: one run, sequential tool rounds, zero latency", "step"),
        ("S2", "S2: 2 parallel tool calls per round, zero latency", "round"),
    ):
        data = sc[key]
        out += [
            f"## {title} ({data['steps']} rounds, {data['rows'][0]['repeats']} repeats)",
            "",
            f"| wire | mode | ours wall µs/{per} | baseline wall µs/{per} | wall ratio "
            f"| ours CPU µs/{per} | baseline CPU µs/{per} | CPU ratio | median wall ratio "
            "| server CPU µs/req (ours / base) | new connections per request (ours / base) |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in data["rows"]:
            server = row["server_cpu_us_per_request"]
            connections = row["connections_per_request"]
            out.append(
                f"| {row['wire']} | {row['mode']} | {_f(row['ours_wall_us'])} "
                f"| {_f(row['base_wall_us'])} | {_x(row['wall_ratio'])} "
                f"| {_f(row['ours_cpu_us'])} | {_f(row['base_cpu_us'])} "
                f"| {_x(row['cpu_ratio'])} | {_x(row['median_wall_ratio'])} "
                f"| {_f(server['ours'])} / {_f(server['baseline'])} "
                f"| {_f(connections['ours'], 2)} / {_f(connections['baseline'], 2)} |"
            )
            if key == "S1":
                targets.append(
                    {
                        "target": f"S1 {row['wire']} {row['mode']}: wall/step ≤ 1.3× baseline",
                        "measured": row["wall_ratio"],
                        "verdict": _verdict(row["wall_ratio"], 1.3),
                    }
                )
        out.append("")

    data = sc["S3"]
    out += [
        f"## S3: {data['runs']} concurrent runs × {data['calls_per_run']} model calls at "
        f"{data['latency_ms']} ms (ideal {data['ideal_s'] * 1000:.0f} ms, "
        f"{data['repeats']} repeats, each in a fresh process)",
        "",
        "Variants: `default` is httpx's own transport with its default pool (100 connections, "
        "20 kept alive), what the library uses unless given a transport; `pool` is the same "
        "transport with 1000 connections kept alive; `aiohttp` is the httpx-aiohttp transport; "
        "`lean` is the library's `LeanTransport` (HTTP/1.1 on asyncio protocols, "
        "`AgentPlugin(http_transport=LeanTransport)`), bounded to 1000 connections like the "
        "others. The target is met when any library configuration meets it; the `default` "
        "rows are listed in the targets table for reference.",
        "",
        "| variant | wall ms | × ideal | client CPU ms/request | peak RSS KiB per run "
        "| server CPU µs/req | new connections per request |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in data["rows"]:
        out.append(
            f"| {row['variant']} | {_f(row['wall_s'] * 1000)} | {_x(row['x_ideal'])} "
            f"| {_f(row['cpu_ms_per_request'], 2)} | {_f(row['kb_per_run'], 1)} "
            f"| {_f(row['server_cpu_us_per_request'])} "
            f"| {_f(row['connections_per_request'], 2)} |"
        )
        who, _, engine = row["variant"].split(":")
        if who == "ours" and engine in ("lean", "default"):
            targets.append(
                {
                    "target": f"S3 {row['variant']}: wall ≤ 3× ideal"
                    + (" (httpx's own transport, for reference)" if engine == "default" else ""),
                    "measured": row["x_ideal"],
                    "verdict": _verdict(row["x_ideal"], 3.0),
                }
            )
    out.append("")

    data = sc["S4"]
    out += [
        "## S4: marginal cost per step, (T(N) − T(0)) / N",
        "",
        "| wire | who | steps | wall µs/step | CPU µs/step |",
        "|---|---|---:|---:|---:|",
    ]
    for row in data["http"]:
        out.append(
            f"| {row['wire']} | {row['who']} | {row['steps']} | {_f(row['wall_us'])} "
            f"| {_f(row['cpu_us'])} |"
        )
    out += [
        "",
        "| wire | measure | ours N/1 | baseline N/1 | ours less the request's growth |",
        "|---|---|---:|---:|---:|",
    ]
    for wire, flat in data["flatness"].items():
        for key, value in flat.items():
            out.append(
                f"| {wire} | {key} per step, {value['steps']} vs 1 | {_x(value['ours'])} "
                f"| {_x(value['baseline'])} | {_x(value['ours_minus_request_growth'])} |"
            )
            if key == "wall":
                targets.append(
                    {
                        "target": f"S4 {wire}: {value['steps']}-step per-step ≤ 1.2× the 1-step "
                        "figure, apart from the request's bytes",
                        "measured": value["ours_minus_request_growth"],
                        "verdict": _verdict(value["ours_minus_request_growth"], 1.2),
                    }
                )
    inproc = data["in_process"]
    out += [
        "",
        f"In process (benchmarks/bench_loop.py, zero-latency model object, CPU, "
        f"{inproc['repeats']} repeats): fixed cost of a run Agent "
        f"{_f(inproc['fixed']['agent_us'])} µs vs hand loop "
        f"{_f(inproc['fixed']['hand_loop_us'])} µs.",
        "",
        "| steps | Agent µs/step | hand loop µs/step | ratio |",
        "|---:|---:|---:|---:|",
    ]
    for row in inproc["rows"]:
        out.append(
            f"| {row['steps']} | {_f(row['agent_us'], 1)} | {_f(row['hand_loop_us'], 1)} "
            f"| {_x(row['ratio'])} |"
        )
    out += ["", f"In process, 200-step vs 1-step per-step CPU: {_x(inproc['flatness'])}.", ""]

    data = sc["S5"]
    app = data["fresh_app"]
    as_is = "in this environment as it is"
    if data["dont_write_bytecode"]:
        as_is += " (PYTHONDONTWRITEBYTECODE=1: the checkout compiles its sources on every start)"
    out += [
        "## S5: start-up",
        "",
        f"`import agent_plugin` in a fresh interpreter, bytecode cached (as installed): median "
        f"{data['import_s_median'] * 1000:.0f} ms over {len(data['import_s_all'])}, least "
        f"{min(data['import_s_all']) * 1000:.0f} ms (loads: {', '.join(data['loaded_by_import'])})."
        f" Interleaved with those, {as_is}: median {data['import_as_is_s_median'] * 1000:.0f} ms,"
        f" least {min(data['import_as_is_s_all']) * 1000:.0f} ms.",
        "Most import time of their own (`-X importtime` self column, one run, bytecode cached): "
        + ", ".join(f"{name} {sec * 1000:.0f} ms" for name, sec in data["slowest_imports"])
        + ".",
        "",
        f"Fresh app (agent_plugin.web exists: FastAPI + AgentPlugin, in-memory sessions, "
        f"ASGI transport, bytecode cached, median of {data['fresh_app_runs']}): import FastAPI + "
        f"plugin {app['import_s'] * 1000:.0f} ms, build the app {app['build_s'] * 1000:.0f} ms, "
        f"startup {app['startup_s'] * 1000:.1f} ms, **first request "
        f"{app['first_request_s'] * 1000:.1f} ms**, second request "
        f"{app['second_request_s'] * 1000:.1f} ms (one tool round: two model calls). Modules "
        f"first imported during the first request: "
        f"{', '.join(data['imported_by_first_request']) or 'none'}.",
        "",
    ]
    targets.append(
        {
            "target": "S5: import agent_plugin < 0.3 s",
            "measured": data["import_s_median"],
            "verdict": _verdict(data["import_s_median"], 0.3),
        }
    )

    data = sc["S6"]
    out += ["## S6: session append", "", f"Status: {data['status']}."]
    if data.get("output"):
        out += ["", data["output"]]
    data = sc.get("S7") or {"status": "not run"}
    s7_lines, s7_targets = s7_markdown(data)
    out += ["", *s7_lines]

    out += ["## Targets", "", "| target | measured | verdict |", "|---|---:|---|"]
    for target in targets:
        measured = target["measured"]
        shown = f"{measured:.2f} s" if target["target"].startswith("S5") else _x(measured)
        out.append(f"| {target['target']} | {shown} | {target['verdict']} |")
    ratios = sc["S6"].get("append_ratios") or {}
    for backend, value in ratios.items():
        out.append(
            f"| S6 {backend}: append at 10,000 messages ≤ 1.5× at 10 | {_x(value)} "
            f"| {_verdict(value, 1.5)} |"
        )
    if not ratios:
        out.append(f"| S6: ≤ 1.5× | — | {sc['S6']['status']} |")
    for target in s7_targets:
        out.append(f"| {target['target']} | {_x(target['measured'])} | {target['verdict']} |")
    if "report" not in data:
        out.append(f"| S7: ≥ 0.7× | — | {data['status']} |")
    out.append("")
    return "\n".join(out), targets + s7_targets


# --- main ----------------------------------------------------------------------------------------


@dataclass
class Plan:
    quick: bool
    s1_steps: int
    s2_rounds: int
    repeats: int
    s3_runs: int
    s3_repeats: int
    s4_steps: tuple[int, ...]
    s4_wires: tuple[str, ...]
    s4_repeats: int
    in_process_repeats: int
    import_repeats: int
    check_requests: int

    @classmethod
    def of(cls, quick: bool) -> Plan:
        if quick:
            return cls(True, 50, 25, 2, 100, 1, (1, 10, 50), ("openai",), 2, 3, 3, 200)
        return cls(False, 200, 100, 7, 300, 3, (1, 10, 50, 200), WIRES, 5, 15, 9, 1000)


async def run_async(plan: Plan, server: ServerProcess, only: set[str]) -> dict[str, Any]:
    sc: dict[str, Any] = {}

    def log(message: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    log("server check")
    sc["server_check"] = await server_check(server, plan.check_requests)
    if "S1" in only:
        log(f"S1: {plan.s1_steps} rounds")
        sc["S1"] = {
            "steps": plan.s1_steps,
            "rows": await long_run(
                server.url,
                server,
                steps=plan.s1_steps,
                parallel=1,
                repeats=plan.repeats,
                stream_too=True,
            ),
        }
    if "S2" in only:
        log(f"S2: {plan.s2_rounds} rounds × 2 calls")
        sc["S2"] = {
            "steps": plan.s2_rounds,
            "rows": await long_run(
                server.url,
                server,
                steps=plan.s2_rounds,
                parallel=2,
                repeats=plan.repeats,
                stream_too=False,
            ),
        }
    if "S3" in only:
        log(f"S3: {plan.s3_runs} concurrent runs")
        sc["S3"] = s3(
            server,
            runs=plan.s3_runs,
            steps=4,
            latency_ms=50,
            repeats=plan.s3_repeats,
            quick=plan.quick,
        )
    if "S4" in only:
        log("S4: flatness")
        http_rows = await s4_http(
            server.url,
            server,
            steps_list=plan.s4_steps,
            wires=plan.s4_wires,
            repeats=plan.s4_repeats,
        )
        sc["S4"] = {
            "http": http_rows,
            "flatness": {
                wire: {key: flatness(http_rows, wire, f"{key}_us") for key in ("wall", "cpu")}
                for wire in plan.s4_wires
            },
            "in_process": await s4_in_process(plan.in_process_repeats),
        }
    if "S5" in only:
        log("S5: import and first request")
        sc["S5"] = s5(server, repeats=plan.import_repeats)
    if "S6" in only:
        log("S6: sessions")
        sc["S6"] = s6(plan.quick)
    if "S7" in only:
        log("S7: background runs through arq")
        sc["S7"] = s7(plan.quick)
    return sc


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the benchmark suite.")
    parser.add_argument("--quick", action="store_true", help="a short smoke run (< 60 s)")
    parser.add_argument("--only", default="S1,S2,S3,S4,S5,S6,S7", help="scenarios, comma-separated")
    parser.add_argument("--child-s3", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--latency-ms", type=int, help=argparse.SUPPRESS)
    options = parser.parse_args()

    pin_to(CLIENT_CPU)
    if options.child_s3:
        result = asyncio.run(
            s3_child(options.child_s3, options.url, options.runs, options.steps, options.latency_ms)
        )
        print(json.dumps(result))
        return

    only = {name.strip().upper() for name in options.only.split(",")}
    plan = Plan.of(options.quick)
    started = time.perf_counter()
    report: dict[str, Any] = {"quick": plan.quick, "plan": asdict(plan), "machine": machine()}
    with ServerProcess(cpu=SERVER_CPU if (os.cpu_count() or 1) > 1 else None) as server:
        report["scenarios"] = asyncio.run(run_async(plan, server, only))
    report["machine"]["load_average_at_end"] = os.getloadavg()
    report["seconds"] = time.perf_counter() - started
    if only >= {"S1", "S2", "S3", "S4", "S5", "S6"}:
        markdown, targets = render(report)
        report["targets"] = targets
    else:
        markdown = (
            "(partial run: only "
            + ", ".join(sorted(only))
            + ")\n\n```json\n"
            + json.dumps(report["scenarios"], indent=1, default=str)
            + "\n```"
        )
        if "S7" in report["scenarios"]:  # S7's tables and targets, as in the full report
            s7_lines, s7_targets = s7_markdown(report["scenarios"]["S7"])
            s7_lines += [
                f"S7 target: {t['target']}: {_x(t['measured'])} ({t['verdict']})"
                for t in s7_targets
            ]
            markdown += "\n\n" + "\n".join(s7_lines)
    markdown += f"\nSuite took {report['seconds']:.0f} s.\n"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.md").write_text(markdown)
    (RESULTS / "latest.json").write_text(json.dumps(report, indent=2, default=str))
    print(markdown)


if __name__ == "__main__":
    main()
