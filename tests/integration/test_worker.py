"""The worker against a real SQLite file and a real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped

from onceonly import Event, EventStatus, NewEvent, Onceonly, create_store
from onceonly.context import Context
from onceonly.operations import attempts_of, replay
from onceonly.worker import Claimed, Worker, backoff

metadata = sa.MetaData()
payments = sa.Table(
    "payments",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("event_id", sa.Text, nullable=False),
    sa.Column("note", sa.Text),
)


class Base(DeclarativeBase):
    pass


class Payment(Base):
    __table__ = payments
    id: Mapped[int]
    event_id: Mapped[str]
    note: Mapped[str | None]


def make_app(database_url: str, **options: Any) -> Onceonly:
    options.setdefault("retry_base", 0.01)
    app = Onceonly(database_url=database_url, environ={}, **options)
    with app.engine.begin() as conn:
        metadata.create_all(conn)
    return app


def deliver(
    database_url: str,
    *event_ids: str,
    provider: str = "stripe",
    event_type: str = "charge.succeeded",
) -> None:
    async def insert() -> None:
        async with create_store(database_url) as store:
            await store.insert_events(
                [NewEvent(provider, e, event_type, b'{"ok": true}', {}) for e in event_ids]
            )

    asyncio.run(insert())


def rows(app: Onceonly, sql: str, **params: Any) -> list[Any]:
    with app.engine.connect() as conn:
        return list(conn.execute(sa.text(sql), params).all())


def statuses(app: Onceonly) -> dict[str, str]:
    return {r.event_id: r.status for r in rows(app, "SELECT event_id, status FROM onceonly_events")}


def paid(app: Onceonly) -> list[str]:
    return sorted(r.event_id for r in rows(app, "SELECT event_id FROM payments"))


def test_handler_writes_and_processed_mark_commit_together(database_url: str) -> None:
    app = make_app(database_url, max_attempts=5)
    failures = {"evt_flaky": 2}

    @app.handler("stripe")
    def record(event: Event, ctx: Context) -> None:
        ctx.connection.execute(payments.insert().values(event_id=event.event_id))
        if failures.get(event.event_id, 0) >= ctx.attempt:
            raise RuntimeError(f"failing attempt {ctx.attempt}")

    deliver(database_url, "evt_ok", "evt_flaky")
    app.worker(concurrency=2).run_until_idle()
    assert statuses(app) == {"evt_ok": "processed", "evt_flaky": "processed"}
    # The two failed attempts wrote a payment each; both were rolled back.
    assert paid(app) == ["evt_flaky", "evt_ok"]
    flaky = rows(app, "SELECT id FROM onceonly_events WHERE event_id = 'evt_flaky'")[0].id
    history = attempts_of(app.engine, flaky)
    # Failures are kept with their errors; success is the event's own status.
    assert [(a.attempt, a.outcome) for a in history] == [(1, "failed"), (2, "failed")]
    assert history[0].error_type == "RuntimeError"
    assert history[0].traceback is not None
    assert "failing attempt 1" in history[0].traceback


def test_orm_and_async_handlers_share_the_transaction(database_url: str) -> None:
    app = make_app(database_url)

    @app.handler("stripe", "charge.succeeded")
    def orm(event: Event, ctx: Context) -> None:
        ctx.session.add(Payment(event_id=event.event_id, note="orm"))

    @app.handler("github")
    async def coroutine(event: Event, ctx: Context) -> None:
        await asyncio.sleep(0)
        ctx.connection.execute(payments.insert().values(event_id=event.event_id, note="async"))

    deliver(database_url, "evt_orm")
    deliver(database_url, "delivery-1", provider="github", event_type="push")
    app.worker().run_until_idle()
    notes = {r.event_id: r.note for r in rows(app, "SELECT event_id, note FROM payments")}
    assert notes == {"evt_orm": "orm", "delivery-1": "async"}


def test_most_specific_handler_wins_and_unhandled_events_are_recorded(database_url: str) -> None:
    app = make_app(database_url)
    seen: list[tuple[str, str]] = []

    @app.handler("stripe", "charge.succeeded")
    def specific(event: Event, ctx: Context) -> None:
        seen.append(("specific", event.event_id))

    @app.handler("stripe")
    def any_stripe(event: Event, ctx: Context) -> None:
        seen.append(("stripe", event.event_id))

    deliver(database_url, "a")
    deliver(database_url, "b", event_type="invoice.paid")
    deliver(database_url, "c", provider="github", event_type="push")
    app.worker().run_until_idle()
    assert sorted(seen) == [("specific", "a"), ("stripe", "b")]
    handled = {
        r.event_id: r.handler for r in rows(app, "SELECT event_id, handler FROM onceonly_events")
    }
    assert handled["a"].endswith("specific")
    assert handled["c"] == "(no handler registered)"
    assert statuses(app)["c"] == "processed"


def test_failures_back_off_then_die_and_replay_brings_them_back(database_url: str) -> None:
    app = make_app(database_url, max_attempts=3)
    broken = True

    @app.handler("stripe")
    def handler(event: Event, ctx: Context) -> None:
        if broken:
            raise ValueError("card declined by a bug")
        ctx.connection.execute(payments.insert().values(event_id=event.event_id))

    deliver(database_url, "evt_dead")
    app.worker().run_until_idle()
    (event,) = rows(app, "SELECT id, status, attempts, last_error FROM onceonly_events")
    assert (event.status, event.attempts) == ("dead", 3)
    assert event.last_error == "ValueError: card declined by a bug"

    # A resend of a dead event is still a duplicate, not a second event.
    deliver(database_url, "evt_dead")
    assert len(rows(app, "SELECT id FROM onceonly_events")) == 1

    broken = False
    assert replay(app.engine, app.engine_kind, status=EventStatus.DEAD) == [event.id]
    app.worker().run_until_idle()
    assert statuses(app) == {"evt_dead": "processed"}
    assert paid(app) == ["evt_dead"]


def test_backoff_grows_and_is_jittered() -> None:
    delays = [backoff(n, base=2, cap=60) for n in range(1, 8)]
    assert 1 <= delays[0] <= 2
    assert 4 <= delays[2] <= 8
    assert 30 <= delays[6] <= 60  # capped
    assert len({backoff(3, base=2, cap=60) for _ in range(20)}) > 1


def test_failed_event_waits_for_its_retry_time(database_url: str) -> None:
    app = make_app(database_url, retry_base=60)

    @app.handler("stripe")
    def handler(event: Event, ctx: Context) -> None:
        raise RuntimeError("down")

    deliver(database_url, "evt_later")
    app.worker().run_until_idle()
    (event,) = rows(app, "SELECT status, attempts FROM onceonly_events")
    assert (event.status, event.attempts) == ("failed", 1)  # not retried within the run


def test_a_worker_that_lost_its_lease_cannot_commit(database_url: str) -> None:
    app = make_app(database_url, lease_seconds=0.2)
    ran: list[str] = []

    @app.handler("stripe")
    def handler(event: Event, ctx: Context) -> None:
        ran.append(ctx.connection.engine.url.drivername)
        ctx.connection.execute(payments.insert().values(event_id=event.event_id))

    deliver(database_url, "evt_fenced")
    stale, fresh = Worker(app, name="stale"), Worker(app, name="fresh")
    (claimed,) = stale._claim(1)
    time.sleep(0.3)  # the stale worker stops renewing: its lease runs out
    (reclaimed,) = fresh._claim(1)
    assert reclaimed.fence == claimed.fence + 1
    stale._process(claimed)  # must notice and write nothing
    assert paid(app) == []
    assert len(ran) == 0
    fresh._process(reclaimed)
    assert paid(app) == ["evt_fenced"]
    assert statuses(app) == {"evt_fenced": "processed"}


def test_a_slow_live_handler_is_never_run_twice_in_parallel(database_url: str) -> None:
    app = make_app(database_url, lease_seconds=0.5)
    running = 0
    peak = 0
    calls = 0
    lock = threading.Lock()

    @app.handler("stripe")
    def slow(event: Event, ctx: Context) -> None:
        nonlocal running, peak, calls
        with lock:
            running += 1
            calls += 1
            peak = max(peak, running)
        time.sleep(2.0)  # four leases long
        with lock:
            running -= 1
        ctx.connection.execute(payments.insert().values(event_id=event.event_id))

    deliver(database_url, "evt_slow")
    workers = [Worker(app, concurrency=1, poll_interval=0.05) for _ in range(3)]
    threads = [threading.Thread(target=w.run, kwargs={"install_signals": False}) for w in workers]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while statuses(app)["evt_slow"] != "processed" and time.monotonic() < deadline:
        time.sleep(0.05)
    for w in workers:
        w.stop()
    for t in threads:
        t.join()
    assert (peak, calls) == (1, 1)
    assert paid(app) == ["evt_slow"]


def test_effects_are_recorded_and_returned_on_retry(database_url: str) -> None:
    app = make_app(database_url, max_attempts=3)
    external_calls: list[str] = []

    @app.handler("stripe")
    def handler(event: Event, ctx: Context) -> None:
        def charge_card(key: str) -> dict[str, str]:
            external_calls.append(key)
            return {"id": "ch_1"}

        charge = ctx.effect("charge", charge_card)
        assert charge == {"id": "ch_1"}
        ctx.connection.execute(payments.insert().values(event_id=event.event_id))
        if ctx.attempt == 1:
            raise RuntimeError("crash after the charge")

    deliver(database_url, "evt_fx")
    app.worker().run_until_idle()
    assert statuses(app) == {"evt_fx": "processed"}
    assert len(external_calls) == 1  # the retry got the recorded outcome back
    with app.effect_ledger.engine.connect() as conn:
        (record,) = conn.execute(sa.text("SELECT name, key, outcome FROM onceonly_effects")).all()
    assert (record.name, record.outcome) == ("charge", '{"id": "ch_1"}')
    assert record.key == external_calls[0]
    assert paid(app) == ["evt_fx"]


def test_effect_keys_are_deterministic_and_distinct() -> None:
    from onceonly.context import effect_key

    assert effect_key("stripe", "evt_1", "charge") == effect_key("stripe", "evt_1", "charge")
    keys = {
        effect_key("stripe", "evt_1", "charge"),
        effect_key("stripe", "evt_1", "email"),
        effect_key("stripe", "evt_2", "charge"),
        effect_key("github", "evt_1", "charge"),
    }
    assert len(keys) == 4
    assert all(len(k) <= 64 for k in keys)


def test_outbox_runs_after_commit_only(database_url: str) -> None:
    app = make_app(database_url, max_attempts=3)
    sent: list[tuple[Any, str]] = []

    @app.action("email")
    def email(payload: Any, key: str) -> None:
        sent.append((payload, key))

    @app.handler("stripe")
    def handler(event: Event, ctx: Context) -> None:
        ctx.stage("email", {"to": "ana@example.com", "attempt": ctx.attempt})
        if ctx.attempt == 1:
            raise RuntimeError("rolled back: the e-mail of this attempt must not go")

    deliver(database_url, "evt_mail")
    app.worker().run_until_idle()
    assert [payload for payload, _ in sent] == [{"to": "ana@example.com", "attempt": 2}]
    (row,) = rows(app, "SELECT status FROM onceonly_outbox")
    assert row.status == "sent"


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_listen_notify_wakes_the_worker_at_once(database_url: str) -> None:
    app = make_app(database_url)
    handled_at: dict[str, float] = {}

    @app.handler("stripe")
    def handler(event: Event, ctx: Context) -> None:
        handled_at[event.event_id] = time.monotonic()

    deliver(database_url, "warm-up")  # also creates the tables and trigger
    worker = Worker(app, poll_interval=1.0)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        while "warm-up" not in handled_at:
            time.sleep(0.01)
        time.sleep(0.2)
        latencies = []
        for i in range(5):
            sent = time.monotonic()
            deliver(database_url, f"evt_{i}")
            while f"evt_{i}" not in handled_at:
                time.sleep(0.002)
            latencies.append(handled_at[f"evt_{i}"] - sent)
    finally:
        worker.stop()
        thread.join()
    # Polling would take up to a second; NOTIFY brings each in well under that.
    assert sorted(latencies)[2] < 0.3, latencies


def held_app(database_url: str) -> tuple[Onceonly, threading.Event, threading.Event]:
    """An app whose handler holds each event until `release` is set; `started`
    is set when the first one is in hand."""
    app = make_app(database_url)
    started = threading.Event()
    release = threading.Event()

    @app.handler("stripe")
    def handler(event: Event, ctx: Context) -> None:
        started.set()
        release.wait(10)

    return app, started, release


def status_counts(app: Onceonly) -> dict[str, int]:
    found: dict[str, int] = {}
    for status in statuses(app).values():
        found[status] = found.get(status, 0) + 1
    return found


def test_sigterm_style_stop_gives_back_unstarted_events(database_url: str) -> None:
    app, started, release = held_app(database_url)
    deliver(database_url, *[f"evt_{i}" for i in range(6)])
    worker = Worker(app, concurrency=1, batch_size=6)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    assert started.wait(5)
    worker.stop()
    release.set()
    thread.join(10)
    counts = status_counts(app)
    # The one in hand finished; the claimed-but-unstarted ones are back in line, not leased.
    assert counts.get("processed", 0) >= 1
    assert counts.get("processing", 0) == 0
    assert counts.get("processed", 0) + counts.get("pending", 0) == 6
    assert all(
        r.attempts == 0
        for r in rows(app, "SELECT attempts FROM onceonly_events WHERE status = 'pending'")
    )


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_the_next_batch_waits_claimed_and_goes_back_on_stop(database_url: str) -> None:
    """A thread's next batch is claimed while it runs one (so it never waits
    on a claim), and no further: on a graceful stop the waiting batch goes
    back to pending with no attempt spent. (On SQLite the running batch holds
    the write lock, so the claim ahead waits for its commit.)"""
    app, started, release = held_app(database_url)
    deliver(database_url, *[f"evt_{i}" for i in range(9)])
    worker = Worker(app, concurrency=1, batch_size=3)

    def wait_for(expected: dict[str, int]) -> None:
        deadline = time.monotonic() + 10
        while status_counts(app) != expected and time.monotonic() < deadline:
            time.sleep(0.02)
        assert status_counts(app) == expected

    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        assert started.wait(10)
        # One batch running, one waiting: 2 x concurrency x batch_size leased.
        wait_for({"processing": 6, "pending": 3})
        worker.stop()
        wait_for({"processing": 3, "pending": 6})  # the waiting batch, given back
    finally:
        worker.stop()
        release.set()
        thread.join(10)
    assert status_counts(app) == {"processed": 3, "pending": 6}
    assert [
        r.attempts
        for r in rows(app, "SELECT attempts FROM onceonly_events WHERE status = 'pending'")
    ] == [0] * 6


def test_claims_are_exclusive_under_racing_workers(database_url: str) -> None:
    app = make_app(database_url)
    deliver(database_url, *[f"evt_{i}" for i in range(200)])
    workers = [Worker(app, name=f"w{i}") for i in range(4)]
    results: list[list[Claimed]] = [[] for _ in workers]

    def grab(i: int) -> None:
        while batch := workers[i]._claim(7):
            results[i].extend(batch)

    threads = [threading.Thread(target=grab, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [c.event.id for r in results for c in r]
    assert len(ids) == 200
    assert len(set(ids)) == 200


def test_one_failing_handler_does_not_undo_the_others_in_its_batch(database_url: str) -> None:
    app = make_app(database_url, max_attempts=1)
    with app.engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE codes (code TEXT PRIMARY KEY)")

    @app.handler("stripe")
    def handler(event: Event, ctx: Context) -> None:
        ctx.connection.execute(payments.insert().values(event_id=event.event_id))
        if event.event_id.startswith("bad"):
            raise RuntimeError("bad event")
        if event.event_id.startswith("swallow"):
            # A handler that hides a database error: on PostgreSQL the
            # transaction is now unusable; only this event may pay for it.
            with contextlib.suppress(sa.exc.IntegrityError):
                ctx.connection.exec_driver_sql("INSERT INTO codes VALUES ('taken')")

    with app.engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO codes VALUES ('taken')")
    ids = [f"good{i}" for i in range(10)] + ["bad1", "bad2", "swallow1"]
    deliver(database_url, *ids)
    Worker(app, concurrency=1, batch_size=50).run_until_idle()
    final = statuses(app)
    assert {e for e, s in final.items() if s == "processed"} >= {f"good{i}" for i in range(10)}
    assert final["bad1"] == final["bad2"] == "dead"
    assert [p for p in paid(app) if p.startswith("good")] == sorted(f"good{i}" for i in range(10))
    assert not [p for p in paid(app) if p.startswith("bad")]
    if app.engine_kind == "postgresql":
        assert final["swallow1"] == "dead"
        assert "swallow1" not in paid(app)
