"""Mercado Pago: the ``x-signature`` manifest, checked against the documented
scheme and against the official ``mercadopago`` SDK's validator both ways.

Signatures are computed here with ``hmac``/``hashlib`` from the documented
manifest, never with onceonly's helpers.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Mapping

import pytest
from mercadopago.webhook import (  # type: ignore[import-untyped]  # ships no type hints
    InvalidWebhookSignatureError,
    WebhookSignatureValidator,
)

from onceonly import ConfigurationError, Delivery, PayloadError, SignatureError
from onceonly.providers import PROVIDER_CLASSES, MercadoPago, is_unverified

NOW = 1_700_000_000
SECRET = "mp-webhook-secret-0123456789abcdef"
OLD_SECRET = "mp-previous-secret"
REQUEST_ID = "bb56a2f1-6aae-46ac-982e-9dcd3581d08e"
PAYMENT_ID = "123456789"
ORDER_ID = "ORD01JQ4S4KY8HWQ6NA5PXB65B3D3"  # Orders API ids are upper-case alphanumerics

BODY = json.dumps(
    {
        "action": "payment.updated",
        "api_version": "v1",
        "data": {"id": PAYMENT_ID},
        "date_created": "2026-11-30T10:04:58Z",
        "id": 12345678901,
        "live_mode": True,
        "type": "payment",
        "user_id": "44444",
    }
).encode()
QUERY = {"data.id": PAYMENT_ID, "type": "payment"}


def clock(at: float = NOW) -> Callable[[], float]:
    return lambda: float(at)


def documented_signature(
    data_id: str | None, request_id: str | None, ts: int | str, secret: str = SECRET
) -> str:
    """The manifest as Mercado Pago's docs give it; missing parts are left out."""
    text = ""
    if data_id:
        text += f"id:{data_id};"
    if request_id:
        text += f"request-id:{request_id};"
    text += f"ts:{ts};"
    return hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()


def signed_headers(
    data_id: str | None = PAYMENT_ID,
    request_id: str | None = REQUEST_ID,
    ts: int | str = NOW * 1000,
    secret: str = SECRET,
) -> dict[str, str]:
    headers = {"x-signature": f"ts={ts},v1={documented_signature(data_id, request_id, ts, secret)}"}
    if request_id is not None:
        headers["x-request-id"] = request_id
    return headers


def provider(**options: object) -> MercadoPago:
    options.setdefault("clock", clock())
    return MercadoPago(options.pop("secrets", SECRET), **options)  # type: ignore[arg-type]


def delivery(
    headers: Mapping[str, str], query: Mapping[str, str] = QUERY, body: bytes = BODY
) -> Delivery:
    return Delivery("mercadopago", body, dict(headers), dict(query))


def rejected(p: MercadoPago, item: Delivery) -> SignatureError:
    with pytest.raises(SignatureError) as caught:
        p.verify(item)
    return caught.value


# -- accepted as Mercado Pago signs ------------------------------------------------


@pytest.mark.parametrize("ts", [NOW, NOW * 1000, NOW * 1000 + 683], ids=["s", "ms", "ms+"])
def test_documented_signature_is_accepted_in_seconds_and_milliseconds(ts: int) -> None:
    p = provider(tolerance=300)
    item = delivery(signed_headers(ts=ts))
    p.verify(item)
    info = p.identify(item)
    assert (info.event_id, info.event_type) == (f"{PAYMENT_ID}:{REQUEST_ID}", "payment.updated")
    assert info.extra_headers["onceonly-verified"] == "true"
    assert info.extra_headers["onceonly-query"] == "data.id=123456789&type=payment"


def test_data_id_case_is_preserved() -> None:
    """Mercado Pago signs ``data.id`` as it appears in the URL."""
    p = provider()
    p.verify(delivery(signed_headers(data_id=ORDER_ID), {"data.id": ORDER_ID}))


def test_lower_cased_data_id_signature_is_also_accepted() -> None:
    """Older SDKs and docs lower-cased alphanumeric ids before signing."""
    p = provider()
    p.verify(delivery(signed_headers(data_id=ORDER_ID.lower()), {"data.id": ORDER_ID}))


