"""API clients without I/O: which object an event points to, parsing, policy, configuration."""

from __future__ import annotations

import inspect
import json
import logging
import random
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

import onceonly.clients
from onceonly import ConfigurationError, Delivery, Event, EventStatus, NotFetchable, Onceonly
from onceonly.clients import (
    CLIENT_CLASSES,
    ApiRetryPolicy,
    AsaasClient,
    MercadoPagoClient,
    PagBankClient,
    StripeClient,
    Target,
    clients_from_environ,
)
from onceonly.clients.base import parse_retry_after
from onceonly.clients.pagbank import parse_transaction_xml
from onceonly.dev.payloads import PaymentFacts, api_objects, build_event, default_object_id
from onceonly.providers import PROVIDER_CLASSES, Stripe
from onceonly.providers.mercadopago import MercadoPago
from onceonly.providers.pagbank import PagBank

TOKEN = "tok_unit_secret_value"


def event(
    provider: str,
    body: Any,
    *,
    event_id: str = "evt_1",
    event_type: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Event:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Event(
        id=1,
        provider=provider,
        event_id=event_id,
        event_type=event_type,
        body=raw,
        headers=headers or {},
        received_at=datetime.now(UTC),
        status=EventStatus.PROCESSING,
        attempts=1,
    )


# Stripe.


def test_a_stripe_event_points_to_itself_by_default() -> None:
    client = StripeClient(TOKEN)
    target = client.target(event("stripe", {"id": "evt_1", "data": {}}, event_id="evt_1"))
    assert target == Target("event", "evt_1")


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"object": "payment_intent", "id": "pi_1"}, "pi_1"),
        ({"object": "charge", "id": "ch_1", "payment_intent": "pi_2"}, "pi_2"),
        ({"object": "refund", "id": "re_1", "payment_intent": {"id": "pi_3"}}, "pi_3"),
    ],
)
def test_a_stripe_event_names_its_payment_intent(obj: dict[str, Any], expected: str) -> None:
    target = StripeClient(TOKEN).target(
        event("stripe", {"data": {"object": obj}}), "payment_intent"
    )
    assert target == Target("payment_intent", expected)


def test_a_stripe_event_without_a_payment_intent_is_not_fetchable() -> None:
    customer = event("stripe", {"data": {"object": {"object": "customer", "id": "cus_1"}}})
    with pytest.raises(NotFetchable, match="names no payment intent"):
        StripeClient(TOKEN).target(customer, "payment_intent")
    with pytest.raises(NotFetchable, match="cannot fetch 'invoice'"):
        StripeClient(TOKEN).target(customer, "invoice")


# Mercado Pago.


def test_mercadopago_prefers_the_signed_query_over_the_body() -> None:
    notification = event(
        "mercadopago",
        {"type": "payment", "data": {"id": "999"}},
        headers={"onceonly-query": "data.id=123&type=payment"},
    )
    assert MercadoPagoClient(TOKEN).target(notification) == Target("payment", "123")


@pytest.mark.parametrize(
    ("body", "headers", "expected"),
    [
        ({"action": "payment.updated", "data": {"id": 555}}, {}, "555"),
        (b"", {"onceonly-query": "topic=payment&id=777"}, "777"),
        (
            {"topic": "payment", "resource": "https://api.mercadolibre.com/collections/42"},
            {},
            "42",
        ),
        ({"topic": "payment", "resource": "43"}, {}, "43"),
    ],
)
def test_mercadopago_finds_the_payment_in_every_notification_shape(
    body: Any, headers: dict[str, str], expected: str
) -> None:
    assert MercadoPagoClient(TOKEN).target(event("mercadopago", body, headers=headers)).id == (
        expected
    )


def test_mercadopago_refuses_a_notification_about_something_else() -> None:
    order = event("mercadopago", b"", headers={"onceonly-query": "topic=merchant_order&id=1"})
    with pytest.raises(NotFetchable, match="merchant_order"):
        MercadoPagoClient(TOKEN).target(order)


