"""Handlers' own retry policies, and several handlers for one event, run by a
real worker on a real SQLite file and a real PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import sqlalchemy as sa

from onceonly import Event, NewEvent, Onceonly, create_store
from onceonly.context import Context, effect_key
from onceonly.operations import attempts_of

metadata = sa.MetaData()
payments = sa.Table(
    "payments",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("event_id", sa.Text, nullable=False),
    sa.Column("note", sa.Text),
)


def make_app(database_url: str, **options: Any) -> Onceonly:
    app = Onceonly(database_url=database_url, environ={}, **options)
    with app.engine.begin() as conn:
        metadata.create_all(conn)
    return app


def deliver(database_url: str, *events: tuple[str, str]) -> None:
    async def insert() -> None:
        async with create_store(database_url) as store:
            await store.insert_events(
                [
                    NewEvent("stripe", event_id, event_type, b'{"data": {"amount": 1990}}', {})
                    for event_id, event_type in events
                ]
            )

    asyncio.run(insert())


def name_of(handler: Any) -> str:
    return f"{handler.__module__}.{handler.__qualname__}"


def rows(app: Onceonly, sql: str) -> list[Any]:
    with app.engine.connect() as conn:
        return list(conn.execute(sa.text(sql)).all())


def test_a_handlers_attempts_and_backoff_replace_the_workers(database_url: str) -> None:
    # The worker's own policy would retry an hour later, ten times.
    app = make_app(database_url, max_attempts=10, retry_base=3600, retry_cap=3600)

    @app.handler("stripe", "charge.*", attempts=2, backoff=(0.01, 0.01))
    def charges(event: Event, ctx: Context) -> None:
        raise RuntimeError("charge handler broken")

    @app.handler("stripe", "invoice.paid", attempts=3, backoff=lambda attempt: 0.0)
    def invoices(event: Event, ctx: Context) -> None:
        raise RuntimeError("invoice handler broken")

    @app.handler("stripe")
    def everything_else(event: Event, ctx: Context) -> None:
        raise RuntimeError("still the worker's policy")

    deliver(
        database_url,
        ("evt_charge", "charge.succeeded"),
        ("evt_invoice", "invoice.paid"),
        ("evt_other", "customer.created"),
    )
    # Polled often: retries are due within milliseconds.
    app.worker(poll_interval=0.02).run_until_idle()
    found = {
        r.event_id: (r.status, r.attempts, r.id)
        for r in rows(app, "SELECT id, event_id, status, attempts FROM onceonly_events")
    }
    assert {e: s[:2] for e, s in found.items()} == {
        "evt_charge": ("dead", 2),
        "evt_invoice": ("dead", 3),
        "evt_other": ("failed", 1),  # waiting for its retry, an hour away
    }
    history = attempts_of(app.engine, found["evt_charge"][2])
    assert [(a.attempt, a.outcome) for a in history] == [(1, "failed"), (2, "dead")]


def test_several_handlers_of_one_event_commit_together_once(database_url: str) -> None:
    app = make_app(database_url, retry_base=0.01)
    calls: list[tuple[str, str]] = []
    before: list[int] = []
    parsed: list[Any] = []
    fail = {"notify": 1}

    def send(who: str) -> Any:
        def call(key: str) -> str:
            calls.append((who, key))
            return f"sent by {who}"

        return call

    @app.handler("stripe", "payment_intent.succeeded")
    def record(event: Event, ctx: Context) -> None:
        # What earlier attempts left behind, seen from inside this transaction.
        before.append(
            ctx.connection.execute(
                sa.select(sa.func.count()).where(payments.c.event_id == event.event_id)
            ).scalar_one()
        )
        parsed.append(event.json())
        ctx.connection.execute(payments.insert().values(event_id=event.event_id, note="record"))
        assert ctx.effect("email", send("record")) == "sent by record"

    @app.handler("stripe", "payment_intent.succeeded")
    def notify(event: Event, ctx: Context) -> None:
        parsed.append(event.json())
        ctx.connection.execute(payments.insert().values(event_id=event.event_id, note="notify"))
        assert ctx.effect("email", send("notify")) == "sent by notify"
        if fail["notify"] >= ctx.attempt:
            raise RuntimeError("notify failed after its write and its effect")

    # A wildcard loses to the exact type: it does not join the two above.
    @app.handler("stripe", "payment_intent.*")
    def other_intents(event: Event, ctx: Context) -> None:
        ctx.connection.execute(payments.insert().values(event_id=event.event_id, note="wildcard"))

    deliver(
        database_url, ("evt_pay", "payment_intent.succeeded"), ("evt_new", "payment_intent.created")
    )
    app.worker(concurrency=1, poll_interval=0.02).run_until_idle()

    # The failed attempt's writes (both handlers') were rolled back: the
    # retry found no payment, and each handler's payment is there once.
    assert before == [0, 0]
    notes = sorted((r.event_id, r.note) for r in rows(app, "SELECT event_id, note FROM payments"))
    assert notes == [("evt_new", "wildcard"), ("evt_pay", "notify"), ("evt_pay", "record")]
    (event,) = rows(
        app,
        "SELECT status, attempts, handler FROM onceonly_events WHERE event_id = 'evt_pay'",
    )
    assert (event.status, event.attempts) == ("processed", 2)
    assert event.handler == f"{name_of(record)}, {name_of(notify)}"
    # Each effect ran once, under a key of its own; the first handler's is the
    # key one handler alone always had.
    assert calls == [
        ("record", effect_key("stripe", "evt_pay", "email")),
        ("notify", effect_key("stripe", "evt_pay", f"{name_of(notify)}/email")),
    ]
    # Parsed once per attempt, shared by both handlers of that attempt.
    assert parsed[0] is parsed[1]
    assert parsed[0] == {"data": {"amount": 1990}}
