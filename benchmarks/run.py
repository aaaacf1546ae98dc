"""The benchmark suite: ``python -m benchmarks.run`` or ``python benchmarks/run.py``.

Every scenario measures ``Agent`` in its default configuration beside two baselines measured
in the same run (:mod:`benchmarks.subjects`): the hand loop on httpx and the floor loop on raw
asyncio, against the scripted model server of :mod:`benchmarks.model_server` in its own process,
and reports ratios: on a shared 2-core machine absolute timings drift, ratios of interleaved
measurements much less. The client runs pinned to CPU 0, the server to CPU 1.

* S1  one run of 200 sequential tool rounds, zero latency: wall and CPU per step.
* S2  2 parallel tool calls per round, 100 rounds.
* S3  300 concurrent runs × 5 model calls at 50 ms latency: total wall vs the ideal 250 ms,
      memory per in-flight run, garbage collection; each variant in a fresh process.
* S4  CPU per step when the conversation holds 10, 50, 200 and 400 messages, each step timed
      on its own (nothing subtracted), over HTTP and in process (:mod:`benchmarks.bench_loop`).
* S5  ``import agent_plugin`` and ``import agent_plugin.web`` in a fresh interpreter; the first
      request of a fresh app.
* S6  session append (``benchmarks/bench_sessions.py``).
* S7  background runs through one arq worker (:mod:`benchmarks.bench_jobs`, in a subprocess).
* S8  load: the enqueue route at rising rates, model-bound runs through one and two default
      workers, a worker's memory over many runs (:mod:`benchmarks.bench_load`, in a subprocess).

Every figure is the **median** of interleaved repeats, with the least and the most beside it;
a ratio is the median of the ratios of samples taken in the same round of repeats. CPU is
``time.process_time()`` of the client process; the server's own CPU per request is shown beside
the figures. Results go to ``benchmarks/results/latest.md`` and ``latest.json``; the markdown is
printed too. No timing is ever asserted: ``--quick`` is a smoke run for CI.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from benchmarks import baseline
from benchmarks.model_server import ServerProcess, pin_to
from benchmarks.report import render, s7_markdown
from benchmarks.subjects import Subject, make_subject, prompt_for

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
CLIENT_CPU, SERVER_CPU = 0, 1
WIRES = ("openai", "anthropic")
S4_MESSAGES = (10, 50, 200, 400)
S4_WINDOW = 6
"""Steps timed at each S4 point: the steps whose requests hold N, N + 2, ... messages."""


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child process: this checkout first on the path (not another copy
    of the package the interpreter may have installed)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


# --- samples -----------------------------------------------------------------------------------


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

    def values(self, attr: str) -> list[float]:
        return [float(getattr(s, attr)) for s in self.samples]

    def connections_per_request(self) -> float:
        """New connections the client opened per request (0 when it reuses one)."""
        return statistics.median(s.connections / max(s.server_requests, 1) for s in self.samples)

    def server_cpu_per_request(self) -> float:
        return statistics.median(s.server_cpu / max(s.server_requests, 1) for s in self.samples)


def spread(values: list[float], scale: float = 1.0) -> dict[str, float]:
    """The median and the range of ``values`` (times ``scale``)."""
    return {
        "median": statistics.median(values) * scale,
        "min": min(values) * scale,
        "max": max(values) * scale,
    }


def paired(ours: list[float], base: list[float]) -> dict[str, float]:
    """Ratios of samples taken in the same round: their median and range."""
    return spread([o / b for o, b in zip(ours, base, strict=True) if b > 0])


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


# --- S1 and S2: one long run ---------------------------------------------------------------


async def long_run(
    url: str,
    server: ServerProcess,
    *,
    steps: int,
    parallel: int,
    repeats: int,
    stream_too: bool,
    who: tuple[str, ...],
) -> list[dict[str, Any]]:
    rows = []
    for wire in WIRES:
        for stream in (False, True) if stream_too else (False,):
            subjects = {w: make_subject(w, wire, url, stream=stream) for w in who}
            try:
                series = await measure(
                    list(subjects.values()), prompt_for(steps, parallel), steps, repeats, server
                )
            finally:
                for subject in subjects.values():
                    await subject.close()
            by = {w: series[s.label] for w, s in subjects.items()}
            row: dict[str, Any] = {
                "wire": wire,
                "mode": "stream" if stream else "whole",
                "repeats": repeats,
                "subjects": {},
            }
            for w, got in by.items():
                row["subjects"][w] = {
                    "wall_us": spread(got.values("wall"), 1e6 / steps),
                    "cpu_us": spread(got.values("cpu"), 1e6 / steps),
                    "server_cpu_us_per_request": got.server_cpu_per_request() * 1e6,
                    "connections_per_request": got.connections_per_request(),
                }
                for base in ("floor", "floor-aiohttp", "hand"):
                    if w != base and base in by:
                        for key in ("wall", "cpu"):
                            row["subjects"][w][f"{key}_vs_{base}"] = paired(
                                got.values(key), by[base].values(key)
                            )
            rows.append(row)
    return rows


# --- S3: many concurrent runs, each variant in a fresh process -----------------------------------


def _rss_kb() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _reset_peak_rss() -> None:
    """Make the peak RSS the current RSS (Linux 4.0+). ``ru_maxrss`` would not do: it keeps the
    peak of the process this one was forked from (the suite, far larger) across exec."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def _peak_rss_kb() -> int:
    """The peak RSS since :func:`_reset_peak_rss` (``VmHWM``), in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


async def s3_child(
    variant: str, url: str, runs: int, steps: int, latency_ms: int
) -> dict[str, Any]:
    """One S3 measurement in this (fresh) process; ``variant`` is ``who:wire:engine``."""
    who, wire, engine = variant.split(":")
    subject = make_subject(who, wire, url, engine=engine)
    collecting: list[float] = []
    gc_seconds = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collecting.append(time.perf_counter())
        elif collecting:
            gc_seconds[0] += time.perf_counter() - collecting.pop()

    try:
        await subject.run(prompt_for(1))  # imports, first connection
        gc.collect()
        _reset_peak_rss()
        rss_before = _rss_kb()
        prompt = prompt_for(steps, 1, latency_ms)
        counts = [g["collections"] for g in gc.get_stats()]
        gc.callbacks.append(on_gc)
        wall, cpu = time.perf_counter(), time.process_time()
        done = await asyncio.gather(*(subject.run(prompt) for _ in range(runs)))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        gc.callbacks.remove(on_gc)
        peak = _peak_rss_kb()
        collections = [g["collections"] - c for g, c in zip(gc.get_stats(), counts, strict=True)]
    finally:
        await subject.close()
    if any(d != steps for d in done):
        raise RuntimeError(f"{variant}: some runs did not take {steps} rounds")
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "gc_s": gc_seconds[0],
        "gc_collections": collections,
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
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=900, check=False, env=child_env()
    )
    after = server.stats()
    if done.returncode != 0:
        raise RuntimeError(f"S3 {variant} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    requests = max(after.requests - before.requests - 1, 1)
    result["server_cpu_us_per_request"] = (after.cpu - before.cpu) / requests * 1e6
    result["connections_per_request"] = (after.connections - before.connections - 1) / requests
    return result


S3_VARIANTS = (
    # the default configuration first, then the same with an async tool, then httpx's own
    "ours:openai:default",
    "ours:anthropic:default",
    "ours-async:openai:default",
    "ours:openai:httpx",
    "floor:openai:default",
    "floor:anthropic:default",
    "floor-aiohttp:openai:default",
    "floor-aiohttp:anthropic:default",
    "hand:openai:aiohttp",
    "hand:anthropic:aiohttp",
    "hand:openai:httpx",
    "hand:anthropic:httpx",
)
S3_SLOW = frozenset({"ours:openai:httpx", "hand:openai:httpx", "hand:anthropic:httpx"})
"""httpx's own pool under 300 runs: tens of seconds a sample, so fewer samples."""


