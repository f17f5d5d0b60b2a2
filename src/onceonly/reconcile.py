"""Reconcile: catch up on events whose deliveries never arrived.

A sender that gives up (Stripe after 3 days, Asaas's paused queue, a
delivery lost for good) leaves an event the inbox never saw. :func:`reconcile`
reads what the provider's API lists (:meth:`~onceonly.clients.ApiClient.listing`)
and puts each item through the inbox (:meth:`~onceonly.inbox.Inbox.admit`):
the same group commit and ``UNIQUE (provider, event_id)`` as a delivery, so
an item already delivered (or reconciled before) is a duplicate, a rerun
changes nothing, and the normal worker processes what is new.

:class:`ScheduledReconcile` runs it every few minutes inside a worker; one
worker at a time per period, decided by the database (a guard key per
provider and period in ``onceonly_jobs``, see :mod:`onceonly.guard`).

How a listed item becomes an event (its id, type and shape) is each
provider's client's business; docs/reconcile.md says what each one does.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from ._exceptions import ConfigurationError, JobInProgress
from .events import NewEvent
from .inbox import Inbox
from .providers.client import ApiClient, Listed
from .retention import duration
from .store import Store, create_store

if TYPE_CHECKING:
    from .guard import Guard
    from .handlers import HandlerRegistry
    from .providers import Provider
    from .settings import Settings

__all__ = [
    "ReconcileReport",
    "ReconcilingApp",
    "ScheduledReconcile",
    "parse_since",
    "reconcile",
]

log = logging.getLogger("onceonly.reconcile")

#: Listed items admitted at once: one page, sharing group commits.
_CHUNK = 100
_RELATIVE = re.compile(r"\s*\d+(?:\.\d+)?\s*[smhdw]\s*", re.IGNORECASE)


def parse_since(value: str | None, *, default: float, now: datetime | None = None) -> datetime:
    """When a reconcile window starts: an ISO date (``2026-12-01``, midnight
    UTC), an ISO time (``2026-12-01T10:00``, UTC unless it has an offset), a
    duration back from now (``2h``, ``3d``, ``90m``, ``1w``), or `default`
    seconds back when `value` is ``None``. Never in the future."""
    moment = now or datetime.now(UTC)
    if value is None:
        return moment - timedelta(seconds=default)
    text = value.strip()
    if _RELATIVE.fullmatch(text):
        return moment - duration(text, "--since")
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigurationError(
            f"--since: {value!r} is neither a duration (2h, 3d) nor an ISO date or time "
            "(2026-12-01, 2026-12-01T10:00:00Z)"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    if parsed > moment:
        raise ConfigurationError(f"--since: {value!r} is in the future")
    return parsed


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    """What one reconcile of one provider route found."""

    provider: str
    since: datetime
    dry_run: bool
    #: Items the API listed.
    listed: int = 0
    #: Of those, events the inbox did not have (stored now, or would be).
    new: int = 0
    #: Of those, events already there (delivered, or reconciled before).
    already: int = 0
    #: The new events' ids (at most the first 100).
    new_ids: tuple[str, ...] = ()
    #: The provider's view of its webhook queue, where it has one (Asaas).
    queue: Mapping[str, Any] | None = None
    #: What an operator should know (a paused provider queue).
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (``onceonly reconcile --format json``)."""
        return {
            "provider": self.provider,
            "since": self.since.isoformat(),
            "dry_run": self.dry_run,
            "listed": self.listed,
            "new": self.new,
            "already": self.already,
            "new_ids": list(self.new_ids),
            "queue": dict(self.queue) if self.queue is not None else None,
            "warnings": list(self.warnings),
        }


