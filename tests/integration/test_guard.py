"""The job guard: memory, not a lock, on both engines."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

from onceonly import Onceonly
from onceonly.guard import Guard, JobConflict, JobInProgress
from onceonly.retention import purge


@pytest.fixture
def guard(database_url: str) -> Guard:
    # No set-up: the guard creates its tables on first use.
    return Onceonly(database_url=database_url, environ={}).guard()


def test_a_completed_key_is_remembered_after_the_job_ends(guard: Guard, database_url: str) -> None:
    ran: list[str] = []
    with guard.once("report:2026-12-01") as run:
        assert run
        ran.append("first")
        run.result = {"rows": 12}
    # "Five minutes later", from another process: a fresh guard on the same database.
    later = Onceonly(database_url=database_url, environ={}).guard()
    with later.once("report:2026-12-01") as run:
        assert not run
        assert run.result == {"rows": 12}
        ran.append("second")
    assert ran == ["first", "second"]


def test_decorator_returns_the_recorded_result_on_repeats(guard: Guard) -> None:
    sent: list[int] = []

    @guard.job("receipt:{0}")
    def send_receipt(order_id: int) -> str:
        sent.append(order_id)
        return f"msg-{order_id}"

    assert send_receipt(7) == "msg-7"
    assert send_receipt(7) == "msg-7"
    assert send_receipt(8) == "msg-8"
    assert sent == [7, 8]


def test_an_exception_leaves_the_key_retryable_not_locked(guard: Guard) -> None:
    attempts = 0

    @guard.job(lambda name: f"import:{name}")
    def flaky(name: str) -> int:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise OSError("disk full")
        return attempts

    with pytest.raises(OSError, match="disk full"):
        flaky("customers.csv")
    assert flaky("customers.csv") == 2
    assert flaky("customers.csv") == 2
    assert attempts == 2


def test_a_running_key_is_refused_to_a_concurrent_caller(guard: Guard) -> None:
    inside = threading.Event()
    leave = threading.Event()

    def first() -> None:
        with guard.once("nightly") as run:
            assert run
            inside.set()
            leave.wait(5)

    thread = threading.Thread(target=first)
    thread.start()
    assert inside.wait(5)
    with pytest.raises(JobInProgress), guard.once("nightly"):
        pass
    leave.set()
    thread.join()
    with guard.once("nightly") as run:
        assert not run


def test_racing_callers_run_the_block_once(guard: Guard) -> None:
    runs = 0
    outcomes: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def call() -> None:
        nonlocal runs
        barrier.wait()
        try:
            with guard.once("race") as run:
                if run:
                    with lock:
                        runs += 1
                    time.sleep(0.2)
                outcomes.append("ran" if run else "skipped")
        except JobInProgress:
            outcomes.append("in-progress")

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert runs == 1
    assert outcomes.count("ran") == 1


def test_a_dead_runner_is_taken_over_after_its_lease(database_url: str, guard: Guard) -> None:
    short = Onceonly(database_url=database_url, environ={}).guard(lease_seconds=0.3)
    with short.once("warm-up"):
        pass
    # What a runner killed with SIGKILL leaves behind: running, lease soon over.
    short.records.claim(short.engine, "orphan", owner="dead-host:1", lease=short.lease)
    with pytest.raises(JobInProgress):
        short._acquire("orphan")
    time.sleep(0.4)
    with short.once("orphan") as run:
        assert run
    rows: Any = None
    with short.engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT status, runs FROM onceonly_jobs WHERE key = 'orphan'")
        ).all()
    assert [(r.status, r.runs) for r in rows] == [("done", 2)]


def test_a_runner_that_lost_its_lease_cannot_mark_done(database_url: str) -> None:
    short = Onceonly(database_url=database_url, environ={}).guard(lease_seconds=0.3)
    short._keep = lambda *args: None  # type: ignore[method-assign]  # a stalled runner

    def stalled_run() -> None:
        with short.once("stalled"):
            time.sleep(0.4)
            with short.once("stalled") as newcomer:  # takes over the expired lease
                assert newcomer

    with pytest.raises(JobInProgress, match="lease ran out"):
        stalled_run()
    with short.engine.connect() as conn:
        (row,) = conn.execute(sa.text("SELECT status, runs FROM onceonly_jobs")).all()
    assert (row.status, row.runs) == ("done", 2)


async def test_async_jobs_run_once_and_repeat_the_recorded_result(guard: Guard) -> None:
    sent: list[int] = []

    @guard.job("async-receipt:{0}")
    async def send_receipt(order_id: int) -> dict[str, int]:
        await asyncio.sleep(0)
        sent.append(order_id)
        return {"order": order_id}

    assert await send_receipt(7) == {"order": 7}
    assert await send_receipt(7) == {"order": 7}
    assert sent == [7]
    async with guard.aonce("async-block") as run:
        assert run
        run.result = "built"
    async with guard.aonce("async-block") as run:
        assert not run
        assert run.result == "built"

    async def failing() -> None:
        async with guard.aonce("async-fails") as run:
            assert run
            raise RuntimeError("the block failed")

    with pytest.raises(RuntimeError):
        await failing()
    async with guard.aonce("async-fails") as run:
        assert run  # a failure leaves the key retryable


def test_the_same_key_with_other_arguments_is_refused(guard: Guard) -> None:
    charged: list[tuple[str, int]] = []

    @guard.job(lambda customer, amount: f"charge:{customer}")  # a key that forgot the amount
    def charge(customer: str, amount: int) -> str:
        charged.append((customer, amount))
        return f"charged {amount}"

    assert charge("ana", 100) == "charged 100"
    assert charge("ana", 100) == "charged 100"  # a true repeat: the recorded result
    with pytest.raises(JobConflict, match="other arguments"):
        charge("ana", 250)
    assert charged == [("ana", 100)]
    with guard.once("import:file.csv", fingerprint="sha-1") as run:
        assert run
    with pytest.raises(JobConflict), guard.once("import:file.csv", fingerprint="sha-2"):
        pass


def test_finished_keys_expire_and_are_purged(database_url: str) -> None:
    app = Onceonly(database_url=database_url, environ={})
    guard = app.guard(ttl_seconds=0.5)
    runs: list[str] = []
    for key in ("short", "kept"):
        with guard.once(key, ttl=3600 if key == "kept" else None) as run:
            assert run
            runs.append(key)
    forever = app.guard(ttl_seconds=None)
    with forever.once("forever") as run:
        assert run
    with guard.once("short") as run:
        assert not run  # still remembered
    time.sleep(0.6)
    assert guard.purge(dry_run=True) == 1
    report = purge(app)  # onceonly purge deletes them too
    assert report.jobs_deleted == 1
    with app.engine.connect() as conn:
        keys = conn.execute(sa.text("SELECT key FROM onceonly_jobs ORDER BY key")).scalars()
        assert list(keys) == ["forever", "kept"]
    with guard.once("short") as run:
        assert run  # past its horizon, the key runs again
    with guard.once("expired-unpurged", ttl=0.2) as run:
        assert run
    time.sleep(0.3)
    with guard.once("expired-unpurged") as run:
        assert run  # expired keys run again even before a purge
