"""The importer's repository (``onceonly.store.bulk``, ``onceonly.store.tables``)
on SQLite and PostgreSQL: the user's table described in the importer's terms,
batches upserted with the database's own counts, a refused row left out alone,
and the database's errors told apart (a refusal, an outage, anything else)."""

from __future__ import annotations

import sqlite3
import warnings
from collections.abc import Iterator, Sequence
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa

from onceonly import StoreError, StoreRejected, StoreUnavailable
from onceonly.db import create_engine
from onceonly.store.bulk import BatchCounts, BulkUpserts, Outcome, Refused, UpsertSession
from onceonly.store.tables import MissingTable, TargetTable, ValueKind, reflect_table
from ports import free_port

COLUMNS = ["code", "name", "amount"]
KEY = ["code"]


@pytest.fixture
def db(database_url: str) -> Iterator[sa.Engine]:
    engine = create_engine(database_url, pool_size=2)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE items (code VARCHAR(10) PRIMARY KEY, name TEXT NOT NULL, "
            "amount NUMERIC(8, 2) CHECK (amount >= 0), note TEXT)"
        )
    yield engine
    engine.dispose()


def described(engine: sa.Engine, name: str = "items") -> TargetTable:
    found = BulkUpserts(engine).describe(name)
    assert isinstance(found, TargetTable), found
    return found


@pytest.fixture
def session(db: sa.Engine) -> Iterator[UpsertSession]:
    with BulkUpserts(db).open(described(db), COLUMNS, KEY) as opened:
        yield opened


def amount(value: str, engine: sa.Engine) -> object:
    # What the importer's column plan hands over: SQLite takes decimals as text.
    return value if engine.dialect.name == "sqlite" else Decimal(value)


