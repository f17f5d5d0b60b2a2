"""Reads on SQLite leave the write lock to the writers.

The worker's engine opens every transaction with ``BEGIN IMMEDIATE`` (the
write lock, taken up front). A read opened that way holds the lock for as long
as it takes: the purge's scan for old events on a table of a million rows held
it for half a second, and every delivery waited. ``reading()`` connections
begin a plain transaction instead, which WAL lets run beside the writer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from onceonly.store import migrate_blocking
from onceonly.store.engine import create_engine, reading


def another_process_takes_the_write_lock(path: Path) -> bool:
    """Another process gets SQLite's write lock at once (no waiting allowed)."""
    script = (
        "import sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE'); c.execute('ROLLBACK')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=30
    )
    return result.returncode == 0


def test_a_read_in_progress_leaves_the_write_lock_free(tmp_path: Path) -> None:
    path = tmp_path / "onceonly.db"
    url = f"sqlite:///{path}"
    migrate_blocking(url)
    engine = create_engine(url, pool_size=2)
    try:
        with reading(engine) as conn:
            conn.execute(sa.text("SELECT count(*) FROM onceonly_events")).scalar_one()
            # Mid-transaction: the read's snapshot is open.
            assert conn.in_transaction()
            assert another_process_takes_the_write_lock(path)
        # The contrast: the engine's ordinary transactions do hold it.
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT count(*) FROM onceonly_events")).scalar_one()
            assert not another_process_takes_the_write_lock(path)
    finally:
        engine.dispose()


def test_a_reading_connection_sees_what_was_committed_before_it_read(tmp_path: Path) -> None:
    path = tmp_path / "onceonly.db"
    url = f"sqlite:///{path}"
    migrate_blocking(url)
    engine = create_engine(url, pool_size=2)
    insert = sa.text(
        "INSERT INTO onceonly_events (provider, event_id, body, headers)"
        " VALUES ('stripe', :id, x'', '{}')"
    )
    count = sa.text("SELECT count(*) FROM onceonly_events")
    try:
        with engine.begin() as conn:
            conn.execute(insert, {"id": "evt_1"})
        with reading(engine) as conn:
            assert conn.execute(count).scalar_one() == 1
        with engine.begin() as conn:
            conn.execute(insert, {"id": "evt_2"})
        with reading(engine) as conn:
            assert conn.execute(count).scalar_one() == 2
    finally:
        engine.dispose()
