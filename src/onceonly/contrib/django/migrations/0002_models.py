"""The admin's read models over onceonly's tables (``models.py``).

State only: the models are unmanaged, so this migration runs no SQL. The
tables are onceonly's (``0001_initial``), and onceonly's migrations change them.
"""

from __future__ import annotations

from typing import Any, ClassVar

import django.db.models.deletion
from django.db import migrations, models

_STATUSES = [(s, s) for s in ("pending", "processing", "processed", "failed", "dead")]


class Migration(migrations.Migration):
    dependencies: ClassVar[list[tuple[str, str]]] = [("onceonly", "0001_initial")]

    operations: ClassVar[list[Any]] = [
        migrations.CreateModel(
            name="Event",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("provider", models.TextField(help_text="The route name the event arrived on.")),
                (
                    "event_id",
                    models.TextField(
                        help_text="The provider's id of the event.", verbose_name="event id"
                    ),
                ),
                ("event_type", models.TextField(blank=True, null=True, verbose_name="type")),
                ("status", models.TextField(choices=_STATUSES)),
                (
                    "attempts",
                    models.IntegerField(
                        help_text="Attempts since it was received or last replayed."
                    ),
                ),
                ("received_at", models.DateTimeField(verbose_name="received")),
                (
                    "processed_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="processed"),
                ),
                ("handler", models.TextField(blank=True, null=True)),
                ("last_error", models.TextField(blank=True, null=True, verbose_name="last error")),
                (
                    "lease_owner",
                    models.TextField(
                        blank=True,
                        help_text="The worker holding it while processing.",
                        null=True,
                        verbose_name="worker",
                    ),
                ),
                (
                    "duplicates",
                    models.IntegerField(help_text="Deliveries after the first, answered 200."),
                ),
                (
                    "last_duplicate_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="last duplicate"),
                ),
                (
                    "payload_purged_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="payload purged"),
                ),
                ("body", models.BinaryField()),
                ("headers", models.JSONField()),
            ],
            options={
                "verbose_name": "event",
                "verbose_name_plural": "events",
                "db_table": "onceonly_events",
                "ordering": ["-id"],
                "permissions": [("replay_event", "Can replay events (put them back in line)")],
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="Attempt",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                # makemigrations leaves an unmanaged model's relations out of
                # its state; written here so the state is the model.
                (
                    "event",
                    models.ForeignKey(
                        db_column="event_pk",
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="attempt_records",
                        to="onceonly.event",
                    ),
                ),
                ("attempt", models.IntegerField()),
                ("worker", models.TextField()),
                ("outcome", models.TextField()),
                ("error_type", models.TextField(blank=True, null=True, verbose_name="error type")),
                ("error_message", models.TextField(blank=True, null=True, verbose_name="message")),
                ("traceback", models.TextField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(verbose_name="finished")),
            ],
            options={
                "verbose_name": "attempt",
                "verbose_name_plural": "attempts",
                "db_table": "onceonly_attempts",
                "ordering": ["id"],
                "managed": False,
                "default_permissions": (),
            },
        ),
    ]
