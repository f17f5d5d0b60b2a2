"""SIGKILL in the middle of a load: every delivery that got a 200 is in the database."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx

from onceonly import create_store
from support import STRIPE_SECRET, Server, stripe_delivery


async def test_sigkill_under_load_loses_no_acknowledged_event(
    database_url: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "ONCEONLY_DATABASE_URL": database_url,
        "ONCEONLY_STRIPE_SECRET": STRIPE_SECRET,
    }
    server = Server(env, tmp_path)
    acknowledged: list[str] = []
    failed = 0
    stop = asyncio.Event()

    async def sender(client: httpx.AsyncClient, worker: int) -> None:
        nonlocal failed
        n = 0
        while not stop.is_set():
            event_id = f"evt_{worker}_{n}"
            n += 1
            body, headers = stripe_delivery(event_id)
            try:
                response = await client.post(
                    f"{server.url}/webhooks/stripe", content=body, headers=headers
                )
            except httpx.TransportError:
                failed += 1
                return
            if response.status_code == 200:
                acknowledged.append(event_id)

    async with httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=32)) as client:
        senders = [asyncio.create_task(sender(client, w)) for w in range(32)]
        # Kill once a healthy number of events has been acknowledged.
        deadline = time.monotonic() + 30
        while len(acknowledged) < 300 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        server.process.send_signal(signal.SIGKILL)
        await asyncio.gather(*senders)
        stop.set()
    server.stop()

    assert len(acknowledged) >= 300
    assert failed > 0  # the kill really happened mid-load, with requests in flight
    async with create_store(database_url) as store:
        stored = {e.event_id for e in await store.list_events(limit=1_000_000)}
    missing = set(acknowledged) - stored
    assert not missing, f"{len(missing)} acknowledged events lost, e.g. {sorted(missing)[:5]}"
