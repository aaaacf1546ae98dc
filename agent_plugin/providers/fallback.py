"""Model fallback: :class:`FallbackClient` tries an ordered list of models in turn.

The next model is asked when a call fails with one of :data:`FALLBACK_ON` (the provider is
down, still rate limited after the client's own retries, or the conversation is too long for
the model), each switch reported to the request's ``on_fallback`` as a :class:`FallbackNotice`
(the loop makes a ``model_fallback`` event and a span event of it). A stream falls back only
before its first event: text already shown is never replaced.

Models may be of several providers. A transcript stays valid across them because each wire
encoder sends only what its provider made: signed (Anthropic) thinking goes to Anthropic only,
unsigned reasoning to OpenAI-compatible servers only, a provider's own blocks to that
provider only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Final

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.providers.base import (
    ChatRequest,
    ChatResponse,
    FallbackNotice,
    LlmClient,
    StreamEvent,
)

__all__ = ["FALLBACK_ON", "FallbackClient", "FallbackModel", "FallbackNotice"]

FALLBACK_ON: Final = frozenset(
    {ErrorKind.UNAVAILABLE, ErrorKind.RATE_LIMITED, ErrorKind.CONTEXT_TOO_LONG}
)
"""The error kinds that move a call on to the next model."""


@dataclass(frozen=True, slots=True)
class FallbackModel:
    """A model of a fallback list: ``client``, asked for ``model`` (``None``: the client's own
    model). One client may serve several models of its provider."""

    client: LlmClient
    model: str | None = None

    @property
    def name(self) -> str:
        return self.model or getattr(self.client, "model", None) or self.client.provider_name


class FallbackClient:
    """An :class:`~agent_plugin.providers.base.LlmClient` that asks ``models`` in order,
    moving on when a call fails with a kind in ``on`` (default :data:`FALLBACK_ON`); the
    last model's error is raised. Every call starts again from the first model. ``aclose``
    closes each distinct client once."""

    def __init__(
        self,
        models: Iterable[LlmClient | FallbackModel],
        *,
        on: Iterable[ErrorKind] = FALLBACK_ON,
    ) -> None:
        self.models = tuple(m if isinstance(m, FallbackModel) else FallbackModel(m) for m in models)
        if not self.models:
            raise AgentError.config("a FallbackClient needs at least one model")
        self.on = frozenset(on)

    def __repr__(self) -> str:
        return f"FallbackClient(models={[m.name for m in self.models]!r})"

    @property
    def provider_name(self) -> str:
        return self.models[0].client.provider_name

    @property
    def model(self) -> str | None:
        """The first model's name (what a call asks for first)."""
        first = self.models[0]
        return first.model or getattr(first.client, "model", None)

    @property
    def base_url(self) -> str | None:
        return getattr(self.models[0].client, "base_url", None)

    def _request_for(self, entry: FallbackModel, request: ChatRequest) -> ChatRequest:
        if entry.model is None or request.model == entry.model:
            return request
        return dataclasses.replace(request, model=entry.model)

    def _notify(self, request: ChatRequest, index: int, error: AgentError) -> None:
        if request.on_fallback is None:
            return
        entry, after = self.models[index], self.models[index + 1]
        request.on_fallback(
            FallbackNotice(
                from_model=request.model or entry.name,
                to_model=after.name,
                to_provider=after.client.provider_name,
                to_base_url=getattr(after.client, "base_url", None),
                error=error,
            )
        )

    async def chat(self, request: ChatRequest) -> ChatResponse:
        last = len(self.models) - 1
        for index, entry in enumerate(self.models):
            try:
                return await entry.client.chat(self._request_for(entry, request))
            except AgentError as error:
                if index == last or error.kind not in self.on:
                    raise
                self._notify(request, index, error)
        raise AssertionError("unreachable")  # pragma: no cover

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        last = len(self.models) - 1
        for index, entry in enumerate(self.models):
            events = entry.client.stream(self._request_for(entry, request))
            started = False
            try:
                async for event in events:
                    started = True
                    yield event
                return
            except AgentError as error:
                if started or index == last or error.kind not in self.on:
                    raise
                self._notify(request, index, error)
            finally:
                close = getattr(events, "aclose", None)
                if close is not None:
                    await close()

    async def list_models(self) -> list[str]:
        return await self.models[0].client.list_models()

    async def aclose(self) -> None:
        seen: set[int] = set()
        for entry in self.models:
            if id(entry.client) not in seen:
                seen.add(id(entry.client))
                await entry.client.aclose()
