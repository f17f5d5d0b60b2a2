"""The effect ledger: each record is durable before the handler goes on, on a
real SQLite file and a real PostgreSQL, whatever the batch size."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from onceonly import Event, NewEvent, Onceonly, create_store
from onceonly.context import Context, effect_key
from onceonly.db import create_engine
from onceonly.ledger import effects_url
from onceonly.retention import purge


def make_app(database_url: str, **options: Any) -> Onceonly:
    return Onceonly(database_url=database_url, environ={}, retry_base=0.01, **options)


def deliver(database_url: str, *event_ids: str) -> None:
    async def insert() -> None:
        async with create_store(database_url) as store:
            await store.insert_events(
                [NewEvent("stripe", e, "charge.succeeded", b"{}", {}) for e in event_ids]
            )

    asyncio.run(insert())


class Outside:
    """Reads effect records as another process would: a plain connection of its
    own (on SQLite a deferred read, which never waits for a writer)."""

    def __init__(self, url: str) -> None:
        self.sqlite: sqlite3.Connection | None = None
        self.engine: sa.Engine | None = None
        if url.startswith("sqlite:///"):
            self.sqlite = sqlite3.connect(url.removeprefix("sqlite:///"), check_same_thread=False)
        else:
            self.engine = create_engine(url, pool_size=1)

    def __call__(self, key: str) -> list[Any]:
        query = "SELECT outcome FROM onceonly_effects WHERE key = :k"
        if self.sqlite is not None:
            return [r[0] for r in self.sqlite.execute(query, {"k": key})]
        assert self.engine is not None
        with self.engine.connect() as conn:
            return list(conn.execute(sa.text(query), {"k": key}).scalars())

    def close(self) -> None:
        if self.sqlite is not None:
            self.sqlite.close()
        if self.engine is not None:
            self.engine.dispose()


def test_each_record_is_committed_before_the_handler_goes_on(database_url: str) -> None:
    """What a worker killed right after ``ctx.effect()`` returned leaves behind:
    read from another connection (another process would see the same), in the
    middle of a batch of 40 whose transaction has not committed."""
    app = make_app(database_url, max_attempts=3)
    outside = Outside(effects_url(database_url))
    seen: dict[tuple[str, int], list[Any]] = {}
    calls: list[str] = []

    @app.handler("stripe")
    def handler(event: Event, ctx: Context) -> None:
        def charge(key: str) -> dict[str, str]:
            calls.append(key)
            return {"charged": event.event_id}

        ctx.effect("charge", charge)
        seen[event.event_id, ctx.attempt] = outside(ctx.effect_key("charge"))
        if event.event_id.endswith("7") and ctx.attempt == 1:
            # The failure mark of this attempt comes after the record.
            raise RuntimeError("fails after the charge")

    ids = [f"evt_{i}" for i in range(40)]
    deliver(database_url, *ids)
    app.worker(concurrency=1, batch_size=40).run_until_idle()
    outside.close()
    assert all(found == [f'{{"charged": "{e}"}}'] for (e, _), found in seen.items()), seen
    assert {e for e, _ in seen} == set(ids)
    # The failed ones were retried and got their recorded outcome back.
    assert sorted(calls) == sorted(effect_key("stripe", e, "charge") for e in ids)
    with app.engine.connect() as conn:
        statuses = conn.execute(sa.text("SELECT DISTINCT status FROM onceonly_events")).all()
    assert statuses == [("processed",)]


def test_records_written_by_an_earlier_version_are_still_read(database_url: str) -> None:
    """Before records had a file of their own on SQLite they lived in the main
    database; a retry after the upgrade must still find them."""
    app = make_app(database_url)
    deliver(database_url, "evt_old")
    with app.engine.begin() as conn:
        (pk,) = conn.execute(sa.text("SELECT id FROM onceonly_events")).one()
        conn.execute(
            sa.text(
                "INSERT INTO onceonly_effects (event_pk, name, key, outcome)"
                " VALUES (:pk, 'charge', :key, '\"ch_old\"')"
            ),
            {"pk": pk, "key": effect_key("stripe", "evt_old", "charge")},
        )
    got: list[Any] = []

    @app.handler("stripe")
    def handler(event: Event, ctx: Context) -> None:
        got.append(ctx.effect("charge", lambda key: "called again"))

    app.worker().run_until_idle()
    assert got == ["ch_old"]


def test_purge_deletes_the_records_of_deleted_events(database_url: str) -> None:
    app = make_app(database_url)

    @app.handler("stripe")
    def handler(event: Event, ctx: Context) -> None:
        ctx.effect("charge", lambda key: 1)
        ctx.effect("email", lambda key: 2)

    deliver(database_url, "evt_old", "evt_new")
    app.worker().run_until_idle()
    old = datetime.now(UTC) - timedelta(days=500)
    value: Any = old if app.engine_kind == "postgresql" else old.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    with app.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE onceonly_events SET received_at = :t WHERE event_id = 'evt_old'"),
            {"t": value},
        )
    assert purge(app, dry_run=True).effects_deleted == 2
    report = purge(app)
    assert (report.events_deleted, report.effects_deleted) == (1, 2)
    with app.effect_ledger.engine.connect() as conn:
        left = conn.execute(sa.text("SELECT key FROM onceonly_effects ORDER BY key")).scalars()
        assert sorted(left) == sorted(
            effect_key("stripe", "evt_new", name) for name in ("charge", "email")
        )
