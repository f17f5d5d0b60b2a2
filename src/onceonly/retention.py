"""Retention: drop old payloads early, forget event ids late.

Two horizons, both measured from when an event was received:

- **payloads** (``--older-than``, default ``30d``): a *processed* event older
  than this loses its body and headers (``payload_purged_at`` is set) along
  with its attempt history, its effect records and its sent outbox rows. Its
  row stays: provider and event id are the dedup memory, so a resend is still
  answered as a duplicate.
- **ids** (``--keep-ids``, default ``400d``, never shorter than the first):
  processed events older than this are deleted outright; a resend after that
  would be taken as new.

Events that are not finished are never touched: pending, processing and failed
ones are still to be handled, and dead ones keep their payload because replay
needs it (replay them, and they are purged like any processed event later).
A processed event with outbox rows still to send is kept whole.

Work is done in batches of ``batch_size`` rows, each in its own short
transaction, walking the primary key: a purge of millions of rows never holds a
lock for long, and can be interrupted and run again (it is idempotent).
Expired Idempotency-Key records go in the same run (see docs/idempotency.md).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ._exceptions import ConfigurationError

if TYPE_CHECKING:
    from .config import Onceonly
    from .ledger import EffectLedger

__all__ = [
    "DEFAULT_RETENTION_IDS",
    "DEFAULT_RETENTION_PAYLOADS",
    "PurgeReport",
    "duration",
    "purge",
]

DEFAULT_RETENTION_PAYLOADS = "30d"
DEFAULT_RETENTION_IDS = "400d"

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", re.IGNORECASE)


def duration(value: str | timedelta, what: str = "duration") -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` (or a :class:`timedelta`) as a timedelta."""
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise ConfigurationError(f"{what} must not be negative, got {value}")
        return value
    match = _DURATION.fullmatch(value)
    if match is None:
        raise ConfigurationError(
            f"{what}: {value!r} is not a duration; write a number and a unit "
            "(s, m, h, d or w), for example 90m, 12h or 30d"
        )
    return timedelta(seconds=float(match[1]) * _UNITS[match[2].lower()])


@dataclass(frozen=True, slots=True)
class PurgeReport:
    """What a purge did (or, with ``dry_run``, would do)."""

    dry_run: bool
    payload_cutoff: datetime
    ids_cutoff: datetime
    #: Processed events whose body and headers were dropped (rows kept).
    payloads_dropped: int
    #: Processed events deleted entirely (past the ids horizon).
    events_deleted: int
    attempts_deleted: int
    effects_deleted: int
    outbox_deleted: int
    idempotency_keys_deleted: int
    #: Job guard keys finished longer ago than their memory horizon.
    jobs_deleted: int = 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["payload_cutoff"] = self.payload_cutoff.isoformat()
        data["ids_cutoff"] = self.ids_cutoff.isoformat()
        return data


def _sql(text: str) -> sa.TextClause:
    return sa.text(text).bindparams(sa.bindparam("ids", expanding=True))


