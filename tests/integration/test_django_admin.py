"""The Django admin over onceonly's events, and ``manage.py onceonly_replay`` /
``onceonly_purge``: the real admin through Django's test client, on the real
database of each engine; events made by the real worker."""

from __future__ import annotations

import asyncio
import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("django")

import django_support
from conftest import POSTGRES
from onceonly import Event, NewEvent, Onceonly, create_store
from onceonly.context import Context
from support import ENGINES

CARD = "4242424242424242"
SIGNATURE = "t=1,v1=deadbeefcafe"


@dataclass
class Shop:
    """A project with events in every state the admin shows."""

    alias: str
    app: Onceonly
    #: event_id -> row id
    pk: dict[str, int]
    #: The app's twin whose one handler fails ``charge.failed`` events.
    runner: Onceonly

    def status(self, event_id: str) -> tuple[str, int]:
        row = self.row(
            "SELECT status, attempts FROM onceonly_events WHERE id = %s", self.pk[event_id]
        )
        return str(row[0]), int(row[1])

    def attempts(self, event_id: str) -> list[str]:
        from django.db import connections

        with connections[self.alias].cursor() as cursor:
            cursor.execute(
                "SELECT outcome FROM onceonly_attempts WHERE event_pk = %s ORDER BY id",
                [self.pk[event_id]],
            )
            return [str(r[0]) for r in cursor.fetchall()]

    def row(self, sql: str, *params: Any) -> tuple[Any, ...]:
        from django.db import connections

        with connections[self.alias].cursor() as cursor:
            cursor.execute(sql, list(params))
            found = cursor.fetchone()
        assert found is not None
        return tuple(found)


def _insert(app: Onceonly, *events: NewEvent) -> None:
    async def insert() -> None:
        async with create_store(app.database_url) as store:
            await store.insert_events(list(events))

    asyncio.run(insert())


@pytest.fixture
def shop(engine: str, database_url: str) -> Iterator[Shop]:
    """Events received and worked on by the project's own application:
    ``evt_dead`` (its handler failed), ``evt_paid`` and ``evt_old`` processed
    (``evt_old``'s payload then purged), ``evt_new`` pending, from another
    provider."""
    from django.conf import settings
    from django.test import override_settings

    postgres = POSTGRES.url if "postgresql" in ENGINES else None
    with django_support.django_alias(engine, postgres) as alias:
        options = {
            **settings.ONCEONLY["OPTIONS"],
            "max_attempts": 1,
            "dashboard_redact": "card.number",
        }
        with override_settings(ONCEONLY={**settings.ONCEONLY, "OPTIONS": options}):
            from onceonly.contrib.django import get_app

            app = get_app()
            shop = _shop(alias, app)
            try:
                yield shop
            finally:
                shop.runner.engine.dispose()
                app.engine.dispose()


def _shop(alias: str, app: Onceonly) -> Shop:
    headers = {"content-type": "application/json", "stripe-signature": SIGNATURE}
    body = json.dumps({"id": "x", "card": {"number": CARD, "brand": "visa"}}).encode()
    _insert(
        app,
        NewEvent("stripe", "evt_dead", "charge.failed", body, headers),
        NewEvent("stripe", "evt_old", "charge.succeeded", body, headers),
    )

    # The project's handlers (payments/webhooks.py) stay registered in the
    # app's registry for the whole run; this one runs on a twin with a
    # registry of its own, on the same database and settings.
    runner = Onceonly(settings=app.settings)

    @runner.handler("stripe")
    def handle(event: Event, ctx: Context) -> None:
        if event.event_type == "charge.failed":
            raise ValueError("card declined by a bug")

    runner.worker().run_until_idle()
    from django.core.management import call_command

    # The old event's payload goes the way retention sends it (the dead one
    # keeps its own: purge touches processed events only).
    call_command("onceonly_purge", "--older-than", "0s", stdout=io.StringIO())
    _insert(app, NewEvent("stripe", "evt_paid", "charge.succeeded", body, headers))
    runner.worker().run_until_idle()
    _insert(app, NewEvent("github", "evt_new", "push", b"{}", {}))
    from onceonly.contrib.django.models import Event as EventRow

    pk = dict(EventRow.objects.using(alias).values_list("event_id", "id"))
    shop = Shop(alias, app, pk, runner)
    assert [shop.status(e) for e in ("evt_dead", "evt_old", "evt_paid", "evt_new")] == [
        ("dead", 1),
        ("processed", 1),
        ("processed", 1),
        ("pending", 0),
    ]
    return shop


