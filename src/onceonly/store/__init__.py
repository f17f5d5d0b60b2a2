"""Stores: one port, one adapter per engine, chosen by URL.

``sqlite:///onceonly.db`` (relative to the working directory),
``sqlite:////absolute/path.db``, ``postgresql://user@host:5432/db``
(``postgres://`` and ``postgresql+asyncpg://`` are accepted too).
"""

from __future__ import annotations

from urllib.parse import parse_qs

from .._exceptions import ConfigurationError
from .base import Store

__all__ = ["DEFAULT_DATABASE_URL", "Store", "create_store", "migrate_blocking"]

DEFAULT_DATABASE_URL = "sqlite:///onceonly.db"


def create_store(url: str, *, auto_migrate: bool = True) -> Store:
    """The store for `url`. Drivers are imported here, only for the engine in use."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigurationError(
            f"database URL {url!r} has no scheme; use sqlite:///file.db or postgresql://..."
        )
    engine = scheme.split("+", 1)[0].lower()
    if engine == "sqlite":
        path, _, query = rest.partition("?")
        # sqlite:///x.db -> rest "/x.db" -> "x.db" (relative); sqlite:////abs -> "/abs".
        path = path[1:] if path.startswith("/") else path
        if not path:
            raise ConfigurationError(f"database URL {url!r} names no file")
        options = parse_qs(query)
        busy = options.get("busy_timeout", ["5000"])[0]
        if not busy.isdigit():
            raise ConfigurationError(f"busy_timeout must be milliseconds, got {busy!r}")
        from .sqlite import SQLiteStore

        return SQLiteStore(path, auto_migrate=auto_migrate, busy_timeout_ms=int(busy))
    if engine in ("postgresql", "postgres"):
        from .postgres import PostgresStore

        return PostgresStore("postgresql://" + rest, auto_migrate=auto_migrate)
    raise ConfigurationError(
        f"unsupported database URL scheme {scheme!r}: use sqlite:/// or postgresql://"
    )


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
