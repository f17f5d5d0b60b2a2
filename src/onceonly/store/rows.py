"""An ``onceonly_events`` row as an :class:`~onceonly.Event`: one column list, one mapper.

Every statement that reads events (the stores' lookups and listings, the
worker's claim) selects :data:`EVENT_COLUMNS`, in that order, and hands the
row to :func:`event_from_row`. The drivers differ in what they return for the
same column, and the mapper takes each form:

- SQLite (sqlite3, or SQLAlchemy over it) returns times as ISO text and the
  headers as JSON text;
- asyncpg returns times as aware datetimes and ``jsonb`` as text;
- SQLAlchemy over psycopg returns aware datetimes and ``jsonb`` as a dict.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, Protocol

from ..events import Event, EventStatus

__all__ = ["EVENT_COLUMNS", "event_columns", "event_from_row"]

#: The columns of an :class:`~onceonly.Event`, in the order
#: :func:`event_from_row` reads them. Each is the Event field of the same name.
EVENT_COLUMNS = (
    "id",
    "provider",
    "event_id",
    "event_type",
    "body",
    "headers",
    "received_at",
    "status",
    "attempts",
    "last_error",
    "duplicates",
    "last_duplicate_at",
    "payload_purged_at",
    "tenant",
    "object_id",
    "occurred_at",
    "ordering_key",
)


def event_columns(table: str = "") -> str:
    """:data:`EVENT_COLUMNS` for a SELECT or RETURNING list, each prefixed
    with ``table.`` when a table (or alias) is given."""
    prefix = f"{table}." if table else ""
    return ", ".join(prefix + name for name in EVENT_COLUMNS)


class Row(Protocol):
    """What the drivers' rows have in common: a length and their values in order."""

    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Any]: ...


def _moment(value: datetime | str | float | None) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    if isinstance(value, int | float):
        # SQLite keeps the times the worker compares as Unix seconds.
        return datetime.fromtimestamp(value, UTC)
    moment = datetime.fromisoformat(value)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def event_from_row(row: Row) -> Event:
    """The Event in a row whose first columns are :data:`EVENT_COLUMNS`
    (a sqlite3 tuple, an asyncpg Record, a SQLAlchemy Row); columns after
    them (the claim's fence) are not read.

    The row is unpacked rather than read by name: naming each column costs a
    lookup per column (a sqlite3.Row is a quarter slower on a listing), and
    the names come from EVENT_COLUMNS all the same (tests/unit/store/test_rows.py
    holds the unpacking to that list).
    """
    (
        id,
        provider,
        event_id,
        event_type,
        body,
        headers,
        received_at,
        status,
        attempts,
        last_error,
        duplicates,
        last_duplicate_at,
        payload_purged_at,
        tenant,
        object_id,
        occurred_at,
        ordering_key,
    ) = row if len(row) == _WIDTH else tuple(row)[:_WIDTH]
    received = _moment(received_at)
    assert received is not None  # NOT NULL
    return Event(
        id=id,
        provider=provider,
        event_id=event_id,
        event_type=event_type,
        body=bytes(body),
        headers=json.loads(headers) if isinstance(headers, str) else headers,
        received_at=received,
        status=_STATUS[status],
        attempts=attempts,
        last_error=last_error,
        duplicates=duplicates,
        last_duplicate_at=_moment(last_duplicate_at),
        payload_purged_at=_moment(payload_purged_at),
        tenant=tenant,
        object_id=object_id,
        occurred_at=_moment(occurred_at),
        ordering_key=ordering_key,
    )


_WIDTH = len(EVENT_COLUMNS)
# A dict lookup, a fifth of the cost of calling the enum (a claim maps a batch).
_STATUS = {status.value: status for status in EventStatus}