# Walk the primary key from `after`: each batch starts where the last ended, so
# the whole purge reads the table once. Received-at correlates with id, but is
# checked row by row (nothing relies on the correlation for correctness).
_NO_PENDING_OUTBOX = (
    "NOT EXISTS (SELECT 1 FROM onceonly_outbox o WHERE o.event_pk = e.id AND o.status = 'pending')"
)
_OLD_PROCESSED = sa.text(
    "SELECT id FROM onceonly_events e WHERE id > :after AND status = 'processed'"
    " AND received_at < :cutoff AND payload_purged_at IS NULL ORDER BY id LIMIT :n"
)
_EXPIRED_IDS = sa.text(
    "SELECT id FROM onceonly_events e WHERE id > :after AND status = 'processed'"
    f" AND received_at < :cutoff AND {_NO_PENDING_OUTBOX} ORDER BY id LIMIT :n"
)
# A dry run deletes nothing, so it leaves out here what the ids pass would delete.
_OLD_PROCESSED_DRY = sa.text(
    "SELECT id FROM onceonly_events e WHERE id > :after AND status = 'processed'"
    " AND received_at < :cutoff AND payload_purged_at IS NULL"
    f" AND NOT (received_at < :ids_cutoff AND {_NO_PENDING_OUTBOX}) ORDER BY id LIMIT :n"
)
# The status is checked again under the write: an event replayed since the
# batch was read is pending now, and keeps its payload.
_DROP_PAYLOADS = _sql(
    "UPDATE onceonly_events SET body = :empty, headers = '{}', payload_purged_at = :now"
    " WHERE id IN :ids AND status = 'processed' AND payload_purged_at IS NULL RETURNING id"
)
# Re-checked and locked before any child row goes: an event replayed since the
# batch was read keeps its effect records (a replay must not repeat effects).
# (SQLite needs no row lock: BEGIN IMMEDIATE already holds the database's.)
_LOCK_EXPIRED = (
    "SELECT id FROM onceonly_events e WHERE id IN :ids AND status = 'processed'"
    f" AND received_at < :cutoff AND {_NO_PENDING_OUTBOX} ORDER BY id"
)
_DELETE_EVENTS = _sql("DELETE FROM onceonly_events WHERE id IN :ids")
_CHILDREN = (
    ("attempts", "onceonly_attempts", ""),
    ("effects", "onceonly_effects", ""),
    # Outbox rows still pending are work to do, never history.
    ("outbox", "onceonly_outbox", " AND status <> 'pending'"),
)
_EXPIRED_KEYS = sa.text("SELECT count(*) FROM onceonly_idempotency_keys WHERE expires_at < :now")


def _when(moment: datetime, kind: str) -> Any:
    """A time as the engine stores it: timestamptz, or SQLite's ISO text in UTC."""
    if kind == "postgresql":
        return moment
    utc = moment.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


class _Totals:
    def __init__(self) -> None:
        self.payloads = self.events = self.attempts = self.effects = self.outbox = 0

    def forget(self, ledger: EffectLedger, ids: Sequence[int]) -> None:
        """Delete the records the ledger keeps outside the main database, once
        their events' deletion committed: a failure then leaves records of
        events that are gone, which nothing reads, never an event without the
        records that stop its effects from running again."""
        self.effects += ledger.forget(ids, delete=True)

    def add_children(
        self, conn: sa.Connection, ids: Sequence[int], *, delete: bool, ledger: EffectLedger
    ) -> None:
        """Count or delete the rows that belong to these events."""
        if not delete:  # records kept in a file of their own (SQLite): see forget()
            self.effects += ledger.forget(ids, delete=False)
        for name, table, condition in _CHILDREN:
            verb = "DELETE" if delete else "SELECT count(*)"
            result = conn.execute(
                _sql(f"{verb} FROM {table} WHERE event_pk IN :ids{condition}"), {"ids": ids}
            )
            count = result.rowcount if delete else int(result.scalar_one())
            setattr(self, name, getattr(self, name) + count)


def _walk(
    engine: sa.Engine, select: sa.TextClause, params: dict[str, Any], n: int
) -> Iterator[list[int]]:
    """Ids matching `select`, a batch at a time, in id order."""
    after = 0
    while True:
        with engine.connect() as conn:
            ids = [int(r[0]) for r in conn.execute(select, {**params, "after": after, "n": n})]
        if not ids:
            return
        yield ids
        after = ids[-1]


