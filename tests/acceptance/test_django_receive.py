"""The receiver as a Django URL, served the way Django projects are: gunicorn
(WSGI, sync and gthread workers) and uvicorn (ASGI) subprocesses on the test
project, on a SQLite file and on PostgreSQL. The answers are ``onceonly
serve``'s: 200 only after the commit, one row per event however often it is
delivered, 4xx problems that store nothing, 503 while the database is away."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
import sqlalchemy as sa

pytest.importorskip("django")
pytest.importorskip("gunicorn")

import django_support
from onceonly.db import create_engine
from processes import Proc, rows
from support import TcpProxy, signed, stripe_delivery

#: Over Django's DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB), under onceonly's limit.
BIG = 3 * 1024 * 1024
LIMIT = 4 * 1024 * 1024


@pytest.fixture
def project(database_url: str, tmp_path: Path) -> str:
    """The project's database, migrated by ``manage.py migrate``."""
    django_support.manage(database_url, tmp_path, "migrate", "--verbosity", "0")
    return database_url


@pytest.fixture
def db(project: str) -> Iterator[sa.Engine]:
    engine = create_engine(project, pool_size=2)
    yield engine
    engine.dispose()


def _event_ids(db: sa.Engine) -> Counter[str]:
    return Counter(str(e) for (e,) in rows(db, "SELECT event_id FROM onceonly_events"))


def _post(
    client: httpx.Client,
    url: str,
    body: bytes,
    headers: dict[str, str],
    prefix: str = "webhooks",
) -> httpx.Response:
    return client.post(f"{url}/{prefix}/stripe", content=body, headers=headers)


def _deliver_twice_concurrently(
    url: str, event_ids: list[str], prefix: str = "webhooks"
) -> list[httpx.Response]:
    deliveries = [stripe_delivery(e) for e in event_ids for _ in range(2)]
    with httpx.Client(timeout=30) as client, ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda d: _post(client, url, d[0], d[1], prefix), deliveries))


def _assert_stored_once(db: sa.Engine, event_ids: list[str], answers: list[httpx.Response]) -> None:
    assert [a.status_code for a in answers] == [200] * len(answers)
    fresh = Counter(
        json.loads(a.request.content)["id"]
        for a in answers
        if a.headers["onceonly-duplicate"] == "false"
    )
    # Each event: one delivery stored it, the other was told "duplicate".
    assert fresh == Counter(event_ids)
    assert _event_ids(db) == Counter(event_ids)


def _problem(response: httpx.Response, status: int, reason: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["type"] == f"urn:onceonly:problem:{reason}"


def test_under_gunicorn_each_event_is_stored_once_and_refusals_store_nothing(
    project: str, db: sa.Engine, tmp_path: Path, procs: list[Proc]
) -> None:
    # --preload: the project is imported (handlers registered, the
    # application built) in the master, then forked into the workers.
    url = django_support.start_gunicorn(
        procs,
        project,
        tmp_path,
        workers=2,
        extra=("--preload",),
        ONCEONLY_MAX_BODY_BYTES=str(LIMIT),
    )
    event_ids = [f"evt_wsgi_{i}" for i in range(20)]
    _assert_stored_once(db, event_ids, _deliver_twice_concurrently(url, event_ids))

    with httpx.Client(timeout=30) as client:
        body, headers = stripe_delivery("evt_forged")
        forged = _post(client, url, body, {**headers, "stripe-signature": "t=1,v1=00"})
        _problem(forged, 401, "signature")
        _problem(client.get(f"{url}/webhooks/stripe"), 405, "method")
        assert client.get(f"{url}/webhooks/stripe").headers["allow"] == "POST"
        _problem(client.post(f"{url}/webhooks/nobody", content=b"{}"), 404, "unknown-provider")
        _problem(_post(client, url, *signed(b"not json")), 400, "payload")
        # Over onceonly's 32 KiB of headers (each under gunicorn's own limit).
        padded = {**headers, **{f"x-pad-{i}": "p" * 7000 for i in range(5)}}
        _problem(_post(client, url, body, padded), 431, "headers-too-large")
        # Django's own limit (DATA_UPLOAD_MAX_MEMORY_SIZE) does not apply:
        # onceonly's does, with onceonly's answers.
        padding = "x" * BIG
        big = json.dumps({"id": "evt_big", "type": "t", "data": {"pad": padding}}).encode()
        assert _post(client, url, *signed(big)).status_code == 200
        huge = json.dumps({"id": "evt_huge", "type": "t", "data": {"pad": padding * 2}}).encode()
        _problem(_post(client, url, *signed(huge)), 413, "too-large")
    assert _event_ids(db) == Counter([*event_ids, "evt_big"])


@pytest.mark.parametrize("prefix", ["webhooks", "async-webhooks"], ids=["sync-view", "async-view"])
def test_under_asgi_each_event_is_stored_once(
    project: str, db: sa.Engine, tmp_path: Path, procs: list[Proc], prefix: str
) -> None:
    url = django_support.start_uvicorn(procs, project, tmp_path)
    event_ids = [f"evt_asgi_{i}" for i in range(20)]
    _assert_stored_once(db, event_ids, _deliver_twice_concurrently(url, event_ids, prefix))
    with httpx.Client(timeout=30) as client:
        body, headers = stripe_delivery("evt_forged")
        forged = _post(client, url, body, {**headers, "stripe-signature": "t=1,v1=00"}, prefix)
        _problem(forged, 401, "signature")
        _problem(client.get(f"{url}/{prefix}/stripe"), 405, "method")
        _problem(client.post(f"{url}/{prefix}/nobody", content=b"{}"), 404, "unknown-provider")
    assert _event_ids(db) == Counter(event_ids)


def _through(proxy: TcpProxy, url: str) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    auth = f"{netloc[0]}@" if len(netloc) == 2 else ""
    return urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{proxy.port}"))


def test_database_away_is_503_with_retry_after_and_back_is_200(
    engine: str, project: str, db: sa.Engine, tmp_path: Path, procs: list[Proc]
) -> None:
    def delivery(event_id: str) -> httpx.Response:
        with httpx.Client(timeout=30) as client:
            return _post(client, url, *stripe_delivery(event_id))

    if engine == "postgresql":
        parts = urlsplit(project)
        proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
        proxy.start()
        try:
            # gthread workers: several requests per process share its inbox thread.
            url = django_support.start_gunicorn(
                procs, _through(proxy, project), tmp_path, threads=4
            )
            assert delivery("evt_before").status_code == 200
            proxy.cut()
            away = delivery("evt_away")
            proxy.start()
            back = delivery("evt_back")
        finally:
            proxy.close()
    else:
        url = django_support.start_gunicorn(
            procs, project, tmp_path, threads=4, ONCEONLY_TEST_DJANGO_SQLITE_TIMEOUT="0.5"
        )
        assert delivery("evt_before").status_code == 200
        # Another process holds the write lock past the busy timeout: the
        # receiver cannot commit, and says so.
        path = urlsplit(project).path.removeprefix("/")
        locker = sqlite3.connect(path, isolation_level=None)
        try:
            locker.execute("BEGIN IMMEDIATE")
            away = delivery("evt_away")
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        back = delivery("evt_back")
    _problem(away, 503, "unavailable")
    assert away.headers["retry-after"] == "5"
    assert back.status_code == 200
    assert _event_ids(db) == Counter(["evt_before", "evt_back"])
