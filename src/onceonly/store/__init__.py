"""Stores: one port, one adapter per engine, chosen by URL.

``sqlite:///onceonly.db`` (relative to the working directory),
``sqlite:////absolute/path.db``, ``postgresql://user@host:5432/db``
(``postgres://`` and ``postgresql+asyncpg://`` are accepted too).
"""

from __future__ import annotations

from .base import Store
from .url import DatabaseURL

__all__ = ["DEFAULT_DATABASE_URL", "DatabaseURL", "Store", "create_store", "migrate_blocking"]

DEFAULT_DATABASE_URL = "sqlite:///onceonly.db"


def create_store(url: str, *, auto_migrate: bool = True) -> Store:
    """The store for `url`. Drivers are imported here, only for the engine in use."""
    parsed = DatabaseURL.parse(url)
    if parsed.kind == "sqlite":
        from .sqlite import SQLiteStore

        return SQLiteStore(
            parsed.path, auto_migrate=auto_migrate, busy_timeout_ms=parsed.busy_timeout_ms
        )
    from .postgres import PostgresStore

    return PostgresStore(parsed.postgres_dsn, auto_migrate=auto_migrate)


def migrate_blocking(url: str) -> list[int]:
    """Bring the schema at `url` up to date from synchronous code.

    Runs on a short-lived thread with its own event loop, so it works whether
    or not the caller is inside a running loop.
    """
    from .._threads import run_on_own_loop

    async def work() -> list[int]:
        store = create_store(url, auto_migrate=False)
        try:
            return await store.migrate()
        finally:
            await store.close()

    return run_on_own_loop(work, name="onceonly-migrate")
