"""Event bodies shaped like each provider's, pointing at an object of its API.

:func:`build_event` returns an :class:`~onceonly.dev.delivery.Outgoing` whose
body, extra headers and query string look like what the provider sends for
that kind of event. The ids are random unless given, and the object the event
points to is described by :class:`PaymentFacts` so that the fake API can serve
the same payment (see :mod:`onceonly.dev.api`).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .._exceptions import ConfigurationError
from .delivery import Outgoing

__all__ = ["DEFAULT_EVENT_TYPES", "PaymentFacts", "build_event"]

#: The event type sent when none is given: a payment that went through.
DEFAULT_EVENT_TYPES: dict[str, str] = {
    "stripe": "payment_intent.succeeded",
    "mercadopago": "payment.updated",
    "asaas": "PAYMENT_RECEIVED",
    "pagbank": "PAID",
    "shopify": "orders/paid",
    "github": "push",
    "standardwebhooks": "payment.succeeded",
    "hmac": "payment.succeeded",
}


@dataclass(frozen=True, slots=True)
class PaymentFacts:
    """The payment an event is about: what the fake API serves for `object_id`."""

    object_id: str
    amount: int = 1999  # minor units (cents, centavos)
    currency: str = "brl"
    customer: str = "cus_0001"
    email: str = "customer@example.com"
    status: str = "succeeded"
    extra: dict[str, Any] = field(default_factory=dict)


def _iso(ts: float | None = None) -> str:
    moment = datetime.fromtimestamp(ts if ts is not None else time.time(), UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def default_object_id(provider: str, rng: random.Random | None = None) -> str:
    """A new id in the provider's style for the object an event points to."""
    r = rng or random.Random()
    digits = str(r.randrange(10**10, 10**11))
    token = f"{r.getrandbits(64):016x}"
    return {
        "stripe": f"pi_{token}",
        "mercadopago": digits,
        "asaas": f"pay_{token}",
        "pagbank": f"ORDE_{token.upper()}",
        "shopify": digits,
    }.get(provider, f"obj_{token}")


def build_event(
    provider: str,
    *,
    event_type: str | None = None,
    event_id: str | None = None,
    facts: PaymentFacts | None = None,
    rng: random.Random | None = None,
) -> Outgoing:
    """An event of `provider` about a payment, ready for a
    :class:`~onceonly.dev.delivery.Sender`."""
    r = rng or random.Random()
    facts = facts or PaymentFacts(default_object_id(provider, r))
    kind = event_type or DEFAULT_EVENT_TYPES.get(provider)
    if kind is None:
        raise ConfigurationError(f"no event shape known for provider {provider!r}")
    token = f"{r.getrandbits(96):024x}"
    builder = _BUILDERS.get(provider, _generic)
    return builder(kind, event_id, facts, token, r)


def _hex_id(r: random.Random) -> str:
    """A 32-hex-digit id, the form of the per-delivery ids senders put in headers."""
    return f"{r.getrandbits(128):032x}"


