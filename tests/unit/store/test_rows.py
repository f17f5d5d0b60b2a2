"""The one event row mapper reads each column into the Event field of its name,
in every form the drivers return (store/rows.py)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from onceonly.events import Event, EventStatus
from onceonly.store.rows import EVENT_COLUMNS, event_columns, event_from_row

RECEIVED = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
DUPLICATE = datetime(2026, 1, 3, tzinfo=UTC)
PURGED = datetime(2026, 1, 4, tzinfo=UTC)

# Every field a value no other field has, so a column read into the wrong
# field cannot go unnoticed.
EXPECTED = Event(
    id=41,
    provider="stripe",
    event_id="evt_1",
    event_type="charge.succeeded",
    body=b'{"id": "evt_1"}',
    headers={"x-test": "1"},
    received_at=RECEIVED,
    status=EventStatus.FAILED,
    attempts=3,
    last_error="RuntimeError: no",
    duplicates=2,
    last_duplicate_at=DUPLICATE,
    payload_purged_at=PURGED,
)


# Event.json()'s cache is a field too, but no column: it is not passed in.
RECORD_FIELDS = [f for f in dataclasses.fields(Event) if f.init]


def as_driver_row(form: str) -> tuple[Any, ...]:
    """EXPECTED as a row of EVENT_COLUMNS, the way one driver returns it."""
    values: dict[str, Any] = {f.name: getattr(EXPECTED, f.name) for f in RECORD_FIELDS}
    values["status"] = EXPECTED.status.value
    if form == "sqlite":  # times as SQLite's text, headers as JSON text, body as memoryview
        for name in ("received_at", "last_duplicate_at", "payload_purged_at"):
            values[name] = values[name].strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        values["headers"] = json.dumps(values["headers"])
        values["body"] = memoryview(values["body"])
    elif form == "asyncpg":  # jsonb as text
        values["headers"] = json.dumps(values["headers"])
    return tuple(values[name] for name in EVENT_COLUMNS)


def test_every_event_field_has_its_column() -> None:
    assert set(EVENT_COLUMNS) == {f.name for f in RECORD_FIELDS}


@pytest.mark.parametrize("form", ["sqlite", "asyncpg", "psycopg"])
def test_each_column_lands_in_the_field_of_its_name(form: str) -> None:
    assert event_from_row(as_driver_row(form)) == EXPECTED


def test_columns_after_the_event_are_not_read() -> None:
    fence = 7
    assert event_from_row((*as_driver_row("psycopg"), fence)) == EXPECTED


def test_a_naive_sqlite_time_is_utc() -> None:
    row = list(as_driver_row("sqlite"))
    row[EVENT_COLUMNS.index("received_at")] = "2026-01-02 03:04:05"
    row[EVENT_COLUMNS.index("last_duplicate_at")] = None
    event = event_from_row(row)
    assert event.received_at == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert event.last_duplicate_at is None


def test_the_column_list_for_a_statement() -> None:
    assert event_columns().split(", ") == list(EVENT_COLUMNS)
    assert event_columns("e").split(", ") == [f"e.{name}" for name in EVENT_COLUMNS]
