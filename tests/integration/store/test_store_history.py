"""The history repositories on SQLite and PostgreSQL: what the queue gauges,
the dashboard's listings, the retention purge and the dashboard's sign-ins
read and write (``onceonly.store.history``, ``.retention``, ``.sessions``).

The behaviour they serve is tested end to end elsewhere (test_metrics.py,
test_dashboard_endpoints.py, test_retention.py); here each statement is held
to its answer, and a failing database to onceonly's errors.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from onceonly import NewEvent, Onceonly, StoreError, StoreUnavailable, create_store
from onceonly.store import migrate_blocking
from onceonly.store.history import EventHistory
from onceonly.store.retention import ChildRows, RetentionRecords
from onceonly.store.sessions import DashboardSessions

# Collection time: for cut-offs only. An age measured against the clock
# takes datetime.now() when the test runs (the suite may be minutes old).
NOW = datetime.now(UTC)


@pytest.fixture
def app(database_url: str) -> Iterator[Onceonly]:
    migrate_blocking(database_url)
    deployment = Onceonly(database_url, environ={})
    yield deployment
    deployment.engine.dispose()


def receive(app: Onceonly, *events: NewEvent) -> list[int]:
    """Store events as the receiver does, one at a time (so ids follow the
    arguments' order); their row ids."""

    async def insert() -> list[int]:
        async with create_store(app.database_url) as store:
            receipts = [(await store.insert_events([event]))[0] for event in events]
        return [r.id for r in receipts if r.id is not None]

    return asyncio.run(insert())


def new(event_id: str, provider: str = "stripe", event_type: str = "charge.succeeded") -> NewEvent:
    return NewEvent(provider, event_id, event_type, b'{"x": 1}', {"x-test": event_id})


def when(app: Onceonly, moment: datetime) -> Any:
    """A time as the engine stores received_at."""
    if app.engine_kind == "sqlite":
        return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    return moment


def set_rows(app: Onceonly, ids: list[int], **columns: Any) -> None:
    assignments = ", ".join(f"{c} = :{c}" for c in columns)
    with app.engine.begin() as conn:
        for pk in ids:
            conn.execute(
                sa.text(f"UPDATE onceonly_events SET {assignments} WHERE id = :pk"),
                {**columns, "pk": pk},
            )


def run(app: Onceonly, sql: str, **params: Any) -> None:
    with app.engine.begin() as conn:
        conn.execute(sa.text(sql), params)


def count(app: Onceonly, table: str) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())


# The queue gauges.


def test_queue_depth_per_unfinished_status_capped_and_the_oldest_pending_age(
    app: Onceonly,
) -> None:
    history = EventHistory(app.engine_kind)
    empty = history.queue(app.engine)
    assert empty.depth == {"pending": 0, "processing": 0, "failed": 0, "dead": 0}
    assert empty.oldest_pending_age == 0.0

    ids = receive(app, *(new(f"evt_{i}") for i in range(7)))
    set_rows(app, ids[3:5], status="failed")
    set_rows(app, ids[5:6], status="dead")
    set_rows(app, ids[6:7], status="processed")
    set_rows(app, ids[:1], received_at=when(app, datetime.now(UTC) - timedelta(hours=1)))

    stats = history.queue(app.engine, cap=100)
    assert stats.depth == {"pending": 3, "processing": 0, "failed": 2, "dead": 1}
    assert 3500 < stats.oldest_pending_age < 3700
    # The cap bounds each count, not the total.
    assert history.queue(app.engine, cap=2).depth == {
        "pending": 2,
        "processing": 0,
        "failed": 2,
        "dead": 1,
    }


# The dashboard's reads.


