"""The same shop behind onceonly: receiver, worker, and a handler that shares the
transaction.

The receiver stores each event once and answers 200 after the commit; the
worker runs the handler once per event. The payment and the access grant are
written on ``ctx.connection``, so they commit together with the event's
``processed`` mark; the receipt goes through ``ctx.effect``, recorded once per
event under a deterministic key.
"""

from __future__ import annotations

import json

from ..config import Onceonly
from ..context import Context
from ..events import Event
from ..providers import Stripe
from .shop import Mailer, access_grants, payments

__all__ = ["protected_app"]


def protected_app(database_url: str, mailer: Mailer, secret: str) -> Onceonly:
    """An :class:`~onceonly.Onceonly` for the shop, its handler registered."""
    # environ={}: the demo must not pick up the caller's ONCEONLY_* settings.
    app = Onceonly(database_url, {"stripe": Stripe(secret)}, environ={}, retry_base=0.2)

    @app.handler("stripe", "payment_intent.succeeded")
    def fulfil(event: Event, ctx: Context) -> None:
        intent = json.loads(event.body)["data"]["object"]
        order, customer = intent["id"], intent["customer"]
        ctx.connection.execute(
            payments.insert().values(order_id=order, customer=customer, amount=intent["amount"])
        )
        ctx.connection.execute(access_grants.insert().values(order_id=order, customer=customer))
        ctx.stage("receipt-email", {"to": intent["receipt_email"], "order": order})

    @app.action("receipt-email")
    def send_receipt(payload: dict[str, str], key: str) -> None:
        mailer.send_receipt(to=payload["to"], order=payload["order"], key=key)

    return app
