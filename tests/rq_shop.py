"""The RQ jobs of tests/integration/test_rq.py, declared as docs/celery.md
shows: a module-level ``KeyedTasks`` on the database of ``ONCEONLY_DATABASE_URL``
(the test imports this module afresh for each database)."""

from __future__ import annotations

import os
from typing import Any

import httpx
import sqlalchemy as sa

from onceonly import Onceonly
from onceonly.tasks import KeyedTasks, TaskContext

tasks = KeyedTasks(Onceonly().guard())


def card_call(order_id: int, amount: int) -> Any:
    def call(key: str) -> Any:
        response = httpx.post(
            f"{os.environ['SHOP_CARD_URL']}/charges",
            json={"order": order_id, "amount": amount},
            headers={"Idempotency-Key": key},
            timeout=10,
        )
        response.raise_for_status()
        return response.json()

    return call


@tasks.task(key="charge:{0}")
def charge(ctx: TaskContext, order_id: int, amount: int) -> str:
    card = ctx.effect("charge", card_call(order_id, amount))
    ctx.connection.execute(
        sa.text("INSERT INTO shop_payments (order_id, charge) VALUES (:o, :c)"),
        {"o": order_id, "c": card["id"]},
    )
    return str(card["id"])
