"""What the dashboard reads from the event store (read-only, both engines).

The statements are :class:`onceonly.store.history.EventHistory`'s; this module
shapes what they return for the pages and the JSON endpoints (times shown in
UTC, counts totalled). Reads are blocking, run off the event loop by the
caller, on read-only connections (:func:`onceonly.store.engine.reading`): on
SQLite they never take the write lock the receiver needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..events import EventStatus
from ..store.activity import ActivityHistory, MinuteActivity
from ..store.history import Attempt, EventHistory, EventSummary

if TYPE_CHECKING:
    import sqlalchemy as sa

    from ..deployment import Deployment

__all__ = ["Activity", "Counts", "EventDetail", "EventReader", "EventRow", "format_time"]

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
    #: The provider's object (a payment id), when the provider names one.
    object_id: str | None = None
    tenant: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "provider": self.provider,
            "tenant": self.tenant,
            "event_id": self.event_id,
            "event_type": self.event_type,
            "status": self.status,
            "attempts": self.attempts,
            "received_at": self.received_at,
            "last_error": self.last_error,
            "duplicates": self.duplicates,
            "object_id": self.object_id,
        }


@dataclass(frozen=True, slots=True)
class Activity:
    """The chart's figures: one entry per minute, oldest first, the current
    minute last (partly elapsed), and the age of the oldest pending event."""

    minutes: list[MinuteActivity]
    oldest_pending_age: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "minutes": len(self.minutes),
            "oldest_pending_age": round(self.oldest_pending_age, 3),
            # Said in the data itself, for scripts that never read the docs.
            "duplicates_counted_as": "events whose latest duplicate fell in the minute",
            "series": [m.to_dict() for m in self.minutes],
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


class EventReader:
    """Read-only queries for one :class:`~onceonly.Onceonly` deployment."""

    def __init__(self, app: Deployment) -> None:
        self.app = app
        self.history = EventHistory(app.engine_kind)
        self.activity_history = ActivityHistory(app.engine_kind)

    @property
    def engine(self) -> sa.Engine:
        # The deployment's: every read here takes a read-only connection of
        # its own (store.engine.reading), which on SQLite leaves the write
        # lock to the receiver and the worker.
        return self.app.engine

    def counts(self) -> Counts:
        tallies = self.history.tallies(self.engine)
        by_provider: dict[str, dict[str, int]] = {}
        duplicates: dict[str, int] | None = {} if tallies.duplicates_counted else None
        for tally in tallies.rows:
            statuses = by_provider.setdefault(tally.provider, dict.fromkeys(STATUSES, 0))
            statuses[tally.status] = tally.events
            if duplicates is not None:
                duplicates[tally.provider] = duplicates.get(tally.provider, 0) + tally.duplicates
        return Counts(dict(sorted(by_provider.items())), duplicates)

    def events(
        self,
        *,
        provider: str | None = None,
        status: str | None = None,
        event_type: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
        object_id: str | None = None,
        tenant: str | None = None,
        event_id: str | None = None,
    ) -> list[EventRow]:
        """Newest first; each filter is an exact match (an event id is
        searched within `tenant` when one is given, never across merchants
        when the operator looks at one)."""
        found = self.history.events(
            self.engine,
            provider=provider,
            status=status,
            event_type=event_type,
            before_id=before_id,
            limit=limit,
            object_id=object_id,
            tenant=tenant,
            event_id=event_id,
        )
        return [_row(summary) for summary in found]

    def activity(self, minutes: int, *, now: float | None = None) -> Activity:
        """The last `minutes` minutes, per minute (see :mod:`onceonly.store.activity`)."""
        return Activity(
            minutes=self.activity_history.per_minute(self.engine, minutes=minutes, now=now),
            oldest_pending_age=self.history.oldest_pending_age(self.engine),
        )

    def event(self, id: int) -> EventDetail | None:
        record = self.history.event(self.engine, id)
        if record is None:
            return None
        return EventDetail(
            row=_row(record.summary),
            body=record.body,
            headers=record.headers,
            processed_at=format_time(record.processed_at) or None,
            handler=record.handler,
            last_duplicate_at=format_time(record.last_duplicate_at) or None,
            payload_purged_at=format_time(record.payload_purged_at) or None,
            attempts=record.attempts,
        )


def _row(summary: EventSummary) -> EventRow:
    return EventRow(
        id=summary.id,
        provider=summary.provider,
        event_id=summary.event_id,
        event_type=summary.event_type,
        status=summary.status,
        attempts=summary.attempts,
        received_at=format_time(summary.received_at),
        last_error=summary.last_error,
        duplicates=summary.duplicates,
        object_id=summary.object_id,
        tenant=summary.tenant,
    )
