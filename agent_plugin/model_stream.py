"""A streamed model reply read to its end: deltas become run events, the end the response.

Text and thinking deltas and tool-call starts are emitted as they arrive; a typed output's
partial values (:class:`~agent_plugin.output.OutputStream`) as they grow. The caller gets the
provider's final :class:`~agent_plugin.providers.base.ChatResponse`, as from a plain call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent_plugin.errors import AgentError
from agent_plugin.events import (
    OutputDelta,
    TextDeltaEvent,
    ThinkingDeltaEvent,
    ToolCallDeltaEvent,
)
from agent_plugin.options import EventSink
from agent_plugin.providers.base import (
    ChatRequest,
    ChatResponse,
    LlmClient,
    StreamDone,
    TextDelta,
    ThinkingDelta,
    ToolCallArgumentsDelta,
    ToolCallStarted,
)

if TYPE_CHECKING:
    from agent_plugin.output import Output

__all__ = ["read_stream"]


async def read_stream(
    model: LlmClient,
    request: ChatRequest,
    *,
    run_id: str,
    emit: EventSink | None,
    output: Output[Any] | None,
) -> ChatResponse:
    """Stream ``request`` from ``model``, emitting its deltas, and return the final response."""
    partial = None
    if emit is not None and output is not None and output.typed:
        from agent_plugin.output import OutputStream

        partial = OutputStream(output)
    events = model.stream(request)
    try:
        async for event in events:
            if isinstance(event, StreamDone):
                return event.response
            if emit is None:
                continue
            grown = None
            if isinstance(event, TextDelta):
                emit(TextDeltaEvent(run_id=run_id, text=event.text))
                grown = partial.text_fragment(event.text) if partial is not None else None
            elif isinstance(event, ThinkingDelta):
                emit(ThinkingDeltaEvent(run_id=run_id, text=event.text))
            elif isinstance(event, ToolCallStarted):
                emit(
                    ToolCallDeltaEvent(
                        run_id=run_id, index=event.index, call_id=event.id, name=event.name
                    )
                )
                if partial is not None:
                    partial.call_started(event.index, event.name)
            elif isinstance(event, ToolCallArgumentsDelta) and partial is not None:
                grown = partial.call_fragment(event.index, event.fragment)
            if isinstance(grown, tuple):
                emit(OutputDelta(run_id=run_id, choice=grown[0], partial=grown[1]))
    finally:
        # closed here, at once: left to the event loop's finalizer, an unfinished async
        # generator costs a wake-up of the loop and a task of its own per model call
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()
    raise AgentError.decode(f"the {model.provider_name} stream ended without a final response")
