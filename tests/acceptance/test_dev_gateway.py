"""``onceonly dev gateway`` against ``onceonly serve`` and ``onceonly worker``, all
real subprocesses: 500 events with Stripe's retry behaviour on a bad day, each
processed exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import payments_app
import sqlalchemy as sa

from onceonly.db import create_engine
from onceonly.dev.gateway import prepare_events
from ports import free_port
from support import ONCEONLY, Server

HERE = Path(__file__).resolve().parent
EVENTS = 500
SEED = 11


def wait_healthy(url: str, serve: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert serve.poll() is None, "onceonly serve exited"
        assert time.monotonic() < deadline, "onceonly serve did not come up"
        time.sleep(0.1)


def run_gateway(url: str, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    gateway = subprocess.run(
        [
            *ONCEONLY, "dev", "gateway", "stripe", "--target", url,
            "--secret", payments_app.STRIPE_SECRET,
            "--events", str(EVENTS), "--seed", str(SEED), "--speedup", "3600",
            "--duplicates", "0.1", "--timeouts", "0.05", "--lost-acks", "0.05",
            "--spread", "1", "--port", "0", "--exit", "--format", "json",
        ],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert gateway.returncode == 0, gateway.stdout + gateway.stderr
    report: dict[str, Any] = json.loads(gateway.stdout)
    return report


def settled(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        waiting = conn.execute(
            sa.text("SELECT count(*) FROM onceonly_events WHERE status <> 'processed'")
        ).scalar_one()
        stored = conn.execute(sa.text("SELECT count(*) FROM onceonly_events")).scalar_one()
    return bool(waiting == 0 and stored == EVENTS)


def test_500_events_with_retries_duplicates_and_timeouts_are_processed_once(
    database_url: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEONLY_")}
    env.update(
        ONCEONLY_DATABASE_URL=database_url,
        PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
        COLUMNS="120",
    )
    payments_app.create_payments_table(database_url)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    logs = {name: (tmp_path / f"{name}.log").open("wb") for name in ("serve", "worker")}
    serve = subprocess.Popen(
        [*ONCEONLY, "serve", "--app", "payments_app:inbox_app", "--port", str(port)],
        env=env, cwd=tmp_path, stdout=logs["serve"], stderr=subprocess.STDOUT,
    )  # fmt: skip
    worker = subprocess.Popen(
        [*ONCEONLY, "worker", "--app", "payments_app:chaos_app", "--concurrency", "2"],
        env=env, cwd=tmp_path, stdout=logs["worker"], stderr=subprocess.STDOUT,
    )  # fmt: skip
    engine = create_engine(database_url)
    try:
        wait_healthy(url, serve)
        report = run_gateway(url, env, tmp_path)
        assert report["acknowledged"] == EVENTS
        assert report["undelivered"] == []
        # The bad day happened: resends, copies at once, cut-off waits, lost 200s.
        assert report["retries"] > 0
        assert report["concurrent_copies"] > 0
        assert report["injected_timeouts"] > 0
        assert report["lost_acks"] > 0
        assert report["duplicates_answered"] > 0
        assert report["requests"] > EVENTS

        deadline = time.monotonic() + 60
        while not settled(engine):
            assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
            time.sleep(0.2)
        with engine.connect() as conn:
            paid = [r[0] for r in conn.execute(sa.text("SELECT event_id FROM payments"))]
        expected = {e.event_id for e in prepare_events("stripe", EVENTS, seed=SEED)}
        assert set(paid) == expected
        assert Counter(paid).most_common(1)[0][1] == 1  # each exactly once
    finally:
        for process in (worker, serve):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in (worker, serve):
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        for log in logs.values():
            log.close()
        engine.dispose()


def test_dev_send_signs_one_delivery_and_reports_the_answer(
    database_url: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEONLY_")}
    env.update(
        ONCEONLY_DATABASE_URL=database_url,
        ONCEONLY_STRIPE_SECRET="whsec_dev_send",
        ONCEONLY_ASAAS_SECRET="asaas-token",
        COLUMNS="120",
    )
    server = Server(env, tmp_path)

    def send(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*ONCEONLY, "dev", "send", *args, "--url", server.url],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30,
        )  # fmt: skip

    try:
        # The secret comes from the receiver's own setting.
        first = send("stripe", "--event-id", "evt_send_1", "--format", "json")
        assert first.returncode == 0, first.stderr
        answer = json.loads(first.stdout)
        assert (answer["status"], answer["duplicate"]) == (200, False)
        assert answer["sent_headers"]["stripe-signature"].startswith("t=")
        again = send("stripe", "--event-id", "evt_send_1")
        assert again.returncode == 0
        assert "answer: 200 (duplicate)" in again.stdout
        asaas = send("asaas", "--event-type", "PAYMENT_OVERDUE", "--format", "json")
        assert json.loads(asaas.stdout)["status"] == 200
        forged = send("stripe", "--secret", "whsec_wrong")
        assert forged.returncode == 1
        assert "answer: 401" in forged.stdout
    finally:
        server.stop()
    listed = subprocess.run(
        [*ONCEONLY, "events", "list", "--format", "json"],
        env=env, cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    stored = {(e["provider"], e["event_type"]) for e in json.loads(listed.stdout)}
    assert stored == {("stripe", "payment_intent.succeeded"), ("asaas", "PAYMENT_OVERDUE")}
