"""What of an event may leave the process: its redacted JSON (:func:`public_payload`,
:func:`public_json`) and streamed text held back until no secret can straddle what is sent
(:class:`DeltaGuard`). The Redis streams and the SSE encoder both publish through these."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Final

from pydantic import JsonValue
from pydantic_core import to_json

from agent_plugin.events import AgentEvent, TextDeltaEvent, ThinkingDeltaEvent
from agent_plugin.redaction import (
    ASSIGNED_SECRET,
    known_secret_spans,
    known_secret_words,
    needs_no_redaction,
    redact_deep,
)

__all__ = ["DeltaGuard", "public_json", "public_jsons", "public_payload"]

Delta = TextDeltaEvent | ThinkingDeltaEvent


def public_payload(event: AgentEvent) -> dict[str, JsonValue]:
    """The JSON of ``event`` as it may leave the process.

    Secret-named fields and credential-looking strings become ``[REDACTED]`` everywhere, tool
    results and assistant text included; JSON inside a string (a tool result) is redacted by
    field name as well; ``name: value`` assignments of secret names lose their value. A
    ``run_end`` carries its summary, never the in-process outcome.
    """
    cleaned = redact_deep(event.model_dump(mode="json"))
    assert isinstance(cleaned, dict)
    return cleaned


def public_json(event: AgentEvent) -> str:
    """:func:`public_payload` as compact JSON text (a number JSON cannot hold, infinite or
    NaN, as ``null``).

    Most events hold nothing to redact: those are written once by pydantic and sent as
    written (:func:`~agent_plugin.redaction.needs_no_redaction` decides, on the text); the
    rest are cleaned value by value. A string that is not valid Unicode (a lone surrogate)
    is written escaped, so the text always encodes as UTF-8.
    """
    written = _written(event)
    if written is not None and needs_no_redaction(written):
        return written
    return _cleaned(event)


def public_jsons(events: Sequence[AgentEvent]) -> list[str]:
    """:func:`public_json` of each of ``events``, in order, with one look at all of them for
    what needs cleaning (a writer's turn: most turns hold nothing to redact)."""
    written = [_written(event) for event in events]
    if needs_no_redaction(*(text for text in written if text is not None)):
        return [
            text if text is not None else _cleaned(event)
            for event, text in zip(events, written, strict=True)
        ]
    return [
        text if text is not None and needs_no_redaction(text) else _cleaned(event)
        for event, text in zip(events, written, strict=True)
    ]


def _written(event: AgentEvent) -> str | None:
    """``event`` as pydantic writes it, or ``None`` when it cannot (a lone surrogate)."""
    try:
        return event.model_dump_json()
    except ValueError:
        return None


def _cleaned(event: AgentEvent) -> str:
    """The slow way: :func:`public_payload`, encoded."""
    cleaned = public_payload(event)
    try:
        return to_json(cleaned, inf_nan_mode="null").decode()
    except ValueError:  # a lone surrogate
        return json.dumps(_finite(cleaned), separators=(",", ":"))  # ASCII: "\\udcff"


def _finite(value: JsonValue) -> JsonValue:
    """``value`` with its infinite and NaN numbers made ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


_WORD_BREAK: Final = re.compile(r"\s+")
_WORD: Final = re.compile(r"\S+")
_INTRODUCED_SECRET: Final = re.compile(r"(?i)\b(?:bearer|basic)\s+\S+")
_HELD_WORDS: Final = 3
_MAX_HELD: Final = 4096


class DeltaGuard:
    """Holds back the tail of streamed text until no secret can straddle what is published.

    A key may arrive split over several deltas (``sk-an`` + ``t-api03...``); each piece alone
    matches no pattern. The guard publishes text only up to the start of its last three words
    (a secret with its introducer, ``password = value`` or ``Bearer token``, spans at most three;
    a registered passphrase of more words holds back as many), and never through the middle of
    a match or of a registered secret; the rest waits for more text or for the next non-delta
    event, which flushes it.
    """

    def __init__(self) -> None:
        self._held: dict[str, Delta] = {}

    def feed(self, event: AgentEvent) -> list[AgentEvent]:
        """The events to publish for ``event``, in order (possibly none)."""
        if not isinstance(event, TextDeltaEvent | ThinkingDeltaEvent):
            return [*self.flush(), event] if self._held else [event]
        held = self._held.pop(event.type, None)
        out: list[AgentEvent] = self.flush()  # text of the other kind, ended by this one
        text = event.text if held is None else held.text + event.text
        cut = _safe_cut(text)
        if cut < len(text):
            self._held[event.type] = event.model_copy(update={"text": text[cut:]})
        if cut > 0:
            out.append(event.model_copy(update={"text": text[:cut]}))
        return out

    def flush(self) -> list[AgentEvent]:
        """Whatever is held, as deltas; the guard is empty afterwards."""
        held, self._held = list(self._held.values()), {}
        return list(held)


def _safe_cut(text: str) -> int:
    """How much of ``text`` can be published now without cutting a possible secret."""
    held = max(_HELD_WORDS, known_secret_words())  # a passphrase of more words is held whole
    words = [0, *(m.end() for m in _WORD_BREAK.finditer(text) if m.end() < len(text))]
    cut = 0 if len(words) <= held else words[-held]
    spans = [
        *(m.span() for p in (ASSIGNED_SECRET, _INTRODUCED_SECRET, _WORD) for m in p.finditer(text)),
        *known_secret_spans(text),
    ]
    moved = True
    while moved:  # moving back out of one match may land inside another
        moved = False
        for start, stop in spans:
            if start < cut < stop:
                cut, moved = start, True
    if len(text) - cut > _MAX_HELD:  # one enormous "word": publish all but a long tail
        cut = len(text) - _MAX_HELD // 2
    return cut
