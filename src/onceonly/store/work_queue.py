"""The work queue: the event rows as jobs, claimed, leased, marked and replayed.

The worker (:mod:`onceonly.worker`, :mod:`onceonly.batch`,
:mod:`onceonly.leases`) and the operator actions (:mod:`onceonly.operations`)
reach ``onceonly_events`` and ``onceonly_attempts`` only through
:class:`WorkQueue`. Its statements are named, one set per engine.
PostgreSQL computes times with ``now()`` on the server (many machines, one
clock); SQLite, which lives on one machine, gets ``:now`` in unix seconds
from the queue's clock.

Order per key. An event with an ``ordering_key`` is claimable only when no
other unfinished event of its key (pending, processing, failed) is being
processed or comes before it in ``(occurred_at, id)`` order, an unknown
``occurred_at`` counting as later than every known one. The claim statement
evaluates that itself (:data:`_HEAD_OF_KEY`), so "one at a time, in order"
holds across workers and machines: only a key's head is ever claimable, a
claim takes it at most once (SKIP LOCKED on PostgreSQL, the write lock on
SQLite), and its successors stay unclaimable until its ``processed`` (or
``dead``) mark commits. ``dead`` does not block a key: it is terminal until an
operator replays it.

Methods that share the caller's transaction (the worker's processing
transaction is also its handlers') take the :class:`~sqlalchemy.Connection`;
the others take the engine and open their own. Each runs inside
:func:`~onceonly.store.errors.translated`: what leaves is a
:class:`~onceonly.StoreError` (:class:`~onceonly.StoreUnavailable` for an
outage), never a driver's exception.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from .._exceptions import PayloadPurged
from ..events import Event
from .engine import one_statement, reading
from .errors import translated
from .notifications import CHANNEL
from .rows import event_columns, event_from_row

__all__ = ["Claimed", "WorkQueue"]


@dataclass(frozen=True, slots=True)
class Claimed:
    """An event this worker claimed, with the fence its claim set."""

    event: Event
    fence: int


@dataclass(frozen=True, slots=True)
class _Statements:
    #: Claim up to :n due events (new, failed and due, or leased by a dead worker).
    claim: str
    #: Inside the processing transaction: re-read the leases of a batch (and lock
    #: the rows on PostgreSQL).
    lock_events: str
    mark_processed: str
    #: The same for a whole batch at once, where the engine has arrays (else None).
    mark_processed_many: str | None
    #: Record a failure: back to 'failed' with run_after in :delay seconds, or 'dead'.
    mark_failed: str
    #: Give back events claimed but not started (graceful shutdown).
    release: str
    extend_leases: str
    insert_attempt: str
    #: The statuses it puts back in line are REPLAYABLE's (tests/unit/test_replayable.py).
    replay: str
    #: Why a replay by id found nothing: the payload was purged (or not).
    purged_at: str
    #: Wake the workers listening (PostgreSQL only).
    notify: str | None
    #: How many events a worker could claim now (``run_until_idle``).
    due_count: str
    #: One event as a claim of it left it: still processing under that fence
    #: (an outlet's message names the claim it carries).
    claimed: str
    #: A handler's RetryLater: back to 'pending', due in :delay seconds, and the
    #: attempt the claim counted given back.
    defer: str


_INSERT_ATTEMPT = """
    INSERT INTO onceonly_attempts
        (event_pk, attempt, worker, outcome, error_type, error_message, traceback)
    VALUES (:event_pk, :attempt, :worker, :outcome, :error_type, :error_message, :traceback)
"""
_RELEASE = """
    UPDATE onceonly_events SET status = 'pending', lease_owner = NULL,
        lease_expires_at = NULL, attempts = attempts - 1
    WHERE id = :id AND fence = :fence AND status = 'processing'
