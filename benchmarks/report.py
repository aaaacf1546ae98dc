"""The suite's report: the markdown of ``results/latest.md`` and its targets table.

Every row says which configuration it measures; the library's default configuration comes
first. Figures are medians with the least and the most of the repeats in brackets; ratios are
medians of ratios of samples taken in the same round of repeats.
"""

from __future__ import annotations

from typing import Any

__all__ = ["render", "s7_markdown", "s8_markdown"]

WHO = {
    "ours": "Agent, default configuration (aiohttp engine), sync tool",
    "ours-async": "Agent, default configuration, async tool",
    "hand": "hand loop on httpx.AsyncClient (httpx's own transport)",
    "floor": "floor loop on raw asyncio streams",
    "floor-aiohttp": "aiohttp floor: the loop on one aiohttp.ClientSession, no httpx",
}
ENGINES = {
    "default": ", httpx's own transport (AsyncClient's default pool)",
    "httpx": ", httpx's own transport (its default pool)",
    "aiohttp": ", httpx-aiohttp's AiohttpTransport (1000 connections)",
}


def describe(variant: str) -> str:
    """What an S3 variant ``who:wire:engine`` is, in words."""
    who, wire, engine = variant.split(":")
    if who == "hand":
        return f"{wire}: hand loop on httpx.AsyncClient{ENGINES[engine]}"
    if who.startswith("ours") and engine != "default":
        tool = "async" if who == "ours-async" else "sync"
        return f"{wire}: Agent, {tool} tool{ENGINES[engine]}"
    return f"{wire}: {WHO[who]}"


def show(stat: dict[str, float], digits: int = 0, unit: str = "") -> str:
    """``median [min–max]``."""
    return (
        f"{stat['median']:,.{digits}f}{unit} [{stat['min']:,.{digits}f}–{stat['max']:,.{digits}f}]"
    )


def ratio(stat: dict[str, float] | None) -> str:
    if stat is None:
        return "—"
    return f"{stat['median']:.2f}× [{stat['min']:.2f}–{stat['max']:.2f}]"


def verdict(measured: float, target: float) -> str:
    """ "met", or how far over an upper-bound target the measurement is."""
    if measured <= target:
        return "met"
    return f"missed by {(measured / target - 1) * 100:.0f}% ({measured / target:.2f}× the target)"


