"""``settings.ONCEONLY``: one :class:`~onceonly.Onceonly` built from Django's settings.

::

    ONCEONLY = {
        "DATABASE": "default",                       # an alias of DATABASES
        "PROVIDERS": {"stripe": Stripe("whsec_...")},  # route name -> provider
        "API_CLIENTS": {"stripe": StripeClient("sk_...")},
        "OPTIONS": {"max_attempts": 8},              # any Onceonly keyword
    }

The database is Django's own: its URL is derived from ``DATABASES[alias]``,
so onceonly's tables sit beside the project's and one backup holds both.
The environment's ``ONCEONLY_*`` variables are read as in ``onceonly serve``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.core.signals import setting_changed

from ..._exceptions import ConfigurationError
from ...config import Onceonly
from ...handlers import HandlerRegistry

__all__ = ["database_alias", "database_url_for", "get_app", "reset"]

_KNOWN_KEYS = frozenset({"DATABASE", "PROVIDERS", "API_CLIENTS", "OPTIONS"})


class _Built:
    """The one application, built on first use (a holder, not a global rebound)."""

    lock = threading.Lock()
    app: Onceonly | None = None
    #: The handlers of every application built here: those the installed
    #: apps' ``webhooks.py`` registered stay when the settings change.
    handlers = HandlerRegistry()


def _setting() -> Mapping[str, Any]:
    value = getattr(settings, "ONCEONLY", {})
    if not isinstance(value, Mapping):
        raise ConfigurationError("settings.ONCEONLY must be a dict")
    unknown = set(value) - _KNOWN_KEYS
    if unknown:
        raise ConfigurationError(
            f"settings.ONCEONLY has unknown keys {sorted(unknown)}; known: {sorted(_KNOWN_KEYS)}"
        )
    return value


def database_alias() -> str:
    """The alias of ``DATABASES`` that holds onceonly's tables."""
    alias = _setting().get("DATABASE", "default")
    if alias not in settings.DATABASES:
        raise ConfigurationError(
            f"settings.ONCEONLY['DATABASE'] is {alias!r}, which DATABASES does not define"
        )
    return str(alias)


def database_url_for(alias: str) -> str:
    """The onceonly database URL of Django's database `alias`."""
    db = settings.DATABASES[alias]
    backend = str(db.get("ENGINE", ""))
    name = str(db.get("NAME") or "")
    if backend == "django.db.backends.sqlite3":
        if not name or name == ":memory:" or name.startswith("file:"):
            raise ConfigurationError(
                f"DATABASES[{alias!r}] is an in-memory SQLite database; onceonly's worker and "
                "receiver need a file that every process opens"
            )
        url = f"sqlite:///{Path(name).resolve()}"
        # One lock wait for both: Django's connections and onceonly's.
        timeout = (db.get("OPTIONS") or {}).get("timeout")
        if isinstance(timeout, int | float) and timeout >= 0:
            url += f"?busy_timeout={int(timeout * 1000)}"
        return url
    if backend in ("django.db.backends.postgresql", "django.contrib.gis.db.backends.postgis"):
        user = quote(str(db.get("USER") or ""), safe="")
        password = quote(str(db.get("PASSWORD") or ""), safe="")
        auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        host = str(db.get("HOST") or "")
        port = str(db.get("PORT") or "")
        netloc = f"{auth}{host}{':' + port if port else ''}"
        return f"postgresql://{netloc}/{quote(name, safe='')}"
    raise ConfigurationError(
        f"DATABASES[{alias!r}] uses {backend!r}; onceonly supports SQLite and PostgreSQL"
    )


def get_app() -> Onceonly:
    """The project's one :class:`~onceonly.Onceonly`, built on first use."""
    with _Built.lock:
        if _Built.app is None:
            conf = _setting()
            _Built.app = Onceonly(
                database_url_for(database_alias()),
                providers=conf.get("PROVIDERS") or {},
                api_clients=conf.get("API_CLIENTS") or {},
                **dict(conf.get("OPTIONS") or {}),
            )
            _Built.app.handlers = _Built.handlers
        return _Built.app


def reset() -> None:
    """Forget the built application (tests, or settings changed at run time)."""
    with _Built.lock:
        _Built.app = None


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("ONCEONLY", "DATABASES"):
        reset()


def _after_fork() -> None:
    # A child forked after the application was built (gunicorn --preload)
    # must not share its parent's connections: same settings and handlers,
    # resources of its own.
    _Built.lock = threading.Lock()
    if _Built.app is not None:
        _Built.app = _Built.app.replace()


setting_changed.connect(_on_setting_changed)
os.register_at_fork(after_in_child=_after_fork)
