"""S8: load. The enqueue route at rising rates, model-bound runs through one and two default
workers, and a worker's memory over many runs (issue 25).

Everything runs as it is deployed, each part in a process of its own: the app under uvicorn
(uvloop, httptools), workers under ``arq`` (:mod:`benchmarks.load_app`, default
:class:`~agent_plugin.jobs.JobOptions`), the scripted model server
(:mod:`benchmarks.model_server`), PostgreSQL (a database of its own, created and dropped on
the server of ``AGENT_BENCH_POSTGRES_URL``) and Redis (``AGENT_BENCH_REDIS_URL``, a queue and
key prefix of its own).

1. **Enqueue**: a client in a separate process sends ``POST /agent/runs`` at a fixed rate
   (open loop: each request is due at its time, whether the previous ones have answered or
   not), rate after rate. Latency is from the time a request was due to its answer;
   reported as p50, p99 and the largest, with the errors and the app's CPU per request.
   No worker runs meanwhile.
2. **Model-bound runs**: N runs of two model calls, each answered 1 s late, are enqueued
   through the app (32 at a time) to one worker, then to two; the wall time from the first
   enqueue to the last run's end, and runs completed per second. The workers' peak Redis and
   PostgreSQL connections are counted from ``/proc`` (established TCP connections to either
   port).
3. **Memory**: one worker runs many runs with a model that answers at once, enqueued in
   batches; its RSS after each batch, and the growth per 1,000 runs after the first 1,000
   (a least-squares slope).

Targets: 200 runs of two 1 s calls on one default worker in at most 15 s; enqueue p99 at most
50 ms at 100 requests/s; worker RSS growth at most 1 MB per 1,000 runs. Nothing is asserted.
Results go to ``results/load.json``; the markdown is printed::

    python benchmarks/bench_load.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import redis
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from benchmarks.model_server import ServerProcess

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
REDIS_URL = os.environ.get("AGENT_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get(
    "AGENT_BENCH_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)
TARGET_WALL_S = 15.0
TARGET_P99_MS = 50.0
TARGET_RATE = 100
TARGET_RSS_MB = 1.0
SATURATED_P99_MS = 1000.0
"""A rate whose p99 is past this (at or over the target rate) ends the enqueue steps."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Plan:
    quick: bool
    rates: tuple[int, ...]
    rate_seconds: float
    runs_one: tuple[int, ...]
    runs_two: int
    memory_runs: int
    memory_batch: int

    @classmethod
    def of(cls, quick: bool) -> Plan:
        if quick:
            return cls(True, (50, 100), 3.0, (200,), 200, 600, 200)
        return cls(False, (25, 50, 100, 200, 300), 10.0, (200, 400), 400, 5000, 500)