"""
# An event of a key blocks another while it is unfinished and either being
# processed (whatever its place: an earlier event that arrived late must not
# run beside a later one already running) or earlier in (occurred_at, id).
# `{inf}` stands in for an unknown occurred_at. The partial index
# onceonly_events_ordering_idx (ordering_key, occurred_at, id) serves the
# subquery: it holds only the unfinished rows of ordered events.
_HEAD_OF_KEY = """(e.ordering_key IS NULL OR NOT EXISTS (
    SELECT 1 FROM onceonly_events p
    WHERE p.ordering_key = e.ordering_key AND p.id <> e.id
        AND p.status IN ('pending', 'processing', 'failed')
        AND (p.status = 'processing'
            OR (COALESCE(p.occurred_at, {inf}), p.id) < (COALESCE(e.occurred_at, {inf}), e.id))))"""
_HEAD_POSTGRES = _HEAD_OF_KEY.format(inf="'infinity'::timestamptz")
# Unix seconds; 1e308 is later than any real time.
_HEAD_SQLITE = _HEAD_OF_KEY.format(inf="1e308")
_DEFER = """
    UPDATE onceonly_events SET status = 'pending', attempts = attempts - 1,
        run_after = {due}, lease_owner = NULL, lease_expires_at = NULL
    WHERE id = :id AND fence = :fence AND status = 'processing'
"""
_PURGED_AT = "SELECT payload_purged_at FROM onceonly_events WHERE id = :id"
_CLAIMED = f"""
    SELECT {event_columns()}, fence FROM onceonly_events
    WHERE id = :id AND fence = :fence AND status = 'processing'
