"""Live runs across processes, on Redis: event streams (:mod:`agent_plugin.live.streams`) and
cancel and steering requests (:mod:`agent_plugin.live.control`). An adapter: the core never
imports it. Redis itself loads with the first stream or channel: the web side imports this
package's helpers for runs that never leave the process too."""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from agent_plugin.live.public import DeltaGuard, public_json, public_jsons, public_payload
from agent_plugin.live.publishing import EventPublisher, RunEventStream, StreamWriter
from agent_plugin.live.streams import (
    DEFAULT_PREFIX,
    RecordedEnd,
    caught_up_with_end,
    open_events,
    parse_event_id,
    read_events,
    stream_key,
)

if TYPE_CHECKING:
    from agent_plugin.live.control import ControlWatcher, RunControlChannel, watch

_LAZY = frozenset({"ControlWatcher", "RunControlChannel", "watch"})


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'agent_plugin.live' has no attribute {name!r}")
    return getattr(import_module("agent_plugin.live.control"), name)


__all__ = [
    "DEFAULT_PREFIX",
    "ControlWatcher",
    "DeltaGuard",
    "EventPublisher",
    "RecordedEnd",
    "RunControlChannel",
    "RunEventStream",
    "StreamWriter",
    "caught_up_with_end",
    "open_events",
    "parse_event_id",
    "public_json",
    "public_jsons",
    "public_payload",
    "read_events",
    "stream_key",
    "watch",
]
