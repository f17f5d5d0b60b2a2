"""benchmarks/_prefill.py on a real database of each engine: the table the
cost curve measures holds the ids it says, the pending events where the
worker's check looks for them, and a dedup key that still decides duplicates
after a PostgreSQL fill rebuilt its index. And, against a real server,
benchmarks/_pgio.py, which tells what PostgreSQL did per event, and
receive.count_ids, which checks a run of scattered ids."""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import asyncpg
import pytest

from onceonly import create_store
from onceonly.events import NewEvent

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
ROWS, PENDING = 450, 30


@pytest.fixture
def prefill() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import _prefill

        yield _prefill
    finally:
        sys.path.remove(str(BENCHMARKS))
        for name in ("_prefill", "_harness", "_pgio", "receive"):
            sys.modules.pop(name, None)


def fill_table(prefill: ModuleType, url: str, fill: object) -> None:
    if url.startswith("sqlite:///"):
        prefill.sqlite_fill(url.removeprefix("sqlite:///"), fill)
    else:
        asyncio.run(prefill._pg_fill(url, fill))


def read_rows(url: str) -> list[tuple[int, str, str, bytes]]:
    sql = "SELECT id, event_id, status, body FROM onceonly_events ORDER BY id"
    if url.startswith("sqlite:///"):
        import sqlite3

        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            return [(r[0], r[1], r[2], bytes(r[3])) for r in conn.execute(sql)]
        finally:
            conn.close()

    async def pg() -> list[tuple[int, str, str, bytes]]:
        conn = await asyncpg.connect(url)
        try:
            return [(r[0], r[1], r[2], bytes(r[3])) for r in await conn.fetch(sql)]
        finally:
            await conn.close()

    return asyncio.run(pg())


@pytest.mark.parametrize("ids", ["random", "sequential"])
def test_the_prefill_holds_the_ids_it_says_on_each_engine(
    prefill: ModuleType, database_url: str, ids: str
) -> None:
    fill = prefill.Fill(rows=ROWS, pending=PENDING, ids=ids)
    fill_table(prefill, database_url, fill)
    rows = read_rows(database_url)

    # The same ids on both engines: PostgreSQL's md5() and Python's agree.
    expected = [fill.event_id("prefill", g) for g in range(1, ROWS + 1)]
    expected += [fill.event_id("pending", g) for g in range(1, PENDING + 1)]
    assert [r[1] for r in rows] == expected
    if ids == "random":
        # As long as the numbered ids: the rows take the same room either way.
        numbered = prefill.Fill(rows=ROWS, pending=PENDING)
        expected_lengths = [len(numbered.event_id("prefill", g)) for g in range(1, ROWS + 1)]
        assert [len(r[1]) for r in rows[:ROWS]] == expected_lengths
        # Scattered: in id order, the event ids are far from sorted.
        in_order = sum(a[1] < b[1] for a, b in itertools.pairwise(rows))
        assert in_order < len(rows) * 0.7
    else:
        assert rows[0][1] == "evt_prefill_1"
    # Each body names its own event.
    assert all(json.loads(r[3])["id"] == r[1] for r in rows)
    # The pending events are the last rows, at the ids the worker's check reads.
    first, last = fill.pending_ids
    pending = [r for r in rows if first <= r[0] <= last]
    assert [r[1] for r in pending] == expected[ROWS:]
    assert {r[2] for r in pending} == {"pending"}
    assert "pending" not in {r[2] for r in rows if r[0] < first}


def test_a_prefilled_table_still_tells_duplicates(prefill: ModuleType, database_url: str) -> None:
    """After a fill of scattered ids (on PostgreSQL, with the dedup index built
    after the rows), onceonly's own store refuses a second row for a stored id."""
    fill = prefill.Fill(rows=ROWS, pending=PENDING, ids="random")
    fill_table(prefill, database_url, fill)

    async def insert() -> list[bool]:
        async with create_store(database_url) as store:
            receipts = await store.insert_events(
                [
                    NewEvent("stripe", fill.event_id("prefill", 7), "t", b"{}", {}),
                    NewEvent("stripe", fill.event_id("pending", 3), "t", b"{}", {}),
                    NewEvent("stripe", "evt_new_one", "t", b"{}", {}),
                ]
            )
        return [r.duplicate for r in receipts]

    assert asyncio.run(insert()) == [True, True, False]
    assert len(read_rows(database_url)) == ROWS + PENDING + 1


def test_pgio_counts_what_a_phase_wrote_and_read_per_event(
    prefill: ModuleType, database_url: str
) -> None:
    import _pgio

    if not database_url.startswith("postgresql"):
        assert _pgio.snapshot(database_url) is None
        assert _pgio.between(None, None, 10) is None
        return
    fill_table(prefill, database_url, prefill.Fill(rows=ROWS, ids="random"))

    async def insert(n: int) -> None:
        async with create_store(database_url) as store:
            for i in range(n):  # one commit each
                await store.insert_events([NewEvent("stripe", f"evt_io_{i}", "t", b"{}", {})])

    # (pg_stat_wal is the whole cluster's, which other tests may write to
    # meanwhile: only the table's own counters are asked to stand still.)
    quiet = _pgio.between(_pgio.snapshot(database_url), _pgio.snapshot(database_url), 1)
    assert quiet is not None
    assert sum(quiet.read.values()) + sum(quiet.hit.values()) == 0

    before = _pgio.snapshot(database_url)
    asyncio.run(insert(40))
    phase = _pgio.between(before, _pgio.snapshot(database_url), 40)
    assert phase is not None
    assert phase.wal_bytes is not None
    assert phase.wal_records is not None
    # Each event: its row, an entry in each index, a commit.
    assert phase.wal_records >= 3
    assert phase.wal_bytes > 100
    for part in ("table", "dedup index", "other indexes"):
        assert phase.read[part] + phase.hit[part] > 0, part
    line = phase.describe()
    assert line.startswith("40 events; WAL ")
    assert "dedup index" in line
    blind = _pgio.between(before, _pgio.snapshot(database_url), 40, with_wal=False)
    assert blind is not None
    assert blind.wal_bytes is None
    assert "WAL" not in blind.describe()


def test_rows_of_scattered_ids_are_counted_by_their_lists(
    prefill: ModuleType, database_url: str
) -> None:
    import receive

    ids = [receive.event_id("TAGTAGTA", i, scattered=True) for i in range(30)]
    stored = ids[:12] + ids[20:]  # 10..19 never arrived

    async def insert() -> None:
        async with create_store(database_url) as store:
            await store.insert_events([NewEvent("stripe", i, "t", b"{}", {}) for i in stored])
            await store.insert_events([NewEvent("github", ids[25], "t", b"{}", {})])

    asyncio.run(insert())
    total, per = receive.count_ids(database_url, [ids[:10], ids[10:20], ids[20:], []])
    # Another provider's row with the same id counts in the table, not in a list.
    assert (total, per) == (23, [10, 2, 10, 0])
