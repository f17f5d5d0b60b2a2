"""Effect records of keyed tasks: one per (job key, effect name), read back when
a task is run again after a crash instead of calling again (see
:mod:`onceonly.tasks`).

PostgreSQL: in ``onceonly_job_effects`` of the main database (migration 8),
written on a connection of their own that commits at once, outside the task's
transaction; a record goes with its key when the job row is deleted.

SQLite: a task's transaction holds the main file's only write lock until it
commits, so the records live in the ``<database>-effects`` file next to it (the
one the event ledger uses, see :mod:`onceonly.ledger`), in a table this
repository creates there.

Once a task is marked done its records are deleted: a repeat returns the
recorded result and never reads them, and a key that is forgotten and run
again must make its calls again.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from .engine import reading
from .errors import translated

__all__ = ["JobEffectRecords"]


@dataclass(frozen=True, slots=True)
class _Statements:
    find: str
    #: A second record of the same (job, name) changes nothing: the first
    #: outcome is the one a later run must get back.
    record: str
    forget: str
    #: The table of a file of its own (SQLite), or None where a migration makes it.
    table: str | None


_POSTGRES = _Statements(
    find="SELECT outcome FROM onceonly_job_effects WHERE job_key = :job_key AND name = :name",
    record="""
        INSERT INTO onceonly_job_effects (job_key, name, key, outcome)
        VALUES (:job_key, :name, :key, :outcome) ON CONFLICT DO NOTHING
    """,
    forget="DELETE FROM onceonly_job_effects WHERE job_key = :job_key",
    table=None,
)

# No foreign key: SQLite cannot reference a table in another file.
_SQLITE = _Statements(
    find=_POSTGRES.find,
    record=_POSTGRES.record,
    forget=_POSTGRES.forget,
    table="""
        CREATE TABLE IF NOT EXISTS onceonly_job_effects (
            job_key TEXT NOT NULL,
            name TEXT NOT NULL,
            key TEXT NOT NULL UNIQUE,
            outcome TEXT NOT NULL,
            recorded_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
            PRIMARY KEY (job_key, name)
        )
    """,
)

_STATEMENTS = {"postgresql": _POSTGRES, "sqlite": _SQLITE}


class JobEffectRecords:
    """The keyed tasks' effect statements for one engine (stateless, thread-safe)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._s = _STATEMENTS[kind]

    @property
    def separate_file(self) -> bool:
        """Whether the records live in a database of their own (SQLite)."""
        return self._s.table is not None

    def create_table(self, engine: sa.Engine) -> None:
        """Create the records table of a separate file (nothing to do elsewhere)."""
        if self._s.table is None:
            return
        with translated("creating the task effect records table"), engine.begin() as conn:
            conn.exec_driver_sql(self._s.table)

    def find(self, engine: sa.Engine, job_key: str, name: str) -> str | None:
        """The recorded outcome (JSON) of effect `name` of a task, if any."""
        params = {"job_key": job_key, "name": name}
        with translated("reading a task effect record"), reading(engine) as conn:
            row = conn.execute(sa.text(self._s.find), params).first()
        return None if row is None else str(row.outcome)

    def record(self, engine: sa.Engine, job_key: str, name: str, key: str, outcome: str) -> None:
        """Commit a record now, in a transaction of its own."""
        params = {"job_key": job_key, "name": name, "key": key, "outcome": outcome}
        with translated("recording a task effect"), engine.begin() as conn:
            conn.execute(sa.text(self._s.record), params)

    def forget(self, on: sa.Connection | sa.Engine, job_key: str) -> int:
        """Delete the records of a task; how many. `on` is the transaction that
        marks it done (PostgreSQL), or the separate file's engine (SQLite)."""
        params = {"job_key": job_key}
        with translated("deleting task effect records"):
            if isinstance(on, sa.Connection):
                return on.execute(sa.text(self._s.forget), params).rowcount
            with on.begin() as conn:
                return conn.execute(sa.text(self._s.forget), params).rowcount
