"""S4 in process: the CPU of one agent-loop step with a zero-latency in-process model.

One conversation of ``rounds`` tool rounds runs through ``Agent`` (a sync tool, then the same
tool written ``async def``) and through the smallest hand-written loop over the same model and
tool, in the same process. The tool reads the CPU clock at the calls around a window of steps,
so the steps are timed where they happen (nothing subtracted): the figure at N messages is the
CPU of the steps whose requests held N, N + 2, ... messages, over their number. The model
returns prebuilt replies, so what is measured is the loop's own work: budgets, truncation,
gating, hooks, the tool call and the transcript.

    python benchmarks/bench_loop.py            # prints a markdown table, writes results/loop.json
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_plugin.agent import Agent
from agent_plugin.loop_guard import LoopGuard
from agent_plugin.messages import (
    ChatMessage,
    Role,
    StopReason,
    TextPart,
    TokenUsage,
    ToolCall,
    ToolCallPart,
    ToolResult,
)
from agent_plugin.providers.base import ChatRequest, ChatResponse, StreamDone, StreamEvent
from agent_plugin.tools import FnTool
from benchmarks import baseline

MESSAGES = (10, 50, 200, 400)
WINDOW = 6
USAGE = TokenUsage(input_tokens=1, output_tokens=1)
SCHEMA = baseline.SCHEMA


class InstantModel:
    """Answers ``steps`` tool calls, then a final text, from replies built in advance."""

    provider_name = "instant"

    def __init__(self, steps: int) -> None:
        self.replies = [
            ChatResponse(
                content=[
                    ToolCallPart(tool_call=ToolCall(id=f"c{i}", name="lookup", arguments={"i": i}))
                ],
                stop_reason=StopReason.TOOL_USE,
                usage=USAGE,
            )
            for i in range(steps)
        ] + [ChatResponse(content=[TextPart(text="done")], usage=USAGE)]
        self.index = 0

    def reset(self) -> None:
        self.index = 0

    async def chat(self, request: ChatRequest) -> ChatResponse:
        reply = self.replies[self.index]
        self.index += 1
        return reply

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        yield StreamDone(await self.chat(request))

    async def list_models(self) -> list[str]:
        return ["instant"]

    async def aclose(self) -> None:
        return None


def bounds(n: int) -> tuple[int, int]:
    """The tool calls around the :data:`WINDOW` steps from the one whose request held ``n``
    messages: the request between calls i and i + 1 holds 4 + 2i messages (system, user, then
    a call and its result per round)."""
    start = max((n - 2) // 2 - 1, 0)
    return start, start + WINDOW


MARKED = frozenset(i for n in MESSAGES for i in bounds(n))


class Clock:
    """The tool's record of the CPU clock at the calls in :data:`MARKED` (a few per run, so
    reading the clock costs the steps nothing measurable)."""

    def __init__(self) -> None:
        self.times: dict[int, float] = {}
        self.calls = 0

    def reset(self) -> None:
        self.times.clear()
        self.calls = 0

    def lookup(self, arguments: Any) -> Any:
        if self.calls in MARKED:
            self.times[self.calls] = time.process_time()
        self.calls += 1
        return baseline.lookup(arguments)


def agent_for(model: InstantModel, clock: Clock, *, sync: bool) -> Agent:
    async def async_lookup(arguments: Any) -> Any:
        return clock.lookup(arguments)

    tool = FnTool("lookup", "Looks a number up.", SCHEMA, clock.lookup if sync else async_lookup)
    return Agent(
        model,
        tools=[tool],
        max_steps=len(model.replies) + 1,
        max_tokens=10**9,
        loop_guard=LoopGuard.disabled(),
        system_prompt=baseline.SYSTEM,
    )


async def hand_loop(model: InstantModel, clock: Clock) -> None:
    """The smallest correct loop: call, run the tool, append the result, repeat."""
    messages = [ChatMessage.system(baseline.SYSTEM), ChatMessage.user("look them up")]
    while True:
        response = await model.chat(ChatRequest(messages=list(messages)))
        messages.append(ChatMessage(role=Role.ASSISTANT, content=response.content))
        calls = response.tool_calls
        if not calls:
            return
        results = [
            ToolResult(tool_call_id=call.id, content=json.dumps(clock.lookup(call.arguments)))
            for call in calls
        ]
        messages.append(ChatMessage.tool_results(results))


def per_step(times: dict[int, float]) -> dict[int, float]:
    """CPU per step at each of :data:`MESSAGES`."""
    out = {}
    for n in MESSAGES:
        start, end = bounds(n)
        if start in times and end in times:
            out[n] = (times[end] - times[start]) / WINDOW
    return out


async def measure(*, rounds: int = 205, repeats: int = 9) -> dict[str, Any]:
    """Interleaved repeats of the three subjects (after a warm-up of each); per N, the median
    and range over the repeats, and the ratio to the hand loop (of samples of the same round)."""
    models = {who: InstantModel(rounds) for who in ("agent", "agent-async", "hand")}
    clocks = {who: Clock() for who in models}
    agents = {
        "agent": agent_for(models["agent"], clocks["agent"], sync=True),
        "agent-async": agent_for(models["agent-async"], clocks["agent-async"], sync=False),
    }

    async def once(who: str) -> dict[int, float]:
        model, clock = models[who], clocks[who]
        model.reset()
        clock.reset()
        gc.collect()
        if who == "hand":
            await hand_loop(model, clock)
        else:
            outcome = (await agents[who].run("look them up")).outcome
            assert outcome.status == "completed", outcome
        return per_step(clock.times)

    for who in models:
        await once(who)
    samples: dict[str, list[dict[int, float]]] = {who: [] for who in models}
    order = list(models)
    for repeat in range(repeats):
        for who in order[repeat % 3 :] + order[: repeat % 3]:
            samples[who].append(await once(who))
    rows = []
    for n in MESSAGES:
        row: dict[str, Any] = {"messages": n}
        for who, got in samples.items():
            values = [s[n] * 1e6 for s in got]
            row[who] = {
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
            }
        for who in ("agent", "agent-async"):
            ratios = [a[n] / h[n] for a, h in zip(samples[who], samples["hand"], strict=True)]
            row[f"{who}_vs_hand"] = statistics.median(ratios)
        rows.append(row)
    growth = {
        who: statistics.median(s[MESSAGES[-1]] / s[MESSAGES[0]] for s in got)
        for who, got in samples.items()
    }
    return {"rounds": rounds, "repeats": repeats, "window": WINDOW, "rows": rows, "growth": growth}


def table(result: dict[str, Any]) -> list[str]:
    out = [
        "| messages | Agent, sync tool µs/step | Agent, async tool µs/step "
        "| hand loop µs/step | Agent / hand loop (sync, async) |",
        "|---:|---:|---:|---:|---:|",
    ]

    def show(s: dict[str, float]) -> str:
        return f"{s['median']:.1f} [{s['min']:.1f}–{s['max']:.1f}]"

    for row in result["rows"]:
        out.append(
            f"| {row['messages']} | {show(row['agent'])} | {show(row['agent-async'])} "
            f"| {show(row['hand'])} | {row['agent_vs_hand']:.2f}× / "
            f"{row['agent-async_vs_hand']:.2f}× |"
        )
    growth = result["growth"]
    out += [
        "",
        f"Per-step CPU at {MESSAGES[-1]} messages over that at {MESSAGES[0]}: Agent (sync tool) "
        f"{growth['agent']:.2f}×, Agent (async tool) {growth['agent-async']:.2f}×, hand loop "
        f"{growth['hand']:.2f}×.",
    ]
    return out


def main() -> None:
    result = asyncio.run(measure())
    print("\n".join(table(result)))
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "loop.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
