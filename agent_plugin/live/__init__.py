"""Live runs across processes, on Redis: event streams (:mod:`agent_plugin.live.streams`) and
cancel and steering requests (:mod:`agent_plugin.live.control`). An adapter: the core never
imports it."""

from agent_plugin.live.control import ControlWatcher, RunControlChannel, watch
from agent_plugin.live.streams import (
    DEFAULT_PREFIX,
    DeltaGuard,
    EventPublisher,
    RecordedEnd,
    RunEventStream,
    caught_up_with_end,
    open_events,
    parse_event_id,
    public_payload,
    read_events,
    stream_key,
)

__all__ = [
    "DEFAULT_PREFIX",
    "ControlWatcher",
    "DeltaGuard",
    "EventPublisher",
    "RecordedEnd",
    "RunControlChannel",
    "RunEventStream",
    "caught_up_with_end",
    "open_events",
    "parse_event_id",
    "public_payload",
    "read_events",
    "stream_key",
    "watch",
]
