"""The run console in a real browser (issue 8).

Headless Chromium (Debian's ``chromium``, driven by Playwright with ``executable_path``) opens
the console of a paused background run: the app is served by a real uvicorn on 127.0.0.1 and
the run by a real arq worker. The page shows the call waiting for approval; a click on Approve
posts the decision, the worker resumes the run, and the page shows it complete. The browser
enforces the page's Content Security Policy, so the test also proves that the script and style
hashes in the headers match what the page holds.

``.ci/run`` installs Chromium and sets ``AGENT_TEST_REQUIRE_BROWSER=1``, so there the test runs;
elsewhere it is skipped when Chromium or Playwright is missing. ``AGENT_TEST_CHROMIUM`` names
another browser binary.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.jobs_app import JobsEnv, jobs_env, make_app, make_plugin, worker_serving
from tests.test_live import serve
from tests.test_live_routes import wait_for

pytestmark = pytest.mark.timeout(120)

_REQUIRED = os.environ.get("AGENT_TEST_REQUIRE_BROWSER") == "1"


def chromium() -> str:
    """The browser binary, or a skip (a failure where the browser is required)."""
    path = os.environ.get("AGENT_TEST_CHROMIUM") or shutil.which("chromium")
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        path = None
    if path is None:
        message = (
            "Chromium and Playwright are needed (apt-get install chromium; pip install playwright)"
        )
        if _REQUIRED:
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobsEnv]:
    chromium()  # skip before a worker starts for nothing
    with worker_serving(jobs_env(tmp_path_factory.mktemp("console"))) as environment:
        yield environment


async def test_the_console_shows_a_paused_run_and_approving_completes_it(env: JobsEnv) -> None:
    from playwright.async_api import async_playwright, expect

    app = make_app(make_plugin(env.environ), runs_route=True, console=True)
    prompt = json.dumps({"tag": "console", "rounds": [[["send", "k1"]]], "answer": "all sent"})
    problems: list[str] = []
    async with serve(app, lifespan="on") as base, httpx.AsyncClient(base_url=base) as client:
        response = await client.post("/agent/runs", json={"prompt": prompt})
        assert response.status_code == 202, response.text
        run_id = str(response.json()["run_id"])
        await wait_for(client, run_id, {"awaiting_approval"}, within=30)

        async with async_playwright() as driver:
            browser = await driver.chromium.launch(executable_path=chromium(), headless=True)
            try:
                page = await browser.new_page()
                page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
                page.on("console", lambda message: _console(message, problems))
                await page.goto(f"{base}/agent/console/{run_id}")

                call = page.locator("#approvals .call")
                await expect(call.locator(".name")).to_have_text("send")
                await expect(call.locator(".args")).to_contain_text('"key": "k1"')
                await expect(page.locator("#status")).to_have_text("awaiting approval")
                await call.get_by_role("button", name="Approve").click()

                await expect(page.locator("#status")).to_have_text("completed", timeout=30_000)
                await expect(page.locator("#outcome")).to_have_text("all sent after 1 rounds")
                await expect(page.locator("#approvals")).to_be_hidden()
                await expect(page.locator("#log")).to_contain_text("\u2190 send")
            finally:
                await browser.close()

        record: dict[str, Any] = (await client.get(f"/agent/runs/{run_id}")).json()
    assert record["status"] == "complete"
    assert record["outcome"]["text"] == "all sent after 1 rounds"
    tool_runs = [line for line in env.lines("tool_start") if line.args[0] == run_id]
    assert [line.args[2] for line in tool_runs] == ["send"]  # approved once, ran once
    assert problems == []  # no script error, no CSP violation


def _console(message: Any, problems: list[str]) -> None:
    if message.type == "error":
        problems.append(f"console: {message.text}")
