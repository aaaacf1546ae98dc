"""The README and the guide are true: every name their Python blocks import from the package
is there, and the README's first example runs as written."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import httpx
import pytest

from tests.jobs_app import ROOT

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text(encoding="utf-8"))


def package_imports(source: str) -> list[tuple[str, str | None]]:
    """``(module, name)`` for every import of the package in ``source`` (``name`` ``None`` for
    ``import module``); every block must be a whole program."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agent_plugin"):
            found.extend((node.module or "", alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend(
                (alias.name, None) for alias in node.names if alias.name.startswith("agent_plugin")
            )
    return found


def test_the_documents_have_python_blocks_to_check() -> None:
    assert len(python_blocks(ROOT / "README.md")) >= 8
    assert sum(len(package_imports(b)) for p in DOCUMENTS for b in python_blocks(p)) >= 60


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_a_document_imports_from_the_package_is_there(path: Path) -> None:
    missing = []
    for block in python_blocks(path):
        for module_name, name in package_imports(block):
            try:
                module = importlib.import_module(module_name)
            except ImportError as error:
                missing.append(f"{module_name}: {error}")
                continue
            if name is not None and name != "*" and not hasattr(module, name):
                try:
                    importlib.import_module(f"{module_name}.{name}")
                except ImportError:
                    missing.append(f"from {module_name} import {name}")
    assert missing == []


def readme_block(heading: str) -> str:
    """The first Python block after ``heading`` in the README."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    after = text[text.index(heading) :]
    found = BLOCK.search(after)
    assert found is not None
    return found.group(1)


async def test_the_first_example_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AGENT_MODEL_CLIENT", "tests.weather_models:weather")
    monkeypatch.setenv("AGENT_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path / 'readme.db'}")
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(readme_block("## Add an agent to your app"), "README.md", "exec"), namespace)
    app = namespace["app"]
    async with (
        app.router.lifespan_context(app),  # type: ignore[attr-defined]
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as client,  # type: ignore[arg-type]
    ):
        answered = await client.post("/ask", json={"prompt": "Weather in Oslo?"})
        tools = await client.get("/agent/tools")
    assert answered.status_code == 200, answered.text
    summary = answered.json()
    assert summary["text"] == "Oslo: 21 °C"
    assert "state" not in summary  # the summary never carries a paused run's state
    assert [t["name"] for t in tools.json()] == ["get_weather"]
