"""Outbox rows are claimed before they are sent: one runner at a time per row,
on a real SQLite file and a real PostgreSQL."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from onceonly import Event, NewEvent, Onceonly, create_store
from onceonly.context import Context
from onceonly.handlers import Action
from onceonly.outbox import OutboxRunner, outbox_key
from onceonly.store import migrate_blocking
from onceonly.store.outbox import OutboxRecords
from onceonly.worker import running


def make_app(database_url: str, **options: Any) -> Onceonly:
    return Onceonly(database_url=database_url, environ={}, retry_base=0.01, **options)


def deliver(database_url: str, *event_ids: str) -> None:
    async def insert() -> None:
        async with create_store(database_url) as store:
            await store.insert_events(
                [NewEvent("stripe", e, "charge.succeeded", b"{}", {}) for e in event_ids]
            )

    asyncio.run(insert())


def rows(app: Onceonly, sql: str) -> list[Any]:
    with app.engine.connect() as conn:
        return list(conn.execute(sa.text(sql)).all())


class Sends:
    """An action that counts its calls per key, thread-safely."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.keys: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, payload: Any, key: str) -> None:
        time.sleep(self.seconds)  # a real API call takes a while: widen every window
        with self._lock:
            self.keys.append(key)

    def repeated(self) -> dict[str, int]:
        return {k: n for k, n in collections.Counter(self.keys).items() if n > 1}


def runner(
    app: Onceonly, owner: str, actions: dict[str, Action], lease: float = 30.0
) -> OutboxRunner:
    loop = asyncio.new_event_loop()
    return OutboxRunner(
        app.engine,
        OutboxRecords(app.engine_kind),
        actions,
        owner=owner,
        lease=lease,
        max_attempts=3,
        delay=lambda attempt: 0.0,
        loop=lambda: loop,
    )


@pytest.fixture
def app(database_url: str) -> Iterator[Onceonly]:
    migrate_blocking(database_url)
    app = make_app(database_url)
    yield app
    app.engine.dispose()


def stage_rows(app: Onceonly, event_pks: list[int | None]) -> list[int]:
    with app.engine.begin() as conn:
        return [
            conn.execute(
                sa.text(
                    "INSERT INTO onceonly_outbox (event_pk, action, payload)"
                    " VALUES (:pk, 'email', '{}') RETURNING id"
                ),
                {"pk": pk},
            ).scalar_one()
            for pk in event_pks
        ]


def pending(app: Onceonly) -> int:
    return len(rows(app, "SELECT id FROM onceonly_outbox WHERE status = 'pending'"))


def test_concurrent_runners_send_each_row_once(app: Onceonly, database_url: str) -> None:
    deliver(database_url, *(f"evt_{i}" for i in range(40)))
    pks = [r.id for r in rows(app, "SELECT id FROM onceonly_events ORDER BY id")]
    ids = stage_rows(app, [pk for pk in pks for _ in range(2)] + [None] * 20)
    sends = Sends(seconds=0.002)
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def run(n: int) -> None:
        # Every runner goes after every row, by event (right after a commit) and
        # by sweep, at the same time as the others.
        r = runner(app, f"runner-{n}", {"email": sends})
        try:
            start.wait()
            deadline = time.monotonic() + 30
            while pending(app) and time.monotonic() < deadline:
                r.run_for(pks[n::3] + pks)
                r.sweep(n=7)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sends.repeated() == {}
    assert sorted(sends.keys) == sorted(outbox_key(i) for i in ids)
    assert pending(app) == 0


def test_a_sweep_leaves_rows_a_live_runner_is_sending(app: Onceonly, database_url: str) -> None:
    deliver(database_url, "evt_slow")
    (pk,) = [r.id for r in rows(app, "SELECT id FROM onceonly_events")]
    stage_rows(app, [pk])
    sends = Sends(seconds=1.5)  # three leases long
    first = runner(app, "first", {"email": sends}, lease=0.5)
    other = runner(app, "other", {"email": sends}, lease=0.5)
    sending = threading.Thread(target=first.run_for, args=([pk],))
    sending.start()
    while sending.is_alive():
        first.extend_leases()  # what the worker's lease keeper does
        other.sweep()
        time.sleep(0.1)
    sending.join()
    other.sweep()
    assert len(sends.keys) == 1
    assert pending(app) == 0


