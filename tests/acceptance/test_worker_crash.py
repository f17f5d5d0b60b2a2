"""Workers that die, handlers that fail: every event still takes effect exactly once.

Real ``onceonly serve`` / ``onceonly worker`` / ``onceonly events`` subprocesses
on a real database (a SQLite file, or PostgreSQL), handlers from
``payments_app`` that write to the user's own ``payments`` table, which has no
unique constraint: a handler that ran twice would leave two rows.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import payments_app
import pytest
import sqlalchemy as sa

from onceonly.context import effect_key
from onceonly.db import create_engine
from onceonly.ledger import EffectLedger
from processes import (
    ONCEONLY,
    Proc,
    app_env,
    rows,
    scalar,
    start_server,
    start_worker,
    statuses,
    wait_for,
)
from support import live_server, stripe_delivery

EVENTS = 1_000
DELIVERIES_PER_EVENT = 3
WORKERS = 4
KILLS = 10
SENDERS = 32


@pytest.fixture
def db(database_url: str) -> Iterator[sa.Engine]:
    engine = create_engine(database_url, pool_size=2)
    yield engine
    engine.dispose()


def deliver(url: str, *event_ids: str) -> None:
    with httpx.Client(timeout=10) as client:
        for event_id in event_ids:
            body, headers = stripe_delivery(event_id)
            response = client.post(f"{url}/webhooks/stripe", content=body, headers=headers)
            assert response.status_code == 200, response.text


def receive(database_url: str, *event_ids: str) -> None:
    """Receive signed deliveries through the real receiver (in-process uvicorn)."""
    app = payments_app.inbox_app(database_url)
    with live_server(app.asgi()) as url:
        deliver(url, *event_ids)


# 1. Chaos.


class ChaosRun:
    """`onceonly serve` and WORKERS `onceonly worker` processes; signed deliveries
    from SENDERS concurrent senders while KILLS workers are SIGKILLed and replaced."""

    def __init__(self, db: sa.Engine, env: dict[str, str], cwd: Path, procs: list[Proc]) -> None:
        self.db = db
        self.env = env
        self.cwd = cwd
        self.procs = procs
        self.url = ""
        self.workers: list[Proc] = []
        self.spawned = 0
        self.started = time.monotonic()
        self.sending = False
        #: Answers by status code (or transport error), and deliveries retried.
        self.answers: Counter[str] = Counter()
        self.retried = 0
        #: Per event: answers that were not "duplicate" (the one that stored it).
        self.stored: Counter[str] = Counter()
        self.kills: list[dict[str, Any]] = []

    def start(self) -> None:
        self.url = start_server(self.procs, "chaos_app", self.env, self.cwd)
        for _ in range(WORKERS):
            self.spawn()

    def spawn(self) -> None:
        self.spawned += 1
        name = f"worker-{self.spawned}"
        concurrency = random.randint(2, 4)
        self.workers.append(
            start_worker(self.procs, name, "chaos_app", self.env, self.cwd, concurrency)
        )

    async def run(self, deliveries: list[str]) -> None:
        self.started = time.monotonic()
        await asyncio.gather(self.send_all(deliveries), self.kill_randomly())

    async def send_all(self, deliveries: list[str]) -> None:
        self.sending = True
        queue = iter(deliveries)
        await asyncio.gather(*(self.sender(queue) for _ in range(SENDERS)))
        self.sending = False

    async def sender(self, queue: Iterator[str]) -> None:
        # One client (one connection) per sender: httpcore's pool spends CPU
        # superlinear in its connections, and on 2 cores one client with 32
        # connections burns more CPU than the server it is loading.
        async with httpx.AsyncClient(timeout=30) as client:
            for event_id in queue:
                await self.send(client, event_id)

    async def send(self, client: httpx.AsyncClient, event_id: str) -> None:
        body, headers = stripe_delivery(event_id)
        for _ in range(50):
            try:
                response = await client.post(
                    f"{self.url}/webhooks/stripe", content=body, headers=headers
                )
            except httpx.TransportError as exc:
                self.answers[type(exc).__name__] += 1
            else:
                self.answers[str(response.status_code)] += 1
                if response.status_code == 200:
                    if response.headers.get("onceonly-duplicate") != "true":
                        self.stored[event_id] += 1
                    return
                assert response.status_code == 503, response.text  # only "retry later"
            self.retried += 1
            await asyncio.sleep(0.1)  # a sender retries, as Stripe would
        raise AssertionError(f"{event_id} never got a 200")

    async def kill_randomly(self) -> None:
        for n in range(KILLS):
            await asyncio.sleep(random.uniform(0.2, 1.0))
            # Prefer a worker that holds events right now: killing an idle one
            # tests little. Workers are named host:pid:suffix.
            owners = await asyncio.to_thread(
                rows,
                self.db,
                "SELECT DISTINCT lease_owner FROM onceonly_events WHERE status = 'processing'",
            )
            busy = {str(owner).split(":")[-2] for (owner,) in owners if owner}
            alive = [w for w in self.workers if w.alive()]
            victim = random.choice([w for w in alive if str(w.pid) in busy] or alive)
            victim.process.send_signal(signal.SIGKILL)
            await asyncio.to_thread(victim.process.wait, 10)
            self.workers.remove(victim)
            self.spawn()
            # What it left behind: claimed events nobody runs until their lease ends.
            orphaned = await asyncio.to_thread(
                scalar,
                self.db,
                "SELECT count(*) FROM onceonly_events"
                " WHERE status = 'processing' AND lease_owner LIKE :owner",
                owner=f"%:{victim.pid}:%",
            )
            self.kills.append(
                {
                    "kill": n + 1,
                    "at": round(time.monotonic() - self.started, 2),
                    "sending": self.sending,
                    "victim_busy": str(victim.pid) in busy,
                    "orphaned": orphaned,
                    "statuses": await asyncio.to_thread(statuses, self.db),
                }
            )


async def test_sigkilled_workers_under_load_process_every_event_exactly_once(
    database_url: str, db: sa.Engine, tmp_path: Path, procs: list[Proc]
) -> None:
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    payments_app.create_payments_table(database_url)
    chaos = ChaosRun(db, app_env(database_url), tmp_path, procs)
    chaos.start()
    timings["startup"] = time.monotonic() - t0

    event_ids = [f"evt_chaos_{i:04d}" for i in range(EVENTS)]
    deliveries = [e for e in event_ids for _ in range(DELIVERIES_PER_EVENT)]
    random.shuffle(deliveries)
    await chaos.run(deliveries)
    timings["deliver+kill"] = time.monotonic() - chaos.started

    timings["drain"] = await asyncio.to_thread(
        wait_for,
        f"all {EVENTS} events processed",
        lambda: statuses(db).get("processed", 0) >= EVENTS,
        120,
        chaos.workers,
        0.25,
    )
    for worker in chaos.workers:
        assert worker.stop() == 0, worker.output()[-3000:]
    timings["total"] = time.monotonic() - t0

    reclaimed = scalar(db, "SELECT count(*) FROM onceonly_events WHERE attempts > 1")
    print(f"\ntimings: { {k: round(v, 2) for k, v in timings.items()} }")
    print(f"answers: {dict(chaos.answers)}, retried: {chaos.retried}, reclaimed: {reclaimed}")
    for kill in chaos.kills:
        print("  " + " ".join(f"{k}={v}" for k, v in kill.items()))

    # The receiver stored each event once, and the chaos really happened.
    assert set(chaos.stored) == set(event_ids)
    assert set(chaos.stored.values()) == {1}, "an event was stored twice"
    assert len(chaos.kills) == KILLS
    assert reclaimed > 0, "no kill hit a worker holding events: the chaos tested nothing"
    # Every event processed; each handler's write is there exactly once.
    assert statuses(db) == {"processed": EVENTS}
    assert scalar(db, "SELECT count(*) FROM onceonly_events") == EVENTS
    assert scalar(db, "SELECT count(*) FROM payments") == EVENTS
    duplicates = rows(
        db, "SELECT event_id, count(*) FROM payments GROUP BY event_id HAVING count(*) > 1"
    )
    assert duplicates == [], f"{len(duplicates)} events paid twice, e.g. {duplicates[:5]}"
    assert {event_id for (event_id,) in rows(db, "SELECT event_id FROM payments")} == set(event_ids)
    # Each marked by the chaos app's handler, none left holding a lease.
    assert rows(
        db,
        "SELECT handler, count(*) FROM onceonly_events WHERE processed_at IS NOT NULL"
        " AND lease_owner IS NULL GROUP BY handler",
    ) == [("payments_app.chaos_app.<locals>.record", EVENTS)]


# 2. The effect crash window.


class Gateway:
    """A payment gateway on loopback that dedupes by the Idempotency-Key header:
    a repeated key gets the first charge back and creates nothing."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.charges: list[dict[str, Any]] = []
        self.by_key: dict[str, dict[str, Any]] = {}
        self.keys_seen: list[str | None] = []
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
                key = self.headers.get("Idempotency-Key")
                with gateway.lock:
                    gateway.keys_seen.append(key)
                    charge = gateway.by_key.get(key) if key else None
                    if charge is None:
                        charge = {
                            "id": f"ch_{len(gateway.charges) + 1}",
                            "amount": body["amount"],
                            "event_id": body["event_id"],
                        }
                        gateway.charges.append(charge)
                        if key:
                            gateway.by_key[key] = charge
                payload = json.dumps(charge).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Gateway:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def test_crash_between_the_call_and_its_record_is_covered_by_the_idempotency_key(
    database_url: str, db: sa.Engine, tmp_path: Path, procs: list[Proc]
) -> None:
    payments_app.create_payments_table(database_url)
    receive(database_url, "evt_charge")
    effect_ledger = EffectLedger(database_url, db)
    effect_ledger.prepare()  # a fresh SQLite ledger file has no table yet
    ledger = effect_ledger.engine  # where the records live
    (pk,) = rows(db, "SELECT id FROM onceonly_events WHERE event_id = 'evt_charge'")[0]
    key = effect_key("stripe", "evt_charge", "charge")

    with Gateway() as gateway:
        env = app_env(database_url, PAYMENTS_GATEWAY_URL=gateway.url)
        first = start_worker(procs, "worker-first", "effect_app", env, tmp_path, 1)
        # Attempt 1 calls the gateway, then SIGKILLs its own process inside the effect.
        assert first.process.wait(30) == -signal.SIGKILL, first.output()[-3000:]
        assert gateway.keys_seen == [key]
        assert len(gateway.charges) == 1
        assert rows(db, "SELECT status, attempts FROM onceonly_events") == [("processing", 1)]
        assert scalar(ledger, "SELECT count(*) FROM onceonly_effects") == 0  # never recorded
        assert scalar(db, "SELECT count(*) FROM payments") == 0
        assert scalar(db, "SELECT count(*) FROM onceonly_attempts") == 0  # no error to report

        second = start_worker(procs, "worker-second", "effect_app", env, tmp_path, 1)
        wait_for(
            "the event processed by the second worker",
            lambda: statuses(db) == {"processed": 1},
            30,
            [second],
        )
        assert second.stop() == 0, second.output()[-3000:]

        # The effect ran again with the same key; the gateway charged once.
        assert gateway.keys_seen == [key, key]
        assert gateway.charges == [{"id": "ch_1", "amount": 1999, "event_id": "evt_charge"}]

    assert rows(db, "SELECT status, attempts FROM onceonly_events") == [("processed", 2)]
    effects = rows(ledger, "SELECT event_pk, name, key, outcome FROM onceonly_effects")
    effect_ledger.dispose()
    assert len(effects) == 1
    assert tuple(effects[0][:3]) == (pk, "charge", key)
    assert json.loads(effects[0][3]) == gateway.charges[0]
    assert rows(db, "SELECT event_id, attempt, charge_id FROM payments") == [
        ("evt_charge", 2, "ch_1")
    ]
    # Attempt rows are kept for failures only: the killed attempt recorded nothing.
    assert scalar(db, "SELECT count(*) FROM onceonly_attempts") == 0


