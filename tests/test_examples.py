"""The README's demo command works as documented."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_quickstart_example_runs_on_the_scripted_model() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "needs approval: send_message" in result.stdout
    assert "messages sent: ['to Kari: Bring an umbrella to Bergen.']" in result.stdout
