"""The Django application config."""

from __future__ import annotations

from django.apps import AppConfig


class OnceonlyConfig(AppConfig):
    name = "onceonly.contrib.django"
    # "django" would clash with nothing in INSTALLED_APPS, but reads badly in
    # the admin, the migration table and `manage.py migrate onceonly`.
    label = "onceonly"
    verbose_name = "onceonly"
    default_auto_field = "django.db.models.BigAutoField"