def _user(shop: Shop, name: str, *perms: str) -> Any:
    from django.contrib.auth.models import Permission, User

    user = User.objects.db_manager(shop.alias).create_user(name, password="x", is_staff=True)
    for codename in perms:
        user.user_permissions.add(
            Permission.objects.using(shop.alias).get(
                content_type__app_label="onceonly", codename=codename
            )
        )
    return user


def _client(user: Any) -> Any:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


def _listed(html: str) -> set[int]:
    """The row ids on a changelist page (each row links to its event's page)."""
    return {int(pk) for pk in re.findall(r'href="/admin/onceonly/event/(\d+)/change/', html)}


CHANGELIST = "/admin/onceonly/event/"


def test_staff_with_view_only_sees_events_but_cannot_replay(shop: Shop) -> None:
    stranger = _client(_user(shop, "stranger"))
    assert stranger.get(CHANGELIST).status_code == 403

    viewer = _client(_user(shop, "viewer", "view_event"))
    page = viewer.get(CHANGELIST)
    assert page.status_code == 200
    assert _listed(page.content.decode()) == set(shop.pk.values())
    assert "replay_events" not in page.content.decode()
    # Read-only, even for whoever holds the model's other permissions.
    assert viewer.get(f"{CHANGELIST}add/").status_code == 403

    # Posting the action anyway replays nothing.
    viewer.post(
        CHANGELIST,
        {"action": "replay_events", "_selected_action": [shop.pk["evt_dead"]], "index": 0},
    )
    assert shop.status("evt_dead") == ("dead", 1)

    # A superuser holds every permission, replay included.
    from django.contrib.auth.models import User

    root = User.objects.db_manager(shop.alias).create_superuser("root", password="x")
    assert "replay_events" in _client(root).get(CHANGELIST).content.decode()


def test_replay_action_requeues_and_names_what_it_could_not(shop: Shop) -> None:
    operator = _client(_user(shop, "operator", "view_event", "replay_event"))
    assert "replay_events" in operator.get(CHANGELIST).content.decode()
    chosen = [shop.pk[e] for e in ("evt_dead", "evt_old", "evt_new")]
    page = operator.post(
        CHANGELIST,
        {"action": "replay_events", "_selected_action": chosen, "index": 0},
        follow=True,
    )
    text = page.content.decode()
    assert f"Requeued 1 event(s): {shop.pk['evt_dead']}." in text
    assert f"Could not replay 1 event(s) whose payload was purged: {shop.pk['evt_old']}." in text
    assert f"1 event(s) already in line (pending or processing): {shop.pk['evt_new']}." in text

    # Back in line, its history kept; the purged one did not move.
    assert shop.status("evt_dead") == ("pending", 0)
    assert shop.attempts("evt_dead") == ["dead"]
    assert shop.status("evt_old") == ("processed", 1)

    # The worker takes it again: the replayed event runs (and fails) once more.
    shop.runner.worker().run_until_idle()
    assert shop.status("evt_dead") == ("dead", 1)
    assert shop.attempts("evt_dead") == ["dead", "dead"]


def test_filters_and_search_pick_the_right_rows(shop: Shop) -> None:
    admin = _client(_user(shop, "viewer", "view_event"))
    pk = shop.pk

    def listed(query: str) -> set[int]:
        page = admin.get(f"{CHANGELIST}?{query}")
        assert page.status_code == 200, query
        return _listed(page.content.decode())

    assert listed("status__exact=dead") == {pk["evt_dead"]}
    assert listed("status__exact=processed") == {pk["evt_paid"], pk["evt_old"]}
    assert listed("provider=github") == {pk["evt_new"]}
    assert listed("event_type=charge.succeeded") == {pk["evt_paid"], pk["evt_old"]}
    assert listed("q=evt_paid") == {pk["evt_paid"]}
    assert listed("q=stripe:evt_old") == {pk["evt_old"]}
    assert listed(f"q={pk['evt_new']}") == {pk["evt_new"]}
    assert listed("q=evt_") == set()  # exact, not a substring scan
    # Hostile queries are answered, never a server error.
    assert listed("q=" + "9" * 30) == set()
    assert listed("q=%27%20OR%201%3D1%20--") == set()
    for url in (f"{CHANGELIST}{'9' * 30}/change/", f"{CHANGELIST}x/change/"):
        assert admin.get(url).status_code in (302, 404), url
    assert admin.get(f"{CHANGELIST}?status__exact=bogus").status_code in (200, 302)
    # The filter lists offer the values present.
    page = admin.get(CHANGELIST).content.decode()
    assert "?provider=github" in page
    assert "?event_type=push" in page


