"""An app as a user writes it, with no model in its code: the README's "Testing your agent".

Its tests give the app and its worker one scripted model through the ``model_client``
setting (``AGENT_MODEL_CLIENT=tests.weather_models:weather``); ``WEATHER_QUEUE`` keeps each
test's background runs on a queue of its own.
"""

from __future__ import annotations

import os
from typing import Annotated

from fastapi import FastAPI
from pydantic import BaseModel

from agent_plugin import AgentHandle, AgentPlugin, JobOptions, OutcomeSummary, ToolEffect, tool


@tool(effect=ToolEffect.READ_ONLY)
async def get_weather(city: Annotated[str, "The city to look up"]) -> dict[str, object]:
    """Current weather for a city."""
    return {"city": city, "temperature_c": 21}


plugin = AgentPlugin(
    tools=[get_weather],
    jobs=JobOptions(queue_name=os.environ.get("WEATHER_QUEUE", "agent:queue")),
)
app = FastAPI()
plugin.install(app, runs_route=True)  # POST /agent/runs starts a background run


class Question(BaseModel):
    prompt: str


@app.post("/ask")
async def ask(question: Question, agent: AgentHandle) -> OutcomeSummary:
    turn = await agent.run(question.prompt)
    return OutcomeSummary.of(turn.outcome)
