"""Fixtures every test module may use: the services (from :mod:`tests.services`) and a
background-run environment served by one worker process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.jobs_app import JobsEnv, jobs_env, worker_serving
from tests.services import POSTGRES_URL, REDIS_URL


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The Redis the suite uses (``AGENT_TEST_REDIS_URL``)."""
    return REDIS_URL


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The PostgreSQL database the suite uses (``AGENT_TEST_POSTGRES_URL``)."""
    return POSTGRES_URL


@pytest.fixture(scope="module")
def served_env(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[JobsEnv]:
    """The module's own database, queue, key prefix and log, and one worker process serving
    them; the worker stops and the environment's Redis keys go when the module is done."""
    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    with worker_serving(jobs_env(tmp_path_factory.mktemp(name))) as environment:
        yield environment
