"""``onceonly reconcile`` end to end: 500 events at the fake Stripe gateway and
500 at the fake Asaas gateway, 10% of each lost for good; after reconcile every
payment is processed once, and a second reconcile changes nothing.

The fake gateway's API runs in-process on loopback, and reconcile reads it
over HTTP; the first Stripe reconcile is the real ``onceonly reconcile``
subprocess, the others are the same function called in-process. The
deliveries reach the receiver's ASGI app in-process (httpx's ASGI
transport): through a uvicorn thread in this process 500 of them took 16 s on
a loaded 2-core machine against 1.6 s in-process (the two event loops contend
for the GIL), and the HTTP side of deliveries has its own test
(test_dev_gateway.py).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import httpx
import reconcile_app
import sqlalchemy as sa

from onceonly.db import create_engine
from onceonly.dev.api import DEFAULT_TOKEN, FakeApi
from onceonly.dev.delivery import DeliveryReport, Faults, Sender
from onceonly.dev.gateway import prepare_events, provider_for, record_deliveries
from onceonly.dev.servers import serve_in_thread
from onceonly.receiver import Receiver
from onceonly.reconcile import ReconcileReport, parse_since
from onceonly.reconcile import reconcile_app as run_reconcile
from processes import ONCEONLY, app_env

EVENTS = 500
LOSS = 0.1
SECRETS = {"stripe": reconcile_app.STRIPE_SECRET, "asaas": reconcile_app.ASAAS_TOKEN}


async def deliver(
    provider: str, api: FakeApi, client: httpx.AsyncClient, seed: int
) -> DeliveryReport:
    events = prepare_events(provider, EVENTS, seed=seed, api=api)
    sender = Sender(
        provider_for(provider, SECRETS[provider]),
        f"http://receiver/webhooks/{provider}",
        faults=Faults(lost=LOSS),
        seed=seed,
        concurrency=32,
    )
    report = await sender.deliver(events, client)
    record_deliveries(api, provider, report)
    return report


def deliver_both(api: FakeApi, receiver: Receiver) -> dict[str, DeliveryReport]:
    # One event loop for both: the receiver's store (asyncpg's pool) belongs to it.
    async def run() -> dict[str, DeliveryReport]:
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(receiver)) as client:
                return {
                    "stripe": await deliver("stripe", api, client, 7),
                    "asaas": await deliver("asaas", api, client, 8),
                }
        finally:
            # ASGITransport sends no lifespan events: close the store here,
            # on the loop its connections belong to.
            await receiver.inbox.store.close()

    return asyncio.run(run())


def count(engine: sa.Engine, sql: str, **params: object) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(sql), params).scalar_one())


def credited(engine: sa.Engine, provider: str) -> int:
    return count(engine, "SELECT count(*) FROM credits WHERE provider = :p", p=provider)


def test_reconcile_catches_up_on_lost_deliveries_once(database_url: str, tmp_path: Path) -> None:
    reconcile_app.create_tables(database_url)
    api = FakeApi()
    with serve_in_thread(api, lifespan="off") as api_url:
        env = app_env(
            database_url,
            ONCEONLY_STRIPE_API_TOKEN=DEFAULT_TOKEN,
            ONCEONLY_STRIPE_API_BASE=api_url,
            ONCEONLY_ASAAS_API_TOKEN=DEFAULT_TOKEN,
            ONCEONLY_ASAAS_API_BASE=api_url,
        )
        app = reconcile_app.build(env)
        engine = create_engine(database_url)
        receiver = app.asgi()
        reports = deliver_both(api, receiver)
        for provider, report in reports.items():
            # 10% lost for good, give or take what 500 draws give; the rest arrived.
            assert 25 <= report.stats.lost <= 75, (provider, report.stats.lost)
            assert report.stats.acknowledged == EVENTS - report.stats.lost
        app.worker(concurrency=4).run_until_idle(60)
        for provider, report in reports.items():
            assert credited(engine, provider) == EVENTS - report.stats.lost

        # The real command, once: Stripe's events list, all 500 of them.
        done = subprocess.run(
            [*ONCEONLY, "reconcile", "stripe", "--app", "reconcile_app:app", "--format", "json"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        first = json.loads(done.stdout)
        lost = reports["stripe"].stats.lost
        assert (first["listed"], first["new"], first["already"]) == (EVENTS, lost, EVENTS - lost)
        lost_ids = {o.event_id for o in reports["stripe"].outcomes.values() if o.lost}
        assert set(first["new_ids"]) == lost_ids

        since = parse_since("1d", default=0)
        asaas = asyncio.run(run_reconcile(app, "asaas", since=since))
        # Asaas lists payments, not events: every payment comes back as the
        # event of its status, under an id of its own (docs/reconcile.md).
        assert (asaas.listed, asaas.new, asaas.already) == (EVENTS, EVENTS, 0)
        assert asaas.queue is not None
        assert asaas.queue["interrupted"] is False

        app.worker(concurrency=4).run_until_idle(60)
        for provider in ("stripe", "asaas"):
            assert credited(engine, provider) == EVENTS, provider
        assert (
            count(engine, "SELECT count(*) FROM onceonly_events WHERE status <> 'processed'") == 0
        )
        # Each event's handler ran once (no unique key on handler_runs).
        runs = count(engine, "SELECT count(*) FROM handler_runs")
        distinct = count(
            engine, "SELECT count(*) FROM (SELECT DISTINCT provider, event_id FROM handler_runs) d"
        )
        stored = count(engine, "SELECT count(*) FROM onceonly_events")
        assert runs == distinct == stored == 2 * EVENTS + (EVENTS - reports["asaas"].stats.lost)

        # Again: nothing new, nothing changes.
        again: dict[str, ReconcileReport] = {
            p: asyncio.run(run_reconcile(app, p, since=since)) for p in ("stripe", "asaas")
        }
        for provider, rerun in again.items():
            assert (rerun.listed, rerun.new, rerun.already) == (EVENTS, 0, EVENTS), provider
        assert count(engine, "SELECT count(*) FROM onceonly_events") == stored
        app.worker(concurrency=4).run_until_idle(10)
        assert count(engine, "SELECT count(*) FROM handler_runs") == runs
        engine.dispose()
