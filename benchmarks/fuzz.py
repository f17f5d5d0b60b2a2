"""The long fuzz run: 100,000 genuine and hostile deliveries against `onceonly serve`.

The same deliveries as tests/integration/test_fuzz.py (tests/fuzzing.py), drawn
from a seeded random generator instead of hypothesis: about 45% genuine signed
deliveries of Stripe, GitHub, Shopify and Standard Webhooks, the rest resends
and everything an attacker sends (tampered bytes, forged and missing
signatures, poisoned ids, oversized bodies and headers, replays with unsigned
parts changed, other routes and methods), --concurrency at a time, against a
real `onceonly serve` subprocess on each engine.

Prints, per engine: requests, answers by status, unexpected 5xx, unexpected
answers, genuine events lost, events created that nobody genuine sent, and
whether the server was still alive at the end. Exit status: 0 when every
property held, 1 when one did not, 2 when it could not run.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import fuzzing
from _harness import add_pg_admin_url, free_port, http_status, parser_for, pg_drop, pg_recreate
from fuzzing import Shot
from onceonly import create_store

ONCEONLY = [sys.executable, "-m", "onceonly.cli"]


def serve(database_url: str, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEONLY_")}
    env.update(
        ONCEONLY_DATABASE_URL=database_url,
        ONCEONLY_STRIPE_SECRET=fuzzing.STRIPE_SECRET,
        ONCEONLY_GITHUB_SECRET=fuzzing.GITHUB_SECRET,
        ONCEONLY_SHOPIFY_SECRET=fuzzing.SHOPIFY_SECRET,
        ONCEONLY_STANDARDWEBHOOKS_SECRET=fuzzing.STANDARD_SECRET,
        ONCEONLY_MAX_BODY_BYTES=str(fuzzing.MAX_BODY_BYTES),
        ONCEONLY_MAX_HEADER_BYTES=str(fuzzing.MAX_HEADER_BYTES),
        ONCEONLY_DASHBOARD_PATH="off",
    )
    log = (workdir / "serve.log").open("wb")
    process = subprocess.Popen(
        [*ONCEONLY, "serve", "--port", str(port), "--log-level", "error"],
        env=env,
        cwd=workdir,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while http_status(port, "GET", "/healthz") != 200:
        if process.poll() is not None or time.monotonic() > deadline:
            output = (workdir / "serve.log").read_text()
            raise SystemExit(f"onceonly serve did not start:\n{output}")
        time.sleep(0.1)
    return process, port


async def run(url: str, requests: int, concurrency: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    sent: list[Shot] = []
    statuses: Counter[int] = Counter()
    unexpected: Counter[str] = Counter()
    closed_early: Counter[str] = Counter()
    genuine: dict[tuple[str, str], bytes] = {}
    queue: asyncio.Queue[Shot] = asyncio.Queue(maxsize=concurrency * 4)

    async def produce() -> None:
        for _ in range(requests):
            shot = fuzzing.random_shot(rng, sent)
            if shot.genuine is not None:
                sent.append(shot)
                if len(sent) > 200:
                    sent.pop(rng.randrange(len(sent)))
            await queue.put(shot)
        for _ in range(concurrency):
            await queue.put(Shot("", "", b"", {}, "stop"))

    async def consume(client: httpx.AsyncClient) -> None:
        while (shot := await queue.get()).kind != "stop":
            try:
                response = await client.request(
                    shot.method, shot.path, content=shot.body, headers=shot.headers
                )
            except httpx.TransportError as exc:
                if shot.kind.startswith("oversized"):
                    # Refused from its Content-Length and the connection closed
                    # while this client was still sending: a refusal too.
                    closed_early[shot.kind] += 1
                else:
                    unexpected[f"{shot.kind}: {type(exc).__name__}"] += 1
                continue
            statuses[response.status_code] += 1
            if response.status_code not in shot.expected:
                unexpected[f"{shot.kind}: {response.status_code}"] += 1
            if shot.genuine is not None and response.status_code == 200:
                genuine[shot.genuine] = shot.body

    started = time.monotonic()
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        await asyncio.gather(produce(), *(consume(client) for _ in range(concurrency)))
    return {
        "seconds": round(time.monotonic() - started, 1),
        "statuses": dict(sorted(statuses.items())),
        "unexpected": dict(unexpected),
        "refused_by_closing": dict(closed_early),
        "genuine_acknowledged": len(genuine),
        "genuine": genuine,
    }


async def check(database_url: str, genuine: dict[tuple[str, str], bytes]) -> dict[str, int]:
    async with create_store(database_url) as store:
        events = await store.list_events(limit=10_000_000)
    stored = {(e.provider, e.event_id): e.body for e in events}
    return {
        "stored": len(stored),
        "genuine_lost": sum(1 for k in genuine if k not in stored),
        "genuine_swallowed": sum(1 for k, b in genuine.items() if k in stored and stored[k] != b),
        "created_by_nobody_genuine": sum(1 for k in stored if k not in genuine),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = parser_for("fuzz.py", __doc__)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--format", choices=["text", "json"], default="text")
    add_pg_admin_url(parser)
    args = parser.parse_args(argv)
    ok = True
    results = {}
    for engine in args.engines.split(","):
        with tempfile.TemporaryDirectory(prefix="onceonly-fuzz-") as tmp:
            workdir = Path(tmp)
            if engine == "sqlite":
                database_url = f"sqlite:///{workdir / 'fuzz.db'}"
            else:
                database_url = pg_recreate(args.pg_admin_url, "onceonly_bench_fuzz")
            process, port = serve(database_url, workdir)
            try:
                outcome = asyncio.run(
                    run(f"http://127.0.0.1:{port}", args.requests, args.concurrency, args.seed)
                )
                alive = process.poll() is None
            finally:
                process.terminate()
                process.wait(30)
            genuine = outcome.pop("genuine")
            assert isinstance(genuine, dict)
            outcome.update(asyncio.run(check(database_url, genuine)))
            outcome["server_alive"] = alive
            five = sum(n for s, n in outcome["statuses"].items() if s >= 500)  # type: ignore[attr-defined]
            outcome["unexpected_5xx"] = five
            if engine != "sqlite":
                pg_drop(args.pg_admin_url, "onceonly_bench_fuzz")
        held = (
            alive
            and five == 0
            and not outcome["unexpected"]
            and outcome["genuine_lost"] == 0
            and outcome["genuine_swallowed"] == 0
            and outcome["created_by_nobody_genuine"] == 0
        )
        outcome["properties_held"] = held
        ok = ok and held
        results[engine] = outcome
    if args.format == "json":
        print(json.dumps(results, indent=2))
    else:
        for engine, outcome in results.items():
            print(f"{engine}:")
            for name, value in outcome.items():
                print(f"  {name}: {value}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
