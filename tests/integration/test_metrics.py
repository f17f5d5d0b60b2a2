"""GET /metrics over real HTTP: the counts match what the test sent and what the
worker did, on a real SQLite file and a real PostgreSQL."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from onceonly import Event, Onceonly
from onceonly.context import Context
from onceonly.providers import Stripe
from onceonly.store.memory import MemoryStore
from onceonly.worker import running
from support import STRIPE_SECRET, live_server, signed, stripe_delivery

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    response = httpx.get(f"{url}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def make_app(database_url: str) -> Onceonly:
    app = Onceonly(
        database_url=database_url,
        providers={"stripe": Stripe(STRIPE_SECRET)},
        max_body_bytes=4096,
        max_attempts=1,
        environ={},
    )

    @app.handler("stripe", "payment_intent.succeeded")
    def paid(event: Event, ctx: Context) -> None:
        pass

    @app.handler("stripe", "charge.failed")
    def broken(event: Event, ctx: Context) -> None:
        raise RuntimeError("the handler has a bug")

    return app


def test_metrics_count_what_was_sent_and_what_the_worker_did(database_url: str) -> None:
    app = make_app(database_url)
    with live_server(app.asgi()) as url, running(app.worker(poll_interval=0.05)):
        with httpx.Client(base_url=url, timeout=10) as client:

            def post(body: bytes, headers: dict[str, str], provider: str = "stripe") -> int:
                return client.post(
                    f"/webhooks/{provider}", content=body, headers=headers
                ).status_code

            for event_id in ("evt_a", "evt_b"):
                assert post(*stripe_delivery(event_id)) == 200
            assert post(*stripe_delivery("evt_c", event_type="charge.failed")) == 200
            # A retry storm in miniature: the same event twice more.
            assert post(*stripe_delivery("evt_a")) == 200
            assert post(*stripe_delivery("evt_a")) == 200
            assert post(*stripe_delivery("evt_x", secret="whsec_wrong")) == 401
            assert post(*signed(b'{"object": "event", "type": "no.id"}')) == 400
            body, headers = stripe_delivery("evt_big", extra={"pad": "x" * 5000})
            assert post(body, headers) == 413
            assert post(*stripe_delivery("evt_y"), provider="nope") == 404

        deadline = time.monotonic() + 30
        while True:
            samples = scrape(url)
            done = value(samples, "onceonly_events_processed_total", provider="stripe") == 2
            # The counters move right after the commit the queue gauge reads.
            dead = value(samples, "onceonly_queue_depth", status="dead") == 1 and (
                value(samples, "onceonly_events_dead_total", provider="stripe") == 1
            )
            if (done and dead) or time.monotonic() > deadline:
                break
            time.sleep(0.1)

    # The tenant-less route counts under tenant="" (see docs/tenants.md).
    stripe = {"provider": "stripe", "tenant": ""}
    assert value(samples, "onceonly_deliveries_received_total", **stripe) == 8
    assert value(samples, "onceonly_events_stored_total", **stripe) == 3
    assert value(samples, "onceonly_duplicates_received_total", **stripe) == 2
    rejected = "onceonly_deliveries_rejected_total"
    assert value(samples, rejected, reason="signature", **stripe) == 1
    assert value(samples, rejected, reason="too-large", **stripe) == 1
    assert value(samples, rejected, reason="payload", **stripe) == 1
    unknown = {"provider": "(unknown)", "tenant": ""}
    assert value(samples, rejected, reason="unknown-provider", **unknown) == 1
    assert value(samples, "onceonly_deliveries_received_total", **unknown) == 1

    assert value(samples, "onceonly_events_processed_total", **stripe) == 2
    assert value(samples, "onceonly_events_dead_total", **stripe) == 1
    assert value(samples, "onceonly_events_failed_total", **stripe) == 0
    assert value(samples, "onceonly_handler_duration_seconds_count", provider="stripe") == 3

    assert value(samples, "onceonly_database_up") == 1
    assert value(samples, "onceonly_queue_depth", status="dead") == 1
    assert value(samples, "onceonly_queue_depth", status="pending") == 0
    assert value(samples, "onceonly_queue_oldest_pending_age_seconds") == 0


def test_queue_gauges_show_what_waits(database_url: str) -> None:
    """No worker: deliveries pile up as pending, and the oldest one ages."""
    app = make_app(database_url)
    with live_server(app.asgi()) as url:
        for event_id in ("evt_1", "evt_2", "evt_3"):
            body, headers = stripe_delivery(event_id)
            assert (
                httpx.post(f"{url}/webhooks/stripe", content=body, headers=headers).status_code
                == 200
            )
        time.sleep(0.3)
        samples = scrape(url)
    assert value(samples, "onceonly_queue_depth", status="pending") == 3
    assert value(samples, "onceonly_queue_oldest_pending_age_seconds") > 0


def test_metrics_can_be_turned_off(tmp_path: Path) -> None:
    app = Onceonly(database_url=f"sqlite:///{tmp_path / 'o.db'}", metrics=False, environ={})
    with live_server(app.asgi()) as url:
        assert httpx.get(f"{url}/metrics").status_code == 404
        assert httpx.get(f"{url}/healthz").status_code == 200


def test_an_unavailable_database_is_counted_as_such(tmp_path: Path) -> None:
    app = Onceonly(
        database_url=f"sqlite:///{tmp_path / 'o.db'}",
        providers={"stripe": Stripe(STRIPE_SECRET)},
        environ={},
    )
    store = MemoryStore()
    app._store = store  # the double's switch stands in for a database outage
    with live_server(app.asgi()) as url:
        store.unavailable = True
        body, headers = stripe_delivery("evt_down")
        assert (
            httpx.post(f"{url}/webhooks/stripe", content=body, headers=headers).status_code == 503
        )
        samples = scrape(url)
    rejected = "onceonly_deliveries_rejected_total"
    assert value(samples, rejected, provider="stripe", tenant="", reason="unavailable") == 1
    # The queue gauges read the (empty, unmigrated) SQLite file: no table yet.
    assert value(samples, "onceonly_database_up") == 0