def test_tallies_by_provider_and_status_with_duplicates(app: Onceonly) -> None:
    history = EventHistory(app.engine_kind)
    assert history.tallies(app.engine).rows == []
    ids = receive(app, new("evt_a"), new("evt_b"), new("evt_a", provider="shop"))
    receive(app, new("evt_a"), new("evt_a"))  # two duplicate deliveries of stripe's evt_a
    set_rows(app, ids[1:2], status="dead")

    tallies = history.tallies(app.engine)
    assert tallies.duplicates_counted is True
    found = {(t.provider, t.status): (t.events, t.duplicates) for t in tallies.rows}
    assert found == {
        ("stripe", "pending"): (1, 2),
        ("stripe", "dead"): (1, 0),
        ("shop", "pending"): (1, 0),
    }


def test_listing_newest_first_with_exact_filters_and_paging(app: Onceonly) -> None:
    history = EventHistory(app.engine_kind)
    ids = receive(
        app,
        new("evt_1"),
        new("evt_2", event_type="charge.failed"),
        new("evt_3", provider="shop"),
        new("evt_4"),
    )
    set_rows(app, ids[1:2], status="dead", last_error="declined")

    def listed(**filters: Any) -> list[int]:
        return [e.id for e in history.events(app.engine, **filters)]

    assert listed() == ids[::-1]
    assert listed(provider="stripe") == [ids[3], ids[1], ids[0]]
    assert listed(provider="strip") == []  # exact, not a prefix
    assert listed(status="dead") == [ids[1]]
    assert listed(event_type="charge.failed") == [ids[1]]
    assert listed(provider="stripe", status="pending") == [ids[3], ids[0]]
    assert listed(provider="", status=None) == ids[::-1]  # empty is no filter
    assert listed(before_id=ids[2]) == [ids[1], ids[0]]
    assert listed(limit=2) == [ids[3], ids[2]]

    (dead,) = history.events(app.engine, status="dead")
    assert (dead.provider, dead.event_id, dead.event_type) == ("stripe", "evt_2", "charge.failed")
    assert (dead.status, dead.attempts, dead.last_error, dead.duplicates) == (
        "dead",
        0,
        "declined",
        0,
    )
    assert dead.received_at


def test_one_event_with_its_payload_and_attempts(app: Onceonly) -> None:
    history = EventHistory(app.engine_kind)
    (pk,) = receive(app, new("evt_x"))
    for attempt, outcome in ((1, "failed"), (2, "processed")):
        run(
            app,
            "INSERT INTO onceonly_attempts (event_pk, attempt, worker, outcome, error_type)"
            " VALUES (:pk, :attempt, 'w1', :outcome, :error)",
            pk=pk,
            attempt=attempt,
            outcome=outcome,
            error="RuntimeError" if outcome == "failed" else None,
        )

    record = history.event(app.engine, pk)
    assert record is not None
    assert (record.summary.id, record.summary.event_id) == (pk, "evt_x")
    assert record.body == b'{"x": 1}'
    assert record.headers == {"x-test": "evt_x"}
    assert record.processed_at is None
    assert record.payload_purged_at is None
    assert [(a.attempt, a.outcome, a.error_type) for a in record.attempts] == [
        (1, "failed", "RuntimeError"),
        (2, "processed", None),
    ]
    assert history.attempts(app.engine, pk) == record.attempts
    assert history.event(app.engine, pk + 1000) is None


def test_reads_answer_beside_an_open_write_transaction(app: Onceonly) -> None:
    # A worker's transaction, or a purge's, is open: on SQLite it holds the
    # write lock. A scrape of /metrics or a dashboard page must neither wait
    # for it (SQLite would give up after busy_timeout, 5 s) nor see its rows.
    history = EventHistory(app.engine_kind)
    (pk,) = receive(app, new("evt_committed"))
    with app.engine.begin() as writer:
        writer.execute(
            sa.text(
                "UPDATE onceonly_events SET status = 'processing', attempts = 1 WHERE id = :pk"
            ),
            {"pk": pk},
        )
        started = time.monotonic()
        assert app.metrics.read_queue().depth["pending"] == 1
        assert history.queue(app.engine).depth["processing"] == 0
        assert history.oldest_pending_age(app.engine) >= 0
        assert [(t.status, t.events) for t in history.tallies(app.engine).rows] == [("pending", 1)]
        assert [e.status for e in history.events(app.engine)] == ["pending"]
        record = history.event(app.engine, pk)
        assert record is not None
        assert record.summary.attempts == 0
        assert history.attempts(app.engine, pk) == []
        assert time.monotonic() - started < 2
    assert history.queue(app.engine).depth["processing"] == 1


