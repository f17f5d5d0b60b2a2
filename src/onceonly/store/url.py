"""The one reading of an onceonly database URL.

``sqlite:///onceonly.db`` (relative to the working directory),
``sqlite:////absolute/path.db``, ``sqlite:///x.db?busy_timeout=2000``,
``postgresql://user@host:5432/db`` (``postgres://`` and ``postgresql+asyncpg://``
are accepted too, and libpq's multi-host form ``user@h1,h2/db``).

The store, the SQLAlchemy engines, the effect ledger and the dashboard all
open the same database; reading its URL in one place keeps them from ever
disagreeing about which file or which options (they once parsed it four ways).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs

from .._exceptions import ConfigurationError

__all__ = ["DEFAULT_BUSY_TIMEOUT_MS", "DatabaseURL", "EngineKind"]

EngineKind = Literal["sqlite", "postgresql"]

# How long a SQLite connection waits for the file's write lock before the
# caller hears "database is locked" (StoreUnavailable: 503, retry later).
DEFAULT_BUSY_TIMEOUT_MS = 5000


@dataclass(frozen=True, slots=True)
class DatabaseURL:
    """A parsed database URL.

    `kind` is the engine; for SQLite `path` is the file (relative or absolute,
    as written) and `busy_timeout_ms` its lock wait; for PostgreSQL `rest` is
    everything after ``://`` (user, hosts, database, libpq options), which the
    drivers read themselves. `query` is the raw query string, kept so that a
    derived URL (the effect ledger's file) carries the same options.
    """

    url: str
    kind: EngineKind
    rest: str
    path: str = ""
    query: str = ""
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS

    @classmethod
    def parse(cls, url: str) -> DatabaseURL:
        scheme, sep, rest = url.partition("://")
        if not sep:
            raise ConfigurationError(
                f"database URL {url!r} has no scheme; use sqlite:///file.db or postgresql://..."
            )
        engine = scheme.split("+", 1)[0].lower()
        if engine in ("postgresql", "postgres"):
            return cls(url, "postgresql", rest)
        if engine != "sqlite":
            raise ConfigurationError(
                f"unsupported database URL scheme {scheme!r}: use sqlite:/// or postgresql://"
            )
        path, _, query = rest.partition("?")
        # sqlite:///x.db -> rest "/x.db" -> "x.db" (relative); sqlite:////abs -> "/abs".
        path = path[1:] if path.startswith("/") else path
        if not path:
            raise ConfigurationError(f"database URL {url!r} names no file")
        busy = parse_qs(query).get("busy_timeout", [str(DEFAULT_BUSY_TIMEOUT_MS)])[0]
        if not busy.isdigit():
            raise ConfigurationError(f"busy_timeout must be milliseconds, got {busy!r}")
        return cls(url, "sqlite", rest, path=path, query=query, busy_timeout_ms=int(busy))

    @property
    def postgres_dsn(self) -> str:
        """The URL as libpq and asyncpg take it (no driver suffix)."""
        return "postgresql://" + self.rest

    def sibling(self, suffix: str) -> DatabaseURL:
        """For SQLite, the URL of the file named like this one plus `suffix`, with
        the same options (the effect ledger's own file); for PostgreSQL, itself."""
        if self.kind != "sqlite":
            return self
        head, sep, query = self.url.partition("?")
        return DatabaseURL.parse(f"{head}{suffix}{sep}{query}")
