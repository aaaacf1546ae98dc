"""Where the test suite finds Redis and PostgreSQL: one place, read from the environment.

``AGENT_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) and ``AGENT_TEST_POSTGRES_URL``
(default ``postgresql+asyncpg://postgres@127.0.0.1:5432/test``, trust auth). Tests that need a
Redis database of their own take one with :func:`redis_db`; the numbers below are reserved.
"""

from __future__ import annotations

import os
import random
from typing import Final

REDIS_URL: Final = os.environ.get("AGENT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL: Final = os.environ.get(
    "AGENT_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)

APP_QUEUE_DB: Final = 9
"""The database of the test of an app's own arq jobs beside the agent's."""
FUZZ_DB: Final = 13
"""The database the fuzz test empties before and after it runs."""
SHARED_DBS: Final = tuple(n for n in range(1, 16) if n not in (APP_QUEUE_DB, FUZZ_DB))
"""Databases a test may take at random (the heartbeat tests: arq names a fleet tick's job per
Redis database, not per queue)."""


def redis_db(number: int | None = None) -> str:
    """:data:`REDIS_URL` on database ``number`` (default: one of :data:`SHARED_DBS`)."""
    chosen = random.choice(SHARED_DBS) if number is None else number
    return f"{REDIS_URL.rsplit('/', 1)[0]}/{chosen}"
