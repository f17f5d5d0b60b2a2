"""The store adapters against a real SQLite file and a real PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest

from onceonly import EventStatus, NewEvent, create_store
from onceonly.store import migrations
from onceonly.store.engine import create_engine


def event(event_id: str, provider: str = "stripe", body: bytes = b"{}") -> NewEvent:
    return NewEvent(
        provider=provider,
        event_id=event_id,
        event_type="charge.succeeded",
        body=body,
        headers={"stripe-signature": "t=1,v1=ab"},
    )


async def test_migrate_creates_tables_once_and_reports_version(database_url: str) -> None:
    store = create_store(database_url, auto_migrate=False)
    try:
        assert await store.schema_version() == 0
        assert await store.migrate() == [m.version for m in migrations.MIGRATIONS[store.engine]]
        assert await store.migrate() == []
        assert await store.schema_version() == migrations.latest(store.engine)
    finally:
        await store.close()


async def test_concurrent_starters_apply_each_migration_once(database_url: str) -> None:
    stores = [create_store(database_url, auto_migrate=False) for _ in range(5)]
    try:
        applied = await asyncio.gather(*(s.migrate() for s in stores))
        everything = len(migrations.MIGRATIONS[stores[0].engine])
        assert sorted(len(a) for a in applied) == [0, 0, 0, 0, everything]
    finally:
        for s in stores:
            await s.close()


async def test_insert_decides_duplicates_in_the_database(database_url: str) -> None:
    async with create_store(database_url) as store:
        first = await store.insert_events([event("evt_1"), event("evt_2")])
        assert [r.duplicate for r in first] == [False, False]
        assert all(r.id is not None for r in first)
        again = await store.insert_events([event("evt_2"), event("evt_3"), event("evt_3")])
        # evt_2 exists; evt_3 appears twice in one batch: first new, second duplicate.
        assert [r.duplicate for r in again] == [True, False, True]
        # Same event id from another provider is another event.
        other = await store.insert_events([event("evt_1", provider="github")])
        assert [r.duplicate for r in other] == [False]
        assert len(await store.list_events(limit=100)) == 4


async def test_a_batch_past_one_statement_gets_each_receipt_right(database_url: str) -> None:
    # More rows than one statement carries (3,000 on SQLite), old and new
    # mixed, copies in the batch, ids that SQL or a separator could misread.
    async with create_store(database_url) as store:
        old = await store.insert_events([event(f"evt_old_{i}") for i in range(0, 7000, 7)])
        tricky = ["evt a,b", "evt 'q' \"d\"", "evt \u00e9 \u4e2d", "evt ,  ,", "1 2 3"]
        ids = [f"evt_old_{i}" for i in range(7000)] + tricky + tricky[:2]
        receipts = await store.insert_events([event(i) for i in ids])
        was_there = {f"evt_old_{i}" for i in range(0, 7000, 7)}
        expected = [i in was_there for i in ids[:7000]] + [False] * 5 + [True, True]
        assert [r.duplicate for r in receipts] == expected
        # Each receipt names the row its event is in.
        by_id = {e.event_id: e.id for e in await store.list_events(limit=10_000)}
        assert [r.id for r in receipts] == [by_id[i] for i in ids]
        assert [r.id for r in old] == [by_id[f"evt_old_{i}"] for i in range(0, 7000, 7)]
        copy = await store.find_event("stripe", "evt a,b")
        assert copy is not None
        assert copy.duplicates == 1


async def test_raw_bytes_and_headers_are_kept_exactly(database_url: str) -> None:
    raw = b'{"id": "evt_x",  "amount":1.10}\n\x00\xff'
    async with create_store(database_url) as store:
        (receipt,) = await store.insert_events([event("evt_x", body=raw)])
        assert receipt.id is not None
        stored = await store.get_event(receipt.id)
    assert stored is not None
    assert stored.body == raw
    assert stored.headers == {"stripe-signature": "t=1,v1=ab"}
    assert stored.status is EventStatus.PENDING
    assert stored.attempts == 0
    assert stored.received_at.tzinfo is not None


async def test_events_survive_reopening(database_url: str) -> None:
    async with create_store(database_url) as store:
        await store.insert_events([event(f"evt_{i}") for i in range(10)])
    async with create_store(database_url) as store:
        found = await store.find_event("stripe", "evt_7")
        assert found is not None
        assert found.event_id == "evt_7"
        assert await store.find_event("stripe", "evt_missing") is None


async def test_list_filters_and_pages_newest_first(database_url: str) -> None:
    async with create_store(database_url) as store:
        await store.insert_events([event(f"s{i}") for i in range(5)])
        await store.insert_events([event(f"g{i}", provider="github") for i in range(3)])
        github = await store.list_events(provider="github")
        assert [e.event_id for e in github] == ["g2", "g1", "g0"]
        page = await store.list_events(limit=3)
        assert [e.event_id for e in page] == ["g2", "g1", "g0"]
        older = await store.list_events(limit=3, before_id=page[-1].id)
        assert [e.event_id for e in older] == ["s4", "s3", "s2"]
        assert await store.list_events(status=EventStatus.DEAD) == []
        assert len(await store.list_events(status=EventStatus.PENDING, limit=100)) == 8


@pytest.mark.parametrize("writers", [8])
async def test_racing_stores_store_each_event_once(database_url: str, writers: int) -> None:
    """Separate connections racing on the same keys: the unique constraint decides."""
    async with create_store(database_url):
        pass  # migrate once up front
    stores = [create_store(database_url) for _ in range(writers)]
    try:
        keys = [f"evt_{i}" for i in range(50)]
        results = await asyncio.gather(*(s.insert_events([event(k) for k in keys]) for s in stores))
        new_per_key = [sum(not r[i].duplicate for r in results) for i in range(len(keys))]
        assert new_per_key == [1] * len(keys)
        assert len(await stores[0].list_events(limit=1000)) == len(keys)
    finally:
        for s in stores:
            await s.close()


async def test_the_tenant_migration_keeps_events_their_attempts_and_unused_ids(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A deployment that ran before tenants existed: events, an attempt, an
    # effect, and a purged top row (whose id must never come back).
    tenant_version = next(
        m.version for m in migrations.MIGRATIONS[_kind(database_url)] if "tenant" in m.description
    )
    before = {
        kind: tuple(m for m in ms if m.version < tenant_version if kind == _kind(database_url))
        or ms
        for kind, ms in migrations.MIGRATIONS.items()
    }
    monkeypatch.setattr(migrations, "MIGRATIONS", before)
    store = create_store(database_url, auto_migrate=False)
    try:
        await store.migrate()
        engine = create_engine(database_url)
        try:
            empty = "x''" if store.engine == "sqlite" else "''"
            with engine.begin() as conn:
                first, second, third = (
                    conn.exec_driver_sql(
                        "INSERT INTO onceonly_events (provider, event_id, body, headers)"
                        f" VALUES ('stripe', '{name}', {empty}, '{{}}') RETURNING id"
                    ).scalar_one()
                    for name in "abc"
                )
                conn.exec_driver_sql(
                    "INSERT INTO onceonly_attempts (event_pk, attempt, worker, outcome)"
                    f" VALUES ({first}, 1, 'w', 'failed')"
                )
                conn.exec_driver_sql(
                    "INSERT INTO onceonly_effects (event_pk, name, key, outcome)"
                    f" VALUES ({second}, 'charge', 'k', '1')"
                )
                conn.exec_driver_sql(f"DELETE FROM onceonly_events WHERE id = {third}")
            monkeypatch.undo()
            assert await store.migrate() == [
                m.version
                for m in migrations.MIGRATIONS[store.engine]
                if m.version >= tenant_version
            ]
            with engine.begin() as conn:
                attempts = conn.exec_driver_sql("SELECT event_pk FROM onceonly_attempts").all()
                effects = conn.exec_driver_sql("SELECT event_pk FROM onceonly_effects").all()
        finally:
            engine.dispose()
        assert attempts == [(first,)]
        assert effects == [(second,)]
        old = await store.find_event("stripe", "a")
        assert old is not None
        assert old.id == first
        assert old.tenant == ""
        # The same event id for another account is another event; for the
        # same account, a duplicate; new rows never take the purged id.
        again, other = await store.insert_events(
            [event("a"), NewEvent("stripe", "a", None, b"{}", {}, tenant="acme")]
        )
        assert again.duplicate
        assert again.id == first
        assert not other.duplicate
        assert other.id is not None
        assert other.id > third
        found = await store.find_event("stripe", "a", tenant="acme")
        assert found is not None
        assert found.tenant == "acme"
    finally:
        await store.close()


def _kind(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgresql"


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
async def test_batches_share_a_few_connections_of_their_own_and_survive_a_cut(
    database_url: str,
) -> None:
    """Deliveries are inserted on connections of their own, never more at once
    than the batches the inbox keeps in flight, and reused from batch to
    batch. A connection cut under them (a restart, a proxy) fails at most the
    batch on it, as unavailable (a 503, so the sender retries); the next
    batch gets a new one."""
    import asyncpg

    from onceonly import StoreUnavailable

    store = create_store(database_url)
    admin = await asyncpg.connect(database_url)

    async def inserting_backends() -> set[int]:
        rows = await admin.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND query LIKE '%INSERT INTO onceonly_events%'"
        )
        return {row["pid"] for row in rows}

    try:
        for round_ in range(5):
            batches = [[event(f"evt_{round_}_{b}_{n}") for n in range(3)] for b in range(6)]
            receipts = await asyncio.gather(*(store.insert_events(b) for b in batches))
            assert all(not r.duplicate for batch in receipts for r in batch)
        used = await inserting_backends()
        assert 1 <= len(used) <= store.commit_concurrency
        cut = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE pid = ANY($1::int[])",
            list(used),
        )
        assert cut == len(used)
        await asyncio.sleep(0.1)
        # Whether the client has seen the cut yet is a race: if it has, this
        # batch already goes through on a new connection.
        try:
            (maybe,) = await store.insert_events([event("evt_after_cut_1")])
        except StoreUnavailable:
            maybe = None
        (after,) = await store.insert_events([event("evt_after_cut_2")])
        assert not after.duplicate
        if maybe is not None:
            assert not maybe.duplicate
        assert not (await inserting_backends()) & used
        assert len(await store.list_events(limit=200)) == 90 + 1 + (maybe is not None)
    finally:
        await admin.close()
        await store.close()


async def test_the_inbox_commits_no_more_than_the_stores_batch(database_url: str) -> None:
    """Concurrent deliveries share commits, never more than the store's
    ``commit_batch`` in one. On PostgreSQL a batch takes 16 (the store's
    ``commit_share``) or half of those waiting: 40 go in at least three
    batches, one verified while another commits."""
    from onceonly.events import Delivery
    from onceonly.inbox import Inbox
    from onceonly.providers import Stripe
    from support import STRIPE_SECRET, stripe_delivery

    store = create_store(database_url)
    inbox = Inbox(store, {"stripe": Stripe(STRIPE_SECRET)})
    deliveries = [stripe_delivery(f"evt_batch_{n}") for n in range(40)]
    try:
        receipts = await asyncio.gather(
            *(inbox.receive(Delivery("stripe", body, headers)) for body, headers in deliveries)
        )
        assert len({r.id for r in receipts}) == 40
        assert inbox.commits.items == 40
        assert inbox.commits.batches >= -(-40 // store.commit_batch)
        if store.engine == "postgresql":
            assert store.commit_share == 16
            assert inbox.commits.batches >= 3
    finally:
        await store.close()
