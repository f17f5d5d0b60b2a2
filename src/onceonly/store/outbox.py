"""The outbox's rows: staged in a handler's transaction, claimed by one runner
at a time, marked sent or failed (see :mod:`onceonly.outbox` for the runner).

A claim is one conditional ``UPDATE ... RETURNING`` that sets the runner as
``owner``, bumps ``fence`` and starts a lease, so the database decides who
sends a row. PostgreSQL computes times with ``now()`` on the server (many
machines, one clock); SQLite, on one machine, gets ``:now`` in unix seconds
from the repository's clock.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from .errors import translated

__all__ = ["OutboxRecords", "OutboxRow"]


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A claimed row: what to run, and the fence that proves the claim."""

    id: int
    action: str
    #: The staged payload, as JSON.
    payload: str
    #: Sends tried before this claim.
    attempts: int
    fence: int


@dataclass(frozen=True, slots=True)
class _Statements:
    stage: str
    #: Claim the due, unclaimed rows of just-committed events (:pks).
    claim_of_events: str
    #: Claim up to :n due rows that nobody holds (or whose runner's lease expired).
    claim: str
    #: Sent: no fence check, since the send happened whoever holds the row now,
    #: and recording it is what stops a second send.
    mark_sent: str
    #: A failed send: only its claimant (:fence) records it and lets the row go.
    mark_failed: str
    extend_leases: str


_POSTGRES = _Statements(
    stage="""
        INSERT INTO onceonly_outbox (event_pk, action, payload, available_at)
        VALUES (:event_pk, :action, :payload, now())
        RETURNING id
    """,
    # SKIP LOCKED: a row another runner is claiming right now is its, not ours;
    # a row it claimed and committed is re-checked (lease in the future): skipped.
    claim_of_events="""
        UPDATE onceonly_outbox o SET owner = :owner, fence = o.fence + 1,
            lease_expires_at = now() + make_interval(secs => :lease)
        WHERE o.id IN (
            SELECT id FROM onceonly_outbox
            WHERE event_pk = ANY(:pks) AND status = 'pending' AND available_at <= now()
                AND (lease_expires_at IS NULL OR lease_expires_at < now())
            ORDER BY id FOR UPDATE SKIP LOCKED)
        RETURNING o.id, o.action, o.payload, o.attempts, o.fence
    """,
    claim="""
        UPDATE onceonly_outbox o SET owner = :owner, fence = o.fence + 1,
            lease_expires_at = now() + make_interval(secs => :lease)
        WHERE o.id IN (
            SELECT id FROM onceonly_outbox
            WHERE status = 'pending' AND available_at <= now()
                AND (lease_expires_at IS NULL OR lease_expires_at < now())
            ORDER BY id LIMIT :n FOR UPDATE SKIP LOCKED)
        RETURNING o.id, o.action, o.payload, o.attempts, o.fence
    """,
    mark_sent="""
        UPDATE onceonly_outbox SET status = 'sent', sent_at = now(), attempts = attempts + 1,
            owner = NULL, lease_expires_at = NULL
        WHERE id = :id AND status = 'pending'
    """,
    mark_failed="""
        UPDATE onceonly_outbox SET attempts = attempts + 1, last_error = :error,
            status = CASE WHEN :dead THEN 'dead' ELSE 'pending' END,
            available_at = now() + make_interval(secs => :delay),
            owner = NULL, lease_expires_at = NULL
        WHERE id = :id AND fence = :fence AND status = 'pending'
    """,
    extend_leases="""
        UPDATE onceonly_outbox SET lease_expires_at = now() + make_interval(secs => :lease)
        WHERE id = ANY(:ids) AND owner = :owner AND status = 'pending'
    """,
)

_SQLITE = _Statements(
    stage="""
        INSERT INTO onceonly_outbox (event_pk, action, payload, available_at)
        VALUES (:event_pk, :action, :payload, :now)
        RETURNING id
    """,
    # One statement under the write lock: the read and the claim cannot be split
    # by another runner.
    claim_of_events="""
        UPDATE onceonly_outbox SET owner = :owner, fence = fence + 1,
            lease_expires_at = :now + :lease
        WHERE id IN (
            SELECT id FROM onceonly_outbox
            WHERE event_pk IN (SELECT value FROM json_each(:pks_json))
                AND status = 'pending' AND available_at <= :now
                AND (lease_expires_at IS NULL OR lease_expires_at < :now))
        RETURNING id, action, payload, attempts, fence
    """,
    claim="""
        UPDATE onceonly_outbox SET owner = :owner, fence = fence + 1,
            lease_expires_at = :now + :lease
        WHERE id IN (
            SELECT id FROM onceonly_outbox
            WHERE status = 'pending' AND available_at <= :now
                AND (lease_expires_at IS NULL OR lease_expires_at < :now)
            ORDER BY id LIMIT :n)
        RETURNING id, action, payload, attempts, fence
    """,
    mark_sent="""
        UPDATE onceonly_outbox SET status = 'sent', attempts = attempts + 1,
            sent_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), owner = NULL, lease_expires_at = NULL
        WHERE id = :id AND status = 'pending'
    """,
    mark_failed="""
        UPDATE onceonly_outbox SET attempts = attempts + 1, last_error = :error,
            status = CASE WHEN :dead THEN 'dead' ELSE 'pending' END,
            available_at = :now + :delay, owner = NULL, lease_expires_at = NULL
        WHERE id = :id AND fence = :fence AND status = 'pending'
    """,
    extend_leases="""
        UPDATE onceonly_outbox SET lease_expires_at = :now + :lease
        WHERE id IN (SELECT value FROM json_each(:ids_json))
            AND owner = :owner AND status = 'pending'
    """,
)

