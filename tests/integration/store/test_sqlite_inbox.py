"""The SQLite store's receive path: rows and quick commits on the event loop,
waits and slow commits on its thread (onceonly.store.sqlite._InboxWriter).

Whatever runs where, the loop must keep answering while another writer holds
the lock or the disk is slow, each event must be stored once, and a caller
that goes away must not leave a transaction open. A slow disk is made with
sqlite3's trace callback, which runs on the thread that runs the statement:
every COMMIT then takes `SLOW_COMMIT` seconds longer, wherever it runs.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from onceonly import NewEvent, create_store
from onceonly.store import sqlite as sqlite_module

SLOW_COMMIT = 0.05


def event(event_id: str, body: bytes = b"{}") -> NewEvent:
    return NewEvent("stripe", event_id, "charge.succeeded", body, {"stripe-signature": "t=1"})


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'inbox.db'}"


@pytest.fixture
def slow_disk(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every COMMIT of every onceonly connection waits SLOW_COMMIT first; the
    list gets the name of each thread that ran one."""
    threads: list[str] = []
    connect = sqlite_module.connect

    def slow_connect(path: str, busy_timeout_ms: int) -> sqlite3.Connection:
        conn = connect(path, busy_timeout_ms)

        def trace(statement: str) -> None:
            if statement == "COMMIT":
                threads.append(threading.current_thread().name)
                time.sleep(SLOW_COMMIT)

        conn.set_trace_callback(trace)
        return conn

    monkeypatch.setattr(sqlite_module, "connect", slow_connect)
    return threads


class LoopWatch:
    """How long the event loop went without running a 5 ms ticker."""

    def __init__(self) -> None:
        self.gaps: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.005)
            now = time.monotonic()
            self.gaps.append(now - last)
            last = now

    async def __aenter__(self) -> LoopWatch:
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    def stalls(self, over: float) -> int:
        return sum(1 for gap in self.gaps if gap > over)


def hold_write_lock(path: str, seconds: float) -> threading.Thread:
    """Another writer (as a worker would be): BEGIN IMMEDIATE for `seconds`."""
    taken = threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        taken.set()
        time.sleep(seconds)
        conn.execute("COMMIT")
        conn.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert taken.wait(5)
    return thread


def database(url: str) -> str:
    return url.removeprefix("sqlite:///")


async def test_an_insert_waits_for_another_writer_without_holding_up_the_loop(url: str) -> None:
    async with create_store(url) as store:
        await store.insert_events([event("evt_before")])
        holder = hold_write_lock(database(url), 0.4)
        async with LoopWatch() as watch:
            started = time.monotonic()
            (receipt,) = await store.insert_events([event("evt_during")])
            waited = time.monotonic() - started
        holder.join(5)
        assert not receipt.duplicate
        assert waited >= 0.3, "the insert went in while another writer held the lock"
        assert max(watch.gaps) < 0.1, f"the loop stalled for {max(watch.gaps):.3f} s"
        found = await store.find_event("stripe", "evt_during")
        assert found is not None


async def test_on_a_slow_disk_commits_leave_the_loop(url: str, slow_disk: list[str]) -> None:
    async with create_store(url) as store:
        async with LoopWatch() as watch:
            for n in range(8):
                await store.insert_events([event(f"evt_{n}")])
        # The first commit ran on the loop (nothing had said the disk was
        # slow); it took SLOW_COMMIT, and every later one ran on the thread.
        assert watch.stalls(over=SLOW_COMMIT * 0.8) <= 1, watch.gaps
        thread_commits = [name for name in slow_disk if name.startswith("onceonly-sqlite-commit")]
        assert len(thread_commits) >= 7, slow_disk
        assert len(await store.list_events(limit=20)) == 8


async def test_a_caller_that_goes_away_mid_commit_leaves_it_committed_and_the_lock_free(
    url: str, slow_disk: list[str]
) -> None:
    async with create_store(url) as store:
        await store.insert_events([event("evt_first")])  # measures the slow disk
        insert = asyncio.create_task(store.insert_events([event("evt_left")]))
        await asyncio.sleep(SLOW_COMMIT / 3)
        insert.cancel()
        with pytest.raises(asyncio.CancelledError):
            await insert
        # The next batch waits for the commit in progress, then goes in.
        (receipt,) = await store.insert_events([event("evt_next")])
        assert not receipt.duplicate
        # The abandoned commit landed (its sender will retry: a duplicate then).
        (again,) = await store.insert_events([event("evt_left")])
        assert again.duplicate
        # And no transaction was left open on the file.
        other = sqlite3.connect(database(url), isolation_level=None, timeout=0.2)
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
        other.close()


async def test_concurrent_inserts_beside_the_group_commit_store_each_event_once(
    url: str, slow_disk: list[str]
) -> None:
    async with create_store(url) as store:
        batches = [[event(f"evt_{(b * 3 + i) % 10}") for i in range(4)] for b in range(12)]
        results = await asyncio.gather(*(store.insert_events(b) for b in batches))
        rows = await store.list_events(limit=100)
        assert sorted(r.event_id for r in rows) == sorted(f"evt_{i}" for i in range(10))
        receipts = [r for batch in results for r in batch]
        assert sum(not r.duplicate for r in receipts) == 10
        # Every copy past the first is counted on its row.
        assert sum(r.duplicates for r in rows) == len(receipts) - 10


async def test_a_batch_of_big_bodies_is_stored_exactly(url: str) -> None:
    bodies = [bytes([n]) * (sqlite_module.INLINE_BYTES // 3) for n in range(5)]
    async with create_store(url) as store:
        async with LoopWatch():
            receipts = await store.insert_events(
                [event(f"evt_big_{n}", body) for n, body in enumerate(bodies)]
            )
        assert [r.duplicate for r in receipts] == [False] * 5
        for n, body in enumerate(bodies):
            found = await store.find_event("stripe", f"evt_big_{n}")
            assert found is not None
            assert found.body == body
