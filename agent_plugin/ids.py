"""Run and session ids, and the default memory scope: plain strings on the wire."""

from __future__ import annotations

import secrets
from typing import Final, NewType

__all__ = ["DEFAULT_SCOPE", "RUN_ID_PATTERN", "RunId", "SessionId", "new_run_id"]

RunId = NewType("RunId", str)
SessionId = NewType("SessionId", str)

RUN_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
"""A run id: a letter or digit, then up to 63 letters, digits, ``_``, ``.`` or ``-``."""

DEFAULT_SCOPE: Final = "agent"
"""The memory scope of an agent-wide memory (see :mod:`agent_plugin.memory`)."""


def new_run_id() -> RunId:
    """A fresh ``run_…`` id with 128 random bits, safe to use as a public handle."""
    return RunId(f"run_{secrets.token_hex(16)}")
