"""The Idempotency-Key store port's contract, on every store that keeps one:
the in-memory double (``MemoryStore``, for users' unit tests), SQLite and
PostgreSQL. Each operation of ``onceonly.store.idempotency.KeyStore`` is held
to the same answers, reached only through ``Store.idempotency_keys()``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from onceonly import ConfigurationError, StoreError, StoreUnavailable, create_store
from onceonly.store import Store
from onceonly.store.idempotency import Completion, KeyClaim, KeyStore, StoredResponse
from onceonly.store.memory import MemoryStore
from support import ENGINES

NOW = 1_800_000_000.0
OK = StoredResponse(201, (("content-type", "application/json"), ("x-n", "1")), b'{"id": 1}')
CHUNKED = StoredResponse(200, (("content-type", "text/plain"),), None)


@pytest.fixture(params=["memory", *ENGINES])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(kind: str, request: pytest.FixtureRequest) -> str | None:
    """conftest's database_url for `engine` below; None for the memory double."""
    return None if kind == "memory" else str(request.getfixturevalue("database_url"))


@pytest.fixture
def engine(kind: str) -> str:
    """Overrides conftest's: the engine ``database_url`` is made for."""
    return kind


@pytest.fixture
async def store(url: str | None) -> AsyncIterator[Store]:
    opened: Store = MemoryStore() if url is None else create_store(url)
    async with opened:
        yield opened


@pytest.fixture
def keys(store: Store) -> KeyStore:
    return store.idempotency_keys()


async def claim(
    keys: KeyStore, key: str, fp: str = "fp", *, now: float = NOW, lock: float = 10, ttl: float = 99
) -> tuple[str, int, str]:
    (outcome,) = await keys.claim([KeyClaim("c", key, fp)], now=now, lock_seconds=lock, ttl=ttl)
    return outcome.state, outcome.fence, outcome.fingerprint


async def test_one_key_store_per_store(store: Store) -> None:
    assert store.idempotency_keys() is store.idempotency_keys()


async def test_a_new_key_is_claimed_and_its_repeat_is_in_flight(keys: KeyStore) -> None:
    assert await claim(keys, "k") == ("acquired", 1, "fp")
    # The same request again while the first runs (the middleware's 409), and
    # another request under the same key: both see it running.
    assert await claim(keys, "k", now=NOW + 1) == ("running", 1, "fp")
    assert await claim(keys, "k", "other-fp", now=NOW + 1) == ("running", 1, "fp")


async def test_a_completed_key_is_replayed(keys: KeyStore) -> None:
    await claim(keys, "k", ttl=99)
    assert await keys.complete([Completion("c", "k", 1, OK)], now=NOW + 1) == [True]
    (replay,) = await keys.claim([KeyClaim("c", "k", "fp")], now=NOW + 2, lock_seconds=10, ttl=50)
    assert (replay.state, replay.fence, replay.response) == ("done", 1, OK)
    assert replay.expires_at == NOW + 99  # the record's own expiry, not the new ttl
    (reused,) = await keys.claim([KeyClaim("c", "k", "fp-2")], now=NOW + 2, lock_seconds=10, ttl=50)
    assert (reused.state, reused.fingerprint) == ("done", "fp")  # the middleware's 422


async def test_keys_are_scoped(keys: KeyStore) -> None:
    outcomes = await keys.claim(
        [KeyClaim("alice", "k", "fp"), KeyClaim("bob", "k", "fp")],
        now=NOW,
        lock_seconds=10,
        ttl=100,
    )
    assert [o.state for o in outcomes] == ["acquired", "acquired"]


async def test_an_expired_record_is_taken_over_with_a_new_fence(keys: KeyStore) -> None:
    await claim(keys, "k", ttl=2)
    await keys.complete([Completion("c", "k", 1, OK)], now=NOW)
    assert await claim(keys, "k", "new-fp", now=NOW + 3) == ("acquired", 2, "new-fp")


async def test_an_abandoned_claim_is_taken_over_by_the_same_request_only(keys: KeyStore) -> None:
    await claim(keys, "k", lock=1)
    # The lock ran out (the first request crashed): another request waits...
    assert await claim(keys, "k", "other-fp", now=NOW + 2) == ("running", 1, "fp")
    # ...the same request retried takes it over.
    assert await claim(keys, "k", now=NOW + 2) == ("acquired", 2, "fp")


async def test_a_completion_lands_only_for_the_current_owner(keys: KeyStore) -> None:
    await claim(keys, "k", lock=1)
    await claim(keys, "k", now=NOW + 2)  # taken over: fence 2
    landed = await keys.complete(
        [Completion("c", "k", 1, OK), Completion("c", "never-claimed", 1, OK)], now=NOW + 3
    )
    assert landed == [False, False]
    assert await keys.complete([Completion("c", "k", 2, OK)], now=NOW + 3) == [True]
    # Done is done: a second completion of the same claim does not land.
    assert await keys.complete([Completion("c", "k", 2, OK)], now=NOW + 4) == [False]


