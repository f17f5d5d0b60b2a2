"""CPU per request of the Idempotency-Key middleware, in process (no HTTP, no wrk).

benchmarks/idempotency.py measures throughput over HTTP on a shared machine,
where other load moves the figures. This script drives the ASGI app of
benchmarks/idempotency_app.py directly, `--concurrency` requests at a time,
and reports the CPU each request cost:

  loop µs    CPU of the event-loop thread (the server's bottleneck: one core);
  other µs   CPU of the process's other threads (the SQLite thread);

for the bare endpoint and, per engine, fresh keys, replays from the cache and
replays without it. The engines are sqlite, postgres and memory (the unit
tests' in-memory store, not durable: what the middleware itself costs before
any database work). CPU time, unlike requests/s, barely moves with foreign
load, so it shows what a code change saved. HTTP parsing (uvicorn/httptools)
is not included: it costs the same with and without the middleware.

    python benchmarks/idempotency_cpu.py [--requests 4000] [--engines sqlite,postgres,memory]
        [--app fastapi]

``--app fastapi`` drives the same route written for FastAPI
(benchmarks/idempotency_fastapi.py), bare and wrapped.

With ``--batches N`` it measures the key store alone instead: N batches of 16
completions and 16 new claims, each handed to the store's ``apply`` as group
commit hands them, and prints the CPU per batch, of the event loop's thread
and of the whole process (the SQLite thread included). ``--keys random``
(the default) names each claim's key with a UUID4, as clients do, so that the
keys land all over the primary key's B-tree; ``--keys sequential`` numbers
them, so that each batch lands where the last one did. To compare two trees,
run it with each tree's ``src`` first on ``PYTHONPATH``, one after the other,
a few times.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _harness import pg_drop, pg_recreate
from idempotency import cycle_request, new_tag
from idempotency_app import APPS, MEMORY, add_app_option, build
from onceonly import create_store
from onceonly.asgi import ASGIApp, Message

ENGINES = ("sqlite", "postgres", "memory")
TARGETS = ("fresh", "replay", "replay-nocache")


def _process_and_loop_cpu() -> tuple[float, float]:
    """Before a measured step: the process's clock first, then the loop's."""
    return time.process_time(), time.thread_time()


def _loop_and_process_cpu() -> tuple[float, float]:
    """After it, the other way round: the loop's interval then lies inside the
    process's, so the loop's CPU never reads as more than the process's (with
    all the work on the loop's thread, the two differ only by that order)."""
    thread = time.thread_time()
    return time.process_time(), thread


async def _lifespan(app: ASGIApp) -> tuple[asyncio.Future[None], asyncio.Queue[Message]]:
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    started = asyncio.Event()

    async def send(message: Message) -> None:
        if message["type"].startswith("lifespan.startup"):
            started.set()

    await inbox.put({"type": "lifespan.startup"})
    task: asyncio.Future[None] = asyncio.ensure_future(
        app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, send)
    )
    await started.wait()
    return task, inbox


def _scope(headers: dict[str, str]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/orders",
        "raw_path": b"/orders",
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        + [(b"host", b"127.0.0.1:8001"), (b"content-length", b"160")],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8001),
    }


async def _one(app: ASGIApp, headers: dict[str, str], body: bytes) -> int:
    sent = False
    status = 0

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(_scope(headers), receive, send)
    return status


async def _drive(app: ASGIApp, requests: int, concurrency: int, make: Any) -> tuple[float, float]:
    counter = iter(range(requests))

    async def worker() -> None:
        for i in counter:
            headers, body = make(i)
            status = await _one(app, headers, body)
            if status != 201:
                raise RuntimeError(f"status {status}")

    p0, t0 = _process_and_loop_cpu()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    p1, t1 = _loop_and_process_cpu()
    loop_us = (t1 - t0) / requests * 1e6
    other_us = ((p1 - p0) - (t1 - t0)) / requests * 1e6
    return loop_us, other_us


async def measure(
    target: str, url: str | None, requests: int, concurrency: int, app_kind: str = APPS[0]
) -> tuple[float, float]:
    app = build(url, 0 if target == "replay-nocache" else 32 * 1024 * 1024, app_kind=app_kind)
    task, inbox = await _lifespan(app)
    tag = new_tag()
    keys = 500
    try:
        if target.startswith("replay"):

            def make(i: int) -> tuple[dict[str, str], bytes]:
                return cycle_request(tag, 0, i % keys)

            await _drive(app, keys, concurrency, make)  # creates the keys
            await _drive(app, min(requests, 500), concurrency, make)  # warm-up
            return await _drive(app, requests, concurrency, make)
        # The warm-up's keys are its own: measured with the same ones, the
        # first 500 "fresh" requests were replays (the figure came out low).
        warm_up = functools.partial(cycle_request, new_tag(), 0)
        await _drive(app, min(requests, 500), concurrency, warm_up)
        return await _drive(app, requests, concurrency, functools.partial(cycle_request, tag, 0))
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await task


BATCH = 16
STORED = b'{"id":"ord_0123456789abcdef0123456789abcdef","object":"order","status":"created"}'


