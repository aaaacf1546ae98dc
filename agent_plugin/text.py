"""Text every store accepts: no NUL characters and no lone surrogates.

PostgreSQL refuses both (``\\u0000`` in ``text`` and ``jsonb``; a lone surrogate is not UTF-8),
and SQLite's driver cannot encode a lone surrogate. :func:`unstorable` says what is wrong with a
text a caller gave (an id, a prompt: refuse it, naming the field); :func:`storable` and
:func:`storable_json` make what a model or a tool produced storable, each bad character
becoming U+FFFD, so a fetched page with a NUL in it never fails a run.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

__all__ = ["REPLACEMENT", "storable", "storable_json", "unstorable"]

REPLACEMENT: Final = "\ufffd"
"""What a NUL or a lone surrogate becomes: the Unicode replacement character."""

_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_UNSTORABLE: Final = re.compile("[\x00\ud800-\udfff]")
_ESCAPED_NUL: Final = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")
"""``\\u0000`` in JSON text, not preceded by an escaped backslash."""


def unstorable(text: str) -> str | None:
    """What makes ``text`` unstorable (``"a NUL character"``, ``"a lone surrogate"``), or
    ``None`` when it is fine."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    return "a NUL character" if found.group() == "\x00" else "a lone surrogate"


def storable(text: str) -> str:
    """``text`` with every NUL and lone surrogate replaced by U+FFFD (unchanged when none)."""
    return _UNSTORABLE.sub(REPLACEMENT, text) if _UNSTORABLE.search(text) else text


def storable_json(value: Any) -> str:
    """``json.dumps(value)`` (UTF-8 kept, no spaces wasted) with every NUL and lone surrogate
    of its strings, keys included, replaced by U+FFFD: the JSON serializer of the plugin's
    database engine."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if "\\u0000" in text:
        text = _ESCAPED_NUL.sub(r"\1\\ufffd", text)
    if _SURROGATE.search(text):  # with ensure_ascii=False only a lone one can be here
        text = _SURROGATE.sub(REPLACEMENT, text)
    return text
