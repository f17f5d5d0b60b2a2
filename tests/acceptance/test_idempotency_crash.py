"""A server killed with SIGKILL in the middle of an Idempotency-Key request."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from ports import free_port

APP = """
import asyncio, os
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from onceonly import create_store
from onceonly.idempotency import IdempotencyMiddleware

LOG = os.environ["EXECUTIONS"]

async def create_order(request):
    body = await request.json()
    with open(LOG, "a") as f:          # one line per execution, O_APPEND
        f.write(body["sku"] + "\\n")
    await asyncio.sleep(float(os.environ["SLEEP"]))
    return JSONResponse({"order": body["sku"]}, status_code=201)

app = IdempotencyMiddleware(
    Starlette(routes=[Route("/orders", create_order, methods=["POST"])]),
    store=create_store(os.environ["ONCEONLY_DATABASE_URL"]),
    required=True,
    lock_timeout=float(os.environ["LOCK"]),
)
"""

HEADERS = {"idempotency-key": "order-7", "authorization": "Bearer mobile-app"}


def start(tmp: Path, env: dict[str, str], sleep: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "shop:app",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=tmp,
        env={**env, "SLEEP": str(sleep)},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            httpx.get(url, timeout=1)
            return process, url
        except httpx.TransportError:
            assert process.poll() is None, "server exited"
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)


def executions(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


async def test_killed_mid_request_runs_again_once_after_the_lock_expires(
    database_url: str, tmp_path: Path
) -> None:
    (tmp_path / "shop.py").write_text(APP)
    log = tmp_path / "executions.log"
    lock = 4.0
    env = {
        **os.environ,
        "ONCEONLY_DATABASE_URL": database_url,
        "EXECUTIONS": str(log),
        "LOCK": str(lock),
        "PYTHONPATH": str(tmp_path),
    }

    server, url = start(tmp_path, env, sleep=30)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        in_flight = asyncio.create_task(client.post("/orders", json={"sku": "A1"}, headers=HEADERS))
        while executions(log) == 0:
            await asyncio.sleep(0.02)
        killed_at = time.monotonic()
        server.send_signal(signal.SIGKILL)
        server.wait()
        try:
            await in_flight
            raise AssertionError("the killed request got an answer")
        except httpx.TransportError:
            pass

    server, url = start(tmp_path, env, sleep=0.3)
    try:
        async with httpx.AsyncClient(
            base_url=url, timeout=30, limits=httpx.Limits(max_connections=10)
        ) as client:
            # The dead request's claim still holds: no second run while it might be alive.
            early = await client.post("/orders", json={"sku": "A1"}, headers=HEADERS)
            assert time.monotonic() - killed_at < lock
            assert early.status_code == 409
            assert executions(log) == 1

            await asyncio.sleep(max(0.0, lock - (time.monotonic() - killed_at)) + 0.5)
            # After the in-flight expiry: ten retries at once, exactly one runs.
            burst = await asyncio.gather(
                *(client.post("/orders", json={"sku": "A1"}, headers=HEADERS) for _ in range(10))
            )
            statuses = sorted(r.status_code for r in burst)
            assert statuses.count(201) >= 1
            assert set(statuses) <= {201, 409}
            assert executions(log) == 2

            replay = await client.post("/orders", json={"sku": "A1"}, headers=HEADERS)
            assert replay.status_code == 201
            assert replay.headers["idempotent-replayed"] == "true"
            assert replay.json() == {"order": "A1"}
            assert executions(log) == 2
    finally:
        server.terminate()
        server.wait(20)
