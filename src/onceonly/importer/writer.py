"""Writing a batch: one upsert, the database deciding what is new, what
changed and what stays as it is.

Every batch is ``INSERT ... ON CONFLICT (key) DO UPDATE SET ... WHERE (the
existing row) IS DISTINCT FROM (the new values)``: never a SELECT to decide
what to write, so two imports at once cannot both "see" a customer missing.
A row whose values did not change is left alone: no new row version, no
UPDATE trigger, no ``updated_at`` bumped by one.

The counts come from the database too:

- PostgreSQL: the batch is copied (``COPY``) into a temporary table, then one
  ``INSERT ... SELECT ... RETURNING (xmax = 0)``: true for a row it inserted,
  false for one it updated; a row it left alone is not returned at all (nor
  locked: see `PostgresWriter._unless_identical`).
- SQLite: one prepared upsert run over the batch (``executemany``); SQLite's
  change count is inserted + updated, and a temporary trigger on the target
  table, private to this connection, counts the inserts.

A batch is its own transaction (or, when the whole import is one
transaction, a savepoint in it). If the database refuses it (a CHECK or
foreign key, another unique constraint, a value the column type refuses), the
batch is rolled back and written again one row at a time, each in its own
savepoint, so only the refused rows are left out, each with the database's own
reason.

This module is the importer's edge with the drivers (psycopg, sqlite3): their
errors become onceonly's here.
"""

from __future__ import annotations

import secrets
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import errors as pg_errors

from .._exceptions import StoreError, StoreUnavailable
from .columns import Plan

__all__ = ["BatchResult", "Writer", "copy_line", "make_writer"]

Row = Sequence[object]


class Outcome(Enum):
    INSERTED = "inserted"
    UPDATED = "updated"
    UNCHANGED = "unchanged"


@dataclass
class BatchResult:
    """What one batch did. `rejected` holds (index in the batch, reason);
    `stopped_at` is the index of the row at which the rejections went over
    what was allowed (that row and the ones after it were not written)."""

    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)
    stopped_at: int | None = None

    def count(self, outcome: Outcome) -> None:
        if outcome is Outcome.INSERTED:
            self.inserted += 1
        elif outcome is Outcome.UPDATED:
            self.updated += 1
        else:
            self.unchanged += 1


