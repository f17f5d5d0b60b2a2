"""The FastAPI/Starlette page's example application, run exactly as printed.

The code block is extracted from ``docs/integration.md`` and served by uvicorn
as a subprocess, so the documentation cannot drift from what works.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from onceonly.db import create_engine
from ports import free_port
from support import STRIPE_SECRET, stripe_delivery

DOC = Path(__file__).resolve().parents[2] / "docs" / "integration.md"


def example_source() -> str:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(r"<!-- example: app\.py -->\s*```python\n(.*?)```", text, re.DOTALL)
    assert match, "docs/integration.md lost its example block"
    return match.group(1)


@pytest.fixture
def example_app(database_url: str, tmp_path: Path) -> Iterator[str]:
    (tmp_path / "app.py").write_text(example_source(), encoding="utf-8")
    port = free_port()
    env = {
        **os.environ,
        "ONCEONLY_DATABASE_URL": database_url,
        "ONCEONLY_STRIPE_SECRET": STRIPE_SECRET,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app:app", "--port", str(port), "--log-level", "warning"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.TransportError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                out, _ = process.communicate()
                pytest.fail(f"the documented example did not start:\n{out}")
            time.sleep(0.1)
    try:
        yield url
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=30)
        assert "Traceback" not in out, out


def test_the_documented_application_creates_one_order_per_client_and_one_payment(
    example_app: str, database_url: str
) -> None:
    caller = {"authorization": "Bearer customer-1"}
    with httpx.Client(base_url=example_app, timeout=10, headers=caller) as client:
        first = client.post("/orders", json={"item": "book"}, headers={"Idempotency-Key": "k-1"})
        again = client.post("/orders", json={"item": "book"}, headers={"Idempotency-Key": "k-1"})
        missing = client.post("/orders", json={"item": "book"})
        nobody = httpx.post(
            f"{example_app}/orders", json={"item": "book"}, headers={"Idempotency-Key": "k-1"}
        )
        other = client.post(
            "/orders",
            json={"item": "book"},
            headers={"Idempotency-Key": "k-1", "authorization": "Bearer customer-2"},
        )
        assert first.status_code == 201, first.text
        # No credential, no client to scope the key to: refused, not replayed.
        assert nobody.status_code == 400
        assert "idempotent-replayed" not in nobody.headers
        # Another client's same key is its own: a new order, not the first one's.
        assert other.status_code == 201
        assert "idempotent-replayed" not in other.headers
        assert again.status_code == 201
        assert again.headers["idempotent-replayed"] == "true"
        assert again.json() == first.json()
        assert missing.status_code == 400

        body, headers = stripe_delivery(
            "evt_doc_1", extra={"object": {"id": "pi_1", "amount": 1990}}
        )
        answers = [client.post("/webhooks/stripe", content=body, headers=headers) for _ in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 200]
        assert [a.headers["onceonly-duplicate"] for a in answers] == ["false", "true", "true"]

    engine = create_engine(database_url)
    try:
        deadline = time.monotonic() + 20
        while True:
            with engine.connect() as conn:
                paid = conn.execute(sa.text("SELECT intent, amount FROM payments")).all()
                ordered = conn.execute(sa.text("SELECT count(*) FROM orders")).scalar_one()
            if paid or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        engine.dispose()
    assert [tuple(row) for row in paid] == [("pi_1", 1990)]
    assert ordered == 2  # one per client that sent key k-1
