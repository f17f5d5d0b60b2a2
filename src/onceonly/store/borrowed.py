"""SQLAlchemy connections on DB-API connections that someone else owns.

A web framework (Django) opens, commits and closes its own driver connections.
For a handler's ORM writes and the ``processed`` mark to commit together, the
worker's statements must run on that very connection, inside the framework's
transaction. :class:`BorrowedConnections` wraps such a connection in a
SQLAlchemy :class:`~sqlalchemy.Connection` for the length of a block: the
repositories run on it as on their own, savepoints included, but SQLAlchemy
can neither commit, roll back nor close it (those calls do nothing), so the
owner's transaction decides and the owner's connection lives on.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

__all__ = ["BorrowedConnections"]

_DIALECTS = {"sqlite": "sqlite+pysqlite://", "postgresql": "postgresql+psycopg://"}
# The hstore look-up at first connect wants psycopg's own class, not the
# stand-in below; onceonly's tables have no hstore column.
_OPTIONS: dict[str, dict[str, Any]] = {"sqlite": {}, "postgresql": {"use_native_hstore": False}}


class _Lent:
    """The owner's DB-API connection, as SQLAlchemy's pool sees it."""

    __slots__ = ("_connection",)

    def __init__(self, connection: Any) -> None:
        object.__setattr__(self, "_connection", connection)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._connection, name, value)

    # The owner's to decide: SQLAlchemy ends its own bookkeeping of the
    # transaction with these, never the owner's transaction.
    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        pass

    def add_notice_handler(self, handler: Any) -> None:
        # psycopg's dialect adds one per new pool connection; lent again and
        # again, the owner's connection would collect them.
        pass


class BorrowedConnections:
    """SQLAlchemy connections, one block at a time, on lent driver connections
    (psycopg for PostgreSQL, sqlite3 for SQLite)."""

    def __init__(self, kind: str) -> None:
        if kind not in _DIALECTS:
            raise ValueError(f"no dialect for {kind!r}")
        self.kind = kind
        self._lent = threading.local()
        self.engine = sa.create_engine(
            _DIALECTS[kind],
            creator=self._current,
            # One SQLAlchemy connection per block, gone after it: the driver
            # connection is the owner's, and it may be a new one next time.
            poolclass=sa.pool.NullPool,
            pool_reset_on_return=None,
            **_OPTIONS[kind],
        )

    def _current(self) -> Any:
        connection = getattr(self._lent, "connection", None)
        if connection is None:
            raise RuntimeError("no connection is lent on this thread")
        return _Lent(connection)

    @contextmanager
    def lend(self, dbapi_connection: Any) -> Iterator[sa.Connection]:
        """`dbapi_connection` as a SQLAlchemy connection for the block; the
        transaction around it is the owner's (open it before, end it after)."""
        self._lent.connection = dbapi_connection
        try:
            with self.engine.connect() as connection:
                yield connection
        finally:
            self._lent.connection = None
