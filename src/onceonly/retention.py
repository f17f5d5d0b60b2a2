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
lock for long, and can be interrupted and run again (it is idempotent). With
``pause``, it waits that long after each batch's commit, so that the
database's other work (a receiver's commits) meets fewer of its writes.
Expired Idempotency-Key records go in the same run (see docs/idempotency.md).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ._exceptions import ConfigurationError
from .store.retention import RetentionRecords

if TYPE_CHECKING:
    import sqlalchemy as sa

    from .deployment import Deployment
    from .ledger import EffectLedger

__all__ = [
    "DEFAULT_PURGE_BATCH",
    "DEFAULT_RETENTION_IDS",
    "DEFAULT_RETENTION_PAYLOADS",
    "MAX_PURGE_PAUSE",
    "PurgeReport",
    "duration",
    "purge",
]

DEFAULT_RETENTION_PAYLOADS = "30d"
#: Rows per purge transaction. Small enough that each commit's WAL flush
#: (PostgreSQL) or write-lock hold (SQLite) is short beside the receiver's
#: commits: purging 1M payloads while receiving, the longest receive stall
#: was 98 ms at 1000 rows per batch and 56 ms at 200 (docs/benchmarks.md).
DEFAULT_PURGE_BATCH = 250
DEFAULT_RETENTION_IDS = "400d"
#: The longest --pause between purge batches: a longer one is a typo, not pacing.
MAX_PURGE_PAUSE = 60.0

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


class _Totals:
    def __init__(self, records: RetentionRecords, ledger: EffectLedger) -> None:
        self.records, self.ledger = records, ledger
        self.payloads = self.events = self.attempts = self.effects = self.outbox = 0

    def forget(self, ids: Sequence[int]) -> None:
        """Delete the records the ledger keeps outside the main database, once
        their events' deletion committed: a failure then leaves records of
        events that are gone, which nothing reads, never an event without the
        records that stop its effects from running again."""
        self.effects += self.ledger.forget(ids, delete=True)

    def add_children(self, conn: sa.Connection, ids: Sequence[int], *, delete: bool) -> None:
        """Count or delete the rows that belong to these events."""
        if delete:
            rows = self.records.delete_children(conn, ids)
        else:
            # Records kept in a file of their own (SQLite): see forget().
            self.effects += self.ledger.forget(ids, delete=False)
            rows = self.records.count_children(conn, ids)
        self.attempts += rows.attempts
        self.effects += rows.effects
        self.outbox += rows.outbox


def _walk(batch: Callable[[int], list[int]]) -> Iterator[list[int]]:
    """Ids a batch at a time, in id order: `batch(after)` gives those past
    `after`, so each batch starts where the last ended and the whole purge
    reads the table once."""
    after = 0
    while True:
        ids = batch(after)
        if not ids:
            return
        yield ids
        after = ids[-1]


def purge(
    app: Deployment,
    *,
    older_than: timedelta | str | None = None,
    keep_ids: timedelta | str | None = None,
    dry_run: bool = False,
    batch_size: int = DEFAULT_PURGE_BATCH,
    pause: float = 0.0,
) -> PurgeReport:
    """Apply the retention horizons (defaults: the app's ``retention_payloads``
    and ``retention_ids``) and purge expired Idempotency-Key records.

    `pause`: seconds to wait after each batch that changed something. Purging
    1M payloads while receiving 200 deliveries a second on PostgreSQL, 14 ms
    after each batch of 250 doubled the purge's time (115-122 s against
    51-71 s) and brought the receiver's p99 during it from 19-41 ms to 9-13
    ms, in four runs each; its longest stall did not follow
    (docs/benchmarks.md, 2026-12-08).

    Blocking; creates or upgrades the tables first, as every command does.
    """
    payloads_age = (
        duration(older_than, "--older-than")
        if older_than is not None
        else app.settings.retention.payloads
    )
    ids_age = (
        duration(keep_ids, "--keep-ids") if keep_ids is not None else app.settings.retention.ids
    )
    if ids_age < payloads_age:
        raise ConfigurationError(
            f"--keep-ids ({ids_age}) is shorter than --older-than ({payloads_age}): the dedup "
            "memory must outlive the payloads, or a late resend would be taken as new"
        )
    if batch_size < 1:
        raise ConfigurationError("batch size must be at least 1")
    if not 0 <= pause <= MAX_PURGE_PAUSE:
        raise ConfigurationError(f"pause must be between 0 and {MAX_PURGE_PAUSE:g} seconds")
    from .store import migrate_blocking

    migrate_blocking(app.settings.database_url)
    engine = app.engine
    records = RetentionRecords(app.engine_kind)
    now = datetime.now(UTC)
    payload_cutoff, ids_cutoff = now - payloads_age, now - ids_age
    totals = _Totals(records, app.effect_ledger)

    # Rows past the ids horizon first: what is deleted needs no payload drop.
    def expired(after: int) -> list[int]:
        return records.expired(engine, cutoff=ids_cutoff, after=after, n=batch_size)

    for ids in _walk(expired):
        with records.transaction(engine) as conn:
            if dry_run:
                totals.add_children(conn, ids, delete=False)
                totals.events += len(ids)
                continue
            doomed = records.lock_expired(conn, ids, cutoff=ids_cutoff)
            if doomed:
                # Children first, counted; the foreign keys would cascade anyway.
                totals.add_children(conn, doomed, delete=True)
                totals.events += records.delete_events(conn, doomed)
        if doomed:
            totals.forget(doomed)
            _rest(pause)

    # A dry run deletes nothing, so it leaves out here what the ids pass would delete.
    spared = ids_cutoff if dry_run else None

    def old(after: int) -> list[int]:
        return records.old_processed(
            engine, cutoff=payload_cutoff, after=after, n=batch_size, sparing_expired_before=spared
        )

    for ids in _walk(old):
        with records.transaction(engine) as conn:
            if dry_run:
                totals.add_children(conn, ids, delete=False)
                totals.payloads += len(ids)
                continue
            purged = records.drop_payloads(conn, ids, now=now)
            if purged:
                totals.add_children(conn, purged, delete=True)
            totals.payloads += len(purged)
        if purged:
            totals.forget(purged)
            _rest(pause)

    keys = _expired_keys(app, dry_run=dry_run)
    from .guard import Guard

    jobs = Guard(app.settings.database_url, engine=engine).purge(dry_run=dry_run)
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


def _rest(pause: float) -> None:
    """Between two batches, when asked: the wait is outside any transaction,
    so it holds no lock and no connection's snapshot."""
    if pause > 0:
        time.sleep(pause)


def _expired_keys(app: Deployment, *, dry_run: bool) -> int:
    """Count (dry run) or delete expired Idempotency-Key records, with the key
    store's own purge."""
    now = time.time()
    if dry_run:
        return RetentionRecords(app.engine_kind).expired_idempotency_keys(app.engine, now=now)
    from ._threads import run_on_own_loop
    from .store import create_store

    async def work() -> int:
        store = create_store(app.settings.database_url, auto_migrate=False)
        try:
            return await store.idempotency_keys().purge(now=now)
        finally:
            await store.close()

    # purge() is blocking and may be called from code that runs an event loop.
    return run_on_own_loop(work, name="onceonly-purge-keys")