def test_a_dead_runners_rows_are_swept_after_its_lease(app: Onceonly) -> None:
    (row_id,) = stage_rows(app, [None])
    never = Sends()
    dead = runner(app, "dead", {"email": never}, lease=0.5)
    # Claims it, then "dies" before sending.
    dead.records.claim(app.engine, 10, owner=dead.owner, lease=dead.lease)
    sends = Sends()
    other = runner(app, "other", {"email": sends})
    other.sweep()
    assert sends.keys == []  # still leased
    time.sleep(0.6)
    other.sweep()
    assert sends.keys == [outbox_key(row_id)]
    assert pending(app) == 0


BLOCK_MARKS = {
    "sqlite": [
        "CREATE TABLE block_marks (x INTEGER)",
        """CREATE TRIGGER block_marks BEFORE UPDATE OF status ON onceonly_outbox
           WHEN NEW.status = 'sent' AND EXISTS (SELECT 1 FROM block_marks)
           BEGIN SELECT RAISE(ABORT, 'marks blocked'); END""",
    ],
    "postgresql": [
        "CREATE TABLE block_marks (x INTEGER)",
        """CREATE FUNCTION block_marks() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
               IF NEW.status = 'sent' AND EXISTS (SELECT 1 FROM block_marks) THEN
                   RAISE EXCEPTION 'marks blocked';
               END IF;
               RETURN NEW;
           END $$""",
        "CREATE TRIGGER block_marks BEFORE UPDATE ON onceonly_outbox"
        " FOR EACH ROW EXECUTE FUNCTION block_marks()",
    ],
}


def test_a_failed_mark_is_retried_as_a_mark_not_a_send(app: Onceonly) -> None:
    with app.engine.begin() as conn:
        for statement in BLOCK_MARKS[app.engine_kind]:
            conn.exec_driver_sql(statement)
        conn.exec_driver_sql("INSERT INTO block_marks VALUES (1)")
    (row_id,) = stage_rows(app, [None])
    sends = Sends()
    first = runner(app, "first", {"email": sends}, lease=1.0)
    other = runner(app, "other", {"email": sends}, lease=1.0)
    first.sweep()  # sent; its mark fails
    assert sends.keys == [outbox_key(row_id)]
    for _ in range(3):  # past the lease: the runner keeps the row while it retries
        time.sleep(0.5)
        first.extend_leases()
        first.sweep()
        other.sweep()
    assert len(sends.keys) == 1
    assert pending(app) == 1
    with app.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM block_marks")
    first.sweep()
    assert pending(app) == 0
    assert len(sends.keys) == 1
    (row,) = rows(app, "SELECT status, attempts, owner FROM onceonly_outbox")
    assert tuple(row) == ("sent", 1, None)


def test_a_slow_action_is_sent_once_by_racing_workers(database_url: str) -> None:
    """Through the worker: a send longer than the lease, two workers sweeping."""
    app = make_app(database_url, lease_seconds=0.6, outbox_lease_seconds=0.6)
    sends = Sends(seconds=1.5)
    app.action("email")(sends)

    @app.handler("stripe")
    def handler(event: Event, ctx: Context) -> None:
        ctx.stage("email", {"event": event.event_id})

    deliver(database_url, "evt_a", "evt_b", "evt_c")
    workers = [app.worker(concurrency=2, name=f"w{i}") for i in range(2)]
    with running(workers[0]), running(workers[1]):
        deadline = time.monotonic() + 30
        while (pending(app) or len(sends.keys) < 3) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2.5)  # a sweep or two more: nothing is sent again
    assert sends.repeated() == {}
    assert len(sends.keys) == 3
