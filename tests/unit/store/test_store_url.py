"""The one database URL parser (store/url.py)."""

from __future__ import annotations

import sqlite3

import pytest

from onceonly import ConfigurationError
from onceonly.store.sqlite import connect
from onceonly.store.url import DatabaseURL


def test_sqlite_urls_name_a_file_and_its_options() -> None:
    relative = DatabaseURL.parse("sqlite:///data/x.db?busy_timeout=250")
    absolute = DatabaseURL.parse("sqlite:////var/x.db")
    assert (relative.kind, relative.path, relative.busy_timeout_ms) == ("sqlite", "data/x.db", 250)
    assert (absolute.path, absolute.busy_timeout_ms) == ("/var/x.db", 5000)


@pytest.mark.parametrize(
    "url", ["postgresql://u@h/db", "postgres://u@h/db", "postgresql+asyncpg://u@h/db"]
)
def test_postgresql_spellings_give_one_dsn(url: str) -> None:
    parsed = DatabaseURL.parse(url)
    assert (parsed.kind, parsed.postgres_dsn) == ("postgresql", "postgresql://u@h/db")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("onceonly.db", "no scheme"),
        ("mysql://x/y", "unsupported database URL scheme"),
        ("sqlite:///", "names no file"),
        ("sqlite:///x.db?busy_timeout=soon", "busy_timeout must be milliseconds"),
    ],
)
def test_bad_urls_are_configuration_errors(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        DatabaseURL.parse(url)


def test_a_sibling_file_keeps_the_options_and_postgresql_stays_itself() -> None:
    sibling = DatabaseURL.parse("sqlite:///x.db?busy_timeout=7").sibling("-effects")
    assert (sibling.path, sibling.busy_timeout_ms) == ("x.db-effects", 7)
    pg = DatabaseURL.parse("postgresql://u@h/db")
    assert pg.sibling("-effects") is pg


def test_every_sqlite_connection_enforces_foreign_keys(tmp_path: object) -> None:
    conn = connect(f"{tmp_path}/fk.db", 1000)
    try:
        pragmas = [
            conn.execute(f"PRAGMA {name}").fetchone()[0]
            for name in ("foreign_keys", "journal_mode", "synchronous", "busy_timeout")
        ]
        assert pragmas == [1, "wal", 2, 1000]
        assert conn.isolation_level is None
        assert isinstance(conn, sqlite3.Connection)
    finally:
        conn.close()
