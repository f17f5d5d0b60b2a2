"""SQLite contention: the receiver and the workers sharing one database file.

    python benchmarks/sqlite_contention.py [--events 3000] [--rate 250] [--workers 2]

SQLite has one write lock per file. The receiver's inserts, the workers'
claims, their processing transactions and the outbox marks all take it, and
a processing transaction holds it while its handlers run, external calls
included. This script measures what the receiver suffers from that, in one
run, for each worker set-up given with --budgets:

- ``onceonly serve`` and --workers ``onceonly worker`` processes (each
  --concurrency threads) on a fresh SQLite file;
- each event's handler makes one card call through ``ctx.effect()`` to a
  loopback API that takes --call-ms, and writes one row (contention_app.py);
- a sender delivers --events signed Stripe events at --rate per second
  (--senders at a time, open loop: a late answer does not slow the schedule),
  and resends a 503 after 0.1 s, as a gateway would.

Per set-up it prints: the receiver's answer times (p50, p99, max of one
request), how many 503s it answered ("database is locked" past busy_timeout),
the longest time until an event was acknowledged (resends included), the time
until every event was processed, and where the lock went: the workers'
processing transactions (``onceonly_worker_transaction_seconds``, scraped from
each worker), their p99 and longest, and the share of the wall time they held
the lock.

``--budgets 0,0.01`` compares one transaction per batch (budget 0) with the
default 10 ms budget (``ONCEONLY_TRANSACTION_BUDGET``), in the same run; both
have the receiver's priority (``store/write_lock.py``). ``--baseline-src
DIR`` adds a first row with the onceonly of another checkout's ``src`` (for
example a worktree of the commit before), measured in the same run.

Exit status: 0 done, 1 an event was lost or processed twice, 2 could not run.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from _harness import (
    BenchmarkError,
    Processes,
    free_port,
    http_status,
    log,
    parser_for,
)
from onceonly.providers import Stripe

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from contention_app import SECRET  # noqa: E402


class CardApi:
    """A loopback card API that answers each charge after `delay` seconds."""

    def __init__(self, delay: float) -> None:
        counter = iter(range(1, 10**9))
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes: without this, Nagle holds
            # the second until the client's delayed ACK, 40 ms per call.
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                time.sleep(delay)
                with lock:
                    n = next(counter)
                body = json.dumps({"id": f"ch_{n}"}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/charges"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Sent:
    answers: list[float]  # seconds per request, every attempt
    unavailable: int  # 503 answers
    longest_ack: float  # first attempt to 200, resends included
    wall: float


async def deliver(url: str, events: int, rate: float, senders: int, tag: str) -> Sent:
    stripe = Stripe(SECRET)
    answers: list[float] = []
    unavailable = 0
    longest_ack = 0.0
    start = time.monotonic() + 0.2
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(events):
        queue.put_nowait(i)

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal unavailable, longest_ack
        while not queue.empty():
            i = queue.get_nowait()
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            body = json.dumps(
                {
                    "id": f"evt_{tag}_{i:06d}",
                    "type": "payment_intent.succeeded",
                    "data": {"object": {"id": f"pi_{i}"}},
                }
            ).encode()
            first = time.monotonic()
            while True:
                sent = time.monotonic()
                response = await client.post(
                    "/webhooks/stripe", content=body, headers=stripe.sign(body)
                )
                answers.append(time.monotonic() - sent)
                if response.status_code == 200:
                    break
                if response.status_code != 503:
                    raise BenchmarkError(f"unexpected {response.status_code}: {response.text}")
                unavailable += 1
                await asyncio.sleep(0.1)
            longest_ack = max(longest_ack, time.monotonic() - first)

    limits = httpx.Limits(max_connections=senders, max_keepalive_connections=senders)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        began = time.monotonic()
        await asyncio.gather(*(one(client) for _ in range(senders)))
    return Sent(answers, unavailable, longest_ack, time.monotonic() - began)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] if ordered else 0.0


_BUCKET = re.compile(r'^onceonly_worker_transaction_seconds_bucket\{le="([^"]+)"\} (\S+)$')


@dataclass
class Held:
    count: float
    seconds: float
    buckets: dict[float, float]  # upper bound -> cumulative count, summed over workers

    def quantile(self, q: float) -> float:
        """The smallest bucket bound below which a share `q` of transactions ended."""
        for bound in sorted(self.buckets):
            if self.buckets[bound] >= q * self.count:
                return bound
        return math.inf


def scrape(ports: list[int]) -> Held:
    held = Held(0.0, 0.0, {})
    for port in ports:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith("onceonly_worker_transaction_seconds_count "):
                held.count += float(line.split()[1])
            elif line.startswith("onceonly_worker_transaction_seconds_sum "):
                held.seconds += float(line.split()[1])
            elif m := _BUCKET.match(line):
                bound = float(m.group(1))
                held.buckets[bound] = held.buckets.get(bound, 0.0) + float(m.group(2))
    return held


def processed(db: Path) -> tuple[int, int]:
    """(processed events, order rows) read without taking the write lock."""
    import sqlite3

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        done = conn.execute(
            "SELECT count(*) FROM onceonly_events WHERE status = 'processed'"
        ).fetchone()[0]
        has_orders = conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE name = 'bench_orders'"
        ).fetchone()[0]
        rows = conn.execute("SELECT count(*) FROM bench_orders").fetchone()[0] if has_orders else 0
        return int(done), int(rows)
    finally:
        conn.close()


@dataclass(frozen=True)
class SetUp:
    label: str
    budget: float | None  # None: the tree's default
    src: Path | None  # None: the onceonly this script imports


@contextmanager
def deployment(
    procs: Processes, workdir: Path, setup: SetUp, args: Any, card: CardApi
) -> Iterator[tuple[str, list[int], Path]]:
    db = workdir / f"{setup.label}.db"
    path = [str(HERE), *([str(setup.src)] if setup.src else [])]
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.pathsep.join(path),
        "PYTHONUNBUFFERED": "1",
        "ONCEONLY_DATABASE_URL": f"sqlite:///{db}",
        "CONTENTION_CARD_URL": card.url,
    }
    if setup.budget is not None:
        env["ONCEONLY_TRANSACTION_BUDGET"] = str(setup.budget)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ONCEONLY_")}, **env}
    onceonly = [sys.executable, "-m", "onceonly.cli"]
    app = ["--app", "contention_app:app", "--log-level", "warning"]
    # The app's own table, created before anyone takes the lock for it.
    import sqlalchemy as sa

    from contention_app import metadata

    engine = sa.create_engine(f"sqlite:///{db}")
    metadata.create_all(engine)
    engine.dispose()
    port = free_port()
    started = []
    with (workdir / f"serve-{setup.label}.log").open("wb") as out:
        started.append(
            procs.start(
                [*onceonly, "serve", *app, "--port", str(port)],
                env=env,
                cwd=workdir,
                stdout=out,
                stderr=out,
            )
        )
    deadline = time.monotonic() + 30
    while http_status(port, "GET", "/healthz") != 200:
        if time.monotonic() > deadline or started[0].poll() is not None:
            raise BenchmarkError("onceonly serve did not come up")
        time.sleep(0.1)
    metric_ports = []
    for i in range(args.workers):
        metric_port = free_port()
        metric_ports.append(metric_port)
        with (workdir / f"worker-{setup.label}-{i}.log").open("wb") as out:
            started.append(
                procs.start(
                    [
                        *onceonly,
                        "worker",
                        *app,
                        "--concurrency",
                        str(args.concurrency),
                        "--metrics-port",
                        str(metric_port),
                    ],
                    env=env,
                    cwd=workdir,
                    stdout=out,
                    stderr=out,
                )
            )
    for metric_port in metric_ports:
        deadline = time.monotonic() + 30
        while http_status(metric_port, "GET", "/metrics") != 200:
            if time.monotonic() > deadline:
                raise BenchmarkError("a worker did not come up")
            time.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}", metric_ports, db
    finally:
        for proc in reversed(started):
            procs.stop(proc)


def measure(setup: SetUp, args: Any, workdir: Path, card: CardApi) -> dict[str, Any]:
    procs = Processes()
    try:
        with deployment(procs, workdir, setup, args, card) as (url, metric_ports, db):
            began = time.monotonic()
            sent = asyncio.run(deliver(url, args.events, args.rate, args.senders, setup.label))
            deadline = time.monotonic() + 300
            while processed(db)[0] < args.events:
                if time.monotonic() > deadline:
                    raise BenchmarkError(f"only {processed(db)[0]} events processed after 300 s")
                time.sleep(0.05)
            drained = time.monotonic() - began
            held = scrape(metric_ports)
            done, orders = processed(db)
    finally:
        procs.stop_all()
    return {
        "set-up": setup.label,
        "answer_p50_ms": round(percentile(sent.answers, 0.5) * 1000, 1),
        "answer_p99_ms": round(percentile(sent.answers, 0.99) * 1000, 1),
        "answer_max_ms": round(max(sent.answers) * 1000, 1),
        "unavailable_503": sent.unavailable,
        "longest_ack_s": round(sent.longest_ack, 2),
        "drained_s": round(drained, 1),
        "transactions": int(held.count),
        # The baseline tree has no transaction histogram: "-".
        "txn_p99_ms": round(held.quantile(0.99) * 1000, 1) if held.count else "-",
        "txn_mean_ms": round(held.seconds / held.count * 1000, 1) if held.count else "-",
        "lock_share_pct": round(100 * held.seconds / drained, 1) if held.count else "-",
        "processed": done,
        "orders": orders,
    }


def main() -> int:
    parser = parser_for("sqlite_contention.py", __doc__)
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=250.0, help="deliveries per second")
    parser.add_argument("--senders", type=int, default=16, help="requests in flight at most")
    parser.add_argument("--workers", type=int, default=2, help="onceonly worker processes")
    parser.add_argument("--concurrency", type=int, default=2, help="threads per worker")
    parser.add_argument("--call-ms", type=float, default=5.0, help="the card API's answer time")
    parser.add_argument(
        "--budgets",
        default="0,0.01",
        help="ONCEONLY_TRANSACTION_BUDGET values to compare (0: one transaction per batch)",
    )
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="another checkout's src directory, measured first as 'baseline'",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    try:
        budgets = [float(b) for b in args.budgets.split(",")]
    except ValueError:
        parser.error("--budgets must be comma-separated numbers")
    setups = [SetUp(f"budget-{b:g}", b, None) for b in budgets]
    if args.baseline_src:
        if not (args.baseline_src / "onceonly" / "__init__.py").is_file():
            parser.error(f"--baseline-src {args.baseline_src}: no onceonly package there")
        setups.insert(0, SetUp("baseline", None, args.baseline_src.resolve()))
    if args.events < 1 or args.rate <= 0 or args.workers < 1 or args.concurrency < 1:
        parser.error("--events, --rate, --workers and --concurrency must be positive")
    workdir = Path(tempfile.mkdtemp(prefix="onceonly-contention-"))
    card = CardApi(args.call_ms / 1000)
    results = []
    try:
        for setup in setups:
            log(f"{setup.label}: {args.events} events at {args.rate:g}/s ...")
            results.append(measure(setup, args, workdir, card))
    except BenchmarkError as exc:
        log(f"error: {exc}")
        return 2
    finally:
        card.close()
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        columns = list(results[0])
        print("  ".join(f"{c:>15}" for c in columns))
        for row in results:
            print("  ".join(f"{row[c]!s:>15}" for c in columns))
        print(
            f"({args.events} events at {args.rate:g}/s, {args.senders} senders; "
            f"{args.workers} workers x {args.concurrency} threads; card call "
            f"{args.call_ms:g} ms; one SQLite file)"
        )
    bad = [r for r in results if r["processed"] != args.events or r["orders"] != args.events]
    for row in bad:
        log(
            f"CHECK FAILED: {row['set-up']}: {row['processed']} processed, "
            f"{row['orders']} order rows, for {args.events} events"
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
