"""Worker benchmark: events/s for a no-op handler and receive-to-handler latency.

    python benchmarks/worker.py [--events 20000] [--concurrency 4] [--engines sqlite,postgresql]

For each engine, in one run:

1. throughput: N pending events, one worker with a no-op handler, timed from
   start to the last event processed; the baseline is the same worker with
   one event per transaction (``batch_size=1``), the naive way; then the
   same batched worker whose handler records ``--effects`` effects per event
   (``ctx.effect()`` with a call that does nothing: what the ledger costs);
2. latency: events inserted one at a time at a steady rate while a worker
   waits (PostgreSQL: LISTEN/NOTIFY; SQLite: polling every second), measured
   from the insert's commit to the handler call.

PostgreSQL runs against a fresh database ``onceonly_bench_worker`` on
``--postgres`` (default postgresql://postgres@127.0.0.1:5432/test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _harness import recreate_database
from onceonly import Event, NewEvent, Onceonly, create_store
from onceonly.context import Context
from onceonly.worker import Worker


def fresh_url(engine: str, admin_url: str, tmp: Path, tag: str) -> str:
    if engine == "sqlite":
        return f"sqlite:///{tmp / f'{tag}.db'}"
    return asyncio.run(recreate_database(admin_url, f"onceonly_bench_worker_{tag}"))


async def _insert(url: str, n: int) -> None:
    async with create_store(url) as store:
        for start in range(0, n, 1000):
            await store.insert_events(
                [
                    NewEvent("stripe", f"evt_{i}", "charge.succeeded", b"{}", {})
                    for i in range(start, min(n, start + 1000))
                ]
            )


def throughput(url: str, n: int, concurrency: int, batch_size: int, effects: int = 0) -> float:
    asyncio.run(_insert(url, n))
    app = Onceonly(database_url=url, environ={})
    done = threading.Event()
    count = 0
    lock = threading.Lock()

    @app.handler()
    def noop(event: Event, ctx: Context) -> None:
        nonlocal count
        for i in range(effects):
            ctx.effect(f"call-{i}", lambda key: {"id": key})
        with lock:
            count += 1
            if count == n:
                done.set()

    worker = Worker(app, concurrency=concurrency, batch_size=batch_size)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    started = time.perf_counter()
    thread.start()
    done.wait(600)
    while worker._held:  # the last batch's commit
        time.sleep(0.001)
    elapsed = time.perf_counter() - started
    worker.stop()
    thread.join()
    return n / elapsed


def latency(url: str, n: int, rate: float) -> list[float]:
    asyncio.run(_insert(url, 0))  # schema
    app = Onceonly(database_url=url, environ={})
    handled: dict[str, float] = {}

    @app.handler()
    def stamp(event: Event, ctx: Context) -> None:
        handled[event.event_id] = time.perf_counter()

    worker = Worker(app, concurrency=2)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    committed: dict[str, float] = {}

    async def feed() -> None:
        async with create_store(url) as store:
            await asyncio.sleep(0.5)  # let the worker start listening
            for i in range(n):
                await store.insert_events([NewEvent("stripe", f"lat_{i}", "t", b"{}", {})])
                committed[f"lat_{i}"] = time.perf_counter()
                await asyncio.sleep(1 / rate)

    asyncio.run(feed())
    deadline = time.monotonic() + 10
    while len(handled) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.stop()
    thread.join()
    return [max(0.0, handled[k] - committed[k]) for k in committed if k in handled]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--latency-events", type=int, default=200)
    parser.add_argument("--effects", type=int, default=1, help="effects per event (0: skip)")
    parser.add_argument("--effect-events", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=50.0, help="latency feed, events/s")
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    args = parser.parse_args()

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for engine in args.engines.split(","):
            naive_n = max(1000, args.events // 5)
            naive = throughput(
                fresh_url(engine, args.postgres, Path(tmp), "naive"),
                naive_n,
                args.concurrency,
                1,
            )
            batched = throughput(
                fresh_url(engine, args.postgres, Path(tmp), "batched"),
                args.events,
                args.concurrency,
                args.batch_size,
            )
            with_effects = (
                throughput(
                    fresh_url(engine, args.postgres, Path(tmp), "effects"),
                    args.effect_events,
                    args.concurrency,
                    args.batch_size,
                    args.effects,
                )
                if args.effects
                else 0.0
            )
            lat = latency(
                fresh_url(engine, args.postgres, Path(tmp), "latency"),
                args.latency_events,
                args.rate,
            )
            results.append(
                {
                    "engine": engine,
                    "events_per_s": round(batched),
                    "naive_events_per_s": round(naive),
                    "ratio": round(batched / naive, 2),
                    "effects_per_event": args.effects,
                    "with_effects_events_per_s": round(with_effects),
                    "latency_p50_ms": round(statistics.median(lat) * 1000, 1),
                    "latency_p99_ms": round(percentile(lat, 99) * 1000, 1),
                    "latency_samples": len(lat),
                    "wake_up": "LISTEN/NOTIFY" if engine == "postgresql" else "polling (0.1 s)",
                }
            )
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"{'engine':<11} {'events/s':>9} {'naive/s':>8} {'ratio':>6} {'effects/s':>9} "
        f"{'p50 ms':>7} {'p99 ms':>7}  wake-up"
    )
    for r in results:
        print(
            f"{r['engine']:<11} {r['events_per_s']:>9} {r['naive_events_per_s']:>8} "
            f"{r['ratio']:>6} {r['with_effects_events_per_s']:>9} "
            f"{r['latency_p50_ms']:>7} {r['latency_p99_ms']:>7}  {r['wake_up']}"
        )
    print(
        f"({args.events} events, concurrency {args.concurrency}, batch {args.batch_size}; "
        f"naive = one transaction per event; effects/s: {args.effect_events} events with "
        f"{args.effects} ctx.effect() each; latency: {len(lat)} events at {args.rate}/s, "
        "insert commit to handler call)"
    )


if __name__ == "__main__":
    main()
