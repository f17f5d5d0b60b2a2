"""The Flask page's example application, run exactly as printed: its code block
is extracted from ``docs/flask.md``, its tables made with ``flask init-db``, and
it is served by gunicorn (two worker processes forked from a preloaded app, threads) with ``onceonly
worker`` beside it, as the page says to run it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from onceonly.db import create_engine
from processes import Proc, start_gunicorn, stop_cleanly
from support import STRIPE_SECRET, stripe_delivery

DOC = Path(__file__).resolve().parents[2] / "docs" / "flask.md"


def example_source() -> str:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(r"<!-- example: flask_app\.py -->\s*```python\n(.*?)```", text, re.DOTALL)
    assert match, "docs/flask.md lost its example block"
    return match.group(1)


def _env(database_url: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEONLY_")}
    env.update(
        ONCEONLY_DATABASE_URL=database_url,
        ONCEONLY_STRIPE_SECRET=STRIPE_SECRET,
        FLASK_SECRET_KEY="test-only",
        PYTHONPATH=str(tmp_path),
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture
def flask_app(database_url: str, tmp_path: Path, procs: list[Proc]) -> Iterator[str]:
    (tmp_path / "flask_app.py").write_text(example_source(), encoding="utf-8")
    env = _env(database_url, tmp_path)
    subprocess.run(
        [sys.executable, "-m", "flask", "--app", "flask_app", "init-db"],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
    )
    url, server = start_gunicorn(
        procs,
        "flask_app:app",
        ["--workers", "2", "--threads", "8", "--preload"],
        env,
        tmp_path,
    )
    yield url
    stop_cleanly(server)


def _check_deliveries(url: str) -> None:
    body, headers = stripe_delivery("evt_flask_1", extra={"object": {"id": "pi_1", "amount": 990}})
    first = httpx.post(f"{url}/webhooks/stripe", content=body, headers=headers, timeout=10)
    # Concurrent resends, to two gunicorn processes of eight threads each.
    with ThreadPoolExecutor(8) as pool:
        resends = list(
            pool.map(
                lambda _: httpx.post(
                    f"{url}/webhooks/stripe", content=body, headers=headers, timeout=10
                ),
                range(16),
            )
        )
    forged = httpx.post(
        f"{url}/webhooks/stripe", content=body.replace(b"evt_flask_1", b"evt_x"), headers=headers
    )
    unknown = httpx.post(f"{url}/webhooks/nobody", content=body, headers=headers)
    assert (first.status_code, first.headers["onceonly-duplicate"]) == (200, "false")
    assert first.json() == {"received": True, "duplicate": False}
    assert {(r.status_code, r.headers["onceonly-duplicate"]) for r in resends} == {(200, "true")}
    assert forged.status_code == 401
    assert forged.headers["content-type"] == "application/problem+json"
    assert unknown.status_code == 404


def _check_orders(url: str) -> None:
    key = {"Idempotency-Key": "o-1"}
    book, pen = {"item": "book"}, {"item": "pen"}
    anonymous = httpx.post(f"{url}/orders", json=book, headers=key)
    with httpx.Client(base_url=url) as ana, httpx.Client(base_url=url) as bia:
        ana.post("/login", json={"customer": "ana"})
        bia.post("/login", json={"customer": "bia"})
        order = ana.post("/orders", json=book, headers=key)
        again = ana.post("/orders", json=book, headers=key)
        other = bia.post("/orders", json=pen, headers=key)
        reused = ana.post("/orders", json=pen, headers=key)
        keyless = ana.post("/orders", json=book)
    assert anonymous.status_code == 400  # a key, and nobody to scope it to
    assert order.status_code == 201
    assert (again.status_code, again.headers["idempotent-replayed"]) == (201, "true")
    assert again.json() == order.json()
    assert other.status_code == 201
    assert "idempotent-replayed" not in other.headers
    assert other.json()["id"] != order.json()["id"]
    assert reused.status_code == 422
    assert keyless.status_code == 400


def _check_concurrent_orders(url: str) -> None:
    """One customer's client sends one key 16 times at once, to both processes:
    the database lets one of them run."""
    with httpx.Client(base_url=url) as login:
        login.post("/login", json={"customer": "cai"})
        cookies = dict(login.cookies)
    key = {"Idempotency-Key": "o-race"}

    def send(_: int) -> httpx.Response:
        return httpx.post(f"{url}/orders", json={"item": "mug"}, headers=key, cookies=cookies)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(send, range(16)))
    assert {a.status_code for a in answers} <= {201, 409}
    created = {a.json()["id"] for a in answers if a.status_code == 201}
    assert len(created) == 1
    assert sum("idempotent-replayed" not in a.headers for a in answers if a.status_code == 201) == 1


def test_the_documented_flask_app_stores_each_delivery_once_and_runs_each_order_once(
    flask_app: str, database_url: str, tmp_path: Path, procs: list[Proc]
) -> None:
    _check_deliveries(flask_app)
    _check_orders(flask_app)
    _check_concurrent_orders(flask_app)
    # The worker, as the page runs it, handles the one stored event once.
    env = _env(database_url, tmp_path)
    worker = Proc.start(
        "worker", ["worker", "--app", "flask_app:onceonly", "--concurrency", "1"], env, tmp_path
    )
    procs.append(worker)
    engine = create_engine(database_url)
    try:
        deadline = time.monotonic() + 20
        while True:
            with engine.connect() as conn:
                paid = conn.execute(sa.text("SELECT intent, amount FROM payments")).all()
            if paid or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        with engine.connect() as conn:
            events = conn.execute(sa.text("SELECT event_id FROM onceonly_events")).scalars().all()
            placed = conn.execute(sa.text("SELECT customer, item FROM orders ORDER BY id")).all()
    finally:
        engine.dispose()
    assert [tuple(row) for row in paid] == [("pi_1", 990)]
    assert events == ["evt_flask_1"]  # nothing from the forged or unknown deliveries
    assert [tuple(row) for row in placed] == [("ana", "book"), ("bia", "pen"), ("cai", "mug")]
