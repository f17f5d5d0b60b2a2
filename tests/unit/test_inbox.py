"""Group commit and the inbox, on the in-memory store double."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import pytest

from onceonly import (
    Delivery,
    Inbox,
    NewEvent,
    PayloadError,
    Receipt,
    SignatureError,
    StoreUnavailable,
    UnknownProvider,
)
from onceonly.inbox import GroupCommit
from onceonly.providers import Stripe
from onceonly.store.memory import MemoryStore
from support import STRIPE_SECRET, stripe_delivery


class SlowStore(MemoryStore):
    """A commit takes a while, as an fsync or a round trip does."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_sizes: list[int] = []

    async def insert_events(self, events: Sequence[NewEvent]) -> list[Receipt]:
        self.batch_sizes.append(len(events))
        await asyncio.sleep(0.01)
        return await super().insert_events(events)


def new_event(event_id: str) -> NewEvent:
    return NewEvent("stripe", event_id, None, b"{}", {})


async def test_deliveries_arriving_during_a_commit_share_the_next_one() -> None:
    store = SlowStore()
    commits = GroupCommit(store.insert_events)
    first = asyncio.create_task(commits.submit(new_event("e0")))
    while not store.batch_sizes:  # until the first commit is in flight
        await asyncio.sleep(0)
    later = await asyncio.gather(*(commits.submit(new_event(f"e{i}")) for i in range(1, 50)))
    receipts = [await first, *later]
    assert [r.duplicate for r in receipts] == [False] * 50
    # The first commit runs alone; everything that arrived meanwhile shares the next.
    assert store.batch_sizes == [1, 49]
    assert len(store.events) == 50


async def test_a_lone_delivery_commits_at_once() -> None:
    store = SlowStore()
    commits = GroupCommit(store.insert_events)
    await commits.submit(new_event("only"))
    await commits.submit(new_event("next"))
    assert store.batch_sizes == [1, 1]


async def test_batches_are_capped() -> None:
    store = SlowStore()
    commits = GroupCommit(store.insert_events, max_batch=10)
    await asyncio.gather(*(commits.submit(new_event(f"e{i}")) for i in range(31)))
    assert max(store.batch_sizes) == 10
    assert sum(store.batch_sizes) == 31


async def test_with_a_share_a_short_queue_goes_in_batches_of_the_share() -> None:
    """Six waiting, two batches in flight, a share of four: four and two, so
    that the loop answers one batch while the other commits."""
    store = SlowStore()
    commits = GroupCommit(store.insert_events, max_in_flight=2, share=4)
    receipts = await asyncio.gather(*(commits.submit(new_event(f"e{i}")) for i in range(6)))
    assert [r.duplicate for r in receipts] == [False] * 6
    assert store.batch_sizes == [4, 2]


async def test_with_a_share_a_long_queue_goes_in_halves() -> None:
    """Forty waiting: the first batch takes half of them, not the share of
    four, which would hold the throughput to eight per round trip."""
    store = SlowStore()
    commits = GroupCommit(store.insert_events, max_in_flight=2, share=4)
    receipts = await asyncio.gather(*(commits.submit(new_event(f"e{i}")) for i in range(40)))
    assert [r.duplicate for r in receipts] == [False] * 40
    assert store.batch_sizes[:2] == [20, 10]
    assert sum(store.batch_sizes) == 40
    assert len(store.events) == 40


async def test_with_a_share_batches_stay_under_the_cap() -> None:
    store = SlowStore()
    commits = GroupCommit(store.insert_events, max_batch=8, max_in_flight=2, share=4)
    await asyncio.gather(*(commits.submit(new_event(f"e{i}")) for i in range(40)))
    assert store.batch_sizes[0] == 8
    assert max(store.batch_sizes) == 8
    assert sum(store.batch_sizes) == 40


@pytest.mark.parametrize("share", [0, 11])
def test_a_share_outside_one_to_the_cap_is_refused(share: int) -> None:
    with pytest.raises(ValueError, match="share"):
        GroupCommit(MemoryStore().insert_events, max_batch=10, share=share)


async def test_a_failed_commit_fails_every_delivery_in_it_and_the_next_ones_proceed() -> None:
    store = SlowStore()
    commits = GroupCommit(store.insert_events)
    store.unavailable = True
    results = await asyncio.gather(
        *(commits.submit(new_event(f"e{i}")) for i in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, StoreUnavailable) for r in results)
    store.unavailable = False
    assert not (await commits.submit(new_event("e0"))).duplicate


