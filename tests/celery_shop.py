"""The Celery app the Celery tests run in real ``celery worker`` subprocesses.

Configured by environment, as a deployment would be: ``SHOP_BROKER`` (a Redis
URL, also the result backend), ``SHOP_QUEUE`` (a queue of the test's own),
``ONCEONLY_DATABASE_URL``, ``SHOP_CARD_URL`` (the loopback card API),
``SHOP_LEASE`` (the guard's lease, short so a killed worker's key is taken over
within seconds) and ``SHOP_HOOKS``, a directory where the test holds a task at
a point of its choosing: while ``hold-<point>-<order>`` exists there, the task
writes its pid to ``reached-<point>-<order>`` and waits.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from celery import Celery

from onceonly import Onceonly
from onceonly.contrib.celery import OnceTasks, TaskContext

BROKER = os.environ.get("SHOP_BROKER", "redis://127.0.0.1:6379/0")
# Short: a message whose worker was SIGKILLed goes back to the queue after this.
VISIBILITY_TIMEOUT = 2

app = Celery("celery_shop", broker=BROKER, backend=BROKER)
app.conf.update(
    task_default_queue=os.environ.get("SHOP_QUEUE", "celery"),
    # kombu looks for such messages every interval x throttle seconds (100 by
    # default): every second here.
    broker_transport_options={
        "visibility_timeout": VISIBILITY_TIMEOUT,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
    result_backend_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT},
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)

once = OnceTasks(
    app,
    lambda: Onceonly().guard(lease_seconds=float(os.environ.get("SHOP_LEASE", "300"))),
    retry_countdown=0.3,
)

PAYMENTS = "CREATE TABLE shop_payments (order_id INTEGER NOT NULL, charge TEXT NOT NULL)"


def hold(point: str, order_id: int) -> None:
    hooks = os.environ.get("SHOP_HOOKS")
    if not hooks:
        return
    flag = Path(hooks, f"hold-{point}-{order_id}")
    if flag.exists():
        # Which process holds it: a prefork pool's child, not the worker itself.
        Path(hooks, f"reached-{point}-{order_id}").write_text(str(os.getpid()))
    while flag.exists():
        time.sleep(0.02)


def card_call(order_id: int, amount: int) -> Any:
    def call(key: str) -> Any:
        response = httpx.post(
            f"{os.environ['SHOP_CARD_URL']}/charges",
            json={"order": order_id, "amount": amount},
            headers={"Idempotency-Key": key},
            timeout=10,
        )
        response.raise_for_status()
        # After the card API charged, before the ledger records it: the window
        # that only the idempotency key closes.
        hold("call", order_id)
        return response.json()

    return call


@once.task(key="charge:{0}")
def charge(ctx: TaskContext, order_id: int, amount: int) -> str:
    card = ctx.effect("charge", card_call(order_id, amount))
    hold("charged", order_id)
    ctx.connection.execute(
        sa.text("INSERT INTO shop_payments (order_id, charge) VALUES (:o, :c)"),
        {"o": order_id, "c": card["id"]},
    )
    hold("written", order_id)
    return str(card["id"])


@once.task(key="book:{0}", fingerprint=False)
def book(ctx: TaskContext, order_id: int, fail: bool) -> int:
    """A write, then a failure on demand: the write must not outlive it."""
    ctx.connection.execute(
        sa.text("INSERT INTO shop_payments (order_id, charge) VALUES (:o, 'booked')"),
        {"o": order_id},
    )
    if fail:
        raise RuntimeError(f"booking {order_id} failed after its write")
    return order_id
