"""What the dashboard reads from the event store (read-only, both engines).

Reads go through a synchronous SQLAlchemy engine, run off the event loop by the
caller. On PostgreSQL that is the deployment's engine. On SQLite it is a
separate one in autocommit mode: the deployment's engine opens every
transaction with ``BEGIN IMMEDIATE`` (the write lock, right for the worker),
and a dashboard polling counts every two seconds must not take the lock the
receiver needs; in WAL mode a plain read never blocks a writer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ..events import EventStatus
from ..operations import Attempt, attempts_of

if TYPE_CHECKING:
    from ..config import Onceonly

__all__ = ["Counts", "EventDetail", "EventReader", "EventRow", "format_time"]

STATUSES = tuple(s.value for s in EventStatus)


@dataclass(frozen=True, slots=True)
class Counts:
    """Events by provider and status, and duplicate deliveries by provider.

    `duplicates` is ``None`` when the schema does not count duplicates.
    """

    by_provider: dict[str, dict[str, int]]
    duplicates: dict[str, int] | None

    @property
    def by_status(self) -> dict[str, int]:
        totals = dict.fromkeys(STATUSES, 0)
        for statuses in self.by_provider.values():
            for status, n in statuses.items():
                totals[status] = totals.get(status, 0) + n
        return totals

    @property
    def total(self) -> int:
        return sum(self.by_status.values())

    def to_dict(self) -> dict[str, Any]:
        by_status = self.by_status
        return {
            "total": sum(by_status.values()),
            "by_status": by_status,
            "by_provider": self.by_provider,
            "duplicates": (
                None
                if self.duplicates is None
                else {"total": sum(self.duplicates.values()), "by_provider": self.duplicates}
            ),
        }


@dataclass(frozen=True, slots=True)
class EventRow:
    """One line of the event list."""

    id: int
    provider: str
    event_id: str
    event_type: str | None
    status: str
    attempts: int
    received_at: str
    last_error: str | None
    duplicates: int | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "provider": self.provider,
            "event_id": self.event_id,
            "event_type": self.event_type,
            "status": self.status,
            "attempts": self.attempts,
            "received_at": self.received_at,
            "last_error": self.last_error,
            "duplicates": self.duplicates,
        }


@dataclass(frozen=True, slots=True)
class EventDetail:
    """One event with its payload, as stored (redact before showing)."""

    row: EventRow
    body: bytes | None
    headers: Mapping[str, str]
    processed_at: str | None
    handler: str | None
    last_duplicate_at: str | None = None
    #: When retention dropped the body and headers (``None``: never).
    payload_purged_at: str | None = None
    attempts: list[Attempt] = field(default_factory=list)


def format_time(value: Any) -> str:
    """A stored time as ``YYYY-MM-DD HH:MM:SS`` UTC (SQLite keeps ISO text)."""
    if value is None:
        return ""
    moment: datetime
    if isinstance(value, datetime):
        moment = value
    else:
        try:
            moment = datetime.fromisoformat(str(value))
        except ValueError:
            return str(value)
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


#: Columns added by schema version 4 (duplicate counting, payload retention):
#: read when present, so the dashboard also works on an older schema.
OPTIONAL_COLUMNS = ("duplicates", "last_duplicate_at", "payload_purged_at")
_NAMES = ", ".join(f"'{c}'" for c in OPTIONAL_COLUMNS)
_PRESENT_COLUMNS = {
    "sqlite": f"SELECT name FROM pragma_table_info('onceonly_events') WHERE name IN ({_NAMES})",
    "postgresql": (
        "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema()"
        f" AND table_name = 'onceonly_events' AND column_name IN ({_NAMES})"
    ),
}

_LIST_COLUMNS = "id, provider, event_id, event_type, status, attempts, received_at, last_error"


class EventReader:
    """Read-only queries for one :class:`~onceonly.Onceonly` deployment."""

    def __init__(self, app: Onceonly) -> None:
        self.app = app
        self.kind = app.engine_kind
        self._engine: sa.Engine | None = None
        # Looked up until all are seen: a column is never dropped, but one may
        # appear when a newer version migrates the database.
        self._present: frozenset[str] = frozenset()

    @property
    def engine(self) -> sa.Engine:
        if self._engine is None:
            if self.kind == "postgresql":
                self._engine = self.app.engine
            else:
                # Its own connections, opened like every other (pragmas and
                # all): pages read while the worker holds the pool's.
                from ..store.sqlite import connect
                from ..store.url import DatabaseURL

                url = DatabaseURL.parse(self.app.database_url)
                self._engine = sa.create_engine(
                    f"sqlite+pysqlite:///{url.path}",
                    creator=lambda: connect(url.path, url.busy_timeout_ms),
                    poolclass=sa.pool.NullPool,
                    isolation_level="AUTOCOMMIT",
                )
        return self._engine

    def close(self) -> None:
        if self._engine is not None and self._engine is not self.app.engine:
            self._engine.dispose()
        self._engine = None

    def _columns(self, conn: sa.Connection) -> frozenset[str]:
        if len(self._present) < len(OPTIONAL_COLUMNS):
            rows = conn.execute(sa.text(_PRESENT_COLUMNS[self.kind])).scalars()
            self._present = frozenset(str(name) for name in rows)
        return self._present

    def _duplicates_column(self, conn: sa.Connection) -> bool:
        return "duplicates" in self._columns(conn)

    def counts(self) -> Counts:
        with self.engine.connect() as conn:
            with_duplicates = self._duplicates_column(conn)
            extra = ", coalesce(sum(duplicates), 0)" if with_duplicates else ""
            rows = conn.execute(
                sa.text(
                    f"SELECT provider, status, count(*){extra} FROM onceonly_events"
                    " GROUP BY provider, status"
                )
            ).all()
        by_provider: dict[str, dict[str, int]] = {}
        duplicates: dict[str, int] | None = {} if with_duplicates else None
        for row in rows:
            by_provider.setdefault(row[0], dict.fromkeys(STATUSES, 0))[row[1]] = int(row[2])
            if duplicates is not None:
                duplicates[row[0]] = duplicates.get(row[0], 0) + int(row[3])
        return Counts(dict(sorted(by_provider.items())), duplicates)

    def events(
        self,
        *,
        provider: str | None = None,
        status: str | None = None,
        event_type: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
    ) -> list[EventRow]:
        """Newest first; each filter is an exact match."""
        where = []
        params: dict[str, Any] = {"limit": limit}
        for column, value in (
            ("provider", provider),
            ("status", status),
            ("event_type", event_type),
        ):
            if value:
                where.append(f"{column} = :{column}")
                params[column] = value
        if before_id is not None:
            where.append("id < :before_id")
            params["before_id"] = before_id
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        with self.engine.connect() as conn:
            extra = ", duplicates" if self._duplicates_column(conn) else ""
            rows = conn.execute(
                sa.text(
                    f"SELECT {_LIST_COLUMNS}{extra} FROM onceonly_events{clause}"
                    " ORDER BY id DESC LIMIT :limit"
                ),
                params,
            ).all()
        return [_row(row) for row in rows]

    def event(self, id: int) -> EventDetail | None:
        with self.engine.connect() as conn:
            present = self._columns(conn)
            extra = "".join(f", {c}" for c in OPTIONAL_COLUMNS if c in present)
            row = conn.execute(
                sa.text(
                    f"SELECT {_LIST_COLUMNS}{extra}, body, headers, processed_at, handler"
                    " FROM onceonly_events WHERE id = :id"
                ),
                {"id": id},
            ).one_or_none()
        if row is None:
            return None
        headers = row.headers
        if isinstance(headers, str):
            headers = json.loads(headers)
        return EventDetail(
            row=_row(row),
            body=None if row.body is None else bytes(row.body),
            headers=headers or {},
            processed_at=format_time(row.processed_at) or None,
            handler=row.handler,
            last_duplicate_at=format_time(row._mapping.get("last_duplicate_at")) or None,
            payload_purged_at=format_time(row._mapping.get("payload_purged_at")) or None,
            attempts=attempts_of(self.engine, id),
        )


def _row(row: Any) -> EventRow:
    mapping = row._mapping
    return EventRow(
        id=int(row.id),
        provider=row.provider,
        event_id=row.event_id,
        event_type=row.event_type,
        status=row.status,
        attempts=int(row.attempts),
        received_at=format_time(row.received_at),
        last_error=row.last_error,
        duplicates=int(mapping["duplicates"] or 0) if "duplicates" in mapping else None,
    )
