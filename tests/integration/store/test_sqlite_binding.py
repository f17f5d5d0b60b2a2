"""How onceonly's SQLite connections bind ``bytes`` and ``None``.

sqlite3 sends every value that is not an int, float, str or bytearray to its
adapter registry, and looks for ``__adapt__`` and ``__conform__`` when the
registry has nothing for its type: bodies and NULLs paid two failed attribute
lookups each. onceonly registers an adapter that returns the value as it is
(onceonly.store.sqlite). These tests hold what that must not change: what is
stored, and an adapter the application registered itself.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from onceonly import NewEvent, create_store
from onceonly.store.sqlite import connect

BODY = bytes(range(256)) * 3  # every byte value, NUL and invalid UTF-8 included


def test_bytes_and_none_are_stored_as_a_blob_and_a_null(tmp_path: Path) -> None:
    conn = connect(str(tmp_path / "bind.db"), 1000)
    try:
        conn.execute("CREATE TABLE t (body, absent)")
        conn.execute("INSERT INTO t VALUES (?, ?)", (BODY, None))
        row = conn.execute("SELECT body, typeof(body), absent, typeof(absent) FROM t").fetchone()
    finally:
        conn.close()
    assert row == (BODY, "blob", None, "null")


async def test_a_delivery_body_comes_back_byte_for_byte(tmp_path: Path) -> None:
    async with create_store(f"sqlite:///{tmp_path / 'events.db'}") as store:
        event = NewEvent("stripe", "evt_bytes", None, BODY, {"stripe-signature": "t=1"})
        (receipt,) = await store.insert_events([event])
        stored = await store.find_event("stripe", "evt_bytes")
    assert not receipt.duplicate
    assert stored is not None
    assert stored.body == BODY
    assert stored.event_type is None


def test_an_adapter_the_application_registered_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onceonly adds its adapter only where the registry has none: an
    application that adapts bytes its own way keeps doing so."""

    def reversed_bytes(value: bytes) -> bytes:
        return value[::-1]

    key: tuple[type[Any], type[Any]] = (bytes, sqlite3.PrepareProtocol)
    monkeypatch.setitem(sqlite3.adapters, key, reversed_bytes)
    conn = connect(str(tmp_path / "theirs.db"), 1000)
    try:
        conn.execute("CREATE TABLE t (body)")
        conn.execute("INSERT INTO t VALUES (?)", (b"abc",))
        (stored,) = conn.execute("SELECT body FROM t").fetchone()
    finally:
        conn.close()
    assert stored == b"cba"
    assert sqlite3.adapters[key] is reversed_bytes