def purge(
    app: Onceonly,
    *,
    older_than: timedelta | str | None = None,
    keep_ids: timedelta | str | None = None,
    dry_run: bool = False,
    batch_size: int = 1000,
) -> PurgeReport:
    """Apply the retention horizons (defaults: the app's ``retention_payloads``
    and ``retention_ids``) and purge expired Idempotency-Key records.

    Blocking; creates or upgrades the tables first, as every command does.
    """
    payloads_age = (
        duration(older_than, "--older-than") if older_than is not None else app.retention_payloads
    )
    ids_age = duration(keep_ids, "--keep-ids") if keep_ids is not None else app.retention_ids
    if ids_age < payloads_age:
        raise ConfigurationError(
            f"--keep-ids ({ids_age}) is shorter than --older-than ({payloads_age}): the dedup "
            "memory must outlive the payloads, or a late resend would be taken as new"
        )
    if batch_size < 1:
        raise ConfigurationError("batch size must be at least 1")
    from .store import migrate_blocking

    migrate_blocking(app.database_url)
    engine, kind, ledger = app.engine, app.engine_kind, app.effect_ledger
    now = datetime.now(UTC)
    payload_cutoff, ids_cutoff = now - payloads_age, now - ids_age
    totals = _Totals()

    # Rows past the ids horizon first: what is deleted needs no payload drop.
    ids_params = {"cutoff": _when(ids_cutoff, kind)}
    lock = _sql(_LOCK_EXPIRED + (" FOR UPDATE" if kind == "postgresql" else ""))
    for ids in _walk(engine, _EXPIRED_IDS, ids_params, batch_size):
        with engine.begin() as conn:
            if dry_run:
                totals.add_children(conn, ids, delete=False, ledger=ledger)
                totals.events += len(ids)
                continue
            doomed = [int(r[0]) for r in conn.execute(lock, {**ids_params, "ids": ids})]
            if doomed:
                # Children first, counted; the foreign keys would cascade anyway.
                totals.add_children(conn, doomed, delete=True, ledger=ledger)
                totals.events += conn.execute(_DELETE_EVENTS, {"ids": doomed}).rowcount
        if doomed:
            totals.forget(ledger, doomed)

    payload_params = {"cutoff": _when(payload_cutoff, kind), "ids_cutoff": _when(ids_cutoff, kind)}
    select = _OLD_PROCESSED_DRY if dry_run else _OLD_PROCESSED
    for ids in _walk(engine, select, payload_params, batch_size):
        with engine.begin() as conn:
            if dry_run:
                totals.add_children(conn, ids, delete=False, ledger=ledger)
                totals.payloads += len(ids)
                continue
            purged = [
                int(r[0])
                for r in conn.execute(
                    _DROP_PAYLOADS, {"ids": ids, "empty": b"", "now": _when(now, kind)}
                )
            ]
            if purged:
                totals.add_children(conn, purged, delete=True, ledger=ledger)
            totals.payloads += len(purged)
        if purged:
            totals.forget(ledger, purged)

    keys = _expired_keys(app, dry_run=dry_run)
    jobs = app.guard().purge(dry_run=dry_run)
    return PurgeReport(
        dry_run=dry_run,
        payload_cutoff=payload_cutoff,
        ids_cutoff=ids_cutoff,
        payloads_dropped=totals.payloads,
        events_deleted=totals.events,
        attempts_deleted=totals.attempts,
        effects_deleted=totals.effects,
        outbox_deleted=totals.outbox,
        idempotency_keys_deleted=keys,
        jobs_deleted=jobs,
    )


def _expired_keys(app: Onceonly, *, dry_run: bool) -> int:
    """Count (dry run) or delete expired Idempotency-Key records, with the key
    store's own purge."""
    now = time.time()
    if dry_run:
        with app.engine.connect() as conn:
            return int(conn.execute(_EXPIRED_KEYS, {"now": now}).scalar_one())
    from ._threads import run_on_own_loop
    from .idempotency.storage import key_store_for
    from .store import create_store

    async def work() -> int:
        store = create_store(app.database_url, auto_migrate=False)
        try:
            return await key_store_for(store).purge(now=now)
        finally:
            await store.close()

    # purge() is blocking and may be called from code that runs an event loop.
    return run_on_own_loop(work, name="onceonly-purge-keys")
