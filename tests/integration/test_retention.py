"""Retention on a real SQLite file and a real PostgreSQL: payloads go, the dedup
memory stays until its own horizon, and a late resend is still a duplicate."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from onceonly import ConfigurationError, Event, Onceonly, PayloadPurged, create_store
from onceonly.context import Context
from onceonly.operations import replay
from onceonly.providers import Stripe
from onceonly.retention import duration, purge
from support import STRIPE_SECRET, live_server, stripe_delivery


def make_app(database_url: str) -> Onceonly:
    app = Onceonly(
        database_url=database_url,
        providers={"stripe": Stripe(STRIPE_SECRET)},
        max_attempts=2,
        retry_base=0.01,
        environ={},
    )
    failed_once: set[str] = set()

    @app.handler("stripe", "payment_intent.succeeded")
    def paid(event: Event, ctx: Context) -> None:
        # The first attempt of evt_old fails, so it has an attempt history.
        if event.event_id == "evt_old" and event.event_id not in failed_once:
            failed_once.add(event.event_id)
            raise RuntimeError("first try fails")

    @app.handler("stripe", "charge.failed")
    def broken(event: Event, ctx: Context) -> None:
        raise RuntimeError("always fails")

    return app


def post(url: str, event_id: str, event_type: str = "payment_intent.succeeded") -> bool:
    """Deliver an event; whether the receiver called it a duplicate."""
    body, headers = stripe_delivery(event_id, event_type=event_type)
    response = httpx.post(f"{url}/webhooks/stripe", content=body, headers=headers, timeout=10)
    assert response.status_code == 200
    return bool(response.json()["duplicate"])


def backdate(app: Onceonly, event_id: str, days: int) -> None:
    moment = datetime.now(UTC) - timedelta(days=days)
    value: Any = moment
    if app.engine_kind == "sqlite":
        value = moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    with app.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE onceonly_events SET received_at = :t WHERE event_id = :e"),
            {"t": value, "e": event_id},
        )


def find(app: Onceonly, event_id: str) -> Event | None:
    async def read() -> Event | None:
        async with create_store(app.database_url) as store:
            return await store.find_event("stripe", event_id)

    return asyncio.run(read())


def count(app: Onceonly, table: str) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())


@pytest.fixture
def world(database_url: str) -> Iterator[tuple[Onceonly, str]]:
    """Processed events old and recent, a dead one and a pending one, all old
    except evt_recent; plus one expired Idempotency-Key record."""
    app = make_app(database_url)
    with live_server(app.asgi()) as url:
        assert not post(url, "evt_old")
        assert not post(url, "evt_recent")
        assert not post(url, "evt_dead", "charge.failed")
        app.worker(poll_interval=0.02).run_until_idle()
        assert not post(url, "evt_waiting")
        for event_id in ("evt_old", "evt_dead", "evt_waiting"):
            backdate(app, event_id, days=40)
        with app.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO onceonly_idempotency_keys"
                    " (scope, key, fingerprint, status, expires_at, created_at)"
                    " VALUES ('api', 'k1', 'f', 'done', 1.0, 0.0)"
                )
            )
        yield app, url


def test_purge_drops_old_payloads_but_a_resend_is_still_a_duplicate(
    world: tuple[Onceonly, str],
) -> None:
    app, url = world
    attempts_before = count(app, "onceonly_attempts")
    report = purge(app, older_than="30d", keep_ids="400d")
    assert report.payloads_dropped == 1
    assert report.events_deleted == 0
    assert report.attempts_deleted == 1  # evt_old's failed first try
    assert report.idempotency_keys_deleted == 1
    assert count(app, "onceonly_attempts") == attempts_before - 1
    assert count(app, "onceonly_idempotency_keys") == 0

    old = find(app, "evt_old")
    assert old is not None
    assert (old.body, dict(old.headers)) == (b"", {})
    assert old.payload_purged_at is not None
    for kept in ("evt_recent", "evt_dead", "evt_waiting"):
        event = find(app, kept)
        assert event is not None
        assert event.body.startswith(b"{")
        assert event.payload_purged_at is None

    # The dedup memory is intact: the real receiver answers a resend as a duplicate.
    assert post(url, "evt_old")
    resent = find(app, "evt_old")
    assert resent is not None
    assert resent.duplicates == 1
    assert resent.body == b""  # a duplicate never brings the payload back

    # Replaying it would run the handler on nothing: refused, loudly.
    with pytest.raises(PayloadPurged, match="purged"):
        replay(app.engine, app.engine_kind, id=old.id)

    again = purge(app, older_than="30d", keep_ids="400d")
    assert (again.payloads_dropped, again.events_deleted) == (0, 0)


def test_keep_ids_horizon_finally_forgets_processed_events(world: tuple[Onceonly, str]) -> None:
    app, url = world
    for event_id in ("evt_old", "evt_dead", "evt_waiting"):
        backdate(app, event_id, days=500)
    report = purge(app, older_than="30d", keep_ids="400d", batch_size=1)
    assert report.events_deleted == 1
    assert report.attempts_deleted == 1
    assert find(app, "evt_old") is None
    # Unfinished events are never forgotten, however old.
    assert find(app, "evt_dead") is not None
    assert find(app, "evt_waiting") is not None
    # Past the horizon, a resend is new again: that is what the horizon means.
    assert not post(url, "evt_old")


def test_a_pause_waits_after_each_batch_and_purges_the_same(
    world: tuple[Onceonly, str],
) -> None:
    app, _ = world
    backdate(app, "evt_recent", days=40)  # two old processed events: two batches of one
    started = time.monotonic()
    report = purge(app, older_than="30d", keep_ids="400d", batch_size=1, pause=0.3)
    elapsed = time.monotonic() - started
    assert report.payloads_dropped == 2
    assert elapsed >= 0.6
    for gone in ("evt_old", "evt_recent"):
        event = find(app, gone)
        assert event is not None
        assert event.payload_purged_at is not None
    # Nothing left to purge: nothing to wait after.
    started = time.monotonic()
    assert purge(app, older_than="30d", keep_ids="400d", pause=5.0).payloads_dropped == 0
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("pause", [-0.01, 60.5, float("nan")])
def test_a_pause_out_of_range_is_refused(world: tuple[Onceonly, str], pause: float) -> None:
    app, _ = world
    with pytest.raises(ConfigurationError, match="pause must be between 0 and 60 seconds"):
        purge(app, older_than="30d", pause=pause)
    event = find(app, "evt_old")
    assert event is not None
    assert event.payload_purged_at is None


def test_dry_run_counts_and_changes_nothing(world: tuple[Onceonly, str]) -> None:
    app, _ = world
    backdate(app, "evt_recent", days=500)

    def snapshot() -> list[Any]:
        with app.engine.connect() as conn:
            return [
                conn.execute(
                    sa.text(
                        "SELECT id, body, headers, payload_purged_at"
                        " FROM onceonly_events ORDER BY id"
                    )
                ).all(),
                conn.execute(sa.text("SELECT count(*) FROM onceonly_attempts")).all(),
                conn.execute(sa.text("SELECT count(*) FROM onceonly_idempotency_keys")).all(),
            ]

    before = snapshot()
    report = purge(app, older_than="30d", keep_ids="400d", dry_run=True)
    assert report.dry_run
    assert (report.payloads_dropped, report.events_deleted) == (1, 1)
    assert report.attempts_deleted == 1
    assert report.idempotency_keys_deleted == 1
    assert snapshot() == before
    real = purge(app, older_than="30d", keep_ids="400d")
    assert (real.payloads_dropped, real.events_deleted, real.attempts_deleted) == (1, 1, 1)


def test_horizons_are_checked(tmp_path: Any) -> None:
    app = Onceonly(database_url=f"sqlite:///{tmp_path / 'o.db'}", environ={})
    with pytest.raises(ConfigurationError, match="keep-ids"):
        purge(app, older_than="30d", keep_ids="7d")
    with pytest.raises(ConfigurationError, match="not a duration"):
        purge(app, older_than="30 days")
    assert duration("90m") == timedelta(minutes=90)
    assert duration("12h") == timedelta(hours=12)
    assert duration("2w") == timedelta(days=14)
    with pytest.raises(ConfigurationError, match="ONCEONLY_RETENTION_IDS"):
        Onceonly(database_url="sqlite:///x.db", environ={"ONCEONLY_RETENTION_IDS": "-1d"})
    configured = Onceonly(
        database_url="sqlite:///x.db",
        retention_payloads="12h",
        environ={"ONCEONLY_RETENTION_IDS": "90d"},
    )
    assert configured.retention_payloads == timedelta(hours=12)
    assert configured.retention_ids == timedelta(days=90)
