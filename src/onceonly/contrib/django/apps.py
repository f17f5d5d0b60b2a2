"""The Django application config: handlers found in each app's ``webhooks.py``."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class OnceonlyConfig(AppConfig):
    name = "onceonly.contrib.django"
    # "django" would clash with nothing in INSTALLED_APPS, but reads badly in
    # the admin, the migration table and `manage.py migrate onceonly`.
    label = "onceonly"
    verbose_name = "onceonly"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # As the admin finds admin.py: importing each installed app's
        # webhooks.py registers its handlers, in the worker and the views alike.
        autodiscover_modules("webhooks")
