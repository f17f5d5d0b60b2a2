"""What each payment provider says an event is about, and when it was created:
the object id is searched in the dashboard and orders a handler's events, the
time orders them (docs/ordering.md)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from onceonly import Delivery
from onceonly.providers import PROVIDER_CLASSES

BRASILIA = timezone(timedelta(hours=-3))

CASES: list[tuple[str, dict[str, Any], dict[str, str], str | None, datetime | None]] = [
    (
        "stripe",
        {
            "id": "evt_1",
            "type": "payment_intent.succeeded",
            "created": 1764000000,
            "data": {"object": {"id": "pi_9", "object": "payment_intent"}},
        },
        {},
        "pi_9",
        datetime.fromtimestamp(1764000000, UTC),
    ),
    (
        "asaas",
        {
            "id": "evt_2",
            "event": "PAYMENT_RECEIVED",
            "dateCreated": "2026-12-01 10:30:00",
            "payment": {"id": "pay_7", "value": 10},
        },
        {},
        "pay_7",
        datetime(2026, 12, 1, 10, 30, tzinfo=BRASILIA),
    ),
    (
        "mercadopago",
        {"id": 123, "action": "payment.updated", "date_created": "2026-12-01T10:30:00.000-04:00"},
        {"data.id": "555"},
        "555",
        datetime(2026, 12, 1, 14, 30, tzinfo=UTC),
    ),
    (
        "pagbank",
        {"id": "ORDE_1", "status": "PAID", "created_at": "2026-12-01T10:30:00-03:00"},
        {},
        "ORDE_1",
        datetime(2026, 12, 1, 13, 30, tzinfo=UTC),
    ),
    (
        "pagarme",
        {
            "id": "hook_1",
            "type": "order.paid",
            "created_at": "2026-12-01T13:30:00Z",
            "data": {"id": "or_5", "status": "paid"},
        },
        {},
        "or_5",
        datetime(2026, 12, 1, 13, 30, tzinfo=UTC),
    ),
    (
        "efi",
        {"pix": [{"endToEndId": "E1", "txid": "tx9", "horario": "2026-12-01T13:30:00.000Z"}]},
        {},
        "tx9",
        datetime(2026, 12, 1, 13, 30, tzinfo=UTC),
    ),
]


@pytest.mark.parametrize(("provider", "body", "query", "object_id", "occurred_at"), CASES)
def test_a_payment_event_names_its_object_and_creation_time(
    provider: str,
    body: dict[str, Any],
    query: dict[str, str],
    object_id: str | None,
    occurred_at: datetime | None,
) -> None:
    secret = "user:a-secret-that-is-long-enough" if provider == "pagarme" else "a-secret-0123456789"
    verifier = PROVIDER_CLASSES[provider]([secret])
    headers = {"x-request-id": "req-1", "x-signature": "ts=1,v1=00"}
    info = verifier.identify(Delivery(provider, json.dumps(body).encode(), headers, query))
    assert info.object_id == object_id
    assert info.occurred_at == occurred_at


@pytest.mark.parametrize("created", ["yesterday", None, True, [], "2026-13-40T99:00:00"])
def test_a_time_no_one_can_read_is_no_time_rather_than_a_refusal(created: Any) -> None:
    verifier = PROVIDER_CLASSES["stripe"](["whsec_test"])
    body = {"id": "evt_1", "type": "x", "created": created, "data": {"object": {"id": 5}}}
    info = verifier.identify(Delivery("stripe", json.dumps(body).encode(), {}))
    assert info.occurred_at is None
    assert info.object_id == "5"


def test_several_pix_in_one_delivery_are_about_no_single_object() -> None:
    verifier = PROVIDER_CLASSES["efi"](["a-secret-that-is-long-enough-000"])
    body = {"pix": [{"endToEndId": "E1", "txid": "a"}, {"endToEndId": "E2", "txid": "b"}]}
    info = verifier.identify(Delivery("efi", json.dumps(body).encode(), {}))
    assert info.object_id is None
