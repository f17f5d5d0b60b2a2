"""The effect ledger's records: one per (event, effect name), read back on a
retry instead of calling again (see :mod:`onceonly.ledger` for where they live
and why).

On PostgreSQL the records are in the main database's ``onceonly_effects``,
created by the migrations. On SQLite they are in a file of their own next to
the main one, whose single table this repository creates (the migrations
only know the main file); records an earlier version wrote into the main
file's ``onceonly_effects`` are still found there.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import sqlalchemy as sa

from .errors import translated

__all__ = ["EffectRecords"]


@dataclass(frozen=True, slots=True)
class _Statements:
    find: str
    #: A second record of the same (event, name) or key changes nothing: the
    #: first outcome is the one a retry must get back.
    record: str
    #: Whether the main database holds any record (written by an earlier
    #: version on SQLite): only then is it looked into.
    any_record: str
    forget: sa.TextClause
    count: sa.TextClause
    #: The table of a file of its own (SQLite), or None where a migration makes it.
    table: str | None


def _by_event(verb: str) -> sa.TextClause:
    return sa.text(f"{verb} FROM onceonly_effects WHERE event_pk IN :ids").bindparams(
        sa.bindparam("ids", expanding=True)
    )


_POSTGRES = _Statements(
    find="SELECT outcome FROM onceonly_effects WHERE event_pk = :event_pk AND name = :name",
    record="""
        INSERT INTO onceonly_effects (event_pk, name, key, outcome)
        VALUES (:event_pk, :name, :key, :outcome) ON CONFLICT DO NOTHING
    """,
    any_record="SELECT 1 FROM onceonly_effects LIMIT 1",
    forget=_by_event("DELETE"),
    count=_by_event("SELECT count(*)"),
    table=None,
)

# No foreign key: SQLite cannot reference a table in another file. Event ids
# are never reused (AUTOINCREMENT), so event_pk still names one event.
_SQLITE = _Statements(
    find=_POSTGRES.find,
    record=_POSTGRES.record,
    any_record=_POSTGRES.any_record,
    forget=_POSTGRES.forget,
    count=_POSTGRES.count,
    table="""
        CREATE TABLE IF NOT EXISTS onceonly_effects (
            event_pk INTEGER NOT NULL,
            name TEXT NOT NULL,
            key TEXT NOT NULL UNIQUE,
            outcome TEXT NOT NULL,
            recorded_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
            PRIMARY KEY (event_pk, name)
        )
    """,
)

_STATEMENTS = {"postgresql": _POSTGRES, "sqlite": _SQLITE}


class EffectRecords:
    """The effect ledger's statements for one engine (stateless, thread-safe)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._s = _STATEMENTS[kind]

    @property
    def separate_file(self) -> bool:
        """Whether the records live in a database of their own (SQLite), not
        in the main one next to the events."""
        return self._s.table is not None

    def create_table(self, engine: sa.Engine) -> None:
        """Create the records table of a separate file (nothing to do elsewhere)."""
        if self._s.table is None:
            return
        with translated("creating the effect records table"), engine.begin() as conn:
            conn.exec_driver_sql(self._s.table)

    def find(self, on: sa.Connection | sa.Engine, event_pk: int, name: str) -> str | None:
        """The recorded outcome (JSON) of effect `name` of an event, if any.

        `on` is the handler's connection (its transaction reads the record), or
        the engine of the separate file, read on a connection of its own.
        """
        params = {"event_pk": event_pk, "name": name}
        with translated("reading an effect record"), _connected(on) as conn:
            row = conn.execute(sa.text(self._s.find), params).first()
        return None if row is None else str(row.outcome)

    def any_record(self, conn: sa.Connection) -> bool:
        """Whether the database of `conn` holds any effect record at all."""
        with translated("looking for effect records"):
            return conn.exec_driver_sql(self._s.any_record).first() is not None

    def record(self, engine: sa.Engine, event_pk: int, name: str, key: str, outcome: str) -> None:
        """Commit a record now, in a transaction of its own."""
        params = {"event_pk": event_pk, "name": name, "key": key, "outcome": outcome}
        with translated("recording an effect"), engine.begin() as conn:
            conn.execute(sa.text(self._s.record), params)

    def forget(self, engine: sa.Engine, event_pks: Sequence[int], *, delete: bool) -> int:
        """Delete (or only count) the records of these events; how many."""
        if not event_pks:
            return 0
        statement = self._s.forget if delete else self._s.count
        what = "deleting effect records" if delete else "counting effect records"
        with translated(what), engine.begin() as conn:
            result = conn.execute(statement, {"ids": list(event_pks)})
            return result.rowcount if delete else int(result.scalar_one())


@contextmanager
def _connected(on: sa.Connection | sa.Engine) -> Iterator[sa.Connection]:
    if isinstance(on, sa.Connection):
        yield on
    else:
        with on.connect() as conn:
            yield conn
