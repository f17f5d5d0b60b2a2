"""One timer keeps the limits of many tasks (the body deadline of every delivery)."""

from __future__ import annotations

import asyncio
import time

import pytest

from onceonly.deadlines import RESOLUTION, Deadlines


async def test_a_block_past_its_time_ends_with_timeout_error() -> None:
    deadlines = Deadlines()
    began = time.monotonic()
    with pytest.raises(TimeoutError), deadlines.limit(0.2):
        await asyncio.sleep(5)
    took = time.monotonic() - began
    assert 0.2 <= took < 0.2 + RESOLUTION + 0.2


async def test_a_block_in_time_is_left_alone_and_the_timer_stops() -> None:
    deadlines = Deadlines()
    with deadlines.limit(5):
        await asyncio.sleep(0.01)
    sweep = deadlines._sweep()
    assert sweep.due == {}
    await asyncio.sleep(RESOLUTION * 2)
    # Nothing left to watch: the loop is not woken for nothing.
    assert sweep.timer is None


async def test_many_tasks_each_get_their_own_limit() -> None:
    deadlines = Deadlines()

    async def wait(limit: float, work: float) -> str:
        try:
            with deadlines.limit(limit):
                await asyncio.sleep(work)
        except TimeoutError:
            return "timeout"
        return "done"

    results = await asyncio.gather(
        *(wait(0.3, 0.01) for _ in range(20)), *(wait(0.15, 2) for _ in range(20))
    )
    assert results == ["done"] * 20 + ["timeout"] * 20


async def test_a_cancellation_from_elsewhere_goes_through_as_cancellation() -> None:
    deadlines = Deadlines()

    async def held() -> None:
        with deadlines.limit(5):
            await asyncio.sleep(5)

    task = asyncio.create_task(held())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert deadlines._sweep().due == {}


async def test_a_cancellation_during_the_block_is_not_mistaken_for_its_timeout() -> None:
    # Both at once: the deadline passes and the task is cancelled from outside
    # before it runs again. The outside cancellation must win.
    deadlines = Deadlines()
    entered = asyncio.Event()

    async def held() -> None:
        with deadlines.limit(0.05):
            entered.set()
            await asyncio.sleep(5)

    task = asyncio.create_task(held())
    await entered.wait()
    sweep = deadlines._sweep()
    sweep.due[task] = 0.0  # due now
    sweep.run()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_each_event_loop_keeps_its_own_limits() -> None:
    deadlines = Deadlines()

    async def one() -> str:
        try:
            with deadlines.limit(0.1):
                await asyncio.sleep(2)
        except TimeoutError:
            return "timeout"
        return "done"

    # One Deadlines object across loops run one after the other, as a
    # receiver is when an application restarts its loop (and in tests).
    assert asyncio.run(one()) == "timeout"
    assert asyncio.run(one()) == "timeout"


async def test_outside_a_task_it_says_so() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    failures: list[BaseException] = []

    def plain_callback() -> None:
        try:
            with deadlines.limit(1):
                pass
        except RuntimeError as exc:
            failures.append(exc)

    loop.call_soon(plain_callback)
    await asyncio.sleep(0.01)
    assert len(failures) == 1
    assert "task" in str(failures[0])
