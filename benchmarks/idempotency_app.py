"""The app for benchmarks/idempotency.py: a small JSON API, with or without
onceonly's Idempotency-Key middleware.

``POST /orders`` reads the JSON body and answers 201 with a ~200-byte JSON
order (a fresh order id each time it really runs, so a replay is recognisable
by its id). ``GET /healthz`` answers 200, for the readiness probe. With
``--stats``, ``GET /_group-commit`` answers the middleware's group commit
counters (batches, records, seconds in flight) as JSON.

``--app fastapi`` serves the same route written for FastAPI instead
(benchmarks/idempotency_fastapi.py: pydantic models in and out).

Without ``--database-url`` the app runs bare. With it, the app is wrapped in
``IdempotencyMiddleware(app, store=create_store(url), cache_bytes=...)``; the
store is opened (and migrated) at startup and closed at shutdown.
``memory://`` puts the unit tests' in-memory store (``onceonly.store.memory``:
not durable, one process) in the database's place, to measure what the
middleware costs before any database work. That store keeps every record as
Python objects; so that the garbage collector's full passes over a growing
heap of them are not counted as the middleware's cost, the app moves what
exists to the collector's permanent generation (``gc.freeze()``) every second.
``memory://?wait=0.002`` is the same store with each group-commit batch first
waiting 2 ms on the event loop (``asyncio.sleep``): a database's round trip
with none of its work, to tell what the wait costs from what the work does.

uvicorn runs it with the settings of benchmarks/bare_app.py (and of ``onceonly
serve``): one process, ``loop="auto"``/``http="auto"`` (uvloop and httptools
when installed), access log off, lifespan on.

    python benchmarks/idempotency_app.py --port 8001 [--database-url URL] [--cache-bytes N]
        [--app fastapi] [--gc-freeze]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from onceonly import Store, create_store
from onceonly.asgi import ASGIApp
from onceonly.idempotency import IdempotencyMiddleware
from onceonly.store.memory import MemoryStore

#: The `database_url` that stands for the in-memory store; ``memory://?wait=S``
#: makes each of its batches first wait S seconds (see `memory_wait`).
MEMORY = "memory://"
#: The frameworks the endpoint is written for (--app); the first is the default.
APPS = ("starlette", "fastapi")
#: With --stats: the group commit's counters so far, as JSON (batches, the
#: records they carried, and the seconds a batch was in flight), for
#: benchmarks/idempotency.py to read before and after a measurement.
STATS_PATH = "/_group-commit"


def _installed_app(name: str) -> str:
    """--app's value, refused (a usage error) when its framework is missing."""
    if name == "fastapi" and importlib.util.find_spec("fastapi") is None:
        raise argparse.ArgumentTypeError("fastapi needs FastAPI: pip install -e '.[bench]'")
    return name


def add_app_option(parser: argparse.ArgumentParser) -> None:
    """--app, as this app and the scripts that drive it (idempotency.py,
    idempotency_cpu.py) take it."""
    parser.add_argument(
        "--app",
        type=_installed_app,
        choices=APPS,
        default=APPS[0],
        help="the framework the endpoint is written for, bare and wrapped alike (fastapi: "
        "benchmarks/idempotency_fastapi.py, pydantic models in and out)",
    )


async def create_order(request: Request) -> JSONResponse:
    order: dict[str, Any] = await request.json()
    items = order.get("items", [])
    return JSONResponse(
        {
            "id": f"ord_{uuid.uuid4().hex}",
            "object": "order",
            "status": "created",
            "customer": order.get("customer"),
            "items": len(items),
            "amount": sum(int(i.get("quantity", 1)) * 1250 for i in items),
            "currency": order.get("currency", "usd"),
            "created": int(time.time()),
        },
        status_code=201,
    )


async def healthz(request: Request) -> Response:
    return Response(b"ok", media_type="text/plain")


async def _freeze_every_second() -> None:
    while True:
        await asyncio.sleep(1)
        gc.freeze()


def is_memory(database_url: str | None) -> bool:
    """Whether `database_url` names the in-memory store, with or without a wait."""
    return database_url is not None and database_url.partition("?")[0] == MEMORY


def memory_wait(database_url: str) -> float:
    """The seconds each batch of the in-memory store waits (``?wait=``), 0 by
    default: asyncio.sleep() before the batch, a database's round trip with
    none of its work, so that what waiting itself costs the server can be
    told apart from the work of a real database."""
    query = urllib.parse.parse_qs(database_url.partition("?")[2])
    unknown = set(query) - {"wait"}
    if unknown:
        raise ValueError(f"{database_url!r}: the in-memory store takes ?wait=SECONDS only")
    wait = float(query.get("wait", ["0"])[-1])
    if not 0 <= wait <= 10:
        raise ValueError(f"{database_url!r}: wait must be 0 to 10 seconds")
    return wait


