"""What each OpenAI-compatible endpoint accepts: one small frozen :class:`EndpointProfile`.

Servers that copy OpenAI's chat-completions protocol disagree at the edges: Mistral answers 422
to ``stream_options`` and to ``reasoning_content`` in an assistant message, Cerebras and
OpenRouter name the reasoning field ``reasoning``, OpenAI's reasoning models want
``max_completion_tokens`` and the ``developer`` role, some servers ignore or refuse
``tool_choice`` and ``parallel_tool_calls``. The request encoder of
:class:`~agent_plugin.providers.openai.OpenAICompatibleClient` asks the client's profile;
:func:`profile_for` picks the profile of a known host from the base URL, and any other URL
gets :data:`GENERIC` (what the OpenAI API itself accepts, in its most widely copied form).
A profile is overridden by passing one to the client, or by :func:`replace` on a known one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias, get_args

import httpx

from agent_plugin.errors import AgentError

__all__ = [
    "GENERIC",
    "PROFILES",
    "EndpointProfile",
    "ReasoningField",
    "profile_for",
    "replace",
]

ReasoningField: TypeAlias = Literal["reasoning_content", "reasoning", "thinking"]
"""Where a server puts a reply's reasoning: DeepSeek's ``reasoning_content``, the
``reasoning`` of Ollama, Groq, Cerebras and OpenRouter, or Mistral's ``thinking`` content
parts (``{"type": "thinking", "thinking": [{"type": "text", "text": ...}]}``)."""


@dataclass(frozen=True, slots=True)
class EndpointProfile:
    """What one OpenAI-compatible endpoint accepts in a chat-completions request.

    * ``stream_usage``: a stream asks for its usage chunk with ``stream_options:
      {"include_usage": true}`` (servers that refuse the field send usage unasked, or not).
    * ``reasoning_field`` and ``send_reasoning``: where the server puts reasoning, and whether
      earlier (unsigned) reasoning is sent back there in assistant messages; DeepSeek needs it
      back within a tool-calling turn, OpenAI rejects the unknown field.
    * ``max_tokens_field``: the name of the output cap, ``max_tokens`` or
      ``max_completion_tokens``.
    * ``system_role``: the role system instructions are sent with, ``system`` or ``developer``.
    * ``parallel_tool_calls``, ``tool_choice``, ``strict_tools``, ``images``: whether the
      server takes the ``parallel_tool_calls`` field, honours ``tool_choice``, takes
      ``strict: true`` on a function definition (and on a response format), and takes images
      in user messages.
    * ``response_format``: whether it takes ``response_format: {"type": "json_schema"}``
      (native structured output).

    A request the endpoint cannot express is a Config error when it would change the answer
    (a tool choice other than ``auto``, ``parallel_tool_calls: false``, an image); a request
    for strict schemas is left out where they are not taken (the arguments are validated
    here anyway).
    """

    name: str = "openai-compatible"
    stream_usage: bool = True
    reasoning_field: ReasoningField = "reasoning_content"
    send_reasoning: bool = True
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    system_role: Literal["system", "developer"] = "system"
    parallel_tool_calls: bool = True
    tool_choice: bool = True
    strict_tools: bool = True
    images: bool = True
    response_format: bool = True

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise AgentError.config(
                    f"endpoint profile {name} must be one of {', '.join(allowed)}"
                )
        for flag in _FLAGS:
            if not isinstance(getattr(self, flag), bool):
                raise AgentError.config(f"endpoint profile {flag} must be true or false")


_CHOICES: Final[Mapping[str, tuple[str, ...]]] = {
    "reasoning_field": get_args(ReasoningField),
    "max_tokens_field": ("max_tokens", "max_completion_tokens"),
    "system_role": ("system", "developer"),
}
_FLAGS: Final = (
    "stream_usage",
    "send_reasoning",
    "parallel_tool_calls",
    "tool_choice",
    "strict_tools",
    "images",
    "response_format",
)

GENERIC: Final = EndpointProfile()
"""Any OpenAI-compatible server not known by its host (vLLM, LM Studio, llama.cpp, a proxy)."""

_OPENAI: Final = EndpointProfile(
    name="openai",
    send_reasoning=False,
    max_tokens_field="max_completion_tokens",
    system_role="developer",
)

PROFILES: Final[Mapping[str, EndpointProfile]] = {
    "openai": _OPENAI,
    "azure": dataclasses.replace(_OPENAI, name="azure"),
    "mistral": EndpointProfile(name="mistral", stream_usage=False, reasoning_field="thinking"),
    "cerebras": EndpointProfile(
        name="cerebras",
        reasoning_field="reasoning",
        max_tokens_field="max_completion_tokens",
        images=False,
    ),
    "openrouter": EndpointProfile(name="openrouter", reasoning_field="reasoning"),
    "groq": EndpointProfile(
        name="groq",
        stream_usage=False,
        reasoning_field="reasoning",
        send_reasoning=False,
        max_tokens_field="max_completion_tokens",
        strict_tools=False,
    ),
    "deepseek": EndpointProfile(
        name="deepseek",
        parallel_tool_calls=False,
        strict_tools=False,
        images=False,
        response_format=False,  # json_object only
    ),
    "together": EndpointProfile(
        name="together",
        stream_usage=False,
        reasoning_field="reasoning",
        send_reasoning=False,
        parallel_tool_calls=False,
        strict_tools=False,
    ),
    "ollama": EndpointProfile(
        name="ollama",
        reasoning_field="reasoning",
        parallel_tool_calls=False,
        tool_choice=False,
        strict_tools=False,
    ),
    "xai": EndpointProfile(
        name="xai", send_reasoning=False, max_tokens_field="max_completion_tokens"
    ),
    "gemini": EndpointProfile(
        name="gemini",
        send_reasoning=False,
        max_tokens_field="max_completion_tokens",
        parallel_tool_calls=False,
        strict_tools=False,
    ),
}
"""The profiles of the known hosts, by name (see :func:`profile_for` for the hosts)."""

_HOSTS: Final[Mapping[str, str]] = {
    "api.openai.com": "openai",
    "api.mistral.ai": "mistral",
    "api.cerebras.ai": "cerebras",
    "openrouter.ai": "openrouter",
    "api.groq.com": "groq",
    "api.deepseek.com": "deepseek",
    "api.together.xyz": "together",
    "api.together.ai": "together",
    "ollama.com": "ollama",
    "api.x.ai": "xai",
    "generativelanguage.googleapis.com": "gemini",
}
_HOST_SUFFIXES: Final[Mapping[str, str]] = {
    ".openai.azure.com": "azure",
    ".cognitiveservices.azure.com": "azure",
}
_OLLAMA_PORT: Final = 11434


def profile_for(base_url: str) -> EndpointProfile:
    """The profile of the server at ``base_url``: a known host's (OpenAI, Azure OpenAI,
    Mistral, Cerebras, OpenRouter, Groq, DeepSeek, Together, Ollama (``ollama.com`` or port
    11434), xAI, Gemini), else :data:`GENERIC`."""
    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL:
        return GENERIC
    host = url.host.lower()
    name = _HOSTS.get(host)
    if name is None:
        name = next((n for suffix, n in _HOST_SUFFIXES.items() if host.endswith(suffix)), None)
    if name is None and url.port == _OLLAMA_PORT:
        name = "ollama"
    return GENERIC if name is None else PROFILES[name]


def replace(profile: EndpointProfile | str, **changes: Any) -> EndpointProfile:
    """``profile`` (or the known profile of that name) with some fields changed.

    A Config error names an unknown profile or field: ``replace("mistral", images=False)``.
    """
    if isinstance(profile, str):
        known = PROFILES.get(profile) or (GENERIC if profile == GENERIC.name else None)
        if known is None:
            raise AgentError.config(
                f"unknown endpoint profile {profile!r}; known: "
                f"{', '.join(sorted([GENERIC.name, *PROFILES]))}"
            )
        profile = known
    fields = {f.name for f in dataclasses.fields(EndpointProfile)}
    unknown = sorted(set(changes) - fields)
    if unknown:
        raise AgentError.config(f"unknown endpoint profile field(s): {', '.join(unknown)}")
    return dataclasses.replace(profile, **changes)
