"""The per-minute activity (``onceonly.store.activity``) and the search by
object id (``EventHistory.events(object_id=...)``) on SQLite and PostgreSQL.

Events are received through the store, then their times are set to known
minutes of a fixed "now", so each bucket's expected figure is known.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from onceonly import NewEvent, Onceonly, create_store
from onceonly.store import migrate_blocking
from onceonly.store.activity import MAX_MINUTES, ActivityHistory
from onceonly.store.history import EventHistory

# A fixed "now", 30 s into a minute: the window is built from it, never from the clock.
NOW = datetime(2026, 3, 9, 12, 0, 30, tzinfo=UTC)
CURRENT = datetime(2026, 3, 9, 12, 0, tzinfo=UTC)


@pytest.fixture
def app(database_url: str) -> Iterator[Onceonly]:
    migrate_blocking(database_url)
    deployment = Onceonly(database_url, environ={})
    yield deployment
    deployment.engine.dispose()


def receive(app: Onceonly, *events: NewEvent) -> list[int]:
    async def insert() -> list[int]:
        async with create_store(app.database_url) as store:
            receipts = [(await store.insert_events([event]))[0] for event in events]
        return [r.id for r in receipts if r.id is not None]

    return asyncio.run(insert())


def new(event_id: str, provider: str = "stripe", object_id: str | None = None) -> NewEvent:
    return NewEvent(provider, event_id, "charge.succeeded", b"{}", {}, object_id=object_id)


def stored(app: Onceonly, moment: datetime) -> Any:
    """A time as the engine stores it."""
    if app.engine_kind == "sqlite":
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    return moment


def minutes_ago(n: int, seconds: float = 0.0) -> datetime:
    return CURRENT - timedelta(minutes=n) + timedelta(seconds=seconds)


def set_times(app: Onceonly, pk: int, **columns: datetime) -> None:
    assignments = ", ".join(f"{c} = :{c}" for c in columns)
    values = {c: stored(app, v) for c, v in columns.items()}
    with app.engine.begin() as conn:
        conn.execute(
            sa.text(f"UPDATE onceonly_events SET {assignments} WHERE id = :pk"),
            {**values, "pk": pk},
        )


def add_attempt(app: Onceonly, pk: int, outcome: str, finished: datetime) -> None:
    with app.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO onceonly_attempts (event_pk, attempt, worker, outcome, finished_at)"
                " VALUES (:pk, 1, 'w', :outcome, :finished)"
            ),
            {"pk": pk, "outcome": outcome, "finished": stored(app, finished)},
        )


def test_each_minute_counts_what_happened_in_it(app: Onceonly) -> None:
    ids = receive(app, *(new(f"evt_{i}") for i in range(8)))
    # Received: two 9 minutes ago (a boundary second and the last ms of the
    # minute), one 3 minutes ago, three in the current minute, and two 20
    # minutes ago (outside a 10-minute window: the bisection must skip them).
    received = [
        minutes_ago(20),
        minutes_ago(20, 10),
        minutes_ago(9),
        minutes_ago(9, 59.999),
        minutes_ago(3, 5),
        minutes_ago(0),
        minutes_ago(0, 1),
        minutes_ago(0, 2),
    ]
    for pk, moment in zip(ids, received, strict=True):
        set_times(app, pk, received_at=moment)
    # Processed 3 minutes ago with lags 1 s, 2 s and 6 s (median 2, max 6);
    # one received 20 minutes ago and processed 1 minute ago (lag 19 min 10 s).
    set_times(app, ids[2], processed_at=minutes_ago(3, 1), received_at=minutes_ago(3))
    set_times(app, ids[3], processed_at=minutes_ago(3, 2), received_at=minutes_ago(3))
    set_times(app, ids[4], processed_at=minutes_ago(3, 11))
    set_times(app, ids[1], processed_at=minutes_ago(1))
    # Duplicates by their latest time: two in the current minute, one outside.
    set_times(app, ids[5], last_duplicate_at=minutes_ago(0, 3))
    set_times(app, ids[6], last_duplicate_at=minutes_ago(0, 4))
    set_times(app, ids[0], last_duplicate_at=minutes_ago(30))
    # Failed attempts (and a dead one) 5 minutes ago; one outside the window.
    add_attempt(app, ids[7], "failed", minutes_ago(5, 1))
    add_attempt(app, ids[7], "dead", minutes_ago(5, 2))
    add_attempt(app, ids[7], "failed", minutes_ago(11))

    series = ActivityHistory(app.engine_kind).per_minute(
        app.engine, minutes=10, now=NOW.timestamp()
    )

    assert [m.start for m in series] == [minutes_ago(n) for n in range(9, -1, -1)]
    by_age = {9 - i: m for i, m in enumerate(series)}
    # ids[2] and ids[3] were moved to 3 minutes ago by their processed times.
    assert {n: m.received for n, m in by_age.items() if m.received} == {3: 3, 0: 3}
    assert {n: m.processed for n, m in by_age.items() if m.processed} == {3: 3, 1: 1}
    assert (by_age[3].lag_p50, by_age[3].lag_max) == (2.0, 6.0)
    assert by_age[1].lag_p50 == by_age[1].lag_max == 19 * 60 - 10
    assert {n: m.duplicates for n, m in by_age.items() if m.duplicates} == {0: 2}
    assert {n: m.failed for n, m in by_age.items() if m.failed} == {5: 2}
    assert by_age[2].lag_p50 is None


def test_the_median_of_an_even_count_is_the_mean_of_the_middle_two(app: Onceonly) -> None:
    ids = receive(app, *(new(f"evt_{i}") for i in range(4)))
    for pk, lag in zip(ids, (1, 2, 4, 10), strict=True):
        set_times(app, pk, received_at=minutes_ago(0), processed_at=minutes_ago(0, lag))
    (minute,) = ActivityHistory(app.engine_kind).per_minute(
        app.engine, minutes=1, now=NOW.timestamp()
    )
    assert (minute.received, minute.processed, minute.lag_p50, minute.lag_max) == (4, 4, 3.0, 10.0)


def test_a_window_without_events_is_all_zeros(app: Onceonly) -> None:
    activity = ActivityHistory(app.engine_kind)
    assert [m.received for m in activity.per_minute(app.engine, minutes=5)] == [0] * 5
    # Received before the window, processed in it: only the processing counts.
    (pk,) = receive(app, new("evt_old"))
    set_times(app, pk, received_at=minutes_ago(90), processed_at=minutes_ago(2))
    series = activity.per_minute(app.engine, minutes=60, now=NOW.timestamp())
    assert len(series) == 60
    assert sum(m.received for m in series) == 0
    assert sum(m.processed for m in series) == 1
    with pytest.raises(ValueError, match="minutes"):
        activity.per_minute(app.engine, minutes=MAX_MINUTES + 1)


def test_the_object_search_finds_every_provider_s_events_of_one_object(app: Onceonly) -> None:
    ids = receive(
        app,
        new("evt_a", "stripe", object_id="pay_123"),
        new("evt_b", "mercadopago", object_id="pay_123"),
        new("evt_c", "stripe", object_id="pay_999"),
        new("evt_d", "stripe"),
    )
    history = EventHistory(app.engine_kind)
    found = history.events(app.engine, object_id="pay_123")
    assert [(e.id, e.provider, e.object_id) for e in found] == [
        (ids[1], "mercadopago", "pay_123"),
        (ids[0], "stripe", "pay_123"),
    ]
    assert history.events(app.engine, object_id="pay_12") == []
    assert [e.object_id for e in history.events(app.engine)] == [
        None,
        "pay_999",
        "pay_123",
        "pay_123",
    ]
