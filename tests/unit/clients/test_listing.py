"""The listing clients ``onceonly reconcile`` reads with, against the fake
provider API in-process (httpx's ASGI transport: no sockets), and ``--since``.

The paging is exercised with a small page size, so that a listing of 7 items
takes several pages; what the fake answers follows the providers' documented
parameters (Stripe's ``created[gte]``/``starting_after``/``has_more``, Asaas's
``offset``/``limit``/``hasMore``, Mercado Pago's ``paging.total``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import httpx
import pytest

from onceonly import ConfigurationError
from onceonly.clients import (
    ApiClient,
    AsaasClient,
    MercadoPagoClient,
    PagBankClient,
    StripeClient,
)
from onceonly.dev.api import DEFAULT_TOKEN, FakeApi
from onceonly.dev.gateway import prepare_events
from onceonly.providers.asaas import Asaas
from onceonly.providers.client import RECONCILED_HEADER, Listed
from onceonly.reconcile import parse_since

T = TypeVar("T")
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def wired(client: ApiClient, api: FakeApi) -> ApiClient:
    """`client` talking to `api` in-process: its per-loop HTTP client, replaced."""
    client.page_size = 3  # type: ignore[misc]  # small pages: several of them
    original = client._http

    def http() -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if loop not in client._clients:
            client._clients[loop] = httpx.AsyncClient(
                transport=httpx.ASGITransport(api), base_url=client.base_url
            )
        return original()

    client._http = http  # type: ignore[method-assign]
    return client


async def listed(client: ApiClient, since: datetime = LONG_AGO, **kw: Any) -> list[Listed]:
    try:
        return [item async for item in client.listing(since, **kw)]
    finally:
        await client.aclose()


def test_stripe_lists_every_page_newest_first_with_the_events_own_ids() -> None:
    api = FakeApi()
    events = prepare_events("stripe", 7, seed=1, api=api)
    client = wired(StripeClient(DEFAULT_TOKEN), api)
    items = run(listed(client))
    assert [i.event_id for i in items] == [e.event_id for e in reversed(events)]
    assert len(api.requests) == 3  # 3 + 3 + 1
    assert {i.headers[RECONCILED_HEADER] for i in items} == {"stripe:events-list"}
    first = json.loads(items[-1].body)
    assert first["type"] == "payment_intent.succeeded"
    assert first["data"]["object"]["id"] == json.loads(events[0].body)["data"]["object"]["id"]


def test_stripe_failed_only_lists_what_was_never_acknowledged() -> None:
    api = FakeApi()
    events = prepare_events("stripe", 5, seed=2, api=api)
    for event in events[:3]:
        api.record_delivery("stripe", event.event_id, True)
    api.record_delivery("stripe", events[3].event_id, False)
    items = run(listed(wired(StripeClient(DEFAULT_TOKEN), api), failed_only=True))
    assert {i.event_id for i in items} == {events[3].event_id, events[4].event_id}


def test_stripe_window_and_ids() -> None:
    api = FakeApi()
    events = prepare_events("stripe", 2, seed=3, api=api)
    future = datetime.now(UTC) + timedelta(hours=1)
    assert run(listed(wired(StripeClient(DEFAULT_TOKEN), api), since=future)) == []
    by_id = run(listed(wired(StripeClient(DEFAULT_TOKEN), api), ids=[events[1].event_id]))
    assert [i.event_id for i in by_id] == [events[1].event_id]
    assert by_id[0].headers[RECONCILED_HEADER] == "stripe:events"


def test_asaas_pages_by_offset_and_names_each_payment_by_its_status() -> None:
    api = FakeApi()
    events = prepare_events("asaas", 7, seed=4, api=api)
    api.set_status("asaas", "payment", json.loads(events[0].body)["payment"]["id"], "OVERDUE")
    items = run(listed(wired(AsaasClient(DEFAULT_TOKEN), api)))
    assert len(items) == 7
    assert len(api.requests) == 3
    payment_ids = [json.loads(e.body)["payment"]["id"] for e in events]
    assert items[0].event_id == f"reconciled:{payment_ids[0]}:OVERDUE"
    assert items[0].event_type == "PAYMENT_OVERDUE"
    assert [i.event_id for i in items[1:]] == [f"reconciled:{p}:RECEIVED" for p in payment_ids[1:]]
    assert {i.event_type for i in items[1:]} == {"PAYMENT_RECEIVED"}
    body = json.loads(items[1].body)
    assert (body["event"], body["payment"]["id"]) == ("PAYMENT_RECEIVED", payment_ids[1])
    # Tomorrow's window lists none of today's payments (Asaas filters by day).
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    assert run(listed(wired(AsaasClient(DEFAULT_TOKEN), api), since=tomorrow)) == []


def test_asaas_queue_state() -> None:
    api = FakeApi()
    client = wired(AsaasClient(DEFAULT_TOKEN), api)
    assert run(client.queue_state()) == {
        "webhooks": [
            {
                "id": "wh_onceonly_dev",
                "name": "onceonly dev gateway",
                "url": "",
                "enabled": True,
                "interrupted": False,
                "penalizedRequestsCount": 0,
            }
        ],
        "interrupted": False,
    }
    api.set_queue("asaas", interrupted=True)
    state = run(wired(AsaasClient(DEFAULT_TOKEN), api).queue_state())
    assert state is not None
    assert state["interrupted"] is True


def test_mercadopago_pages_until_the_total() -> None:
    api = FakeApi()
    events = prepare_events("mercadopago", 7, seed=5, api=api)
    items = run(listed(wired(MercadoPagoClient(DEFAULT_TOKEN), api)))
    assert len(api.requests) == 3
    ids = [json.loads(e.body)["data"]["id"] for e in events]
    assert [i.event_id for i in items] == [f"reconciled:{p}:approved" for p in ids]
    assert {i.event_type for i in items} == {"payment.updated"}
    assert json.loads(items[0].body)["data"]["id"] == ids[0]


def test_pagbank_reads_the_orders_given_under_their_delivered_ids() -> None:
    from onceonly.events import Delivery
    from onceonly.providers import PagBank

    api = FakeApi()
    events = prepare_events("pagbank", 2, seed=6, api=api)
    client = wired(PagBankClient(DEFAULT_TOKEN), api)
    with pytest.raises(ConfigurationError, match="cannot list orders"):
        run(listed(client))
    order_ids = [json.loads(e.body)["id"] for e in events]
    items = run(listed(wired(PagBankClient(DEFAULT_TOKEN), api), ids=order_ids))
    # The same id PagBank's verifier gives a notification of that order's state.
    provider = PagBank("token")
    api_orders = [api.get("pagbank", "order", o) for o in order_ids]
    expected = [
        provider.identify(Delivery("pagbank", json.dumps(o).encode(), {})).event_id
        for o in api_orders
    ]
    assert [i.event_id for i in items] == expected


def test_a_provider_without_a_listing_says_so() -> None:
    with pytest.raises(ConfigurationError, match="lists nothing"):
        ApiClient.listing(StripeClient.__new__(StripeClient), LONG_AGO)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, NOW - timedelta(days=3)),
        ("2h", NOW - timedelta(hours=2)),
        ("3d", NOW - timedelta(days=3)),
        ("90m", NOW - timedelta(minutes=90)),
        ("1w", NOW - timedelta(weeks=1)),
        ("2026-12-01", datetime(2026, 12, 1, tzinfo=UTC)),
        ("2026-12-01T10:30:00Z", datetime(2026, 12, 1, 10, 30, tzinfo=UTC)),
        ("2026-12-01T10:30:00-03:00", datetime(2026, 12, 1, 13, 30, tzinfo=UTC)),
    ],
)
def test_since(value: str | None, expected: datetime) -> None:
    assert parse_since(value, default=3 * 86400, now=NOW) == expected


@pytest.mark.parametrize("value", ["yesterday", "3 days", "-2h", "2026-13-01", "2027-01-01"])
def test_since_refuses(value: str) -> None:
    with pytest.raises(ConfigurationError, match="--since"):
        parse_since(value, default=0, now=NOW)


def test_reconcile_admits_through_the_inbox_and_warns_of_a_paused_queue() -> None:
    from onceonly.inbox import Inbox
    from onceonly.reconcile import reconcile
    from onceonly.store.memory import MemoryStore

    api = FakeApi()
    events = prepare_events("asaas", 4, seed=7, api=api)
    api.set_queue("asaas", interrupted=True)
    store = MemoryStore()
    inbox = Inbox(store, {"asaas": Asaas([DEFAULT_TOKEN])})

    async def once(dry_run: bool = False) -> Any:
        client = wired(AsaasClient(DEFAULT_TOKEN), api)
        try:
            return await reconcile(inbox, client, "asaas", since=LONG_AGO, dry_run=dry_run)
        finally:
            await client.aclose()

    dry = run(once(dry_run=True))
    assert (dry.listed, dry.new, dry.already, store.commits) == (4, 4, 0, 0)
    first = run(once())
    assert (first.listed, first.new, first.already) == (4, 4, 0)
    assert any("interrupted" in w for w in first.warnings)
    stored = sorted(e.event_id for e in store.events.values())
    payment_ids = sorted(json.loads(e.body)["payment"]["id"] for e in events)
    assert stored == [f"reconciled:{p}:RECEIVED" for p in payment_ids]
    # Read as a delivery of the same body would be: found by its payment.
    assert sorted(str(e.object_id) for e in store.events.values()) == payment_ids
    assert all(e.headers[RECONCILED_HEADER] == "asaas:payments-list" for e in store.events.values())
    second = run(once())
    assert (second.new, second.already) == (0, 4)
    # Counted as resends on the rows, as a delivered duplicate would be.
    assert {e.duplicates for e in store.events.values()} == {1}