def log(message: str) -> None:
    print(f"[S8 {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def child_env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- a process's CPU, memory and connections, from /proc ----------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def local_ports(pid: int, port: int) -> set[int]:
    """The local ports of the established TCP connections of ``pid`` to ``port``."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                remote, state, inode = parts[2], parts[3], parts[9]
                if state == "01" and inode in inodes and int(remote.rsplit(":", 1)[1], 16) == port:
                    found.add(int(parts[1].rsplit(":", 1)[1], 16))
    return found


def connections(pid: int, ports: dict[str, int], observer: redis.Redis) -> dict[str, int]:
    """The connections of ``pid`` to PostgreSQL (its established sockets) and to Redis (those
    Redis lists as its clients: a socket being closed is not one)."""
    mine = local_ports(pid, ports["redis"])
    clients = observer.client_list()
    return {
        "postgres": len(local_ports(pid, ports["postgres"])),
        "redis": sum(1 for c in clients if int(c["addr"].rsplit(":", 1)[1]) in mine),
    }


# --- the parts: database, app, workers -----------------------------------------------------------


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    """A PostgreSQL database of this run's own (dropped afterwards), migrated."""
    name = f"agent_bench_load_{uuid.uuid4().hex[:8]}"
    url = make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    try:
        env = child_env(AGENT_DATABASE_URL=url)
        subprocess.run(
            [sys.executable, "-m", "agent_plugin", "migrate"],
            env=env,
            check=True,
            capture_output=True,
            cwd=tempfile.gettempdir(),
        )
        yield url
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def _admin(statement: str) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(sa.text(statement))
    finally:
        await engine.dispose()


@dataclass
class Deployment:
    """The environment every process of one benchmark run shares."""

    directory: Path
    database_url: str
    model_url: str
    queue: str = field(default_factory=lambda: f"bench-load-{uuid.uuid4().hex[:8]}")

    def env(self, **extra: str) -> dict[str, str]:
        config = self.directory / "agent.toml"
        if not config.exists():
            config.write_text('[agent]\nprovider = "openai-compatible"\n', encoding="utf-8")
        return child_env(
            AGENT_CONFIG_FILE=str(config),
            AGENT_BASE_URL=f"{self.model_url}/v1",
            AGENT_MODEL="bench-model",
            AGENT_DATABASE_URL=self.database_url,
            AGENT_REDIS_URL=REDIS_URL,
            LOAD_QUEUE=self.queue,
            LOAD_READY=str(self.directory / "ready"),
            **extra,
        )

    def ports(self) -> dict[str, int]:
        redis_port = redis.Redis.from_url(REDIS_URL).connection_pool.connection_kwargs["port"]
        return {"redis": int(redis_port), "postgres": make_url(POSTGRES_URL).port or 5432}

    def clean_redis(self) -> None:
        client = redis.Redis.from_url(REDIS_URL)
        try:
            queued = [m.decode() for m in client.zrange(f"{self.queue}:queue", 0, -1)]
            keys: list[Any] = [f"{self.queue}:queue", f"{self.queue}:queue:health-check"]
            keys += list(client.scan_iter(match=f"{self.queue}:*"))
            for run_id in queued:
                keys += [f"arq:job:{run_id}", f"arq:retry:{run_id}", f"arq:in-progress:{run_id}"]
            for start in range(0, len(keys), 1000):
                client.delete(*keys[start : start + 1000])
        finally:
            client.close()

    def forget_runs(self) -> None:
        """Empty the run tables (between parts: no worker ever sees another part's runs)."""
        self.clean_redis()
        asyncio.run(_execute(self.database_url, "TRUNCATE agent_runs CASCADE"))


async def _execute(url: str, statement: str) -> Any:
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            return (await conn.execute(sa.text(statement))).all() if "SELECT" in statement else None
    finally:
        await engine.dispose()


class App:
    """``uvicorn benchmarks.load_app:app`` with uvloop and httptools."""

    def __init__(self, deployment: Deployment) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.out = open(deployment.directory / "app.out", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "benchmarks.load_app:app",
                "--port",
                str(self.port),
                "--loop",
                "uvloop",
                "--http",
                "httptools",
                "--no-access-log",
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=deployment.env(),
            stdout=self.out,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health/ready", timeout=2).status_code == 200:
                    return
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"the app did not start: {self.output()}")

    def output(self) -> str:
        return (Path(self.out.name).read_text(errors="replace"))[-3000:]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.out.close()


class Workers:
    """``count`` processes of ``arq benchmarks.load_app.WorkerSettings``, started and ready."""

    def __init__(self, deployment: Deployment, count: int) -> None:
        ready = deployment.directory / "ready"
        ready.unlink(missing_ok=True)
        self.processes = []
        for n in range(count):
            out = deployment.directory / f"worker-{n}-{uuid.uuid4().hex[:4]}.out"
            with open(out, "wb") as output:
                self.processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "arq", "benchmarks.load_app.WorkerSettings"],
                        cwd=ROOT,
                        env=deployment.env(),
                        stdout=output,
                        stderr=subprocess.STDOUT,
                    )
                )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            started = ready.read_text().split() if ready.exists() else []
            if len(started) >= count:
                return
            if any(p.poll() is not None for p in self.processes):
                break
            time.sleep(0.1)
        self.close()
        raise RuntimeError("the workers did not start")

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# --- 1: the enqueue route at rising rates ---------------------------------------------------------