def test_event_page_redacts_the_payload_and_shows_attempts(shop: Shop) -> None:
    admin = _client(_user(shop, "viewer", "view_event"))
    page = admin.get(f"{CHANGELIST}{shop.pk['evt_dead']}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert CARD not in text
    assert SIGNATURE not in text
    assert "[redacted]" in text
    assert "visa" in text  # what is not secret is shown
    assert "application/json" in text
    # The attempt, with its error and traceback.
    assert "ValueError" in text
    assert "card declined by a bug" in text
    assert "Traceback" in text

    purged = admin.get(f"{CHANGELIST}{shop.pk['evt_old']}/change/").content.decode()
    assert "(purged with onceonly purge)" in purged
    # No way to change or delete from there.
    assert admin.get(f"{CHANGELIST}{shop.pk['evt_old']}/delete/").status_code == 403


def test_manage_py_replay_and_purge_print_what_the_cli_prints(shop: Shop) -> None:
    from django.core.management import CommandError, call_command

    out = io.StringIO()
    call_command("onceonly_replay", "--status", "dead", "--format", "json", stdout=out)
    assert json.loads(out.getvalue()) == {"replayed": [shop.pk["evt_dead"]]}
    assert shop.status("evt_dead") == ("pending", 0)

    out = io.StringIO()
    call_command("onceonly_replay", "stripe:evt_paid", stdout=out)
    assert out.getvalue() == "replayed 1 event(s)\n"
    assert shop.status("evt_paid") == ("pending", 0)

    with pytest.raises(CommandError, match="no event stripe:evt_nope") as failed:
        call_command("onceonly_replay", "stripe:evt_nope", stdout=io.StringIO())
    assert failed.value.returncode == 1
    with pytest.raises(CommandError, match="payload was purged"):
        call_command("onceonly_replay", str(shop.pk["evt_old"]), stdout=io.StringIO())
    with pytest.raises(CommandError, match="not both"):
        call_command("onceonly_replay", stdout=io.StringIO())

    out = io.StringIO()
    call_command("onceonly_purge", "--dry-run", "--format", "json", stdout=out)
    report = json.loads(out.getvalue())
    assert report["dry_run"] is True
    # Nothing processed is 30 days old (the default horizon).
    assert report["payloads_dropped"] == 0
    with pytest.raises(CommandError, match="not a duration"):
        call_command("onceonly_purge", "--older-than", "3x")
    for pause in ("-1", "61", "nan", "soon"):
        with pytest.raises(CommandError, match="--pause"):
            call_command("onceonly_purge", "--pause", pause)
    out = io.StringIO()
    call_command("onceonly_purge", "--dry-run", "--pause", "0.01", "--format", "json", stdout=out)
    assert json.loads(out.getvalue())["payloads_dropped"] == 0
    # The command line's own refusal, on one line, with its exit status.
    with pytest.raises(CommandError, match=r"--keep-ids \(2:00:00\) is shorter than") as refused:
        call_command("onceonly_purge", "--older-than", "1d", "--keep-ids", "2h")
    assert refused.value.returncode == 2


def _manage(*args: str, tmp: Any) -> subprocess.CompletedProcess[str]:
    env = django_support.project_env(f"sqlite:///{tmp / 'manage.sqlite3'}")
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=django_support.PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_manage_py_help_and_no_missing_migrations(tmp_path: Any) -> None:
    helped = _manage("onceonly_replay", "--help", tmp=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "Put events back in line" in helped.stdout
    assert "--status {failed,dead}" in helped.stdout
    assert "PROVIDER:EVENT_ID" in helped.stdout

    # The read models' state is what the migrations say.
    checked = _manage("makemigrations", "--check", "--dry-run", tmp=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "No changes detected" in checked.stdout