class Writer(ABC):
    """Upserts batches into the plan's table over one DBAPI connection.

    Life cycle: :meth:`open`, then :meth:`write` and :meth:`commit` as often as
    needed (a transaction starts with the next write after a commit), then
    :meth:`close`, which rolls back whatever was not committed.
    """

    # Errors that belong to a row (its values), not to the connection.
    row_errors: tuple[type[Exception], ...] = ()
    # Whether batches come with their rows as COPY text (see copy_line), and
    # whether writing them in a thread of their own pays.
    wants_copy_text = False
    threaded = False

    def __init__(
        self,
        connection: Any,
        plan: Plan,
        quote: Callable[[str], str],
        *,
        commit_every_batch: bool = True,
    ) -> None:
        self.connection = connection
        # With a commit after every batch, a refused batch is simply rolled
        # back; in one long transaction it needs a savepoint.
        self.savepoints = not commit_every_batch
        self.plan = plan
        self.q = quote
        table = plan.table
        self.table = (quote(table.schema) + "." if table.schema else "") + quote(table.name)
        self.columns = ", ".join(quote(c) for c in plan.column_names)
        self.key = ", ".join(quote(k) for k in plan.key)
        self.others = [c for c in plan.column_names if c not in plan.key]

    def _on_conflict(self, existing: str, compare: Callable[[str], str]) -> str:
        if not self.others:
            return f"ON CONFLICT ({self.key}) DO NOTHING"
        sets = ", ".join(f"{self.q(c)} = excluded.{self.q(c)}" for c in self.others)
        old = ", ".join(compare(f"{existing}.{self.q(c)}") for c in self.others)
        new = ", ".join(compare(f"excluded.{self.q(c)}") for c in self.others)
        return (
            f"ON CONFLICT ({self.key}) DO UPDATE SET {sets} WHERE ({old}) {self.distinct} ({new})"
        )

    distinct = "IS DISTINCT FROM"

    # -- the driver-specific part --------------------------------------------------

    @abstractmethod
    def _setup(self) -> None: ...

    @abstractmethod
    def _teardown(self) -> None: ...

    @abstractmethod
    def _execute(self, sql: str) -> None: ...

    @abstractmethod
    def _write_batch(self, rows: Sequence[Row], copy_text: str | None) -> BatchResult:
        """Write the batch (opening the savepoint first when savepoints are on)."""

    @abstractmethod
    def _write_one(self, row: Row) -> Outcome: ...

    @abstractmethod
    def _reason(self, exc: Exception) -> str: ...

    # -- shared ------------------------------------------------------------------

    def _translated(self, exc: Exception) -> Exception:
        message = str(exc).strip()
        if isinstance(exc, psycopg.OperationalError) or (
            isinstance(exc, sqlite3.OperationalError)
            and any(word in message for word in ("locked", "unable to open", "disk I/O"))
        ):
            return StoreUnavailable(message)
        return StoreError(f"{type(exc).__name__}: {message}")

    def open(self) -> None:
        """Prepare the connection (temporary objects this import needs)."""
        try:
            self._setup()
        except (sqlite3.Error, psycopg.Error) as exc:
            raise self._translated(exc) from exc

    def write(
        self,
        rows: Sequence[Row],
        allowed: int,
        skipped_before: Sequence[int] | None = None,
        copy_text: str | None = None,
    ) -> BatchResult:
        """Upsert `rows` (values in plan column order, keys unique within the
        batch; `copy_text` the same rows as COPY text, when the writer wants it).

        Rows the database refuses are left out, as long as the rejections stay
        within `allowed`; `skipped_before[i]` counts rows rejected before
        they got here that come before row i in the file (they count too).
        Once the count goes over, the batch stops there (`stopped_at`)."""
        try:
            self._begin()
            try:
                result = self._write_batch(rows, copy_text)
            except self.row_errors:
                self._undo_batch()
                return self._write_rows(rows, allowed, skipped_before)
            if self.savepoints:
                self._execute("RELEASE SAVEPOINT onceonly_batch")
            return result
        except (sqlite3.Error, psycopg.Error) as exc:
            raise self._translated(exc) from exc

    def _undo_batch(self) -> None:
        if self.savepoints:
            self._execute("ROLLBACK TO SAVEPOINT onceonly_batch")
            self._execute("RELEASE SAVEPOINT onceonly_batch")
        else:
            self._rollback()
            self._begin()

    def _begin(self) -> None:  # noqa: B027  # most drivers begin by themselves
        """Start a transaction where the driver does not do it by itself."""

    def _write_rows(
        self, rows: Sequence[Row], allowed: int, skipped_before: Sequence[int] | None
    ) -> BatchResult:
        result = BatchResult()
        for i, row in enumerate(rows):
            earlier = len(result.rejected) + (skipped_before[i] if skipped_before else 0)
            if earlier > allowed:
                result.stopped_at = i
                break
            self._execute("SAVEPOINT onceonly_row")
            try:
                outcome = self._write_one(row)
            except self.row_errors as exc:
                self._execute("ROLLBACK TO SAVEPOINT onceonly_row")
                self._execute("RELEASE SAVEPOINT onceonly_row")
                result.rejected.append((i, self._reason(exc)))
                if earlier + 1 > allowed:
                    result.stopped_at = i
                    break
                continue
            self._execute("RELEASE SAVEPOINT onceonly_row")
            result.count(outcome)
        return result

    def commit(self) -> None:
        try:
            self._commit()
        except (sqlite3.Error, psycopg.Error) as exc:
            raise self._translated(exc) from exc

    def rollback(self) -> None:
        try:
            self._rollback()
        except (sqlite3.Error, psycopg.Error) as exc:
            raise self._translated(exc) from exc

    @abstractmethod
    def _commit(self) -> None: ...

    @abstractmethod
    def _rollback(self) -> None: ...

    def close(self) -> None:
        """Roll back what was not committed and drop the temporary objects."""
        try:
            self._rollback()
            self._teardown()
        except (sqlite3.Error, psycopg.Error):
            pass  # the connection is going away; the pool discards a broken one


