"""Onceonly apps for the worker crash tests, loadable with ``--app payments_app:<factory>``.

Each factory builds a fresh :class:`~onceonly.Onceonly` whose handlers write to
the user's own ``payments`` table. That table has no unique constraint on the
event id on purpose: a handler that ran twice shows up as two rows.

The factories read their settings from the environment, so the same module
configures ``onceonly serve``, ``onceonly worker`` and ``onceonly events``
subprocesses as well as in-process apps:

- ``ONCEONLY_DATABASE_URL``: the database (required);
- ``PAYMENTS_GATEWAY_URL``: the payment gateway of :func:`effect_app`;
- ``PAYMENTS_CARD_URL``, ``PAYMENTS_MAIL_URL``: the card and mail APIs of
  :func:`ledger_app`;
- ``PAYMENTS_STATE_DIR``: where :func:`broken_app` looks for its ``fixed`` marker.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from onceonly import Event, Onceonly
from onceonly.context import Context
from onceonly.providers import Stripe

STRIPE_SECRET = "whsec_test_secret"  # the same as support.STRIPE_SECRET

metadata = sa.MetaData()

#: The user's table. No unique constraint on event_id: duplicates would show.
payments = sa.Table(
    "payments",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("event_id", sa.Text, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("worker_pid", sa.Integer, nullable=False),
    sa.Column("charge_id", sa.Text),
)


def _app(database_url: str | None, **options: Any) -> Onceonly:
    return Onceonly(
        database_url=database_url or os.environ["ONCEONLY_DATABASE_URL"],
        providers={"stripe": Stripe(STRIPE_SECRET)},
        environ={},
        **options,
    )


def _record_payment(event: Event, ctx: Context, charge_id: str | None = None) -> None:
    ctx.connection.execute(
        payments.insert().values(
            event_id=event.event_id,
            attempt=ctx.attempt,
            worker_pid=os.getpid(),
            charge_id=charge_id,
        )
    )


def inbox_app(database_url: str | None = None) -> Onceonly:
    """Receives and stores; handles nothing (for delivering in-process)."""
    return _app(database_url)


def plain_app(database_url: str | None = None) -> Onceonly:
    """Records each payment; short leases and retries, so a failover is over fast."""
    app = _app(database_url, lease_seconds=2, retry_base=0.05, retry_cap=0.5)

    @app.handler("stripe")
    def record(event: Event, ctx: Context) -> None:
        _record_payment(event, ctx)

    return app


def chaos_app(database_url: str | None = None) -> Onceonly:
    """Short leases and retries so that events of a SIGKILLed worker come back fast."""
    app = _app(database_url, lease_seconds=2, retry_base=0.05, retry_cap=0.5)

    @app.handler("stripe")
    def record(event: Event, ctx: Context) -> None:
        _record_payment(event, ctx)
        # Widen the windows: most events are quick, a few hold their worker for
        # 0.2 s, so that a SIGKILL regularly lands on a worker holding events
        # (when every handler is instant, the kills mostly hit idle workers and
        # the test proves little).
        time.sleep(0.2 if random.random() < 0.05 else random.uniform(0.0, 0.005))

    return app


def effect_app(database_url: str | None = None) -> Onceonly:
    """Charges through the gateway with ``ctx.effect``; the first attempt dies (SIGKILL)
    after the gateway answered and before onceonly could record the outcome."""
    app = _app(database_url, lease_seconds=2, retry_base=0.05, retry_cap=0.5)
    gateway = os.environ.get("PAYMENTS_GATEWAY_URL", "")

    @app.handler("stripe")
    def charge(event: Event, ctx: Context) -> None:
        def call(key: str) -> dict[str, Any]:
            response = httpx.post(
                f"{gateway}/charges",
                headers={"Idempotency-Key": key},
                json={"event_id": event.event_id, "amount": 1999},
                timeout=10,
            )
            response.raise_for_status()
            outcome: dict[str, Any] = response.json()
            if ctx.attempt == 1:
                # The crash window: the charge exists, its record does not.
                os.kill(os.getpid(), signal.SIGKILL)
            return outcome

        outcome = ctx.effect("charge", call)
        _record_payment(event, ctx, charge_id=str(outcome["id"]))

    return app


def ledger_app(database_url: str | None = None) -> Onceonly:
    """Charges a card with ``ctx.effect`` and stages a receipt e-mail, at the
    loopback APIs ``$PAYMENTS_CARD_URL`` and ``$PAYMENTS_MAIL_URL``; every call
    says which event and which worker process made it."""
    # Outbox claims longer than the event leases: a row's runner may wait for
    # SQLite's write lock (busy_timeout, 5 s) before it can mark the row sent.
    app = _app(
        database_url, lease_seconds=2, outbox_lease_seconds=10, retry_base=0.05, retry_cap=0.5
    )
    card = os.environ.get("PAYMENTS_CARD_URL", "")
    mail = os.environ.get("PAYMENTS_MAIL_URL", "")
    client = httpx.Client(timeout=10)  # one per process: thread-safe, keeps connections

    def headers(key: str, event_id: str) -> dict[str, str]:
        return {"Idempotency-Key": key, "X-Event": event_id, "X-Worker-Pid": str(os.getpid())}

    @app.handler("stripe")
    def charge(event: Event, ctx: Context) -> None:
        def call(key: str) -> dict[str, Any]:
            response = client.post(f"{card}/charges", headers=headers(key, event.event_id))
            response.raise_for_status()
            outcome: dict[str, Any] = response.json()
            return outcome

        outcome = ctx.effect("charge", call)
        _record_payment(event, ctx, charge_id=str(outcome["id"]))
        ctx.stage("receipt", {"event_id": event.event_id})
        # The rest of the handler (and of its batch) takes a while, so that
        # kills land there too: after the call's record, no longer a window.
        time.sleep(0.05 if random.random() < 0.1 else random.uniform(0.0, 0.005))

    @app.action("receipt")
    def receipt(payload: dict[str, Any], key: str) -> None:
        client.post(f"{mail}/mails", headers=headers(key, payload["event_id"])).raise_for_status()

    return app


class HandlerBug(Exception):
    """What a buggy handler raises."""


def flaky_app(database_url: str | None = None) -> Onceonly:
    """Writes its payment, then raises on attempts 1 and 2; attempt 3 succeeds."""
    app = _app(database_url, lease_seconds=5, retry_base=0.05, retry_cap=0.2, max_attempts=5)

    @app.handler("stripe")
    def record(event: Event, ctx: Context) -> None:
        _record_payment(event, ctx)
        if ctx.attempt < 3:
            raise HandlerBug(f"boom on attempt {ctx.attempt}")

    return app


def broken_app(database_url: str | None = None) -> Onceonly:
    """Writes its payment, then raises, until ``$PAYMENTS_STATE_DIR/fixed`` exists
    (the deployed fix)."""
    app = _app(database_url, lease_seconds=5, retry_base=0.05, retry_cap=0.2, max_attempts=2)
    state = Path(os.environ.get("PAYMENTS_STATE_DIR", "."))

    @app.handler("stripe")
    def record(event: Event, ctx: Context) -> None:
        _record_payment(event, ctx)
        if not (state / "fixed").exists():
            raise HandlerBug(f"not fixed yet: {json.loads(event.body)['type']}")

    return app


def create_payments_table(database_url: str) -> None:
    """Create the user's table (before onceonly's own tables exist: any order works)."""
    engine = _app(database_url).engine
    try:
        metadata.create_all(engine)
    finally:
        engine.dispose()