async def measure_batches(url: str, batches: int, key_order: str = "random") -> tuple[float, float]:
    """CPU seconds per batch of `BATCH` completions and `BATCH` claims: (loop, process).
    `key_order`: "random" (UUID4 keys) or "sequential" (numbered keys)."""
    from onceonly.store.idempotency import Completion, KeyClaim, StoredResponse

    store = create_store(url)
    await store.open()
    keys = store.idempotency_keys()
    response = StoredResponse(
        201, (("content-type", "application/json"), ("content-length", str(len(STORED)))), STORED
    )
    tag = new_tag()
    if key_order not in ("random", "sequential"):
        raise ValueError(f"key order {key_order!r}: random or sequential")

    def key(n: int, i: int) -> str:
        return str(uuid.uuid4()) if key_order == "random" else f"{tag}-{n}-{i}"

    claims = [
        [KeyClaim(f"client-{tag}", key(n, i), "f" * 64) for i in range(BATCH)]
        for n in range(batches + 1)
    ]
    loop_s = process_s = 0.0
    previous: list[Completion] = []
    try:
        for n, batch in enumerate(claims):
            now = time.time()
            p0, t0 = _process_and_loop_cpu()
            landed, outcomes = await keys.apply(
                previous, batch, now=now, lock_seconds=60, ttl=86400
            )
            p1, t1 = _loop_and_process_cpu()
            if n:  # the first batch has no completions: not counted
                loop_s, process_s = loop_s + t1 - t0, process_s + p1 - p0
            if not all(landed) or any(o.state != "acquired" for o in outcomes):
                raise RuntimeError(f"batch {n}: stored {landed}, claimed {outcomes}")
            previous = [
                Completion(c.scope, c.key, o.fence, response)
                for c, o in zip(batch, outcomes, strict=True)
            ]
    finally:
        await store.close()
    return loop_s / batches, process_s / batches


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--requests", type=int, default=4000, help="measured requests per target (default 4000)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=32, help="requests in flight at once (default 32)"
    )
    parser.add_argument(
        "--engines",
        default="sqlite,postgres",
        help="comma-separated: sqlite, postgres, memory (the middleware without a database)",
    )
    parser.add_argument(
        "--targets",
        default=",".join(TARGETS),
        help="comma-separated: fresh, replay, replay-nocache (default all)",
    )
    add_app_option(parser)
    parser.add_argument(
        "--pg-admin-url",
        default="postgresql://postgres@127.0.0.1:5432/test",
        help="a PostgreSQL database with rights to create the benchmark's own",
    )
    parser.add_argument(
        "--pg-database",
        default="onceonly_bench_idem_cpu",
        help="the database it creates, and drops again at exit",
    )
    parser.add_argument(
        "--batches",
        type=int,
        default=0,
        help="measure the key store alone: this many batches of 16 completions and 16 claims",
    )
    parser.add_argument(
        "--keys",
        choices=("random", "sequential"),
        default="random",
        help="with --batches: UUID4 keys, as clients send (default), or numbered keys",
    )
    args = parser.parse_args(argv)
    engines, targets = args.engines.split(","), args.targets.split(",")
    for kind, names, known in (("engine", engines, ENGINES), ("target", targets, TARGETS)):
        unknown = [n for n in names if n not in known]
        if unknown:
            parser.error(f"unknown {kind} {', '.join(unknown)}: use {', '.join(known)}")
    if args.batches and "memory" in engines:
        parser.error("--batches measures a database's key store: sqlite or postgres")
    if args.batches and args.app != APPS[0]:
        parser.error("--batches measures the key store alone, with no app: drop --app")
    args.engines, args.targets = engines, targets
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    engines, targets = args.engines, args.targets
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    workdir = Path(tempfile.mkdtemp(prefix="onceonly-bench-idem-cpu-"))
    urls: dict[str, str] = {}
    for engine in engines:
        if engine == "sqlite":
            urls[engine] = f"sqlite:///{workdir / 'onceonly.db'}"
        elif engine == "postgres":
            urls[engine] = pg_recreate(args.pg_admin_url, args.pg_database)
        else:
            urls[engine] = MEMORY
    if args.batches:
        try:
            for name, address in urls.items():
                loop_s, process_s = asyncio.run(measure_batches(address, args.batches, args.keys))
                print(
                    f"{name}: {args.batches} batches of {BATCH} completions + {BATCH} claims"
                    f" ({args.keys} keys): "
                    f"{loop_s * 1e6:.0f} µs loop CPU, {process_s * 1e6:.0f} µs process CPU "
                    "per batch",
                    flush=True,
                )
        finally:
            if "postgres" in urls:
                pg_drop(args.pg_admin_url, args.pg_database)
        return 0
    rows = [("bare", "-", None)] + [(t, e, u) for e, u in urls.items() for t in targets]
    print(f"{'target':<16}{'engine':<10}{'loop µs':>9}{'other µs':>10}{'vs bare loop':>14}")
    bare = 0.0
    try:
        for target, engine, url in rows:
            loop_us, other_us = asyncio.run(
                measure(target, url, args.requests, args.concurrency, args.app)
            )
            bare = bare or loop_us
            print(
                f"{target:<16}{engine:<10}{loop_us:>9.0f}{other_us:>10.0f}{loop_us / bare:>13.2f}x",
                flush=True,
            )
    finally:
        if "postgres" in urls:
            pg_drop(args.pg_admin_url, args.pg_database)
    return 0


if __name__ == "__main__":
    sys.exit(main())
