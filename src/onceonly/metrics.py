"""Prometheus metrics: what arrives, what is refused, what the worker does, what waits.

Each :class:`~onceonly.Onceonly` owns one :class:`Metrics` with its own
:class:`~prometheus_client.CollectorRegistry` (never the global one: a test
suite, or an application hosting two deployments, creates many apps in one
process). ``onceonly serve`` exposes it at ``GET /metrics``; a stand-alone
``onceonly worker --metrics-port N`` serves it on its own port.

Counters (all ``_total``):

====================================  ==================  ==============================
name                                  labels              counts
====================================  ==================  ==============================
onceonly_deliveries_received_total    provider, tenant    every delivery answered, any
                                                          outcome (= stored + duplicates
                                                          + rejected)
onceonly_events_stored_total          provider, tenant    new events committed (200)
onceonly_duplicates_received_total    provider, tenant    duplicates answered 200
onceonly_deliveries_rejected_total    provider, tenant,   refused: ``signature``,
                                      reason              ``payload``,
                                                          ``unknown-provider``,
                                                          ``unknown-tenant``,
                                                          ``too-large``, ``unavailable``
onceonly_events_processed_total       provider, tenant    handlers that committed
onceonly_events_failed_total          provider, tenant    failed attempts to be retried
onceonly_events_dead_total            provider, tenant    events given up on (dead)
onceonly_worker_database_errors_total operation           worker database calls that
                                                          failed and were retried:
                                                          ``start``, ``claim``,
                                                          ``batch``, ``leases``,
                                                          ``outbox-claim``,
                                                          ``outbox-sweep``,
                                                          ``outbox-mark``,
                                                          ``outbox-lease``
====================================  ==================  ==============================

and the gauge ``onceonly_worker_database_reachable``: 1 while the worker's last
database call succeeded, 0 after a failure (set by the worker, not scraped).

``onceonly_seconds_since_last_delivery{provider}``: seconds since this
process last answered a delivery of that provider with 200 (new or
duplicate), or since it started when none came yet; computed at scrape
time. Events stored by ``onceonly reconcile`` do not count: they are what
the alert on this gauge is for (docs/reconcile.md). With several receivers,
alert on ``min by (provider)``.

plus the histogram ``onceonly_handler_duration_seconds{provider}`` and, read
from the database when scraped (at most once a second, whatever the number of
scrapers), ``onceonly_queue_depth{status}``,
``onceonly_queue_oldest_pending_age_seconds`` and ``onceonly_database_up``.

Deliveries to a route with no configured provider are counted under
``provider="(unknown)"``: anyone can POST to any path, and a label per path
would let them grow the metrics without bound. For the same reason the
``tenant`` label is ``""`` for the tenant-less route, the tenant's name only
for the tenants listed in ``Tenants(metrics_tenants=...)``, and ``"(other)"``
for every other tenant (see :mod:`onceonly.tenants`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .asgi import Receive, Scope, Send, send_response
from .store.history import QUEUE_STATUSES, EventHistory, QueueStats

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = [
    "CONTENT_TYPE",
    "UNKNOWN_PROVIDER",
    "Metrics",
    "MetricsEndpoint",
    "QueueStats",
    "read_queue",
]

log = logging.getLogger("onceonly.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
UNKNOWN_PROVIDER = "(unknown)"
REJECTION_REASONS = (
    "signature",
    "payload",
    "unknown-provider",
    "unknown-tenant",
    "too-large",
    "unavailable",
)

# From 1 ms to 1 min: handlers range from one INSERT to a slow provider API.
_HANDLER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Processing transactions: on SQLite, how long the write lock is held.
_TRANSACTION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)


def read_queue(engine: sa.Engine, kind: str, *, cap: int = 100_000) -> QueueStats:
    """Count unfinished events per status (each count stops at `cap`) and the age
    of the oldest pending one, in one short read transaction."""
    return EventHistory(kind).queue(engine, cap=cap)


class _QueueCollector(Collector):
    """Queue gauges read at scrape time, cached for `ttl` seconds."""

    def __init__(self, metrics: Metrics, ttl: float) -> None:
        self._metrics = metrics
        self._ttl = ttl
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._stats: QueueStats | None = None

    def _current(self) -> QueueStats | None:
        with self._lock:  # concurrent scrapes share one read
            if time.monotonic() - self._at >= self._ttl:
                try:
                    self._stats = self._metrics.read_queue()
                except Exception as exc:  # a scrape must not fail with the database
                    log.warning("cannot read the queue for /metrics: %s", exc)
                    self._stats = None
                self._at = time.monotonic()
            return self._stats

    def describe(self) -> Iterable[Metric]:
        return self._families(None, describe=True)

    def collect(self) -> Iterable[Metric]:
        return self._families(self._current(), describe=False)

    def _families(self, stats: QueueStats | None, *, describe: bool) -> list[Metric]:
        up = GaugeMetricFamily(
            "onceonly_database_up", "1 when the last queue read from the database succeeded"
        )
        depth = GaugeMetricFamily(
            "onceonly_queue_depth",
            "Events waiting or in hand, by status (each count capped)",
            labels=["status"],
        )
        age = GaugeMetricFamily(
            "onceonly_queue_oldest_pending_age_seconds",
            "Seconds since the oldest pending event was received (0: none pending)",
        )
        if describe:
            return [up, depth, age]
        up.add_metric([], 0.0 if stats is None else 1.0)
        if stats is None:
            return [up]
        for status in QUEUE_STATUSES:
            depth.add_metric([status], float(stats.depth.get(status, 0)))
        age.add_metric([], stats.oldest_pending_age)
        return [up, depth, age]


class _DeliveryAgeCollector(Collector):
    """Seconds since each provider's last delivery answered 200, at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        for provider, seconds in self._metrics.seconds_since_last_delivery().items():
            family.add_metric([provider], seconds)
        return [family]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "onceonly_seconds_since_last_delivery",
            "Seconds since this process last answered a delivery of the provider with 200 "
            "(or since it started)",
            labels=["provider"],
        )


