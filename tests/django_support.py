"""The Django test project (tests/djangoproject), in process and in subprocesses.

Django is configured once per test process, so the in-process tests share one
settings module with two databases: ``default`` (a SQLite file of this run)
and ``postgresql`` (the run's PostgreSQL database). :func:`django_alias`
points onceonly and the shop's tables at the engine's alias for one test;
:func:`project_env` gives a subprocess (gunicorn, ``manage.py``) the same
project on a database of its own.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from ports import free_port
from processes import Proc

PROJECT = Path(__file__).resolve().parent / "djangoproject"
_SQLITE_FILE = Path(tempfile.mkdtemp(prefix="onceonly-django-")) / "default.sqlite3"


def database_env(url: str) -> dict[str, str]:
    """The environment that makes the project's ``default`` database `url`."""
    return {"ONCEONLY_TEST_DJANGO_DB": url, "DJANGO_SETTINGS_MODULE": "project.settings"}


def project_env(url: str, **extra: str) -> dict[str, str]:
    """A full environment for a subprocess running the project on `url`."""
    env = dict(os.environ)
    env.update(database_env(url))
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def setup(postgres_url: str | None) -> None:
    """Configure Django in this process (once; later calls do nothing).

    `postgres_url` is the run's PostgreSQL database whenever PostgreSQL is
    among the engines, whichever engine the first test runs on: the set of
    aliases is fixed at set-up."""
    import django
    from django.conf import settings

    if settings.configured:
        return
    if str(PROJECT) not in sys.path:
        sys.path.insert(0, str(PROJECT))
    given = database_env(f"sqlite:///{_SQLITE_FILE}")
    if postgres_url:
        given["ONCEONLY_TEST_DJANGO_POSTGRES"] = postgres_url
    os.environ.update(given)
    try:
        django.setup()
    finally:
        # Read once, by the set-up: left in the environment, they would reach
        # every subprocess a later test starts (a Celery worker then loads
        # Django's fixup and fails on a project it cannot import).
        for name in given:
            os.environ.pop(name, None)


@contextlib.contextmanager
def django_alias(engine: str, postgres_url: str | None) -> Iterator[str]:
    """Django set up, onceonly and the shop on `engine`'s alias, migrated from
    empty; the alias, for ``using=``. The caller empties the PostgreSQL
    database first (the ``database_url`` fixture does)."""
    setup(postgres_url)
    from django.core.management import call_command
    from django.db import connections
    from django.test import override_settings

    from onceonly.contrib.django import reset

    alias = "default" if engine == "sqlite" else "postgresql"
    connections.close_all()
    if engine == "sqlite":
        for suffix in ("", "-wal", "-shm", ".effects", ".effects-wal", ".effects-shm"):
            Path(f"{_SQLITE_FILE}{suffix}").unlink(missing_ok=True)
    from django.conf import settings

    onceonly: dict[str, Any] = {**settings.ONCEONLY, "DATABASE": alias}
    with override_settings(ONCEONLY=onceonly):
        reset()
        call_command("migrate", database=alias, verbosity=0)
        try:
            yield alias
        finally:
            connections.close_all()
            reset()


def deliver(deliveries: list[tuple[bytes, dict[str, str]]]) -> list[bool]:
    """Store signed Stripe deliveries through the project's inbox, in process;
    for each, whether it was a duplicate."""
    import asyncio

    from onceonly.contrib.django import get_app
    from onceonly.events import Delivery

    app = get_app()

    async def receive() -> list[bool]:
        try:
            receipts = await asyncio.gather(
                *(app.inbox.receive(Delivery("stripe", b, h, {})) for b, h in deliveries)
            )
        finally:
            await app.store.close()
        return [r.duplicate for r in receipts]

    return asyncio.run(receive())


def run_worker_until_idle(alias: str, **options: Any) -> None:
    """The project's worker, as ``manage.py onceonly_worker --until-idle`` runs
    it, in this process."""
    from onceonly.contrib.django import get_app
    from onceonly.contrib.django.transactions import DjangoTransactions

    app = get_app()
    # Polled often: a failed event's retries are due within a fraction of a
    # second (the project's retry_base), and PostgreSQL's NOTIFY only says
    # "new event".
    options.setdefault("poll_interval", 0.05)
    app.worker(transactions=DjangoTransactions(alias), **options).run_until_idle(30)
    app.engine.dispose()


# The project as subprocesses: manage.py, gunicorn (WSGI), uvicorn (ASGI).


def manage(url: str, cwd: Path, *args: str, **env: str) -> str:
    """Run ``manage.py`` on the project with its database at `url`; its output."""
    done = subprocess.run(
        [sys.executable, str(PROJECT / "manage.py"), *args],
        env=project_env(url, **env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout + done.stderr


def _start(procs: list[Proc], name: str, args: list[str], url: str, cwd: Path, **env: str) -> Proc:
    log = cwd / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            args,
            env=project_env(url, PYTHONUNBUFFERED="1", **env),
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    proc = Proc(name, process, log)
    procs.append(proc)
    return proc


def _wait_until_serving(proc: Proc, base: str) -> str:
    deadline = time.monotonic() + 30
    while True:
        try:
            # 405: the project is up and the onceonly include answers.
            if httpx.get(f"{base}/webhooks/stripe", timeout=1).status_code == 405:
                return base
        except httpx.TransportError:
            pass
        if not proc.alive() or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{proc.name} did not come up:\n{proc.output()[-5000:]}")
        time.sleep(0.1)


def start_gunicorn(
    procs: list[Proc],
    url: str,
    cwd: Path,
    *,
    workers: int = 2,
    threads: int = 1,
    extra: tuple[str, ...] = (),
    **env: str,
) -> str:
    """gunicorn serving ``project.wsgi`` (sync workers; gthread with `threads` > 1)."""
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "gunicorn",
        "project.wsgi:application",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
        "--threads",
        str(threads),
        "--worker-class",
        "gthread" if threads > 1 else "sync",
        "--log-level",
        "warning",
        *extra,
    ]
    proc = _start(procs, "gunicorn", args, url, cwd, **env)
    return _wait_until_serving(proc, f"http://127.0.0.1:{port}")


def start_uvicorn(procs: list[Proc], url: str, cwd: Path, **env: str) -> str:
    """uvicorn serving ``project.asgi``."""
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "uvicorn",
        "project.asgi:application",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--lifespan",
        "off",
    ]
    proc = _start(procs, "uvicorn", args, url, cwd, **env)
    return _wait_until_serving(proc, f"http://127.0.0.1:{port}")


def start_worker(procs: list[Proc], name: str, url: str, cwd: Path, *args: str, **env: str) -> Proc:
    """``manage.py onceonly_worker`` (named ``worker-...``: Proc.stop waits for its start)."""
    command = [sys.executable, str(PROJECT / "manage.py"), "onceonly_worker", *args]
    return _start(procs, name, command, url, cwd, **env)