def render(report: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    m = report["machine"]
    sc = report["scenarios"]
    targets: list[dict[str, Any]] = []
    body: list[str] = []
    for name, section in (
        ("S1", _long_run),
        ("S2", _long_run),
        ("S3", _s3),
        ("S4", _s4),
        ("S5", _s5),
        ("S6", _s6),
        ("S7", _s7),
        ("S8", _s8),
    ):
        if name in sc:
            lines, found = section(name, sc[name])
            body += lines
            targets += found
    head = [
        f"# Benchmarks{' (quick smoke run)' if report['quick'] else ''}",
        "",
        f"Machine: {m['cpu']}, {m['cpus']} CPUs, Python {m['python']}, httpx {m['httpx']}, "
        f"aiohttp {m['aiohttp']}; load average (1 min) {m['load_average_at_start'][0]:.2f} at "
        f"the start and {m['load_average_at_end'][0]:.2f} at the end (above 1, other work "
        "shared the machine: absolute figures are inflated, ratios much less). Client pinned "
        "to CPU 0, the model server (its own process) to CPU 1. Figures are medians of "
        "interleaved repeats, [least–most] beside them; a ratio is the median of the ratios of "
        "samples taken in the same round. The floor loop is the hand loop's work on raw "
        "asyncio streams (benchmarks/baseline.py).",
        "",
    ]
    check = sc.get("server_check")
    if check:
        head += [
            f"The model server alone (raw-socket client, {check['requests']} keep-alive "
            f"requests of {check['request_bytes']:,} bytes): round trip "
            f"{check['round_trip_us']:,.0f} µs, server CPU "
            f"{check['server_cpu_us_per_request']:,.0f} µs per request.",
            "",
        ]
    head += ["## Targets", "", "| target | measured | verdict |", "|---|---:|---|"]
    for target in targets:
        head.append(f"| {target['target']} | {target['shown']} | {target['verdict']} |")
    return "\n".join([*head, "", *body]), targets


def _target(name: str, measured: float, target: float, shown: str) -> dict[str, Any]:
    return {
        "target": name,
        "measured": measured,
        "limit": target,
        "shown": shown,
        "verdict": verdict(measured, target),
    }


def _long_run(name: str, data: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    per = "step" if name == "S1" else "round"
    title = (
        "one run, sequential tool rounds, zero latency"
        if name == "S1"
        else "2 parallel tool calls per round, zero latency"
    )
    out = [
        f"## {name}: {title} ({data['steps']} rounds, {data['rows'][0]['repeats']} repeats)",
        "",
        f"| wire | mode | who | wall µs/{per} | CPU µs/{per} | CPU vs floor "
        "| CPU vs aiohttp floor | CPU vs hand loop | wall vs floor | server CPU µs/req "
        "| new connections/req |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    targets = []
    for row in data["rows"]:
        for who, got in row["subjects"].items():
            out.append(
                f"| {row['wire']} | {row['mode']} | {WHO[who]} | {show(got['wall_us'])} "
                f"| {show(got['cpu_us'])} | {ratio(got.get('cpu_vs_floor'))} "
                f"| {ratio(got.get('cpu_vs_floor-aiohttp'))} "
                f"| {ratio(got.get('cpu_vs_hand'))} | {ratio(got.get('wall_vs_floor'))} "
                f"| {got['server_cpu_us_per_request']:,.0f} "
                f"| {got['connections_per_request']:.2f} |"
            )
        ours = row["subjects"]["ours"].get("cpu_vs_floor")
        if name == "S1" and ours is not None:
            targets.append(
                _target(
                    f"S1 {row['wire']} {row['mode']}, default configuration: client CPU per "
                    "step ≤ 1.3× the floor loop's",
                    ours["median"],
                    1.3,
                    ratio(ours),
                )
            )
    return [*out, ""], targets


def _s3(name: str, data: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    out = [
        f"## S3: {data['runs']} concurrent runs × {data['calls_per_run']} model calls at "
        f"{data['latency_ms']} ms (ideal {data['ideal_s'] * 1000:.0f} ms, up to "
        f"{data['repeats']} repeats, each in a fresh process)",
        "",
        "| configuration | samples | wall ms | × ideal | vs floor | vs aiohttp floor "
        "| vs hand loop on aiohttp | vs hand loop on httpx | client CPU ms/req "
        "| GC share of wall | peak RSS KiB per run | new connections/req | server CPU µs/req |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    targets = []
    for row in data["rows"]:
        variant = row["variant"]
        _, wire, _ = variant.split(":")
        vs = row.get("vs", {})
        out.append(
            f"| {describe(variant)} | {row['samples']} | {show(row['wall_ms'])} "
            f"| {ratio(row['x_ideal'])} | {ratio(vs.get(f'floor:{wire}:default'))} "
            f"| {ratio(vs.get(f'floor-aiohttp:{wire}:default'))} "
            f"| {ratio(vs.get(f'hand:{wire}:aiohttp'))} | {ratio(vs.get(f'hand:{wire}:httpx'))} "
            f"| {show(row['cpu_ms_per_request'], 2)} "
            f"| {row['gc_share_of_wall']['median'] * 100:.0f}% "
            f"| {show(row['kb_per_run'], 1)} | {row['connections_per_request']:.2f} "
            f"| {row['server_cpu_us_per_request']:,.0f} |"
        )
        if variant in ("ours:openai:default", "ours:anthropic:default"):
            targets.append(
                _target(
                    f"S3 {wire}, default configuration: wall ≤ 3× ideal",
                    row["x_ideal"]["median"],
                    3.0,
                    ratio(row["x_ideal"]),
                )
            )
            targets.append(
                _target(
                    f"S3 {wire}, default configuration: ≤ 25 KB per in-flight run",
                    row["kb_per_run"]["median"] * 1.024,
                    25.0,
                    f"{row['kb_per_run']['median'] * 1.024:.1f} KB",
                )
            )
    return [*out, ""], targets


def _s4(name: str, data: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    out = [
        f"## S4: CPU per step as the conversation grows ({data['rounds']} rounds, "
        f"{data['repeats']} repeats; the CPU of the {data['window']} steps from the one whose "
        "request held N messages, read at the tool calls around them, over their number: "
        "nothing subtracted)",
        "",
        "| wire | messages | who | CPU µs/step | vs floor | vs aiohttp floor | vs hand loop |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    targets = []
    growths = []
    for row in data["http"]:
        if "growth" in row:
            growths.append(row)
            continue
        for who, got in row["subjects"].items():
            out.append(
                f"| {row['wire']} | {row['messages']} | {WHO[who]} | {show(got['cpu_us'])} "
                f"| {ratio(got.get('vs_floor'))} | {ratio(got.get('vs_floor-aiohttp'))} "
                f"| {ratio(got.get('vs_hand'))} |"
            )
        ours = row["subjects"]["ours"]["vs_floor"]
        targets.append(
            _target(
                f"S4 {row['wire']} at {row['messages']} messages, default configuration: "
                "client CPU per step ≤ 1.3× the floor loop's",
                ours["median"],
                1.3,
                ratio(ours),
            )
        )
    out += ["", "| wire | who | CPU per step at 400 messages / at 10 |", "|---|---|---:|"]
    for row in growths:
        key = next(k for k in row if k.endswith("_vs_10"))
        out.append(f"| {row['wire']} | {WHO[row['growth']]} | {ratio(row[key])} |")
        if row["growth"] == "ours":
            targets.append(
                _target(
                    f"S4 {row['wire']}, default configuration: CPU per step at 400 messages "
                    "≤ 1.25× that at 10",
                    row[key]["median"],
                    1.25,
                    ratio(row[key]),
                )
            )
    from benchmarks import bench_loop

    inproc = data["in_process"]
    out += [
        "",
        f"In process (benchmarks/bench_loop.py: a zero-latency model object, no HTTP, "
        f"{inproc['repeats']} repeats), CPU per step timed the same way:",
        "",
        *bench_loop.table(inproc),
        "",
    ]
    return out, targets


def _s5(name: str, data: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    out = ["## S5: start-up", ""]
    targets = []
    limits = {"agent_plugin": 0.2, "agent_plugin.web": 0.35}
    for module, by in data["imports"].items():
        cached, as_is = by["cached"], by["as_is"]
        loaded = ", ".join(data["loaded_by_import"][module]) or "none of them"
        slow = ", ".join(
            f"{mod} {sec * 1000:.0f} ms" for mod, sec in data["slowest_imports"][module]
        )
        out += [
            f"`import {module}` in a fresh interpreter, bytecode cached (as installed): "
            f"{show(cached, 3, ' s')} over {data['repeats']}; as the environment is"
            f"{' (PYTHONDONTWRITEBYTECODE=1)' if data['dont_write_bytecode'] else ''}: "
            f"{show(as_is, 3, ' s')}. Loads: {loaded}. Most import time of their own: {slow}.",
            "",
        ]
        targets.append(
            _target(
                f"S5: `import {module}` ≤ {limits[module]} s (median)",
                cached["median"],
                limits[module],
                f"{cached['median']:.3f} s",
            )
        )
    app = data["fresh_app"]
    out += [
        f"Fresh app (FastAPI + AgentPlugin, in-memory sessions, ASGI transport, bytecode "
        f"cached, median of {data['fresh_app_runs']}): import FastAPI + plugin "
        f"{app['import_s'] * 1000:.0f} ms, build the app {app['build_s'] * 1000:.0f} ms, "
        f"startup {app['startup_s'] * 1000:.1f} ms, first request "
        f"{app['first_request_s'] * 1000:.1f} ms, second request "
        f"{app['second_request_s'] * 1000:.1f} ms (one tool round: two model calls). Modules "
        f"first imported during the first request: "
        f"{', '.join(data['imported_by_first_request']) or 'none'}.",
        "",
    ]
    return out, targets


def _s6(name: str, data: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    out = ["## S6: session append", "", f"Status: {data['status']}."]
    if data.get("output"):
        out += ["", data["output"]]
    targets = [
        _target(
            f"S6 {backend}: append at 10,000 messages ≤ 1.5× at 10", value, 1.5, f"{value:.2f}×"
        )
        for backend, value in (data.get("append_ratios") or {}).items()
    ]
    return [*out, ""], targets


def _s7(name: str, data: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    lines, found = s7_markdown(data)
    targets = [
        {**t, "shown": f"{t['measured']:.2f}×", "verdict": t.get("verdict", "")} for t in found
    ]
    return lines, targets


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


def _s8(name: str, data: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    return s8_markdown(data)


def s8_markdown(data: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """S8's section of the report (its tables, or why it did not run) and its target rows."""
    out = ["## S8: load (enqueue rates, model-bound runs, worker memory)", ""]
    if "report" not in data:
        out += [f"Status: {data['status']}.", ""]
        if data.get("stderr_tail"):
            out += ["```", data["stderr_tail"], "```", ""]
        return out, []
    from benchmarks import bench_load

    out += [bench_load.render(data["report"]), ""]
    return out, data["report"].get("targets") or bench_load.target_rows(data["report"])
