"""Recorded provider traffic in ``tests/fixtures/wire`` (its README names each source)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

WIRE_DIR = Path(__file__).resolve().parent / "fixtures" / "wire"


def fixture_names(provider: str | None = None) -> list[str]:
    """File names (without ``.json``) of every fixture, or of one provider's."""
    names = sorted(p.stem for p in WIRE_DIR.glob("*.json"))
    if provider is not None:
        names = [n for n in names if n.startswith(provider + "__")]
    return names


@cache
def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((WIRE_DIR / f"{name}.json").read_text())
    return data


def sse_body(fixture: dict[str, Any]) -> bytes:
    """The recorded streaming body, byte for byte where the source kept it."""
    response = fixture["response"]
    if "sse" in response:
        return "\n".join(response["sse"]).encode()
    # fixture-file streams kept only each event's data payload
    return "".join(f"data: {payload}\n\n" for payload in response["sse_data"]).encode()


def is_stream(fixture: dict[str, Any]) -> bool:
    return "sse" in fixture["response"] or "sse_data" in fixture["response"]
