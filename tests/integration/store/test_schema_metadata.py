"""The onceonly tables' ``MetaData`` says what the migrations make.

Alembic's own comparison (``compare_metadata``, what autogenerate runs) between
a database fresh from onceonly's migrations and the description must find
nothing. A migration added without its counterpart in ``store/schema.py``
fails here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from onceonly.db import create_engine
from onceonly.store import migrate_blocking
from onceonly.store.schema import TABLE_PREFIX, describe


@pytest.fixture
def migrated(database_url: str) -> Iterator[sa.Engine]:
    """A database onceonly has just migrated to its latest version."""
    migrate_blocking(database_url)
    engine = create_engine(database_url, pool_size=1)
    yield engine
    engine.dispose()


def _differences(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, describe(engine.dialect.name)))


def _operations(diffs: list[Any]) -> set[tuple[str, str]]:
    """(operation, what) for each difference; column changes come as lists."""
    found: set[tuple[str, str]] = set()
    for diff in diffs:
        for change in diff if isinstance(diff, list) else [diff]:
            target = change[1] if len(change) == 2 else change[3]
            found.add((change[0], getattr(target, "name", str(target))))
    return found


def test_the_description_matches_the_migrated_database(migrated: sa.Engine) -> None:
    assert _differences(migrated) == []
    described = set(describe(migrated.dialect.name).tables)
    reflected = {t for t in sa.inspect(migrated).get_table_names() if t.startswith(TABLE_PREFIX)}
    assert described == reflected
    assert "onceonly_events" in described


def test_a_migration_missing_from_the_description_shows(migrated: sa.Engine) -> None:
    # What the next migration might do, written without its line in schema.py.
    with migrated.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE onceonly_events ADD COLUMN region TEXT")
        conn.exec_driver_sql("CREATE INDEX onceonly_events_region_idx ON onceonly_events (region)")
        conn.exec_driver_sql("CREATE TABLE onceonly_future (id INTEGER PRIMARY KEY)")
    assert _operations(_differences(migrated)) == {
        ("remove_column", "region"),
        ("remove_index", "onceonly_events_region_idx"),
        ("remove_table", "onceonly_future"),
    }


def test_partial_indexes_are_partial_in_the_description(migrated: sa.Engine) -> None:
    # Alembic compares an index's columns, not its WHERE; the engines rewrite
    # the condition's text, so what is checked is that it is there.
    where = f"{migrated.dialect.name}_where"
    inspector = sa.inspect(migrated)
    described: dict[str, bool] = {}
    reflected: dict[str, bool] = {}
    for table in describe(migrated.dialect.name).tables.values():
        for index in table.indexes:
            assert index.name is not None
            described[index.name] = (
                index.dialect_options[migrated.dialect.name]["where"] is not None
            )
        for found in inspector.get_indexes(table.name):
            if found["name"] in described:
                options: dict[str, Any] = dict(found.get("dialect_options", {}))
                reflected[str(found["name"])] = options.get(where) is not None
    assert reflected == described
    assert sum(described.values()) == 10
