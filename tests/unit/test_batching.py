"""ThreadGroupCommit: batches committed back to back on a store's own thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence

import pytest

from onceonly._exceptions import StoreUnavailable
from onceonly.batching import ThreadGroupCommit


class FakeStoreThread:
    """One worker thread, like the SQLite store's; records every batch."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.batches: list[list[int]] = []
        self.threads: set[str] = set()
        self.fail_on = fail_on
        self.unreachable = False
        self.gate = threading.Event()
        self.gate.set()

    def apply(self, items: Sequence[int]) -> list[int]:
        self.gate.wait(5)
        self.threads.add(threading.current_thread().name)
        self.batches.append(list(items))
        if self.fail_on is not None and self.fail_on in items:
            raise ValueError("the transaction failed")
        return [i * 10 for i in items]

    async def schedule(self, fn: Callable[[], None]) -> None:
        if self.unreachable:
            raise StoreUnavailable("database is locked")
        await asyncio.to_thread(fn)


async def test_concurrent_callers_share_batches_and_get_their_own_answer() -> None:
    store = FakeStoreThread()
    store.gate.clear()  # hold the first batch so that the others pile up
    commits = ThreadGroupCommit(store.apply, store.schedule)
    first = asyncio.create_task(commits.submit(0))
    await asyncio.sleep(0.05)
    rest = [asyncio.create_task(commits.submit(i)) for i in range(1, 50)]
    await asyncio.sleep(0.05)
    store.gate.set()
    assert await asyncio.gather(first, *rest) == [i * 10 for i in range(50)]
    assert store.batches[0] == [0]
    assert store.batches[1] == list(range(1, 50))  # taken by the thread in one go
    assert (commits.batches, commits.items) == (2, 50)
    assert all(name != threading.current_thread().name for name in store.threads)


async def test_a_failed_transaction_fails_only_its_own_callers() -> None:
    store = FakeStoreThread(fail_on=3)
    commits = ThreadGroupCommit(store.apply, store.schedule, max_batch=5)
    results = await asyncio.gather(*(commits.submit(i) for i in range(10)), return_exceptions=True)
    failed = {i for i, r in enumerate(results) if isinstance(r, ValueError)}
    batch = next(b for b in store.batches if 3 in b)
    assert failed == set(batch)
    assert all(results[i] == i * 10 for i in range(10) if i not in failed)


async def test_an_unreachable_store_fails_the_callers_and_recovers() -> None:
    store = FakeStoreThread()
    store.unreachable = True
    commits = ThreadGroupCommit(store.apply, store.schedule)
    with pytest.raises(StoreUnavailable):
        await commits.submit(1)
    store.unreachable = False
    assert await commits.submit(2) == 20  # a later caller starts a new turn


async def test_the_thread_gives_its_turn_back_and_is_handed_another() -> None:
    store = FakeStoreThread()
    turns = 0

    async def schedule(fn: Callable[[], None]) -> None:
        nonlocal turns
        turns += 1
        await store.schedule(fn)

    commits = ThreadGroupCommit(store.apply, schedule, max_batch=1, max_seconds=0.0)
    assert await asyncio.gather(*(commits.submit(i) for i in range(5))) == [
        0, 10, 20, 30, 40
    ]  # fmt: skip
    assert turns >= 2  # every item was still taken, over several turns


def test_callers_on_several_event_loops_get_their_own_answers() -> None:
    """A batch can mix callers of several event loops: each loop is handed its
    own callers with their own results, in order (one loop: the batch as is)."""
    from onceonly.batching import _by_loop

    loops = [asyncio.new_event_loop(), asyncio.new_event_loop()]
    try:
        batch = [(i, loops[i % 2].create_future()) for i in range(5)]
        results = [i * 10 for i in range(5)]
        split = {loop: (mine, answers) for loop, mine, answers in _by_loop(batch, results)}
        assert [item for item, _ in split[loops[0]][0]] == [0, 2, 4]
        assert split[loops[0]][1] == [0, 20, 40]
        assert split[loops[1]][1] == [10, 30]
        failure = ValueError("the transaction failed")
        assert all(answers is failure for _, _, answers in _by_loop(batch, failure))
        ((loop, mine, answers),) = _by_loop(batch[:1], results[:1])
        assert (loop, mine, answers) == (loops[0], batch[:1], results[:1])
    finally:
        for loop in loops:
            loop.close()
