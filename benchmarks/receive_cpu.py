"""CPU per delivery on the receive path, in process (no network, no wrk).

    python benchmarks/receive_cpu.py [--deliveries 3000] [--engine sqlite|postgresql|nodb]

Signed Stripe deliveries go straight into ``app.asgi()`` as ASGI calls, 32 at
a time (as 32 connections would), and each must answer 200. The figure is the
process's CPU time per delivery (event loop plus the store's threads): what a
change to the receive path costs, without wrk's noise, the kernel's network
stack or the other processes on the machine. The baselines are two Starlette
routes measured the same way in the same run: lean awaits the body and answers
an empty 200 (as benchmarks/bare_app.py's lean app), bare answers 200 with a
small JSON document. To compare two trees, run it with each tree's
``src`` first on ``PYTHONPATH``.

PostgreSQL (``--engine postgresql``) runs on a fresh database
``onceonly_bench_cpu`` on ``--postgres``, dropped again at exit; its
server's CPU is not counted.
``--engine nodb`` is benchmarks/receive.py's nodb target (``nodb_app.py``:
the same receiver with a store that keeps only the keys), so the figure is
the receive path's own Python with no database at all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import onceonly
from _harness import drop_database, recreate_database
from nodb_app import WithoutDatabase
from onceonly import Onceonly
from onceonly.providers import Stripe

SECRET = "whsec_receive_cpu"
AsgiApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def deliveries(n: int, tag: str) -> list[tuple[bytes, list[tuple[bytes, bytes]]]]:
    stripe = Stripe(SECRET)
    out = []
    for i in range(n):
        body = json.dumps(
            {
                "id": f"evt_{tag}_{i}",
                "type": "charge.succeeded",
                "data": {"object": {"id": f"ch_{i}"}},
            }
        ).encode()
        headers = [(k.encode(), v.encode()) for k, v in stripe.sign(body).items()]
        headers += [
            (b"host", b"localhost"),
            (b"user-agent", b"Stripe/1.0 (+https://stripe.com/docs/webhooks)"),
            (b"content-type", b"application/json; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
        ]
        out.append((body, headers))
    return out


async def call(app: AsgiApp, body: bytes, headers: list[tuple[bytes, bytes]]) -> int:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/webhooks/stripe",
        "raw_path": b"/webhooks/stripe",
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
    }
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if delivered:  # the answer is sent before the client goes away
            await asyncio.sleep(3600)
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    status = 0

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def measure(app: AsgiApp, n: int, tag: str) -> float:
    """CPU seconds per delivery, after a warm-up of 200."""
    warm, timed = deliveries(200, f"{tag}w"), deliveries(n, tag)
    for start in range(0, len(warm), 32):
        await asyncio.gather(*(call(app, *d) for d in warm[start : start + 32]))
    began = time.process_time()
    for start in range(0, n, 32):
        statuses = await asyncio.gather(*(call(app, *d) for d in timed[start : start + 32]))
        if set(statuses) != {200}:
            raise SystemExit(f"{tag}: answers {sorted(set(statuses))}, expected only 200")
    return (time.process_time() - began) / n


def bare() -> AsgiApp:
    async def endpoint(request: Request) -> JSONResponse:
        await request.body()
        return JSONResponse({"received": True})

    return Starlette(routes=[Route("/webhooks/stripe", endpoint, methods=["POST"])])


def lean() -> AsgiApp:
    async def endpoint(request: Request) -> Response:
        await request.body()
        return Response(status_code=200)

    return Starlette(routes=[Route("/webhooks/stripe", endpoint, methods=["POST"])])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=3000)
    parser.add_argument("--engine", choices=["sqlite", "postgresql", "nodb"], default="sqlite")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="onceonly-receive-cpu-") as work:
        if args.engine == "postgresql":
            url = await recreate_database(args.postgres, "onceonly_bench_cpu")
        elif args.engine == "sqlite":
            url = f"sqlite:///{Path(work) / 'cpu.db'}"
        else:
            url = None  # nodb: KeysOnly never opens a database
        try:
            kind = WithoutDatabase if args.engine == "nodb" else Onceonly
            app = kind(database_url=url, providers={"stripe": Stripe(SECRET)}, environ={})
            receiver: AsgiApp = app.asgi()
            floor = await measure(lean(), args.deliveries, "lean")
            base = await measure(bare(), args.deliveries, "bare")
            ours = await measure(receiver, args.deliveries, "onceonly")
            await app.store.close()
        finally:
            if args.engine == "postgresql":
                await drop_database(args.postgres, "onceonly_bench_cpu")
    print(
        f"onceonly from {Path(onceonly.__file__).parent}, {args.engine}, "
        f"{args.deliveries} deliveries: {ours * 1e6:.0f} us CPU per delivery; "
        f"lean Starlette {floor * 1e6:.0f} us, bare Starlette {base * 1e6:.0f} us; "
        f"ratio {ours / floor:.2f} vs lean, {ours / base:.2f} vs bare"
    )


if __name__ == "__main__":
    asyncio.run(main())
