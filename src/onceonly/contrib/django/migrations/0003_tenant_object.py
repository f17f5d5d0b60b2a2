"""The events' tenant and object id (onceonly's own migration added the columns).

State only, like ``0002_models``: the models are unmanaged.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies: ClassVar[list[tuple[str, str]]] = [("onceonly", "0002_models")]

    operations: ClassVar[list[Any]] = [
        migrations.AddField(
            model_name="event",
            name="tenant",
            field=models.TextField(
                blank=True,
                default="",
                help_text="The merchant account it arrived for (empty: the only one).",
            ),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="event",
            name="object_id",
            field=models.TextField(
                blank=True,
                help_text="The provider's object (a payment's id).",
                null=True,
                verbose_name="object id",
            ),
        ),
    ]
