"""Build the :class:`~agent_plugin.providers.base.LlmClient` that the settings describe."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from agent_plugin.config import AgentSettings, ProviderName, parse_provider
from agent_plugin.errors import AgentError
from agent_plugin.providers.anthropic import AnthropicClient
from agent_plugin.providers.base import LlmClient
from agent_plugin.providers.engines import DEFAULT_LIMITS
from agent_plugin.providers.openai import OpenAICompatibleClient
from agent_plugin.providers.profiles import EndpointProfile, profile_for, replace
from agent_plugin.providers.scripted import ScriptedModel

__all__ = ["ProviderName", "create_client", "endpoint_profile", "parse_provider"]


def create_client(
    settings: AgentSettings,
    *,
    api_key: str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    limits: httpx.Limits = DEFAULT_LIMITS,
) -> LlmClient:
    """The client for ``settings.provider`` with the resolved model, base URL and timeout.

    ``api_key`` is passed as given (the plugin passes ``settings.require_api_key()``, which reads
    ``AGENT_API_KEY``); ``transport`` replaces the default transport (aiohttp behind
    httpx-aiohttp's, see :func:`~agent_plugin.providers.default_transport`), whose pool
    ``limits`` bound. The ``scripted`` provider gives a :class:`ScriptedModel` that answers
    ``"default"``; an app that wants a script hands its own model to the plugin instead.
    """
    model = settings.resolved_model()
    timeout = float(settings.request_timeout_secs)
    match settings.provider:
        case "openai-compatible":
            base_url = settings.resolved_base_url()
            return OpenAICompatibleClient(
                model=model,
                base_url=base_url,
                api_key=api_key,
                timeout=timeout,
                transport=transport,
                limits=limits,
                profile=endpoint_profile(settings.endpoint, base_url),
            )
        case "anthropic":
            return AnthropicClient(
                model=model,
                base_url=settings.resolved_base_url(),
                api_key=api_key,
                timeout=timeout,
                prompt_caching=settings.prompt_caching,
                transport=transport,
                limits=limits,
            )
        case "scripted":
            return ScriptedModel(models=(model,))


def endpoint_profile(table: Mapping[str, Any], base_url: str) -> EndpointProfile | None:
    """The profile ``[agent.endpoint]`` describes: the profile of ``base_url``'s host (or the
    known profile its ``name`` says) with the table's fields changed; ``None`` for an empty
    table (the client picks its host's profile). A Config error names the table."""
    if not table:
        return None
    changes = dict(table)
    start = changes.pop("name", None)
    if start is not None and not isinstance(start, str):
        raise AgentError.config(f"[agent.endpoint] name must be a profile name, got {start!r}")
    try:
        return replace(start if start is not None else profile_for(base_url), **changes)
    except AgentError as error:
        raise AgentError.config(f"[agent.endpoint]: {error.message}") from None
