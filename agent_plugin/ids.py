"""Run and session ids, and the default memory scope: plain strings on the wire."""

from __future__ import annotations

import secrets
from typing import Final, NewType

__all__ = ["DEFAULT_SCOPE", "RunId", "SessionId", "new_run_id"]

RunId = NewType("RunId", str)
SessionId = NewType("SessionId", str)

DEFAULT_SCOPE: Final = "agent"
"""The memory scope of an agent-wide memory (see :mod:`agent_plugin.memory`)."""


def new_run_id() -> RunId:
    """A fresh ``run_…`` id with 128 random bits, safe to use as a public handle."""
    return RunId(f"run_{secrets.token_hex(16)}")