async def client_child(url: str, rate: int, seconds: float) -> dict[str, Any]:
    """The client process: ``POST /agent/runs`` at ``rate`` per second for ``seconds``."""
    total = int(rate * seconds)
    latencies: list[float] = []
    errors: dict[str, int] = {}
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        body = {"prompt": "STEPS=1 PARALLEL=1 LATENCY_MS=0"}
        for _ in range(20):  # warm the connections and the app's first-request costs
            await client.post("/agent/runs", json=body)

        async def one(due: float) -> None:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            try:
                response = await client.post("/agent/runs", json=body)
                if response.status_code != 202:
                    errors[str(response.status_code)] = errors.get(str(response.status_code), 0) + 1
                    return
            except httpx.HTTPError as error:
                errors[type(error).__name__] = errors.get(type(error).__name__, 0) + 1
                return
            latencies.append(time.perf_counter() - due)

        start = time.perf_counter() + 0.2
        await asyncio.gather(*(one(start + i / rate) for i in range(total)))
        wall = time.perf_counter() - start
    latencies.sort()
    return {
        "rate": rate,
        "requests": total,
        "answered": len(latencies),
        "errors": errors,
        "achieved_rate": total / wall,
        "p50_ms": quantile(latencies, 0.5) * 1e3,
        "p99_ms": quantile(latencies, 0.99) * 1e3,
        "max_ms": (latencies[-1] if latencies else 0.0) * 1e3,
    }


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def enqueue_rates(deployment: Deployment, plan: Plan) -> list[dict[str, Any]]:
    app = App(deployment)
    rows = []
    try:
        for rate in plan.rates:
            before = cpu_seconds(app.process.pid)
            try:
                done = subprocess.run(
                    [
                        sys.executable,
                        str(Path(__file__).resolve()),
                        "--child-client",
                        app.url,
                        "--rate",
                        str(rate),
                        "--seconds",
                        str(plan.rate_seconds),
                    ],
                    env=child_env(),
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=plan.rate_seconds * 10 + 60,
                )
            except subprocess.TimeoutExpired:
                log(f"enqueue {rate}/s: the client did not finish; no higher rate is tried")
                break
            row = json.loads(done.stdout)
            row["app_cpu_ms_per_request"] = (
                (cpu_seconds(app.process.pid) - before) / (row["requests"] + 20) * 1e3
            )
            log(
                f"enqueue {rate}/s: p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms, "
                f"errors {sum(row['errors'].values())}, app CPU "
                f"{row['app_cpu_ms_per_request']:.2f} ms/request"
            )
            rows.append(row)
            if row["p99_ms"] > SATURATED_P99_MS and rate >= TARGET_RATE:
                log(f"enqueue {rate}/s: saturated (p99 over 1 s); no higher rate is tried")
                break
    finally:
        app.close()
    deployment.forget_runs()
    return rows


# --- 2 and 3: runs through the workers --------------------------------------------------------


async def enqueue_runs(url: str, prompt: str, count: int) -> list[str]:
    """``count`` runs through the app, 32 requests at a time; their ids."""
    gate = asyncio.Semaphore(32)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def one() -> str:
            async with gate:
                response = await client.post("/agent/runs", json={"prompt": prompt})
                response.raise_for_status()
                return str(response.json()["run_id"])

        return list(await asyncio.gather(*(one() for _ in range(count))))


async def wait_ended(
    database_url: str, run_ids: list[str], on_tick: Any = None, limit_s: float = 600
) -> dict[str, int]:
    """Until every run has ended; their statuses counted."""
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(database_url, pool_size=1)
    query = sa.text(
        "SELECT status, count(*) FROM agent_runs WHERE run_id = ANY(:ids) GROUP BY status"
    )
    deadline = time.monotonic() + limit_s
    try:
        while True:
            async with engine.connect() as conn:
                counts = {
                    str(s): int(n) for s, n in (await conn.execute(query, {"ids": run_ids})).all()
                }
            if on_tick is not None:
                on_tick()
            if sum(n for s, n in counts.items() if s not in ("queued", "in_progress")) >= len(
                run_ids
            ):
                return counts
            if time.monotonic() > deadline:
                counts["timed_out"] = 1
                return counts
            await asyncio.sleep(0.05)
    finally:
        await engine.dispose()


