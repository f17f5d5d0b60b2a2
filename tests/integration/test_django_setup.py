"""The Django app's set-up: ``migrate`` creates onceonly's tables in the
project's database, and the application is built from ``settings.ONCEONLY``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

pytest.importorskip("django")

import django_support
from conftest import POSTGRES
from support import ENGINES, STRIPE_SECRET, signed


@pytest.fixture
def alias(engine: str, database_url: str) -> Iterator[str]:
    postgres = POSTGRES.url if "postgresql" in ENGINES else None
    with django_support.django_alias(engine, postgres) as name:
        yield name


def test_migrate_creates_onceonly_tables_in_the_projects_database(alias: str) -> None:
    from django.db import connections

    tables = set(connections[alias].introspection.table_names())
    assert {"onceonly_events", "onceonly_attempts", "payments_payment"} <= tables


def test_the_application_stores_in_the_projects_database(alias: str) -> None:
    from django.db import connections

    from onceonly.contrib.django import get_app
    from onceonly.events import Delivery

    app = get_app()
    body, headers = signed(b'{"id": "evt_django_1", "type": "charge.succeeded"}')
    assert STRIPE_SECRET  # the project's provider signs with the tests' secret

    async def receive() -> None:
        await app.inbox.receive(Delivery("stripe", body, headers, {}))
        await app.store.close()

    asyncio.run(receive())
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT event_id FROM onceonly_events")
        assert [row[0] for row in cursor.fetchall()] == ["evt_django_1"]