@pytest.mark.parametrize("bad", ["../../v1/account", "1?x=2", "a/b", "", " 1", "%2e%2e"])
def test_an_id_that_could_steer_the_request_is_never_used(bad: str) -> None:
    unsigned = event("mercadopago", b"", headers={"onceonly-query": f"type=payment&id={bad}"})
    tampered = event("mercadopago", {"type": "payment", "data": {"id": bad}})
    with pytest.raises(NotFetchable):
        MercadoPagoClient(TOKEN).target(unsigned)
    with pytest.raises(NotFetchable):
        MercadoPagoClient(TOKEN).target(tampered)


# Asaas.


def test_asaas_points_to_the_payment_it_carries() -> None:
    body = {"id": "evt_a", "event": "PAYMENT_RECEIVED", "payment": {"id": "pay_9", "value": 10}}
    assert AsaasClient(TOKEN).target(event("asaas", body)) == Target("payment", "pay_9")
    with pytest.raises(NotFetchable, match="carries no payment"):
        AsaasClient(TOKEN).target(event("asaas", {"id": "evt_b", "event": "TRANSFER_DONE"}))


def test_asaas_sends_its_key_in_the_access_token_header() -> None:
    assert AsaasClient(TOKEN).auth_headers() == {"access_token": TOKEN}
    assert StripeClient(TOKEN).auth_headers() == {"authorization": f"Bearer {TOKEN}"}


# PagBank and legacy PagSeguro.


def test_pagbank_points_to_the_order_or_charge_it_carries() -> None:
    client = PagBankClient(TOKEN)
    order = event("pagbank", {"id": "ORDE_1", "charges": [{"id": "CHAR_1"}, {"id": "CHAR_2"}]})
    charge = event("pagbank", {"id": "CHAR_7", "status": "PAID"})
    assert client.target(order) == Target("order", "ORDE_1")
    assert client.target(order, "charge") == Target("charge", "CHAR_1")
    assert client.target(charge) == Target("charge", "CHAR_7")
    with pytest.raises(NotFetchable):
        client.target(charge, "order")


def test_a_legacy_pagseguro_form_points_to_its_notification_code() -> None:
    client = PagBankClient(legacy_email="seller@example.com", legacy_token=TOKEN)
    form = event(
        "pagbank",
        b"notificationCode=766B9C-AD4B04&notificationType=transaction",
        event_id="unverified:766B9C-AD4B04",
        event_type="unverified:transaction",
    )
    assert client.target(form) == Target("notification", "766B9C-AD4B04")
    with pytest.raises(NotFetchable):
        client.target(form, "order")


def test_a_signed_order_quoting_a_notification_code_is_read_as_the_order() -> None:
    # The body's text is the seller's customer's: a free-text field holding
    # "&notificationCode=..." must not turn a signed order into a legacy
    # lookup of a transaction the customer chose. Legacy or current is what
    # the provider recorded when it verified the delivery.
    provider = PagBank("token")
    body = json.dumps(
        {"id": "ORDE_1", "status": "PAID", "notes": "x&notificationCode=CHOSEN-BY-ME&y"}
    ).encode()
    headers = provider.sign(body)
    signed = stored(provider, Delivery("pagbank", body, headers))
    client = PagBankClient(TOKEN, legacy_email="s@example.com", legacy_token=TOKEN)
    assert client.target(signed) == Target("order", "ORDE_1")
    assert client.target(event("pagbank", body, event_type="order")) == Target("order", "ORDE_1")


def test_a_body_without_its_legacy_verification_is_not_a_legacy_notification() -> None:
    # A stored event whose type does not say "unverified" was verified as a
    # current-API notification: its body is never parsed as a legacy form.
    client = PagBankClient(TOKEN, legacy_email="s@example.com", legacy_token=TOKEN)
    with pytest.raises(NotFetchable):
        client.target(event("pagbank", b"notificationCode=766B9C&notificationType=transaction"))


def test_the_legacy_transaction_xml_becomes_a_dict() -> None:
    xml = (
        '<?xml version="1.0" encoding="ISO-8859-1" standalone="yes"?>'
        "<transaction><code>9E88</code><status>3</status><reference>Pedido Ã§</reference>"
        "<items><item><id>1</id></item><item><id>2</id></item></items></transaction>"
    ).encode("latin-1")
    parsed = parse_transaction_xml(xml)
    assert parsed["status"] == "3"
    assert parsed["reference"] == "Pedido Ã§"
    assert parsed["items"] == {"item": [{"id": "1"}, {"id": "2"}]}


