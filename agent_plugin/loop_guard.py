"""The loop guard: notice when the model keeps making the same call and getting the same answer.

Every executed tool call is reduced to a fingerprint of (tool name, arguments, raw result). The
tracker keeps the last ``window`` fingerprints; when one of them occurs ``warn_after`` times the
agent appends :func:`warning_note` to the result, and at ``stop_after`` times the run ends as
``loop_detected``.

Because the result is part of the fingerprint, polling a tool whose output changes is never a
loop, while ping-pong between two calls is (both fingerprints repeat). Fingerprints are plain
integers kept in ``RunState.recent_calls``, so the count survives a pause and a resume in another
process: they come from SHA-256, not from the per-process salted ``hash()``, and have 53 bits so
a JavaScript client reading the saved state keeps them exact.
"""

from __future__ import annotations

import hashlib
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, TypeAlias

from pydantic import JsonValue

from agent_plugin.errors import AgentError
from agent_plugin.tools import canonical_json

__all__ = [
    "OK",
    "LoopGuard",
    "LoopTracker",
    "Ok",
    "Stop",
    "Verdict",
    "Warn",
    "fingerprint",
    "warning_note",
]


# --- verdicts ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ok:
    """Not a loop (yet). Use :data:`OK`."""


@dataclass(frozen=True, slots=True)
class Warn:
    """The same call and result occurred ``repeats`` times: append :func:`warning_note`."""

    repeats: int


@dataclass(frozen=True, slots=True)
class Stop:
    """The same call and result occurred ``repeats`` times: end the run as ``loop_detected``."""

    repeats: int


Verdict: TypeAlias = Ok | Warn | Stop
"""What :meth:`LoopTracker.record` says about a call; ``match`` on it."""

OK: Final = Ok()
"""The one :class:`Ok` the tracker returns."""


# --- fingerprints --------------------------------------------------------------------------


_FINGERPRINT_BITS: Final = 53
"""Fingerprints are below ``2**53``: exact as JSON numbers in JavaScript too."""


def fingerprint(name: str, arguments: JsonValue, content: str) -> int:
    """A stable 53-bit fingerprint of one call: tool name, arguments and raw result.

    The first 53 bits (big endian, unsigned) of SHA-256 over the three parts, each UTF-8 encoded
    and prefixed with its 8-byte length so no two different calls share an input. Arguments are
    :func:`~agent_plugin.tools.canonical_json` text, so key order does not matter; NaN and
    Infinity (which Python's JSON decoder accepts from a provider) are written as ``NaN`` and
    ``Infinity`` instead of failing. The value is the same in every process and on every machine.
    """
    digest = hashlib.sha256()
    for part in (name, canonical_json(arguments, allow_nan=True), content):
        data = part.encode("utf-8", errors="surrogatepass")
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return int.from_bytes(digest.digest()[:8], "big") >> (64 - _FINGERPRINT_BITS)


def warning_note(name: str, repeats: int) -> str:
    """The note appended to a tool result when :class:`Warn` is returned (starts with a newline)."""
    return (
        f"\n[harness] You called {name} {repeats} times with identical arguments and got an "
        "identical result each time. Calling it again will not tell you anything new: change "
        "your approach, or answer with what you have."
    )


# --- guard and tracker ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoopGuard:
    """Thresholds of the loop guard: warn at ``warn_after`` repeats, stop at ``stop_after``.

    Repeats are counted within the last ``window`` executed calls of the run, so an enabled
    guard needs ``1 <= warn_after <= stop_after <= window``. ``window=0`` turns the guard off
    (see :meth:`disabled`); the thresholds are then ignored.
    """

    warn_after: int = 3
    stop_after: int = 5
    window: int = 30

    def __post_init__(self) -> None:
        if self.window < 0:
            raise AgentError.config(f"loop guard window must be >= 0, not {self.window}")
        if self.enabled and not 1 <= self.warn_after <= self.stop_after <= self.window:
            raise AgentError.config(
                "loop guard needs 1 <= warn_after <= stop_after <= window, got "
                f"warn_after={self.warn_after}, stop_after={self.stop_after}, "
                f"window={self.window}"
            )

    @classmethod
    def disabled(cls) -> LoopGuard:
        """A guard that never fires and records nothing (``window=0``)."""
        return cls(window=0)

    @property
    def enabled(self) -> bool:
        """Whether the guard records anything at all."""
        return self.window > 0

    def tracker(self, recent: Iterable[int] = ()) -> LoopTracker:
        """A tracker for one run, seeded with fingerprints saved in ``RunState.recent_calls``.

        Only the last ``window`` of ``recent`` are kept.
        """
        return LoopTracker(self, recent)


class LoopTracker:
    """Counts fingerprints of one run's executed calls within the guard's window.

    :meth:`record` is O(1): a bounded deque holds the window and a counter stays in step with it.
    """

    __slots__ = ("_counts", "_guard", "_window")

    def __init__(self, guard: LoopGuard, recent: Iterable[int] = ()) -> None:
        self._guard = guard
        self._window: deque[int] = deque(recent, maxlen=guard.window)  # the last `window` only
        self._counts: Counter[int] = Counter(self._window)

    @property
    def guard(self) -> LoopGuard:
        """The thresholds this tracker applies."""
        return self._guard

    @property
    def recent(self) -> list[int]:
        """The fingerprints in the window, oldest first (save as ``RunState.recent_calls``)."""
        return list(self._window)

    def __len__(self) -> int:
        return len(self._window)

    def record(self, name: str, arguments: JsonValue, content: str) -> Verdict:
        """Record one executed call; ``content`` is the raw result, before any warning note."""
        if not self._guard.enabled:
            return OK
        repeats = self._push(fingerprint(name, arguments, content))
        if repeats >= self._guard.stop_after:
            return Stop(repeats)
        if repeats >= self._guard.warn_after:
            return Warn(repeats)
        return OK

    def _push(self, fp: int) -> int:
        """Add a fingerprint, evicting the oldest when full; return its count in the window."""
        window = self._window
        if len(window) == window.maxlen:
            oldest = window.popleft()
            left = self._counts[oldest] - 1
            if left:
                self._counts[oldest] = left
            else:
                del self._counts[oldest]
        window.append(fp)
        self._counts[fp] += 1
        return self._counts[fp]

    def __repr__(self) -> str:
        return f"LoopTracker(guard={self._guard!r}, size={len(self._window)})"