def s3(
    server: ServerProcess, *, runs: int, steps: int, latency_ms: int, repeats: int, quick: bool
) -> dict[str, Any]:
    calls = steps + 1
    ideal = calls * latency_ms / 1000
    variants = [v for v in S3_VARIANTS if not quick or ":openai:" in v]
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for repeat in range(repeats):
        for variant in variants:  # interleaved: the machine's noise spread over all of them
            if variant in S3_SLOW and repeat >= max(1, repeats // 2):
                continue
            results[variant].append(run_s3_variant(variant, server, runs, steps, latency_ms))
    rows = []
    for variant, samples in results.items():
        rows.append(
            {
                "variant": variant,
                "samples": len(samples),
                "wall_ms": spread([s["wall_s"] for s in samples], 1e3),
                "x_ideal": spread([s["wall_s"] / ideal for s in samples]),
                "cpu_ms_per_request": spread([s["cpu_s"] / (runs * calls) for s in samples], 1e3),
                "gc_share_of_wall": spread([s["gc_s"] / s["wall_s"] for s in samples]),
                "gc_collections": samples[0]["gc_collections"],
                "kb_per_run": spread([s["kb_per_run"] for s in samples]),
                "server_cpu_us_per_request": statistics.median(
                    s["server_cpu_us_per_request"] for s in samples
                ),
                "connections_per_request": statistics.median(
                    s["connections_per_request"] for s in samples
                ),
                "walls_s": [s["wall_s"] for s in samples],
            }
        )
    by = {row["variant"]: row for row in rows}
    for row in rows:
        _, wire, _ = row["variant"].split(":")
        for base in (
            f"floor:{wire}:default",
            f"floor-aiohttp:{wire}:default",
            f"hand:{wire}:aiohttp",
            f"hand:{wire}:httpx",
        ):
            if base in by and base != row["variant"]:
                mine, theirs = row["walls_s"], by[base]["walls_s"]
                count = min(len(mine), len(theirs))  # same rounds of repeats
                row.setdefault("vs", {})[base] = paired(mine[:count], theirs[:count])
    return {
        "runs": runs,
        "calls_per_run": calls,
        "latency_ms": latency_ms,
        "ideal_s": ideal,
        "repeats": repeats,
        "rows": rows,
    }


# --- S4: CPU per step as the conversation grows ---------------------------------------------


def window(n: int, first_messages: int, per_round: int) -> tuple[int, int]:
    """The tool calls that bound the :data:`S4_WINDOW` steps from the one whose request held
    ``n`` messages. A step runs from one tool call to the next (results appended, the request
    built and sent, the answer parsed, the next call dispatched), and the request between
    calls ``i`` and ``i + 1`` holds ``first_messages + per_round * (i + 1)`` messages."""
    start = max((n - first_messages) // per_round - 1, 0)
    return start, start + S4_WINDOW


def s4_marks(first_messages: int, per_round: int) -> frozenset[int]:
    return frozenset(i for n in S4_MESSAGES for i in window(n, first_messages, per_round))


def per_step_at(times: dict[int, float], first_messages: int, per_round: int) -> dict[int, float]:
    """CPU per step at each of :data:`S4_MESSAGES`: the CPU between the tool calls that bound
    its window, over the steps in it."""
    out = {}
    for n in S4_MESSAGES:
        start, end = window(n, first_messages, per_round)
        if start in times and end in times:
            out[n] = (times[end] - times[start]) / S4_WINDOW
    return out


async def s4_http(
    url: str, server: ServerProcess, *, rounds: int, wires: tuple[str, ...], repeats: int
) -> list[dict[str, Any]]:
    """Each step of one long run timed on its own: ours (sync and async tool), the hand loop
    and the floor, interleaved repeats."""
    rows = []
    who = ("ours", "ours-async", "hand", "floor", "floor-aiohttp")
    for wire in wires:
        subjects = {w: make_subject(w, wire, url) for w in who}
        per: dict[str, list[dict[int, float]]] = {w: [] for w in who}
        try:
            for subject in subjects.values():
                await subject.run(prompt_for(1))
            for repeat in range(repeats):
                order = list(who[repeat % len(who) :] + who[: repeat % len(who)])
                for w in order:
                    subject = subjects[w]
                    gc.collect()
                    # a request holds system + user (2) then 2 more messages per round; on
                    # Anthropic's wire the system text goes apart, the transcript is the same
                    subject.marks.start(s4_marks(2, 2))
                    done = await subject.run(prompt_for(rounds))
                    subject.marks.on = False
                    if done != rounds:
                        raise RuntimeError(f"{subject.label}: {done} rounds, expected {rounds}")
                    per[w].append(per_step_at(subject.marks.times, 2, 2))
        finally:
            for subject in subjects.values():
                await subject.close()
        for n in S4_MESSAGES:
            if not all(n in sample for samples in per.values() for sample in samples):
                continue
            row: dict[str, Any] = {"wire": wire, "messages": n, "subjects": {}}
            for w in who:
                values = [sample[n] for sample in per[w]]
                entry: dict[str, Any] = {"cpu_us": spread(values, 1e6)}
                for base in ("floor", "floor-aiohttp", "hand"):
                    if w != base:
                        entry[f"vs_{base}"] = paired(values, [s[n] for s in per[base]])
                row["subjects"][w] = entry
            rows.append(row)
        low, high = min(S4_MESSAGES), max(S4_MESSAGES)
        for w in who:
            growth = [s[high] / s[low] for s in per[w] if low in s and high in s]
            if growth:
                rows.append({"wire": wire, "growth": w, f"{high}_vs_{low}": spread(growth)})
    return rows


async def s4_in_process(rounds: int, repeats: int) -> dict[str, Any]:
    from benchmarks import bench_loop

    return await bench_loop.measure(rounds=rounds, repeats=repeats)


# --- S5: import and first request ----------------------------------------------------------------

_IMPORT_PROBE = """
import json, sys, time
start = time.perf_counter()
import {module}
took = time.perf_counter() - start
heavy = ("fastapi", "starlette", "sqlalchemy", "alembic", "asyncpg", "aiosqlite", "arq",
         "redis", "pydantic_settings", "httpx", "aiohttp", "pydantic")
print(json.dumps({{"s": took, "loaded": [m for m in heavy if m in sys.modules]}}))
"""

S5_MODULES = ("agent_plugin", "agent_plugin.web")


def _cached_bytecode_env(pycache: str) -> dict[str, str]:
    """A fresh interpreter's environment with bytecode cached under ``pycache``.

    An installed package starts from bytecode (``pip install`` compiles every module), while a
    checkout run with ``PYTHONDONTWRITEBYTECODE=1`` (set in many containers, this one included)
    compiles the package's sources again on every start: tens of milliseconds that no user
    pays. The cache lives outside the source tree; its first run writes it and is not counted.
    """
    env = {k: v for k, v in child_env().items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": pycache}


def s5(server: ServerProcess, *, repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="s5-pycache-") as pycache:
        cached = _cached_bytecode_env(pycache)
        environments = {"cached": cached, "as_is": child_env()}
        imports: dict[tuple[str, str], list[dict[str, Any]]] = {
            (module, name): [] for module in S5_MODULES for name in environments
        }
        for attempt in range(repeats + 1):  # the first ones write the bytecode: not counted
            for module in S5_MODULES:
                for name, env in environments.items():  # interleaved: the same noise for all
                    done = subprocess.run(
                        [sys.executable, "-c", _IMPORT_PROBE.format(module=module)],
                        capture_output=True,
                        text=True,
                        check=True,
                        env=env,
                        cwd=tempfile.gettempdir(),  # nothing on the path but PYTHONPATH
                    )
                    if attempt:
                        imports[module, name].append(json.loads(done.stdout))
        importtime = {
            module: subprocess.run(
                [sys.executable, "-X", "importtime", "-c", f"import {module}"],
                capture_output=True,
                text=True,
                check=True,
                env=cached,
                cwd=tempfile.gettempdir(),
            ).stderr
            for module in S5_MODULES
        }
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
    return {
        "imports": {
            module: {name: spread([i["s"] for i in imports[module, name]]) for name in environments}
            for module in S5_MODULES
        },
        "repeats": repeats,
        "dont_write_bytecode": bool(os.environ.get("PYTHONDONTWRITEBYTECODE")),
        "loaded_by_import": {
            module: imports[module, "cached"][0]["loaded"] for module in S5_MODULES
        },
        "slowest_imports": {
            module: _slowest_imports(report) for module, report in importtime.items()
        },
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
            command,
            capture_output=True,
            text=True,
            timeout=30 if quick else 900,
            check=False,
            env=child_env(),
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
            command,
            capture_output=True,
            text=True,
            timeout=90 if quick else 1200,
            check=False,
            env=child_env(),
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


# --- S8 ------------------------------------------------------------------------------------------


def s8(quick: bool) -> dict[str, Any]:
    """Runs benchmarks/bench_load.py (uvicorn, arq workers, Redis, PostgreSQL; processes of
    their own) and keeps the report it writes to results/load.json."""
    started = time.time()
    command = [sys.executable, str(HERE / "bench_load.py"), *(["--quick"] if quick else [])]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=600 if quick else 3600,
            check=False,
            env=child_env(),
        )
    except subprocess.TimeoutExpired:
        return {"status": "timed out", "command": command[1:]}
    written = RESULTS / "load.json"
    if done.returncode != 0 or not written.exists() or written.stat().st_mtime < started:
        return {
            "status": f"failed (exit {done.returncode})",
            "command": command[1:],
            "stderr_tail": done.stderr.strip()[-2000:],
        }
    return {"status": "ran", "command": command[1:], "report": json.loads(written.read_text())}


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


def machine() -> dict[str, Any]:
    model = ""
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    import aiohttp

    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "httpx": httpx.__version__,
        "aiohttp": aiohttp.__version__,
        "load_average_at_start": os.getloadavg(),
    }


# --- main ----------------------------------------------------------------------------------------


@dataclass
class Plan:
    quick: bool
    s1_steps: int
    s2_rounds: int
    repeats: int
    s3_runs: int
    s3_repeats: int
    s4_rounds: int
    s4_wires: tuple[str, ...]
    s4_repeats: int
    in_process_repeats: int
    import_repeats: int
    check_requests: int

    @classmethod
    def of(cls, quick: bool) -> Plan:
        if quick:
            return cls(True, 50, 25, 2, 100, 1, 205, ("openai",), 1, 2, 3, 200)
        return cls(False, 200, 100, 7, 300, 5, 205, WIRES, 5, 9, 9, 1000)


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
                who=("ours", "ours-async", "hand", "floor", "floor-aiohttp"),
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
                who=("ours", "hand", "floor"),
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
        log(f"S4: {plan.s4_rounds} rounds, each step timed")
        sc["S4"] = {
            "rounds": plan.s4_rounds,
            "window": S4_WINDOW,
            "repeats": plan.s4_repeats,
            "http": await s4_http(
                server.url,
                server,
                rounds=plan.s4_rounds,
                wires=plan.s4_wires,
                repeats=plan.s4_repeats,
            ),
            "in_process": await s4_in_process(plan.s4_rounds, plan.in_process_repeats),
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
    if "S8" in only:
        log("S8: load (enqueue rates, model-bound runs, worker memory)")
        sc["S8"] = s8(plan.quick)
    return sc


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the benchmark suite.")
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument(
        "--only", default="S1,S2,S3,S4,S5,S6,S7,S8", help="scenarios, comma-separated"
    )
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
    markdown, targets = render(report)
    report["targets"] = targets
    if not only >= {"S1", "S2", "S3", "S4", "S5", "S6", "S7", "S8"}:
        markdown = f"(partial run: only {', '.join(sorted(only))})\n\n" + markdown
    markdown += f"\nSuite took {report['seconds']:.0f} s.\n"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.md").write_text(markdown)
    (RESULTS / "latest.json").write_text(json.dumps(report, indent=2, default=str))
    print(markdown)


if __name__ == "__main__":
    main()


__all__ = ["Plan", "main", "run_async", "s7_markdown"]
