"""Running staged outbox actions after their transaction committed."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from .handlers import Action
from .queries import Queries

__all__ = ["OutboxRunner"]

log = logging.getLogger("onceonly.outbox")


class OutboxRunner:
    """Runs outbox rows: right after their commit, and later for rows whose first
    runner died or failed (a sweep claims rows whose ``available_at`` passed)."""

    def __init__(
        self,
        engine: sa.Engine,
        queries: Queries,
        actions: dict[str, Action],
        *,
        lease: float,
        max_attempts: int,
        delay: Callable[[int], float],
        loop: Callable[[], asyncio.AbstractEventLoop],
    ) -> None:
        self.engine = engine
        self.q = queries
        self.actions = actions
        self.lease = lease
        self.max_attempts = max_attempts
        self.delay = delay
        self.loop = loop

    def run_for(self, event_pks: Sequence[int]) -> None:
        query = sa.text(self.q.pending_outbox_of_event)
        with self.engine.connect() as conn:
            rows = [row for pk in event_pks for row in conn.execute(query, {"event_pk": pk})]
        for row in rows:
            self._send(row)

    def sweep(self) -> None:
        try:
            with self.engine.begin() as conn:
                rows = conn.execute(
                    sa.text(self.q.claim_outbox), {"n": 50, "lease": self.lease, "now": time.time()}
                ).all()
        except sa.exc.OperationalError as exc:
            log.warning("outbox sweep failed: %s", exc.orig)
            return
        for row in rows:
            self._send(row)

    def _send(self, row: Any) -> None:
        action = self.actions.get(row.action)
        key = f"oo-outbox-{row.id}"
        try:
            if action is None:
                raise LookupError(f"no outbox action named {row.action!r} is registered")
            result = action(json.loads(row.payload), key)
            if asyncio.iscoroutine(result):
                self.loop().run_until_complete(result)
        except Exception as exc:
            attempt = row.attempts + 1
            log.warning("outbox %s (%s) attempt %d failed: %s", row.id, row.action, attempt, exc)
            with self.engine.begin() as conn:
                conn.execute(
                    sa.text(self.q.mark_outbox_failed),
                    {
                        "id": row.id,
                        "dead": attempt >= self.max_attempts,
                        "error": f"{type(exc).__name__}: {exc}"[:2000],
                        "delay": self.delay(attempt),
                        "now": time.time(),
                    },
                )
            return
        with self.engine.begin() as conn:
            conn.execute(sa.text(self.q.mark_sent), {"id": row.id})
