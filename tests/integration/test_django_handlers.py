"""Handlers under Django: the worker's batches run inside ``transaction.atomic``
on Django's connection, so ORM writes and the ``processed`` mark are one commit."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("django")

import django_support
from conftest import POSTGRES
from support import ENGINES, stripe_delivery


@pytest.fixture
def alias(engine: str, database_url: str) -> Iterator[str]:
    postgres = POSTGRES.url if "postgresql" in ENGINES else None
    with django_support.django_alias(engine, postgres) as name:
        yield name


def _statuses(alias: str) -> dict[str, str]:
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT event_id, status FROM onceonly_events")
        return {str(e): str(s) for e, s in cursor.fetchall()}


def _assert_failed_unprocessed(alias: str, event_id: str) -> None:
    """The event's handler failed at least once and the event was not processed.

    Its status is "failed" (a retry due later) or "dead", or "pending" when the
    retry came due just as run_until_idle stopped the worker: a claim taken in
    that instant is given back unrun, as on any stop."""
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT e.status, COUNT(a.event_pk) FROM onceonly_events e"
            " LEFT JOIN onceonly_attempts a"
            " ON a.event_pk = e.id AND a.outcome IN ('failed', 'dead')"
            " WHERE e.event_id = %s GROUP BY e.status",
            [event_id],
        )
        ((status, failures),) = cursor.fetchall()
    assert status in ("failed", "dead", "pending"), status
    assert failures >= 1


def _payments() -> list[tuple[str, int]]:
    from payments.models import Payment

    return sorted(Payment.objects.values_list("event_id", "amount"))


def test_orm_writes_and_the_processed_mark_commit_together(alias: str) -> None:
    from django.db import connections
    from payments import webhooks

    seen: list[tuple[list[Any], list[Any]]] = []

    # While the handler runs, another connection sees neither its payment
    # nor its mark: both wait for the one commit.
    def look_from_outside(event: Any) -> None:
        other = connections.create_connection(alias)
        try:
            with other.cursor() as cursor:
                cursor.execute("SELECT event_id FROM payments_payment")
                payments = [tuple(r) for r in cursor.fetchall()]
                cursor.execute("SELECT status FROM onceonly_events")
                seen.append((payments, [tuple(r) for r in cursor.fetchall()]))
        finally:
            other.close()

    webhooks.PROBES.append(look_from_outside)
    try:
        django_support.deliver([stripe_delivery("evt_seen", event_type="charge.refunded")])
        django_support.run_worker_until_idle(alias, concurrency=1)
    finally:
        webhooks.PROBES.clear()
    assert seen == [([], [("processing",)])]
    assert _payments() == [("evt_seen", 7)]
    assert _statuses(alias) == {"evt_seen": "processed"}
    assert connections[alias].in_atomic_block is False


def test_a_failing_handler_leaves_no_orm_rows_and_its_neighbours_commit(alias: str) -> None:
    django_support.deliver(
        [
            stripe_delivery("evt_ok_1", extra={"amount": 10}),
            stripe_delivery("evt_bad", extra={"amount": 99, "fail": True}),
            stripe_delivery("evt_ok_2", extra={"amount": 20}),
        ]
    )
    # One thread, one batch: the three share a transaction; the failure's
    # savepoint undoes its row, the others' commit.
    django_support.run_worker_until_idle(alias, concurrency=1, batch_size=8)
    assert _payments() == [("evt_ok_1", 10), ("evt_ok_2", 20)]
    statuses = _statuses(alias)
    assert statuses["evt_ok_1"] == statuses["evt_ok_2"] == "processed"
    _assert_failed_unprocessed(alias, "evt_bad")


@pytest.mark.parametrize("swallow", [False, True], ids=["raised", "swallowed"])
def test_a_failed_orm_statement_fails_only_its_handler(alias: str, swallow: bool) -> None:
    # Django marks its transaction for rollback when an ORM statement fails;
    # the handler's savepoint undoes that statement, so the batch goes on. A
    # handler that swallows the error is failed all the same (its writes are
    # not what it meant), as PostgreSQL would have it anyway.
    django_support.deliver(
        [
            stripe_delivery("evt_before", extra={"amount": 1}),
            stripe_delivery("evt_null", extra={"amount": 2, "null": True, "swallow": swallow}),
            stripe_delivery("evt_after", extra={"amount": 3}),
        ]
    )
    django_support.run_worker_until_idle(alias, concurrency=1, batch_size=8)
    assert _payments() == [("evt_after", 3), ("evt_before", 1)]
    statuses = _statuses(alias)
    assert statuses["evt_before"] == statuses["evt_after"] == "processed"
    _assert_failed_unprocessed(alias, "evt_null")


def test_the_effect_ledger_and_the_outbox_work_in_django_handlers(alias: str) -> None:
    from django.db import connections
    from payments import webhooks

    webhooks.SENT.clear()
    django_support.deliver([stripe_delivery("evt_effect", extra={"amount": 5, "effect": True})])
    django_support.run_worker_until_idle(alias, concurrency=1)
    assert _payments() == [("evt_effect", 5)]
    assert [payload for _, payload in webhooks.SENT] == [{"event": "evt_effect"}]
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT status FROM onceonly_outbox")
        assert [row[0] for row in cursor.fetchall()] == ["sent"]


def test_an_async_handler_writes_with_the_async_orm_in_the_same_transaction(alias: str) -> None:
    django_support.deliver(
        [
            stripe_delivery("evt_async_ok", event_type="invoice.paid", extra={"amount": 3}),
            stripe_delivery(
                "evt_async_bad", event_type="invoice.paid", extra={"amount": 4, "fail": True}
            ),
        ]
    )
    django_support.run_worker_until_idle(alias, concurrency=1, batch_size=8)
    assert _payments() == [("evt_async_ok", 3)]
    statuses = _statuses(alias)
    assert statuses["evt_async_ok"] == "processed"
    _assert_failed_unprocessed(alias, "evt_async_bad")


@pytest.fixture
def customer_handlers(alias: str) -> list[str]:
    """Two handlers of the project for every ``customer.*`` event, registered
    with Django's decorator and their own retry policy (once per process: the
    project's handlers outlive each test's application)."""
    from onceonly.contrib.django import get_app, handler

    if get_app().handlers.route("stripe", "customer.created") is None:

        @handler("stripe", "customer.*", attempts=2, backoff=(0.01, 0.01))
        def customer_first(event: Any, ctx: Any) -> None:
            from payments.models import Payment

            Payment.objects.create(event_id=event.event_id, amount=event.json()["data"]["amount"])

        @handler("stripe", "customer.*")
        def customer_second(event: Any, ctx: Any) -> None:
            raise RuntimeError("the second customer handler always fails")

    route = get_app().handlers.route("stripe", "customer.created")
    assert route is not None
    return [r.name for r in route.registrations]


def test_django_handlers_take_wildcards_attempts_and_several_per_type(
    alias: str, customer_handlers: list[str]
) -> None:
    django_support.deliver(
        [stripe_delivery("evt_customer", event_type="customer.created", extra={"amount": 8})]
    )
    django_support.run_worker_until_idle(alias, concurrency=1)
    # Dead after the handlers' two attempts (the project's worker allows
    # more), and the first handler's payment went with each failure.
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT status, attempts FROM onceonly_events")
        assert [tuple(r) for r in cursor.fetchall()] == [("dead", 2)]
    assert _payments() == []
    assert len(customer_handlers) == 2