class ReconcilingApp(Protocol):
    """What reconcile needs of a deployment (:class:`~onceonly.Onceonly` is one)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def providers(self) -> Mapping[str, Provider]: ...

    @property
    def api_clients(self) -> Mapping[str, ApiClient]: ...

    @property
    def handlers(self) -> HandlerRegistry: ...

    def guard(self, *, lease_seconds: float = ..., ttl_seconds: float | None = ...) -> Guard: ...


def _event(route: str, item: Listed) -> NewEvent:
    return NewEvent(
        provider=route,
        event_id=item.event_id,
        event_type=item.event_type,
        body=item.body,
        headers=dict(item.headers),
    )


async def reconcile(
    inbox: Inbox,
    client: ApiClient,
    route: str,
    *,
    since: datetime,
    ids: Sequence[str] = (),
    failed_only: bool = False,
    dry_run: bool = False,
) -> ReconcileReport:
    """List what `client`'s API has since `since` (or `ids`) and admit each
    item into `inbox` under provider route `route`. With `dry_run` nothing
    is written: each item is looked up instead (a read that decides nothing).

    Raises :class:`~onceonly.ApiError` when the API fails (after the client's
    retries) and :class:`~onceonly.StoreError` when the database does; what
    was admitted before the failure stays admitted (a rerun dedups it).
    """
    listed = new = already = 0
    new_ids: list[str] = []
    warnings: list[str] = []
    queue = await client.queue_state()
    if queue is not None and queue.get("interrupted"):
        warnings.append(
            f"{route}: the provider's webhook queue is interrupted (paused): it sends "
            "nothing until you re-enable it; reconcile catches up meanwhile"
        )
    pending: list[NewEvent] = []

    async def flush() -> None:
        nonlocal new, already
        if dry_run:
            found = [await inbox.store.find_event(e.provider, e.event_id) for e in pending]
            fresh = [e for e, f in zip(pending, found, strict=True) if f is None]
        else:
            receipts = await asyncio.gather(*(inbox.admit(e) for e in pending))
            fresh = [e for e, r in zip(pending, receipts, strict=True) if not r.duplicate]
        new += len(fresh)
        already += len(pending) - len(fresh)
        new_ids.extend(e.event_id for e in fresh[: max(0, 100 - len(new_ids))])
        pending.clear()

    async for item in client.listing(since, ids=ids, failed_only=failed_only):
        listed += 1
        pending.append(_event(route, item))
        if len(pending) >= _CHUNK:
            await flush()
    if pending:
        await flush()
    return ReconcileReport(
        provider=route,
        since=since,
        dry_run=dry_run,
        listed=listed,
        new=new,
        already=already,
        new_ids=tuple(new_ids),
        queue=queue,
        warnings=tuple(warnings),
    )


def client_for(app: ReconcilingApp, route: str) -> ApiClient:
    """The API client configured for `route`, or a clear configuration error."""
    client = app.api_clients.get(route)
    if client is None:
        from .providers.base import env_name

        raise ConfigurationError(
            f"no API client for {route!r}: set {env_name(route, 'API_TOKEN')} "
            f"(and {env_name(route, 'API_BASE')} for a sandbox or the fake gateway)"
        )
    return client


async def reconcile_app(
    app: ReconcilingApp,
    route: str,
    *,
    since: datetime | None = None,
    ids: Sequence[str] = (),
    failed_only: bool = False,
    dry_run: bool = False,
    store: Store | None = None,
) -> ReconcileReport:
    """:func:`reconcile` for one route of `app`, on a store of its own (closed
    after) unless `store` is given: usable from any event loop or thread."""
    client = client_for(app, route)
    start = since or parse_since(None, default=client.default_window)
    own = store is None
    used = store or create_store(app.settings.database_url)
    try:
        return await reconcile(
            # The app's handlers name the ordering key of what is admitted.
            Inbox(used, app.providers, app.handlers),
            client,
            route,
            since=start,
            ids=ids,
            failed_only=failed_only,
            dry_run=dry_run,
        )
    finally:
        await client.aclose()
        if own:
            await used.close()


class ScheduledReconcile:
    """Reconciles `routes` every `every` seconds from inside a worker.

    Each period is a guard key ``onceonly:reconcile:<route>:<period>``: the
    first worker to claim it (one ``INSERT ... ON CONFLICT DO NOTHING``) runs
    that period's reconcile; the others find it done or in hand and skip it.
    A failed run (API or database down) is logged and leaves the key failed
    (a worker that starts later in the period runs it again). Each run looks
    back `window` seconds (default: twice the period, at least an hour), so
    a failed or missed period is covered by the next.
    """

    def __init__(
        self,
        app: ReconcilingApp,
        routes: Sequence[str],
        every: float,
        *,
        window: float | None = None,
        guard: Guard | None = None,
    ) -> None:
        if every <= 0:
            raise ConfigurationError("reconcile_every must be positive (seconds)")
        if not routes:
            raise ConfigurationError("reconcile needs at least one provider route")
        for route in routes:
            client_for(app, route)
        self.app = app
        self.routes = tuple(routes)
        self.every = every
        self.window = window if window is not None else max(2 * every, 3600.0)
        self._guard = guard
        #: Reports of the runs this worker did, newest last (for tests and logs).
        self.reports: list[ReconcileReport] = []

    @property
    def guard(self) -> Guard:
        if self._guard is None:
            self._guard = self.app.guard(
                lease_seconds=max(60.0, self.every), ttl_seconds=max(3 * self.every, 3600.0)
            )
        return self._guard

    def run_once(self, now: float | None = None) -> list[ReconcileReport]:
        """Reconcile every route whose current period no worker has claimed."""
        moment = time.time() if now is None else now
        period = int(moment // self.every)
        done: list[ReconcileReport] = []
        for route in self.routes:
            key = f"onceonly:reconcile:{route}:{period}"
            try:
                with self.guard.once(key) as run:
                    if not run:
                        continue
                    since = datetime.fromtimestamp(moment - self.window, UTC)
                    report = asyncio.run(reconcile_app(self.app, route, since=since))
                    run.result = report.to_dict()
            except JobInProgress:
                continue  # another worker reconciles this period
            except Exception as exc:  # a failed run must not stop the worker
                log.warning("reconcile %s failed (another try next period): %s", route, exc)
                continue
            log.info(
                "reconcile %s: %d listed, %d new, %d already there",
                route,
                report.listed,
                report.new,
                report.already,
            )
            for warning in report.warnings:
                log.warning("%s", warning)
            done.append(report)
        self.reports.extend(done)
        return done

    def run(self, stop: threading.Event) -> None:
        """Run at start, then at each period boundary, until `stop` is set."""
        while not stop.is_set():
            self.run_once()
            wait = self.every - (time.time() % self.every)
            stop.wait(wait)
