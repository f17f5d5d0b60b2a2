"""``EventOutlet``: received events processed by a real ``celery worker``
(Redis), both engines. Each message carries one claim; a lost message's event
is claimed and sent again after its lease; a duplicate or stale message does
nothing; the handler's writes and the processed mark commit together."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import sqlalchemy as sa

import celery_outlet_app
from celery_support import CardApi, Queue, shop_env, start_celery_worker
from onceonly import NewEvent, Onceonly, create_store
from onceonly.context import effect_key
from onceonly.contrib.celery import EventOutlet
from onceonly.db import create_engine
from processes import Proc, rows, statuses

EVENTS = ["evt_a", "evt_b", "evt_c", "evt_flaky"]
TIMEOUT = 30


def deliver(database_url: str, *event_ids: str) -> None:
    async def insert() -> None:
        async with create_store(database_url) as store:
            await store.insert_events(
                [NewEvent("stripe", e, "charge.succeeded", b"{}", {}) for e in event_ids]
            )

    asyncio.run(insert())


def claim_of(db: sa.Engine, event_id: str) -> tuple[int, int]:
    ((pk, fence),) = rows(
        db, "SELECT id, fence FROM onceonly_events WHERE event_id = :e", e=event_id
    )
    return int(pk), int(fence)


def test_events_handed_to_celery_are_processed_once_with_their_writes(
    redis_url: str, database_url: str, tmp_path: Path, procs: list[Proc]
) -> None:
    db = create_engine(database_url)
    with db.begin() as conn:
        conn.exec_driver_sql(celery_outlet_app.PAYMENTS)
    deliver(database_url, *EVENTS)
    queue, card = Queue.new(), CardApi()
    env = shop_env(database_url, queue, card, tmp_path, lease=2.0)
    home = Onceonly(database_url=database_url, environ={})
    outlet = EventOutlet(home, queue.client, queue=queue.name)
    try:
        worker = start_celery_worker(
            procs, "celery-outlet", env, tmp_path, app="celery_outlet_app", queue=queue.name
        )
        # A message lost on the way: its event claimed for 1 s and never sent.
        lost = EventOutlet(home, queue.client, lease_seconds=1.0, batch_size=1)
        (gone,) = lost.work.claim(home.engine, 1, owner=lost.owner, lease=1.0)
        assert outlet.dispatch() == len(EVENTS) - 1
        # The same claim sent twice: at most one of the two processes it.
        twice = claim_of(db, "evt_b")
        duplicate = queue.client.send_task("onceonly.process_event", twice, queue=queue.name)

        deadline = time.monotonic() + TIMEOUT
        while statuses(db) != {"processed": len(EVENTS)}:
            assert time.monotonic() < deadline, (statuses(db), worker.output()[-3000:])
            outlet.dispatch()  # the lost event after its lease, the failed one when due
            time.sleep(0.1)

        assert duplicate.get(timeout=TIMEOUT) in ("processed", "stale")
        stale = (gone.event.id, gone.fence)
        late = queue.client.send_task("onceonly.process_event", stale, queue=queue.name)
        assert late.get(timeout=TIMEOUT) == "stale"

        paid = rows(db, "SELECT event_id FROM outlet_payments ORDER BY event_id")
        assert paid == [(e,) for e in sorted(EVENTS)]
        assert card.calls() == {effect_key("stripe", e, "charge"): 1 for e in EVENTS}
        # The lost event was claimed again (a new fence); the flaky one ran twice.
        assert claim_of(db, gone.event.event_id)[1] > gone.fence
        attempts = rows(
            db,
            "SELECT e.event_id, a.outcome FROM onceonly_attempts a"
            " JOIN onceonly_events e ON e.id = a.event_pk",
        )
        assert attempts == [("evt_flaky", "failed")]
    finally:
        queue.close()
        card.close()
        db.dispose()