def model_bound(
    deployment: Deployment, app: App, workers: int, runs: int, ports: dict[str, int]
) -> dict[str, Any]:
    """``runs`` runs of two 1 s model calls through ``workers`` fresh workers."""
    pool = Workers(deployment, workers)
    peaks = {pid: dict.fromkeys(ports, 0) for pid in pool.pids}
    observer = redis.Redis.from_url(REDIS_URL)

    def sample() -> None:
        for pid in pool.pids:
            for name, n in connections(pid, ports, observer).items():
                peaks[pid][name] = max(peaks[pid][name], n)

    try:
        cpu_before = sum(cpu_seconds(pid) for pid in pool.pids)
        started = time.perf_counter()
        ids = asyncio.run(enqueue_runs(app.url, "STEPS=1 PARALLEL=1 LATENCY_MS=1000", runs))
        enqueued = time.perf_counter() - started
        statuses = asyncio.run(wait_ended(deployment.database_url, ids, sample))
        wall = time.perf_counter() - started
        cpu = sum(cpu_seconds(pid) for pid in pool.pids) - cpu_before
    finally:
        pool.close()
        observer.close()
    deployment.forget_runs()
    row = {
        "workers": workers,
        "runs": runs,
        "wall_s": wall,
        "enqueue_s": enqueued,
        "runs_per_s": runs / wall,
        "statuses": statuses,
        "worker_cpu_s": cpu,
        "worker_cpu_ms_per_run": cpu / runs * 1e3,
        "peak_connections_per_worker": {
            name: max(p[name] for p in peaks.values()) for name in ports
        },
    }
    log(
        f"{workers} worker(s), {runs} runs: {wall:.1f} s ({row['runs_per_s']:.1f} runs/s), "
        f"{statuses}, CPU {row['worker_cpu_ms_per_run']:.1f} ms/run, connections "
        f"{row['peak_connections_per_worker']}"
    )
    return row


def memory(deployment: Deployment, app: App, plan: Plan) -> dict[str, Any]:
    """One worker's RSS over ``plan.memory_runs`` zero-latency runs, after each batch."""
    pool = Workers(deployment, 1)
    pid = pool.pids[0]
    samples = [(0, rss_mb(pid))]
    try:
        done = 0
        while done < plan.memory_runs:
            ids = asyncio.run(enqueue_runs(app.url, "STEPS=1 PARALLEL=1", plan.memory_batch))
            asyncio.run(wait_ended(deployment.database_url, ids))
            done += len(ids)
            samples.append((done, rss_mb(pid)))
            log(f"memory: {done} runs, RSS {samples[-1][1]:.1f} MB")
            deployment.forget_runs()
    finally:
        pool.close()
    later = [(n, mb) for n, mb in samples if n >= 1000] or samples[1:]
    return {
        "runs": plan.memory_runs,
        "batch": plan.memory_batch,
        "samples": samples,
        "rss_start_mb": samples[0][1],
        "rss_end_mb": samples[-1][1],
        "growth_mb_per_1000": slope(later) * 1000 if len(later) >= 2 else float("nan"),
    }