class PostgresWriter(Writer):
    row_errors = (pg_errors.DataError, pg_errors.IntegrityError, pg_errors.CardinalityViolation)
    wants_copy_text = True
    # The database works while the next batch is parsed: psycopg waits on the
    # socket without the GIL, and COPY text arrives ready-made (copy_line).
    threaded = True

    def __init__(
        self,
        connection: psycopg.Connection[Any],
        plan: Plan,
        quote: Callable[[str], str],
        *,
        commit_every_batch: bool = True,
    ) -> None:
        super().__init__(connection, plan, quote, commit_every_batch=commit_every_batch)
        self.stage = quote(f"onceonly_import_{secrets.token_hex(4)}")
        json_columns = {
            quote(c.column)
            for c in plan.columns
            if isinstance(plan.table.columns[c.column].type, sa.JSON)
            and type(plan.table.columns[c.column].type).__name__ != "JSONB"
        }

        def compare(expression: str) -> str:
            # json (unlike jsonb) has no equality operator: compare its text.
            if expression.rpartition(".")[2] in json_columns:
                return f"{expression}::text"
            return expression

        conflict = self._on_conflict("existing", compare)
        head = f"INSERT INTO {self.table} AS existing ({self.columns})"
        self.from_stage = (
            f"{head} SELECT {self.columns} FROM {self.stage} AS incoming"
            f"{self._unless_identical(compare)} {conflict} RETURNING (xmax = 0)"
        )
        marks = ", ".join(["%s"] * len(plan.columns))
        self.one = f"{head} VALUES ({marks}) {conflict} RETURNING (xmax = 0)"
        self.cursor = connection.cursor()

    def _unless_identical(self, compare: Callable[[str], str]) -> str:
        """A filter that drops the rows the table already holds as they are.

        ON CONFLICT DO UPDATE ... WHERE leaves such a row's values alone, but
        still locks it: a write to the row's header and a WAL record per row
        (measured: 11 to 30 MB of WAL for 200,000 unchanged rows, against 9 kB
        with this filter), all of it replicated, for nothing. The filter only
        reads, through the key's unique index; every row it lets through is
        still judged by ON CONFLICT. A row changed by someone else between the
        two is simply ordered after this import, as if it came later."""
        if not self.others:
            return ""  # DO NOTHING takes no lock
        q = self.q
        same = ", ".join(compare(f"same.{q(c)}") for c in self.others)
        new = ", ".join(compare(f"incoming.{q(c)}") for c in self.others)
        match = " AND ".join(f"same.{q(k)} = incoming.{q(k)}" for k in self.plan.key)
        return (
            f" WHERE NOT COALESCE((SELECT ({same}) IS NOT DISTINCT FROM ({new}) "
            f"FROM {self.table} AS same WHERE {match}), false)"
        )

    def _setup(self) -> None:
        # Same column types as the target, none of its constraints: COPY
        # accepts every row, the INSERT is where the database judges them.
        # Emptied by every commit, so a batch costs no TRUNCATE.
        self.cursor.execute(
            f"CREATE TEMP TABLE {self.stage} ON COMMIT DELETE ROWS AS "
            f"SELECT {self.columns} FROM {self.table} WITH NO DATA"
        )
        self.connection.commit()

    def _teardown(self) -> None:
        self.cursor.execute(f"DROP TABLE IF EXISTS {self.stage}")
        self.connection.commit()

    def _execute(self, sql: str) -> None:
        self.cursor.execute(sql)  # built from quoted names only

    def _write_batch(self, rows: Sequence[Row], copy_text: str | None) -> BatchResult:
        cursor = self.cursor
        if self.savepoints:
            # One round trip: the savepoint, and an empty stage (no commit empties it).
            cursor.execute(f"SAVEPOINT onceonly_batch; TRUNCATE {self.stage}")
        with cursor.copy(f"COPY {self.stage} ({self.columns}) FROM STDIN") as copy:
            if copy_text is not None:
                copy.write(copy_text)
            else:
                for row in rows:
                    copy.write_row(row)
        cursor.execute(self.from_stage)
        flags = cursor.fetchall()
        inserted = sum(1 for (new,) in flags if new)
        return BatchResult(
            inserted=inserted, updated=len(flags) - inserted, unchanged=len(rows) - len(flags)
        )

    def _write_one(self, row: Row) -> Outcome:
        self.cursor.execute(self.one, row)
        found = self.cursor.fetchone()
        if found is None:
            return Outcome.UNCHANGED
        return Outcome.INSERTED if found[0] else Outcome.UPDATED

    def _reason(self, exc: Exception) -> str:
        diag = getattr(exc, "diag", None)
        primary = (diag.message_primary if diag else None) or str(exc).strip()
        detail = diag.message_detail if diag else None
        # "Key (email)=(a@b.c) already exists." says which; "Failing row
        # contains (...)" only repeats the row.
        if detail and detail.startswith("Key "):
            primary = f"{primary}: {detail}"
        return f"refused by the database: {primary}"

    def _commit(self) -> None:
        self.connection.commit()

    def _rollback(self) -> None:
        self.connection.rollback()


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def copy_line(values: Sequence[object]) -> str:
    """One row in PostgreSQL's COPY text format, without the line end.

    The values are what the column plan produced (str, int, Decimal, bool,
    date, datetime, time, UUID, float or None), whose ``str()`` PostgreSQL
    reads back as the same value; text is escaped, None is ``\\N``.
    """
    # Runs once per row: the plain join first, and escaping only when a value
    # holds one of the four characters COPY gives a meaning to (rare).
    line = "\t".join(["\\N" if v is None else v if v.__class__ is str else str(v) for v in values])
    if (
        line.count("\t") == len(values) - 1
        and "\\" not in line
        and "\n" not in line
        and "\r" not in line
    ):
        return line
    return "\t".join(
        [
            "\\N" if v is None else (v if v.__class__ is str else str(v)).translate(_COPY_ESCAPES)
            for v in values
        ]
    )


