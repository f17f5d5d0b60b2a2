"""Reconcile inside the worker and the last-delivery gauge, on a real SQLite
file and a real PostgreSQL, with the fake Stripe API and the receiver served
over HTTP on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result
from prometheus_client.parser import text_string_to_metric_families

from onceonly import Event, Onceonly
from onceonly.cli import main
from onceonly.clients import StripeClient
from onceonly.context import Context
from onceonly.dev.api import DEFAULT_TOKEN, FakeApi
from onceonly.dev.delivery import Outgoing, Sender
from onceonly.dev.gateway import prepare_events, provider_for
from onceonly.dev.servers import serve_in_thread
from onceonly.reconcile import ScheduledReconcile, reconcile_app
from onceonly.store import create_store
from onceonly.worker import running
from support import STRIPE_SECRET, live_server

GAUGE = "onceonly_seconds_since_last_delivery"


@pytest.fixture
def api() -> Iterator[tuple[FakeApi, str]]:
    fake = FakeApi()
    with serve_in_thread(fake, lifespan="off") as url:
        yield fake, url


def make_app(database_url: str, api_url: str, seen: list[str]) -> Onceonly:
    from onceonly.providers import Stripe

    app = Onceonly(
        database_url=database_url,
        providers={"stripe": Stripe(STRIPE_SECRET)},
        api_clients={"stripe": StripeClient(DEFAULT_TOKEN, base_url=api_url)},
        environ={},
    )

    @app.handler("stripe")
    def record(event: Event, ctx: Context) -> None:
        seen.append(event.event_id)

    return app


def gauge(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == GAUGE and sample.labels == {"provider": "stripe"}:
                return float(sample.value)
    raise AssertionError(f"no {GAUGE} for stripe in /metrics")


def deliver(url: str, events: list[Outgoing]) -> None:
    sender = Sender(provider_for("stripe", STRIPE_SECRET), f"{url}/webhooks/stripe")
    report = asyncio.run(sender.deliver(events))
    assert not report.undelivered


def test_the_gauge_counts_deliveries_and_not_reconciled_events(
    database_url: str, api: tuple[FakeApi, str]
) -> None:
    fake, api_url = api
    events = prepare_events("stripe", 4, seed=3, api=fake)
    app = make_app(database_url, api_url, [])
    with live_server(app.asgi()) as url:
        # Nothing delivered yet: the time since this receiver started.
        time.sleep(0.5)
        assert gauge(url) >= 0.5
        deliver(url, events[:2])
        assert gauge(url) < 0.5
        time.sleep(0.5)
        report = asyncio.run(reconcile_app(app, "stripe"))
        assert (report.new, report.already) == (2, 2)
        # Two events were stored, but no delivery came: the alert stays armed.
        assert gauge(url) >= 0.5


def test_workers_reconcile_each_period_once(database_url: str, api: tuple[FakeApi, str]) -> None:
    fake, api_url = api
    events = prepare_events("stripe", 6, seed=4, api=fake)
    seen: list[str] = []
    app = make_app(database_url, api_url, seen)
    # Two workers' schedules on one database, at the same moment.
    first = ScheduledReconcile(app, ["stripe"], 600)
    second = ScheduledReconcile(make_app(database_url, api_url, []), ["stripe"], 600)
    now = time.time()
    assert [r.new for r in first.run_once(now)] == [6]
    assert second.run_once(now) == []  # this period is taken
    assert second.run_once(now + 600)[0].new == 0  # the next one: nothing new
    stripe_listings = fake.hits("stripe", "events")
    assert stripe_listings == 2

    # A worker with the schedule processes what reconcile found.
    seen.clear()
    worker = app.worker(reconcile=["stripe"], reconcile_every=3600, poll_interval=0.05)
    assert worker.reconcile is not None
    with running(worker):
        deadline = time.monotonic() + 30
        while (len(seen) < 6 or not worker.reconcile.reports) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert sorted(seen) == sorted(e.event_id for e in events)
    # Its own period's run listed them again and found nothing new.
    assert [(r.listed, r.new) for r in worker.reconcile.reports] == [(6, 0)]


def test_the_command_dry_run_then_real_and_its_failures(
    api: tuple[FakeApi, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, api_url = api
    prepare_events("stripe", 3, seed=5, api=fake)
    database = f"sqlite:///{tmp_path / 'cli.db'}"
    env = {"ONCEONLY_DATABASE_URL": database, "ONCEONLY_API_RETRIES": "0"}
    for name in [n for n in os.environ if n.startswith("ONCEONLY_")]:
        monkeypatch.delenv(name)
    runner = CliRunner()

    def reconcile(*args: str, **extra: str) -> Result:
        return runner.invoke(main, ["reconcile", *args], env={**env, **extra})

    no_client = reconcile("stripe")
    assert no_client.exit_code == 2
    assert "ONCEONLY_STRIPE_API_TOKEN" in no_client.output

    configured = {"ONCEONLY_STRIPE_API_TOKEN": DEFAULT_TOKEN, "ONCEONLY_STRIPE_API_BASE": api_url}
    dry = reconcile("stripe", "--dry-run", "--format", "json", **configured)
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output)["new"] == 3
    real = reconcile("stripe", "--since", "1h", "--format", "json", **configured)
    assert (json.loads(real.output)["new"], json.loads(real.output)["already"]) == (3, 0)
    again = reconcile("stripe", **configured)
    assert again.exit_code == 0
    assert "already there" in again.output

    fake.fail(1, status=503)
    down = reconcile("stripe", **configured)
    assert down.exit_code == 1
    assert "stripe API failed" in down.output
    assert "503" in down.output

    pagbank = reconcile(
        "pagbank", ONCEONLY_PAGBANK_API_TOKEN=DEFAULT_TOKEN, ONCEONLY_PAGBANK_API_BASE=api_url
    )
    assert pagbank.exit_code == 2
    assert "--id" in pagbank.output
    assert reconcile("stripe", "--since", "tomorrow", **configured).exit_code == 2


def test_the_gateway_loses_events_for_good_on_request(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'gw.db'}"
    app = make_app(database, "http://127.0.0.1:1", [])
    with live_server(app.asgi()) as url:
        args = ["dev", "gateway", "stripe", "--target", url, "--secret", STRIPE_SECRET]
        args += ["--events", "20", "--lose", "0.5", "--seed", "9", "--port", "0", "--exit"]
        result = CliRunner().invoke(main, [*args, "--format", "json"])
        assert result.exit_code == 0, result.output  # losing them was asked for
        report = json.loads(result.output)

    async def events() -> list[Event]:
        async with create_store(database) as store:
            return await store.list_events(limit=100)

    stored = asyncio.run(events())
    assert 0 < report["lost"] < 20
    assert len(report["lost_events"]) == report["lost"]
    assert report["acknowledged"] == 20 - report["lost"]
    # Not one request was sent for a lost event.
    assert not {e.event_id for e in stored} & set(report["lost_events"])
    assert len(stored) == 20 - report["lost"]