def rows_of(engine: sa.Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        found = conn.exec_driver_sql("SELECT code, name FROM items ORDER BY code").all()
        return [tuple(r) for r in found]


# -- describing the table ------------------------------------------------------------


def test_a_table_is_described_with_its_keys_and_what_each_column_holds(
    database_url: str,
) -> None:
    engine = create_engine(database_url, pool_size=1)
    postgres = engine.dialect.name == "postgresql"
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE TABLE people (id {'SERIAL' if postgres else 'INTEGER'} PRIMARY KEY, "
            "doc VARCHAR(14) NOT NULL UNIQUE, age SMALLINT, credit NUMERIC(12, 2), born DATE, "
            "active BOOLEAN DEFAULT true, seen TIMESTAMP, ratio FLOAT, "
            f"tags {'JSON' if postgres else 'TEXT'}, code TEXT, region TEXT, "
            "UNIQUE (code, region))"
        )
        conn.exec_driver_sql("CREATE UNIQUE INDEX people_lower ON people (lower(code))")
    try:
        with warnings.catch_warnings():
            # SQLAlchemy's warning about the expression index it skips stays
            # inside. Only its warnings: a ResourceWarning of a connection
            # another test left to the garbage collector, collected here, is
            # not this test's business (as an error it became an "exception
            # ignored" in psycopg's __del__, reported against this test).
            warnings.simplefilter("error", sa.exc.SAWarning)
            table = described(engine, "people")
    finally:
        engine.dispose()
    assert (table.name, table.schema, table.display_name) == ("people", None, "people")
    assert list(table.columns) == [
        "id", "doc", "age", "credit", "born", "active", "seen", "ratio", "tags", "code", "region",
    ]  # fmt: skip
    # The primary key first; an expression index backs no key.
    assert table.unique_keys[0] == ("id",)
    assert set(table.unique_keys) == {("id",), ("doc",), ("code", "region")}
    c = table.columns
    assert [c[n].kind for n in ("id", "age", "credit", "born", "active", "seen", "ratio")] == [
        ValueKind.INTEGER, ValueKind.INTEGER, ValueKind.NUMERIC, ValueKind.DATE,
        ValueKind.BOOLEAN, ValueKind.DATETIME, ValueKind.FLOAT,
    ]  # fmt: skip
    assert (c["doc"].kind, c["doc"].length, c["doc"].nullable) == (ValueKind.TEXT, 14, False)
    assert (c["code"].kind, c["code"].length, c["code"].nullable) == (ValueKind.TEXT, None, True)
    assert (c["credit"].precision, c["credit"].scale) == (12, 2)
    assert c["active"].has_default
    assert not c["born"].has_default
    assert c["id"].has_default  # SQLite's rowid, PostgreSQL's serial
    assert not c["id"].nullable
    assert c["age"].type_name == "SMALLINT"
    if postgres:
        assert (c["age"].integer_bits, c["id"].integer_bits) == (16, 32)
        assert c["tags"].compare_as_text
        assert c["active"].bind is None
        assert c["credit"].bind is None
    else:
        # SQLite's integers are all 64-bit; booleans go in through SQLAlchemy's
        # own processor, decimals as their exact text.
        assert (c["age"].integer_bits, c["id"].integer_bits) == (64, 64)
        assert not c["tags"].compare_as_text
        assert c["active"].bind is not None
        assert c["active"].bind(True) == 1
        assert c["credit"].bind is str


def test_a_missing_table_is_told_with_the_tables_there_are(db: sa.Engine) -> None:
    assert BulkUpserts(db).describe("nothing") == MissingTable("nothing", ("items",))


def test_a_table_in_another_schema(database_url: str) -> None:
    engine = create_engine(database_url, pool_size=1)
    try:
        with engine.begin() as conn:
            if engine.dialect.name == "sqlite":
                # An attached database lives on this connection only.
                conn.exec_driver_sql("ATTACH DATABASE ':memory:' AS other")
            else:
                conn.exec_driver_sql("CREATE SCHEMA other")
            conn.exec_driver_sql("CREATE TABLE other.t (k TEXT PRIMARY KEY)")
            found = reflect_table(conn, "other.t")
            missing = reflect_table(conn, "other.nothing")
    finally:
        engine.dispose()
    assert isinstance(found, TargetTable)
    assert (found.schema, found.name, found.display_name) == ("other", "t", "other.t")
    assert found.unique_keys == [("k",)]
    assert missing == MissingTable("other.nothing", ("t",))


# -- writing -------------------------------------------------------------------------


def test_a_batch_is_counted_by_the_database(db: sa.Engine, session: UpsertSession) -> None:
    rows = [("a", "A", amount("1.00", db)), ("b", "B", amount("2.00", db))]
    assert session.write_batch(rows, _text(session, rows)) == BatchCounts(2, 0, 0)
    session.commit()
    again = [("a", "A", amount("1.00", db)), ("b", "B2", amount("2.00", db)), ("c", "C", None)]
    assert session.write_batch(again, _text(session, again)) == BatchCounts(1, 1, 1)
    session.commit()
    assert rows_of(db) == [("a", "A"), ("b", "B2"), ("c", "C")]


def test_a_row_at_a_time_says_what_it_did(db: sa.Engine, session: UpsertSession) -> None:
    assert session.write_row(("a", "A", None)) is Outcome.INSERTED
    assert session.write_row(("a", "A", None)) is Outcome.UNCHANGED
    assert session.write_row(("a", "A2", None)) is Outcome.UPDATED
    session.commit()
    assert rows_of(db) == [("a", "A2")]


@pytest.mark.parametrize("one_transaction", [False, True], ids=["per-batch", "one-transaction"])
def test_a_batch_with_one_bad_row_is_not_sunk(db: sa.Engine, one_transaction: bool) -> None:
    """The database refuses the batch whole (nothing of it stays), and then
    each row alone: only the bad one is left out, with the database's reason;
    a batch written before it in the same transaction stays."""
    with BulkUpserts(db).open(
        described(db), COLUMNS, KEY, commit_every_batch=not one_transaction
    ) as session:
        first = [("a", "A", amount("1", db))]
        assert session.write_batch(first, _text(session, first)) == BatchCounts(1, 0, 0)
        if not one_transaction:
            session.commit()
        batch = [("b", "B", amount("2", db)), ("c", "C", amount("-1", db)), ("d", "D", None)]
        with pytest.raises(StoreRejected, match="refused by the database"):
            session.write_batch(batch, _text(session, batch))
        outcomes = [session.write_row(row) for row in batch]
        assert outcomes[0] is Outcome.INSERTED
        assert outcomes[2] is Outcome.INSERTED
        refused = outcomes[1]
        assert isinstance(refused, Refused)
        assert refused.reason.startswith("refused by the database: ")
        assert "check" in refused.reason.lower()
        session.commit()
    assert rows_of(db) == [("a", "A"), ("b", "B"), ("d", "D")]


def test_another_unique_constraint_names_the_key_in_the_reason(db: sa.Engine) -> None:
    with db.begin() as conn:
        conn.exec_driver_sql("CREATE UNIQUE INDEX items_name ON items (name)")
    with BulkUpserts(db).open(described(db), COLUMNS, KEY) as session:
        assert session.write_row(("a", "same", None)) is Outcome.INSERTED
        refused = session.write_row(("b", "same", None))
        session.commit()
    assert isinstance(refused, Refused)
    assert "name" in refused.reason
    if db.dialect.name == "postgresql":
        assert "Key (name)=(same) already exists." in refused.reason


def test_what_is_not_committed_is_gone_when_the_session_closes(db: sa.Engine) -> None:
    with BulkUpserts(db).open(described(db), COLUMNS, KEY) as session:
        session.write_batch([("a", "A", None)], _text(session, [("a", "A", None)]))
    with BulkUpserts(db).open(described(db), COLUMNS, KEY) as session:
        session.write_row(("b", "B", None))
        session.rollback()
        session.write_row(("c", "C", None))
        session.commit()
    assert rows_of(db) == [("c", "C")]


def test_text_with_the_characters_copy_gives_a_meaning_to(
    db: sa.Engine, session: UpsertSession
) -> None:
    rows = [("a", "tab\there\nline\\back\rslash", None)]
    session.write_batch(rows, _text(session, rows))
    session.commit()
    assert rows_of(db) == [("a", "tab\there\nline\\back\rslash")]


def _text(session: UpsertSession, rows: Sequence[Sequence[object]]) -> str | None:
    make = session.row_text
    return None if make is None else "".join(make(r) + "\n" for r in rows)


# -- errors --------------------------------------------------------------------------


def test_an_unreachable_database_is_an_outage(tmp_path: Path, engine: str) -> None:
    if engine == "sqlite":
        url = f"sqlite:///{tmp_path}"  # a directory: SQLite cannot open it
    else:
        url = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    unreachable = create_engine(url, pool_size=1)
    try:
        upserts = BulkUpserts(unreachable)
        with pytest.raises(StoreUnavailable) as described_error:
            upserts.describe("items")
        table = TargetTable("items", None, {}, [("code",)])
        with pytest.raises(StoreUnavailable) as opened_error:
            upserts.open(table, ["code"], ["code"])
    finally:
        unreachable.dispose()
    # The driver's own first line, as `onceonly import` shows it.
    for error in (described_error.value, opened_error.value):
        message = str(error)
        assert "\n" not in message
        assert ("unable to open" if engine == "sqlite" else "127.0.0.1") in message


def test_a_database_gone_during_the_import_is_an_outage(
    database_url: str, engine: str, db: sa.Engine
) -> None:
    if engine == "sqlite":
        busy = create_engine(database_url + "?busy_timeout=50", pool_size=1)
        table = described(busy)
        with BulkUpserts(busy).open(table, COLUMNS, KEY) as session:
            holder = sqlite3.connect(database_url.removeprefix("sqlite:///"), timeout=0.05)
            holder.isolation_level = None
            holder.execute("BEGIN IMMEDIATE")  # someone else holds the write lock
            try:
                with pytest.raises(StoreUnavailable, match="locked"):
                    session.write_batch([("a", "A", None)])
            finally:
                holder.execute("ROLLBACK")
                holder.close()
        busy.dispose()
        return
    with BulkUpserts(db).open(described(db), COLUMNS, KEY) as session:
        pid = session.connection.info.backend_pid
        with db.begin() as conn:
            conn.exec_driver_sql(f"SELECT pg_terminate_backend({pid})")
        with pytest.raises(StoreUnavailable):
            session.write_batch([("a", "A", None)], "a\tA\t\\N\n")


def test_a_statement_the_database_cannot_run_is_an_error_not_an_outage(
    db: sa.Engine,
) -> None:
    with BulkUpserts(db).open(described(db), COLUMNS, KEY) as session:
        with db.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE items RENAME TO elsewhere")
        with pytest.raises(StoreError) as caught:
            session.write_batch([("a", "A", None)], _text(session, [("a", "A", None)]))
    assert not isinstance(caught.value, StoreUnavailable | StoreRejected)
    assert not isinstance(caught.value.__cause__, StoreError)
