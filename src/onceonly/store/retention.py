"""The retention purge's statements: which events are old, and what goes with them.

:mod:`onceonly.retention` decides what is old (the two horizons), in what
batches, and adds up what went; this repository finds the rows and deletes
or empties them. Ids are walked in primary-key order from ``after``: each
batch starts where the last ended, so a whole purge reads the table once.
Received-at correlates with id, but is checked row by row (nothing relies on
the correlation for correctness).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from .engine import reading
from .errors import translated

__all__ = ["ChildRows", "RetentionRecords"]


@dataclass(frozen=True, slots=True)
class ChildRows:
    """Rows of the main database that belong to some events (counted or deleted)."""

    attempts: int
    effects: int
    #: Sent or dead outbox rows; pending ones are work to do, never history.
    outbox: int


@dataclass(frozen=True, slots=True)
class _Statements:
    #: Processed events received before :cutoff whose payload is still there.
    old_processed: str
    #: The same, leaving out what the ids pass would delete (a dry run
    #: deletes nothing, so it must not count those twice).
    old_processed_sparing_expired: str
    #: Processed events received before :cutoff with no outbox row to send.
    expired: str
    #: Of :ids, those still expired, locked against a concurrent replay.
    lock_expired: str
    drop_payloads: str
    delete_events: str
    count_children: str
    delete_attempts: str
    delete_effects: str
    delete_outbox: str
    expired_idempotency_keys: str


_NO_PENDING_OUTBOX = (
    "NOT EXISTS (SELECT 1 FROM onceonly_outbox o WHERE o.event_pk = e.id AND o.status = 'pending')"
)
_OLD = (
    "SELECT id FROM onceonly_events e WHERE id > :after AND status = 'processed'"
    " AND received_at < :cutoff"
)
# Re-checked and locked before any child row goes: an event replayed since the
# batch was read keeps its effect records (a replay must not repeat effects).
_LOCK_EXPIRED = (
    "SELECT id FROM onceonly_events e WHERE id IN :ids AND status = 'processed'"
    f" AND received_at < :cutoff AND {_NO_PENDING_OUTBOX} ORDER BY id"
)
_POSTGRES = _Statements(
    old_processed=f"{_OLD} AND payload_purged_at IS NULL ORDER BY id LIMIT :n",
    old_processed_sparing_expired=(
        f"{_OLD} AND payload_purged_at IS NULL"
        f" AND NOT (received_at < :ids_cutoff AND {_NO_PENDING_OUTBOX}) ORDER BY id LIMIT :n"
    ),
    expired=f"{_OLD} AND {_NO_PENDING_OUTBOX} ORDER BY id LIMIT :n",
    lock_expired=f"{_LOCK_EXPIRED} FOR UPDATE",
    # The status is checked again under the write: an event replayed since the
    # batch was read is pending now, and keeps its payload.
    drop_payloads=(
        "UPDATE onceonly_events SET body = :empty, headers = '{}', payload_purged_at = :now"
        " WHERE id IN :ids AND status = 'processed' AND payload_purged_at IS NULL RETURNING id"
    ),
    delete_events="DELETE FROM onceonly_events WHERE id IN :ids",
    count_children=(
        "SELECT (SELECT count(*) FROM onceonly_attempts WHERE event_pk IN :ids) AS attempts,"
        " (SELECT count(*) FROM onceonly_effects WHERE event_pk IN :ids) AS effects,"
        " (SELECT count(*) FROM onceonly_outbox WHERE event_pk IN :ids"
        " AND status <> 'pending') AS outbox"
    ),
    delete_attempts="DELETE FROM onceonly_attempts WHERE event_pk IN :ids",
    delete_effects="DELETE FROM onceonly_effects WHERE event_pk IN :ids",
    delete_outbox="DELETE FROM onceonly_outbox WHERE event_pk IN :ids AND status <> 'pending'",
    expired_idempotency_keys=(
        "SELECT count(*) FROM onceonly_idempotency_keys WHERE expires_at < :now"
    ),
)
# SQLite needs no row lock: BEGIN IMMEDIATE already holds the database's.
_SQLITE = replace(_POSTGRES, lock_expired=_LOCK_EXPIRED)


_IDS = re.compile(r":ids\b")


def _sql(text: str) -> sa.TextClause:
    clause = sa.text(text)
    if _IDS.search(text):
        clause = clause.bindparams(sa.bindparam("ids", expanding=True))
    return clause


class RetentionRecords:
    """The purge's reads and writes for one engine kind (``"sqlite"`` or
    ``"postgresql"``). Methods taking a connection run in the caller's
    transaction (see :meth:`transaction`); the others read on their own."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._sql = _POSTGRES if kind == "postgresql" else _SQLITE

    @contextmanager
    def transaction(self, engine: sa.Engine) -> Iterator[sa.Connection]:
        """One batch's transaction: committed when the block ends, rolled
        back (and the error translated) when it raises."""
        with translated("purging old events"), engine.begin() as conn:
            yield conn

    def expired(self, engine: sa.Engine, *, cutoff: datetime, after: int, n: int) -> list[int]:
        """Up to `n` ids past `after` of processed events received before
        `cutoff` with nothing left to send."""
        return self._ids(engine, self._sql.expired, {"cutoff": self._when(cutoff)}, after, n)

    def old_processed(
        self,
        engine: sa.Engine,
        *,
        cutoff: datetime,
        after: int,
        n: int,
        sparing_expired_before: datetime | None = None,
    ) -> list[int]:
        """Up to `n` ids past `after` of processed events received before
        `cutoff` that still hold their payload; with `sparing_expired_before`,
        not those :meth:`expired` finds for that cutoff."""
        params = {"cutoff": self._when(cutoff)}
        sql = self._sql.old_processed
        if sparing_expired_before is not None:
            sql = self._sql.old_processed_sparing_expired
            params["ids_cutoff"] = self._when(sparing_expired_before)
        return self._ids(engine, sql, params, after, n)

    def lock_expired(
        self, conn: sa.Connection, ids: Sequence[int], *, cutoff: datetime
    ) -> list[int]:
        """Of `ids`, those still expired now, locked until the transaction ends."""
        with translated("locking expired events"):
            rows = conn.execute(
                _sql(self._sql.lock_expired), {"ids": list(ids), "cutoff": self._when(cutoff)}
            )
            return [int(row.id) for row in rows]

    def drop_payloads(self, conn: sa.Connection, ids: Sequence[int], *, now: datetime) -> list[int]:
        """Empty body and headers of those of `ids` still processed and whole;
        the ids emptied."""
        with translated("dropping old payloads"):
            rows = conn.execute(
                _sql(self._sql.drop_payloads),
                {"ids": list(ids), "empty": b"", "now": self._when(now)},
            )
            return [int(row.id) for row in rows]

    def count_children(self, conn: sa.Connection, ids: Sequence[int]) -> ChildRows:
        """What :meth:`delete_children` would delete."""
        with translated("counting the rows of old events"):
            row = conn.execute(_sql(self._sql.count_children), {"ids": list(ids)}).one()
        return ChildRows(
            attempts=int(row.attempts), effects=int(row.effects), outbox=int(row.outbox)
        )

    def delete_children(self, conn: sa.Connection, ids: Sequence[int]) -> ChildRows:
        """Delete the attempts, effect records and finished outbox rows of `ids`."""
        params = {"ids": list(ids)}
        with translated("deleting the rows of old events"):
            return ChildRows(
                attempts=conn.execute(_sql(self._sql.delete_attempts), params).rowcount,
                effects=conn.execute(_sql(self._sql.delete_effects), params).rowcount,
                outbox=conn.execute(_sql(self._sql.delete_outbox), params).rowcount,
            )

    def delete_events(self, conn: sa.Connection, ids: Sequence[int]) -> int:
        with translated("deleting old events"):
            return conn.execute(_sql(self._sql.delete_events), {"ids": list(ids)}).rowcount

    def expired_idempotency_keys(self, engine: sa.Engine, *, now: float) -> int:
        """How many Idempotency-Key records expired before `now` (unix seconds)."""
        with translated("counting expired Idempotency-Key records"), reading(engine) as conn:
            return int(
                conn.execute(_sql(self._sql.expired_idempotency_keys), {"now": now}).scalar_one()
            )

    def _ids(
        self, engine: sa.Engine, sql: str, params: dict[str, Any], after: int, n: int
    ) -> list[int]:
        with translated("finding old events"), reading(engine) as conn:
            rows = conn.execute(_sql(sql), {**params, "after": after, "n": n})
            return [int(row.id) for row in rows]

    def _when(self, moment: datetime) -> Any:
        """A time as the engine stores it: timestamptz, or SQLite's ISO text in UTC."""
        if self.kind == "postgresql":
            return moment
        utc = moment.astimezone(UTC)
        return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"
