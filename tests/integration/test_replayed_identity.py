"""A captured, validly signed delivery replayed with its unsigned parts altered,
through the real receiver over HTTP on SQLite and PostgreSQL: it creates no new
event, and the genuine next delivery is still stored (issue 13, item 2)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from onceonly import Event, Onceonly, create_store
from onceonly.providers import StandardWebhooks
from support import live_server

SW_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

PROVIDERS = {"standardwebhooks": StandardWebhooks(SW_SECRET)}


@pytest.fixture
def server(database_url: str) -> Iterator[str]:
    app = Onceonly(database_url=database_url, providers=PROVIDERS, environ={})
    with live_server(app.asgi()) as url:
        yield url


async def stored(database_url: str) -> list[Event]:
    async with create_store(database_url) as store:
        return list(await store.list_events(limit=1000))


async def post(url: str, route: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.post(f"{url}/webhooks/{route}", content=body, headers=headers)


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
