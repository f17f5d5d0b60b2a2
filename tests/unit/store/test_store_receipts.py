"""How a batch with repeated keys is collapsed for one statement, and how the
returned counters become receipts; and retention durations."""

from __future__ import annotations

from datetime import timedelta

import pytest

from onceonly import ConfigurationError, NewEvent
from onceonly.retention import duration
from onceonly.store.base import collapse, receipts
from onceonly.store.memory import MemoryStore


def event(event_id: str, provider: str = "stripe") -> NewEvent:
    return NewEvent(provider=provider, event_id=event_id, event_type=None, body=b"", headers={})


def test_repeated_keys_are_sent_once_with_their_extra_count() -> None:
    batch = [event("a"), event("b"), event("a"), event("a", provider="github"), event("a")]
    unique, extra = collapse(batch)
    assert [(e.provider, e.event_id) for e in unique] == [
        ("stripe", "a"),
        ("stripe", "b"),
        ("github", "a"),
    ]
    assert extra == {("stripe", "", "a"): 2}


def test_the_same_event_id_for_two_tenants_is_two_events() -> None:
    batch = [event("a"), NewEvent("stripe", "a", None, b"{}", {}, tenant="acme"), event("a")]
    unique, extra = collapse(batch)
    assert [(e.tenant, e.event_id) for e in unique] == [("", "a"), ("acme", "a")]
    assert extra == {("stripe", "", "a"): 1}


def test_returned_counter_tells_new_rows_from_old_ones() -> None:
    batch = [event("new"), event("old"), event("new"), event("copied-old"), event("copied-old")]
    _, extra = collapse(batch)
    returned = {
        ("stripe", "", "new"): (1, 1),  # inserted now, carrying its one copy
        ("stripe", "", "old"): (2, 3),  # was there: 2 earlier duplicates + this one
        ("stripe", "", "copied-old"): (3, 2),  # was there with 0: 1 + 1 copy
    }
    got = receipts(batch, returned, extra)
    assert [r.duplicate for r in got] == [False, True, True, True, True]
    assert [r.id for r in got] == [1, 2, 1, 3, 3]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("90m", timedelta(minutes=90)),
        ("45s", timedelta(seconds=45)),
        ("2w", timedelta(weeks=2)),
        ("1.5d", timedelta(hours=36)),
        ("0d", timedelta(0)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert duration(text) == expected


@pytest.mark.parametrize("text", ["30", "30 days", "d", "-1d", "1y", ""])
def test_bad_durations_say_what_is_expected(text: str) -> None:
    with pytest.raises(ConfigurationError, match=r"not a duration.*30d"):
        duration(text, "--older-than")


async def test_memory_double_counts_like_the_databases() -> None:
    store = MemoryStore()
    receipts = await store.insert_events([event("a"), event("a"), event("b")])
    assert [r.duplicate for r in receipts] == [False, True, False]
    await store.insert_events([event("a")])
    found = await store.find_event("stripe", "a")
    assert found is not None
    assert found.duplicates == 2
    assert found.last_duplicate_at is not None
