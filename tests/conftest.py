"""Shared fixtures: every store-backed test runs on SQLite and on PostgreSQL.

``ONCEONLY_TEST_ENGINES`` picks the engines (default ``sqlite,postgresql``).
``ONCEONLY_TEST_POSTGRES_URL`` names the server (default
``postgresql://postgres@127.0.0.1:5432/test``); the tests use their own
database on it, ``onceonly_test_<pid>``, dropped at the end. When PostgreSQL is
among the engines and cannot be reached, the run stops with an error: a
PostgreSQL test must never be silently skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

ENGINES = [
    e.strip() for e in os.environ.get("ONCEONLY_TEST_ENGINES", "sqlite,postgresql").split(",")
]
ADMIN_URL = os.environ.get(
    "ONCEONLY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
# One database per test run, so two runs on one server (a developer's and CI's)
# never empty each other's tables; dropped when the run ends.
TEST_DB = f"onceonly_test_{os.getpid()}"
POSTGRES_URL = urlunsplit(urlsplit(ADMIN_URL)._replace(path=f"/{TEST_DB}"))


async def _prepare_postgres() -> None:
    conn = await asyncpg.connect(ADMIN_URL, timeout=5)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", TEST_DB)
        if not exists:
            await conn.execute(f'CREATE DATABASE "{TEST_DB}"')
    finally:
        await conn.close()


async def _reset_postgres() -> None:
    """Empty the test database: it is ours alone, so drop everything in it."""
    conn = await asyncpg.connect(POSTGRES_URL, timeout=5)
    try:
        await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    finally:
        await conn.close()


def pytest_sessionstart(session: pytest.Session) -> None:
    if "postgresql" not in ENGINES:
        return
    try:
        asyncio.run(_prepare_postgres())
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        pytest.exit(
            f"PostgreSQL is not reachable at {ADMIN_URL} ({exc!r}). Start it, or set "
            "ONCEONLY_TEST_ENGINES=sqlite to run the SQLite half only.",
            returncode=3,
        )


async def _drop_postgres() -> None:
    conn = await asyncpg.connect(ADMIN_URL, timeout=5)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{TEST_DB}" WITH (FORCE)')
    finally:
        await conn.close()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if "postgresql" in ENGINES:
        # If the server went away there is nothing left to clean.
        with contextlib.suppress(OSError, asyncpg.PostgresError, TimeoutError):
            asyncio.run(_drop_postgres())


def pytest_report_header() -> str:
    return f"onceonly engines: {', '.join(ENGINES)} (PostgreSQL: {POSTGRES_URL})"


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def database_url(engine: str, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database on `engine`: a new SQLite file, or PostgreSQL with
    onceonly's tables dropped."""
    if engine == "sqlite":
        yield f"sqlite:///{tmp_path / 'onceonly.db'}"
    else:
        asyncio.run(_reset_postgres())
        yield POSTGRES_URL
