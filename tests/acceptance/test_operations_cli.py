"""`onceonly purge` and the worker's metrics port, run as real subprocesses."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ports import free_port
from support import ONCEONLY, STRIPE_SECRET, Server, stripe_delivery


def run(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ONCEONLY, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ONCEONLY_DATABASE_URL": f"sqlite:///{tmp_path / 'onceonly.db'}",
        "ONCEONLY_STRIPE_SECRET": STRIPE_SECRET,
        "COLUMNS": "200",
    }


@pytest.fixture
def server(env: dict[str, str], tmp_path: Path) -> Iterator[Server]:
    srv = Server(env, tmp_path, "--worker")
    yield srv
    srv.stop()


def deliver(url: str, event_id: str) -> bool:
    body, headers = stripe_delivery(event_id)
    response = httpx.post(f"{url}/webhooks/stripe", content=body, headers=headers, timeout=10)
    assert response.status_code == 200
    return bool(response.json()["duplicate"])


def wait_processed(database: Path, n: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with sqlite3.connect(database) as conn:
            (done,) = conn.execute(
                "SELECT count(*) FROM onceonly_events WHERE status = 'processed'"
            ).fetchone()
        if done == n:
            return
        time.sleep(0.1)
    raise AssertionError(f"{n} events were not processed in time")


def test_purge_command_keeps_the_dedup_memory(
    server: Server, env: dict[str, str], tmp_path: Path
) -> None:
    database = tmp_path / "onceonly.db"
    assert not deliver(server.url, "evt_1")
    assert not deliver(server.url, "evt_2")
    wait_processed(database, 2)
    with sqlite3.connect(database) as conn:
        forty_days_ago = datetime.now(UTC) - timedelta(days=40)
        conn.execute(
            "UPDATE onceonly_events SET received_at = ? WHERE event_id = 'evt_1'",
            (forty_days_ago.strftime("%Y-%m-%dT%H:%M:%S.000Z"),),
        )

    dry = run(
        "purge", "--older-than", "30d", "--dry-run", "--format", "json", env=env, cwd=tmp_path
    )
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["payloads_dropped"] == 1
    with sqlite3.connect(database) as conn:
        assert conn.execute("SELECT count(*) FROM onceonly_events WHERE body = x''").fetchone() == (
            0,
        )

    result = run(
        "purge", "--older-than", "30d", "--keep-ids", "60d", "--format", "json",
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["payloads_dropped"], report["events_deleted"]) == (1, 0)
    # The payload is gone and the running server still knows the event.
    assert deliver(server.url, "evt_1")
    shown = run("events", "show", "stripe:evt_1", "--format", "json", env=env, cwd=tmp_path)
    assert json.loads(shown.stdout)["payload_purged_at"] is not None
    refused = run("events", "replay", "stripe:evt_1", env=env, cwd=tmp_path)
    assert refused.returncode == 1
    assert "payload was purged" in refused.stderr

    table = run("purge", "--older-than", "30d", "--keep-ids", "60d", env=env, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert "Idempotency-Key" in table.stdout


def test_purge_explains_bad_input(env: dict[str, str], tmp_path: Path) -> None:
    bad = run("purge", "--older-than", "30 days", env=env, cwd=tmp_path)
    assert bad.returncode == 2
    assert "not a duration" in bad.stderr
    assert "30d" in bad.stderr
    short = run("purge", "--older-than", "30d", "--keep-ids", "1d", env=env, cwd=tmp_path)
    assert short.returncode == 2
    assert "shorter than --older-than" in short.stderr
    for pause in ("-1", "61", "soon"):
        refused = run("purge", "--pause", pause, env=env, cwd=tmp_path)
        assert refused.returncode == 2, pause
        assert "--pause" in refused.stderr


def test_standalone_worker_serves_its_metrics(env: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    worker = subprocess.Popen(
        [*ONCEONLY, "worker", "--metrics-port", str(port)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        receiver = Server(env, tmp_path, "--no-metrics")
        try:
            assert httpx.get(f"{receiver.url}/metrics").status_code == 404
            assert not deliver(receiver.url, "evt_w")
        finally:
            receiver.stop()
        deadline = time.monotonic() + 30
        processed = 0.0
        while time.monotonic() < deadline and processed < 1:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except httpx.TransportError:
                time.sleep(0.1)
                continue
            samples = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
            }
            processed = samples.get(
                ("onceonly_events_processed_total", (("provider", "stripe"), ("tenant", ""))), 0.0
            )
            time.sleep(0.1)
        assert processed == 1
    finally:
        worker.terminate()
        worker.communicate(timeout=20)