class SqliteWriter(Writer):
    row_errors = (sqlite3.IntegrityError, sqlite3.DataError)
    distinct = "IS NOT"

    def __init__(
        self,
        connection: sqlite3.Connection,
        plan: Plan,
        quote: Callable[[str], str],
        *,
        commit_every_batch: bool = True,
    ) -> None:
        super().__init__(connection, plan, quote, commit_every_batch=commit_every_batch)
        name = f"onceonly_import_{secrets.token_hex(4)}"
        self.counter = self.trigger = name
        schema = quote(plan.table.schema or "main")
        self.target = f"{schema}.{quote(plan.table.name)}"
        conflict = self._on_conflict(quote(plan.table.name), lambda expression: expression)
        marks = ", ".join(["?"] * len(plan.columns))
        self.upsert = f"INSERT INTO {self.table} ({self.columns}) VALUES ({marks}) {conflict}"
        self.in_transaction = False

    def _setup(self) -> None:
        c = self.connection
        c.execute(f"CREATE TEMP TABLE {self.counter} (n INTEGER NOT NULL)")
        c.execute(f"INSERT INTO temp.{self.counter} VALUES (0)")
        # Fires for inserts only (an upsert that updates fires UPDATE triggers),
        # and only on this connection: the count of rows this import inserted.
        c.execute(
            f"CREATE TEMP TRIGGER {self.trigger} AFTER INSERT ON {self.target} "
            f"BEGIN UPDATE {self.counter} SET n = n + 1; END"
        )

    def _begin(self) -> None:
        # Begun when a batch is written, not at the commit before: between
        # batches the write lock is free for others (the webhook receiver on
        # the same file). BEGIN IMMEDIATE takes it up front: no upgrade from a
        # read lock later, which SQLite answers with an immediate "locked".
        if not self.in_transaction:
            self.connection.execute("BEGIN IMMEDIATE")
            self.in_transaction = True

    def _teardown(self) -> None:
        self.connection.execute(f"DROP TRIGGER IF EXISTS temp.{self.trigger}")
        self.connection.execute(f"DROP TABLE IF EXISTS temp.{self.counter}")

    def _execute(self, sql: str) -> None:
        self.connection.execute(sql)

    def _inserted_so_far(self) -> int:
        return int(self.connection.execute(f"SELECT n FROM temp.{self.counter}").fetchone()[0])

    def _write_batch(self, rows: Sequence[Row], copy_text: str | None) -> BatchResult:
        if self.savepoints:
            self.connection.execute("SAVEPOINT onceonly_batch")
        before = self._inserted_so_far()
        changed = self.connection.executemany(self.upsert, rows).rowcount
        inserted = self._inserted_so_far() - before
        return BatchResult(
            inserted=inserted, updated=changed - inserted, unchanged=len(rows) - changed
        )

    def _write_one(self, row: Row) -> Outcome:
        before = self._inserted_so_far()
        changed = self.connection.execute(self.upsert, row).rowcount
        if not changed:
            return Outcome.UNCHANGED
        return Outcome.INSERTED if self._inserted_so_far() > before else Outcome.UPDATED

    def _reason(self, exc: Exception) -> str:
        return f"refused by the database: {str(exc).strip()}"

    def _commit(self) -> None:
        if self.in_transaction:
            self.connection.execute("COMMIT")
            self.in_transaction = False

    def _rollback(self) -> None:
        if self.in_transaction:
            self.connection.execute("ROLLBACK")
            self.in_transaction = False


def make_writer(
    dialect: sa.Dialect, connection: Any, plan: Plan, *, commit_every_batch: bool = True
) -> Writer:
    """The writer for `dialect` on a DBAPI `connection`."""
    quote = dialect.identifier_preparer.quote
    if dialect.name == "postgresql":
        return PostgresWriter(connection, plan, quote, commit_every_batch=commit_every_batch)
    if dialect.name == "sqlite":
        return SqliteWriter(connection, plan, quote, commit_every_batch=commit_every_batch)
    raise StoreError(f"importing into {dialect.name} is not supported")  # pragma: no cover
