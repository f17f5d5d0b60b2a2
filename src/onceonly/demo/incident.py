"""The Friday-evening incident, played twice: against the naive endpoint, then onceonly.

One simulated Stripe gateway (:class:`~onceonly.dev.delivery.Sender`, with
Stripe's retry schedule sped up) delivers the same payments, with the same bad
day, to each side in turn:

- the mail provider has hiccups: the first receipt of some orders takes longer
  than the gateway waits, so the gateway times out and sends the event again;
- the gateway sometimes sends one event twice at the same moment;
- the proxy in front of the app answers 502 after the app committed, for some
  events, so the gateway sends them again;
- first attempts are spread over a second or two, so events arrive out of order.

Everything runs for real on loopback: uvicorn servers in threads (the mail
provider, the proxy, the app or onceonly's receiver), a onceonly worker, SQLite
files in a working directory. The result is counted afterwards from the
shop's tables and the mail outbox, never from what the code meant to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ..dev.delivery import DeliveryStats, Faults, Outgoing, Sender
from ..dev.payloads import PaymentFacts, build_event
from ..dev.schedules import policy_for
from ..dev.servers import serve_in_thread
from ..providers import Stripe
from ..worker import running
from .naive import naive_app
from .protected import protected_app
from .proxy import FlakyProxy
from .shop import Mailer, MailProvider, metadata, shop_state

__all__ = ["Incident", "IncidentResult", "SideResult", "run_incident"]

#: The webhook secret both sides share with the simulated gateway.
SECRET = "whsec_demo_secret"

#: Called with the side's name ("naive", "onceonly") and a phase label.
Progress = Callable[[str, str, DeliveryStats], None]


@dataclass(frozen=True, slots=True)
class Incident:
    """The bad day, as numbers. Fractions are of the events (or of the attempts,
    for `duplicates`); `speedup` divides Stripe's retry delays."""

    events: int = 300
    seed: int = 2024
    duplicates: float = 0.05
    slow_mail: float = 0.03
    bad_gateway: float = 0.04
    gateway_timeout: float = 0.4
    slow_seconds: float = 0.6
    speedup: float = 300.0
    spread: float = 1.5
    concurrency: int = 16

    def payments(self) -> list[Outgoing]:
        """The payments of the evening: one order per customer."""
        rng = random.Random(f"{self.seed}:payments")
        found = []
        for n in range(1, self.events + 1):
            facts = PaymentFacts(
                object_id=f"pi_{rng.getrandbits(64):016x}",
                amount=rng.choice([1990, 4990, 9700, 19700]),
                customer=f"cus_{n:04d}",
                email=f"customer{n:04d}@example.com",
            )
            found.append(build_event("stripe", facts=facts, rng=rng))
        return found

    def troubles(self, events: list[Outgoing]) -> tuple[set[str], set[str]]:
        """(orders whose first receipt is slow, events the proxy answers 502 for once)."""
        rng = random.Random(f"{self.seed}:troubles")
        orders = [_order_of(e) for e in events]
        slow = set(rng.sample(orders, round(self.slow_mail * len(orders))))
        ids = [e.event_id for e in events]
        bad = set(rng.sample(ids, round(self.bad_gateway * len(ids))))
        return slow, bad


def _order_of(event: Outgoing) -> str:
    return str(json.loads(event.body)["data"]["object"]["id"])


@dataclass
class SideResult:
    """What one side ended up with, counted from its real state."""

    name: str
    state: dict[str, int]
    deliveries: DeliveryStats
    answered_502: int
    undelivered: int
    seconds: float
    extra: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.state,
            **self.extra,
            "answered_502_after_commit": self.answered_502,
            "undelivered": self.undelivered,
            "seconds": round(self.seconds, 2),
            "deliveries": self.deliveries.to_dict(),
        }


@dataclass
class IncidentResult:
    """Both sides' results and the bad day they shared."""

    incident: Incident
    slow_receipts: int
    bad_gateway_events: int
    naive: SideResult
    onceonly: SideResult
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        i = self.incident
        return {
            "payments": i.events,
            "seed": i.seed,
            "seconds": round(self.seconds, 2),
            "bad_day": {
                "slow_first_receipts": self.slow_receipts,
                "proxy_502_after_commit": self.bad_gateway_events,
                "concurrent_duplicate_rate": i.duplicates,
                "gateway_timeout_seconds": i.gateway_timeout,
                "retry_speedup": i.speedup,
            },
            "naive": self.naive.to_dict(),
            "onceonly": self.onceonly.to_dict(),
        }