async def test_in_one_batch_the_current_owner_lands_and_a_stale_one_does_not(
    keys: KeyStore,
) -> None:
    await claim(keys, "fresh")
    await claim(keys, "taken", lock=1)
    await claim(keys, "taken", now=NOW + 2)  # taken over: fence 2
    landed = await keys.complete(
        [Completion("c", "taken", 1, OK), Completion("c", "fresh", 1, OK)], now=NOW + 3
    )
    assert landed == [False, True]
    assert await claim(keys, "fresh", now=NOW + 4) == ("done", 1, "fp")
    assert await claim(keys, "taken", now=NOW + 4) == ("running", 2, "fp")


async def test_a_batch_completes_then_claims(keys: KeyStore) -> None:
    await claim(keys, "a")
    landed, outcomes = await keys.apply(
        [Completion("c", "a", 1, OK)],
        [KeyClaim("c", "a", "fp"), KeyClaim("c", "new", "fp"), KeyClaim("c", "new", "fp")],
        now=NOW + 1,
        lock_seconds=10,
        ttl=100,
    )
    assert landed == [True]
    assert [(o.state, o.fence) for o in outcomes] == [("done", 1), ("acquired", 1), ("running", 1)]
    assert outcomes[0].response == OK


async def test_new_and_known_keys_mixed_in_batches_are_each_claimed_once(keys: KeyStore) -> None:
    # SQLite claims a batch of new keys with one insert and, when a key of
    # the batch turns out to have a record, undoes it and reads first: every
    # way through gives the same answers, and no key is claimed twice.
    assert await claim(keys, "known") == ("acquired", 1, "fp")
    mixed = await keys.claim(
        [KeyClaim("c", "new-1", "fp"), KeyClaim("c", "known", "fp"), KeyClaim("c", "new-2", "fp")],
        now=NOW + 1,
        lock_seconds=10,
        ttl=100,
    )
    assert [(o.state, o.fence) for o in mixed] == [("acquired", 1), ("running", 1), ("acquired", 1)]
    # The keys the undone insert had written were claimed by the read's way,
    # once: asked again, they are in flight.
    again = await keys.claim(
        [KeyClaim("c", "new-1", "fp"), KeyClaim("c", "new-2", "fp")],
        now=NOW + 2,
        lock_seconds=10,
        ttl=100,
    )
    assert [(o.state, o.fence) for o in again] == [("running", 1), ("running", 1)]
    # After batches of known keys, new ones are claimed, and then new ones again.
    for n in range(2):
        batch = [KeyClaim("c", f"later-{n}-{i}", "fp") for i in range(3)]
        outcomes = await keys.claim(batch, now=NOW + 3, lock_seconds=10, ttl=100)
        assert [(o.state, o.fence) for o in outcomes] == [("acquired", 1)] * 3


async def test_a_new_key_twice_in_one_batch_is_claimed_by_the_first_only(
    keys: KeyStore,
) -> None:
    # Every key of the batch is new (SQLite's quickest way), but one comes
    # twice: its second claim sees the first's, in flight.
    batch = [KeyClaim("c", "a", "fp-1"), KeyClaim("c", "b", "fp"), KeyClaim("c", "a", "fp-2")]
    outcomes = await keys.claim(batch, now=NOW, lock_seconds=10, ttl=100)
    assert [(o.state, o.fence, o.fingerprint) for o in outcomes] == [
        ("acquired", 1, "fp-1"),
        ("acquired", 1, "fp"),
        ("running", 1, "fp-1"),
    ]
    # Completed, each replays what was stored for it.
    done = [Completion("c", "a", 1, OK), Completion("c", "b", 1, CHUNKED)]
    assert await keys.complete(done, now=NOW + 1) == [True, True]
    replays = await keys.claim(batch[:2], now=NOW + 2, lock_seconds=10, ttl=100)
    assert [(o.state, o.response) for o in replays] == [("done", OK), ("done", CHUNKED)]


async def test_a_release_forgets_only_its_own_claim(keys: KeyStore) -> None:
    await claim(keys, "k")
    await keys.release("c", "k", 2)  # not the owner's fence: nothing happens
    assert await claim(keys, "k", now=NOW + 1) == ("running", 1, "fp")
    await keys.release("c", "k", 1)
    assert await claim(keys, "k", now=NOW + 1) == ("acquired", 1, "fp")
    await keys.complete([Completion("c", "k", 1, OK)], now=NOW + 1)
    await keys.release("c", "k", 1)  # a stored response is not released
    assert (await claim(keys, "k", now=NOW + 2))[0] == "done"