async def test_a_cancelled_waiter_does_not_break_the_batch() -> None:
    store = SlowStore()
    commits = GroupCommit(store.insert_events)
    first = asyncio.create_task(commits.submit(new_event("a")))
    waiting = asyncio.create_task(commits.submit(new_event("b")))
    await asyncio.sleep(0)
    waiting.cancel()
    assert not (await first).duplicate
    assert (await commits.submit(new_event("c"))).id is not None


class Recorded:
    """A waiter that is not a future: what it was given, as it was given."""

    def __init__(self) -> None:
        self.outcomes: list[object] = []

    def done(self) -> bool:
        return bool(self.outcomes)

    def set_result(self, result: Receipt, /) -> None:
        self.outcomes.append(result)

    def set_exception(self, exception: BaseException, /) -> None:
        self.outcomes.append(exception)


async def test_a_waiter_added_without_a_future_gets_its_own_outcome_once() -> None:
    store = SlowStore()
    commits = GroupCommit(store.insert_events)
    waiters = [Recorded() for _ in range(3)]
    for n, waiter in enumerate(waiters):
        commits.add(new_event(f"w{n % 2}"), waiter)
    while not all(w.done() for w in waiters):
        await asyncio.sleep(0.005)
    receipts = [w.outcomes for w in waiters]
    assert all(len(r) == 1 and isinstance(r[0], Receipt) for r in receipts)
    assert [r[0].duplicate for r in receipts] == [False, False, True]  # type: ignore[attr-defined]
    # And a batch that fails hands each waiter the error.
    store.unavailable = True
    failing = Recorded()
    commits.add(new_event("w9"), failing)
    while not failing.done():
        await asyncio.sleep(0.005)
    assert [type(o) for o in failing.outcomes] == [StoreUnavailable]


def inbox(store: MemoryStore) -> Inbox:
    return Inbox(store, {"stripe": Stripe(STRIPE_SECRET)})


async def test_inbox_verifies_before_storing() -> None:
    store = MemoryStore()
    body, headers = stripe_delivery("evt_1", secret="whsec_other")
    with pytest.raises(SignatureError):
        await inbox(store).receive(Delivery("stripe", body, headers))
    assert store.events == {}


async def test_inbox_rejects_unknown_providers_and_idless_events() -> None:
    store = MemoryStore()
    body, headers = stripe_delivery("")
    with pytest.raises(UnknownProvider):
        await inbox(store).receive(Delivery("paypal", body, headers))
    with pytest.raises(PayloadError):
        await inbox(store).receive(Delivery("stripe", body, headers))
    assert store.events == {}


async def test_inbox_stores_identified_event_once() -> None:
    store = MemoryStore()
    box = inbox(store)
    body, headers = stripe_delivery("evt_9", event_type="invoice.paid")
    first = await box.receive(Delivery("stripe", body, headers))
    second = await box.receive(Delivery("stripe", body, headers))
    assert (first.duplicate, second.duplicate) == (False, True)
    (stored,) = store.events.values()
    assert (stored.event_id, stored.event_type, stored.body) == ("evt_9", "invoice.paid", body)


async def test_two_batches_in_flight_when_the_engine_allows_it() -> None:
    store = MemoryStore()
    in_flight = 0
    peak = 0
    both = asyncio.Event()  # two batches are being committed at once

    async def flush(events: Sequence[NewEvent]) -> list[Receipt]:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if in_flight == 2:
            both.set()
        try:
            # A commit lasts until a second one has begun, not for a set time:
            # a 10 ms commit let the first batch end before the second began
            # on a loaded machine. With one batch in flight, the second never
            # begins: the first gives up after 5 s, and `peak` stays 1.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(both.wait(), 5)
            return await store.insert_events(events)
        finally:
            in_flight -= 1

    commits = GroupCommit(flush, max_in_flight=2)
    first = asyncio.create_task(commits.submit(new_event("a")))
    while in_flight == 0:  # the first batch is being committed
        await asyncio.sleep(0)
    second = asyncio.create_task(commits.submit(new_event("b")))
    rest = [asyncio.create_task(commits.submit(new_event(f"c{i}"))) for i in range(20)]
    receipts = await asyncio.gather(first, second, *rest)
    assert peak == 2
    assert [r.duplicate for r in receipts] == [False] * 22
    # Nothing is left waiting once the flushers have gone idle.
    assert not (await commits.submit(new_event("late"))).duplicate
