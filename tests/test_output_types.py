"""A type checker infers a run's output from ``output_type``: ``tests/typecheck/typed_results.py``
passes ``mypy --strict`` (its ``assert_type`` lines are the claims), and a wrong claim fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ROOT / "tests" / "typecheck" / "typed_results.py"

pytestmark = pytest.mark.timeout(300)


def mypy(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", *map(str, paths)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_output_type_is_inferred_through_the_generics(tmp_path: Path) -> None:
    result = mypy(CHECKED)
    assert result.returncode == 0, result.stdout + result.stderr

    wrong = tmp_path / "wrong_claim.py"
    wrong.write_text(
        "from typing import assert_type\n"
        "from pydantic import BaseModel\n"
        "from agent_plugin import Agent, Completed\n"
        "from agent_plugin.testing import ScriptedModel\n\n"
        "class Ticket(BaseModel):\n"
        "    title: str\n\n"
        "async def main() -> None:\n"
        "    turn = await Agent(ScriptedModel(), output_type=Ticket).run('go')\n"
        "    if isinstance(turn.outcome, Completed):\n"
        "        assert_type(turn.outcome.output, str)\n",
        encoding="utf-8",
    )
    failed = mypy(wrong)
    assert failed.returncode == 1
    assert 'Expression is of type "Ticket", not "str"' in failed.stdout
