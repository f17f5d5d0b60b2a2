"""An onceonly app whose events a real ``celery worker`` processes through
``EventOutlet`` (tests/integration/test_celery_events.py). Configured like
celery_shop: ``SHOP_BROKER``, ``SHOP_CARD_URL``, ``ONCEONLY_DATABASE_URL``.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import sqlalchemy as sa
from celery import Celery

from onceonly import Context, Event, Onceonly
from onceonly.contrib.celery import EventOutlet

BROKER = os.environ.get("SHOP_BROKER", "redis://127.0.0.1:6379/0")
PAYMENTS = "CREATE TABLE outlet_payments (event_id TEXT NOT NULL, charge TEXT NOT NULL)"

shop = Onceonly(retry_base=0.05, retry_cap=0.2)
app = Celery("celery_outlet_app", broker=BROKER, backend=BROKER)
outlet = EventOutlet(shop, app)


def charge_card(event: Event) -> Any:
    def call(key: str) -> Any:
        url = f"{os.environ['SHOP_CARD_URL']}/charges"
        response = httpx.post(url, headers={"Idempotency-Key": key}, timeout=10)
        response.raise_for_status()
        return response.json()

    return call


@shop.handler("stripe")
def paid(event: Event, ctx: Context) -> None:
    card = ctx.effect("charge", charge_card(event))
    ctx.connection.execute(
        sa.text("INSERT INTO outlet_payments (event_id, charge) VALUES (:e, :c)"),
        {"e": event.event_id, "c": card["id"]},
    )
    if event.event_id.startswith("evt_flaky") and ctx.attempt == 1:
        raise RuntimeError("the first attempt fails after its charge and its write")
