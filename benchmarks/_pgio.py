"""What PostgreSQL did for the events of one benchmark phase: its write-ahead
log and the pages it had to bring into shared buffers, per event.

Two snapshots of the server's cumulative statistics, before and after a
phase, read with a connection of their own:

- ``pg_stat_wal``: records, full-page images and bytes written to the log by
  the whole cluster (so nothing else may write meanwhile: the benchmarks run
  alone). A full-page image is the first change to a page after a
  checkpoint, written whole (8 kB) rather than as the change.
- ``pg_statio_user_tables`` / ``pg_statio_user_indexes`` for the events
  table and each of its indexes: blocks read into shared buffers (a miss:
  from the kernel's page cache, or the disk) and blocks found there.

A backend reports its statistics when its transaction ends, at most once a
second, and always when it exits: take the second snapshot once the phase's
connections are closed (an engine disposed, a server stopped), or some of
its work is missing. A snapshot first waits (up to 5 s) for the database's
other client connections to be gone: a backend leaves pg_stat_activity
after it has reported.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

TABLE = "onceonly_events"
#: The dedup key's index, named as its constraint (as onceonly's migrations
#: name it on PostgreSQL): an event's place in it is set by its id.
DEDUP_INDEX = "onceonly_events_provider_tenant_event_id_key"

_OTHERS = """
    SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
    AND pid <> pg_backend_pid() AND backend_type = 'client backend'
"""
_WAL = "SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal"
_BLOCKS = f"""
    SELECT 'table' AS name, coalesce(heap_blks_read, 0) AS read, coalesce(heap_blks_hit, 0) AS hit
    FROM pg_statio_user_tables WHERE relname = '{TABLE}'
    UNION ALL
    SELECT indexrelname, coalesce(idx_blks_read, 0), coalesce(idx_blks_hit, 0)
    FROM pg_statio_user_indexes WHERE relname = '{TABLE}'
"""


@dataclass(frozen=True)
class Counters:
    wal_records: int
    wal_fpi: int
    wal_bytes: int
    #: Blocks read into shared buffers and blocks found there, by relation:
    #: "table" for the events table's heap, else the index's name.
    read: dict[str, int]
    hit: dict[str, int]


async def _snapshot(url: str) -> Counters:
    import asyncpg

    conn = await asyncpg.connect(url, timeout=10)
    try:
        deadline = time.monotonic() + 5.0
        while await conn.fetchval(_OTHERS) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        wal = await conn.fetchrow(_WAL)
        blocks = await conn.fetch(_BLOCKS)
    finally:
        await conn.close()
    assert wal is not None  # pg_stat_wal has one row
    return Counters(
        int(wal["wal_records"]),
        int(wal["wal_fpi"]),
        int(wal["wal_bytes"]),
        {r["name"]: int(r["read"]) for r in blocks},
        {r["name"]: int(r["hit"]) for r in blocks},
    )


def snapshot(url: str) -> Counters | None:
    """The counters now, or ``None`` off PostgreSQL."""
    if not url.startswith("postgresql"):
        return None
    return asyncio.run(_snapshot(url))


@dataclass
class PhaseIo:
    """A phase's work, per event."""

    events: int
    #: Per event; ``None`` where the phase's WAL is not this module's to tell
    #: (another writer in the window).
    wal_bytes: float | None
    wal_records: float | None
    wal_fpi: float | None
    #: Blocks read into shared buffers per event: the heap ("table"), the
    #: dedup index, and every other index together ("other indexes").
    read: dict[str, float] = field(default_factory=dict)
    hit: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        parts = []
        if self.wal_bytes is not None:
            parts.append(
                f"WAL {self.wal_bytes / 1000:.2f} kB per event ({self.wal_records:.1f} records, "
                f"{self.wal_fpi:.2f} full-page images)"
            )
        pages = ", ".join(
            f"{name} {self.read.get(name, 0.0):.2f} read / {self.hit.get(name, 0.0):.1f} hit"
            for name in ("table", "dedup index", "other indexes")
        )
        parts.append(f"pages per event, read into shared buffers / found there: {pages}")
        return f"{self.events:,} events; " + "; ".join(parts)


def _group(counts: dict[str, int]) -> dict[str, int]:
    grouped = {"table": 0, "dedup index": 0, "other indexes": 0}
    for name, n in counts.items():
        key = name if name == "table" else "dedup index" if name == DEDUP_INDEX else "other indexes"
        grouped[key] += n
    return grouped


def between(
    before: Counters | None, after: Counters | None, events: int, *, with_wal: bool = True
) -> PhaseIo | None:
    """What happened from `before` to `after`, per one of `events` (``None``
    off PostgreSQL, where the snapshots are)."""
    if before is None or after is None:
        return None
    n = max(1, events)

    def per(a: int, b: int) -> float:
        return (b - a) / n

    read_a, read_b = _group(before.read), _group(after.read)
    hit_a, hit_b = _group(before.hit), _group(after.hit)
    return PhaseIo(
        events,
        per(before.wal_bytes, after.wal_bytes) if with_wal else None,
        per(before.wal_records, after.wal_records) if with_wal else None,
        per(before.wal_fpi, after.wal_fpi) if with_wal else None,
        {k: round(per(read_a[k], read_b[k]), 3) for k in read_b},
        {k: round(per(hit_a[k], hit_b[k]), 3) for k in hit_b},
    )
