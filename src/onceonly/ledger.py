"""Where the effect ledger's records live, so that each one is durable before
the handler that made the call goes on.

PostgreSQL: in ``onceonly_effects``, written on a connection of its own that
commits at once, outside the handler's transaction (which may still roll back).

SQLite: the handler's transaction holds the database's only write lock until
its batch commits, so no other connection can write a record into that file
meanwhile. The records live instead in a second SQLite file next to it,
``<database>-effects``, with a lock of its own: a record is committed (WAL,
``synchronous=FULL``) there before ``ctx.effect()`` returns, whatever the
batch size, and the failure mark of an attempt can only come after it. The
file holds one table and no foreign key (SQLite cannot reference another
file); event ids are never reused (``AUTOINCREMENT``), so a record's
``event_pk`` always names one event. Records that an earlier version wrote
into the main file's ``onceonly_effects`` are still read from there.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from .db import create_engine, engine_kind
from .queries import QUERIES
from .store.url import DatabaseURL

__all__ = ["EffectLedger", "effects_url"]

_SQLITE_TABLE = """
    CREATE TABLE IF NOT EXISTS onceonly_effects (
        event_pk INTEGER NOT NULL,
        name TEXT NOT NULL,
        key TEXT NOT NULL UNIQUE,
        outcome TEXT NOT NULL,
        recorded_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
        PRIMARY KEY (event_pk, name)
    )
"""


def effects_url(database_url: str) -> str:
    """The database URL that holds the effect records of `database_url`."""
    return DatabaseURL.parse(database_url).sibling("-effects").url


class EffectLedger:
    """Reads and writes effect records for one deployment (thread-safe)."""

    def __init__(self, database_url: str, engine: sa.Engine) -> None:
        self.kind = engine_kind(database_url)
        self.q = QUERIES[self.kind]
        self._main = engine
        if self.kind == "sqlite":
            self.engine = create_engine(effects_url(database_url))
        else:
            self.engine = engine
        self._ready = self.kind != "sqlite"
        self._legacy: bool | None = None if self.kind == "sqlite" else False
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """Create the records table where it is not a migration's (SQLite's own file)."""
        if self._ready:
            return
        with self._lock:
            if not self._ready:
                with self.engine.begin() as conn:
                    conn.exec_driver_sql(_SQLITE_TABLE)
                self._ready = True

    def find(self, conn: sa.Connection, event_pk: int, name: str) -> str | None:
        """The recorded outcome (JSON) of effect `name` of an event, if any.

        `conn` is the handler's connection: on PostgreSQL the record is read
        there, on SQLite only for records an earlier version wrote into the
        main file (looked for while that table holds any).
        """
        params = {"event_pk": event_pk, "name": name}
        if self.kind != "sqlite":
            return self._scalar(conn, params)
        self.prepare()
        with self.engine.connect() as own:
            found = self._scalar(own, params)
        if found is None and self._has_legacy(conn):
            found = self._scalar(conn, params)
        return found

    def _scalar(self, conn: sa.Connection, params: dict[str, Any]) -> str | None:
        row = conn.execute(sa.text(self.q.find_effect), params).first()
        return None if row is None else str(row[0])

    def _has_legacy(self, conn: sa.Connection) -> bool:
        if self._legacy is None:
            found = conn.exec_driver_sql("SELECT 1 FROM onceonly_effects LIMIT 1").first()
            self._legacy = found is not None
        return self._legacy

    def record(self, event_pk: int, name: str, key: str, outcome: str) -> None:
        """Commit a record now, in a transaction of its own."""
        self.prepare()
        params = {"event_pk": event_pk, "name": name, "key": key, "outcome": outcome}
        with self.engine.begin() as conn:
            conn.execute(sa.text(self.q.record_effect), params)

    def forget(self, event_pks: Sequence[int], *, delete: bool) -> int:
        """Delete (or count) the records of these events kept outside the main
        database (retention); 0 where the records live in the main database."""
        if self.kind != "sqlite" or not event_pks:
            return 0
        self.prepare()
        verb = "DELETE" if delete else "SELECT count(*)"
        statement = sa.text(f"{verb} FROM onceonly_effects WHERE event_pk IN :ids").bindparams(
            sa.bindparam("ids", expanding=True)
        )
        with self.engine.begin() as conn:
            result = conn.execute(statement, {"ids": list(event_pks)})
            return result.rowcount if delete else int(result.scalar_one())

    def dispose(self) -> None:
        if self.engine is not self._main:
            self.engine.dispose()
