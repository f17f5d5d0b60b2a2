"""Idempotency-Key for Django views, over real HTTP, on a real SQLite file and PostgreSQL.

The conformance tests of test_idempotency.py run here against the test
project (tests/djangoproject, its ``orders`` views) with
:class:`~onceonly.contrib.django.idempotency.IdempotencyMiddleware` on:
sync views under a real gunicorn (two worker processes, threads), async
views under uvicorn. A server and its database serve a whole module (one per
engine and front end: the shared tests use distinct keys); each test counts
its own runs. Then what is Django's own: keys scoped by the user logged in
through Django's auth, the decorator on a project without the middleware
(a class-based view, an async view, Django's 500 page kept), a client that
goes away mid-stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import asyncpg
import httpx
import pytest

pytest.importorskip("django")

import test_idempotency as shared
from test_idempotency import (
    key,
    test_50_concurrent_requests_with_one_key_run_the_endpoint_once,
    test_a_500_is_stored_and_replayed_not_run_again,
    test_first_request_runs_and_repeats_replay_it,
    test_keys_are_scoped_by_client_identity,
    test_large_streamed_responses_replay_byte_for_byte,
    test_quoted_and_bare_keys_are_the_same_key,
    test_same_key_different_request_is_422,
    test_validation_failures_are_not_stored,
)

import django_support
from conftest import POSTGRES
from ports import free_port
from support import ENGINES

# The shared tests, collected again in this module: with its fixtures
# (server, shop, database_url), they run against the Django project.
__all__ = [
    "test_50_concurrent_requests_with_one_key_run_the_endpoint_once",
    "test_a_500_is_stored_and_replayed_not_run_again",
    "test_first_request_runs_and_repeats_replay_it",
    "test_keys_are_scoped_by_client_identity",
    "test_large_streamed_responses_replay_byte_for_byte",
    "test_quoted_and_bare_keys_are_the_same_key",
    "test_same_key_different_request_is_422",
    "test_validation_failures_are_not_stored",
]

USERS = ("ana", "bia")


class RemoteShop:
    """The runs of the server's views, as ``Shop.runs`` gives them in process."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        for path in directory.iterdir():
            path.unlink()

    @property
    def runs(self) -> dict[str, int]:
        return {path.name: path.stat().st_size for path in self.directory.iterdir()}


class Site(contextlib.AbstractContextManager["Site"]):
    """The test project served by a real server subprocess."""

    def __init__(self, frontend: str, env: dict[str, str], log: Path) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.variant = "sync" if frontend == "wsgi" else "async"
        if frontend == "wsgi":
            # Two processes: the concurrent requests' claims meet in the database.
            args = ["gunicorn", "project.wsgi:application", "--bind", f"127.0.0.1:{port}"]
            args += ["--workers", "2", "--worker-class", "gthread", "--threads", "32"]
        else:
            args = ["uvicorn", "project.asgi:application", "--port", str(port)]
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", *args, "--log-level", "warning"],
                env=env,
                cwd=django_support.PROJECT,
                stdout=out,
                stderr=subprocess.STDOUT,
                # Its own process group: gunicorn's workers go with their master.
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/up", timeout=1).status_code == 404:
                    return
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"{args[0]} did not come up:\n{log.read_text()[-5000:]}")
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    @property
    def base(self) -> str:
        """Where the shop's views are (``/orders``, ``/slow``... under it)."""
        return f"{self.url}/orders/{self.variant}"


