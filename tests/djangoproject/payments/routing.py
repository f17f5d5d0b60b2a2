"""The shop's tables live where onceonly's do (``settings.ONCEONLY['DATABASE']``),
so a test switches both engines with one ``override_settings``."""

from __future__ import annotations

from typing import Any

from onceonly.contrib.django.conf import database_alias


class OnceonlyDatabase:
    def db_for_read(self, model: Any, **hints: Any) -> str:
        return database_alias()

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return database_alias()

    def allow_relation(self, *args: Any, **hints: Any) -> bool:
        return True

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return True
