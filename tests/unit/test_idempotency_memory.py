"""The middleware over the in-memory store: what a user's unit tests of an API
behind it can run on, without a database file or server."""

from __future__ import annotations

from typing import Any

import httpx

from onceonly.idempotency import IdempotencyMiddleware
from onceonly.store.memory import MemoryStore


async def test_a_repeat_is_replayed_and_an_outage_fails_closed() -> None:
    runs = 0

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal runs
        runs += 1
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": f'{{"run": {runs}}}'.encode()})

    store = MemoryStore()
    mw = IdempotencyMiddleware(app, store=store, cache_bytes=0)
    headers = {"idempotency-key": "k-1", "authorization": "Bearer sk_test"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=mw), base_url="http://test"
    ) as client:
        first = await client.post("/orders", json={"sku": "A1"}, headers=headers)
        again = await client.post("/orders", json={"sku": "A1"}, headers=headers)
        other = await client.post("/orders", json={"sku": "B2"}, headers=headers)
        store.unavailable = True
        down = await client.post("/orders", json={}, headers={**headers, "idempotency-key": "k-2"})
    assert (first.status_code, again.status_code, other.status_code) == (201, 201, 422)
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    assert down.status_code == 503
    assert runs == 1
