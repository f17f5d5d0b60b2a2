"""A real Django project for the tests: the shop a Django user would write.

Its databases come from the environment, so one settings module serves the
subprocesses (gunicorn, ``manage.py``) and the in-process tests alike:

- ``ONCEONLY_TEST_DJANGO_DB``: the ``default`` database, as an onceonly URL
  (``sqlite:////abs/path.db`` or ``postgresql://user@host:port/db``);
- ``ONCEONLY_TEST_DJANGO_POSTGRES`` (optional): a second alias,
  ``postgresql``, so one test process can run the same test on both engines;
- ``ONCEONLY_TEST_DJANGO_SQLITE_TIMEOUT``: SQLite's lock wait, seconds (30);
- ``ONCEONLY_TEST_DJANGO_ALIAS``: which alias holds onceonly's tables and the
  shop's (default ``default``); in-process tests switch with
  ``override_settings``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from onceonly.providers import Stripe

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "test-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True


def database(url: str) -> dict[str, Any]:
    """Django's DATABASES entry for an onceonly URL."""
    if url.startswith("sqlite:///"):
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": url.removeprefix("sqlite:///"),
            # What onceonly's worker requires on SQLite (docs/django.md): its
            # transactions take the write lock up front, and wait for it.
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": float(os.environ.get("ONCEONLY_TEST_DJANGO_SQLITE_TIMEOUT", "30")),
            },
        }
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


DATABASES = {
    "default": database(
        os.environ.get("ONCEONLY_TEST_DJANGO_DB", f"sqlite:///{BASE_DIR / 'db.sqlite3'}")
    )
}
if os.environ.get("ONCEONLY_TEST_DJANGO_POSTGRES"):
    DATABASES["postgresql"] = database(os.environ["ONCEONLY_TEST_DJANGO_POSTGRES"])
DATABASE_ROUTERS = ["payments.routing.OnceonlyDatabase"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "onceonly.contrib.django",
    "payments",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
if os.environ.get("ONCEONLY_TEST_DJANGO_IDEMPOTENCY") == "1":
    MIDDLEWARE.append("onceonly.contrib.django.idempotency.IdempotencyMiddleware")
ROOT_URLCONF = "project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
WSGI_APPLICATION = "project.wsgi.application"
ASGI_APPLICATION = "project.asgi.application"
STATIC_URL = "static/"

ONCEONLY = {
    "DATABASE": os.environ.get("ONCEONLY_TEST_DJANGO_ALIAS", "default"),
    "PROVIDERS": {
        "stripe": Stripe(os.environ.get("ONCEONLY_TEST_STRIPE_SECRET", "whsec_test_secret"))
    },
    "OPTIONS": {"retry_base": 0.05, "retry_cap": 0.2},
}