def _encode(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def _stripe(
    kind: str, event_id: str | None, f: PaymentFacts, token: str, r: random.Random
) -> Outgoing:
    eid = event_id or f"evt_{token}"
    body = {
        "id": eid,
        "object": "event",
        "api_version": "2024-06-20",
        "created": int(time.time()),
        "livemode": False,
        "pending_webhooks": 1,
        "type": kind,
        "data": {
            "object": {
                "id": f.object_id,
                "object": "payment_intent",
                "amount": f.amount,
                "amount_received": f.amount,
                "currency": f.currency,
                "customer": f.customer,
                "receipt_email": f.email,
                "status": f.status,
                **f.extra,
            }
        },
    }
    return Outgoing(eid, _encode(body))


def _mercadopago(
    kind: str, event_id: str | None, f: PaymentFacts, token: str, r: random.Random
) -> Outgoing:
    # The notification's own id is numeric; data.id (the payment) repeats across
    # the notifications of one payment and also travels in the query string.
    eid = event_id or str(r.randrange(10**10, 10**11))
    topic = kind.split(".", 1)[0]
    body = {
        "id": int(eid) if eid.isdigit() else eid,
        "live_mode": False,
        "type": topic,
        "date_created": _iso(),
        "user_id": 44444444,
        "api_version": "v1",
        "action": kind,
        "data": {"id": f.object_id},
    }
    return Outgoing(
        eid,
        _encode(body),
        query={"data.id": f.object_id, "type": topic},
        delivery_id=_hex_id(r),
    )


def _asaas(
    kind: str, event_id: str | None, f: PaymentFacts, token: str, r: random.Random
) -> Outgoing:
    eid = event_id or f"evt_{token}"
    body = {
        "id": eid,
        "event": kind,
        "dateCreated": _iso(),
        "payment": {
            "object": "payment",
            "id": f.object_id,
            "customer": f.customer,
            "value": f.amount / 100,
            "netValue": f.amount / 100,
            "billingType": "PIX",
            "status": "RECEIVED" if f.status == "succeeded" else f.status.upper(),
            **f.extra,
        },
    }
    return Outgoing(eid, _encode(body))


def _pagbank(
    kind: str, event_id: str | None, f: PaymentFacts, token: str, r: random.Random
) -> Outgoing:
    # PagBank sends the order itself; the receiver derives the event id from the
    # order's state (see onceonly.providers.pagbank). The id below only names
    # the event for the gateway's report.
    charge = f"CHAR_{token.upper()}"
    reference = event_id or f"ref-{token[:12]}"
    body = {
        "id": f.object_id,
        "reference_id": reference,
        "created_at": _iso(),
        "customer": {"name": "Cliente", "email": f.email},
        "charges": [
            {
                "id": charge,
                "reference_id": reference,
                "status": kind,
                "paid_at": _iso(),
                "amount": {"value": f.amount, "currency": f.currency.upper()},
                "payment_method": {"type": "PIX"},
            }
        ],
    }
    return Outgoing(event_id or f"{f.object_id}:{charge}:{kind}", _encode(body))


def _shopify(
    kind: str, event_id: str | None, f: PaymentFacts, token: str, r: random.Random
) -> Outgoing:
    # The per-delivery id goes in X-Shopify-Webhook-Id (kept on retries); the
    # receiver's event id is the hash of the signed body, so each event's body
    # differs (its update time, here also the delivery's own id).
    eid = event_id or _hex_id(r)
    body = {
        "id": int(f.object_id) if f.object_id.isdigit() else f.object_id,
        "admin_graphql_api_id": f"gid://shopify/Order/{f.object_id}",
        "updated_at": _iso(),
        "note": f"onceonly dev delivery {eid}",
        "email": f.email,
        "created_at": _iso(),
        "currency": f.currency.upper(),
        "financial_status": "paid" if f.status == "succeeded" else f.status,
        "total_price": f"{f.amount / 100:.2f}",
        "customer": {"id": f.customer, "email": f.email},
    }
    headers = {
        "x-shopify-topic": kind,
        "x-shopify-shop-domain": "onceonly-dev.myshopify.com",
        "x-shopify-api-version": "2024-07",
        "x-shopify-event-id": _hex_id(r),
    }
    return Outgoing(eid, _encode(body), headers=headers, delivery_id=eid)


def _github(
    kind: str, event_id: str | None, f: PaymentFacts, token: str, r: random.Random
) -> Outgoing:
    eid = event_id or _hex_id(r)
    # The receiver's event id is the hash of the signed body: each push names
    # its own head commit, as GitHub's do.
    after = hashlib.sha1(eid.encode()).hexdigest()
    body = {
        "action": "created",
        "ref": "refs/heads/main",
        "after": after,
        "repository": {"full_name": "x/y"},
    }
    return Outgoing(eid, _encode(body), headers={"x-github-event": kind}, delivery_id=eid)


def _generic(
    kind: str, event_id: str | None, f: PaymentFacts, token: str, r: random.Random
) -> Outgoing:
    eid = event_id or f"msg_{token}"
    body = {
        "id": eid,
        "type": kind,
        "timestamp": _iso(),
        "data": {
            "id": f.object_id,
            "amount": f.amount,
            "currency": f.currency,
            "customer": f.customer,
            "email": f.email,
            "status": f.status,
        },
    }
    return Outgoing(eid, _encode(body), delivery_id=eid)


_BUILDERS = {
    "stripe": _stripe,
    "mercadopago": _mercadopago,
    "asaas": _asaas,
    "pagbank": _pagbank,
    "shopify": _shopify,
    "github": _github,
}


#: What a payment that went through is called, per provider's API.
_PAID = {
    "stripe": "succeeded",
    "mercadopago": "approved",
    "asaas": "RECEIVED",
    "pagbank": "PAID",
}


def api_objects(
    provider: str, event: Outgoing, facts: PaymentFacts, *, status: str | None = None
) -> list[tuple[str, str, dict[str, Any]]]:
    """The ``(kind, id, object)`` triples the fake API serves for `event`
    (see :class:`onceonly.dev.api.FakeApi`); empty for providers without an API.

    `status` is the payment's status as the API tells it; by default the
    provider's word for paid. Give another one ("pending") to play an event
    whose body claims more than the API confirms.
    """
    body = json.loads(event.body)
    state = status or _PAID.get(provider, facts.status)
    if provider == "stripe":
        intent = {**body["data"]["object"], "status": state}
        stored = {**body, "data": {"object": intent}}
        return [("event", event.event_id, stored), ("payment_intent", facts.object_id, intent)]
    if provider == "mercadopago":
        payment = {
            "id": int(facts.object_id) if facts.object_id.isdigit() else facts.object_id,
            "status": state,
            "status_detail": "accredited" if state == "approved" else state,
            "transaction_amount": facts.amount / 100,
            "currency_id": facts.currency.upper(),
            "payer": {"id": facts.customer, "email": facts.email},
            "date_created": body.get("date_created"),
        }
        return [("payment", facts.object_id, payment)]
    if provider == "asaas":
        return [("payment", facts.object_id, {**body["payment"], "status": state})]
    if provider == "pagbank":
        charges = [{**c, "status": state} for c in body.get("charges", [])]
        order = {**body, "charges": charges}
        return [("order", facts.object_id, order)] + [("charge", c["id"], c) for c in charges]
    return []