# The retention purge's statements.


def test_retention_finds_old_processed_events_and_spares_the_rest(app: Onceonly) -> None:
    records = RetentionRecords(app.engine_kind)
    old, waiting_outbox, recent, dead, purged, pending = receive(
        app, *(new(f"evt_{i}") for i in range(6))
    )
    set_rows(app, [old, waiting_outbox, recent, purged], status="processed")
    set_rows(app, [dead], status="dead")
    set_rows(app, [purged], payload_purged_at=when(app, NOW - timedelta(days=40)))
    aged = [old, waiting_outbox, dead, purged, pending]
    set_rows(app, aged, received_at=when(app, NOW - timedelta(days=50)))
    run(
        app,
        "INSERT INTO onceonly_outbox (event_pk, action, payload) VALUES (:pk, 'mail', '{}')",
        pk=waiting_outbox,
    )
    cutoff = NOW - timedelta(days=30)

    # Processed and old, with nothing left to send: dead, pending and recent
    # events are never past the horizon.
    assert records.expired(app.engine, cutoff=cutoff, after=0, n=10) == [old, purged]
    # Batches walk the primary key.
    assert records.expired(app.engine, cutoff=cutoff, after=0, n=1) == [old]
    assert records.expired(app.engine, cutoff=cutoff, after=old, n=10) == [purged]
    # Payloads: processed, old and still whole (an outbox row waiting is fine).
    assert records.old_processed(app.engine, cutoff=cutoff, after=0, n=10) == [
        old,
        waiting_outbox,
    ]
    # The dry run's variant leaves out what the ids pass would take.
    spared = records.old_processed(
        app.engine, cutoff=cutoff, after=0, n=10, sparing_expired_before=cutoff
    )
    assert spared == [waiting_outbox]


def test_retention_rechecks_under_its_lock_and_deletes_children(app: Onceonly) -> None:
    records = RetentionRecords(app.engine_kind)
    kept, replayed, emptied = receive(app, new("evt_k"), new("evt_r"), new("evt_e"))
    everything = [kept, replayed, emptied]
    set_rows(app, everything, status="processed")
    set_rows(app, everything, received_at=when(app, NOW - timedelta(days=50)))
    for pk in everything:
        run(
            app,
            "INSERT INTO onceonly_attempts (event_pk, attempt, worker, outcome)"
            " VALUES (:pk, 1, 'w1', 'processed')",
            pk=pk,
        )
    run(
        app,
        "INSERT INTO onceonly_outbox (event_pk, action, payload, status)"
        " VALUES (:pk, 'mail', '{}', 'sent')",
        pk=kept,
    )
    cutoff = NOW - timedelta(days=30)
    # Replayed after the batch was read: pending now, so it is left alone.
    set_rows(app, [replayed], status="pending")

    with records.transaction(app.engine) as conn:
        assert records.count_children(conn, [kept]) == ChildRows(attempts=1, effects=0, outbox=1)
        doomed = records.lock_expired(conn, [kept, replayed], cutoff=cutoff)
        assert doomed == [kept]
        assert records.delete_children(conn, doomed) == ChildRows(1, 0, 1)
        assert records.delete_events(conn, doomed) == 1
        assert records.drop_payloads(conn, [replayed, emptied], now=NOW) == [emptied]
    assert count(app, "onceonly_events") == 2
    assert count(app, "onceonly_outbox") == 0

    record = EventHistory(app.engine_kind).event(app.engine, emptied)
    assert record is not None
    assert (record.body, dict(record.headers)) == (b"", {})
    assert record.payload_purged_at is not None
    # Emptied once: a second pass finds nothing to drop.
    with records.transaction(app.engine) as conn:
        assert records.drop_payloads(conn, [emptied], now=NOW) == []


