"""The app of benchmarks/sqlite_contention.py, loaded by ``onceonly serve`` and
``onceonly worker`` as ``contention_app:app``.

Each Stripe event's handler makes one card call through the effect ledger (a
loopback API at ``CONTENTION_CARD_URL`` that takes ``CONTENTION_CALL_MS``) and
writes one row of the user's own, in the event's transaction: what a payment
handler does, and what holds SQLite's write lock while it runs.
"""

from __future__ import annotations

import os

import httpx
import sqlalchemy as sa

from onceonly import Event, Onceonly
from onceonly.context import Context
from onceonly.providers import Stripe

SECRET = "whsec_contention_benchmark"

metadata = sa.MetaData()
orders = sa.Table(
    "bench_orders",
    metadata,
    sa.Column("event_id", sa.Text, primary_key=True),
    sa.Column("charge", sa.Text, nullable=False),
)

app = Onceonly(providers={"stripe": Stripe(SECRET)})
_card = httpx.Client(timeout=30)


@app.handler("stripe", "payment_intent.succeeded")
def fulfil(event: Event, ctx: Context) -> None:
    def charge(key: str) -> str:
        response = _card.post(os.environ["CONTENTION_CARD_URL"], headers={"Idempotency-Key": key})
        response.raise_for_status()
        return str(response.json()["id"])

    charge_id = ctx.effect("charge", charge)
    ctx.connection.execute(orders.insert().values(event_id=event.event_id, charge=charge_id))
