"""API clients against the fake provider API on a real loopback server, and
``ctx.fetch()`` inside handlers run by the real worker on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from onceonly import (
    ApiError,
    ApiUnavailable,
    Context,
    Event,
    EventStatus,
    NewEvent,
    Onceonly,
    create_store,
)
from onceonly.clients import (
    ApiClient,
    ApiRetryPolicy,
    AsaasClient,
    MercadoPagoClient,
    PagBankClient,
    StripeClient,
    Target,
)
from onceonly.dev.api import DEFAULT_TOKEN, FakeApi
from onceonly.operations import replay
from onceonly.providers.mercadopago import MercadoPago
from onceonly.worker import running
from ports import free_port
from support import live_server

NO_WAIT = ApiRetryPolicy(retries=3, base=0.0)
LEGACY_EMAIL = "seller@example.com"


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeApi, str]]:
    api = FakeApi()
    with live_server(api) as url:
        yield api, url


@pytest.fixture
def fake(served: tuple[FakeApi, str]) -> FakeApi:
    served[0].clear()
    return served[0]


@pytest.fixture
def url(served: tuple[FakeApi, str]) -> str:
    return served[1]


def mercadopago(url: str, **options: Any) -> MercadoPagoClient:
    options.setdefault("retry", NO_WAIT)
    return MercadoPagoClient(options.pop("token", DEFAULT_TOKEN), base_url=url, **options)


# Each client reads its provider's objects at the real paths.


CASES: list[tuple[str, str, str, dict[str, Any]]] = [
    ("stripe", "event", "evt_1", {"id": "evt_1", "data": {"object": {"status": "succeeded"}}}),
    ("stripe", "payment_intent", "pi_1", {"id": "pi_1", "status": "processing"}),
    ("mercadopago", "payment", "123", {"id": 123, "status": "pending"}),
    ("asaas", "payment", "pay_1", {"id": "pay_1", "status": "PENDING"}),
    ("pagbank", "order", "ORDE_1", {"id": "ORDE_1", "charges": []}),
    ("pagbank", "charge", "CHAR_1", {"id": "CHAR_1", "status": "WAITING"}),
    ("pagbank", "notification", "NC-1", {"code": "TX-1", "status": "1", "grossAmount": "10.00"}),
]


def client_for(provider: str, url: str) -> ApiClient:
    if provider == "stripe":
        return StripeClient(DEFAULT_TOKEN, base_url=url, retry=NO_WAIT)
    if provider == "mercadopago":
        return mercadopago(url)
    if provider == "asaas":
        return AsaasClient(DEFAULT_TOKEN, base_url=url, retry=NO_WAIT)
    return PagBankClient(
        DEFAULT_TOKEN,
        base_url=url,
        legacy_email=LEGACY_EMAIL,
        legacy_base_url=url,
        retry=NO_WAIT,
    )


@pytest.mark.parametrize(("provider", "kind", "object_id", "obj"), CASES)
async def test_each_client_reads_its_provider_s_object(
    fake: FakeApi, url: str, provider: str, kind: str, object_id: str, obj: dict[str, Any]
) -> None:
    fake.put(provider, kind, object_id, obj)
    async with client_for(provider, url) as client:
        assert await client.get(Target(kind, object_id)) == obj
        fake.set_status(provider, kind, object_id, "changed")
        again = await client.get(Target(kind, object_id))
    status = again["data"]["object"]["status"] if kind == "event" else again["status"]
    assert status == "changed"
    assert fake.hits(provider, kind, object_id) == 2


# Retries, timeouts, errors.


async def test_a_503_is_retried_until_the_api_answers(fake: FakeApi, url: str) -> None:
    fake.put("mercadopago", "payment", "123", {"id": 123, "status": "approved"})
    fake.fail(2, status=503)
    async with mercadopago(url) as client:
        payment = await client.retrieve_payment(123)
    assert payment["status"] == "approved"
    assert [r.status for r in fake.requests] == [503, 503, 200]


async def test_a_429_waits_as_long_as_retry_after_says(fake: FakeApi, url: str) -> None:
    fake.put("asaas", "payment", "pay_1", {"id": "pay_1", "status": "RECEIVED"})
    fake.fail(1, status=429, retry_after=0)
    async with AsaasClient(DEFAULT_TOKEN, base_url=url, retry=NO_WAIT) as client:
        assert (await client.retrieve_payment("pay_1"))["status"] == "RECEIVED"
    assert [r.status for r in fake.requests] == [429, 200]


async def test_a_retry_after_longer_than_the_policy_allows_gives_up_at_once(
    fake: FakeApi, url: str
) -> None:
    fake.fail(5, status=503, retry_after=3600)
    async with mercadopago(url) as client:
        with pytest.raises(ApiUnavailable, match="retry after 3600 s") as caught:
            await client.retrieve_payment(1)
    assert caught.value.status == 503
    assert fake.hits() == 1


async def test_a_404_is_an_answer_not_a_hiccup(fake: FakeApi, url: str) -> None:
    async with mercadopago(url) as client:
        with pytest.raises(ApiError) as caught:
            await client.retrieve_payment(404404)
    assert not isinstance(caught.value, ApiUnavailable)
    assert caught.value.status == 404
    assert "not found" in caught.value.body
    assert fake.hits() == 1  # never retried


async def test_exhausted_retries_raise_unavailable_without_the_token(
    fake: FakeApi, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake.fail(10, status=502)
    client = PagBankClient(
        DEFAULT_TOKEN,
        base_url=url,
        legacy_email=LEGACY_EMAIL,
        legacy_base_url=url,
        retry=ApiRetryPolicy(retries=2, base=0.0),
    )
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(ApiUnavailable, match="3 attempts") as caught:
            await client.retrieve_notification("NC-1")
        await client.aclose()
    assert caught.value.status == 502
    assert fake.hits() == 3
    assert "token=***" in caplog.text  # httpx's own request lines, masked
    for text in (str(caught.value), caught.value.body, caplog.text):
        assert DEFAULT_TOKEN not in text


async def test_a_wrong_token_is_refused_and_not_repeated_back(fake: FakeApi, url: str) -> None:
    fake.put("stripe", "event", "evt_1", {"id": "evt_1"})
    secret = "sk_test_wrong_but_secret"
    async with StripeClient(secret, base_url=url, retry=NO_WAIT) as client:
        with pytest.raises(ApiError) as caught:
            await client.retrieve_event("evt_1")
    assert caught.value.status == 401
    assert secret not in str(caught.value)
    assert fake.hits() == 1


async def test_a_slow_api_times_out_as_unavailable(fake: FakeApi, url: str) -> None:
    fake.put("mercadopago", "payment", "1", {"id": 1, "status": "approved"})
    fake.slow(2.0, count=2)
    async with mercadopago(url, timeout=0.2, retry=ApiRetryPolicy(retries=1, base=0.0)) as client:
        with pytest.raises(ApiUnavailable, match="2 attempts") as caught:
            await client.retrieve_payment(1)
    assert caught.value.status is None
    assert "Timeout" in str(caught.value)


async def test_an_unreachable_api_is_unavailable() -> None:
    client = mercadopago(f"http://127.0.0.1:{free_port()}", retry=ApiRetryPolicy(retries=1, base=0))
    with pytest.raises(ApiUnavailable, match="ConnectError"):
        await client.retrieve_payment(1)
    await client.aclose()


async def test_an_answer_that_is_not_json_is_an_error(fake: FakeApi, url: str) -> None:
    # The legacy XML path is served at the PagSeguro path only; asking the
    # JSON client there gets XML back.
    fake.put("pagbank", "notification", "NC-2", {"code": "TX"})
    client = StripeClient(DEFAULT_TOKEN, base_url=url, retry=NO_WAIT)
    with pytest.raises(ApiError, match="not a JSON object"):
        await client.get_json(
            "/v3/transactions/notifications/NC-2",
            params={"email": LEGACY_EMAIL, "token": DEFAULT_TOKEN},
        )
    await client.aclose()


# Inside handlers, with the real worker.


def make_app(database_url: str, url: str, **options: Any) -> Onceonly:
    options.setdefault("retry_base", 0.01)
    app = Onceonly(
        database_url=database_url,
        environ={},
        api_clients={"mercadopago": mercadopago(url)},
        **options,
    )
    with app.engine.begin() as conn:
        conn.execute(
            sa.text("CREATE TABLE releases (payment_id TEXT PRIMARY KEY, event_id TEXT NOT NULL)")
        )
    return app


def released(app: Onceonly) -> list[tuple[str, str]]:
    with app.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT payment_id, event_id FROM releases")).all()
    return sorted((r.payment_id, r.event_id) for r in rows)


def statuses(app: Onceonly) -> dict[str, str]:
    with app.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT event_id, status FROM onceonly_events")).all()
    return {r.event_id: r.status for r in rows}


def insert(database_url: str, *events: tuple[str, str, str]) -> None:
    """Store Mercado Pago notifications (event id, action, payment id) directly."""

    async def run() -> None:
        async with create_store(database_url) as store:
            await store.insert_events(
                [
                    NewEvent(
                        "mercadopago",
                        event_id,
                        action,
                        json.dumps({"type": "payment", "data": {"id": payment}}).encode(),
                        {},
                    )
                    for event_id, action, payment in events
                ]
            )

    asyncio.run(run())


def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def post(
    server: str,
    provider: MercadoPago,
    payment_id: str,
    body: dict[str, Any],
    *,
    signed: bool = True,
) -> httpx.Response:
    raw = json.dumps(body).encode()
    query = {"data.id": payment_id, "type": "payment"}
    # The request id names the notification (it is what is signed, with
    # data.id): the same notification sent again carries the same one.
    request_id = f"req-{body.get('id')}"
    headers = provider.sign(raw, query=query, delivery_id=request_id) if signed else {}
    return httpx.post(
        f"{server}/webhooks/mercadopago",
        params=query,
        content=raw,
        headers={**headers, "content-type": "application/json"},
        timeout=10,
    )


def test_the_handler_acts_on_the_api_answer_not_on_the_payload(
    database_url: str, fake: FakeApi, url: str
) -> None:
    provider = MercadoPago("mp-webhook-secret", unsigned="fetch")
    app = make_app(database_url, url)
    app.providers["mercadopago"] = provider
    seen: list[str] = []

    @app.handler("mercadopago")
    def release(event: Event, ctx: Context) -> None:
        payment = ctx.fetch()  # the body claims "approved"; the API decides
        seen.append(payment["status"])
        if payment["status"] != "approved":
            return
        # One release per payment, whichever notification gets here first.
        ctx.connection.execute(
            sa.text(
                "INSERT INTO releases (payment_id, event_id) VALUES (:p, :e) "
                "ON CONFLICT (payment_id) DO NOTHING"
            ),
            {"p": str(payment["id"]), "e": event.event_id},
        )

    fake.put("mercadopago", "payment", "123", {"id": 123, "status": "pending"})
    claim = {"type": "payment", "action": "payment.updated", "data": {"id": "123"}}
    claim["status"] = "approved"  # the body is not signed: anyone can write this
    with live_server(app.asgi()) as server:
        assert post(server, provider, "123", {**claim, "id": 1001}).status_code == 200
        # An unsigned trigger (kept only to fetch) that also claims approval.
        assert post(server, provider, "123", {**claim, "id": 6666}, signed=False).status_code == 200
        app.worker().run_until_idle()
        assert statuses(app) == {"123:req-1001": "processed", "unverified:6666": "processed"}
        assert seen == ["pending", "pending"]
        assert released(app) == []

        # The payment goes through; Mercado Pago notifies again.
        fake.set_status("mercadopago", "payment", "123", "approved")
        assert post(server, provider, "123", {**claim, "id": 1002}).status_code == 200
        resend = post(server, provider, "123", {**claim, "id": 1002})
        assert resend.headers["onceonly-duplicate"] == "true"
        app.worker().run_until_idle()
        assert released(app) == [("123", "123:req-1002")]

    # An operator replays everything: the handlers run again, nothing is released twice.
    assert len(replay(app.engine, app.engine_kind, status=EventStatus.PROCESSED)) == 3
    app.worker().run_until_idle()
    assert released(app) == [("123", "123:req-1002")]
    assert seen.count("approved") == 4
    assert fake.hits("mercadopago", "payment", "123") == 6


def test_a_fetch_is_cached_for_the_attempt_and_repeated_on_a_retry(
    database_url: str, fake: FakeApi, url: str
) -> None:
    app = make_app(database_url, url, max_attempts=3)
    answers: list[tuple[int, str, bool]] = []

    @app.handler("mercadopago", "payment.created")
    def sync_handler(event: Event, ctx: Context) -> None:
        first, second = ctx.fetch(), ctx.fetch()
        answers.append((ctx.attempt, first["status"], first is second))
        if ctx.attempt == 1:
            raise RuntimeError("fail the first attempt")

    @app.handler("mercadopago", "payment.updated")
    async def async_handler(event: Event, ctx: Context) -> None:
        first, second = await ctx.afetch(), await ctx.afetch("payment")
        answers.append((ctx.attempt, first["status"], first is second))
        fake.set_status("mercadopago", "payment", "2", "approved")
        if ctx.attempt == 1:
            raise RuntimeError("fail the first attempt")

    fake.put("mercadopago", "payment", "1", {"id": 1, "status": "pending"})
    fake.put("mercadopago", "payment", "2", {"id": 2, "status": "pending"})

    insert(database_url, ("n1", "payment.created", "1"), ("n2", "payment.updated", "2"))
    app.worker().run_until_idle()
    assert statuses(app) == {"n1": "processed", "n2": "processed"}
    assert sorted(answers) == [
        (1, "pending", True),
        (1, "pending", True),
        (2, "approved", True),  # the retry read the API again and saw the change
        (2, "pending", True),
    ]
    assert fake.hits("mercadopago", "payment", "1") == 2
    assert fake.hits("mercadopago", "payment", "2") == 2


def test_a_prefetch_waits_on_the_api_without_holding_the_database(
    tmp_path: Path, fake: FakeApi, url: str
) -> None:
    # SQLite has one write lock; a handler's transaction holds it. With
    # prefetch the API is read before that transaction begins.
    database_url = f"sqlite:///{tmp_path / 'onceonly.db'}"
    app = make_app(database_url, url)
    seen: list[str] = []

    @app.handler("mercadopago", prefetch=True)
    def handler(event: Event, ctx: Context) -> None:
        seen.append(ctx.fetch()["status"])

    fake.put("mercadopago", "payment", "1", {"id": 1, "status": "pending"})
    insert(database_url, ("n1", "payment.updated", "1"))
    fake.hold()
    try:
        with running(app.worker()):
            wait_for(lambda: fake.held == 1)
            # The API hangs; a new delivery is still stored (with the lock
            # held this would fail after SQLite's busy timeout).
            insert(database_url, ("n2", "payment.updated", "1"))
            assert seen == []
            fake.release()
            wait_for(lambda: statuses(app) == {"n1": "processed", "n2": "processed"})
    finally:
        fake.release()
    assert seen == ["pending", "pending"]
    assert fake.hits("mercadopago", "payment", "1") == 2


def test_a_failed_prefetch_fails_the_attempt_when_the_handler_fetches(
    database_url: str, fake: FakeApi, url: str
) -> None:
    app = make_app(database_url, url, max_attempts=2)
    errors: list[str] = []

    @app.handler("mercadopago", prefetch=True)
    def handler(event: Event, ctx: Context) -> None:
        try:
            ctx.fetch()
        except ApiError as exc:
            errors.append(type(exc).__name__)
            raise

    insert(database_url, ("n1", "payment.updated", "404"))
    app.worker().run_until_idle()
    assert statuses(app) == {"n1": "dead"}
    assert errors == ["ApiError", "ApiError"]
    assert fake.hits() == 2  # once per attempt, before each transaction


def test_the_fake_api_checks_credentials_and_can_be_driven_over_http(
    fake: FakeApi, url: str
) -> None:
    stored = httpx.put(f"{url}/_fake/asaas/payment/pay_1", json={"id": "pay_1", "status": "X"})
    assert stored.status_code == 200
    changed = httpx.post(f"{url}/_fake/asaas/payment/pay_1/status", json={"status": "RECEIVED"})
    assert changed.json()["status"] == "RECEIVED"
    assert httpx.get(f"{url}/_fake/asaas/order/1").status_code == 404  # no such kind

    asaas = f"{url}/v3/payments/pay_1"
    assert httpx.get(asaas).status_code == 401
    assert httpx.get(asaas, headers={"authorization": f"Bearer {DEFAULT_TOKEN}"}).status_code == 401
    assert httpx.get(asaas, headers={"access_token": DEFAULT_TOKEN}).json()["status"] == "RECEIVED"

    fake.put("pagbank", "notification", "NC-1", {"code": "TX-1", "status": "3"})
    legacy = f"{url}/v3/transactions/notifications/NC-1"
    wrong_email = {"email": "other@example.com", "token": DEFAULT_TOKEN}
    assert httpx.get(legacy, params=wrong_email).status_code == 401
    answer = httpx.get(legacy, params={"email": LEGACY_EMAIL, "token": DEFAULT_TOKEN})
    assert answer.headers["content-type"].startswith("application/xml")
    assert b"<status>3</status>" in answer.content
