"""Store-level cost of a retry storm: inserting new events versus duplicates.

Inserts --events distinct events through ``Store.insert_events`` in batches of
--batch (what group commit hands the store under load), then the very same
events again, all duplicates, and prints events/s for each phase, per engine,
median of --repeat runs (each on a fresh database).

No HTTP here: this isolates what the database does per batch. Since migration
4 a duplicate is counted by the inserting statement (``ON CONFLICT DO UPDATE SET
duplicates = duplicates + 1``), so it writes its row where ``DO NOTHING`` wrote
nothing. To compare with an older tree, run this same file with PYTHONPATH
pointing at that tree's ``src``.

Exit status: 0 measured, 2 could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import asyncpg

import onceonly
from _harness import drop_database, recreate_database
from onceonly import NewEvent, create_store
from onceonly.store import Store


def make_events(n: int) -> list[NewEvent]:
    # About the size of a Stripe event with its headers.
    body = json.dumps({"object": "event", "data": {"pad": "y" * 600}}).encode()
    headers = {"stripe-signature": "t=1,v1=" + "a" * 64, "content-type": "application/json"}
    return [
        NewEvent(provider="stripe", event_id=f"evt_{i}", event_type="t", body=body, headers=headers)
        for i in range(n)
    ]


async def phase(store: Store, events: Sequence[NewEvent], batch: int) -> float:
    started = time.perf_counter()
    for start in range(0, len(events), batch):
        await store.insert_events(events[start : start + batch])
    return len(events) / (time.perf_counter() - started)


async def once(url: str, events: Sequence[NewEvent], batch: int) -> tuple[float, float]:
    async with create_store(url) as store:
        new = await phase(store, events, batch)
        duplicate = await phase(store, events, batch)
    return new, duplicate


async def measure(args: argparse.Namespace) -> int:
    events = make_events(args.events)
    print(f"onceonly from {Path(onceonly.__file__).parent}")
    print(f"{args.events:,} events in batches of {args.batch}, median of {args.repeat} runs")
    print(f"{'engine':<12}{'new events/s':>14}{'duplicates/s':>14}")
    for engine in args.engines.split(","):
        results: list[tuple[float, float]] = []
        for _ in range(args.repeat):
            if engine == "sqlite":
                with tempfile.TemporaryDirectory() as tmp:
                    results.append(await once(f"sqlite:///{tmp}/bench.db", events, args.batch))
            elif engine == "postgresql":
                url = await recreate_database(args.pg_admin_url, args.pg_database)
                try:
                    results.append(await once(url, events, args.batch))
                finally:
                    await drop_database(args.pg_admin_url, args.pg_database)
            else:
                print(f"unknown engine {engine!r}", file=sys.stderr)
                return 2
        new = statistics.median(r[0] for r in results)
        duplicate = statistics.median(r[1] for r in results)
        print(f"{engine:<12}{new:>14,.0f}{duplicate:>14,.0f}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/duplicates.py",
        description=(__doc__ or "").split("\n\n", 1)[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100, help="events per insert_events call")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--pg-admin-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--pg-database", default="onceonly_bench_duplicates")
    args = parser.parse_args(argv)
    if args.events < 1 or args.batch < 1 or args.repeat < 1:
        parser.error("--events, --batch and --repeat must be at least 1")
    try:
        return asyncio.run(measure(args))
    except (OSError, asyncpg.PostgresError) as exc:
        print(f"cannot run: {exc!r}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