def test_a_different_case_in_the_url_than_signed_is_rejected() -> None:
    """Only the exact form and its lower-case are tried, not any casing."""
    mixed = ORDER_ID[:5] + ORDER_ID[5:].lower()
    rejected(provider(), delivery(signed_headers(data_id=ORDER_ID), {"data.id": mixed}))


@pytest.mark.parametrize(
    ("data_id", "request_id", "query"),
    [
        pytest.param(None, REQUEST_ID, {"type": "payment"}, id="no data.id"),
        pytest.param(PAYMENT_ID, None, QUERY, id="no request id"),
        pytest.param(None, None, {}, id="only ts"),
    ],
)
def test_missing_manifest_parts_are_left_out(
    data_id: str | None, request_id: str | None, query: dict[str, str]
) -> None:
    provider().verify(delivery(signed_headers(data_id, request_id), query))


def test_signature_with_the_part_present_does_not_match_when_it_is_missing() -> None:
    # Signed over id:..., but the URL carries no data.id.
    rejected(provider(), delivery(signed_headers(), {"type": "payment"}))


def test_header_spacing_and_key_case_are_tolerated() -> None:
    sig = documented_signature(PAYMENT_ID, REQUEST_ID, NOW)
    headers = {"x-signature": f" TS={NOW} , V1={sig.upper()} ", "x-request-id": REQUEST_ID}
    provider().verify(delivery(headers))


def test_any_of_several_secrets_matches_and_sign_uses_the_first() -> None:
    p = provider(secrets=[OLD_SECRET, SECRET])
    p.verify(delivery(signed_headers(secret=SECRET)))
    p.verify(delivery(signed_headers(secret=OLD_SECRET)))
    headers = p.sign(BODY, timestamp=NOW, delivery_id=REQUEST_ID, query=QUERY)
    assert headers == signed_headers(secret=OLD_SECRET)
    rejected(provider(), delivery(headers))


# -- rejected ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "query"),
    [
        pytest.param(signed_headers(secret="wrong"), QUERY, id="wrong secret"),
        pytest.param(signed_headers(), {"data.id": "987654321"}, id="other data.id"),
        pytest.param({**signed_headers(), "x-request-id": "another"}, QUERY, id="other request id"),
        pytest.param(
            {
                **signed_headers(),
                "x-signature": signed_headers()["x-signature"].replace(
                    f"ts={NOW * 1000}", f"ts={NOW * 1000 + 1}"
                ),
            },
            QUERY,
            id="other ts",
        ),
        pytest.param({"x-signature": f"ts={NOW}", "x-request-id": REQUEST_ID}, QUERY, id="no v1"),
        pytest.param({"x-signature": "v1=" + "a" * 64}, QUERY, id="no ts"),
        pytest.param({"x-signature": "ts=soon,v1=" + "a" * 64}, QUERY, id="ts not digits"),
        pytest.param({"x-signature": "ts=-5,v1=" + "a" * 64}, QUERY, id="negative ts"),
        pytest.param({"x-signature": "ts=" + "9" * 5000 + ",v1=aa"}, QUERY, id="huge ts"),
        pytest.param({"x-request-id": REQUEST_ID}, QUERY, id="missing x-signature"),
        pytest.param({"x-signature": "  "}, QUERY, id="blank x-signature"),
    ],
)
def test_rejections(headers: dict[str, str], query: dict[str, str]) -> None:
    assert rejected(provider(), delivery(headers, query)).status == 401


def test_the_body_is_not_signed_so_a_changed_body_still_verifies() -> None:
    """A gotcha to know, not a feature: Mercado Pago signs the query's data.id,
    the request id and ts only. The handler must fetch by the signed data.id."""
    provider().verify(delivery(signed_headers(), body=BODY.replace(b"updated", b"created")))


@pytest.mark.parametrize(("offset", "ok"), [(0, True), (300, True), (-300, True), (301, False)])
@pytest.mark.parametrize("unit", [1, 1000], ids=["s", "ms"])
def test_tolerance_applies_to_seconds_and_milliseconds(offset: int, ok: bool, unit: int) -> None:
    p = provider(tolerance=300)
    item = delivery(signed_headers(ts=(NOW + offset) * unit))
    if ok:
        p.verify(item)
    else:
        assert "tolerance" in rejected(p, item).detail


