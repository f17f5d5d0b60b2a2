"""The shop both demo handlers serve: its tables and its mail provider.

The tables have no unique constraint on the order on purpose: most shops'
tables do not, and a handler that runs twice shows up as two rows. The mail
provider is a real HTTP server on loopback that appends each message it
accepts to a JSON-lines outbox file; the demo counts e-mails from that file.
Like most mail APIs it has a bad moment now and then: the first message for
some orders takes longer than the gateway waits.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

__all__ = ["MailProvider", "Mailer", "access_grants", "metadata", "payments", "shop_state"]

metadata = sa.MetaData()

#: One row per payment the shop recorded.
payments = sa.Table(
    "payments",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("order_id", sa.Text, nullable=False),
    sa.Column("customer", sa.Text, nullable=False),
    sa.Column("amount", sa.Integer, nullable=False),
)

#: One row each time the customer's access (the course, the plan) was released.
access_grants = sa.Table(
    "access_grants",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("order_id", sa.Text, nullable=False),
    sa.Column("customer", sa.Text, nullable=False),
)


class MailProvider:
    """A fake transactional-mail API: ``POST /messages`` appends to `outbox`.

    The first message about an order in `slow_orders` takes `slow_seconds`
    (a hiccup at the mail provider); every other message takes a few
    milliseconds.
    """

    def __init__(
        self, outbox: Path, *, slow_orders: Iterable[str] = (), slow_seconds: float = 0.6
    ) -> None:
        self.outbox = outbox
        self.outbox.touch()
        self.slow_orders = set(slow_orders)
        self.slow_seconds = slow_seconds
        self._lock = threading.Lock()
        self.app = Starlette(routes=[Route("/messages", self._accept, methods=["POST"])])

    async def _accept(self, request: Request) -> JSONResponse:
        message = await request.json()
        order = str(message.get("order", ""))
        with self._lock:
            slow = order in self.slow_orders
            self.slow_orders.discard(order)
        await asyncio.sleep(self.slow_seconds if slow else 0.003)
        line = json.dumps(message, sort_keys=True) + "\n"
        with self._lock, self.outbox.open("a", encoding="utf-8") as out:
            out.write(line)
        return JSONResponse({"accepted": True}, status_code=202)

    def sent(self) -> list[dict[str, Any]]:
        """Every message accepted so far, read back from the outbox file."""
        with self.outbox.open(encoding="utf-8") as lines:
            return [json.loads(line) for line in lines if line.strip()]


class Mailer:
    """The shop's client for the mail API (thread-safe: one connection pool)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.client = httpx.Client(timeout=30)

    def send_receipt(self, *, to: str, order: str, key: str | None = None) -> dict[str, Any]:
        message = {"to": to, "order": order, "subject": f"Your access to order {order}"}
        if key:
            message["idempotency_key"] = key
        response = self.client.post(f"{self.base_url}/messages", json=message)
        response.raise_for_status()
        return {"status": response.status_code}

    def close(self) -> None:
        self.client.close()


def shop_state(engine: sa.Engine, mail: MailProvider) -> dict[str, int]:
    """What the shop did, counted from its tables and the mail outbox."""
    with engine.connect() as conn:
        recorded = conn.execute(sa.select(sa.func.count()).select_from(payments)).scalar_one()
        released = conn.execute(sa.select(sa.func.count()).select_from(access_grants)).scalar_one()
        per_order = (
            sa.select(payments.c.order_id)
            .group_by(payments.c.order_id)
            .having(sa.func.count() > 1)
            .subquery()
        )
        doubled = conn.execute(sa.select(sa.func.count()).select_from(per_order)).scalar_one()
        orders = conn.execute(
            sa.select(sa.func.count(sa.distinct(payments.c.order_id)))
        ).scalar_one()
    return {
        "orders_paid": int(orders),
        "payments_recorded": int(recorded),
        "access_released": int(released),
        "emails_sent": len(mail.sent()),
        "customers_charged_twice": int(doubled),
    }
