"""Database outages: 503 with Retry-After while it is gone, service again when it is
back, without restarting the server."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from onceonly import Onceonly, create_store
from onceonly.providers import Stripe
from support import STRIPE_SECRET, TcpProxy, live_server, stripe_delivery


def app_for(url: str) -> Onceonly:
    return Onceonly(
        database_url=url, providers={"stripe": Stripe(STRIPE_SECRET)}, environ={}, retry_after=7
    )


async def post(client: httpx.AsyncClient, url: str, event_id: str) -> httpx.Response:
    body, headers = stripe_delivery(event_id)
    return await client.post(f"{url}/webhooks/stripe", content=body, headers=headers)


async def until_ok(client: httpx.AsyncClient, url: str, event_id: str) -> httpx.Response:
    """Resend like a gateway does until a 2xx; every refusal on the way must be a 503."""
    deadline = time.monotonic() + 15
    while True:
        response = await post(client, url, event_id)
        if response.status_code == 200 or time.monotonic() > deadline:
            return response
        assert response.status_code == 503
        await asyncio.sleep(0.2)


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503
    assert response.headers["retry-after"] == "7"
    assert response.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
async def test_postgres_gone_means_503_then_recovers(database_url: str) -> None:
    parts = urlsplit(database_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    proxy.start()
    via_proxy = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
    try:
        with live_server(app_for(via_proxy).asgi()) as url:
            async with httpx.AsyncClient(timeout=30) as client:
                assert (await post(client, url, "evt_before")).status_code == 200
                proxy.cut()
                for _ in range(3):
                    assert_unavailable(await post(client, url, "evt_during"))
                proxy.start()
                recovered = await until_ok(client, url, "evt_during")
                assert recovered.status_code == 200
                # Refused deliveries were not stored: the resend is a new event.
                assert recovered.headers["onceonly-duplicate"] == "false"
    finally:
        proxy.close()
    async with create_store(database_url) as store:
        assert {e.event_id for e in await store.list_events()} == {"evt_before", "evt_during"}


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
async def test_postgres_down_at_start_up(database_url: str) -> None:
    parts = urlsplit(database_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    via_proxy = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
    try:
        with live_server(app_for(via_proxy).asgi()) as url:
            async with httpx.AsyncClient(timeout=30) as client:
                assert_unavailable(await post(client, url, "evt_1"))
                down = await client.get(f"{url}/healthz")
                assert down.status_code == 503
                # Public and unauthenticated: nothing about the deployment.
                for detail in (str(proxy.port), parts.username or "postgres", parts.path[1:]):
                    assert detail not in down.text
                proxy.start()
                assert (await until_ok(client, url, "evt_1")).status_code == 200
                up = await client.get(f"{url}/healthz")
                assert up.status_code == 200
                assert up.json() == {"status": "ok"}
    finally:
        proxy.close()


@pytest.mark.parametrize("engine", ["sqlite"], indirect=True)
async def test_sqlite_locked_means_503_then_recovers(database_url: str) -> None:
    url_with_timeout = database_url + "?busy_timeout=200"
    with live_server(app_for(url_with_timeout).asgi()) as url:
        async with httpx.AsyncClient(timeout=30) as client:
            assert (await post(client, url, "evt_before")).status_code == 200
            # Another process holding the write lock past busy_timeout.
            blocker = sqlite3.connect(urlsplit(database_url).path, isolation_level=None)
            blocker.execute("BEGIN EXCLUSIVE")
            try:
                assert_unavailable(await post(client, url, "evt_during"))
            finally:
                blocker.execute("ROLLBACK")
                blocker.close()
            recovered = await until_ok(client, url, "evt_during")
            assert recovered.headers["onceonly-duplicate"] == "false"