@dataclass(frozen=True, slots=True)
class _Delivery:
    """One provider's receive-path counters, bound once (the hot path only
    increments)."""

    received: Counter
    stored: Counter
    duplicates: Counter
    rejected: dict[str, Counter]


@dataclass(frozen=True, slots=True)
class _Work:
    processed: Counter
    failed: Counter
    dead: Counter
    duration: Histogram


class Metrics:
    """The metrics of one :class:`~onceonly.Onceonly`, in their own registry."""

    def __init__(
        self,
        providers: Iterable[str],
        *,
        engine: Callable[[], sa.Engine],
        engine_kind: str,
        queue_ttl: float = 1.0,
        queue_count_cap: int = 100_000,
        tenant_label: Callable[[str], str] | None = None,
    ) -> None:
        # The two things metrics need from a deployment, not the deployment:
        # its provider routes (shown at 0 from the first scrape) and where
        # the queue gauges are read. `engine` is called on the first scrape,
        # so building Metrics opens nothing.
        self._engine = engine
        # Tenant -> label value, bounded (see the module's docstring): without
        # tenants configured, every tenant-less event is "" and nothing else.
        self._tenant_label = tenant_label or _no_tenant_labels
        self._history = EventHistory(engine_kind)
        self.queue_count_cap = queue_count_cap
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._received = Counter(
            "onceonly_deliveries_received",
            "Deliveries answered, whatever the outcome",
            ["provider", "tenant"],
            registry=r,
        )
        self._stored = Counter(
            "onceonly_events_stored", "New events committed", ["provider", "tenant"], registry=r
        )
        self._duplicates = Counter(
            "onceonly_duplicates_received",
            "Deliveries of an event already stored (answered 200)",
            ["provider", "tenant"],
            registry=r,
        )
        self._rejected = Counter(
            "onceonly_deliveries_rejected",
            "Deliveries refused, by reason",
            ["provider", "tenant", "reason"],
            registry=r,
        )
        self._processed = Counter(
            "onceonly_events_processed",
            "Events whose handler committed",
            ["provider", "tenant"],
            registry=r,
        )
        self._failed = Counter(
            "onceonly_events_failed",
            "Failed attempts that will be retried",
            ["provider", "tenant"],
            registry=r,
        )
        self._dead = Counter(
            "onceonly_events_dead",
            "Events given up on after their last attempt",
            ["provider", "tenant"],
            registry=r,
        )
        self._database_errors = Counter(
            "onceonly_worker_database_errors",
            "Worker database calls that failed (each is logged and retried)",
            ["operation"],
            registry=r,
        )
        self._database_reachable = Gauge(
            "onceonly_worker_database_reachable",
            "1 while the worker's last database call succeeded, 0 after a failure",
            registry=r,
        )
        self._database_reachable.set(1)
        self._duration = Histogram(
            "onceonly_handler_duration_seconds",
            "Time spent in handlers, successful or not",
            ["provider"],
            buckets=_HANDLER_BUCKETS,
            registry=r,
        )
        self._transaction = Histogram(
            "onceonly_worker_transaction_seconds",
            "How long each processing transaction stayed open (on SQLite: held "
            "the database's write lock, which the receiver waits for)",
            buckets=_TRANSACTION_BUCKETS,
            registry=r,
        )
        r.register(_QueueCollector(self, queue_ttl))
        self._started = time.time()
        # Provider -> wall-clock time of its last delivery answered 200.
        self._last_delivery: dict[str, float] = {}
        self._deliveries: dict[tuple[str, str], _Delivery] = {}
        self._work: dict[tuple[str, str], _Work] = {}
        self._bind_lock = threading.Lock()
        # Configured providers appear at 0 from the first scrape, so rate()
        # and absent() behave from the start.
        for name in (*providers, UNKNOWN_PROVIDER):
            self._delivery(name, "")
        r.register(_DeliveryAgeCollector(self))

    # Receive path (the event loop).

    def _delivery(self, provider: str, label: str) -> _Delivery:
        bound = self._deliveries.get((provider, label))
        if bound is None:
            bound = _Delivery(
                received=self._received.labels(provider, label),
                stored=self._stored.labels(provider, label),
                duplicates=self._duplicates.labels(provider, label),
                rejected={r: self._rejected.labels(provider, label, r) for r in REJECTION_REASONS},
            )
            self._deliveries[(provider, label)] = bound
        return bound

    def accepted(self, provider: str, *, duplicate: bool, tenant: str = "") -> None:
        """A delivery answered 200: new event or duplicate."""
        label = self._tenant_label(tenant) if tenant else ""
        bound = self._deliveries.get((provider, label)) or self._delivery(provider, label)
        bound.received.inc()
        (bound.duplicates if duplicate else bound.stored).inc()
        self._last_delivery[provider] = time.time()

    def seconds_since_last_delivery(self, now: float | None = None) -> dict[str, float]:
        """Provider -> seconds since its last delivery answered 200 here (or
        since this process started), for every provider seen or configured."""
        moment = time.time() if now is None else now
        last = dict(self._last_delivery)  # a copy: the event loop may add one meanwhile
        return {
            provider: max(0.0, moment - last.get(provider, self._started))
            for provider in dict.fromkeys(p for p, _ in list(self._deliveries))
            if provider != UNKNOWN_PROVIDER
        }

    def rejected(self, provider: str, reason: str, *, tenant: str = "") -> None:
        """A delivery refused; `reason` is the problem type the sender got."""
        if reason == "unknown-provider":
            provider = UNKNOWN_PROVIDER
        label = self._tenant_label(tenant) if tenant else ""
        bound = self._deliveries.get((provider, label)) or self._delivery(provider, label)
        bound.received.inc()
        counter = bound.rejected.get(reason)
        if counter is None:  # a reason a custom provider made up
            counter = self._rejected.labels(provider, label, reason)
        counter.inc()

    # Worker (its threads).

    def _worker(self, provider: str, tenant: str = "") -> _Work:
        label = self._tenant_label(tenant) if tenant else ""
        bound = self._work.get((provider, label))
        if bound is None:
            with self._bind_lock:
                bound = self._work.get((provider, label))
                if bound is None:
                    bound = _Work(
                        processed=self._processed.labels(provider, label),
                        failed=self._failed.labels(provider, label),
                        dead=self._dead.labels(provider, label),
                        # By provider only: a tenant label times every bucket
                        # would multiply the series for little insight.
                        duration=self._duration.labels(provider),
                    )
                    self._work[(provider, label)] = bound
        return bound

    def handler_ran(self, provider: str, seconds: float) -> None:
        self._worker(provider).duration.observe(seconds)

    def batch_committed(
        self,
        processed: Sequence[str | tuple[str, str]],
        failed: Sequence[str | tuple[str, str]],
        dead: Sequence[str | tuple[str, str]],
    ) -> None:
        """Outcomes of one committed processing transaction, by provider, or
        by (provider, tenant)."""
        # One increment per label set, not per event: a batch is mostly one provider.
        for item, n in collections.Counter(processed).items():
            self._worker(*_pair(item)).processed.inc(n)
        for item, n in collections.Counter(failed).items():
            self._worker(*_pair(item)).failed.inc(n)
        for item, n in collections.Counter(dead).items():
            self._worker(*_pair(item)).dead.inc(n)

    def transaction_ended(self, seconds: float) -> None:
        """A processing transaction committed or rolled back after `seconds`."""
        self._transaction.observe(seconds)

    def worker_database_error(self, operation: str) -> None:
        """A worker database call failed; the worker backs off and retries it."""
        self._database_errors.labels(operation).inc()
        self._database_reachable.set(0)

    def worker_database_ok(self) -> None:
        self._database_reachable.set(1)

    # Exposition.

    def read_queue(self) -> QueueStats:
        return self._history.queue(self._engine(), cap=self.queue_count_cap)

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes (blocking: it may read the database)."""
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` on its own port from a daemon thread (stand-alone workers)."""
        from prometheus_client import start_http_server

        start_http_server(port, addr=host, registry=self.registry)

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        """Every sample as (name, labels, value), for tests and scripts."""
        for family in self.registry.collect():
            for sample in family.samples:
                yield sample.name, dict(sample.labels), float(sample.value)


def _no_tenant_labels(tenant: str) -> str:
    return "(other)"


def _pair(item: str | tuple[str, str]) -> tuple[str, str]:
    return (item, "") if isinstance(item, str) else item


class MetricsEndpoint:
    """An ASGI app answering any request with the metrics, for an application
    that mounts the receiver itself::

        Starlette(routes=[
            Mount("/webhooks", app=app.receiver()),
            Route("/metrics", endpoint=MetricsEndpoint(app.metrics)),
        ])
    """

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        # In a thread: the queue gauges read the database.
        text = await asyncio.to_thread(self.metrics.exposition)
        await send_response(send, 200, text, [(b"content-type", CONTENT_TYPE.encode())])