def test_no_tolerance_by_default_as_in_the_sdk() -> None:
    """Mercado Pago documents none; a retry carrying its first ts must not be lost."""
    provider().verify(delivery(signed_headers(ts=(NOW - 86_400) * 1000)))


# -- event id and type ---------------------------------------------------------------


def test_event_id_is_what_is_signed_not_the_body_s_id() -> None:
    """The body is unsigned: with one captured signature, new body ids must
    not be new events, nor take the id of a later genuine notification."""
    p = provider()
    ids = {
        p.identify(delivery(signed_headers(), body=json.dumps(b).encode())).event_id
        for b in (json.loads(BODY) | {"id": n} for n in (1, 2, 3))
    }
    assert ids == {f"{PAYMENT_ID}:{REQUEST_ID}"}


def test_two_notifications_of_one_payment_are_two_events() -> None:
    p = provider()
    created = p.identify(delivery(signed_headers(request_id="req-created")))
    updated = p.identify(delivery(signed_headers(request_id="req-updated")))
    assert created.event_id != updated.event_id


def test_a_resend_signed_again_with_a_new_ts_dedupes() -> None:
    p = provider()
    first = p.identify(delivery(signed_headers(ts=NOW * 1000)))
    again = p.identify(delivery(signed_headers(ts=(NOW + 900) * 1000)))
    assert first.event_id == again.event_id


def test_without_a_request_id_the_signed_ts_identifies() -> None:
    p = provider()
    item = delivery(signed_headers(request_id=None))
    p.verify(item)
    assert p.identify(item).event_id == f"{PAYMENT_ID}:ts:{NOW * 1000}"


def test_a_body_that_is_not_json_is_kept() -> None:
    info = provider().identify(delivery(signed_headers(), body=b'{"id": {"nested": 1}}'))
    assert info.event_id == f"{PAYMENT_ID}:{REQUEST_ID}"


# -- unsigned notifications (QR code, legacy IPN) ------------------------------------

IPN_QUERY = {"topic": "payment", "id": PAYMENT_ID}
IPN_BODY = (
    b'{"resource": "https://api.mercadolibre.com/collections/notifications/1", "topic": "payment"}'
)


def test_unsigned_is_rejected_by_default() -> None:
    item = delivery({}, IPN_QUERY, IPN_BODY)
    assert "unsigned" in rejected(provider(), item).detail


def test_unsigned_accepted_only_as_an_unverified_trigger() -> None:
    p = provider(unsigned="fetch")
    item = delivery({"x-request-id": REQUEST_ID}, IPN_QUERY, IPN_BODY)
    p.verify(item)
    info = p.identify(item)
    assert info.event_id == f"unverified:{REQUEST_ID}"
    assert info.event_type == "unverified:payment"
    assert is_unverified(info.event_type)
    assert info.extra_headers["onceonly-verified"] == "false"
    assert info.extra_headers["onceonly-query"] == f"topic=payment&id={PAYMENT_ID}"


def test_unsigned_qr_notification_with_a_body_id() -> None:
    p = provider(unsigned="fetch")
    item = delivery({}, {}, BODY)
    p.verify(item)
    info = p.identify(item)
    # Its own namespace: it can never take (and so swallow) the signed event's id.
    assert info.event_id == "unverified:12345678901"
    assert info.event_type == "unverified:payment.updated"


def test_unsigned_without_any_id_is_one_event_per_second() -> None:
    now = [float(NOW)]
    p = MercadoPago(SECRET, unsigned="fetch", clock=lambda: now[0])
    item = delivery({}, IPN_QUERY, b"")
    first = p.identify(item)
    assert first.event_id == f"unverified:payment:{PAYMENT_ID}:{NOW}"
    now[0] += 1
    assert p.identify(item).event_id != first.event_id


def test_unsigned_that_names_nothing_to_fetch_is_a_payload_error() -> None:
    p = provider(unsigned="fetch")
    with pytest.raises(PayloadError):
        p.identify(delivery({}, {"topic": "payment"}, b"{}"))


def test_a_present_but_wrong_signature_is_rejected_even_when_unsigned_is_accepted() -> None:
    rejected(provider(unsigned="fetch"), delivery(signed_headers(secret="wrong")))


