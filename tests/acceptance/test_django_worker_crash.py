"""``manage.py onceonly_worker`` processes, SIGKILLed and restarted while
deliveries (each event three times) keep arriving: every event's ORM payment
exists exactly once. The shop's ``payments_payment`` has no unique
constraint: a handler whose ORM write committed without its event's mark, or
ran twice, would leave a second row."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

pytest.importorskip("django")

import django_support
from onceonly import Onceonly
from onceonly.db import create_engine
from onceonly.events import Delivery
from onceonly.providers import Stripe
from processes import Proc, rows, scalar, statuses, wait_for
from support import STRIPE_SECRET, signed

EVENTS = 1_000
KILLS = 5
WORKER_ARGS = ("--concurrency", "2", "--log-level", "warning")
#: Short leases: a killed worker's events are claimed again within seconds.
WORKER_ENV = {"ONCEONLY_LEASE_SECONDS": "2"}


@pytest.fixture
def db(database_url: str, tmp_path: Path) -> Iterator[sa.Engine]:
    django_support.manage(database_url, tmp_path, "migrate", "--verbosity", "0")
    engine = create_engine(database_url, pool_size=2)
    yield engine
    engine.dispose()


def _deliveries(event_ids: list[str]) -> list[tuple[bytes, dict[str, str]]]:
    out = []
    for n, event_id in enumerate(event_ids):
        data = {"amount": n, "sleep": 0.003}
        body = json.dumps(
            {"id": event_id, "type": "payment_intent.succeeded", "data": data}
        ).encode()
        out.append(signed(body))
    return out


def _receive(database_url: str, deliveries: list[tuple[bytes, dict[str, str]]]) -> list[bool]:
    """Through onceonly's inbox, as the Django view stores them; duplicates."""
    app = Onceonly(database_url, providers={"stripe": Stripe(STRIPE_SECRET)}, environ={})

    async def receive() -> list[bool]:
        try:
            receipts = await asyncio.gather(
                *(app.inbox.receive(Delivery("stripe", b, h, {})) for b, h in deliveries)
            )
        finally:
            await app.store.close()
        return [r.duplicate for r in receipts]

    return asyncio.run(receive())


def _payments(db: sa.Engine) -> int:
    return int(scalar(db, "SELECT count(*) FROM payments_payment"))


def test_until_idle_processes_what_is_due_and_exits(
    database_url: str, db: sa.Engine, tmp_path: Path
) -> None:
    event_ids = [f"evt_idle_{i}" for i in range(3)]
    _receive(database_url, _deliveries(event_ids))
    output = django_support.manage(
        database_url, tmp_path, "onceonly_worker", "--until-idle", "--log-level", "warning"
    )
    assert "onceonly worker: database" in output
    per_event = dict(rows(db, "SELECT event_id, count(*) FROM payments_payment GROUP BY event_id"))
    assert per_event == dict.fromkeys(event_ids, 1)
    assert statuses(db) == {"processed": 3}


def test_sigkilled_django_workers_create_each_payment_exactly_once(
    database_url: str, db: sa.Engine, tmp_path: Path, procs: list[Proc]
) -> None:
    event_ids = [f"evt_dj_{i:04d}" for i in range(EVENTS)]
    deliveries = _deliveries(event_ids)
    assert not any(_receive(database_url, deliveries))  # first deliveries: all new

    spawned = 0

    def spawn() -> Proc:
        nonlocal spawned
        spawned += 1
        return django_support.start_worker(
            procs, f"worker-{spawned}", database_url, tmp_path, *WORKER_ARGS, **WORKER_ENV
        )

    workers = [spawn(), spawn()]
    orphaned: list[int] = []
    for kill in range(KILLS):
        target = (kill + 1) * 120
        wait_for(
            f"{target} payments before kill {kill + 1}",
            lambda target=target: _payments(db) >= target,  # type: ignore[misc]
            timeout=60,
            watch=workers,
            interval=0.02,
        )
        victim = workers.pop(kill % len(workers))
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(10)
        orphaned.append(
            int(
                scalar(
                    db,
                    "SELECT count(*) FROM onceonly_events"
                    " WHERE status = 'processing' AND lease_owner LIKE :owner",
                    owner=f"%:{victim.pid}:%",
                )
            )
        )
        workers.insert(kill % (len(workers) + 1), spawn())
        if kill in (1, 3):  # the senders retry meanwhile: duplicates only
            assert all(_receive(database_url, deliveries))

    wait_for(
        "every event processed",
        lambda: statuses(db).get("processed", 0) == EVENTS,
        timeout=90,
        watch=workers,
    )
    for worker in workers:
        assert worker.stop() == 0, worker.output()[-3000:]  # SIGTERM: a clean exit

    per_event = dict(rows(db, "SELECT event_id, count(*) FROM payments_payment GROUP BY event_id"))
    assert per_event == dict.fromkeys(event_ids, 1)
    assert statuses(db) == {"processed": EVENTS}
    # The kills hit workers in the middle of batches, not idle ones.
    assert sum(orphaned) > 0, orphaned
    print(f"\nkills orphaned {orphaned} events; {spawned} workers started")
