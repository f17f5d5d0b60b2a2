"""Shopify: base64 HMAC-SHA256 over the raw body, and which of its two ids dedupes.

Signatures are computed here with ``hmac``/``base64``, as Shopify documents it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest

from onceonly import ConfigurationError, Delivery, PayloadError, SignatureError
from onceonly.providers import PROVIDER_CLASSES, Shopify
from onceonly.providers.shopify.verifier import EventIdHeader

SECRET = "shpss_0123456789abcdef0123456789abcdef"
BODY = json.dumps(
    {"id": 820982911946154508, "email": "jon@example.com", "total_price": "10.00"}
).encode()
WEBHOOK_ID = "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"
EVENT_ID = "98880550-7158-44d4-b7cd-2c97c8a091b5"


def shopify_hmac(body: bytes, secret: str = SECRET) -> str:
    return base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()


def headers(
    body: bytes = BODY,
    secret: str = SECRET,
    topic: str = "orders/create",
    webhook_id: str = WEBHOOK_ID,
) -> dict[str, str]:
    return {
        "x-shopify-hmac-sha256": shopify_hmac(body, secret),
        "x-shopify-webhook-id": webhook_id,
        "x-shopify-event-id": EVENT_ID,
        "x-shopify-topic": topic,
        "x-shopify-shop-domain": "example.myshopify.com",
    }


def delivery(h: dict[str, str], body: bytes = BODY) -> Delivery:
    return Delivery("shopify", body, h)


def test_documented_signature_is_accepted() -> None:
    p = Shopify(SECRET)
    item = delivery(headers())
    p.verify(item)
    info = p.identify(item)
    assert info.event_id == "sha256:" + hashlib.sha256(BODY).hexdigest()
    assert info.event_type == "orders/create"
    assert info.extra_headers == {"onceonly-type-signed": "false"}


def test_signature_is_base64_not_hex() -> None:
    hex_sig = hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest()
    with pytest.raises(SignatureError):
        Shopify(SECRET).verify(delivery(headers() | {"x-shopify-hmac-sha256": hex_sig}))


def test_base64_is_compared_case_sensitively() -> None:
    sig = shopify_hmac(BODY)
    assert sig != sig.swapcase()
    with pytest.raises(SignatureError):
        Shopify(SECRET).verify(delivery(headers() | {"x-shopify-hmac-sha256": sig.swapcase()}))


@pytest.mark.parametrize(
    ("h", "body"),
    [
        pytest.param(headers(), BODY.replace(b"10.00", b"0.01"), id="tampered"),
        pytest.param(headers(secret="shpss_wrong"), BODY, id="wrong secret"),
        pytest.param(
            {k: v for k, v in headers().items() if k != "x-shopify-hmac-sha256"}, BODY, id="missing"
        ),
        pytest.param(headers() | {"x-shopify-hmac-sha256": "not base64!"}, BODY, id="garbage"),
    ],
)
def test_rejections(h: dict[str, str], body: bytes) -> None:
    with pytest.raises(SignatureError) as caught:
        Shopify(SECRET).verify(delivery(h, body))
    assert caught.value.status == 401


def test_several_secrets_and_sign_uses_the_first() -> None:
    p = Shopify(["shpss_new", SECRET])
    p.verify(delivery(headers()))
    p.verify(delivery(headers(secret="shpss_new")))
    signed = p.sign(BODY, delivery_id=WEBHOOK_ID, timestamp=1_700_000_000)
    assert signed["x-shopify-hmac-sha256"] == shopify_hmac(BODY, "shpss_new")
    assert signed["x-shopify-webhook-id"] == WEBHOOK_ID
    assert signed["x-shopify-triggered-at"] == "2023-11-14T22:13:20Z"


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"x-shopify-webhook-id": "w-forged"}, id="webhook id"),
        pytest.param({"x-shopify-topic": "orders/paid"}, id="topic"),
        pytest.param({"x-shopify-event-id": "e-forged"}, id="event id"),
    ],
)
def test_unsigned_headers_do_not_make_a_new_event_by_default(changes: dict[str, str]) -> None:
    """Only the body is signed: a captured orders/create replayed as orders/paid,
    or with a new webhook id, is the same event."""
    p = Shopify(SECRET)
    replayed = delivery(headers() | changes)
    p.verify(replayed)
    assert p.identify(replayed).event_id == p.identify(delivery(headers())).event_id


def test_webhook_id_mode_takes_the_unsigned_delivery_id() -> None:
    p = Shopify(SECRET, event_id="webhook-id")
    create = p.identify(delivery(headers(topic="orders/create")))
    paid = p.identify(delivery(headers(topic="orders/paid", webhook_id="w-2")))
    assert (create.event_id, paid.event_id) == (WEBHOOK_ID, "w-2")


def test_event_id_mode_collapses_deliveries_of_one_action() -> None:
    p = Shopify(SECRET, event_id="event-id")
    one = p.identify(delivery(headers()))
    other = p.identify(delivery(headers(webhook_id="w-2")))
    assert one.event_id == other.event_id == EVENT_ID


def test_event_id_mode_falls_back_to_the_webhook_id() -> None:
    p = Shopify(SECRET, event_id="event-id")
    h = {k: v for k, v in headers().items() if k != "x-shopify-event-id"}
    assert p.identify(delivery(h)).event_id == WEBHOOK_ID


def test_missing_webhook_id_is_a_payload_error() -> None:
    h = {k: v for k, v in headers().items() if k != "x-shopify-webhook-id"}
    with pytest.raises(PayloadError):
        Shopify(SECRET, event_id="webhook-id").identify(delivery(h))


def test_from_environ() -> None:
    cls = PROVIDER_CLASSES["shopify"]
    p = cls.from_environ({"ONCEONLY_SHOPIFY_EVENT_ID": "event-id"}, [SECRET])
    assert isinstance(p, Shopify)
    assert p.event_id == "event-id"
    assert isinstance(d := cls.from_environ({}, [SECRET]), Shopify)
    assert d.event_id == "body"
    with pytest.raises(ConfigurationError):
        cls.from_environ({"ONCEONLY_SHOPIFY_EVENT_ID": "topic"}, [SECRET])


# Shopify's Events deliveries drop the X- prefix: Shopify-Hmac-Sha256, ...


def events_headers(
    secret: str = SECRET, topic: str = "orders/create", webhook_id: str = WEBHOOK_ID
) -> dict[str, str]:
    """The same delivery as Events sends it: every name without ``x-``."""
    classic = headers(secret=secret, topic=topic, webhook_id=webhook_id)
    return {name.removeprefix("x-"): value for name, value in classic.items()}


def test_events_header_names_are_verified_and_identified() -> None:
    h = events_headers(topic="orders/paid")
    assert "shopify-hmac-sha256" in h
    assert "x-shopify-hmac-sha256" not in h
    p = Shopify(SECRET)
    p.verify(delivery(h))
    info = p.identify(delivery(h))
    # The same body is the same event, whichever header family carried it.
    assert info.event_id == p.identify(delivery(headers())).event_id
    assert info.event_type == "orders/paid"


@pytest.mark.parametrize(("mode", "expected"), [("webhook-id", "w-events"), ("event-id", EVENT_ID)])
def test_events_header_names_feed_the_id_modes(mode: EventIdHeader, expected: str) -> None:
    h = events_headers(webhook_id="w-events")
    assert Shopify(SECRET, event_id=mode).identify(delivery(h)).event_id == expected


@pytest.mark.parametrize(
    ("h", "body"),
    [
        pytest.param(events_headers(), BODY.replace(b"10.00", b"0.01"), id="tampered"),
        pytest.param(events_headers(secret="shpss_wrong"), BODY, id="wrong secret"),
        pytest.param(
            {k: v for k, v in events_headers().items() if k != "shopify-hmac-sha256"},
            BODY,
            id="missing",
        ),
    ],
)
def test_events_header_names_are_refused_like_the_others(h: dict[str, str], body: bytes) -> None:
    with pytest.raises(SignatureError):
        Shopify(SECRET).verify(delivery(h, body))


def test_the_x_header_is_read_first_when_both_are_sent() -> None:
    both = headers() | {"shopify-hmac-sha256": shopify_hmac(BODY, "shpss_wrong")}
    Shopify(SECRET).verify(delivery(both))
    wrong_x = events_headers() | {"x-shopify-hmac-sha256": shopify_hmac(BODY, "shpss_wrong")}
    with pytest.raises(SignatureError):
        Shopify(SECRET).verify(delivery(wrong_x))