@pytest.mark.parametrize(
    ("xml", "reason"),
    [
        # An entity expansion bomb and an external entity: refused, not expanded.
        (
            b'<?xml version="1.0"?><!DOCTYPE t [<!ENTITY a "aaaaaaaaaa">'
            b'<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">]><transaction>&b;</transaction>',
            "DTDForbidden",
        ),
        (
            b'<?xml version="1.0"?><!DOCTYPE t [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
            b"<transaction>&x;</transaction>",
            "DTDForbidden",
        ),
        (b"<errors><error><code>13001</code></error></errors>", "not <transaction>"),
        (b"<transaction><code>unclosed", "ParseError"),
    ],
)
def test_unsafe_or_unexpected_xml_is_refused(xml: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_transaction_xml(xml)


# Retry policy.


def test_backoff_grows_is_capped_and_jittered() -> None:
    policy = ApiRetryPolicy(retries=10, base=1.0, cap=4.0)
    for _ in range(50):
        assert 0.5 <= (policy.delay(1) or 0) <= 1.0
        assert 2.0 <= (policy.delay(3) or 0) <= 4.0
        assert 2.0 <= (policy.delay(9) or 0) <= 4.0


def test_retry_after_is_honoured_up_to_the_limit() -> None:
    policy = ApiRetryPolicy(max_retry_after=30)
    assert policy.delay(1, retry_after=7) == 7
    assert policy.delay(1, retry_after=120) is None  # give up now; the worker retries later


def test_retry_after_is_read_as_seconds_or_as_a_date() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("5") == 5
    assert parse_retry_after("Thu, 01 Jan 2026 12:00:30 GMT", now) == 30
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


# Configuration.


def test_clients_come_from_the_environment_by_route() -> None:
    found = clients_from_environ(
        {
            "ONCEONLY_STRIPE_API_TOKEN": "sk_test_1",
            "ONCEONLY_STRIPE_API_BASE": "http://127.0.0.1:9",
            "ONCEONLY_STRIPE_CONNECT_API_TOKEN": "sk_test_2",
            "ONCEONLY_ASAAS_API_TOKEN": "$aact_x",
            "ONCEONLY_API_TIMEOUT": "2.5",
            "ONCEONLY_API_RETRIES": "1",
        },
        {"stripe-connect": Stripe("whsec_x")},
    )
    assert set(found) == {"stripe", "stripe-connect", "asaas"}
    stripe, connect = found["stripe"], found["stripe-connect"]
    assert isinstance(connect, StripeClient)
    assert stripe.base_url == "http://127.0.0.1:9"
    assert connect.base_url == "https://api.stripe.com"
    assert (stripe.timeout, stripe.retry.retries) == (2.5, 1)
    assert found["asaas"].base_url == "https://api.asaas.com"


def test_pagbank_can_be_configured_for_the_legacy_api_alone() -> None:
    found = clients_from_environ(
        {"ONCEONLY_PAGBANK_LEGACY_EMAIL": "s@example.com", "ONCEONLY_PAGBANK_LEGACY_TOKEN": "t"}
    )
    client = found["pagbank"]
    assert isinstance(client, PagBankClient)
    assert client.legacy_base_url == "https://ws.pagseguro.uol.com.br"
    assert clients_from_environ({"ONCEONLY_PAGBANK_LEGACY_EMAIL": "s@example.com"}) == {}


def test_code_configuration_wins_over_the_environment() -> None:
    mine = MercadoPagoClient("APP_USR-code", base_url="http://127.0.0.1:1")
    app = Onceonly(
        database_url="sqlite:///:memory:",
        api_clients={"mercadopago": mine},
        environ={"ONCEONLY_MERCADOPAGO_API_TOKEN": "APP_USR-env", "ONCEONLY_STRIPE_API_TOKEN": "s"},
    )
    assert app.api_clients["mercadopago"] is mine
    assert isinstance(app.api_clients["stripe"], StripeClient)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: StripeClient(""), "needs a token"),
        (lambda: StripeClient("x", base_url="api.stripe.com"), "http:// or https://"),
        (lambda: StripeClient("x", timeout=0), "timeout"),
        (lambda: PagBankClient(legacy_email="s@example.com"), "legacy_token"),
        (lambda: ApiRetryPolicy(retries=-1), "retries"),
    ],
)
def test_bad_client_settings_are_refused(build: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        build()


def test_a_client_never_shows_its_token() -> None:
    client = PagBankClient(TOKEN, legacy_email="s@example.com", legacy_token="legacy_secret_99")
    assert TOKEN not in repr(client)
    assert client.redact(f"echo {TOKEN} and legacy_secret_99") == "echo *** and ***"


def test_query_tokens_are_masked_in_httpx_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    import onceonly.clients.base  # noqa: F401  (installs the filter)

    with caplog.at_level(logging.INFO, logger="httpx"):
        logging.getLogger("httpx").info(
            'HTTP Request: %s %s "%s"',
            "GET",
            "https://ws.example/v3/x?email=s%40example.com&token=abc123",
            "HTTP/1.1 200 OK",
        )
    assert "abc123" not in caplog.text
    assert "token=***" in caplog.text


def test_the_clients_package_exports_documented_names() -> None:
    for name in onceonly.clients.__all__:
        value = getattr(onceonly.clients, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert inspect.getdoc(value), name


# What the providers store is what the clients read.


def stored(provider: Any, delivery: Delivery) -> Event:
    """The event as the inbox stores it: the delivery's headers plus the provider's."""
    provider.verify(delivery)
    info = provider.identify(delivery)
    return event(
        provider.name,
        delivery.body,
        event_id=info.event_id,
        event_type=info.event_type,
        headers={**delivery.headers, **info.extra_headers},
    )


def test_an_unsigned_mercadopago_ipn_is_a_trigger_the_client_can_follow() -> None:
    provider = MercadoPago("secret", unsigned="fetch")
    ipn = stored(provider, Delivery("mercadopago", b"", {}, {"topic": "payment", "id": "777"}))
    assert ipn.event_id.startswith("unverified:")
    assert MercadoPagoClient(TOKEN).target(ipn) == Target("payment", "777")


def test_a_signed_mercadopago_notification_is_read_by_its_signed_data_id() -> None:
    provider = MercadoPago("secret")
    body = json.dumps({"id": 1, "type": "payment", "data": {"id": "forged"}}).encode()
    query = {"data.id": "123", "type": "payment"}
    signed = stored(
        provider, Delivery("mercadopago", body, provider.sign(body, query=query), query)
    )
    assert MercadoPagoClient(TOKEN).target(signed) == Target("payment", "123")


def test_a_legacy_pagseguro_post_is_read_by_its_notification_code() -> None:
    form = b"notificationCode=766B9C-AD4B04&notificationType=transaction"
    headers = {"content-type": "application/x-www-form-urlencoded"}
    legacy = stored(PagBank("token"), Delivery("pagbank", form, headers))
    client = PagBankClient(legacy_email="s@example.com", legacy_token=TOKEN)
    assert client.target(legacy) == Target("notification", "766B9C-AD4B04")


@pytest.mark.parametrize("provider", ["stripe", "mercadopago", "asaas", "pagbank"])
def test_the_fake_gateway_s_events_point_to_objects_its_api_serves(provider: str) -> None:
    # `onceonly dev gateway` sends these events and stores these objects in
    # the fake API: a handler's ctx.fetch() must find them.
    facts = PaymentFacts(default_object_id(provider, random.Random(1)))
    outgoing = build_event(provider, facts=facts, rng=random.Random(2))
    served = {(kind, object_id) for kind, object_id, _ in api_objects(provider, outgoing, facts)}
    delivery = Delivery(provider, outgoing.body, dict(outgoing.headers), dict(outgoing.query))
    info = PROVIDER_CLASSES[provider]("secret").identify(delivery)
    stored_event = event(
        provider,
        outgoing.body,
        event_id=info.event_id,
        event_type=info.event_type,
        headers=info.extra_headers,
    )
    target = CLIENT_CLASSES[provider](TOKEN).target(stored_event)
    assert (target.kind, target.id) in served
