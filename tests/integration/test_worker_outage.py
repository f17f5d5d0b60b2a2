"""A worker never dies of a database error: the database gone at start, during
claims and during outbox sweeps, or locked past the busy timeout. It logs,
backs off, and resumes by itself."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import sqlalchemy as sa

from onceonly import Event, NewEvent, Onceonly, create_store
from onceonly.context import Context
from onceonly.worker import Worker
from support import TcpProxy


def deliver(database_url: str, *event_ids: str) -> None:
    async def insert() -> None:
        async with create_store(database_url) as store:
            await store.insert_events(
                [NewEvent("stripe", e, "charge.succeeded", b"{}", {}) for e in event_ids]
            )

    asyncio.run(insert())


class Shop:
    """An app whose handler stages one e-mail per event; e-mails counted per key."""

    def __init__(self, database_url: str) -> None:
        self.app = Onceonly(
            database_url=database_url, environ={}, lease_seconds=2, retry_base=0.05, retry_cap=0.5
        )
        self.mails: collections.Counter[str] = collections.Counter()
        self.handled: set[str] = set()
        self._lock = threading.Lock()

        @self.app.action("email")
        def email(payload: dict[str, str], key: str) -> None:
            with self._lock:
                self.mails[key] += 1

        @self.app.handler("stripe")
        def handler(event: Event, ctx: Context) -> None:
            ctx.stage("email", {"event": event.event_id})
            self.handled.add(event.event_id)

    def errors(self, operation: str) -> float:
        return sum(
            value
            for name, labels, value in self.app.metrics.samples()
            if name == "onceonly_worker_database_errors_total" and labels["operation"] == operation
        )

    def reachable(self) -> float:
        (value,) = (
            v
            for name, _, v in self.app.metrics.samples()
            if name == "onceonly_worker_database_reachable"
        )
        return value


def wait_until(what: str, condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@contextlib.contextmanager
def worker_thread(worker: Worker) -> Iterator[threading.Thread]:
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        worker.stop()
        thread.join(30)


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_the_worker_waits_for_postgres_and_survives_it_going_away(database_url: str) -> None:
    parts = urlsplit(database_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    via_proxy = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
    deliver(database_url, *(f"evt_a{i}" for i in range(20)))  # creates the tables
    shop = Shop(via_proxy)
    worker = shop.app.worker(concurrency=2, poll_interval=0.1)
    try:
        with worker_thread(worker) as thread:
            # Down at start: the worker waits instead of exiting.
            wait_until("a failed start", lambda: shop.errors("start") >= 2)
            assert thread.is_alive()
            assert shop.reachable() == 0
            proxy.start()
            wait_until("the first events", lambda: sum(shop.mails.values()) == 20)

            # Gone while it claims and sweeps.
            proxy.cut()
            deliver(database_url, *(f"evt_b{i}" for i in range(20)))
            wait_until("failed claims", lambda: shop.errors("claim") >= 2)
            wait_until("a failed sweep", lambda: shop.errors("outbox-sweep") >= 1)
            assert thread.is_alive()
            proxy.start()
            wait_until("the events after the outage", lambda: sum(shop.mails.values()) == 40)
            assert shop.reachable() == 1
            assert thread.is_alive()
    finally:
        proxy.close()
        shop.app.engine.dispose()
    assert len(shop.handled) == 40
    assert set(shop.mails.values()) == {1}


@pytest.mark.parametrize("engine", ["sqlite"], indirect=True)
def test_the_worker_survives_sqlite_locked_past_its_busy_timeout(database_url: str) -> None:
    deliver(database_url, "evt_first")
    shop = Shop(database_url + "?busy_timeout=100")
    worker = shop.app.worker(concurrency=2, poll_interval=0.05)
    try:
        with worker_thread(worker) as thread:
            wait_until("the first event", lambda: sum(shop.mails.values()) == 1)
            deliver(database_url, *(f"evt_{i}" for i in range(20)))
            # Another process holding the write lock well past busy_timeout:
            # claims, batches, leases, sweeps and marks all hit "database is locked".
            blocker = sqlite3.connect(urlsplit(database_url).path, isolation_level=None)
            blocker.execute("BEGIN EXCLUSIVE")
            try:
                wait_until("failed claims", lambda: shop.errors("claim") >= 2)
                wait_until("a failed sweep", lambda: shop.errors("outbox-sweep") >= 1, 10)
                assert thread.is_alive()
            finally:
                blocker.execute("ROLLBACK")
                blocker.close()
            wait_until("every event", lambda: sum(shop.mails.values()) == 21)
            assert thread.is_alive()
    finally:
        shop.app.engine.dispose()
    assert set(shop.mails.values()) == {1}


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_run_until_idle_waits_for_the_database_instead_of_raising(database_url: str) -> None:
    """A script's ``worker.run_until_idle()`` started while the database is
    away counts the failed look, waits, and returns once everything is done."""
    parts = urlsplit(database_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    via_proxy = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
    deliver(database_url, *(f"evt_{i}" for i in range(10)))
    shop = Shop(via_proxy)
    back = threading.Timer(1.5, proxy.start)  # away for the first 1.5 s
    back.start()
    try:
        shop.app.worker(concurrency=2, poll_interval=0.1).run_until_idle(timeout=30)
    finally:
        back.cancel()
        proxy.close()
        shop.app.engine.dispose()
    assert shop.errors("due-count") >= 1
    assert shop.handled == {f"evt_{i}" for i in range(10)}


def test_a_batch_whose_commit_fails_is_counted_and_done_again_later(database_url: str) -> None:
    """The processing transaction's COMMIT failing (the connection cut at that
    moment) is a database error of the batch like any statement's: counted,
    nothing of the batch stays, and the event is done once its lease ran out."""
    deliver(database_url, "evt_1")
    shop = Shop(database_url)
    failed = threading.Event()

    def cut_once(connection: sa.Connection) -> None:
        # Only the batch's commit: claims, leases and sweeps run on other threads.
        if threading.current_thread().name.startswith("onceonly-handler") and not failed.is_set():
            failed.set()
            raise sa.exc.OperationalError("COMMIT", {}, ConnectionError("cut at commit"))

    sa.event.listen(shop.app.engine, "commit", cut_once)
    worker = shop.app.worker(concurrency=1, poll_interval=0.05)
    try:
        with worker_thread(worker) as thread:
            wait_until("the failed commit", lambda: shop.errors("batch") == 1)
            wait_until("the event done again", lambda: sum(shop.mails.values()) == 1)
            assert thread.is_alive()
    finally:
        shop.app.engine.dispose()
    assert list(shop.mails.values()) == [1]
    assert worker.processed == 1
