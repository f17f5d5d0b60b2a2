"""onceonly's tables, created by onceonly's own migrations in this database.

Django's migration records that they ran; onceonly's schema version table
records which of its migrations applied, so ``onceonly migrate`` and
``manage.py migrate`` agree.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

from onceonly.store import migrate_blocking

from ..conf import database_alias, database_url_for


def _apply(apps: Any, schema_editor: Any) -> None:
    alias = schema_editor.connection.alias
    if alias != database_alias():
        return  # onceonly lives in one database; the others do not get its tables
    migrate_blocking(database_url_for(alias))


class Migration(migrations.Migration):
    # onceonly's migrations open their own connection: Django's transaction
    # around this one would hold SQLite's write lock against it.
    atomic = False
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [migrations.RunPython(_apply, migrations.RunPython.noop)]
