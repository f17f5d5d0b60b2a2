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

The statements, and that file's table, are in :mod:`onceonly.store.effects`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .db import create_engine, engine_kind
from .store.effects import EffectRecords
from .store.url import DatabaseURL

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = ["EffectLedger", "effects_url"]


def effects_url(database_url: str) -> str:
    """The database URL that holds the effect records of `database_url`."""
    return DatabaseURL.parse(database_url).sibling("-effects").url


class EffectLedger:
    """Reads and writes effect records for one deployment (thread-safe).

    The SQL is :class:`~onceonly.store.effects.EffectRecords`'; this class
    decides which database each record is read from and written to. Errors
    leave it as :class:`~onceonly.StoreError`.
    """

    def __init__(self, database_url: str, engine: sa.Engine) -> None:
        self.kind = engine_kind(database_url)
        self.records = EffectRecords(self.kind)
        self._main = engine
        separate = self.records.separate_file
        self.engine = create_engine(effects_url(database_url)) if separate else engine
        self._ready = not separate
        # Whether the main database holds records of an earlier version: only
        # a separate file can leave some behind, and once none are there, none
        # appear (nothing writes them any more).
        self._legacy: bool | None = None if separate else False
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """Create the records table where it is not a migration's (SQLite's own file)."""
        if self._ready:
            return
        with self._lock:
            if not self._ready:
                self.records.create_table(self.engine)
                self._ready = True

    def find(self, conn: sa.Connection, event_pk: int, name: str) -> str | None:
        """The recorded outcome (JSON) of effect `name` of an event, if any.

        `conn` is the handler's connection: where the records live in the main
        database the record is read there; with a separate file, only for
        records an earlier version wrote into the main file (looked for while
        that table holds any).
        """
        if not self.records.separate_file:
            return self.records.find(conn, event_pk, name)
        self.prepare()
        found = self.records.find(self.engine, event_pk, name)
        if found is None and self._has_legacy(conn):
            found = self.records.find(conn, event_pk, name)
        return found

    def _has_legacy(self, conn: sa.Connection) -> bool:
        if self._legacy is None:
            self._legacy = self.records.any_record(conn)
        return self._legacy

    def record(self, event_pk: int, name: str, key: str, outcome: str) -> None:
        """Commit a record now, in a transaction of its own."""
        self.prepare()
        self.records.record(self.engine, event_pk, name, key, outcome)

    def forget(self, event_pks: Sequence[int], *, delete: bool) -> int:
        """Delete (or count) the records of these events kept outside the main
        database (retention); 0 where the records live in the main database."""
        if not self.records.separate_file or not event_pks:
            return 0
        self.prepare()
        return self.records.forget(self.engine, event_pks, delete=delete)

    def dispose(self) -> None:
        if self.engine is not self._main:
            self.engine.dispose()
