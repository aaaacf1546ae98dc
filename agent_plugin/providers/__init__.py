"""Models: the :class:`LlmClient` protocol and its implementations.

- :class:`OpenAICompatibleClient` — ``POST {base}/chat/completions`` (OpenAI, Ollama, vLLM,
  LM Studio, llama.cpp, any compatible proxy);
- :class:`AnthropicClient` — ``POST {base}/v1/messages``;
- :class:`ScriptedModel` — a deterministic local model for tests and demos.

:class:`EndpointProfile` says what an OpenAI-compatible endpoint accepts (chosen from the base
URL for known hosts); :class:`ServerTool` declares a tool Anthropic runs itself.

A wire client sends through :func:`default_transport` (aiohttp behind httpx-aiohttp's
transport) unless it is given another httpx transport as ``transport=`` (or
``AgentPlugin(http_transport=...)``), for example httpx's own for HTTP/2.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from agent_plugin.providers.base import (
    ChatRequest,
    ChatResponse,
    LlmClient,
    StreamDone,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallArgumentsDelta,
    ToolCallStarted,
)
from agent_plugin.providers.retry import RetryNotice, RetryPolicy
from agent_plugin.providers.scripted import ScriptedModel, tool_call

if TYPE_CHECKING:
    from agent_plugin.providers.aiohttp_engine import default_transport
    from agent_plugin.providers.anthropic import AnthropicClient, ServerTool
    from agent_plugin.providers.openai import OpenAICompatibleClient
    from agent_plugin.providers.profiles import EndpointProfile

# the wire clients (and httpx) load on first use, not with the core
_LAZY = {
    "AnthropicClient": "agent_plugin.providers.anthropic",
    "EndpointProfile": "agent_plugin.providers.profiles",
    "OpenAICompatibleClient": "agent_plugin.providers.openai",
    "ServerTool": "agent_plugin.providers.anthropic",
    "default_transport": "agent_plugin.providers.aiohttp_engine",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agent_plugin.providers' has no attribute {name!r}")
    return getattr(import_module(module), name)


__all__ = [
    "AnthropicClient",
    "ChatRequest",
    "ChatResponse",
    "EndpointProfile",
    "LlmClient",
    "OpenAICompatibleClient",
    "RetryNotice",
    "RetryPolicy",
    "ScriptedModel",
    "ServerTool",
    "StreamDone",
    "StreamEvent",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallArgumentsDelta",
    "ToolCallStarted",
    "default_transport",
    "tool_call",
]
