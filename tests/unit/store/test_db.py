"""Database URLs as the SQLAlchemy engines see them (no connection is made).

The engines live in ``onceonly.store.engine``; ``onceonly.db`` is the old name,
kept for users' imports."""

from __future__ import annotations

import pytest

import onceonly.db
from onceonly.store import create_store
from onceonly.store import engine as store_engine
from onceonly.store.engine import create_engine
from onceonly.store.postgres import PostgresStore


@pytest.mark.parametrize(
    ("url", "hosts", "query"),
    [
        pytest.param(
            "postgresql://app@db1:5432,db2:5433/billing?target_session_attrs=read-write",
            ("db1:5432", "db2:5433"),
            {"target_session_attrs": "read-write"},
            id="two hosts and an option",
        ),
        pytest.param(
            "postgresql://app:s3cret@db1,db2,db3/billing",
            ("db1", "db2", "db3"),
            {},
            id="default ports and a password",
        ),
        pytest.param(
            "postgres://app@[::1]:5432,10.0.0.2:5432/billing?sslmode=require",
            ("[::1]:5432", "10.0.0.2:5432"),
            {"sslmode": "require"},
            id="IPv6 and postgres://",
        ),
    ],
)
def test_a_multi_host_url_names_every_host_to_the_worker_engine(
    url: str, hosts: tuple[str, ...], query: dict[str, str]
) -> None:
    engine = create_engine(url)
    try:
        parsed = engine.url
        assert parsed.drivername == "postgresql+psycopg"
        assert parsed.database == "billing"
        assert parsed.username == "app"
        assert parsed.host is None  # all of them are in the query, in order
        got = parsed.query["host"]
        assert ((got,) if isinstance(got, str) else tuple(got)) == hosts
        assert {k: v for k, v in parsed.query.items() if k != "host"} == query
    finally:
        engine.dispose()


def test_a_multi_host_password_reaches_the_engine_and_not_the_logs() -> None:
    url = "postgresql://app:s3cret@db1:5432,db2:5432/billing"
    engine = create_engine(url)
    try:
        assert engine.url.password == "s3cret"
        assert "s3cret" not in repr(engine.url)
    finally:
        engine.dispose()
    store = create_store(url)
    assert isinstance(store, PostgresStore)
    assert "s3cret" not in store.url


def test_a_single_host_url_is_left_as_it_is() -> None:
    engine = create_engine("postgresql://app@db1:6543/billing?application_name=x")
    try:
        assert (engine.url.host, engine.url.port) == ("db1", 6543)
        assert dict(engine.url.query) == {"application_name": "x"}
    finally:
        engine.dispose()


def test_the_old_module_name_still_gives_the_engines() -> None:
    assert onceonly.db.create_engine is store_engine.create_engine
    assert onceonly.db.engine_kind is store_engine.engine_kind
    assert onceonly.db.write_lock_of is store_engine.write_lock_of
