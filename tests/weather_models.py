"""The model of :mod:`tests.weather_app`'s tests: a function of the conversation."""

from __future__ import annotations

import json

from agent_plugin.messages import ChatMessage
from agent_plugin.testing import FunctionModel, ModelCall, Reply, tool_call


def forecast(messages: list[ChatMessage], call: ModelCall) -> Reply:
    """Look the city up first; then answer from what the tool said."""
    if not call.results:
        city = messages[-1].text.rsplit(" ", 1)[-1].strip("?")
        return tool_call("get_weather", {"city": city})
    weather = json.loads(call.results[0].content)
    return f"{weather['city']}: {weather['temperature_c']} °C"


weather = FunctionModel(forecast)
