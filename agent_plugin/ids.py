"""Run and session ids: plain strings on the wire."""

from __future__ import annotations

import secrets
from typing import NewType

__all__ = ["RunId", "SessionId", "new_run_id"]

RunId = NewType("RunId", str)
SessionId = NewType("SessionId", str)


def new_run_id() -> RunId:
    """A fresh ``run_…`` id with 128 random bits, safe to use as a public handle."""
    return RunId(f"run_{secrets.token_hex(16)}")