def slope(points: list[tuple[int, float]]) -> float:
    xs = [float(x) for x, _ in points]
    ys = [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


# --- the report -------------------------------------------------------------------------------


def target_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    from benchmarks.report import verdict

    rows = []
    one = [r for r in report.get("model_bound", []) if r["workers"] == 1 and r["runs"] == 200]
    if one:
        wall = one[0]["wall_s"]
        rows.append(
            {
                "target": "S8: 200 runs of two 1 s model calls on one default worker ≤ 15 s",
                "measured": wall,
                "limit": TARGET_WALL_S,
                "shown": f"{wall:.1f} s",
                "verdict": verdict(wall, TARGET_WALL_S),
            }
        )
    at = [r for r in report.get("enqueue", []) if r["rate"] == TARGET_RATE]
    if at:
        p99 = at[0]["p99_ms"]
        rows.append(
            {
                "target": f"S8: enqueue p99 at {TARGET_RATE} requests/s ≤ 50 ms",
                "measured": p99,
                "limit": TARGET_P99_MS,
                "shown": f"{p99:.1f} ms, {sum(at[0]['errors'].values())} errors",
                "verdict": verdict(p99, TARGET_P99_MS)
                if not at[0]["errors"]
                else "missed (errors)",
            }
        )
    if "memory" in report:
        growth = report["memory"]["growth_mb_per_1000"]
        rows.append(
            {
                "target": "S8: worker RSS growth ≤ 1 MB per 1,000 runs",
                "measured": growth,
                "limit": TARGET_RSS_MB,
                "shown": f"{growth:+.2f} MB",
                "verdict": verdict(growth, TARGET_RSS_MB),
            }
        )
    return rows


def render(report: dict[str, Any]) -> str:
    loads = [report.get("load_average_at_start"), report.get("load_average_at_end")]
    out = [
        f"Load average (1, 5, 15 min) at the start and the end: {loads[0]} / {loads[1]} on "
        f"{os.cpu_count()} CPUs: every figure shares the machine with whatever else ran.",
        "",
        "Enqueue route (`POST /agent/runs`, uvicorn with uvloop and httptools, PostgreSQL and "
        "Redis; an open-loop client in its own process; no worker running):",
        "",
        "| rate (req/s) | achieved | p50 | p99 | max | errors | app CPU per request |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report.get("enqueue", []):
        out.append(
            f"| {r['rate']} | {r['achieved_rate']:.0f}/s | {r['p50_ms']:.1f} ms | "
            f"{r['p99_ms']:.1f} ms | {r['max_ms']:.1f} ms | {sum(r['errors'].values())} | "
            f"{r['app_cpu_ms_per_request']:.2f} ms |"
        )
    out += [
        "",
        "Model-bound runs (two model calls each, 1 s per call, one tool call between; "
        "default `JobOptions`; from the first enqueue to the last run's end):",
        "",
        "| workers | runs | wall | runs/s | worker CPU per run | ended | peak Redis / "
        "PostgreSQL connections per worker |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report.get("model_bound", []):
        peak = r["peak_connections_per_worker"]
        out.append(
            f"| {r['workers']} | {r['runs']} | {r['wall_s']:.1f} s | {r['runs_per_s']:.1f} | "
            f"{r['worker_cpu_ms_per_run']:.1f} ms | {r['statuses']} | "
            f"{peak['redis']} / {peak['postgres']} |"
        )
    if "memory" in report:
        m = report["memory"]
        points = ", ".join(f"{n}: {mb:.1f}" for n, mb in m["samples"])
        out += [
            "",
            f"Worker memory over {m['runs']} zero-latency runs (RSS in MB after each batch of "
            f"{m['batch']}): {points}. Growth "
            + (
                "after the first 1,000 runs"
                if m["runs"] > 1000
                else "over all (a short run: no "
                "warm-up left out, so this is mostly start-up growth)"
            )
            + f": **{m['growth_mb_per_1000']:+.2f} MB per 1,000 runs**.",
        ]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child-client", help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child_client:
        print(
            json.dumps(
                asyncio.run(client_child(options.child_client, options.rate, options.seconds))
            )
        )
        return
    plan = Plan.of(options.quick)
    report: dict[str, Any] = {
        "quick": plan.quick,
        "plan": plan.__dict__,
        "load_average_at_start": os.getloadavg(),
    }
    started = time.perf_counter()
    with (
        tempfile.TemporaryDirectory() as directory,
        ServerProcess() as server,
        fresh_database() as database_url,
    ):
        deployment = Deployment(Path(directory), database_url, server.url)
        ports = deployment.ports()
        try:
            log(f"enqueue at {plan.rates} requests/s")
            report["enqueue"] = enqueue_rates(deployment, plan)
            app = App(deployment)
            try:
                report["model_bound"] = [
                    model_bound(deployment, app, 1, runs, ports) for runs in plan.runs_one
                ]
                report["model_bound"].append(model_bound(deployment, app, 2, plan.runs_two, ports))
                report["memory"] = memory(deployment, app, plan)
            finally:
                app.close()
        finally:
            deployment.clean_redis()
    report["seconds"] = time.perf_counter() - started
    report["load_average_at_end"] = os.getloadavg()
    report["targets"] = target_rows(report)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "load.json").write_text(json.dumps(report, indent=2, default=str))
    print(render(report))
    for row in report["targets"]:
        print(f"- {row['target']}: {row['shown']} ({row['verdict']})")


if __name__ == "__main__":
    main()