async def test_chunks_are_appended_and_read_in_order(keys: KeyStore) -> None:
    await claim(keys, "big")
    await keys.append_chunks("c", "big", 1, 0, [b"zero", b"one"])
    await keys.append_chunks("c", "big", 1, 2, [b"two", b"\x00\xff"])
    assert await keys.complete([Completion("c", "big", 1, CHUNKED)], now=NOW) == [True]
    (replay,) = await keys.claim([KeyClaim("c", "big", "fp")], now=NOW, lock_seconds=10, ttl=100)
    assert replay.response == CHUNKED
    assert replay.response is not None
    assert replay.response.chunked
    assert await keys.read_chunks("c", "big", 1, 0, 10) == [b"zero", b"one", b"two", b"\x00\xff"]
    assert await keys.read_chunks("c", "big", 1, 1, 2) == [b"one", b"two"]
    assert await keys.read_chunks("c", "big", 1, 4, 10) == []
    assert await keys.read_chunks("c", "big", 2, 0, 10) == []  # another owner's


async def test_a_take_over_completed_drops_the_earlier_owners_chunks(keys: KeyStore) -> None:
    await claim(keys, "big", lock=1)
    await keys.append_chunks("c", "big", 1, 0, [b"old"])
    await claim(keys, "big", now=NOW + 2)  # the first owner crashed: fence 2
    await keys.append_chunks("c", "big", 2, 0, [b"new"])
    assert await keys.complete([Completion("c", "big", 2, CHUNKED)], now=NOW + 3) == [True]
    assert await keys.read_chunks("c", "big", 2, 0, 10) == [b"new"]
    assert await keys.read_chunks("c", "big", 1, 0, 10) == []


async def test_purge_drops_expired_records_and_their_chunks(keys: KeyStore) -> None:
    await claim(keys, "old", ttl=1)
    await keys.append_chunks("c", "old", 1, 0, [b"a", b"b"])
    await keys.complete([Completion("c", "old", 1, CHUNKED)], now=NOW)
    await claim(keys, "young", ttl=100)
    assert await keys.purge(now=NOW + 0.5) == 0
    assert await keys.purge(now=NOW + 2) == 1
    assert await keys.read_chunks("c", "old", 1, 0, 10) == []
    assert await claim(keys, "old", now=NOW + 2) == ("acquired", 1, "fp")
    assert await claim(keys, "young", now=NOW + 2) == ("running", 1, "fp")


async def test_a_refused_write_is_a_store_error_not_a_driver_error(keys: KeyStore) -> None:
    # No record for these chunks (the foreign key), then the same chunk twice
    # (the primary key): onceonly's error, whatever the engine.
    with pytest.raises(StoreError) as no_record:
        await keys.append_chunks("c", "nobody", 1, 0, [b"x"])
    await claim(keys, "k")
    await keys.append_chunks("c", "k", 1, 0, [b"x"])
    with pytest.raises(StoreError) as twice:
        await keys.append_chunks("c", "k", 1, 0, [b"x"])
    for raised in (no_record, twice):
        assert type(raised.value).__module__ == "onceonly._exceptions"
    # The failed transaction left nothing open: the next batch goes through.
    assert await claim(keys, "after") == ("acquired", 1, "fp")


async def test_the_memory_key_store_follows_its_stores_outage_switch() -> None:
    store = MemoryStore()
    keys = store.idempotency_keys()
    store.unavailable = True
    with pytest.raises(StoreUnavailable):
        await claim(keys, "k")
    store.unavailable = False
    assert await claim(keys, "k") == ("acquired", 1, "fp")


def test_a_store_without_key_store_says_so() -> None:
    # The port's default, for a user's own Store that keeps no records.
    with pytest.raises(ConfigurationError, match="keeps no Idempotency-Key records"):
        Store.idempotency_keys(MemoryStore())


async def test_on_sqlite_replays_write_nothing_whichever_way_they_are_claimed(
    tmp_path: Path,
) -> None:
    # The SQLite key store tries the insert first after a batch of new keys,
    # and reads first after a batch with known ones (see its module). Either
    # way, a batch that only meets records writes nothing: no WAL frame to
    # write and sync for a replay.
    from onceonly.store.idempotency_sqlite import SQLiteKeyStore

    path = tmp_path / "keys.db"
    async with create_store(f"sqlite:///{path}") as store:
        keys = store.idempotency_keys()
        assert isinstance(keys, SQLiteKeyStore)
        assert await claim(keys, "a") == ("acquired", 1, "fp")
        await keys.complete([Completion("c", "a", 1, OK)], now=NOW)
        wal = path.with_name(path.name + "-wal")
        size = wal.stat().st_size
        assert keys.expect_new  # the last claims were all new
        assert await claim(keys, "a", now=NOW + 1) == ("done", 1, "fp")  # the insert first
        assert not keys.expect_new
        assert await claim(keys, "a", now=NOW + 2) == ("done", 1, "fp")  # the read first
        assert wal.stat().st_size == size
        # A batch of new keys read first turns the store back to the insert.
        assert await claim(keys, "b", now=NOW + 3) == ("acquired", 1, "fp")
        assert keys.expect_new