def test_stored_markers_cannot_be_supplied_by_the_client() -> None:
    headers = {**signed_headers(None), "onceonly-query": "data.id=999", "onceonly-verified": "x"}
    item = delivery(headers, {})
    provider().verify(item)
    info = provider().identify(item)
    stored = {**item.headers, **info.extra_headers}  # as the inbox stores them
    assert stored["onceonly-query"] == ""
    assert stored["onceonly-verified"] == "true"


def test_a_signed_event_is_not_marked_unverified() -> None:
    p = provider(unsigned="fetch")
    info = p.identify(delivery(signed_headers()))
    assert not is_unverified(info.event_type)
    assert info.event_id == f"{PAYMENT_ID}:{REQUEST_ID}"


# -- configuration ---------------------------------------------------------------------


def test_from_environ() -> None:
    cls = PROVIDER_CLASSES["mercadopago"]
    environ = {"ONCEONLY_MERCADOPAGO_UNSIGNED": "fetch", "ONCEONLY_MERCADOPAGO_TOLERANCE": "600"}
    p = cls.from_environ(environ, [SECRET, OLD_SECRET])
    assert isinstance(p, MercadoPago)
    assert (p.unsigned, p.tolerance, p.secrets) == ("fetch", 600, (SECRET, OLD_SECRET))
    assert MercadoPago.from_environ({}, [SECRET]).unsigned == "reject"


@pytest.mark.parametrize("value", ["accept", "yes", ""])
def test_bad_unsigned_policy_is_a_configuration_error(value: str) -> None:
    with pytest.raises(ConfigurationError):
        MercadoPago(SECRET, unsigned=value)  # type: ignore[arg-type]
    if value:
        with pytest.raises(ConfigurationError):
            MercadoPago.from_environ({"ONCEONLY_MERCADOPAGO_UNSIGNED": value}, [SECRET])


# -- the official SDK, both directions -------------------------------------------------

SDK_IDS = [PAYMENT_ID, ORDER_ID, None]


@pytest.mark.parametrize("data_id", SDK_IDS)
@pytest.mark.parametrize("request_id", [REQUEST_ID, None])
def test_onceonly_signature_is_accepted_by_the_sdk(
    data_id: str | None, request_id: str | None
) -> None:
    p = provider()
    query = {"data.id": data_id} if data_id else {}
    headers = p.sign(BODY, timestamp=NOW, delivery_id=request_id, query=query)
    WebhookSignatureValidator.validate(
        headers["x-signature"], headers["x-request-id"], data_id, SECRET
    )
    p.verify(delivery(headers, query))


@pytest.mark.parametrize("data_id", SDK_IDS)
@pytest.mark.parametrize("request_id", [REQUEST_ID, None])
@pytest.mark.parametrize("ts", [NOW, NOW * 1000], ids=["s", "ms"])
def test_what_the_sdk_accepts_onceonly_accepts(
    data_id: str | None, request_id: str | None, ts: int
) -> None:
    """The SDK has no signer: headers built by the documented rule are first
    confirmed by the SDK's validator, then given to onceonly."""
    headers = signed_headers(data_id, request_id, ts)
    WebhookSignatureValidator.validate(headers["x-signature"], request_id, data_id, SECRET)
    provider().verify(delivery(headers, {"data.id": data_id} if data_id else {}))


@pytest.mark.parametrize(
    ("headers", "data_id"),
    [
        pytest.param(signed_headers(secret="wrong"), PAYMENT_ID, id="wrong secret"),
        pytest.param(signed_headers(), "987654321", id="other data.id"),
        pytest.param(signed_headers(data_id=ORDER_ID), ORDER_ID.swapcase(), id="case"),
        pytest.param({"x-signature": "garbage"}, PAYMENT_ID, id="malformed"),
    ],
)
def test_sdk_and_onceonly_agree_on_rejection(headers: dict[str, str], data_id: str) -> None:
    with pytest.raises(InvalidWebhookSignatureError):
        WebhookSignatureValidator.validate(
            headers["x-signature"], headers.get("x-request-id"), data_id, SECRET
        )
    rejected(provider(), delivery(headers, {"data.id": data_id}))
