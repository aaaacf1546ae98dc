"""The run a log record belongs to: set while a run goes on, put on records by a filter, and
on every record the library writes during a run, in a route or in a worker."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from agent_plugin import Agent, RunOptions, logs
from agent_plugin.ids import new_run_id
from agent_plugin.jobs import RunArgs, agent_run
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.tools import tool
from tests.jobs_app import LOG_ENV, WorkerProcess, clean_redis, in_process, jobs_env, make_plugin


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.addFilter(logs.RunContextFilter())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_record_carries_the_run_it_was_written_in() -> None:
    capture = Capture()
    logger = logging.getLogger("tests.logs.direct")
    logger.addHandler(capture)
    logger.setLevel(logging.INFO)
    try:
        logger.info("outside")
        with logs.run_context("run_1", "s1"):
            logger.info("inside")
            logger.info("tagged", extra={"run_id": "run_other"})  # extra= wins
        logger.info("after")
    finally:
        logger.removeHandler(capture)
    runs = [(r.getMessage(), r.run_id, r.session_id) for r in capture.records]  # type: ignore[attr-defined]
    assert runs == [
        ("outside", None, None),
        ("inside", "run_1", "s1"),
        ("tagged", "run_other", "s1"),
        ("after", None, None),
    ]


async def test_a_tools_records_carry_its_run() -> None:
    capture = Capture()
    logger = logging.getLogger("tests.logs.tool")
    logger.addHandler(capture)
    logger.setLevel(logging.INFO)

    @tool
    def lookup() -> str:
        """Looks something up."""
        logger.info("looking")
        return "found"

    try:
        agent = Agent(ScriptedModel([tool_call("lookup", {}), "done"]), tools=[lookup])
        turn = await agent.run("go", options=RunOptions(run_id="run_logged"))
    finally:
        logger.removeHandler(capture)
    assert turn.outcome.status == "completed"
    [record] = capture.records
    assert record.run_id == "run_logged"  # type: ignore[attr-defined]  # sync tools run in a thread


async def test_the_workers_records_of_a_run_name_it_and_its_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    env = jobs_env(tmp_path)
    monkeypatch.setenv(LOG_ENV, str(env.log))
    try:
        async with in_process(make_plugin(env.environ)) as here:
            run_id = new_run_id()
            args = RunArgs.checked('{"tag": "logged"}', overrides={"session": "s-logs"})
            await here.jobs.enqueue(run_id, args)
            with caplog.at_level(logging.INFO, logger="agent_plugin.jobs"):
                result: dict[str, Any] = await agent_run(here.job_ctx(run_id), run_id)
    finally:
        clean_redis(env)
    assert result["status"] == "complete"
    [done] = [r for r in caplog.records if r.getMessage() == f"run {run_id} complete"]
    assert (done.run_id, done.session_id) == (run_id, "s-logs")  # type: ignore[attr-defined]


def test_a_worker_says_at_start_up_where_everything_is(tmp_path: Path) -> None:
    env = jobs_env(tmp_path)
    worker = WorkerProcess(env, extra={"JOBS_TEST_DEBUG_LOGS": "1"})
    worker.start()
    try:
        output = worker.output(whole=True)
    finally:
        worker.stop()
        clean_redis(env)
    [line] = [x for x in output.splitlines() if "agent worker started:" in x]
    assert "provider=scripted" in line
    assert f"queue={env.queue}" in line
    assert "upkeep=on" in line
    assert "settings=" in line
    assert "AGENT_DATABASE_URL" in line


def test_every_logger_the_library_writes_to_is_redacted() -> None:
    """``logs.install`` redacts the loggers of :data:`logs.LOGGERS` only (a logger's filters
    do not see its children's records): a module logging on a name not listed, as
    ``agent_plugin.pricing`` did, writes secrets as they are."""
    import re

    import agent_plugin

    root = Path(agent_plugin.__file__).parent
    pattern = re.compile(r"""logging\.getLogger\(\s*["']([^"']+)["']""")
    names = {
        name for path in root.rglob("*.py") for name in pattern.findall(path.read_text("utf-8"))
    }
    assert "agent_plugin.jobs" in names  # the search finds them
    assert names <= set(logs.LOGGERS), names - set(logs.LOGGERS)
    logs.install()
    capture = Capture()
    logger = logging.getLogger("agent_plugin.pricing")
    logger.addHandler(capture)
    try:
        logger.warning("no price: password: %s", "Hunter2-Log-6c1d")
    finally:
        logger.removeHandler(capture)
    [record] = capture.records
    assert "Hunter2-Log-6c1d" not in record.getMessage()