_STATEMENTS = {"postgresql": _POSTGRES, "sqlite": _SQLITE}


class OutboxRecords:
    """The outbox's statements for one engine (stateless, thread-safe).

    :meth:`stage` runs on the handler's connection, in its transaction; every
    other method is a transaction of its own on `engine`, committed before it
    returns.
    """

    def __init__(self, kind: str, clock: Callable[[], float] = time.time) -> None:
        self.kind = kind
        self.clock = clock
        self._s = _STATEMENTS[kind]

    @classmethod
    def of(cls, bind: sa.Engine | sa.Connection) -> OutboxRecords:
        """The statements for the database `bind` talks to."""
        return cls(bind.dialect.name)

    def stage(self, conn: sa.Connection, event_pk: int, action: str, payload: str) -> int:
        """Stage `action` with `payload` (JSON) in `conn`'s transaction; the row's id."""
        params = {"event_pk": event_pk, "action": action, "payload": payload, "now": self.clock()}
        with translated("staging an outbox row"):
            return int(conn.execute(sa.text(self._s.stage), params).scalar_one())

    def claim_of_events(
        self, engine: sa.Engine, event_pks: Sequence[int], *, owner: str, lease: float
    ) -> list[OutboxRow]:
        """Claim the due rows nobody holds that these events staged."""
        pks = list(event_pks)
        params = {"owner": owner, "lease": lease, "pks": pks, "pks_json": json.dumps(pks)}
        return self._claim(
            "claiming the outbox rows of events", engine, self._s.claim_of_events, params
        )

    def claim(self, engine: sa.Engine, n: int, *, owner: str, lease: float) -> list[OutboxRow]:
        """Claim up to `n` due rows nobody holds (or whose runner's lease expired)."""
        params = {"owner": owner, "lease": lease, "n": n}
        return self._claim("claiming outbox rows", engine, self._s.claim, params)

    def _claim(
        self, what: str, engine: sa.Engine, sql: str, params: dict[str, Any]
    ) -> list[OutboxRow]:
        with translated(what), engine.begin() as conn:
            rows = conn.execute(sa.text(sql), {**params, "now": self.clock()}).all()
        return [
            OutboxRow(
                id=row.id,
                action=row.action,
                payload=row.payload,
                attempts=row.attempts,
                fence=row.fence,
            )
            for row in rows
        ]

    def mark_sent(self, engine: sa.Engine, row_id: int) -> bool:
        """Record that row `row_id` was sent; False if it was no longer pending."""
        with translated("marking an outbox row sent"), engine.begin() as conn:
            return conn.execute(sa.text(self._s.mark_sent), {"id": row_id}).rowcount == 1

    def mark_failed(
        self,
        engine: sa.Engine,
        row: OutboxRow,
        *,
        error: str,
        delay: float,
        dead: bool,
    ) -> bool:
        """Record a failed send of a row this runner claimed: due again in
        `delay` seconds, or ``dead``. False if the claim was lost meanwhile."""
        params = {
            "id": row.id,
            "fence": row.fence,
            "error": error,
            "delay": delay,
            "dead": dead,
            "now": self.clock(),
        }
        with translated("recording a failed outbox send"), engine.begin() as conn:
            return conn.execute(sa.text(self._s.mark_failed), params).rowcount == 1

    def extend_leases(
        self, engine: sa.Engine, row_ids: Sequence[int], *, owner: str, lease: float
    ) -> None:
        """Extend `owner`'s leases on these rows by `lease` seconds from now."""
        ids = list(row_ids)
        params = {
            "owner": owner,
            "lease": lease,
            "ids": ids,
            "ids_json": json.dumps(ids),
            "now": self.clock(),
        }
        with translated("extending outbox leases"), engine.begin() as conn:
            conn.execute(sa.text(self._s.extend_leases), params)