"""

_POSTGRES = _Statements(
    claim=f"""
        WITH ready AS (
            SELECT id FROM onceonly_events e
            WHERE status IN ('pending', 'failed') AND run_after <= now() AND {_HEAD_POSTGRES}
            ORDER BY run_after, id LIMIT :n FOR UPDATE OF e SKIP LOCKED
        ), abandoned AS (
            SELECT id FROM onceonly_events
            WHERE status = 'processing' AND lease_expires_at < now()
            LIMIT :n FOR UPDATE SKIP LOCKED
        ), due AS (
            SELECT id FROM ready UNION SELECT id FROM abandoned LIMIT :n
        )
        UPDATE onceonly_events e SET
            status = 'processing', lease_owner = :owner,
            lease_expires_at = now() + make_interval(secs => :lease),
            fence = e.fence + 1, attempts = e.attempts + 1
        FROM due WHERE e.id = due.id
        RETURNING {event_columns("e")}, e.fence
    """,
    # NO KEY UPDATE, not UPDATE: the effect ledger inserts rows referencing these
    # events from another connection, and their foreign-key check takes KEY SHARE,
    # which FOR UPDATE would block (a deadlock across our own two connections).
    # Claims still skip the rows: FOR UPDATE conflicts with NO KEY UPDATE.
    lock_events="""
        SELECT id, fence, status FROM onceonly_events WHERE id = ANY(CAST(:ids AS bigint[]))
        ORDER BY id FOR NO KEY UPDATE
    """,
    mark_processed="""
        UPDATE onceonly_events SET status = 'processed', processed_at = now(),
            handler = :handler, lease_owner = NULL, lease_expires_at = NULL, last_error = NULL
        WHERE id = :id AND fence = :fence AND status = 'processing'
    """,
    # A batch's marks in one statement: one round of parse, plan and execute
    # on the server instead of one per event (psycopg's executemany sends
    # each). Same rows, same conditions as mark_processed.
    mark_processed_many="""
        UPDATE onceonly_events e SET status = 'processed', processed_at = now(),
            handler = d.handler, lease_owner = NULL, lease_expires_at = NULL, last_error = NULL
        FROM unnest(CAST(:ids AS bigint[]), CAST(:fences AS bigint[]), CAST(:handlers AS text[]))
            AS d(id, fence, handler)
        WHERE e.id = d.id AND e.fence = d.fence AND e.status = 'processing'
    """,
    mark_failed="""
        UPDATE onceonly_events SET
            status = CASE WHEN :dead THEN 'dead' ELSE 'failed' END,
            run_after = now() + make_interval(secs => :delay),
            lease_owner = NULL, lease_expires_at = NULL, last_error = :error
        WHERE id = :id AND fence = :fence AND status = 'processing'
    """,
    release=_RELEASE,
    # SKIP LOCKED: a row locked by our own running handler needs no extension
    # (nobody can claim a locked row) and must not make the keeper wait.
    extend_leases="""
        UPDATE onceonly_events SET lease_expires_at = now() + make_interval(secs => :lease)
        WHERE id IN (
            SELECT id FROM onceonly_events
            WHERE id = ANY(CAST(:ids AS bigint[])) AND lease_owner = :owner
                AND status = 'processing'
            FOR UPDATE SKIP LOCKED)
    """,
    insert_attempt=_INSERT_ATTEMPT,
    replay="""
        UPDATE onceonly_events SET status = 'pending', run_after = now(), attempts = 0,
            lease_owner = NULL, lease_expires_at = NULL
        WHERE status IN ('failed', 'dead', 'processed') AND payload_purged_at IS NULL
            AND (CAST(:id AS BIGINT) IS NULL OR id = :id)
            AND (CAST(:status AS TEXT) IS NULL OR status = :status)
        RETURNING id
    """,
    purged_at=_PURGED_AT,
    notify=f"SELECT pg_notify('{CHANNEL}', '')",
    due_count=f"""
        SELECT count(*) FROM onceonly_events e
        WHERE (status IN ('pending', 'failed') AND run_after <= now() AND {_HEAD_POSTGRES})
           OR (status = 'processing' AND lease_expires_at < now())
           OR (status = 'processing' AND lease_owner = :owner)
    """,
    claimed=_CLAIMED,
    defer=_DEFER.format(due="now() + make_interval(secs => :delay)"),
)

_SQLITE = _Statements(
    claim=f"""
        UPDATE onceonly_events SET
            status = 'processing', lease_owner = :owner, lease_expires_at = :now + :lease,
            fence = fence + 1, attempts = attempts + 1
        WHERE id IN (
            SELECT id FROM onceonly_events e
            WHERE (status IN ('pending', 'failed') AND run_after <= :now AND {_HEAD_SQLITE})
               OR (status = 'processing' AND lease_expires_at < :now)
            ORDER BY run_after, id LIMIT :n)
        RETURNING {event_columns()}, fence
    """,
    # BEGIN IMMEDIATE already holds the database's write lock.
    lock_events="""
        SELECT id, fence, status FROM onceonly_events
        WHERE id IN (SELECT value FROM json_each(:ids_json))
    """,
    mark_processed="""
        UPDATE onceonly_events SET status = 'processed',
            processed_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
            handler = :handler, lease_owner = NULL, lease_expires_at = NULL, last_error = NULL
        WHERE id = :id AND fence = :fence AND status = 'processing'
    """,
    mark_processed_many=None,
    mark_failed="""
        UPDATE onceonly_events SET
            status = CASE WHEN :dead THEN 'dead' ELSE 'failed' END,
            run_after = :now + :delay,
            lease_owner = NULL, lease_expires_at = NULL, last_error = :error
        WHERE id = :id AND fence = :fence AND status = 'processing'
    """,
    release=_RELEASE,
    extend_leases="""
        UPDATE onceonly_events SET lease_expires_at = :now + :lease
        WHERE id IN (SELECT value FROM json_each(:ids_json))
            AND lease_owner = :owner AND status = 'processing'
    """,
    insert_attempt=_INSERT_ATTEMPT,
    replay="""
        UPDATE onceonly_events SET status = 'pending', run_after = 0, attempts = 0,
            lease_owner = NULL, lease_expires_at = NULL
        WHERE status IN ('failed', 'dead', 'processed') AND payload_purged_at IS NULL
            AND (CAST(:id AS BIGINT) IS NULL OR id = :id)
            AND (CAST(:status AS TEXT) IS NULL OR status = :status)
        RETURNING id
    """,
    purged_at=_PURGED_AT,
    notify=None,
    due_count=f"""
        SELECT count(*) FROM onceonly_events e
        WHERE (status IN ('pending', 'failed') AND run_after <= :now AND {_HEAD_SQLITE})
           OR (status = 'processing' AND lease_expires_at < :now)
           OR (status = 'processing' AND lease_owner = :owner)
    """,
    claimed=_CLAIMED,
    defer=_DEFER.format(due=":now + :delay"),
)

_STATEMENTS = {"postgresql": _POSTGRES, "sqlite": _SQLITE}


class WorkQueue:
    """The event rows as a queue, for one engine kind (``"sqlite"`` or ``"postgresql"``)."""

    def __init__(self, kind: str, clock: Callable[[], float] = time.time) -> None:
        self.kind = kind
        self.sql = _STATEMENTS[kind]
        self.clock = clock
        #: Whether a new event wakes the workers at once (LISTEN/NOTIFY on
        #: PostgreSQL; :mod:`onceonly.store.notifications`), so that polling
        #: is only a fallback.
        self.notifies = kind == "postgresql"
        #: Whether one write lock serves the whole database (SQLite): a batch
        #: holding it keeps the receiver waiting, so batches commit in slices.
        self.single_writer = kind == "sqlite"
        # Built once: sa.text() parses its string for bind names on every call.
        self._claim_sql = sa.text(self.sql.claim)
        self._lock_sql = sa.text(self.sql.lock_events)
        self._mark_sql = sa.text(self.sql.mark_processed)
        self._mark_many_sql = (
            sa.text(self.sql.mark_processed_many) if self.sql.mark_processed_many else None
        )
        # PostgreSQL takes the id list as an array, SQLite as JSON (json_each).
        self._ids: Callable[[list[int]], dict[str, Any]] = (
            (lambda ids: {"ids": bigint_array(ids)}) if kind == "postgresql" else _ids_json
        )

    # The claim loop (each in a transaction of its own).

    def claim(self, engine: sa.Engine, n: int, *, owner: str, lease: float) -> list[Claimed]:
        """Claim up to `n` due events for `owner`, leased for `lease` seconds."""
        with one_statement(engine, "claiming events") as conn:
            rows = conn.execute(
                self._claim_sql, {"n": n, "owner": owner, "lease": lease, "now": self.clock()}
            ).all()
        # The fence is the column after the event's.
        return [Claimed(event_from_row(row), row[-1]) for row in rows]

    def claimed(self, engine: sa.Engine, id: int, fence: int) -> Claimed | None:
        """Event `id` as claimed with `fence`, or None if that claim is over
        (processed, failed, or claimed again since)."""
        with translated("reading a claimed event"), reading(engine) as conn:
            row = conn.execute(sa.text(self.sql.claimed), {"id": id, "fence": fence}).first()
        return None if row is None else Claimed(event_from_row(row), row.fence)

    def due_count(self, engine: sa.Engine, *, owner: str | None = None) -> int:
        """How many events a worker could claim now, and those `owner` holds
        (claimed, not finished), when given."""
        with translated("counting due events"), reading(engine) as conn:
            count = conn.execute(
                sa.text(self.sql.due_count), {"now": self.clock(), "owner": owner}
            ).scalar_one()
        return int(count)

    def extend_leases(self, engine: sa.Engine, ids: list[int], *, owner: str, lease: float) -> None:
        """Push the leases `owner` holds on `ids` to `lease` seconds from now."""
        with translated("extending leases"), engine.begin() as conn:
            conn.execute(
                sa.text(self.sql.extend_leases),
                {"owner": owner, "lease": lease, "now": self.clock(), **self._ids(ids)},
            )

    def release(self, engine: sa.Engine, claimed: Sequence[Claimed]) -> None:
        """Give back claimed events not started: due again at once, and the
        attempt they were claimed for not counted."""
        if not claimed:
            return
        with translated("releasing events"), engine.begin() as conn:
            conn.execute(
                sa.text(self.sql.release), [{"id": c.event.id, "fence": c.fence} for c in claimed]
            )

    # Inside the processing transaction (the caller's connection).

    def lock_events(self, conn: sa.Connection, batch: Sequence[Claimed]) -> set[int]:
        """Re-read (and on PostgreSQL lock) the rows of `batch`: the ids whose
        claim is still this one (same fence, still processing)."""
        ids = [c.event.id for c in batch]
        with translated("locking claimed events"):
            current = {
                id: (fence, status)
                for id, fence, status in conn.execute(self._lock_sql, self._ids(ids))
            }
        return {c.event.id for c in batch if current.get(c.event.id) == (c.fence, "processing")}

    def mark_processed(self, conn: sa.Connection, done: Sequence[tuple[Claimed, str]]) -> None:
        """Mark each (claimed event, handler name) processed, if its claim holds."""
        if not done:
            return
        with translated("marking events processed"):
            if self._mark_many_sql is not None and len(done) > 1:
                conn.execute(
                    self._mark_many_sql,
                    {
                        "ids": bigint_array(c.event.id for c, _ in done),
                        "fences": bigint_array(c.fence for c, _ in done),
                        "handlers": text_array(h for _, h in done),
                    },
                )
                return
            conn.execute(
                self._mark_sql,
                [{"id": c.event.id, "fence": c.fence, "handler": h} for c, h in done],
            )

    def mark_failed(
        self, conn: sa.Connection, item: Claimed, *, dead: bool, delay: float, error: str
    ) -> None:
        """Record a failure: ``failed`` and due in `delay` seconds, or ``dead``."""
        with translated("marking an event failed"):
            conn.execute(
                sa.text(self.sql.mark_failed),
                {
                    "id": item.event.id,
                    "fence": item.fence,
                    "dead": dead,
                    "delay": delay,
                    "error": error,
                    "now": self.clock(),
                },
            )

    def defer(self, conn: sa.Connection, item: Claimed, *, delay: float) -> None:
        """A handler's ``RetryLater``: ``pending`` again, due in `delay`
        seconds, and the attempt its claim counted not counted."""
        with translated("deferring an event"):
            conn.execute(
                sa.text(self.sql.defer),
                {"id": item.event.id, "fence": item.fence, "delay": delay, "now": self.clock()},
            )

    def insert_attempt(
        self,
        conn: sa.Connection,
        item: Claimed,
        *,
        worker: str,
        outcome: str,
        error_type: str | None = None,
        error_message: str | None = None,
        traceback: str | None = None,
    ) -> None:
        """Keep the record of one attempt of `item` in ``onceonly_attempts``."""
        with translated("recording an attempt"):
            conn.execute(
                sa.text(self.sql.insert_attempt),
                {
                    "event_pk": item.event.id,
                    "attempt": item.event.attempts,
                    "worker": worker,
                    "outcome": outcome,
                    "error_type": error_type,
                    "error_message": error_message,
                    "traceback": traceback,
                },
            )

    # Operator actions.

    def replay(
        self, engine: sa.Engine, *, id: int | None = None, status: str | None = None
    ) -> list[int]:
        """Put finished events back in line; their ids. Raises
        :class:`~onceonly.PayloadPurged` for an `id` whose payload was purged."""
        with translated("replaying events"), engine.begin() as conn:
            ids = [
                int(row.id)
                for row in conn.execute(sa.text(self.sql.replay), {"id": id, "status": status})
            ]
            if not ids and id is not None:
                purged = conn.execute(sa.text(self.sql.purged_at), {"id": id}).scalar()
                if purged is not None:
                    raise PayloadPurged(
                        f"event {id} cannot be replayed: its payload was purged at {purged}"
                    )
            if ids and self.sql.notify is not None:
                conn.execute(sa.text(self.sql.notify))
        return ids


# PostgreSQL arrays as their text form, cast in the statement. psycopg's list
# adapter looks up a dumper for every element in Python: dumping the worker's
# parameters, mostly these lists, was 12% of its GIL samples (py-spy).


def bigint_array(values: Iterable[int]) -> str:
    """``{1,2,3}``: integers as a PostgreSQL array literal."""
    return "{" + ",".join(str(int(v)) for v in values) + "}"


def text_array(values: Iterable[str]) -> str:
    """Strings as a PostgreSQL array literal, each quoted (commas, braces,
    quotes, backslashes and spaces kept as they are)."""
    quoted = ('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)
    return "{" + ",".join(quoted) + "}"


def _ids_json(ids: list[int]) -> dict[str, Any]:
    return {"ids_json": json.dumps(ids)}
