"""SQLAlchemy on a driver connection someone else owns: it runs statements in
the owner's transaction and never ends that transaction or the connection."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from onceonly.store.borrowed import BorrowedConnections
from onceonly.store.url import DatabaseURL


@pytest.fixture
def owned(engine: str, database_url: str) -> Iterator[Any]:
    """The owner's connection, in autocommit mode, with a table of its own."""
    connection: Any
    if engine == "sqlite":
        connection = sqlite3.connect(DatabaseURL.parse(database_url).path, isolation_level=None)
    else:
        connection = psycopg.connect(DatabaseURL.parse(database_url).postgres_dsn, autocommit=True)
    connection.execute("CREATE TABLE owned (n INTEGER)")
    yield connection
    connection.close()


def _count(connection: Any) -> int:
    return int(connection.execute("SELECT count(*) FROM owned").fetchone()[0])


def test_the_owners_transaction_decides_and_the_connection_lives_on(
    engine: str, owned: Any
) -> None:
    borrowed = BorrowedConnections(engine)
    owned.execute("BEGIN")
    with borrowed.lend(owned) as conn:
        conn.execute(sa.text("INSERT INTO owned (n) VALUES (1)"))
        conn.commit()  # SQLAlchemy's commit ends nothing of the owner's
    with borrowed.lend(owned) as conn:
        conn.execute(sa.text("INSERT INTO owned (n) VALUES (2)"))
        # Leaving the block rolls back SQLAlchemy's transaction: not the owner's.
    assert _count(owned) == 2
    owned.execute("ROLLBACK")
    assert _count(owned) == 0  # both were in the owner's transaction all along
    owned.execute("BEGIN")
    with borrowed.lend(owned) as conn:
        conn.execute(sa.text("INSERT INTO owned (n) VALUES (3)"))
    owned.execute("COMMIT")
    assert _count(owned) == 1


def test_savepoints_work_on_a_borrowed_connection(engine: str, owned: Any) -> None:
    borrowed = BorrowedConnections(engine)
    owned.execute("BEGIN")
    with borrowed.lend(owned) as conn:
        conn.execute(sa.text("INSERT INTO owned (n) VALUES (1)"))
        nested = conn.begin_nested()
        conn.execute(sa.text("INSERT INTO owned (n) VALUES (2)"))
        nested.rollback()
    owned.execute("COMMIT")
    assert _count(owned) == 1


def test_nothing_is_lent_outside_a_block(engine: str) -> None:
    borrowed = BorrowedConnections(engine)
    with pytest.raises(RuntimeError, match="no connection is lent"):
        borrowed.engine.connect()
