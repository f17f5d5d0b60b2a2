"""onceonly as a Django app: ``INSTALLED_APPS += ["onceonly.contrib.django"]``.

Configuration lives in ``settings.ONCEONLY`` (see :mod:`.conf`); the tables are
created by ``manage.py migrate`` in the database the setting names. See
``docs/django.md``.
"""

from __future__ import annotations

from .conf import get_app, reset

__all__ = ["get_app", "reset"]
