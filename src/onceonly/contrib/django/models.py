"""Read models over onceonly's own tables, for the Django admin.

The models are unmanaged: onceonly's migrations create and change the tables
(``0001_initial``), Django only reads them. Writes never go through these
models: replay and purge reach the database through onceonly's repositories
(:mod:`onceonly.operations`, :mod:`onceonly.retention`), the same statements
the worker and the command line run, so a status never changes behind the
work queue's back.

Only the columns an operator reads are mapped. The worker's scheduling state
(``run_after``, ``lease_expires_at``, ``fence``) is left out: the engines
store it differently (Unix seconds on SQLite, ``timestamptz`` on PostgreSQL,
where a fresh event's ``run_after`` is ``-infinity``, which no Python datetime
holds).

Times: PostgreSQL's ``timestamptz`` columns arrive as aware datetimes;
SQLite's TEXT columns hold ISO 8601 in UTC (``2026-01-31T12:00:00.123Z``,
or ``+00:00`` where Python wrote them), which Django's SQLite backend parses
into the same aware datetimes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from django.db import models

from ...events import EventStatus

__all__ = ["REPLAY_PERMISSION", "Attempt", "Event"]

#: The admin's replay action, given to users or groups like any permission.
REPLAY_PERMISSION = "replay_event"


class Event(models.Model):
    """One received event: the row of ``onceonly_events`` (it is also the job)."""

    id: models.BigAutoField[int, int] = models.BigAutoField(primary_key=True)
    provider: models.TextField[str, str] = models.TextField(
        help_text="The route name the event arrived on."
    )
    event_id: models.TextField[str, str] = models.TextField(
        "event id", help_text="The provider's id of the event."
    )
    event_type: models.TextField[str | None, str | None] = models.TextField(
        "type", null=True, blank=True
    )
    status: models.TextField[str, str] = models.TextField(
        choices=[(s.value, s.value) for s in EventStatus]
    )
    attempts: models.IntegerField[int, int] = models.IntegerField(
        help_text="Attempts since it was received or last replayed."
    )
    received_at: models.DateTimeField[datetime, datetime] = models.DateTimeField("received")
    processed_at: models.DateTimeField[datetime | None, datetime | None] = models.DateTimeField(
        "processed", null=True, blank=True
    )
    handler: models.TextField[str | None, str | None] = models.TextField(null=True, blank=True)
    last_error: models.TextField[str | None, str | None] = models.TextField(
        "last error", null=True, blank=True
    )
    lease_owner: models.TextField[str | None, str | None] = models.TextField(
        "worker", null=True, blank=True, help_text="The worker holding it while processing."
    )
    duplicates: models.IntegerField[int, int] = models.IntegerField(
        help_text="Deliveries after the first, answered 200."
    )
    last_duplicate_at: models.DateTimeField[datetime | None, datetime | None] = (
        models.DateTimeField("last duplicate", null=True, blank=True)
    )
    payload_purged_at: models.DateTimeField[datetime | None, datetime | None] = (
        models.DateTimeField("payload purged", null=True, blank=True)
    )
    tenant: models.TextField[str, str] = models.TextField(
        blank=True, help_text="The merchant account it arrived for (empty: the only one)."
    )
    object_id: models.TextField[str | None, str | None] = models.TextField(
        "object id", null=True, blank=True, help_text="The provider's object (a payment's id)."
    )
    # Raw as received: shown only through the dashboard's redaction (admin.py).
    body: models.BinaryField[bytes, bytes | memoryview] = models.BinaryField()
    headers: models.JSONField[Any, Any] = models.JSONField()

    class Meta:
        managed = False
        db_table = "onceonly_events"
        ordering: ClassVar[list[str]] = ["-id"]
        verbose_name = "event"
        verbose_name_plural = "events"
        permissions: ClassVar[list[tuple[str, str]]] = [
            (REPLAY_PERMISSION, "Can replay events (put them back in line)")
        ]

    def __str__(self) -> str:
        return f"{self.provider}:{self.event_id}"


class Attempt(models.Model):
    """One recorded attempt at handling an event (``onceonly_attempts``)."""

    id: models.BigAutoField[int, int] = models.BigAutoField(primary_key=True)
    event: models.ForeignKey[Event, Event] = models.ForeignKey(
        Event,
        on_delete=models.DO_NOTHING,
        db_column="event_pk",
        related_name="attempt_records",
        # The table's own foreign key (ON DELETE CASCADE) is onceonly's.
        db_constraint=False,
    )
    attempt: models.IntegerField[int, int] = models.IntegerField()
    worker: models.TextField[str, str] = models.TextField()
    outcome: models.TextField[str, str] = models.TextField()
    error_type: models.TextField[str | None, str | None] = models.TextField(
        "error type", null=True, blank=True
    )
    error_message: models.TextField[str | None, str | None] = models.TextField(
        "message", null=True, blank=True
    )
    traceback: models.TextField[str | None, str | None] = models.TextField(null=True, blank=True)
    finished_at: models.DateTimeField[datetime, datetime] = models.DateTimeField("finished")

    class Meta:
        managed = False
        db_table = "onceonly_attempts"
        ordering: ClassVar[list[str]] = ["id"]
        verbose_name = "attempt"
        verbose_name_plural = "attempts"
        # Read as part of an event; no permissions of its own.
        default_permissions = ()

    def __str__(self) -> str:
        return f"attempt {self.attempt} ({self.outcome})"
