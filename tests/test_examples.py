"""The README's demo command works as documented."""

from __future__ import annotations

import os
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


def readme_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


def test_the_readme_app_snippet_serves_an_answer(tmp_path: Path) -> None:
    """The "Add an agent to your app" example runs as written (on the scripted provider)."""
    app_code = next(b for b in readme_blocks() if "plugin.install(app)" in b)
    (tmp_path / "readme_app.py").write_text(app_code)
    script = """
import asyncio, httpx, readme_app

async def main():
    app = readme_app.app
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            answer = await client.post("/ask", json={"prompt": "hello"})
            health = await client.get("/health")
    print(answer.status_code, answer.json()["status"], health.json()["status"])

asyncio.run(main())
"""
    env = {
        **os.environ,
        "AGENT_PROVIDER": "scripted",
        "AGENT_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'agent.db'}",
        "AGENT_CONFIG_FILE": "",
        "PYTHONPATH": str(tmp_path),
    }
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["200", "completed", "UP"]
