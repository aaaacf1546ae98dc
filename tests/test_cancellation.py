"""until_cancelled: a token that fires cancels the awaited work in the calling task."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from agent_plugin.cancellation import CancelToken, RunCancelled, until_cancelled


async def test_without_a_token_the_awaitable_is_awaited_as_it_is() -> None:
    async def answer() -> int:
        return 42

    assert await until_cancelled(answer(), None) == 42


async def test_a_token_that_does_not_fire_changes_nothing() -> None:
    token = CancelToken()

    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert await until_cancelled(answer(), token) == 42
    assert token._watchers == []  # nothing left behind


async def test_a_token_that_fires_cancels_the_work_and_raises_run_cancelled() -> None:
    token = CancelToken()
    cleaned = asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            cleaned.set()

    asyncio.get_running_loop().call_later(0.01, token.cancel, "stop")
    with pytest.raises(RunCancelled):
        await until_cancelled(work(), token)
    assert cleaned.is_set()  # the work saw its cancellation before the caller went on
    current = asyncio.current_task()
    assert current is not None
    assert current.cancelling() == 0  # the caller's task is not left half-cancelled
    await asyncio.sleep(0)  # and it can go on awaiting


async def test_a_token_that_fired_before_never_starts_the_work() -> None:
    token = CancelToken()
    token.cancel()
    started = False

    async def work() -> None:
        nonlocal started
        started = True

    with pytest.raises(RunCancelled):
        await until_cancelled(work(), token)
    assert not started


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    token = CancelToken()
    entered = asyncio.Event()

    async def work() -> None:
        entered.set()
        await asyncio.sleep(10)

    task = asyncio.ensure_future(until_cancelled(work(), token))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert token._watchers == []


async def test_work_that_fails_while_it_is_cancelled_is_a_cancellation() -> None:
    token = CancelToken()

    async def work() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise ValueError("cleanup failed") from None

    asyncio.get_running_loop().call_later(0.01, token.cancel)
    with pytest.raises(RunCancelled):
        await until_cancelled(work(), token)


async def test_work_that_swallows_the_cancellation_keeps_its_result() -> None:
    token = CancelToken()

    async def work() -> str:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(10)
        return "finished anyway"

    asyncio.get_running_loop().call_later(0.01, token.cancel)
    assert await until_cancelled(work(), token) == "finished anyway"
    current = asyncio.current_task()
    assert current is not None
    assert current.cancelling() == 0


async def test_a_deadline_and_a_token_together_each_end_the_wait_as_their_own() -> None:
    token = CancelToken()
    with pytest.raises(TimeoutError):  # the deadline first
        async with asyncio.timeout(0.01):
            await until_cancelled(asyncio.sleep(10), token)
    asyncio.get_running_loop().call_later(0.01, token.cancel)
    with pytest.raises(RunCancelled):  # the token first, inside a longer deadline
        async with asyncio.timeout(5):
            await until_cancelled(asyncio.sleep(10), token)


async def test_one_token_watches_several_runs_at_once() -> None:
    token = CancelToken()
    results = await asyncio.gather(
        *(until_cancelled(asyncio.sleep(10), token) for _ in range(3)),
        _fire_soon(token),
        return_exceptions=True,
    )
    assert [type(r) for r in results[:3]] == [RunCancelled] * 3
    assert token._watchers == []


async def _fire_soon(token: CancelToken) -> None:
    await asyncio.sleep(0.01)
    token.cancel()
