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
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from .handlers import Action
from .queries import Queries

__all__ = ["OutboxRunner", "outbox_key"]

log = logging.getLogger("onceonly.outbox")

#: What a database error looks like to the runner: anything the driver raised,
#: including a connection that could not be made.
DatabaseError = (sa.exc.DBAPIError, sa.exc.InterfaceError, OSError)


def outbox_key(row_id: int) -> str:
    """The key passed to an outbox action: the same on every send of the row."""
    return f"oo-outbox-{row_id}"


class OutboxRunner:
    """Claims outbox rows and runs their actions, at most one runner per row."""

    def __init__(
        self,
        engine: sa.Engine,
        queries: Queries,
        actions: dict[str, Action],
        *,
        owner: str,
        lease: float,
        max_attempts: int,
        delay: Callable[[int], float],
        loop: Callable[[], asyncio.AbstractEventLoop],
        on_database_error: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.engine = engine
        self.q = queries
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

    def _params(self, **extra: Any) -> dict[str, Any]:
        return {"owner": self.owner, "lease": self.lease, "now": time.time(), **extra}

    def _failed(self, operation: str, exc: BaseException) -> None:
        log.warning("outbox %s failed (will retry): %s", operation, getattr(exc, "orig", exc))
        if self._on_database_error is not None:
            self._on_database_error(f"outbox-{operation}", exc)

    def run_for(self, event_pks: Sequence[int]) -> None:
        """Claim and send the rows staged by these just-committed events."""
        pks = list(event_pks)
        try:
            with self.engine.begin() as conn:
                rows = conn.execute(
                    sa.text(self.q.claim_outbox_of_events),
                    self._params(pks=pks, pks_json=json.dumps(pks)),
                ).all()
        except DatabaseError as exc:
            # Nothing claimed: the sweep (here or in another worker) takes them.
            self._failed("claim", exc)
            return
        self._send_all(rows)

    def sweep(self, n: int = 50) -> None:
        """Retry marks that did not land, then claim and send rows nobody holds."""
        self._retry_marks()
        try:
            with self.engine.begin() as conn:
                rows = conn.execute(sa.text(self.q.claim_outbox), self._params(n=n)).all()
        except DatabaseError as exc:
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
            with self.engine.begin() as conn:
                conn.execute(
                    sa.text(self.q.extend_outbox_leases),
                    self._params(ids=ids, ids_json=json.dumps(ids)),
                )
        except DatabaseError as exc:
            self._failed("lease", exc)

    def _send_all(self, rows: Sequence[Any]) -> None:
        with self._lock:
            self._held.update({row.id: row.fence for row in rows})
        for row in rows:
            self._send(row)

    def _let_go(self, row_id: int) -> None:
        with self._lock:
            self._held.pop(row_id, None)
            self._unmarked.discard(row_id)

    def _send(self, row: Any) -> None:
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
            with self.engine.begin() as conn:
                conn.execute(sa.text(self.q.mark_sent), {"id": row_id})
        except DatabaseError as exc:
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

    def _mark_failed(self, row: Any, exc: Exception) -> None:
        attempt = row.attempts + 1
        log.warning("outbox %s (%s) attempt %d failed: %s", row.id, row.action, attempt, exc)
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    sa.text(self.q.mark_outbox_failed),
                    self._params(
                        id=row.id,
                        fence=row.fence,
                        dead=attempt >= self.max_attempts,
                        error=f"{type(exc).__name__}: {exc}"[:2000],
                        delay=self.delay(attempt),
                    ),
                )
        except DatabaseError as db_exc:
            # Unrecorded, the row comes back when its lease expires: a retry
            # of a send that failed anyway.
            self._failed("mark", db_exc)
        self._let_go(row.id)
