"""What telemetry costs a run: client CPU per model call of a scripted run (one tool round
per call, in-process, no network), interleaved over repeats, for four configurations:

* off: no SDK configured and no prices (what a run pays when nothing is recorded);
* priced: the cost of every call from a configured price, no SDK;
* traced: the SDK's tracer and meter (in-memory exporter and reader), and prices;
* traced with contents: the same, message contents on spans (redacted).

    PYTHONPATH=. python benchmarks/bench_telemetry.py [--calls 2000] [--repeats 7]

Prints medians with their range; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_plugin.agent import Agent
from agent_plugin.pricing import ModelPrice, Prices
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.telemetry import Telemetry
from agent_plugin.tools import tool


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


def _prices() -> Prices:
    return Prices({"scripted": ModelPrice(input=1.0, output=2.0)}, table=False)


def _traced(record_content: bool) -> Callable[[], Telemetry]:
    def make() -> Telemetry:
        spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
        meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
        return Telemetry(
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            record_content=record_content,
            prices=_prices(),
        )

    return make


CONFIGURATIONS: dict[str, Callable[[], Telemetry]] = {
    "off": lambda: Telemetry(prices=Prices(table=False)),
    "priced": lambda: Telemetry(prices=_prices()),
    "traced": _traced(False),
    "traced with contents": _traced(True),
}


async def cpu_per_call(make: Callable[[], Telemetry], calls: int) -> float:
    """Client CPU seconds per model call over ``calls`` calls (runs of one round each)."""

    def reply(request: object) -> object:
        messages = getattr(request, "messages", [])
        return (
            "done"
            if messages and messages[-1].role.value == "tool"
            else tool_call("lookup", {"key": "k"})
        )

    agent = Agent(
        ScriptedModel(default=reply, keep_requests=0),
        tools=[lookup],
        telemetry=make(),
        max_steps=1000,
        max_tokens=10_000_000,
    )
    await agent.run("warm up")
    runs = calls // 2
    started = time.process_time()
    for _ in range(runs):
        await agent.run("go")
    return (time.process_time() - started) / (runs * 2)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {name: [] for name in CONFIGURATIONS}
    for _ in range(args.repeats):
        for name, make in CONFIGURATIONS.items():
            samples[name].append(await cpu_per_call(make, args.calls))
    base = statistics.median(samples["off"])
    print("| configuration | CPU per model call (µs) | vs off |\n|---|---|---|")
    for name, values in samples.items():
        median = statistics.median(values)
        print(
            f"| {name} | {median * 1e6:.0f} [{min(values) * 1e6:.0f}–{max(values) * 1e6:.0f}] "
            f"| {median / base:.2f}× |"
        )


if __name__ == "__main__":
    asyncio.run(main())
