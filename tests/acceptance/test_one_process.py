"""``onceonly serve --worker``: receive and process in one process."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import sqlalchemy as sa

from onceonly.db import create_engine
from support import ONCEONLY, STRIPE_SECRET, Server, stripe_delivery

APP = """
import sqlalchemy as sa
from onceonly import Onceonly

app = Onceonly(retry_base=0.05, max_attempts=2)
payments = sa.table("payments", sa.column("event_id"))

@app.handler("stripe", "payment_intent.succeeded")
def record(event, ctx):
    ctx.connection.execute(payments.insert().values(event_id=event.event_id))

@app.handler("stripe", "charge.failed")
def broken(event, ctx):
    raise LookupError("customer 42 not found")
"""


def wait_settled(env: dict[str, str], cwd: Path, count: int) -> dict[str, dict[str, object]]:
    """Poll `events list` until `count` events are all processed or dead."""
    deadline = time.monotonic() + 20
    while True:
        out = subprocess.run(
            [*ONCEONLY, "events", "list", "--format", "json"],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
        )
        listing = json.loads(out.stdout)
        settled = {e["status"] for e in listing} <= {"processed", "dead"}
        if (settled and len(listing) == count) or time.monotonic() > deadline:
            return {e["event_id"]: e for e in listing}
        time.sleep(0.2)


def test_serve_with_worker_processes_what_it_receives(database_url: str, tmp_path: Path) -> None:
    (tmp_path / "shop.py").write_text(APP)
    env = {
        **os.environ,
        "ONCEONLY_DATABASE_URL": database_url,
        "ONCEONLY_STRIPE_SECRET": STRIPE_SECRET,
        "PYTHONPATH": str(tmp_path),
        "COLUMNS": "200",
    }
    subprocess.run([*ONCEONLY, "migrate"], env=env, cwd=tmp_path, check=True)
    engine = create_engine(database_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE payments (event_id TEXT NOT NULL)")
    server = Server(env, tmp_path, "--worker", "--app", "shop:app")
    url = server.url
    try:
        with httpx.Client() as client:
            for event_id, kind in [
                ("evt_a", "payment_intent.succeeded"),
                ("evt_b", "payment_intent.succeeded"),
                ("evt_c", "charge.failed"),
            ]:
                body, headers = stripe_delivery(event_id, event_type=kind)
                for _ in range(2):  # every delivery twice, as gateways do
                    response = client.post(f"{url}/webhooks/stripe", content=body, headers=headers)
                    assert response.status_code == 200
        by_id = wait_settled(env, tmp_path, 3)
        assert by_id["evt_a"]["status"] == by_id["evt_b"]["status"] == "processed"
        assert by_id["evt_c"]["status"] == "dead"
        assert by_id["evt_c"]["last_error"] == "LookupError: customer 42 not found"
        with engine.connect() as conn:
            paid = sorted(r[0] for r in conn.execute(sa.text("SELECT event_id FROM payments")))
        assert paid == ["evt_a", "evt_b"]

        def cli(*args: str) -> str:
            return subprocess.run(
                [*ONCEONLY, *args], env=env, cwd=tmp_path, capture_output=True, text=True
            ).stdout

        assert "customer 42 not found" in cli("events", "list", "--status", "dead")
        shown = cli("events", "show", "stripe:evt_c")
        assert "LookupError" in shown
        assert "last traceback" in shown
        assert 'raise LookupError("customer 42 not found")' in shown
    finally:
        server.stop()
        engine.dispose()
