"""A tour of the agent loop on a scripted model: no network, no API key.

pip install -e . && python examples/quickstart.py
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from agent_plugin import (
    Agent,
    ApprovalDecision,
    AwaitingApproval,
    Completed,
    RunState,
    ScriptedModel,
    ToolEffect,
    ToolRules,
    tool,
)
from agent_plugin.providers.scripted import tool_call

FORECASTS = {"Oslo": "sunny, 21 °C", "Bergen": "rain, 14 °C"}
SENT: list[str] = []


@tool(effect=ToolEffect.READ_ONLY)
async def get_weather(city: Annotated[str, "The city to look up"]) -> str:
    """Today's forecast for a city."""
    return FORECASTS.get(city, "unknown")


@tool(effect=ToolEffect.EXTERNAL)
def send_message(to: Annotated[str, "Who gets it"], text: Annotated[str, "The message"]) -> str:
    """Send a short message to a colleague."""
    SENT.append(f"to {to}: {text}")
    return "sent"


async def main() -> None:
    # The scripted model plays the LLM: first it asks for two forecasts (one parallel round),
    # then it wants to send a message, then it answers.
    model = ScriptedModel(
        [
            [
                tool_call("get_weather", {"city": "Oslo"}),
                tool_call("get_weather", {"city": "Bergen"}),
            ],
            tool_call("send_message", {"to": "Kari", "text": "Bring an umbrella to Bergen."}),
            "Oslo is sunny; Bergen needs an umbrella, and I told Kari.",
        ]
    )
    agent = Agent(
        model,
        tools=[get_weather, send_message],
        system_prompt="You are a concise travel assistant.",
        policy=ToolRules.ask_before_acting(),  # external actions wait for a person
    )

    print("1. The run streams events while it works:")
    outcome = None
    async for event in agent.stream("Weather in Oslo and Bergen? Warn Kari if it rains."):
        if event.type == "tool_end":
            print(f"   {event.name} -> {event.content}")
        elif event.type == "approval_required":
            for call in event.calls:
                print(f"   needs approval: {call.name} {call.arguments} ({call.reason})")
        elif event.type == "run_end":
            outcome = event.outcome

    assert isinstance(outcome, AwaitingApproval)
    print("\n2. The paused run is plain JSON; store it anywhere and resume it later:")
    saved = outcome.state.model_dump_json()
    print(f"   {len(saved)} bytes, {len(outcome.state.messages)} messages")
    state = RunState.model_validate_json(saved)

    call = state.awaiting()[0].call
    turn = await agent.resume(state, [ApprovalDecision.approve(call.id)])
    assert isinstance(turn.outcome, Completed)
    print(f"\n3. Approved and finished after {turn.outcome.steps_used} tool rounds:")
    print(f"   {turn.outcome.text}")
    print(f"   messages sent: {SENT}")
    print(f"   tokens used: {turn.outcome.usage.total()}")


if __name__ == "__main__":
    asyncio.run(main())
