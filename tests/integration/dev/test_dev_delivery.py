"""The fake gateway's delivery engine against real receivers on loopback.

A scripted receiver (a Starlette app under uvicorn) answers what each test
needs and records every request it got; the last tests point the engine at
onceonly's own receiver on both engines.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from onceonly import Onceonly
from onceonly.db import create_engine
from onceonly.dev.delivery import Faults, Sender
from onceonly.dev.gateway import prepare_events, provider_for
from onceonly.dev.schedules import DeliverySchedule
from onceonly.providers import Stripe
from support import live_server

#: (event id, how many times it arrived before, including this one) -> (status, delay)
Script = Callable[[str, int], tuple[int, float]]


@dataclass
class ScriptedReceiver:
    """Answers per `script`; records arrivals in order and the peak of requests in flight."""

    script: Script
    arrivals: list[str] = field(default_factory=list)
    in_flight: int = 0
    peak: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def endpoint(self, request: Request) -> Response:
        body = json.loads(await request.body())
        event_id = str(body.get("id") or request.headers.get("webhook-id"))
        with self.lock:
            self.arrivals.append(event_id)
            n = self.arrivals.count(event_id)
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        status, delay = self.script(event_id, n)
        try:
            if delay:
                await asyncio.sleep(delay)
        finally:
            with self.lock:
                self.in_flight -= 1
        return Response(status_code=status)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/webhooks/{provider}", self.endpoint, methods=["POST"])])

    def counts(self) -> Counter[str]:
        return Counter(self.arrivals)


def sender(provider: str, url: str, secret: str = "s3cret", **options: object) -> Sender:
    return Sender(
        provider_for(provider, secret, environ={}),
        f"{url}/webhooks/{provider}",
        **options,  # type: ignore[arg-type]
    )


async def test_asaas_resends_anything_but_200_and_mercadopago_takes_201() -> None:
    receiver = ScriptedReceiver(lambda _id, n: (201 if n < 3 else 200, 0.0))
    with live_server(receiver.app()) as url:
        asaas = sender("asaas", url, speedup=3000, seed=1)
        report = await asaas.deliver(prepare_events("asaas", 5, seed=1))
        assert report.stats.acknowledged == 5
        assert all(o.answers == ["201", "201", "200"] for o in report.outcomes.values())
        assert report.stats.retries == 10

        receiver.arrivals.clear()
        mp = sender("mercadopago", url, speedup=3000, seed=1)
        report = await mp.deliver(prepare_events("mercadopago", 5, seed=1))
        assert report.stats.acknowledged == 5
        assert report.stats.retries == 0
        assert len(receiver.arrivals) == 5


async def test_a_timeout_sends_the_event_again_though_the_receiver_did_the_work() -> None:
    # The first arrival of each event takes longer than the gateway waits.
    # The wait is long enough that a prompt answer never misses it on a busy
    # CI machine (0.2 s did: two prompt answers counted as timeouts).
    receiver = ScriptedReceiver(lambda _id, n: (200, 1.5 if n == 1 else 0.0))
    with live_server(receiver.app()) as url:
        stripe = sender("stripe", url, speedup=6000, timeout=0.6, seed=2)
        events = prepare_events("stripe", 4, seed=2)
        report = await stripe.deliver(events)
        await asyncio.sleep(1.5)  # let the slow first arrivals finish
    assert report.stats.acknowledged == 4
    assert report.stats.timeouts == 4
    assert all(o.answers == ["timeout", "200"] for o in report.outcomes.values())
    assert receiver.counts() == Counter({e.event_id: 2 for e in events})


async def test_concurrent_duplicates_arrive_together() -> None:
    receiver = ScriptedReceiver(lambda _id, n: (200, 0.1))
    with live_server(receiver.app()) as url:
        stripe = sender("stripe", url, faults=Faults(duplicates=1.0, copies=3), seed=3)
        events = prepare_events("stripe", 3, seed=3)
        report = await stripe.deliver(events)
    assert report.stats.requests == 9
    assert report.stats.concurrent_copies == 6
    assert report.stats.acknowledged == 3
    assert receiver.counts() == Counter({e.event_id: 3 for e in events})
    assert receiver.peak >= 3


async def test_lost_acknowledgements_and_injected_timeouts_cause_resends() -> None:
    receiver = ScriptedReceiver(lambda _id, n: (200, 0.05 if n == 1 else 0.0))
    with live_server(receiver.app()) as url:
        stripe = sender("stripe", url, speedup=6000, faults=Faults(lost_acks=0.5), seed=4)
        report = await stripe.deliver(prepare_events("stripe", 40, seed=4))
        assert report.stats.acknowledged == 40
        assert report.stats.lost_acks > 0
        assert len(receiver.arrivals) == 40 + report.stats.retries
        assert any("(lost)" in o.answers[0] for o in report.outcomes.values())

    slow = ScriptedReceiver(lambda _id, n: (200, 0.1))
    with live_server(slow.app()) as url:
        short = DeliverySchedule("stripe", (60.0, 60.0), timeout=5.0)
        cut = sender("stripe", url, policy=short, speedup=6000, faults=Faults(timeouts=1.0))
        report = await cut.deliver(prepare_events("stripe", 5, seed=5))
    # Every attempt was cut short: the schedule ran out and nothing was acknowledged.
    assert report.stats.given_up == 5
    assert report.stats.injected_timeouts == 15
    assert sorted(report.undelivered) == sorted(report.outcomes)


async def test_asaas_pauses_the_queue_after_15_failures_in_a_row() -> None:
    receiver = ScriptedReceiver(lambda _id, n: (500, 0.0))
    with live_server(receiver.app()) as url:
        asaas = sender("asaas", url, speedup=3000, concurrency=1, seed=6)
        report = await asaas.deliver(prepare_events("asaas", 10, seed=6))
    assert report.stats.paused
    assert report.stats.acknowledged == 0
    assert len(receiver.arrivals) == 15
    assert len(report.undelivered) == 10


async def test_410_disables_a_standard_webhooks_endpoint() -> None:
    receiver = ScriptedReceiver(lambda _id, n: (410, 0.0))
    secret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3"
    with live_server(receiver.app()) as url:
        sw = sender("standardwebhooks", url, secret, concurrency=1, seed=7)
        report = await sw.deliver(prepare_events("standardwebhooks", 5, seed=7))
    assert report.stats.disabled
    assert len(receiver.arrivals) == 1


async def test_spread_delivers_out_of_order() -> None:
    receiver = ScriptedReceiver(lambda _id, n: (200, 0.0))
    events = prepare_events("stripe", 40, seed=8)
    with live_server(receiver.app()) as url:
        stripe = sender("stripe", url, faults=Faults(spread=0.5), seed=8)
        report = await stripe.deliver(events)
    assert report.stats.acknowledged == 40
    assert sorted(receiver.arrivals) == sorted(e.event_id for e in events)
    assert receiver.arrivals != [e.event_id for e in events]


async def test_onceonly_stores_each_event_once_whatever_the_gateway_does(
    database_url: str,
) -> None:
    app = Onceonly(database_url, {"stripe": Stripe("whsec_it")}, environ={})
    events = prepare_events("stripe", 150, seed=9)
    faults = Faults(duplicates=0.3, timeouts=0.1, lost_acks=0.1, spread=0.3)
    with live_server(app.asgi()) as url:
        gateway = sender("stripe", url, "whsec_it", speedup=6000, faults=faults, seed=9)
        report = await gateway.deliver(events)
        await asyncio.sleep(0.2)  # requests the gateway stopped waiting for
    assert report.stats.acknowledged == 150
    assert report.stats.duplicates_answered > 0
    assert report.stats.retries > 0
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            stored = [r[0] for r in conn.execute(sa.text("SELECT event_id FROM onceonly_events"))]
    finally:
        engine.dispose()
    assert sorted(stored) == sorted(e.event_id for e in events)