# 3. A handler that raises after writing.


def test_handler_failing_after_its_writes_rolls_them_back_and_retries(
    database_url: str, db: sa.Engine
) -> None:
    payments_app.create_payments_table(database_url)
    event_ids = [f"evt_flaky_{i}" for i in range(5)]
    receive(database_url, *event_ids)
    app = payments_app.flaky_app(database_url)
    try:

        def run_worker() -> bool:
            app.worker(concurrency=2, poll_interval=0.1).run_until_idle(timeout=10)
            return statuses(db) == {"processed": len(event_ids)}

        # run_until_idle returns when nothing is *due*: a retry scheduled in the
        # future may still be waiting, so run again until everything is processed.
        wait_for("every flaky event processed", run_worker, 60)
    finally:
        app.engine.dispose()

    assert rows(db, "SELECT DISTINCT status, attempts FROM onceonly_events") == [("processed", 3)]
    paid = rows(db, "SELECT event_id, attempt FROM payments ORDER BY event_id")
    assert paid == [(e, 3) for e in event_ids]  # attempts 1 and 2 wrote, then rolled back
    for event_id in event_ids:
        history = rows(
            db,
            "SELECT a.attempt, a.outcome, a.error_type, a.error_message"
            " FROM onceonly_attempts a JOIN onceonly_events e ON e.id = a.event_pk"
            " WHERE e.event_id = :event_id ORDER BY a.id",
            event_id=event_id,
        )
        # Failed attempts are kept; the successful third shows in the event row.
        assert history == [
            (1, "failed", "HandlerBug", "boom on attempt 1"),
            (2, "failed", "HandlerBug", "boom on attempt 2"),
        ]


