"""Mercado Pago, Asaas, PagBank and Shopify through the real receiver over HTTP,
on a real SQLite file and on PostgreSQL: an accepted delivery stores one row, a
resend answers 200 and stores nothing more, a rejected one stores nothing.

Deliveries are signed with ``Provider.sign`` (the fake gateway's signer), whose
agreement with each provider's documented scheme is unit-tested.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from onceonly import Event, Onceonly, create_store
from onceonly.providers import Asaas, MercadoPago, PagBank, Shopify
from support import live_server

MP_SECRET = "mp-secret"
ASAAS_TOKEN = "asaas-token"
PAGBANK_TOKEN = "pagbank-token"
SHOPIFY_SECRET = "shpss_secret"

PROVIDERS = {
    "mercadopago": MercadoPago(MP_SECRET),
    "mercadopago-qr": MercadoPago(MP_SECRET, unsigned="fetch"),
    "asaas": Asaas(ASAAS_TOKEN),
    "pagbank": PagBank(PAGBANK_TOKEN),
    "pagbank-strict": PagBank(PAGBANK_TOKEN, unsigned="reject"),
    "shopify": Shopify(SHOPIFY_SECRET),
}


@pytest.fixture
def server(database_url: str) -> Iterator[str]:
    app = Onceonly(database_url=database_url, providers=PROVIDERS, environ={})
    with live_server(app.asgi()) as url:
        yield url


async def stored(database_url: str) -> list[Event]:
    async with create_store(database_url) as store:
        return list(await store.list_events(limit=1000))


async def post(
    url: str, route: str, body: bytes, headers: dict[str, str], query: str = ""
) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.post(
            f"{url}/webhooks/{route}{'?' + query if query else ''}", content=body, headers=headers
        )


async def test_mercadopago_signed_query_id_with_its_case_once(
    server: str, database_url: str
) -> None:
    order_id = "ORD01JQ4S4KY8HWQ6NA5PXB65B3D3"
    body = json.dumps(
        {"id": 9001, "action": "order.processed", "type": "order", "data": {"id": order_id}}
    ).encode()
    headers = PROVIDERS["mercadopago"].sign(body, query={"data.id": order_id})
    query = f"data.id={order_id}&type=order"
    first = await post(server, "mercadopago", body, headers, query)
    again = await post(server, "mercadopago", body, headers, query)
    assert (first.status_code, again.status_code) == (200, 200)
    assert again.headers["onceonly-duplicate"] == "true"
    lowered = await post(server, "mercadopago", body, headers, query.replace("ORD01J", "ord01j"))
    assert lowered.status_code == 401  # the signed id, not any casing of it
    [event] = await stored(database_url)
    assert event.event_id == f"{order_id}:{headers['x-request-id']}"
    assert event.event_type == "order.processed"
    assert event.headers["onceonly-query"] == query
    assert event.headers["onceonly-verified"] == "true"


async def test_mercadopago_unsigned_by_policy(server: str, database_url: str) -> None:
    ipn = json.dumps(
        {"resource": "https://api.mercadolibre.com/v1/payments/77", "topic": "payment"}
    )
    headers = {"x-request-id": "req-1", "content-type": "application/json"}
    refused = await post(server, "mercadopago", ipn.encode(), headers, "topic=payment&id=77")
    assert refused.status_code == 401
    assert await stored(database_url) == []
    taken = await post(server, "mercadopago-qr", ipn.encode(), headers, "topic=payment&id=77")
    forged = await post(
        server, "mercadopago-qr", ipn.encode(), {**headers, "x-signature": "ts=1,v1=00"}, "id=77"
    )
    assert (taken.status_code, forged.status_code) == (200, 401)
    [event] = await stored(database_url)
    assert (event.event_id, event.event_type) == ("unverified:req-1", "unverified:payment")
    assert event.headers["onceonly-verified"] == "false"


async def test_asaas_answers_exactly_200_to_new_and_duplicate(
    server: str, database_url: str
) -> None:
    body = json.dumps(
        {"id": "evt_asaas_1", "event": "PAYMENT_RECEIVED", "payment": {"id": "pay_1"}}
    ).encode()
    headers = PROVIDERS["asaas"].sign(body)
    statuses = [(await post(server, "asaas", body, headers)).status_code for _ in range(3)]
    assert statuses == [200, 200, 200]  # Asaas counts only 200, not 201 or 204
    wrong = await post(server, "asaas", body, {"asaas-access-token": "guess"})
    missing = await post(server, "asaas", body, {})
    assert (wrong.status_code, missing.status_code) == (401, 401)
    [event] = await stored(database_url)
    assert (event.event_id, event.event_type) == ("evt_asaas_1", "PAYMENT_RECEIVED")


async def test_pagbank_state_changes_are_events_resends_are_not(
    server: str, database_url: str
) -> None:
    def order(status: str) -> bytes:
        charge = {"id": "CHAR_1", "status": status, "amount": {"summary": {"paid": 500}}}
        return json.dumps({"id": "ORDE_1", "charges": [charge]}).encode()

    provider = PROVIDERS["pagbank"]
    for body in (order("WAITING"), order("WAITING"), order("PAID")):
        response = await post(server, "pagbank", body, provider.sign(body))
        assert response.status_code == 200
    tampered = await post(server, "pagbank", order("PAID"), provider.sign(order("DECLINED")))
    assert tampered.status_code == 401
    assert len(await stored(database_url)) == 2


async def test_pagseguro_legacy_form_by_policy(server: str, database_url: str) -> None:
    form = b"notificationCode=766B9C-AD4B044B04DA&notificationType=transaction"
    headers = {"content-type": "application/x-www-form-urlencoded"}
    strict = await post(server, "pagbank-strict", form, headers)
    assert strict.status_code == 401
    assert await stored(database_url) == []
    first = await post(server, "pagbank", form, headers)
    again = await post(server, "pagbank", form, headers)
    assert (first.status_code, again.status_code) == (200, 200)
    [event] = await stored(database_url)
    assert event.event_id == "unverified:766B9C-AD4B044B04DA"
    assert event.event_type == "unverified:transaction"
    assert event.headers["onceonly-verified"] == "false"


async def test_shopify_retries_dedupe_a_replayed_topic_is_no_new_event(
    server: str, database_url: str
) -> None:
    body = b'{"id": 820982911946154508, "total_price": "10.00"}'
    provider = PROVIDERS["shopify"]
    create = {**provider.sign(body, delivery_id="w-1"), "x-shopify-topic": "orders/create"}
    # The topic and the webhook id are unsigned: the same body under another
    # topic is the same event (see docs/providers/shopify.md).
    replayed = {**create, "x-shopify-webhook-id": "w-2", "x-shopify-topic": "orders/paid"}
    for headers in (create, create, replayed):
        assert (await post(server, "shopify", body, headers)).status_code == 200
    tampered = await post(server, "shopify", body.replace(b"10.00", b"0.01"), create)
    assert tampered.status_code == 401
    [event] = await stored(database_url)
    assert event.event_type == "orders/create"
    assert event.headers["x-shopify-webhook-id"] == "w-1"
    assert event.headers["onceonly-type-signed"] == "false"
