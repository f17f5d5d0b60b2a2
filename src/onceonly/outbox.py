"""Running staged outbox actions after their transaction committed.

A row is sent by one runner at a time. Before sending, a runner claims the row
in one conditional ``UPDATE ... RETURNING`` (with ``FOR UPDATE SKIP LOCKED`` on
PostgreSQL) that sets it as ``owner``, bumps ``fence`` and starts a lease; the
database decides, so two runners reading the same pending row cannot both
take it. Right after a commit, the worker claims the rows its events staged
(:meth:`OutboxRunner.run_for`); the sweep claims only rows nobody holds: never
sent, due again after a failure, or whose runner's lease expired (it died).
A live runner extends the leases of the rows it holds.

After a successful send the row is marked ``sent``. If that mark fails (the
database is away or locked), the runner keeps the row and retries the *mark*
on each sweep, never the send. What remains at least once is a crash between
the send and its mark: the next runner sends again, with the same key.

The statements are :class:`~onceonly.store.outbox.OutboxRecords`'; a database
error reaches the runner as a :class:`~onceonly.StoreError`, which it logs,
reports and waits out.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence

import sqlalchemy as sa

from ._exceptions import StoreError
from .handlers import Action
from .store.outbox import OutboxRecords, OutboxRow

__all__ = ["OutboxRunner", "outbox_key"]

log = logging.getLogger("onceonly.outbox")


def outbox_key(row_id: int) -> str:
    """The key passed to an outbox action: the same on every send of the row."""
    return f"oo-outbox-{row_id}"


class OutboxRunner:
    """Claims outbox rows and runs their actions, at most one runner per row."""

    def __init__(
        self,
        engine: sa.Engine,
        records: OutboxRecords,
        actions: Mapping[str, Action],
        *,
        owner: str,
        lease: float,
        max_attempts: int,
        delay: Callable[[int], float],
        loop: Callable[[], asyncio.AbstractEventLoop],
        on_database_error: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.engine = engine
        self.records = records
        self.actions = actions
        self.owner = owner
        self.lease = lease
        self.max_attempts = max_attempts
        self.delay = delay
        self.loop = loop
        self._on_database_error = on_database_error
        self._lock = threading.Lock()
        #: Rows this runner holds (claimed, not yet let go): id -> fence.
        self._held: dict[int, int] = {}
        #: Rows sent whose ``sent`` mark did not land yet.
        self._unmarked: set[int] = set()

    def _failed(self, operation: str, exc: StoreError) -> None:
        log.warning("outbox %s failed (will retry): %s", operation, exc)
        if self._on_database_error is not None:
            self._on_database_error(f"outbox-{operation}", exc)

    def run_for(self, event_pks: Sequence[int]) -> None:
        """Claim and send the rows staged by these just-committed events."""
        try:
            rows = self.records.claim_of_events(
                self.engine, event_pks, owner=self.owner, lease=self.lease
            )
        except StoreError as exc:
            # Nothing claimed: the sweep (here or in another worker) takes them.
            self._failed("claim", exc)
            return
        self._send_all(rows)

    def sweep(self, n: int = 50) -> None:
        """Retry marks that did not land, then claim and send rows nobody holds."""
        self._retry_marks()
        try:
            rows = self.records.claim(self.engine, n, owner=self.owner, lease=self.lease)
        except StoreError as exc:
            self._failed("sweep", exc)
            return
        self._send_all(rows)

    def extend_leases(self) -> None:
        """Keep the rows this runner holds (a slow action, a mark being retried)."""
        with self._lock:
            ids = list(self._held)
        if not ids:
            return
        try:
            self.records.extend_leases(self.engine, ids, owner=self.owner, lease=self.lease)
        except StoreError as exc:
            self._failed("lease", exc)

    def _send_all(self, rows: Sequence[OutboxRow]) -> None:
        with self._lock:
            self._held.update({row.id: row.fence for row in rows})
        for row in rows:
            self._send(row)

    def _let_go(self, row_id: int) -> None:
        with self._lock:
            self._held.pop(row_id, None)
            self._unmarked.discard(row_id)

    def _send(self, row: OutboxRow) -> None:
        action = self.actions.get(row.action)
        try:
            if action is None:
                raise LookupError(f"no outbox action named {row.action!r} is registered")
            result = action(json.loads(row.payload), outbox_key(row.id))
            if asyncio.iscoroutine(result):
                self.loop().run_until_complete(result)
        except Exception as exc:
            self._mark_failed(row, exc)
            return
        if not self._mark_sent(row.id):
            with self._lock:
                self._unmarked.add(row.id)

    def _mark_sent(self, row_id: int) -> bool:
        try:
            self.records.mark_sent(self.engine, row_id)
        except StoreError as exc:
            self._failed("mark", exc)
            return False
        self._let_go(row_id)
        return True

    def _retry_marks(self) -> None:
        with self._lock:
            unmarked = sorted(self._unmarked)
        for row_id in unmarked:
            if not self._mark_sent(row_id):
                return  # the database is still away; the next sweep tries again

    def _mark_failed(self, row: OutboxRow, exc: Exception) -> None:
        attempt = row.attempts + 1
        log.warning("outbox %s (%s) attempt %d failed: %s", row.id, row.action, attempt, exc)
        try:
            self.records.mark_failed(
                self.engine,
                row,
                error=f"{type(exc).__name__}: {exc}"[:2000],
                delay=self.delay(attempt),
                dead=attempt >= self.max_attempts,
            )
        except StoreError as db_exc:
            # Unrecorded, the row comes back when its lease expires: a retry
            # of a send that failed anyway.
            self._failed("mark", db_exc)
        self._let_go(row.id)
