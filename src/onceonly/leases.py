"""A worker's leases: kept alive while it holds events, given back when it stops.

A claim sets a lease expiry; a worker killed with SIGKILL leaves
``processing`` rows whose lease runs out, and any worker then claims them
again. A live worker extends the leases of the events (and outbox rows) it
holds every third of a lease, so a slow handler is never taken over. On
PostgreSQL the processing transaction's row locks make a running handler's
event unclaimable even if its lease ran out (claims skip locked rows).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._exceptions import StoreError
from .store.work_queue import Claimed, WorkQueue

if TYPE_CHECKING:
    import sqlalchemy as sa

    from .outbox import OutboxRunner

__all__ = ["LeaseKeeper"]

log = logging.getLogger("onceonly.worker")


class LeaseKeeper:
    """Extends the leases of what a worker holds; releases what it never started."""

    def __init__(
        self,
        engine: sa.Engine,
        queue: WorkQueue,
        *,
        owner: str,
        lease: float,
        held: Callable[[], list[int]],
        outbox: OutboxRunner,
        on_database_error: Callable[[str, BaseException], None],
    ) -> None:
        self.engine = engine
        self.queue = queue
        self.owner = owner
        self.lease = lease
        self._held = held
        self.outbox = outbox
        self._database_failed = on_database_error

    def run(self, stop: threading.Event) -> None:
        """Until `stop` is set: extend every third of a lease."""
        while not stop.wait(self.lease / 3):
            self.extend()

    def extend(self) -> None:
        self.outbox.extend_leases()
        ids = self._held()
        if not ids:
            return
        try:
            self.queue.extend_leases(self.engine, ids, owner=self.owner, lease=self.lease)
        except StoreError as exc:
            self._database_failed("leases", exc)
            log.warning("could not extend leases: %s", exc)

    def release(self, waiting: list[Claimed]) -> None:
        """Give back events claimed but not started (graceful shutdown): they
        are due again at once, and the attempt they were claimed for is not
        counted."""
        if not waiting:
            return
        try:
            self.queue.release(self.engine, waiting)
            log.info("released %d claimed events not yet started", len(waiting))
        except StoreError as exc:
            log.warning("could not release events (their leases will expire): %s", exc)
