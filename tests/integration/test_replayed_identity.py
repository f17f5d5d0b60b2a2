"""A captured, validly signed delivery replayed with its unsigned parts altered,
through the real receiver over HTTP on SQLite and PostgreSQL: it creates no new
event, and the genuine next delivery is still stored (issue 13, item 2)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from onceonly import Event, Onceonly, create_store
from onceonly.providers import GitHub, MercadoPago, Shopify, StandardWebhooks
from support import live_server

SW_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

PROVIDERS = {
    "standardwebhooks": StandardWebhooks(SW_SECRET),
    "github": GitHub("gh-secret"),
    "shopify": Shopify("shpss_secret"),
    "mercadopago": MercadoPago("mp-secret"),
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


def as_svix(headers: dict[str, str]) -> dict[str, str]:
    return {name.replace("webhook-", "svix-"): value for name, value in headers.items()}


async def test_svix_delivery_replayed_with_new_webhook_ids(server: str, database_url: str) -> None:
    provider = PROVIDERS["standardwebhooks"]
    body = json.dumps({"type": "invoice.paid", "data": {"id": "in_1"}}).encode()
    captured = as_svix(provider.sign(body, delivery_id="msg_genuine"))
    first = await post(server, "standardwebhooks", body, captured)
    assert first.status_code == 200
    for n in range(3):
        replay = await post(
            server, "standardwebhooks", body, {**captured, "webhook-id": f"msg_forged_{n}"}
        )
        assert replay.status_code == 200
        assert replay.headers["onceonly-duplicate"] == "true"
    following = json.dumps({"type": "invoice.paid", "data": {"id": "in_2"}}).encode()
    genuine = await post(
        server,
        "standardwebhooks",
        following,
        as_svix(provider.sign(following, delivery_id="msg_next")),
    )
    assert genuine.headers["onceonly-duplicate"] == "false"
    assert sorted(e.event_id for e in await stored(database_url)) == ["msg_genuine", "msg_next"]


async def test_github_delivery_replayed_with_new_guids_and_events(
    server: str, database_url: str
) -> None:
    provider = PROVIDERS["github"]
    body = b'{"action": "created", "comment": {"id": 1}}'
    captured = {**provider.sign(body, delivery_id="guid-1"), "x-github-event": "issue_comment"}
    assert (await post(server, "github", body, captured)).status_code == 200
    redeliver = await post(server, "github", body, captured)  # GitHub's "Redeliver"
    assert redeliver.headers["onceonly-duplicate"] == "true"
    for n, event in enumerate(["issue_comment", "release", "push"]):
        forged = {**captured, "x-github-delivery": f"guid-forged-{n}", "x-github-event": event}
        replay = await post(server, "github", body, forged)
        assert replay.headers["onceonly-duplicate"] == "true"
    following = b'{"action": "created", "comment": {"id": 2}}'
    next_headers = {**provider.sign(following, delivery_id="guid-2"), "x-github-event": "push"}
    genuine = await post(server, "github", following, next_headers)
    assert genuine.headers["onceonly-duplicate"] == "false"
    events = await stored(database_url)
    assert sorted((e.headers["x-github-delivery"], e.event_type) for e in events) == [
        ("guid-1", "issue_comment"),
        ("guid-2", "push"),
    ]
    assert all(e.headers["onceonly-type-signed"] == "false" for e in events)


async def test_shopify_delivery_replayed_under_other_topics_and_ids(
    server: str, database_url: str
) -> None:
    provider = PROVIDERS["shopify"]
    body = b'{"id": 820982911946154508, "financial_status": "pending"}'
    captured = {**provider.sign(body, delivery_id="w-1"), "x-shopify-topic": "orders/create"}
    assert (await post(server, "shopify", body, captured)).status_code == 200
    retry = await post(server, "shopify", body, captured)  # Shopify's retry: same id, same body
    assert retry.headers["onceonly-duplicate"] == "true"
    for n, topic in enumerate(["orders/paid", "orders/create", "refunds/create"]):
        forged = {**captured, "x-shopify-webhook-id": f"w-forged-{n}", "x-shopify-topic": topic}
        replay = await post(server, "shopify", body, forged)
        assert replay.headers["onceonly-duplicate"] == "true"
    paid = b'{"id": 820982911946154508, "financial_status": "paid"}'
    genuine = await post(
        server,
        "shopify",
        paid,
        {**provider.sign(paid, delivery_id="w-2"), "x-shopify-topic": "orders/paid"},
    )
    assert genuine.headers["onceonly-duplicate"] == "false"
    events = await stored(database_url)
    assert sorted((e.headers["x-shopify-webhook-id"], e.event_type) for e in events) == [
        ("w-1", "orders/create"),
        ("w-2", "orders/paid"),
    ]


def mp_notification(notification_id: int, payment: str, action: str = "payment.updated") -> bytes:
    return json.dumps(
        {"id": notification_id, "action": action, "type": "payment", "data": {"id": payment}}
    ).encode()


async def test_mercadopago_signature_replayed_with_bodies_of_the_attacker_s_choice(
    server: str, database_url: str
) -> None:
    # Mercado Pago signs data.id, x-request-id and ts, not the body: the
    # notification id in the body is the attacker's to choose.
    provider = PROVIDERS["mercadopago"]
    query = "data.id=123&type=payment"
    body = mp_notification(1001, "123")
    captured = provider.sign(body, delivery_id="req-1", query={"data.id": "123"})
    assert (await post(server, "mercadopago", body, captured, query)).status_code == 200
    retry = await post(server, "mercadopago", body, captured, query)
    assert retry.headers["onceonly-duplicate"] == "true"
    resigned = provider.sign(body, delivery_id="req-1", query={"data.id": "123"}, timestamp=1)
    again_signed = await post(server, "mercadopago", body, resigned, query)
    assert again_signed.headers["onceonly-duplicate"] == "true"  # same request id, new ts
    # New events by new body ids, and the id of a future genuine notification.
    for forged_id in (1002, 1003, 2002):
        forged = mp_notification(forged_id, "123", "payment.created")
        replay = await post(server, "mercadopago", forged, captured, query)
        assert replay.headers["onceonly-duplicate"] == "true"
    # The genuine next notification (id 2002, taken above) is still stored.
    following = mp_notification(2002, "123")
    next_headers = provider.sign(following, delivery_id="req-2", query={"data.id": "123"})
    genuine = await post(server, "mercadopago", following, next_headers, query)
    assert genuine.headers["onceonly-duplicate"] == "false"
    events = await stored(database_url)
    assert len(events) == 2
    assert sorted(json.loads(e.body)["id"] for e in events) == [1001, 2002]
