"""Reads of the event history: the queue gauges of ``/metrics`` and what the
dashboard lists, counts and shows.

Everything here reads; nothing writes. :class:`EventHistory` holds the named
statements per engine and returns typed values. Each read is a read-only
connection (:func:`~onceonly.store.engine.reading`): on SQLite it never takes
the write lock, so a Prometheus scrape or a dashboard page neither waits for a
worker's transaction nor makes a delivery wait for its count.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from .engine import reading
from .errors import translated

__all__ = [
    "QUEUE_STATUSES",
    "Attempt",
    "EventHistory",
    "EventRecord",
    "EventSummary",
    "EventTally",
    "Moment",
    "QueueStats",
    "Tallies",
]

#: A stored time as the engine returns it: a ``datetime`` (PostgreSQL's
#: timestamptz) or SQLite's ISO text in UTC.
Moment = datetime | str

#: The unfinished statuses the queue gauges count.
QUEUE_STATUSES = ("pending", "processing", "failed", "dead")

#: Columns added by schema version 4 (duplicate counting, payload retention)
#: and later (the provider's object id, the tenant): read when present, so the
#: dashboard also works on an older schema.
OPTIONAL_COLUMNS = ("duplicates", "last_duplicate_at", "payload_purged_at", "object_id", "tenant")

_HAS_TENANT = "tenant <> ''"

_SUMMARY_COLUMNS = "id, provider, event_id, event_type, status, attempts, received_at, last_error"


@dataclass(frozen=True, slots=True)
class QueueStats:
    """The queue as the database saw it at one moment."""

    #: Events per unfinished status, each count capped (see :meth:`EventHistory.queue`).
    depth: dict[str, int]
    #: Seconds since the oldest pending event was received; 0 when none waits.
    oldest_pending_age: float


@dataclass(frozen=True, slots=True)
class EventTally:
    """How many events one provider has in one status."""

    provider: str
    status: str
    events: int
    #: Duplicate deliveries of those events (0 when the schema does not count them).
    duplicates: int


@dataclass(frozen=True, slots=True)
class Tallies:
    """Events by provider and status."""

    rows: list[EventTally]
    #: False on a schema older than duplicate counting.
    duplicates_counted: bool


@dataclass(frozen=True, slots=True)
class EventSummary:
    """One event as the dashboard lists it (no payload)."""

    id: int
    provider: str
    event_id: str
    event_type: str | None
    status: str
    attempts: int
    received_at: Moment
    last_error: str | None
    #: ``None`` when the schema does not count duplicates.
    duplicates: int | None
    #: The provider's object (a payment id), when the provider names one.
    object_id: str | None = None
    #: The merchant account (``""``: none, or a schema older than tenants).
    tenant: str = ""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One recorded attempt at handling an event."""

    attempt: int
    worker: str
    outcome: str
    error_type: str | None
    error_message: str | None
    traceback: str | None
    finished_at: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "worker": self.worker,
            "outcome": self.outcome,
            "error_type": self.error_type,
            "error_message": self.error_message,
            "traceback": self.traceback,
            "finished_at": self.finished_at,
        }


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One event with its payload and its attempts, as stored."""

    summary: EventSummary
    body: bytes | None
    headers: Mapping[str, str]
    processed_at: Moment | None
    handler: str | None
    last_duplicate_at: Moment | None = None
    payload_purged_at: Moment | None = None
    attempts: list[Attempt] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Statements:
    #: Unfinished events per status, each count stopped at :cap.
    queue_depth: str
    #: Seconds since the oldest pending event was received (no row: none).
    oldest_pending_age: str
    #: Which of OPTIONAL_COLUMNS the events table has.
    present_columns: str
    attempts: str


# Counting walks the (status, id) index, never the processed rows (the bulk
# of the table); the cap bounds the walk when a backlog is huge.
_DEPTH = " UNION ALL ".join(
    f"SELECT '{s}' AS status, count(*) AS n FROM"
    f" (SELECT 1 FROM onceonly_events WHERE status = '{s}' LIMIT :cap) AS q{i}"
    for i, s in enumerate(QUEUE_STATUSES)
)
# The oldest by id is the oldest received: one index probe.
_OLDEST = "SELECT {age} AS age FROM onceonly_events WHERE status = 'pending' ORDER BY id LIMIT 1"
_NAMES = ", ".join(f"'{c}'" for c in OPTIONAL_COLUMNS)

_POSTGRES = _Statements(
    queue_depth=_DEPTH,
    oldest_pending_age=_OLDEST.format(age="extract(epoch FROM clock_timestamp() - received_at)"),
    present_columns=(
        "SELECT column_name AS name FROM information_schema.columns"
        " WHERE table_schema = current_schema()"
        f" AND table_name = 'onceonly_events' AND column_name IN ({_NAMES})"
    ),
    attempts=(
        "SELECT attempt, worker, outcome, error_type, error_message, traceback,"
        " finished_at FROM onceonly_attempts WHERE event_pk = :pk ORDER BY id"
    ),
)
_SQLITE = _Statements(
    queue_depth=_DEPTH,
    oldest_pending_age=_OLDEST.format(age="(julianday('now') - julianday(received_at)) * 86400.0"),
    present_columns=(
        f"SELECT name FROM pragma_table_info('onceonly_events') WHERE name IN ({_NAMES})"
    ),
    attempts=_POSTGRES.attempts,
)


class EventHistory:
    """Read-only statements on the events and their attempts, for one engine
    kind (``"sqlite"`` or ``"postgresql"``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._sql = _POSTGRES if kind == "postgresql" else _SQLITE
        # Looked up until all are seen: a column is never dropped, but one may
        # appear when a newer version migrates the database.
        self._present: frozenset[str] = frozenset()

    # The queue gauges.

    def queue(self, engine: sa.Engine, *, cap: int = 100_000) -> QueueStats:
        """Unfinished events per status (each count stops at `cap`) and the age
        of the oldest pending one, in one short read transaction."""
        with translated("reading the queue"), reading(engine) as conn:
            rows = conn.execute(sa.text(self._sql.queue_depth), {"cap": cap}).all()
            age = conn.execute(sa.text(self._sql.oldest_pending_age)).scalar()
        depth = {str(row.status): int(row.n) for row in rows}
        return QueueStats(depth=depth, oldest_pending_age=max(0.0, float(age or 0.0)))

    def oldest_pending_age(self, engine: sa.Engine) -> float:
        """Seconds since the oldest pending event was received (0: none waits)."""
        with translated("reading the queue"), reading(engine) as conn:
            age = conn.execute(sa.text(self._sql.oldest_pending_age)).scalar()
        return max(0.0, float(age or 0.0))

    # The dashboard.

    def tallies(self, engine: sa.Engine) -> Tallies:
        """Events (and their duplicate deliveries) by provider and status."""
        with translated("counting events"), reading(engine) as conn:
            counted = "duplicates" in self._columns(conn)
            extra = ", coalesce(sum(duplicates), 0) AS duplicates" if counted else ""
            rows = conn.execute(
                sa.text(
                    f"SELECT provider, status, count(*) AS n{extra} FROM onceonly_events"
                    " GROUP BY provider, status"
                )
            ).all()
        return Tallies(
            rows=[
                EventTally(
                    provider=str(row.provider),
                    status=str(row.status),
                    events=int(row.n),
                    duplicates=int(row.duplicates) if counted else 0,
                )
                for row in rows
            ],
            duplicates_counted=counted,
        )

    def events(
        self,
        engine: sa.Engine,
        *,
        provider: str | None = None,
        status: str | None = None,
        event_type: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
        object_id: str | None = None,
        tenant: str | None = None,
        event_id: str | None = None,
    ) -> list[EventSummary]:
        """Newest first; each filter (when given and not empty) is an exact match.

        `object_id` finds every event about one provider object (a payment),
        across providers, through ``onceonly_events_object_idx``."""
        where = []
        params: dict[str, Any] = {"limit": limit}
        for column, value in (
            ("provider", provider),
            ("status", status),
            ("event_type", event_type),
            ("object_id", object_id),
            ("tenant", tenant),
            ("event_id", event_id),
        ):
            if value:
                where.append(f"{column} = :{column}")
                params[column] = value
        if tenant:
            # Spelled out so that the planner may use the partial tenant
            # index whatever the bound value (SQLite cannot infer it).
            where.append(_HAS_TENANT)
        if before_id is not None:
            where.append("id < :before_id")
            params["before_id"] = before_id
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        with translated("listing events"), reading(engine) as conn:
            present = self._columns(conn)
            if (object_id and "object_id" not in present) or (tenant and "tenant" not in present):
                return []  # a schema from before object ids or tenants: none match
            extra = "".join(f", {c}" for c in ("duplicates", "object_id", "tenant") if c in present)
            rows = conn.execute(
                sa.text(
                    f"SELECT {_SUMMARY_COLUMNS}{extra} FROM onceonly_events{clause}"
                    " ORDER BY id DESC LIMIT :limit"
                ),
                params,
            ).all()
        return [_summary(row) for row in rows]

    def event(self, engine: sa.Engine, pk: int) -> EventRecord | None:
        """The event with this row id, its payload and its attempts."""
        with translated("reading an event"), reading(engine) as conn:
            present = self._columns(conn)
            extra = "".join(f", {c}" for c in OPTIONAL_COLUMNS if c in present)
            row = conn.execute(
                sa.text(
                    f"SELECT {_SUMMARY_COLUMNS}{extra}, body, headers, processed_at, handler"
                    " FROM onceonly_events WHERE id = :id"
                ),
                {"id": pk},
            ).one_or_none()
            if row is None:
                return None
            attempts = self._attempts(conn, pk)
        headers = row.headers
        if isinstance(headers, str):  # SQLite keeps JSON text
            headers = json.loads(headers)
        mapping = row._mapping
        return EventRecord(
            summary=_summary(row),
            body=None if row.body is None else bytes(row.body),
            headers=headers or {},
            processed_at=row.processed_at,
            handler=row.handler,
            last_duplicate_at=mapping.get("last_duplicate_at"),
            payload_purged_at=mapping.get("payload_purged_at"),
            attempts=attempts,
        )

    def attempts(self, engine: sa.Engine, pk: int) -> list[Attempt]:
        """The recorded attempts of one event, oldest first."""
        with translated("reading attempts"), reading(engine) as conn:
            return self._attempts(conn, pk)

    def _attempts(self, conn: sa.Connection, pk: int) -> list[Attempt]:
        rows = conn.execute(sa.text(self._sql.attempts), {"pk": pk}).all()
        return [
            Attempt(
                attempt=row.attempt,
                worker=row.worker,
                outcome=row.outcome,
                error_type=row.error_type,
                error_message=row.error_message,
                traceback=row.traceback,
                finished_at=str(row.finished_at),
            )
            for row in rows
        ]

    def _columns(self, conn: sa.Connection) -> frozenset[str]:
        if len(self._present) < len(OPTIONAL_COLUMNS):
            names = conn.execute(sa.text(self._sql.present_columns)).scalars()
            self._present = frozenset(str(name) for name in names)
        return self._present


def _summary(row: sa.Row[Any]) -> EventSummary:
    mapping = row._mapping
    return EventSummary(
        id=int(row.id),
        provider=row.provider,
        event_id=row.event_id,
        event_type=row.event_type,
        status=row.status,
        attempts=int(row.attempts),
        received_at=row.received_at,
        last_error=row.last_error,
        duplicates=int(mapping["duplicates"] or 0) if "duplicates" in mapping else None,
        object_id=mapping.get("object_id"),
        tenant=mapping.get("tenant") or "",
    )