# 4. Dead, fixed, replayed.


def test_dead_event_replayed_after_the_fix_is_processed_once(
    database_url: str, db: sa.Engine, tmp_path: Path, procs: list[Proc]
) -> None:
    payments_app.create_payments_table(database_url)
    receive(database_url, "evt_dead")
    (pk,) = rows(db, "SELECT id FROM onceonly_events")[0]
    env = app_env(database_url, PAYMENTS_STATE_DIR=str(tmp_path))

    worker = start_worker(procs, "worker-broken", "broken_app", env, tmp_path)
    wait_for("the event to die", lambda: statuses(db) == {"dead": 1}, 30, [worker])
    assert worker.stop() == 0, worker.output()[-3000:]
    assert scalar(db, "SELECT count(*) FROM payments") == 0  # both attempts rolled back
    assert rows(db, "SELECT attempt, outcome FROM onceonly_attempts ORDER BY id") == [
        (1, "failed"),
        (2, "dead"),
    ]

    (tmp_path / "fixed").touch()  # deploy the fix
    replay = subprocess.run(
        [
            *ONCEONLY,
            *["events", "replay", "--status", "dead"],
            *["--app", "payments_app:broken_app", "--format", "json"],
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert replay.returncode == 0, replay.stderr
    assert json.loads(replay.stdout) == {"replayed": [pk]}
    assert rows(db, "SELECT status, attempts FROM onceonly_events") == [("pending", 0)]

    worker = start_worker(procs, "worker-fixed", "broken_app", env, tmp_path)
    wait_for("the replayed event processed", lambda: statuses(db) == {"processed": 1}, 30, [worker])
    assert worker.stop() == 0, worker.output()[-3000:]

    assert rows(db, "SELECT status, attempts FROM onceonly_events") == [("processed", 1)]
    assert rows(db, "SELECT event_id, attempt FROM payments") == [("evt_dead", 1)]
    # The history before the replay is kept; the new attempt succeeded (nothing to add).
    assert rows(db, "SELECT attempt, outcome FROM onceonly_attempts ORDER BY id") == [
        (1, "failed"),
        (2, "dead"),
    ]