def _wait_before_each_batch(middleware: IdempotencyMiddleware, wait: float) -> None:
    """``memory://?wait=``: each group-commit batch first sleeps `wait` seconds."""
    unwaited = middleware.records.flush

    async def waiting(items: Any) -> Any:
        await asyncio.sleep(wait)
        return await unwaited(items)

    middleware.records.flush = waiting


def _store_for(database_url: str | None) -> tuple[Store | None, float]:
    """The store `database_url` names (none: the bare app), and how long each of
    its batches first waits (the in-memory store's ``?wait=``)."""
    if not database_url:
        return None, 0.0
    if is_memory(database_url):
        return MemoryStore(), memory_wait(database_url)
    return create_store(database_url), 0.0


async def _start(store: Store | None, *, gc_freeze: bool) -> None:
    """The app's start-up: the store opened (its tables created before the
    first request) and, with --gc-freeze, the heap frozen."""
    if store is not None:
        await store.open()
    if gc_freeze:
        # What docs/idempotency.md advises a server to do once its app is
        # built; bare and wrapped alike.
        gc.collect()
        gc.freeze()


def build(
    database_url: str | None,
    cache_bytes: int,
    *,
    stats: bool = False,
    app_kind: str = APPS[0],
    gc_freeze: bool = False,
) -> ASGIApp:
    if app_kind not in APPS:
        raise ValueError(f"unknown app {app_kind!r}: use one of {', '.join(APPS)}")
    store, wait = _store_for(database_url)
    middleware: IdempotencyMiddleware | None = None
    flush_seconds = [0.0]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await _start(store, gc_freeze=gc_freeze)
        if store is None:
            yield
            return
        # With the in-memory store and the collector left alone, p99 went from
        # 4 ms to 39-109 ms and requests/s fell by 11-14% (wrk, 8 s runs): full
        # collections walking the store's records, which a database keeps
        # out of the process.
        frozen = asyncio.create_task(_freeze_every_second()) if is_memory(database_url) else None
        try:
            yield
        finally:
            if frozen is not None:
                frozen.cancel()
            await store.close()
            if stats and middleware is not None:
                commits = middleware.records
                per_batch = (
                    f", {flush_seconds[0] / max(commits.batches, 1) * 1000:.2f} ms per batch"
                )
                print(
                    f"group commit: {commits.batches} batches, {commits.items} items, "
                    f"{commits.items / max(commits.batches, 1):.1f} per batch{per_batch}",
                    flush=True,
                )

    async def group_commit(request: Request) -> JSONResponse:
        # GET: the middleware lets it through untouched (it covers POST and
        # PATCH), so the endpoint's requests pay nothing for this route.
        commits = middleware.records if middleware is not None else None
        return JSONResponse(
            {
                "batches": commits.batches if commits else 0,
                "items": commits.items if commits else 0,
                "flush_seconds": flush_seconds[0],
            }
        )

    app: ASGIApp
    if app_kind == "fastapi":
        # Imported here: FastAPI is only needed when asked for.
        from idempotency_fastapi import create_app

        fastapi_app = create_app(lifespan)
        if stats:
            fastapi_app.add_route(STATS_PATH, group_commit, methods=["GET"])
        app = fastapi_app
    else:
        routes = [
            Route("/orders", create_order, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]
        if stats:
            routes.append(Route(STATS_PATH, group_commit, methods=["GET"]))
        app = Starlette(routes=routes, lifespan=lifespan)
    if store is None:
        return app
    middleware = IdempotencyMiddleware(app, store=store, cache_bytes=cache_bytes)
    if wait:
        _wait_before_each_batch(middleware, wait)
    if stats:
        flush = middleware.records.flush

        async def timed(items: Any) -> Any:
            started = time.perf_counter()
            try:
                return await flush(items)
            finally:
                flush_seconds[0] += time.perf_counter() - started

        middleware.records.flush = timed
    return middleware


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--log-level", default="warning")
    parser.add_argument(
        "--database-url",
        help=f"wrap the app in IdempotencyMiddleware on this database ({MEMORY}: in memory;"
        f" {MEMORY}?wait=SECONDS: in memory, each batch first waiting that long)",
    )
    parser.add_argument(
        "--cache-bytes",
        type=int,
        default=32 * 1024 * 1024,
        help="the middleware's in-memory response cache (0: every replay reads the database)",
    )
    add_app_option(parser)
    parser.add_argument(
        "--stats",
        action="store_true",
        help=f"print the group commit's batch sizes at shutdown, and serve its counters"
        f" at GET {STATS_PATH}",
    )
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="once started, collect and move what exists out of the garbage collector's "
        "full passes (gc.freeze()), as docs/idempotency.md advises",
    )
    args = parser.parse_args()

    import uvicorn

    # The same keyword arguments as bare_app.py and onceonly.cli.serve.
    uvicorn.run(
        build(
            args.database_url,
            args.cache_bytes,
            stats=args.stats,
            app_kind=args.app,
            gc_freeze=args.gc_freeze,
        ),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=10,
    )


if __name__ == "__main__":
    main()
