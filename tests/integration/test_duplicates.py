"""Duplicates remembered by the database: counted by the inserting statement itself."""

from __future__ import annotations

import asyncio

from onceonly import NewEvent, create_store


def event(event_id: str, provider: str = "stripe") -> NewEvent:
    return NewEvent(
        provider=provider, event_id=event_id, event_type="charge.succeeded", body=b"{}", headers={}
    )


async def test_duplicates_are_counted_on_the_stored_row(database_url: str) -> None:
    async with create_store(database_url) as store:
        (first,) = await store.insert_events([event("evt_1")])
        stored = await store.find_event("stripe", "evt_1")
        assert stored is not None
        assert (stored.duplicates, stored.last_duplicate_at) == (0, None)

        again = await store.insert_events([event("evt_1")])
        assert again[0].duplicate
        assert again[0].id == first.id  # the statement that counted it named the row
        once_more = await store.insert_events([event("evt_1"), event("evt_2")])
        assert [r.duplicate for r in once_more] == [True, False]

        stored = await store.find_event("stripe", "evt_1")
        assert stored is not None
        assert stored.duplicates == 2
        assert stored.last_duplicate_at is not None
        assert stored.last_duplicate_at >= stored.received_at
        fresh = await store.find_event("stripe", "evt_2")
        assert fresh is not None
        assert fresh.duplicates == 0


async def test_copies_inside_one_batch_are_counted_too(database_url: str) -> None:
    """PostgreSQL cannot update one row twice in a statement: the store collapses
    the copies and adds their count, for new and for existing rows alike."""
    async with create_store(database_url) as store:
        await store.insert_events([event("old")])
        batch = [event("new"), event("old"), event("new"), event("old"), event("new")]
        receipts = await store.insert_events(batch)
        assert [r.duplicate for r in receipts] == [False, True, True, True, True]
        assert receipts[0].id == receipts[2].id == receipts[4].id
        new = await store.find_event("stripe", "new")
        old = await store.find_event("stripe", "old")
        assert new is not None
        assert old is not None
        assert (new.duplicates, old.duplicates) == (2, 2)
        assert new.last_duplicate_at is not None
        assert len(await store.list_events(limit=10)) == 2


async def test_concurrent_batches_count_every_copy(database_url: str) -> None:
    """Separate connections inserting the same keys in different orders: every
    delivery is either the one new row or one counted duplicate, and no batch
    fails (on PostgreSQL a lock-order deadlock would surface as an error)."""
    async with create_store(database_url):
        pass
    stores = [create_store(database_url) for _ in range(6)]
    keys = [f"evt_{i}" for i in range(40)]
    try:
        results = await asyncio.gather(
            *(
                s.insert_events([event(k) for k in (keys if n % 2 else keys[::-1])])
                for n, s in enumerate(stores)
            )
        )
        assert sum(not r.duplicate for batch in results for r in batch) == len(keys)
        stored = await stores[0].list_events(limit=100)
        assert sorted(e.duplicates for e in stored) == [len(stores) - 1] * len(keys)
    finally:
        for s in stores:
            await s.close()
