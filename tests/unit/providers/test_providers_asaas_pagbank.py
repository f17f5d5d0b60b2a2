"""Asaas (a static token) and PagBank (a plain SHA-256 of token and body, plus
PagSeguro's unsigned legacy form post), as each sender documents them.

Tokens and hashes are computed here with ``hashlib``, never with onceonly's
helpers.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest

from onceonly import ConfigurationError, Delivery, PayloadError, SignatureError
from onceonly.providers import PROVIDER_CLASSES, Asaas, PagBank, is_unverified

# -- Asaas -----------------------------------------------------------------------------

ASAAS_TOKEN = "whk_8Zx1-asaas-token-configured-in-the-panel"
ASAAS_BODY = json.dumps(
    {
        "id": "evt_05b708f961d739ea7eba7e4db318f621&368604920",
        "event": "PAYMENT_RECEIVED",
        "dateCreated": "2026-11-30 10:00:00",
        "payment": {"object": "payment", "id": "pay_080225913252", "status": "RECEIVED"},
    }
).encode()


def asaas(item_headers: dict[str, str], body: bytes = ASAAS_BODY) -> Delivery:
    return Delivery("asaas", body, item_headers)


def test_asaas_token_is_accepted_and_identifies_the_event() -> None:
    p = Asaas(ASAAS_TOKEN)
    item = asaas({"asaas-access-token": ASAAS_TOKEN})
    p.verify(item)
    info = p.identify(item)
    assert info.event_id == "evt_05b708f961d739ea7eba7e4db318f621&368604920"
    assert info.event_type == "PAYMENT_RECEIVED"


def test_asaas_any_configured_token_is_accepted() -> None:
    p = Asaas(["old-token", ASAAS_TOKEN])
    p.verify(asaas({"asaas-access-token": "old-token"}))
    p.verify(asaas({"asaas-access-token": ASAAS_TOKEN}))
    assert p.sign(ASAAS_BODY) == {"asaas-access-token": "old-token"}


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"asaas-access-token": "wrong"}, id="wrong token"),
        pytest.param({"asaas-access-token": ASAAS_TOKEN[:-1]}, id="prefix of the token"),
        pytest.param({"asaas-access-token": ASAAS_TOKEN + "x"}, id="token plus more"),
        pytest.param({"asaas-access-token": ASAAS_TOKEN.upper()}, id="other case"),
        pytest.param({"asaas-access-token": ""}, id="empty"),
        pytest.param({}, id="missing"),
        pytest.param({"x-authenticity-token": ASAAS_TOKEN}, id="another header"),
    ],
)
def test_asaas_rejections(headers: dict[str, str]) -> None:
    with pytest.raises(SignatureError) as caught:
        Asaas(ASAAS_TOKEN).verify(asaas(headers))
    assert caught.value.status == 401


def test_asaas_token_authenticates_the_sender_not_the_body() -> None:
    """A gotcha to document: with a static token a changed body still passes,
    which is why handlers fetch the payment from Asaas before acting."""
    Asaas(ASAAS_TOKEN).verify(asaas({"asaas-access-token": ASAAS_TOKEN}, b'{"id": "other"}'))


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"event": "PAYMENT_RECEIVED"}'])
def test_asaas_body_without_event_id_is_a_payload_error(body: bytes) -> None:
    with pytest.raises(PayloadError):
        Asaas(ASAAS_TOKEN).identify(asaas({"asaas-access-token": ASAAS_TOKEN}, body))


def test_asaas_from_environ() -> None:
    p = PROVIDER_CLASSES["asaas"].from_environ(
        {"ONCEONLY_ASAAS_REJECTION_STATUS": "403"}, [ASAAS_TOKEN]
    )
    with pytest.raises(SignatureError) as caught:
        p.verify(asaas({"asaas-access-token": "nope"}))
    assert caught.value.status == 403


# -- PagBank (current API) -------------------------------------------------------------

PAGBANK_TOKEN = "7cd2e3f4-pagbank-api-token-0a1b2c3d4e5f"


def order(charge_status: str = "PAID", refunded: int = 0, **extra: Any) -> bytes:
    return json.dumps(
        {
            "id": "ORDE_F87334AC-BB8B-42E2-AA85-8579F70AA328",
            "reference_id": "ex-00001",
            "created_at": "2026-11-30T10:00:00.000-03:00",
            "charges": [
                {
                    "id": "CHAR_67CCBEAA-E8B3-4D8C-8C2D-A1B7FFD1B0A4",
                    "status": charge_status,
                    "amount": {
                        "value": 500,
                        "currency": "BRL",
                        "summary": {"total": 500, "paid": 500, "refunded": refunded},
                    },
                }
            ],
            **extra,
        }
    ).encode()


def pagbank_token(body: bytes, token: str = PAGBANK_TOKEN) -> str:
    """As PagBank documents it: SHA-256 of the token, a hyphen and the payload."""
    return hashlib.sha256(f"{token}-".encode() + body).hexdigest()


def pagbank(headers: dict[str, str], body: bytes) -> Delivery:
    return Delivery("pagbank", body, headers)


def test_pagbank_documented_token_is_accepted() -> None:
    body = order()
    p = PagBank(PAGBANK_TOKEN)
    item = pagbank({"x-authenticity-token": pagbank_token(body)}, body)
    p.verify(item)
    info = p.identify(item)
    assert info.event_id.startswith("ORDE_F87334AC-BB8B-42E2-AA85-8579F70AA328:")
    assert info.event_type == "order"
    assert p.sign(body) == {"x-authenticity-token": pagbank_token(body)}


def test_pagbank_is_a_plain_hash_not_an_hmac() -> None:
    body = order()
    as_hmac = hmac.new(PAGBANK_TOKEN.encode(), body, hashlib.sha256).hexdigest()
    with pytest.raises(SignatureError):
        PagBank(PAGBANK_TOKEN).verify(pagbank({"x-authenticity-token": as_hmac}, body))


def test_pagbank_several_tokens_and_upper_case_hex() -> None:
    body = order()
    p = PagBank(["older-token", PAGBANK_TOKEN])
    p.verify(pagbank({"x-authenticity-token": pagbank_token(body).upper()}, body))
    p.verify(pagbank({"x-authenticity-token": pagbank_token(body, "older-token")}, body))


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        pytest.param(
            {"x-authenticity-token": pagbank_token(order())}, order("CANCELED"), id="tampered"
        ),
        pytest.param(
            {"x-authenticity-token": pagbank_token(order(), "wrong")}, order(), id="wrong token"
        ),
        pytest.param(
            {"x-authenticity-token": hashlib.sha256(order()).hexdigest()}, order(), id="body only"
        ),
        pytest.param(
            {"x-authenticity-token": pagbank_token(order())[:-2]}, order(), id="truncated"
        ),
        pytest.param({}, order(), id="missing"),
    ],
)
def test_pagbank_rejections(headers: dict[str, str], body: bytes) -> None:
    with pytest.raises(SignatureError) as caught:
        PagBank(PAGBANK_TOKEN).verify(pagbank(headers, body))
    assert caught.value.status == 401


def identify(body: bytes) -> str:
    return PagBank(PAGBANK_TOKEN).identify(pagbank({}, body)).event_id


def test_pagbank_resend_of_one_notification_dedupes() -> None:
    """Same state, different incidental fields (a timestamp, key order): one event."""
    first = order()
    resent = order(notified_at="2026-11-30T10:15:00Z")
    reordered = json.dumps(json.loads(first), sort_keys=True).encode()
    assert identify(first) == identify(resent) == identify(reordered)


@pytest.mark.parametrize(
    "later",
    [
        pytest.param(order("CANCELED"), id="status change"),
        pytest.param(order(refunded=200), id="partial refund, status unchanged"),
        pytest.param(order(status="PAID"), id="order status set"),
    ],
)
def test_pagbank_later_state_change_is_a_new_event(later: bytes) -> None:
    assert identify(later) != identify(order())


def test_pagbank_charge_body_and_body_without_id() -> None:
    charge = json.dumps({"id": "CHAR_1", "status": "PAID"}).encode()
    p = PagBank(PAGBANK_TOKEN)
    assert p.identify(pagbank({}, charge)).event_type == "charge"
    no_id = b'{"status": "PAID"}'
    assert identify(no_id) == "sha256:" + hashlib.sha256(no_id).hexdigest()


# -- PagSeguro legacy form post ----------------------------------------------------------

LEGACY = b"notificationCode=766B9C-AD4B044B04DA-77742F5FA653-E1AB24&notificationType=transaction"


def test_legacy_form_is_accepted_as_an_unverified_trigger_by_default() -> None:
    p = PagBank(PAGBANK_TOKEN)
    item = pagbank({"content-type": "application/x-www-form-urlencoded"}, LEGACY)
    p.verify(item)
    info = p.identify(item)
    assert info.event_id == "unverified:766B9C-AD4B044B04DA-77742F5FA653-E1AB24"
    assert info.event_type == "unverified:transaction"
    assert is_unverified(info.event_type)
    assert info.extra_headers == {"onceonly-verified": "false"}


def test_legacy_form_is_rejected_under_the_reject_policy() -> None:
    with pytest.raises(SignatureError):
        PagBank(PAGBANK_TOKEN, unsigned="reject").verify(pagbank({}, LEGACY))


def test_legacy_looking_body_with_a_wrong_token_is_rejected() -> None:
    """A token header means the current API: it must match, the policy does not apply."""
    with pytest.raises(SignatureError):
        PagBank(PAGBANK_TOKEN).verify(pagbank({"x-authenticity-token": "f" * 64}, LEGACY))


@pytest.mark.parametrize("body", [b"notificationType=transaction", b"notificationCode=", b"{}"])
def test_unsigned_without_a_notification_code_is_rejected(body: bytes) -> None:
    with pytest.raises(SignatureError):
        PagBank(PAGBANK_TOKEN).verify(pagbank({}, body))


def test_pagbank_from_environ() -> None:
    cls = PROVIDER_CLASSES["pagbank"]
    assert isinstance(p := cls.from_environ({}, [PAGBANK_TOKEN]), PagBank)
    assert p.unsigned == "fetch"
    strict = cls.from_environ({"ONCEONLY_PAGBANK_UNSIGNED": "REJECT"}, [PAGBANK_TOKEN])
    assert isinstance(strict, PagBank)
    assert strict.unsigned == "reject"
    with pytest.raises(ConfigurationError):
        cls.from_environ({"ONCEONLY_PAGBANK_UNSIGNED": "maybe"}, [PAGBANK_TOKEN])
