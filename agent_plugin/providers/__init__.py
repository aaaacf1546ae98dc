"""Models: the :class:`LlmClient` protocol and its implementations.

- :class:`OpenAICompatibleClient` — ``POST {base}/chat/completions`` (OpenAI, Ollama, vLLM,
  LM Studio, llama.cpp, any compatible proxy);
- :class:`AnthropicClient` — ``POST {base}/v1/messages``;
- :class:`ScriptedModel` — a deterministic local model for tests and demos.
"""

from agent_plugin.providers.anthropic import AnthropicClient
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
from agent_plugin.providers.openai import OpenAICompatibleClient
from agent_plugin.providers.retry import RetryNotice, RetryPolicy
from agent_plugin.providers.scripted import ScriptedModel, tool_call

__all__ = [
    "AnthropicClient",
    "ChatRequest",
    "ChatResponse",
    "LlmClient",
    "OpenAICompatibleClient",
    "RetryNotice",
    "RetryPolicy",
    "ScriptedModel",
    "StreamDone",
    "StreamEvent",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallArgumentsDelta",
    "ToolCallStarted",
    "tool_call",
]
