"""The receiver over real HTTP on loopback, against a real SQLite file and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator, MutableMapping
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from onceonly import Onceonly, create_store
from onceonly.asgi import Receive, Scope, Send
from onceonly.providers import GitHub, Stripe
from support import STRIPE_SECRET, live_server, signed, stripe_delivery


def make_app(database_url: str, *, max_body_bytes: int | None = None) -> Onceonly:
    return Onceonly(
        database_url=database_url,
        providers={"stripe": Stripe(STRIPE_SECRET), "github": GitHub("gh-secret")},
        environ={},
        max_body_bytes=max_body_bytes,
    )


@pytest.fixture
def server(database_url: str) -> Iterator[str]:
    with live_server(make_app(database_url, max_body_bytes=4096).asgi()) as url:
        yield url


async def count_rows(database_url: str) -> int:
    async with create_store(database_url) as store:
        return len(await store.list_events(limit=100_000))


async def test_new_event_is_200_and_stored(server: str, database_url: str) -> None:
    body, headers = stripe_delivery("evt_new")
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{server}/webhooks/stripe", content=body, headers=headers)
    assert response.status_code == 200
    assert response.headers["onceonly-duplicate"] == "false"
    async with create_store(database_url) as store:
        stored = await store.find_event("stripe", "evt_new")
    assert stored is not None
    assert stored.body == body  # the raw bytes, not a re-serialisation
    assert stored.event_type == "payment_intent.succeeded"
    assert stored.headers["stripe-signature"] == headers["stripe-signature"]


async def test_100_concurrent_deliveries_of_one_event_make_one_row(
    server: str, database_url: str
) -> None:
    body, headers = stripe_delivery("evt_storm")
    limits = httpx.Limits(max_connections=100)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        # Open the connections first so the 100 requests really are in flight together.
        responses = await asyncio.gather(
            *(
                client.post(f"{server}/webhooks/stripe", content=body, headers=headers)
                for _ in range(100)
            )
        )
    assert [r.status_code for r in responses] == [200] * 100
    duplicates = [r.headers["onceonly-duplicate"] for r in responses]
    assert duplicates.count("false") == 1
    assert duplicates.count("true") == 99
    assert await count_rows(database_url) == 1


async def test_many_distinct_concurrent_events_all_stored(server: str, database_url: str) -> None:
    deliveries = [stripe_delivery(f"evt_{i}") for i in range(300)]
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64), timeout=30) as client:
        responses = await asyncio.gather(
            *(client.post(f"{server}/webhooks/stripe", content=b, headers=h) for b, h in deliveries)
        )
    assert {r.status_code for r in responses} == {200}
    assert await count_rows(database_url) == 300


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        ("tampered", "no v1 signature matches"),
        ("wrong-secret", "no v1 signature matches"),
        ("stale", "tolerance"),
        ("future", "tolerance"),
        ("missing", "missing stripe-signature"),
        ("malformed", "malformed"),
    ],
)
async def test_bad_signatures_are_401_and_store_nothing(
    server: str, database_url: str, change: str, detail: str
) -> None:
    import time

    now = int(time.time())
    secret = "whsec_wrong" if change == "wrong-secret" else STRIPE_SECRET
    # Well past the 300 s tolerance: the exact edges are unit-tested with a frozen clock.
    timestamp = {"stale": now - 330, "future": now + 330}.get(change, now)
    body, headers = stripe_delivery("evt_bad", secret=secret, timestamp=timestamp)
    if change == "tampered":
        body = body.replace(b"payment_intent", b"payment_intenT")
    elif change == "missing":
        del headers["stripe-signature"]
    elif change == "malformed":
        headers["stripe-signature"] = "garbage"
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{server}/webhooks/stripe", content=body, headers=headers)
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/problem+json"
    assert detail in response.json()["detail"]
    assert await count_rows(database_url) == 0


async def test_rejection_status_is_configurable(database_url: str) -> None:
    app = Onceonly(
        database_url=database_url,
        providers={"stripe": Stripe(STRIPE_SECRET, rejection_status=406)},
        environ={},
    )
    body, headers = stripe_delivery("evt_x", secret="whsec_other")
    with live_server(app.asgi()) as url:
        async with httpx.AsyncClient() as client:
            response = await client.post(f"{url}/webhooks/stripe", content=body, headers=headers)
    assert response.status_code == 406


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json", "not valid JSON"),
        (b"[1, 2]", "not an object"),
        (b'{"type": "charge.succeeded"}', "no event id"),
        (b'{"id": ""}', "event id"),
    ],
)
async def test_unparseable_or_idless_bodies_are_400_with_a_reason(
    server: str, database_url: str, body: bytes, reason: str
) -> None:
    _, headers = signed(body)
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{server}/webhooks/stripe", content=body, headers=headers)
    assert response.status_code == 400
    problem = response.json()
    assert problem["status"] == 400
    assert reason in problem["detail"]
    assert await count_rows(database_url) == 0


async def test_routing_answers(server: str) -> None:
    body, headers = stripe_delivery("evt_r")
    async with httpx.AsyncClient() as client:
        unknown = await client.post(f"{server}/webhooks/paypal", content=body, headers=headers)
        elsewhere = await client.post(f"{server}/other", content=body, headers=headers)
        nested = await client.post(f"{server}/webhooks/stripe/x", content=body, headers=headers)
        get = await client.get(f"{server}/webhooks/stripe")
        health = await client.get(f"{server}/healthz")
    assert unknown.status_code == 404
    assert "paypal" in unknown.json()["detail"]
    assert elsewhere.status_code == 404
    assert nested.status_code == 404
    assert get.status_code == 405
    assert get.headers["allow"] == "POST"
    assert health.status_code == 200
    assert health.json()["status"] == "ok"


async def test_bodies_over_the_limit_are_413_declared_or_streamed(
    server: str, database_url: str
) -> None:
    big, headers = stripe_delivery("evt_big", extra={"pad": "x" * 5000})

    async def chunks() -> object:
        for i in range(0, len(big), 1000):
            yield big[i : i + 1000]

    async with httpx.AsyncClient() as client:
        declared = await client.post(f"{server}/webhooks/stripe", content=big, headers=headers)
        streamed = await client.post(
            f"{server}/webhooks/stripe",
            content=chunks(),  # type: ignore[arg-type]
            headers=headers,
        )
    assert declared.status_code == 413
    assert streamed.status_code == 413
    assert "transfer-encoding" not in declared.request.headers
    assert streamed.request.headers["transfer-encoding"] == "chunked"
    assert await count_rows(database_url) == 0


async def test_mounted_inside_a_starlette_app(database_url: str) -> None:
    app = make_app(database_url)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        # Starlette passes no lifespan events to a mounted app: the outer
        # app closes the store, or its connections outlive the server.
        await app.store.close()

    outer = Starlette(
        routes=[
            Route("/", lambda request: PlainTextResponse("home")),
            Mount("/hooks", app=app.receiver()),
        ],
        lifespan=lifespan,
    )
    body, headers = stripe_delivery("evt_mounted")
    with live_server(outer) as url:
        async with httpx.AsyncClient() as client:
            home = await client.get(url)
            response = await client.post(f"{url}/hooks/stripe", content=body, headers=headers)
    assert home.text == "home"
    assert response.status_code == 200
    assert json.loads(response.content) == {"received": True, "duplicate": False}
    assert await count_rows(database_url) == 1


async def test_middleware_that_adds_a_header_in_place_adds_it_once_per_answer(
    database_url: str,
) -> None:
    # The receiver's two answers are built once; each response must still get
    # a header list of its own, or the second answer would carry the first's
    # additions (Starlette's MutableHeaders appends to the message's list).
    receiver = make_app(database_url).asgi()

    async def tagging(scope: Scope, receive: Receive, send: Send) -> None:
        async def tagged_send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"].append((b"x-tag", b"1"))
            await send(message)

        await receiver(scope, receive, tagged_send)

    with live_server(tagging) as url:
        async with httpx.AsyncClient() as client:
            answers = []
            for i in range(3):
                body, headers = stripe_delivery(f"evt_tag_{i}")
                answers.append(
                    await client.post(f"{url}/webhooks/stripe", content=body, headers=headers)
                )
    assert [r.status_code for r in answers] == [200] * 3
    assert [r.headers.get_list("x-tag") for r in answers] == [["1"]] * 3
    assert [r.headers["content-length"] for r in answers] == [str(len(answers[0].content))] * 3
