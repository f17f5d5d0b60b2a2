"""The deployment of the reconcile acceptance test (``--app reconcile_app:app``).

Stripe and Asaas deliveries and reconciled events both reach one handler,
which credits the payment the event is about. ``credits`` has a unique
payment id: a payment credited twice would fail its insert; ``handler_runs``
has none, so a handler that ran twice for one event shows up as two rows.

Settings from the environment: ``ONCEONLY_DATABASE_URL`` and the API clients'
``ONCEONLY_STRIPE_API_TOKEN``/``_API_BASE`` and ``ONCEONLY_ASAAS_API_TOKEN``/
``_API_BASE`` (the fake gateway's API).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from onceonly import Event, Onceonly
from onceonly.context import Context
from onceonly.db import create_engine
from onceonly.providers import Asaas, Stripe

STRIPE_SECRET = "whsec_reconcile_test"
ASAAS_TOKEN = "asaas-reconcile-token"

metadata = sa.MetaData()
credits = sa.Table(
    "credits",
    metadata,
    sa.Column("payment_id", sa.Text, primary_key=True),
    sa.Column("provider", sa.Text, nullable=False),
    sa.Column("event_id", sa.Text, nullable=False),
)
handler_runs = sa.Table(
    "handler_runs",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("provider", sa.Text, nullable=False),
    sa.Column("event_id", sa.Text, nullable=False),
    sa.Column("payment_id", sa.Text, nullable=False),
    sa.Column("reconciled", sa.Boolean, nullable=False),
)


def create_tables(database_url: str) -> None:
    engine = create_engine(database_url)
    try:
        metadata.create_all(engine)
    finally:
        engine.dispose()


def build(environ: Mapping[str, str] | None = None) -> Onceonly:
    env = os.environ if environ is None else environ
    app = Onceonly(
        database_url=env["ONCEONLY_DATABASE_URL"],
        providers={"stripe": Stripe(STRIPE_SECRET), "asaas": Asaas(ASAAS_TOKEN)},
        environ={k: v for k, v in env.items() if "_API_" in k},
        retry_base=0.05,
        retry_cap=0.5,
    )

    @app.handler()
    def credit(event: Event, ctx: Context) -> None:
        body = json.loads(event.body)
        if event.provider == "stripe":
            payment_id = body["data"]["object"]["id"]
        else:
            payment_id = body["payment"]["id"]
        reconciled = "onceonly-reconciled" in event.headers
        ctx.connection.execute(
            handler_runs.insert().values(
                provider=event.provider,
                event_id=event.event_id,
                payment_id=payment_id,
                reconciled=reconciled,
            )
        )
        # What a payments handler does with a payment it may hear of twice
        # (Asaas: a delivered event and a reconciled one): credit it once,
        # decided by the unique key, in the transaction that marks the event.
        insert = postgresql.insert if ctx.connection.dialect.name == "postgresql" else sqlite.insert
        ctx.connection.execute(
            insert(credits)
            .values(payment_id=payment_id, provider=event.provider, event_id=event.event_id)
            .on_conflict_do_nothing(index_elements=["payment_id"])
        )

    return app


def app() -> Onceonly:
    return build()
