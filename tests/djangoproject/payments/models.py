"""The shop's own table: what a handler creates with the Django ORM."""

from __future__ import annotations

from django.db import models


class Payment(models.Model):
    # Not unique on purpose: a duplicate row is what the tests look for.
    event_id: models.CharField[str, str] = models.CharField(max_length=255)
    amount: models.IntegerField[int, int] = models.IntegerField()
    created: models.DateTimeField[object, object] = models.DateTimeField(auto_now_add=True)
