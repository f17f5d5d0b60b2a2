"""The middleware's in-memory cache of replayable responses."""

from __future__ import annotations

import gc

from onceonly.idempotency.policy import _ResponseCache
from onceonly.idempotency.records import StoredResponse


def response(body: bytes = b'{"id": 1}', status: int = 201) -> StoredResponse:
    return StoredResponse(status, (("content-type", "application/json"),), body)


def test_a_cached_response_replays_with_its_headers_and_the_replay_mark() -> None:
    cache = _ResponseCache(1024 * 1024)
    cache.put(("client", "k"), "fp", response(), expires=100.0)
    hit = cache.get(("client", "k"), now=50.0)
    assert hit is not None
    assert (hit.fingerprint, hit.status, hit.body) == ("fp", 201, b'{"id": 1}')
    pairs = list(zip(hit.headers[::2], hit.headers[1::2], strict=True))
    assert pairs == [
        (b"content-type", b"application/json"),
        (b"idempotent-replayed", b"true"),
        (b"content-length", b"9"),
    ]
    assert cache.get(("other", "k"), now=50.0) is None


def test_an_expired_response_is_not_replayed_and_frees_its_room() -> None:
    cache = _ResponseCache(1024 * 1024)
    cache.put(("client", "k"), "fp", response(), expires=100.0)
    assert cache.get(("client", "k"), now=100.0) is None
    assert cache.size == 0


def test_memory_stays_bounded_and_the_least_recently_replayed_goes_first() -> None:
    body = b"x" * 744  # 1,000 bytes counted with the per-entry overhead
    cache = _ResponseCache(3000)
    for name in ("a", "b", "c"):
        cache.put(("client", name), "fp", response(body), expires=100.0)
    assert cache.get(("client", "a"), now=1.0) is not None  # "a" is now the most recent
    cache.put(("client", "d"), "fp", response(body), expires=100.0)
    assert cache.size <= 3000
    assert cache.get(("client", "b"), now=1.0) is None
    assert all(cache.get(("client", n), now=1.0) for n in ("a", "c", "d"))


def test_streamed_too_large_or_disabled_responses_are_not_cached() -> None:
    chunked = StoredResponse(200, (), None)
    cache = _ResponseCache(1000)
    cache.put(("c", "chunked"), "fp", chunked, expires=100.0)
    cache.put(("c", "large"), "fp", response(b"x" * 1000), expires=100.0)
    disabled = _ResponseCache(0)
    disabled.put(("c", "k"), "fp", response(), expires=100.0)
    assert cache.get(("c", "chunked"), now=1.0) is None
    assert cache.get(("c", "large"), now=1.0) is None
    assert disabled.get(("c", "k"), now=1.0) is None


def test_entries_are_not_left_for_the_garbage_collector_to_traverse() -> None:
    # Tens of thousands of tracked entries made every full collection a pause
    # of tens of milliseconds under load (see _ResponseCache).
    cache = _ResponseCache(10 * 1024 * 1024)
    for i in range(1000):
        cache.put(("client", f"k{i}"), "fp", response(), expires=100.0)
    gc.collect()
    tracked = [ident for ident, entry in cache._entries.items() if gc.is_tracked(entry)]
    assert tracked == []
