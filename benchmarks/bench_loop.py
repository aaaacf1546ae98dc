"""CPU cost of one agent-loop step with a zero-latency in-process model.

Runs a conversation of N tool rounds (N = 1, 10, 50, 200) through ``Agent`` and through the
smallest hand-written loop over the same model and tool, in the same process, and reports CPU
microseconds per step for both and their ratio. The model returns prebuilt replies, so what is
measured is the loop's own work: budgets, truncation, gating, hooks, the tool call and the
transcript.

    python benchmarks/bench_loop.py            # prints a markdown table, writes results/loop.json
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

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

STEPS = (1, 10, 50, 200)
"""Tool rounds per run. Each figure is the marginal cost: (CPU of an N-round run - CPU of a
run answered directly) / N, so the fixed cost of a run is not spread over its steps."""
REPEATS = 15
USAGE = TokenUsage(input_tokens=1, output_tokens=1)


class InstantModel:
    """Answers ``steps`` tool calls, then a final text, from replies built in advance."""

    provider_name = "instant"

    def reset(self) -> None:
        self.index = 0

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


async def lookup(args: Any) -> Any:
    return {"value": args["i"]}


LOOKUP = FnTool(
    "lookup",
    "Looks a number up.",
    {"type": "object", "properties": {"i": {"type": "integer"}}, "required": ["i"]},
    lookup,
)


def agent_for(steps: int) -> Agent:
    return Agent(
        InstantModel(steps),
        tools=[LOOKUP],
        max_steps=steps + 1,
        max_tokens=1_000_000,
        loop_guard=LoopGuard.disabled(),
        system_prompt="You look numbers up.",
    )


async def agent_run(agent: Agent) -> None:
    assert isinstance(agent.model, InstantModel)
    agent.model.reset()
    outcome = (await agent.run("look them up")).outcome
    assert outcome.status == "completed", outcome


async def hand_loop(model: InstantModel) -> None:
    """The smallest correct loop: call, run the tool, append the result, repeat."""
    model.reset()
    messages = [ChatMessage.system("You look numbers up."), ChatMessage.user("look them up")]
    while True:
        response = await model.chat(ChatRequest(messages=list(messages)))
        messages.append(ChatMessage(role=Role.ASSISTANT, content=response.content))
        calls = response.tool_calls
        if not calls:
            return
        results = []
        for call in calls:
            value = await LOOKUP.execute(call.arguments, None)  # type: ignore[arg-type]
            results.append(ToolResult(tool_call_id=call.id, content=json.dumps(value)))
        messages.append(ChatMessage.tool_results(results))


async def _cpu_us(fn: Any, subject: Any) -> float:
    gc.collect()
    start = time.process_time()
    await fn(subject)
    return (time.process_time() - start) * 1e6


async def measure() -> tuple[dict[str, float], list[dict[str, float]]]:
    """The least CPU µs of each run over REPEATS rounds, every subject once per round (after a
    warm-up run of each): interleaving spreads the machine's noise evenly over the subjects,
    and on a shared machine the minimum is the most repeatable estimate of the work itself.
    Per step: (T(N) - T(0)) / N, T(0) being a run answered at once."""
    subjects = [
        (who, steps, fn, subject)
        for steps in (0, *STEPS)
        for who, fn, subject in (
            ("agent_us", agent_run, agent_for(steps)),
            ("hand_loop_us", hand_loop, InstantModel(steps)),
        )
    ]
    least: dict[tuple[str, int], float] = {}
    for _, _, fn, subject in subjects:
        await fn(subject)
    for _ in range(REPEATS):
        for who, steps, fn, subject in subjects:
            cpu = await _cpu_us(fn, subject)
            least[who, steps] = min(cpu, least.get((who, steps), cpu))
    fixed = {who: least[who, 0] for who in ("agent_us", "hand_loop_us")}
    rows = []
    for steps in STEPS:
        ours = (least["agent_us", steps] - fixed["agent_us"]) / steps
        base = (least["hand_loop_us", steps] - fixed["hand_loop_us"]) / steps
        rows.append({"steps": steps, "agent_us": ours, "hand_loop_us": base, "ratio": ours / base})
    return fixed, rows


def main() -> None:
    fixed, rows = asyncio.run(measure())
    flat = rows[-1]["agent_us"] / rows[0]["agent_us"]
    print(
        f"Fixed cost of a run answered directly: Agent {fixed['agent_us']:.0f} µs, "
        f"hand loop {fixed['hand_loop_us']:.0f} µs\n"
    )
    print("| steps | Agent µs/step | hand loop µs/step | ratio |")
    print("|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['steps']} | {row['agent_us']:.1f} | {row['hand_loop_us']:.1f} "
            f"| {row['ratio']:.2f}× |"
        )
    print(f"\n200-step vs 1-step cost per step: {flat:.2f}×")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    result = {"fixed": fixed, "rows": rows, "flatness_200_vs_1": flat}
    (out / "loop.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
