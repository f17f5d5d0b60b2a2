"""Limits on what a sender may make the receiver hold, over real HTTP.

Headers past a size, a body that trickles, a Content-Length that is not a
number: each gets its 4xx problem document, never a 500, and leaves nothing
behind. What is stored of a delivery's headers is an allow-list, and never a
credential.
"""

from __future__ import annotations

import asyncio
import select
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from onceonly import Onceonly, create_store
from onceonly.providers import Asaas, Stripe
from support import STRIPE_SECRET, live_server, stripe_delivery

ASAAS_TOKEN = "asaas-webhook-token-0123456789"


@pytest.fixture
def server(database_url: str) -> Iterator[str]:
    app = Onceonly(
        database_url=database_url,
        providers={"stripe": Stripe(STRIPE_SECRET), "asaas": Asaas(ASAAS_TOKEN)},
        environ={},
        max_header_bytes=8192,
        body_timeout=0.5,
    )
    with live_server(app.asgi()) as url:
        yield url


async def stored(database_url: str) -> list[str]:
    async with create_store(database_url) as store:
        return [e.event_id for e in await store.list_events()]


async def test_headers_over_the_limit_get_431(server: str, database_url: str) -> None:
    body, headers = stripe_delivery("evt_big_headers")
    padding = {f"x-pad-{n}": "p" * 1000 for n in range(10)}
    async with httpx.AsyncClient() as client:
        refused = await client.post(
            f"{server}/webhooks/stripe", content=body, headers={**headers, **padding}
        )
        accepted = await client.post(f"{server}/webhooks/stripe", content=body, headers=headers)
    assert refused.status_code == 431
    assert refused.headers["content-type"] == "application/problem+json"
    assert accepted.status_code == 200
    assert await stored(database_url) == ["evt_big_headers"]


def raw_request(url: str, head: bytes, body_parts: list[bytes], pause: float) -> bytes:
    """Send `head`, then each part of the body `pause` seconds apart; the answer."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as conn:
        conn.sendall(head)
        try:
            for part in body_parts:
                # Stop as soon as the server has answered (it will not read on).
                if select.select([conn], [], [], pause)[0]:
                    break
                conn.sendall(part)
        except OSError:
            pass  # the server answered and closed: what we wait for
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


async def test_a_trickling_body_is_cut_off_with_408(server: str, database_url: str) -> None:
    body, headers = stripe_delivery("evt_slow")
    head = (
        b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\n"
        + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items())
        + f"content-length: {len(body)}\r\n\r\n".encode()
    )
    started = time.monotonic()
    # One byte every 0.2 s: the whole body would take tens of seconds.
    parts = [body[i : i + 1] for i in range(len(body))]
    answer = await asyncio.to_thread(raw_request, server, head, parts, 0.2)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert time.monotonic() - started < 5
    assert await stored(database_url) == []


@pytest.mark.parametrize("declared", ["9" * 40, "\u00b2", "12345678901234567890123"])
async def test_a_content_length_that_is_no_usable_number_is_never_a_500(
    server: str, declared: str
) -> None:
    body, headers = stripe_delivery("evt_length")
    head = (
        b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\n"
        + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items())
        + b"content-length: "
        + declared.encode("latin-1")
        + b"\r\n\r\n"
    )
    answer = await asyncio.to_thread(raw_request, server, head, [body], 0)
    status = int(answer.split(b" ", 2)[1]) if answer else 400  # or the server closed
    assert 400 <= status < 500, answer[:200]


async def test_only_the_headers_verification_and_debugging_need_are_stored(
    server: str, database_url: str
) -> None:
    body, headers = stripe_delivery("evt_headers")
    sent = {
        **headers,
        "user-agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
        "authorization": "Bearer someone-elses-session",
        "cookie": "session=abc",
        "x-api_key": "k-1",
        "x-attacker-filler": "x" * 2000,
    }
    asaas_body = b'{"id": "evt_asaas_1", "event": "PAYMENT_RECEIVED"}'
    async with httpx.AsyncClient() as client:
        ok = await client.post(f"{server}/webhooks/stripe", content=body, headers=sent)
        asaas = await client.post(
            f"{server}/webhooks/asaas",
            content=asaas_body,
            headers={"asaas-access-token": ASAAS_TOKEN, "content-type": "application/json"},
        )
    assert ok.status_code == 200
    assert asaas.status_code == 200, asaas.text
    async with create_store(database_url) as store:
        stripe_event = await store.find_event("stripe", "evt_headers")
        asaas_event = await store.find_event("asaas", "evt_asaas_1")
    assert stripe_event is not None
    assert asaas_event is not None
    kept = set(stripe_event.headers)
    assert {"stripe-signature", "content-type", "user-agent"} <= kept
    assert not kept & {"authorization", "cookie", "x-api_key", "x-attacker-filler"}
    # Asaas's token is the shared secret itself: verified, never stored.
    assert "asaas-access-token" not in asaas_event.headers
