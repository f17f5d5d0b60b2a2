"""The effect ledger and the outbox keep their word: real ``onceonly serve`` and
``onceonly worker`` subprocesses, a loopback card API and mail API that count
calls per idempotency key.

Without kills: no call and no e-mail repeated, every processed event has its
effect record. With workers SIGKILLed: a repeat carries the original key and
follows a call made by a killed worker, and a kill repeats at most what that
worker had in flight (one call or e-mail per handler thread), not its batch.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import payments_app
import sqlalchemy as sa

from onceonly.context import effect_key
from onceonly.db import create_engine
from onceonly.ledger import EffectLedger, effects_url
from processes import (
    Proc,
    app_env,
    rows,
    scalar,
    start_server,
    start_worker,
    statuses,
    wait_for,
)
from support import stripe_delivery

WORKERS = 3
CONCURRENCY = 2
# Larger runs for the figures in docs/worker.md, e.g.
# ONCEONLY_TEST_EFFECT_EVENTS=1000 ONCEONLY_TEST_EFFECT_KILLS=20.
CALM_EVENTS = KILLED_EVENTS = int(os.environ.get("ONCEONLY_TEST_EFFECT_EVENTS", "150"))
KILLS = int(os.environ.get("ONCEONLY_TEST_EFFECT_KILLS", "5"))
WAIT = 60 + CALM_EVENTS / 10  # seconds for a phase to drain


@dataclass(frozen=True)
class Call:
    path: str
    key: str
    event_id: str
    pid: int


class CountingApis:
    """The card API (``POST /charges``) and the mail API (``POST /mails``) on
    loopback: every call kept with its key, event and calling process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[Call] = []
        apis = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes: without this, Nagle holds
            # the second until the client's delayed ACK, 40 ms per call.
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                call = Call(
                    self.path,
                    self.headers["Idempotency-Key"],
                    self.headers["X-Event"],
                    int(self.headers["X-Worker-Pid"]),
                )
                with apis.lock:
                    apis.calls.append(call)
                    n = len(apis.calls)
                body = json.dumps({"id": f"ch_{n}"}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def of(self, path: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.path == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def repeats(calls: list[Call]) -> dict[str, list[Call]]:
    by_key: dict[str, list[Call]] = collections.defaultdict(list)
    for call in calls:
        by_key[call.key].append(call)
    return {k: c for k, c in by_key.items() if len(c) > 1}


def check_keys(apis: CountingApis) -> None:
    """Every call carries its event's key: the card's is the effect key; an
    e-mail's names one outbox row, one per event."""
    for call in apis.of("/charges"):
        assert call.key == effect_key("stripe", call.event_id, "charge"), call
    events_of_mail_key: dict[str, set[str]] = collections.defaultdict(set)
    mail_keys_of_event: dict[str, set[str]] = collections.defaultdict(set)
    for call in apis.of("/mails"):
        events_of_mail_key[call.key].add(call.event_id)
        mail_keys_of_event[call.event_id].add(call.key)
    assert all(len(e) == 1 for e in events_of_mail_key.values())
    assert all(len(k) == 1 for k in mail_keys_of_event.values())


def check_records(db: sa.Engine, ledger: sa.Engine, apis: CountingApis) -> None:
    """Every processed event that made a call has its record, with that key."""
    processed = dict(
        rows(db, "SELECT event_id, id FROM onceonly_events WHERE status = 'processed'")
    )
    records = dict(rows(ledger, "SELECT event_pk, key FROM onceonly_effects WHERE name = 'charge'"))
    called = {c.event_id for c in apis.of("/charges")}
    missing = [e for e in called if e in processed and processed[e] not in records]
    assert missing == [], f"{len(missing)} processed events without a record: {missing[:5]}"
    for event_id, pk in processed.items():
        assert records[pk] == effect_key("stripe", event_id, "charge")


def send(url: str, *event_ids: str) -> None:
    """Deliver like a gateway: a 503 (the database busy or away) is sent again."""
    with httpx.Client(timeout=30) as client:
        for event_id in event_ids:
            body, headers = stripe_delivery(event_id)
            for _ in range(100):
                response = client.post(f"{url}/webhooks/stripe", content=body, headers=headers)
                if response.status_code == 200:
                    break
                assert response.status_code == 503, response.text
                time.sleep(0.1)
            else:
                raise AssertionError(f"{event_id} never got a 200")


def reader(url: str) -> sa.Engine:
    """An engine for the test's own reads. On SQLite a plain deferred read (WAL:
    never waits), not onceonly's engine, whose every transaction takes the
    write lock and would wait behind the workers."""
    if url.startswith("sqlite:///"):
        return sa.create_engine(url)
    return create_engine(url, pool_size=2)


class Shop:
    """``onceonly serve`` and WORKERS ``onceonly worker`` processes of ``ledger_app``."""

    def __init__(self, database_url: str, tmp_path: Path, apis: CountingApis) -> None:
        self.env = app_env(database_url, PAYMENTS_CARD_URL=apis.url, PAYMENTS_MAIL_URL=apis.url)
        self.tmp_path = tmp_path
        self.apis = apis
        self.db = reader(database_url)
        self.ledger = EffectLedger(database_url, self.db)
        self.ledger.prepare()
        self.records = reader(effects_url(database_url))
        self.procs: list[Proc] = []
        self.url = start_server(self.procs, "ledger_app", self.env, tmp_path)
        self.workers = [self.spawn(f"worker-{i}") for i in range(WORKERS)]
        #: pid -> handler threads, of every worker killed.
        self.killed: dict[int, int] = {}
        self.busy_kills = 0

    def spawn(self, name: str) -> Proc:
        return start_worker(self.procs, name, "ledger_app", self.env, self.tmp_path, CONCURRENCY)

    def drained(self, n: int) -> bool:
        unsent = "SELECT count(*) FROM onceonly_outbox WHERE status <> 'sent'"
        return (
            statuses(self.db) == {"processed": n}
            and len(self.apis.of("/mails")) >= n
            and scalar(self.db, unsent) == 0
        )

    def kill_one(self) -> None:
        """SIGKILL a worker, one holding events if there is one, and replace it."""
        owners = rows(
            self.db, "SELECT DISTINCT lease_owner FROM onceonly_events WHERE status = 'processing'"
        )
        busy = {str(o).split(":")[-2] for (o,) in owners if o}
        alive = [w for w in self.workers if w.alive()]
        victim = random.choice([w for w in alive if str(w.pid) in busy] or alive)
        self.busy_kills += str(victim.pid) in busy
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(10)
        self.killed[victim.pid] = CONCURRENCY
        self.workers.remove(victim)
        self.workers.append(self.spawn(f"worker-r{len(self.killed)}"))

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
        self.ledger.dispose()
        self.records.dispose()
        self.db.dispose()


def check_bounded_repeats(shop: Shop) -> dict[str, Any]:
    report: dict[str, Any] = {"kills": len(shop.killed), "busy_kills": shop.busy_kills}
    for path, limit in (("/charges", CONCURRENCY), ("/mails", CONCURRENCY + 1)):
        calls = shop.apis.of(path)
        repeated = repeats(calls)
        # Every earlier call of a repeated key came from a worker that was killed:
        # a live worker never left a call for another to make again.
        earlier = [c for same in repeated.values() for c in same[:-1]]
        assert all(c.pid in shop.killed for c in earlier), [
            c for c in earlier if c.pid not in shop.killed
        ]
        per_kill = collections.Counter(c.pid for c in earlier)
        # At most what was in flight in that worker (one per handler thread,
        # plus its sweep for e-mails), not its batch of up to 32.
        assert all(n <= limit for n in per_kill.values()), per_kill
        report[path] = {
            "calls": len(calls),
            "repeated_keys": len(repeated),
            "repeats_per_kill": sorted(per_kill.values(), reverse=True),
        }
    return report


def test_calls_and_mails_once_without_kills_and_bounded_repeats_with_kills(
    database_url: str, tmp_path: Path
) -> None:
    payments_app.create_payments_table(database_url)
    apis = CountingApis()
    started = time.monotonic()
    shop = Shop(database_url, tmp_path, apis)
    total = CALM_EVENTS + KILLED_EVENTS
    try:
        # 1. No kills: nothing repeated, every record there.
        calm = [f"evt_calm_{i:03d}" for i in range(CALM_EVENTS)]
        send(shop.url, *calm, *calm[::3])  # resends: duplicates are answered, not stored
        wait_for("the calm events", lambda: shop.drained(CALM_EVENTS), WAIT, shop.workers)
        assert repeats(apis.of("/charges")) == {}
        assert repeats(apis.of("/mails")) == {}
        check_keys(apis)
        check_records(shop.db, shop.records, apis)
        calm_seconds = time.monotonic() - started

        # 2. Workers SIGKILLed while events flow.
        hot = [f"evt_kill_{i:03d}" for i in range(KILLED_EVENTS)]
        sender = threading.Thread(target=send, args=(shop.url, *hot))
        sender.start()
        for _ in range(KILLS):
            time.sleep(random.uniform(0.2, 0.6) * max(1.0, KILLED_EVENTS / 150 * 5 / KILLS))
            shop.kill_one()
        sender.join(WAIT)
        wait_for("every event after the kills", lambda: shop.drained(total), WAIT, shop.workers)
        for worker in shop.workers:
            assert worker.stop() == 0, worker.output()[-3000:]

        assert scalar(shop.db, "SELECT count(*) FROM payments") == total
        twice = "SELECT event_id FROM payments GROUP BY event_id HAVING count(*) > 1"
        assert rows(shop.db, twice) == []
        check_keys(apis)
        check_records(shop.db, shop.records, apis)
        report = check_bounded_repeats(shop)
    finally:
        shop.close()
        apis.close()
    report["calm_seconds"] = round(calm_seconds, 1)
    report["seconds"] = round(time.monotonic() - started, 1)
    print(f"\neffects under kills: {json.dumps(report)}")
