"""onceonly.contrib.alembic's hooks, called the way Alembic calls them."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import sqlalchemy as sa

import onceonly.contrib.alembic as contrib
from onceonly import ConfigurationError
from onceonly.contrib.alembic import (
    include_name,
    include_name_and,
    include_object,
    include_object_and,
    metadata_for,
)


def _parents(table: str | None) -> Any:
    return {"table_name": table, "schema_name": None, "schema_qualified_table_name": table}


def test_include_name_leaves_out_onceonly_tables_and_what_belongs_to_them() -> None:
    assert not include_name("onceonly_events", "table", _parents(None))
    assert not include_name("status", "column", _parents("onceonly_events"))
    assert not include_name("onceonly_events_status_idx", "index", _parents("onceonly_events"))
    assert include_name("orders", "table", _parents(None))
    assert include_name("public", "schema", _parents(None))
    # Decided by the table, not by the object's own name.
    assert include_name("onceonly_ref", "column", _parents("orders"))
    assert include_name("onceonly_ref_idx", "index", _parents("orders"))


def test_include_name_and_asks_the_users_filter_about_the_rest_only() -> None:
    asked: list[str | None] = []

    def mine(name: str | None, type_: Any, parent_names: Any) -> bool:
        asked.append(name)
        return name != "spatial_ref_sys"

    hook = include_name_and(mine)
    assert not hook("onceonly_events", "table", _parents(None))
    assert not hook("spatial_ref_sys", "table", _parents(None))
    assert hook("orders", "table", _parents(None))
    assert asked == ["spatial_ref_sys", "orders"]


def test_include_object_goes_by_the_table_of_each_object() -> None:
    events = metadata_for("postgresql").tables["onceonly_events"]
    orders = sa.Table(
        "orders", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True), sa.Index("i", "id")
    )
    assert not include_object(events, "onceonly_events", "table", True, None)
    assert not include_object(events.c.status, "status", "column", True, None)
    index = next(iter(events.indexes))
    assert not include_object(index, index.name, "index", True, None)
    assert include_object(orders, "orders", "table", True, None)
    assert include_object(orders.c.id, "id", "column", True, None)
    assert include_object(next(iter(orders.indexes)), "i", "index", False, None)

    refused = include_object_and(lambda obj, name, type_, reflected, compare_to: name != "id")
    assert not refused(events, "onceonly_events", "table", True, None)
    assert not refused(orders.c.id, "id", "column", True, None)
    assert refused(orders, "orders", "table", True, None)


@pytest.mark.parametrize(
    ("engine", "headers_type"),
    [
        ("sqlite", "TEXT"),
        ("sqlite:////var/lib/app/onceonly.db", "TEXT"),
        ("postgresql", "JSONB"),
        ("postgresql+psycopg://app@db/app", "JSONB"),
    ],
)
def test_metadata_for_an_engine_name_or_url(engine: str, headers_type: str) -> None:
    tables = metadata_for(engine).tables
    assert {"onceonly_events", "onceonly_schema", "onceonly_effects"} <= set(tables)
    assert all(name.startswith(contrib.TABLE_PREFIX) for name in tables)
    assert str(tables["onceonly_events"].c.headers.type) == headers_type


@pytest.mark.parametrize("engine", ["mysql", "mysql://app@db/app"])
def test_metadata_for_another_engine_is_refused(engine: str) -> None:
    with pytest.raises(ConfigurationError):
        metadata_for(engine)


def test_the_public_names_are_pinned_and_documented() -> None:
    assert set(contrib.__all__) == {
        "TABLE_PREFIX",
        "include_name",
        "include_name_and",
        "include_object",
        "include_object_and",
        "metadata_for",
    }
    for name in contrib.__all__:
        value = getattr(contrib, name)
        if inspect.isfunction(value):
            assert inspect.getdoc(value), name