def run_incident(
    incident: Incident, workdir: Path, progress: Progress | None = None
) -> IncidentResult:
    """Play the incident against both sides, in `workdir`; return what each recorded."""
    started = time.monotonic()
    events = incident.payments()
    slow, bad = incident.troubles(events)
    naive = _naive_side(incident, events, slow, bad, workdir, progress)
    protected = _onceonly_side(incident, events, slow, bad, workdir, progress)
    return IncidentResult(
        incident, len(slow), len(bad), naive, protected, time.monotonic() - started
    )


def _sender(incident: Incident, url: str, name: str, progress: Progress | None) -> Sender:
    def report(stats: DeliveryStats) -> None:
        if progress is not None:
            progress(name, "delivering", stats)

    return Sender(
        Stripe(SECRET),
        f"{url}/webhooks/stripe",
        policy=policy_for("stripe"),
        speedup=incident.speedup,
        timeout=incident.gateway_timeout,
        faults=Faults(duplicates=incident.duplicates, spread=incident.spread),
        concurrency=incident.concurrency,
        seed=incident.seed,
        on_attempt=report,
    )


@contextlib.contextmanager
def _shop_services(
    incident: Incident, workdir: Path, name: str, slow: set[str]
) -> Iterator[tuple[MailProvider, Mailer]]:
    mail = MailProvider(
        workdir / f"outbox-{name}.jsonl", slow_orders=slow, slow_seconds=incident.slow_seconds
    )
    with serve_in_thread(mail.app) as mail_url:
        mailer = Mailer(mail_url)
        try:
            yield mail, mailer
        finally:
            mailer.close()


def _settle(read: Callable[[], object], *, quiet: float = 0.4, limit: float = 10.0) -> None:
    """Wait until `read()` stops changing for `quiet` seconds: requests the gateway
    gave up waiting for are still running, and they count."""
    deadline = time.monotonic() + limit
    last, since = read(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = read()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return


def _naive_side(
    incident: Incident,
    events: list[Outgoing],
    slow: set[str],
    bad: set[str],
    workdir: Path,
    progress: Progress | None,
) -> SideResult:
    started = time.monotonic()
    engine = sa.create_engine(f"sqlite:///{workdir / 'naive.db'}", connect_args={"timeout": 30})
    metadata.create_all(engine)
    try:
        with _shop_services(incident, workdir, "naive", slow) as (mail, mailer):
            app = naive_app(engine, mailer, SECRET)
            with serve_in_thread(app) as app_url:
                proxy = FlakyProxy(app_url, fail_after_commit=bad)
                with serve_in_thread(proxy.app) as proxy_url:
                    sender = _sender(incident, proxy_url, "naive", progress)
                    report = asyncio.run(sender.deliver(events))
                    if progress is not None:
                        progress("naive", "finishing", sender.stats)
                    _settle(lambda: shop_state(engine, mail))
            state = shop_state(engine, mail)
    finally:
        engine.dispose()
    return SideResult(
        "naive",
        state,
        report.stats,
        proxy.answered_502,
        len(report.undelivered),
        time.monotonic() - started,
    )


def _onceonly_side(
    incident: Incident,
    events: list[Outgoing],
    slow: set[str],
    bad: set[str],
    workdir: Path,
    progress: Progress | None,
) -> SideResult:
    started = time.monotonic()
    with _shop_services(incident, workdir, "onceonly", slow) as (mail, mailer):
        app = protected_app(f"sqlite:///{workdir / 'onceonly.db'}", mailer, SECRET)
        engine = app.engine
        try:
            metadata.create_all(engine)
            with (
                serve_in_thread(app.asgi()) as receiver_url,
                running(app.worker(concurrency=2, poll_interval=0.05)),
            ):
                proxy = FlakyProxy(receiver_url, fail_after_commit=bad)
                with serve_in_thread(proxy.app) as proxy_url:
                    sender = _sender(incident, proxy_url, "onceonly", progress)
                    report = asyncio.run(sender.deliver(events))
                if progress is not None:
                    progress("onceonly", "worker finishing", sender.stats)
                _wait_processed(engine, timeout=60)
                _settle(lambda: shop_state(engine, mail), quiet=0.2)
            state = shop_state(engine, mail)
            stored = _scalar(engine, "SELECT count(*) FROM onceonly_events")
        finally:
            engine.dispose()
    return SideResult(
        "onceonly",
        state,
        report.stats,
        proxy.answered_502,
        len(report.undelivered),
        time.monotonic() - started,
        extra={"events_stored": stored},
    )


def _scalar(engine: sa.Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(sql)).scalar_one())


def _wait_processed(engine: sa.Engine, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waiting = _scalar(
            engine, "SELECT count(*) FROM onceonly_events WHERE status NOT IN ('processed', 'dead')"
        )
        if waiting == 0:
            return
        time.sleep(0.05)