def test_retention_transaction_rolls_back_when_its_block_fails(app: Onceonly) -> None:
    records = RetentionRecords(app.engine_kind)
    (pk,) = receive(app, new("evt_t"))

    def delete_then_fail() -> None:
        with records.transaction(app.engine) as conn:
            assert records.delete_events(conn, [pk]) == 1
            raise RuntimeError("stopped")

    with pytest.raises(RuntimeError):  # not a database error: passes through untranslated
        delete_then_fail()
    assert count(app, "onceonly_events") == 1


def test_expired_idempotency_keys_are_counted(app: Onceonly) -> None:
    records = RetentionRecords(app.engine_kind)
    for key, expires in (("k1", 100.0), ("k2", 200.0), ("k3", 10_000.0)):
        run(
            app,
            "INSERT INTO onceonly_idempotency_keys"
            " (scope, key, fingerprint, status, expires_at, created_at)"
            " VALUES ('api', :key, 'f', 'done', :expires, 1)",
            key=key,
            expires=expires,
        )
    assert records.expired_idempotency_keys(app.engine, now=150.0) == 1
    assert records.expired_idempotency_keys(app.engine, now=5000.0) == 2


# Dashboard sign-ins.


def test_sessions_open_valid_end_and_prune(app: Onceonly) -> None:
    sessions = DashboardSessions(app.engine_kind)
    engine = app.engine
    sessions.open(engine, "s-old", now=1000.0, expires=2000.0, prune_before=0.0)
    sessions.open(engine, "s-new", now=5000.0, expires=9000.0, prune_before=0.0)
    assert sessions.valid(engine, "s-new", now=5001.0)
    assert not sessions.valid(engine, "s-new", now=9000.0)  # expired at its expiry
    assert not sessions.valid(engine, "s-old", now=5001.0)
    assert not sessions.valid(engine, "s-never", now=5001.0)

    assert sessions.end(engine, "s-new", now=6000.0) is True
    assert not sessions.valid(engine, "s-new", now=6001.0)
    assert sessions.end(engine, "s-new", now=6002.0) is False  # already ended

    assert sessions.prune(engine, before=2500.0) == 1  # s-old
    assert count(app, "onceonly_dashboard_sessions") == 1
    # Opening prunes in the same transaction.
    sessions.open(engine, "s-next", now=20000.0, expires=30000.0, prune_before=10000.0)
    assert count(app, "onceonly_dashboard_sessions") == 1
    assert sessions.valid(engine, "s-next", now=20001.0)


# Errors leave the store as onceonly's.


def test_a_missing_table_is_a_store_error_not_a_driver_error(database_url: str) -> None:
    # Not migrated: the statements meet no tables.
    app = Onceonly(database_url, environ={})
    if app.engine_kind == "postgresql":
        migrate_blocking(database_url)
        run(app, "DROP TABLE onceonly_dashboard_sessions")
    try:
        with pytest.raises(StoreError) as raised:
            DashboardSessions(app.engine_kind).valid(app.engine, "s", now=1.0)
        assert not isinstance(raised.value, sa.exc.SQLAlchemyError)
        assert "checking a dashboard session" in str(raised.value)
        assert isinstance(raised.value.__cause__, sa.exc.DBAPIError)
    finally:
        app.engine.dispose()


def test_an_unreachable_database_is_unavailable(engine: str, tmp_path: Any) -> None:
    url = (
        "postgresql://postgres@127.0.0.1:9/none"
        if engine == "postgresql"
        # A directory where the file should be: SQLite cannot open it.
        else f"sqlite:///{tmp_path}"
    )
    app = Onceonly(url, environ={})
    try:
        with pytest.raises(StoreUnavailable):
            EventHistory(app.engine_kind).queue(app.engine)
        with pytest.raises(StoreUnavailable):
            RetentionRecords(app.engine_kind).expired(app.engine, cutoff=NOW, after=0, n=1)
    finally:
        app.engine.dispose()
