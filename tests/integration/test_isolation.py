"""One hostile delivery changes nothing for any other delivery.

Signed deliveries whose event id no database stores faithfully (a NUL, a lone
surrogate, thousands of digits) are mixed into hundreds of genuine ones sent
at the same moment, over real HTTP, on a real SQLite file and a real
PostgreSQL. The genuine ones all get 200 and are stored; the poison gets a 400
problem document and leaves nothing behind; on SQLite no transaction is left
holding the write lock.

Below the receiver's own checks, the group commit is tried with values that
reach the database: a batch the database refuses is retried item by item, so
only the refused item fails.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence

import httpx
import pytest

from onceonly import Onceonly, StoreRejected, create_store
from onceonly.batching import GroupCommit
from onceonly.events import NewEvent, Receipt
from onceonly.providers import Stripe
from support import STRIPE_SECRET, live_server, signed, stripe_delivery

GENUINE = 400
STRIPE = Stripe(STRIPE_SECRET)


#: Each with an id that no engine stores as sent; signed when sent (a
#: signature made at import would be past Stripe's tolerance minutes later).
POISON = {
    "nul": b'{"id": "evt_\\u0000x", "type": "charge.succeeded"}',
    "lone surrogate": b'{"id": "evt_\\ud800", "type": "charge.succeeded"}',
    "3000 digits": b'{"id": ' + b"9" * 3000 + b', "type": "charge.succeeded"}',
    "nul in type": b'{"id": "evt_type_nul", "type": "charge.\\u0000"}',
    "long string": json.dumps({"id": "e" * 5000, "type": "x"}).encode(),
}


@pytest.fixture
def server(database_url: str) -> Iterator[str]:
    app = Onceonly(database_url=database_url, providers={"stripe": STRIPE}, environ={})
    with live_server(app.asgi()) as url:
        yield url


def sqlite_path(database_url: str) -> str:
    return database_url.removeprefix("sqlite:///")


def write_lock_taken_by_another_process(path: str) -> bool:
    """Another process takes SQLite's write lock at once (no waiting allowed)."""
    script = (
        "import sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE'); c.execute('ROLLBACK')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, path], capture_output=True, text=True, timeout=30
    )
    return result.returncode == 0


async def stored_ids(database_url: str) -> list[str]:
    async with create_store(database_url) as store:
        return [e.event_id for e in await store.list_events(limit=100_000)]


@pytest.mark.parametrize("poison", sorted(POISON))
async def test_a_poison_delivery_among_400_genuine_ones_hurts_none_of_them(
    poison: str, server: str, database_url: str, engine: str
) -> None:
    genuine = [stripe_delivery(f"evt_genuine_{n}") for n in range(GENUINE)]
    bad_body, bad_headers = signed(POISON[poison])
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64), timeout=30) as client:

        async def post(body: bytes, headers: dict[str, str]) -> httpx.Response:
            return await client.post(f"{server}/webhooks/stripe", content=body, headers=headers)

        # The poison goes out in the middle of the genuine ones, several times.
        sends = [post(b, h) for b, h in genuine]
        for at in (0, GENUINE // 2, GENUINE - 1):
            sends.insert(at, post(bad_body, bad_headers))
        responses = await asyncio.gather(*sends)

    poisoned = [r for r in responses if r.request.content == bad_body]
    answered = [r for r in responses if r.request.content != bad_body]
    assert [r.status_code for r in answered] == [200] * GENUINE
    assert {r.status_code for r in poisoned} == {400}
    for refused in poisoned:
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["status"] == 400
    ids = await stored_ids(database_url)
    assert sorted(ids) == sorted(f"evt_genuine_{n}" for n in range(GENUINE))
    if engine == "sqlite":
        assert write_lock_taken_by_another_process(sqlite_path(database_url))


class Recording:
    """The store's insert, with the size of every batch it was given."""

    def __init__(self, insert: Callable[[Sequence[NewEvent]], Awaitable[list[Receipt]]]) -> None:
        self.insert = insert
        self.sizes: list[int] = []

    async def __call__(self, events: Sequence[NewEvent]) -> list[Receipt]:
        self.sizes.append(len(events))
        return await self.insert(events)


def event(event_id: str, **headers: str) -> NewEvent:
    return NewEvent("stripe", event_id, "charge.succeeded", b"{}", headers)


@pytest.mark.parametrize(
    ("poison", "refused_by"),
    [
        pytest.param(event("evt_\ud800"), {"sqlite", "postgresql"}, id="lone surrogate in the id"),
        # SQLite keeps a NUL in text (the receiver refuses it before any batch).
        pytest.param(event("evt_nul\x00"), {"postgresql"}, id="NUL in the id"),
        pytest.param(
            event("evt_header", **{"x-note": "\x00"}), {"postgresql"}, id="NUL in a header"
        ),
    ],
)
async def test_a_batch_the_database_refuses_is_retried_item_by_item(
    poison: NewEvent, refused_by: set[str], database_url: str, engine: str
) -> None:
    async with create_store(database_url) as store:
        recording = Recording(store.insert_events)
        commits: GroupCommit[NewEvent, Receipt] = GroupCommit(recording, max_in_flight=1)
        good = [event(f"evt_good_{n}") for n in range(60)]
        items = [*good[:30], poison, *good[30:]]
        results = await asyncio.gather(
            *(commits.submit(item) for item in items), return_exceptions=True
        )
        stored = {e.event_id for e in await store.list_events(limit=1000)}

    refused = results[30]
    if engine not in refused_by:
        # This engine stores the value as it is, in the same batch as the rest.
        assert all(isinstance(r, Receipt) for r in results), results
        assert stored == {e.event_id for e in items}
        return
    assert isinstance(refused, StoreRejected), refused
    assert all(isinstance(r, Receipt) and not r.duplicate for r in results[:30] + results[31:])
    assert stored == {e.event_id for e in good}
    # The poison shared a transaction with genuine events (the test would
    # prove nothing otherwise), and that transaction was tried again per item.
    assert max(recording.sizes) > 1
    assert recording.sizes.count(1) >= 1
    if engine == "sqlite":
        assert write_lock_taken_by_another_process(sqlite_path(database_url))
