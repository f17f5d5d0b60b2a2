"""The shop's handlers, found by onceonly's app in ``ready()``.

The event's ``data`` says how a test wants the handler to behave:
``{"amount": 100}`` creates a payment; ``"fail": true`` creates one and then
raises (the row must not survive); ``"null": true`` makes the ORM's INSERT
fail (``"swallow": true``: and the handler catch that error); ``"effect":
true`` also records an effect in the ledger and stages an outbox row;
``"sleep": seconds`` makes it take that long (crash tests).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError

from onceonly.context import Context
from onceonly.contrib.django import action, handler
from onceonly.events import Event

from .models import Payment

#: What the outbox action was given, in this process (in-process tests read it).
SENT: list[tuple[str, dict[str, Any]]] = []
#: Called by on_refund while its transaction is open (in-process tests look
#: at the database from another connection then).
PROBES: list[Callable[[Event], None]] = []


def _data(event: Event) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(event.body).get("data") or {}
    return data


@handler("stripe", "payment_intent.succeeded")
def on_payment(event: Event, ctx: Context) -> None:
    data = _data(event)
    if data.get("sleep"):
        time.sleep(float(data["sleep"]))
    Payment.objects.create(event_id=event.event_id, amount=int(data.get("amount", 100)))
    if data.get("null"):
        try:
            Payment.objects.create(event_id=event.event_id, amount=None)
        except IntegrityError:
            if not data.get("swallow"):
                raise
    if data.get("effect"):
        ctx.effect("charge", lambda key: {"charged": key})
        ctx.stage("receipt", {"event": event.event_id})
    if data.get("fail"):
        raise RuntimeError("the handler failed after its ORM write")


@handler("stripe", "charge.refunded")
def on_refund(event: Event, ctx: Context) -> None:
    Payment.objects.create(event_id=event.event_id, amount=7)
    for probe in PROBES:
        probe(event)


@handler("stripe", "invoice.paid")
async def on_invoice(event: Event, ctx: Context) -> None:
    await Payment.objects.acreate(
        event_id=event.event_id, amount=int(_data(event).get("amount", 1))
    )
    if _data(event).get("fail"):
        raise RuntimeError("the async handler failed after its ORM write")


@action("receipt")
def send_receipt(payload: dict[str, Any], key: str) -> None:
    SENT.append((key, payload))
