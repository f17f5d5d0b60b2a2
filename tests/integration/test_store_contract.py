"""The store port's contract, on every implementation: the in-memory double
(which the unit tests of the inbox and the receiver trust), SQLite and
PostgreSQL. Each operation of ``onceonly.store.base.Store`` is held to the
same answers, so the double cannot drift from what the databases do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from onceonly import EventStatus, NewEvent, create_store
from onceonly.store import Store
from onceonly.store.memory import MemoryStore
from support import ENGINES


@pytest.fixture(params=["memory", *ENGINES])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(kind: str, request: pytest.FixtureRequest) -> str | None:
    """conftest's database_url for `engine` below (a fresh file or database);
    None for the memory double."""
    return None if kind == "memory" else str(request.getfixturevalue("database_url"))


@pytest.fixture
async def store(url: str | None) -> AsyncIterator[Store]:
    opened: Store = MemoryStore() if url is None else create_store(url)
    async with opened:
        yield opened


@pytest.fixture
def engine(kind: str) -> str:
    """Overrides conftest's: the engine ``database_url`` is made for."""
    return kind


def new(event_id: str, provider: str = "stripe", body: bytes = b"{}") -> NewEvent:
    return NewEvent(provider, event_id, "charge.succeeded", body, {"x-test": event_id})


async def test_a_new_event_and_its_duplicates(store: Store) -> None:
    first = await store.insert_events([new("evt_a"), new("evt_b")])
    assert [r.duplicate for r in first] == [False, False]
    again = await store.insert_events([new("evt_b"), new("evt_c"), new("evt_c")])
    assert [r.duplicate for r in again] == [True, False, True]
    # A duplicate's receipt names the row already there.
    assert again[0].id == first[1].id
    assert again[2].id == again[1].id
    # The same id from another provider is another event.
    other = await store.insert_events([new("evt_a", provider="github")])
    assert other[0].duplicate is False
    assert other[0].id != first[0].id
    stored = await store.find_event("stripe", "evt_b")
    assert stored is not None
    assert stored.duplicates == 1


async def test_what_is_stored_is_what_arrived(store: Store) -> None:
    raw = b'{"id": "evt_x",  "amount":1.10}\n\x00\xff'
    (receipt,) = await store.insert_events([new("evt_x", body=raw)])
    assert receipt.id is not None
    got = await store.get_event(receipt.id)
    assert got is not None
    assert (got.body, got.headers, got.event_type) == (raw, {"x-test": "evt_x"}, "charge.succeeded")
    assert got.status is EventStatus.PENDING
    assert got.attempts == 0
    assert got.received_at.tzinfo is not None


async def test_lookups_of_what_is_not_there(store: Store) -> None:
    assert await store.get_event(10**9) is None
    assert await store.find_event("stripe", "evt_never") is None
    assert await store.list_events() == []


async def test_listing_filters_and_pages_newest_first(store: Store) -> None:
    # One delivery at a time: within one batch, PostgreSQL numbers the rows in
    # no promised order (they arrived together), so newest-first is between
    # batches.
    providers = ("stripe", "asaas")
    for i in range(7):
        await store.insert_events([new(f"evt_{i}", provider=providers[i % 2])])
    everything = await store.list_events(limit=100)
    assert [e.event_id for e in everything] == [f"evt_{i}" for i in reversed(range(7))]
    stripe = await store.list_events(provider="stripe", limit=100)
    assert {e.provider for e in stripe} == {"stripe"}
    assert len(stripe) == 4
    page = await store.list_events(limit=3)
    rest = await store.list_events(limit=100, before_id=page[-1].id)
    assert [e.id for e in page + rest] == [e.id for e in everything]
    assert await store.list_events(status=EventStatus.PROCESSED) == []
    assert len(await store.list_events(status=EventStatus.PENDING, limit=100)) == 7


async def test_migrating_again_changes_nothing(store: Store) -> None:
    version = await store.schema_version()
    assert version > 0
    assert await store.migrate() == []
    assert await store.schema_version() == version
