"""docs/django.md's Idempotency-Key example, run as printed: its settings, model,
views and URLs, added to the test project (tests/djangoproject), migrated
with ``makemigrations`` and ``migrate``, served by a real gunicorn."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("django")

import django_support
from onceonly.db import create_engine
from processes import Proc, start_gunicorn, stop_cleanly

DOC = Path(__file__).resolve().parents[2] / "docs" / "django.md"
BLOCKS = ("settings.py", "shop/models.py", "shop/views.py", "shop/urls.py")


def example_blocks() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    blocks = {}
    for name in BLOCKS:
        match = re.search(
            rf"<!-- example: {re.escape(name)} -->\s*```python\n(.*?)```", text, re.DOTALL
        )
        assert match, f"docs/django.md lost its {name} block"
        blocks[name] = match.group(1)
    return blocks


def _write_project(root: Path) -> None:
    blocks = example_blocks()
    (root / "shop" / "migrations").mkdir(parents=True)
    (root / "shop" / "__init__.py").write_text("")
    (root / "shop" / "migrations" / "__init__.py").write_text("")
    for name in BLOCKS[1:]:
        (root / name).write_text(blocks[name], encoding="utf-8")
    # The test project's settings, the example's lines on top. The project
    # already lists onceonly's app, which the example adds.
    (root / "docsite_settings.py").write_text(
        "from project.settings import *  # noqa: F403\n"
        "INSTALLED_APPS = [a for a in INSTALLED_APPS if a != 'onceonly.contrib.django']\n"
        + blocks["settings.py"]
        + "ROOT_URLCONF = 'docsite_urls'\n",
        encoding="utf-8",
    )
    (root / "docsite_urls.py").write_text(
        "from django.urls import include, path\n"
        "urlpatterns = [path('api/', include('shop.urls'))]\n",
        encoding="utf-8",
    )


@pytest.fixture
def site(database_url: str, tmp_path: Path, procs: list[Proc]) -> Iterator[str]:
    _write_project(tmp_path)
    env = django_support.project_env(database_url, DJANGO_SETTINGS_MODULE="docsite_settings")
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    code = (
        "import importlib; from django.core.management import call_command; "
        "call_command('makemigrations', 'shop', verbosity=0); importlib.invalidate_caches(); "
        "call_command('migrate', verbosity=0)"
    )
    manage = [sys.executable, str(django_support.PROJECT / "manage.py"), "shell", "-c", code]
    subprocess.run(manage, env=env, cwd=tmp_path, check=True)
    url, server = start_gunicorn(
        procs, "project.wsgi:application", ["--workers", "2", "--threads", "8"], env, tmp_path
    )
    yield url
    stop_cleanly(server)


def test_the_documented_views_run_once_per_key(site: str, database_url: str) -> None:
    token = {"Authorization": "Bearer app-1"}
    with httpx.Client(base_url=site, headers=token) as client:
        keyless = client.post("/api/orders/", json={"item": "book"})
        first = client.post(
            "/api/orders/", json={"item": "book"}, headers={"Idempotency-Key": "o-1"}
        )
        again = client.post(
            "/api/orders/", json={"item": "book"}, headers={"Idempotency-Key": "o-1"}
        )
        other = client.post(
            "/api/orders/", json={"item": "pen"}, headers={"Idempotency-Key": "o-2"}
        )
        pk = first.json()["id"]
        cancel = {"Idempotency-Key": "c-1"}
        cancelled = client.post(f"/api/orders/{pk}/cancel/", headers=cancel)
        # Run again, the async view would fail: the order is gone.
        cancelled_again = client.post(f"/api/orders/{pk}/cancel/", headers=cancel)
        refund_keyless = client.post(f"/api/orders/{pk}/refund/")
        refund = client.post(f"/api/orders/{pk}/refund/", headers={"Idempotency-Key": "r-1"})
    assert keyless.status_code == 400  # the settings require a key there
    assert keyless.headers["content-type"] == "application/problem+json"
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json() == {"id": pk, "item": "book"}
    assert other.json()["id"] != pk
    assert cancelled.status_code == cancelled_again.status_code == 200
    assert cancelled_again.headers["idempotent-replayed"] == "true"
    assert cancelled_again.json() == {"cancelled": pk}
    assert refund_keyless.status_code == 400  # the decorator's required=True
    assert refund.status_code == 201
    engine = create_engine(database_url)
    with engine.connect() as conn:
        items = [row[0] for row in conn.exec_driver_sql("SELECT item FROM shop_order")]
    engine.dispose()
    assert items == ["pen"]  # two orders made, one cancelled: nothing twice