@pytest.fixture(scope="module", params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module", params=["wsgi", "asgi"])
def frontend(request: pytest.FixtureRequest) -> str:
    """Sync views under gunicorn (WSGI) or async views under uvicorn (ASGI)."""
    return str(request.param)


SQLITE_FILES = ("", "-wal", ".effects", ".effects-wal")


@pytest.fixture(scope="module")
def migrated(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The engine's project database, migrated, with two users: the template
    of each front end's own."""
    if engine == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('django-idem') / 'template.db'}"
    else:
        name = f"onceonly_test_{os.getpid()}_django"
        asyncio.run(_postgres(f'DROP DATABASE IF EXISTS "{name}"', f'CREATE DATABASE "{name}"'))
        url = POSTGRES.url.rsplit("/", 1)[0] + f"/{name}"
    # Without a password: the test logs them in by name (hashing one costs 0.3 s).
    users = "; ".join(f"User.objects.create_user({u!r})" for u in USERS)
    code = (
        "from django.core.management import call_command; call_command('migrate', verbosity=0)"
        f"; from django.contrib.auth.models import User; {users}"
    )
    subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        env=django_support.project_env(url),
        cwd=django_support.PROJECT,
        check=True,
    )
    yield url
    if engine != "sqlite":
        asyncio.run(_postgres(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="module")
def project_db(engine: str, frontend: str, migrated: str) -> Iterator[str]:
    """A copy of the migrated database for one front end: the shared tests'
    keys would meet across front ends."""
    if engine == "sqlite":
        template = Path(migrated.removeprefix("sqlite:///"))
        copy = template.with_name(f"{frontend}.db")
        for suffix in SQLITE_FILES:
            if Path(f"{template}{suffix}").exists():
                shutil.copyfile(f"{template}{suffix}", f"{copy}{suffix}")
        yield f"sqlite:///{copy}"
        return
    template_name = migrated.rsplit("/", 1)[1]
    name = f"{template_name}_{frontend}"
    asyncio.run(
        _postgres(
            f'DROP DATABASE IF EXISTS "{name}"',
            f'CREATE DATABASE "{name}" TEMPLATE "{template_name}"',
        )
    )
    yield migrated.rsplit("/", 1)[0] + f"/{name}"
    asyncio.run(_postgres(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def _postgres(*statements: str) -> None:
    conn = await asyncpg.connect(POSTGRES.admin_url, timeout=5)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("django-runs")


def _site(frontend: str, url: str, runs: Path, log: Path, **env: str) -> Site:
    return Site(
        frontend, django_support.project_env(url, ONCEONLY_TEST_DJANGO_RUNS=str(runs), **env), log
    )


@pytest.fixture(scope="module")
def site(engine: str, frontend: str, project_db: str, runs_dir: Path) -> Iterator[Site]:
    """The project with the middleware in MIDDLEWARE."""
    log = runs_dir.parent / f"{frontend}-{engine}-middleware.log"
    with _site(frontend, project_db, runs_dir, log, ONCEONLY_TEST_DJANGO_IDEMPOTENCY="1") as s:
        yield s


@pytest.fixture(scope="module")
def plain_site(engine: str, frontend: str, project_db: str, runs_dir: Path) -> Iterator[Site]:
    """The project without the middleware: only the decorated views are covered."""
    log = runs_dir.parent / f"{frontend}-{engine}-plain.log"
    with _site(frontend, project_db, runs_dir, log) as s:
        yield s


@pytest.fixture
def server(site: Site) -> str:
    return site.base


@pytest.fixture
def shop(runs_dir: Path) -> RemoteShop:
    return RemoteShop(runs_dir)


@pytest.fixture
def database_url(project_db: str) -> str:
    return project_db


@pytest.mark.parametrize(
    ("header", "status"), [('"unterminated', 400), ("", 400), ("x" * 256, 400), ("é", 400)]
)
async def test_malformed_keys_are_400(
    server: str, shop: RemoteShop, header: str, status: int
) -> None:
    # A missing key is not refused: the middleware's default is required=False
    # (the decorated views below require one).
    await shared.test_missing_or_malformed_keys_are_400(
        server, cast(shared.Shop, shop), header, status
    )


async def test_a_client_that_goes_away_mid_response(server: str, shop: RemoteShop) -> None:
    """Under WSGI, the server stops reading the view's stream: the relay reads
    it to its end and records it (the shared test). Under ASGI, Django cancels
    the stream: what was sent cannot be replayed whole, and a 500 is kept,
    not a second run."""
    if server.endswith("/sync"):
        await shared.test_a_client_that_goes_away_mid_response_leaves_its_key_answered(
            server, cast(shared.Shop, shop)
        )
        return
    async with (
        httpx.AsyncClient(base_url=server, timeout=10) as client,
        client.stream("POST", "/trickle", json={}, headers=key("gone")) as first,
    ):
        assert first.status_code == 200
        async for _ in first.aiter_raw():
            break
    deadline = time.monotonic() + 5
    async with httpx.AsyncClient(base_url=server, timeout=10) as client:
        while True:
            again = await client.post("/trickle", json={}, headers=key("gone"))
            if again.status_code != 409 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
    assert again.status_code == 500
    assert again.headers["idempotent-replayed"] == "true"
    assert shop.runs["trickle"] == 1


async def test_keys_are_scoped_by_the_logged_in_user(site: Site, shop: RemoteShop) -> None:
    """Two users logged in through Django's auth send the same key: each gets
    their own answer; the same user gets the replay. Anonymous, with no
    Authorization header, there is no client to scope the key to."""
    same_key = {"idempotency-key": "checkout-1"}
    path = f"{site.base}/whoami"
    async with httpx.AsyncClient() as anonymous:
        refused = await anonymous.post(path, json={"card": "4242"}, headers=same_key)
    async with httpx.AsyncClient() as ana, httpx.AsyncClient() as bia:
        for client, user in zip((ana, bia), USERS, strict=True):
            login = await client.post(f"{site.url}/orders/login", data={"username": user})
            assert login.status_code == 204
        first = await ana.post(path, json={"card": "4242"}, headers=same_key)
        other = await bia.post(path, json={"card": "1881"}, headers=same_key)
        again = await ana.post(path, json={"card": "4242"}, headers=same_key)
    assert refused.status_code == 400
    assert refused.json()["type"].endswith("idempotency-key-unscoped")
    assert (first.status_code, other.status_code, again.status_code) == (201, 201, 201)
    assert (first.json()["user"], other.json()["user"]) == ("ana", "bia")
    assert "idempotent-replayed" not in other.headers
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    assert shop.runs["whoami"] == 2


async def test_a_decorated_view_requires_a_key_and_keeps_djangos_500(
    plain_site: Site, shop: RemoteShop
) -> None:
    """Without the middleware, @idempotent covers its view: a sync class-based
    view (method_decorator) under WSGI, an async view under ASGI. The view
    raises: Django's own 500 page is answered, kept and replayed."""
    name = "refund" if plain_site.variant == "sync" else "capture"
    path = f"{plain_site.base}/{name}"
    async with httpx.AsyncClient() as client:
        missing = await client.post(path, json={})
        first = await client.post(path, json={"fail": True}, headers=key("d-1"))
        again = await client.post(path, json={"fail": True}, headers=key("d-1"))
        ok = await client.post(path, json={}, headers=key("d-2"))
        ok_again = await client.post(path, json={}, headers=key("d-2"))
        undecorated = await client.post(f"{plain_site.base}/orders", json={}, headers=key("d-3"))
        undecorated_again = await client.post(
            f"{plain_site.base}/orders", json={}, headers=key("d-3")
        )
    assert missing.status_code == 400
    assert missing.headers["content-type"] == "application/problem+json"
    assert missing.json()["type"].endswith("idempotency-key-missing")
    assert first.status_code == again.status_code == 500
    assert b"Server Error (500)" in first.content  # Django's page, not the view's
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert (ok.status_code, ok_again.status_code) == (201, 201)
    assert ok_again.headers["idempotent-replayed"] == "true"
    assert shop.runs[name] == 2
    # Without the middleware, the other views know nothing of keys.
    assert undecorated.json()["id"] != undecorated_again.json()["id"]


def test_the_server_logged_no_error(site: Site) -> None:
    """After the tests above on this server (none of its views raises): none
    of the errors a front end on the wrong loop or thread gives (a store used
    from a foreign loop, the session read in async code, a record that could
    not be written), no warning about iterators consumed the wrong way."""
    text = site.log.read_text(errors="replace")
    for sign in (
        "attached to a different loop",
        "SynchronousOnlyOperation",
        "Task was destroyed but it is pending",
        "could not store the response",
        "a 500 is kept",
        "must consume",
        "Warning",
    ):
        assert sign not in text, text[-5000:]
