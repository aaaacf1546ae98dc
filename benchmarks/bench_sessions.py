"""Cost of a session turn at 10 and at 10,000 messages, on SQLite and PostgreSQL.

Appending a turn (four messages: the user's, a tool call, its result, the answer) to a session
of 10 messages and to one of 10,000, interleaved round by round so machine noise hits both alike;
the median of each and their ratio (target: at most 1.5×). Also the statements sent to load the
10,000-message session, to load a branch of it, to load it after a compaction, to page its
history 1,000 entries at a time, and to append one turn, counted with a SQLAlchemy event
listener.

    python benchmarks/bench_sessions.py   # prints markdown tables, writes results/sessions.json

PostgreSQL: ``AGENT_BENCH_POSTGRES_URL`` (default ``postgresql+asyncpg://postgres@127.0.0.1:5432/
test``); the benchmark works in a schema of its own and drops it afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from agent_plugin.compaction import CompactionReport
from agent_plugin.errors import AgentError
from agent_plugin.messages import ChatMessage, Role, TextPart, ToolCall, ToolCallPart, ToolResult
from agent_plugin.storage import Database, SqlSessionStore

LONG = 10_000
SHORT = 10
ROUNDS = 40
SETUP_BATCH = 1_000
PAGE = 1_000
POSTGRES_URL = os.environ.get(
    "AGENT_BENCH_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)


def turn(i: int) -> list[ChatMessage]:
    """One realistic turn: a question, a tool call, its result and the answer."""
    return [
        ChatMessage.user(f"Question {i}: what is the status of order {1000 + i}? " * 3),
        ChatMessage(
            role=Role.ASSISTANT,
            content=[
                TextPart(text="Let me look that up."),
                ToolCallPart(
                    tool_call=ToolCall(
                        id=f"call_{i}", name="order_status", arguments={"order_id": 1000 + i}
                    )
                ),
            ],
        ),
        ChatMessage.tool_results(
            [ToolResult(tool_call_id=f"call_{i}", content=json.dumps({"status": "shipped"}))]
        ),
        ChatMessage.assistant(f"Order {1000 + i} has shipped and should arrive this week. " * 2),
    ]


def history(count: int) -> list[ChatMessage]:
    messages: list[ChatMessage] = []
    i = 0
    while len(messages) < count:
        messages.extend(turn(i))
        i += 1
    return messages[:count]


class Counter:
    """Counts the statements an engine sends (transaction control excluded)."""

    def __init__(self, database: Database) -> None:
        self.count = 0
        event.listen(database.engine.sync_engine, "before_cursor_execute", self._seen)

    def _seen(self, *args: Any) -> None:
        if str(args[2]).split(None, 1)[0].upper() not in ("BEGIN", "COMMIT", "ROLLBACK"):
            self.count += 1

    async def measure(self, action: Callable[[], Any]) -> int:
        self.count = 0
        await action()
        return self.count


async def fill(store: SqlSessionStore, session: str, count: int) -> int:
    messages = history(count)
    version = 0
    for start in range(0, count, SETUP_BATCH):
        batch = messages[start : start + SETUP_BATCH]
        version = await store.append(session, batch, expected_version=version)
    return version


async def timed(action: Callable[[], Any]) -> float:
    start = time.perf_counter()
    await action()
    return time.perf_counter() - start


async def bench(database: Database) -> dict[str, Any]:
    await database.migrate()
    store = SqlSessionStore(database)
    counter = Counter(database)
    long_session = f"bench-long-{uuid.uuid4().hex}"
    long_version = await fill(store, long_session, LONG)

    short_times: list[float] = []
    long_times: list[float] = []
    for i in range(ROUNDS):
        short_session = f"bench-short-{uuid.uuid4().hex}"
        short_version = await fill(store, short_session, SHORT)
        messages = turn(LONG + i)
        start = time.perf_counter()
        await store.append(short_session, messages, expected_version=short_version)
        short_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        await store.append(long_session, messages, expected_version=long_version)
        long_times.append(time.perf_counter() - start)
        long_version += len(messages)
        await store.delete(short_session)

    load_queries = await counter.measure(lambda: store.load(long_session))
    load_seconds = await timed(lambda: store.load(long_session))
    append_queries = await counter.measure(
        lambda: store.append(long_session, turn(0), expected_version=long_version)
    )
    long_version += 4

    async def page_all() -> None:
        after = 0
        while page := await store.entries(long_session, after=after, limit=PAGE):
            after = page[-1].seq

    page_queries = await counter.measure(page_all)
    # a branch: the last turn replaced by another, so the head's path skips it
    await store.fork(long_session, long_version - 4)
    long_version = await store.append(long_session, turn(1), expected_version=long_version)
    branch_queries = await counter.measure(lambda: store.load(long_session))
    branch_seconds = await timed(lambda: store.load(long_session))
    report = CompactionReport(summarized_messages=LONG, tokens_before=1, tokens_after=1)
    kept = long_version - 11  # the branch's last two turns stay, starting on a user message
    await store.append_compaction(
        long_session, "summary", kept, report, expected_version=long_version
    )
    compacted_queries = await counter.measure(lambda: store.load(long_session))
    compacted_seconds = await timed(lambda: store.load(long_session))
    await store.delete(long_session)

    short_ms = statistics.median(short_times) * 1000
    long_ms = statistics.median(long_times) * 1000
    return {
        "append_turn_ms_at_10": short_ms,
        "append_turn_ms_at_10000": long_ms,
        "ratio": long_ms / short_ms,
        "append_queries": append_queries,
        "load_queries_10000": load_queries,
        "load_ms_10000": load_seconds * 1000,
        "load_queries_after_compaction": compacted_queries,
        "load_ms_after_compaction": compacted_seconds * 1000,
        "load_queries_branch": branch_queries,
        "load_ms_branch": branch_seconds * 1000,
        "history_page_size": PAGE,
        "history_queries_10000": page_queries,
        "rounds": ROUNDS,
    }


async def run_sqlite() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        database = Database(f"sqlite+aiosqlite:///{Path(folder) / 'bench.db'}")
        try:
            return await bench(database)
        finally:
            await database.dispose()


async def run_postgres() -> dict[str, Any]:
    schema = f"agent_bench_{uuid.uuid4().hex[:12]}"
    admin = Database(POSTGRES_URL)
    try:
        async with admin.write() as conn:
            await conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        database = Database(POSTGRES_URL, connect_args={"server_settings": {"search_path": schema}})
        try:
            return await bench(database)
        finally:
            await database.dispose()
    finally:
        try:
            async with admin.write() as conn:
                await conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        finally:
            await admin.dispose()


async def run() -> dict[str, Any]:
    results: dict[str, Any] = {"sqlite": await run_sqlite()}
    try:
        results["postgresql"] = await run_postgres()
    except AgentError as error:
        results["postgresql"] = {"error": str(error)}
    return results


def main() -> None:
    results = asyncio.run(run())
    print(f"Appending a turn (4 messages), median of {ROUNDS} interleaved rounds\n")
    print("| backend | at 10 msgs (ms) | at 10,000 msgs (ms) | ratio | statements per append |")
    print("|---|---:|---:|---:|---:|")
    for backend, row in results.items():
        if "error" in row:
            print(f"| {backend} | unavailable: {row['error']} | | | |")
            continue
        print(
            f"| {backend} | {row['append_turn_ms_at_10']:.2f} | "
            f"{row['append_turn_ms_at_10000']:.2f} | {row['ratio']:.2f}× | "
            f"{row['append_queries']} |"
        )
    print("\nLoading the 10,000-message session\n")
    print(
        "| backend | load: statements | load (ms) | a branch: statements | (ms) "
        "| after compaction: statements | (ms) "
        f"| history in pages of {PAGE}: statements |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for backend, row in results.items():
        if "error" in row:
            continue
        print(
            f"| {backend} | {row['load_queries_10000']} | {row['load_ms_10000']:.0f} | "
            f"{row['load_queries_branch']} | {row['load_ms_branch']:.0f} | "
            f"{row['load_queries_after_compaction']} | {row['load_ms_after_compaction']:.1f} | "
            f"{row['history_queries_10000']} |"
        )
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "sessions.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
