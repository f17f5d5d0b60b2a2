"""The cost curve: how onceonly's hot paths slow down as the events table grows.

    python benchmarks/cost_curve.py --engine postgresql --rows 0,1000000,10000000
    python benchmarks/cost_curve.py --engine sqlite --rows 0,1000000

For each table size, on a database prefilled with that many rows (mostly
processed events with ~1 KB bodies received over 60 days, 0.5% dead, 0.5%
failed and due in 30 days; see benchmarks/_prefill.py) plus --pending due
events, newest, in this order:

  claim     --claim-samples claims of --claim-batch events each, timed one by
            one through the worker's own WorkQueue.claim (each batch given
            back at once with WorkQueue.release, untimed): p50 and p99;
  worker    one Worker (--concurrency threads, --batch-size events per
            transaction), no-op handler, timed from its start to the last of
            the --pending events committed as processed (like worker.py);
  receive   `onceonly serve` on that database, loaded with wrk and
            benchmarks/receive.lua when wrk is installed (-c --connections,
            after a --warmup), otherwise with a Python client at
            --connections concurrent requests (benchmarks/_load.py: its own CPU
            use caps the throughput; compare sizes with each other, not with
            receive.py's figures); requests/s and p99.

For the receive phase the report also gives the server's full garbage
collections while measured (benchmarks/collections_probe) and, on PostgreSQL,
what the measurement wrote to the write-ahead log and whether the server
made new segment files for it; as in receive.py, the segments it will need
are readied after the warm-up unless --no-wal-prime (benchmarks/_wal.py).

Event ids (--ids): by default each is the head of an md5 digest, as long
as the numbered id it replaces, the prefill's, the pending events' and the
receive load's alike (see _prefill.py and
receive.event_id), so that a new event's key lands anywhere in the dedup
index (provider, tenant, event_id), as the UUIDs of GitHub's or Shopify's
deliveries do. On PostgreSQL a status change (the worker's claim, its mark)
also adds an entry to that index, at the same place: every index gets one
when an indexed column changes. In a large table those places are spread
over pages that recent writes did not touch. --ids sequential numbers the
ids instead, each sorting next to the last: new keys all land at one end of
the index, the kind case; the figures before 2026-12-08 were measured that
way.

Every figure is then given as a ratio to the 0-row figure of the same run.
The goal of issue 19: every ratio within 10% of the empty table's (claim
latency at most 1.10x, throughputs at least 0.90x).

Checks (a failure is printed in capitals, exit status 1): every claim got a
full batch; the worker processed exactly --pending events and the table says
so; every 2xx answer of the receive phase left one new row, and no answer was
an error.

PostgreSQL: each size is filled once into a template database
(onceonly_bench_cost_tpl_...) and copied with CREATE DATABASE ... TEMPLATE;
--cache-templates keeps the templates for the next run (10M rows take about
16 GB of disk, twice that with the copy, and minutes to fill). Without it
every database this script made is dropped at exit. SQLite: the file is
filled in a temporary directory each run (1M rows, about 1.4 GB).

Exit status: 0 all checks passed, 1 a check failed, 2 the benchmark could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sqlite3
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import _harness
import _load
import _pgio
import _prefill
import receive
from _harness import (
    BenchmarkError,
    Processes,
    Workspace,
    add_pg_admin_url,
    add_wait_quiet,
    describe_collections,
    dist_version,
    exit_on_signals,
    flush_writes,
    free_port,
    log,
    parser_for,
    pg_version,
    server,
    wait_for_quiet,
)
from _wal import WalReport, Watch

GOAL = 0.10
TEMPLATE_PREFIX = "onceonly_bench_cost_tpl"


@dataclass
class SizeResult:
    rows: int
    claim_p50_ms: float
    claim_p99_ms: float
    claim_samples: int
    worker_events_per_s: float
    receive_requests_per_s: float
    receive_p50_ms: float
    receive_p99_ms: float
    receive_client: str
    other_cpu_pct: float
    # While receive was measured: the server's full collections (ms) and, on
    # PostgreSQL, its write-ahead log (benchmarks/_wal.py).
    receive_collections_ms: list[float] = field(default_factory=list)
    receive_wal: WalReport | None = None
    # On PostgreSQL, what the database did per event (benchmarks/_pgio.py):
    # the worker's events, and every event the receive phase stored.
    worker_io: _pgio.PhaseIo | None = None
    receive_io: _pgio.PhaseIo | None = None
    ratios: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


# ---------------------------------------------------------------------------
# Phases


def measure_claims(url: str, samples: int, batch: int, problems: list[str]) -> list[float]:
    from onceonly import Onceonly
    from onceonly.store.work_queue import WorkQueue

    app = Onceonly(database_url=url, environ={})
    queue = WorkQueue(app.engine_kind)
    engine = app.engine
    timings: list[float] = []
    short = 0
    try:
        for _ in range(samples):
            started = time.perf_counter()
            claimed = queue.claim(engine, batch, owner="bench-claims", lease=60.0)
            timings.append(time.perf_counter() - started)
            if len(claimed) != batch:
                short += 1
            queue.release(engine, claimed)
    finally:
        engine.dispose()
    if short:
        problems.append(f"{short} of {samples} claims got fewer than {batch} events")
    return timings


def measure_worker(
    url: str, fill: _prefill.Fill, concurrency: int, batch_size: int, problems: list[str]
) -> tuple[float, _pgio.PhaseIo | None]:
    """Events/s, and on PostgreSQL what the database did for them."""
    from onceonly import Event, Onceonly
    from onceonly.context import Context
    from onceonly.worker import Worker

    pending = fill.pending
    # The pending events by their rows' ids (see _prefill.Fill.pending_ids),
    # which hold whatever the event ids are; a primary-key range, not a scan.
    first, last = fill.pending_ids
    in_range = f"FROM onceonly_events WHERE id BETWEEN {first} AND {last}"
    waiting = count(url, f"SELECT count(*) {in_range} AND status = 'pending'")
    if waiting != pending:
        problems.append(f"worker: {waiting} pending events at ids {first}-{last}, not {pending}")
    io_before = _pgio.snapshot(url)
    app = Onceonly(database_url=url, environ={})

    @app.handler()
    def noop(event: Event, ctx: Context) -> None:
        pass

    worker = Worker(app, concurrency=concurrency, batch_size=batch_size)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    started = time.perf_counter()
    thread.start()
    deadline = time.monotonic() + 600
    while worker.processed < pending and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.001)
    elapsed = time.perf_counter() - started
    worker.stop()
    thread.join()
    app.engine.dispose()  # its connections end: their statistics are reported
    io_after = _pgio.snapshot(url)
    io = _pgio.between(io_before, io_after, pending)
    done = count(url, f"SELECT count(*) {in_range} AND status = 'processed'")
    if worker.processed != pending or done != pending:
        problems.append(
            f"worker: {worker.processed} processed by the worker, {done} in the table, "
            f"of {pending} pending"
        )
    return (pending / elapsed if elapsed else 0.0), io


def count(url: str, sql: str) -> int:
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(f"file:{url[len('sqlite:///') :]}?mode=ro", uri=True)
        try:
            return int(conn.execute(sql).fetchone()[0])
        finally:
            conn.close()

    async def pg() -> int:
        import asyncpg

        conn = await asyncpg.connect(url, timeout=10)
        try:
            return int(await conn.fetchval(sql))
        finally:
            await conn.close()

    return asyncio.run(pg())


@dataclass
class ReceiveFigures:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    client: str
    # The measured run's wall-clock window (time.time()), for the server's log.
    since: float = 0.0
    until: float = 0.0


def serve_argv(port: int) -> list[str]:
    argv = [sys.executable, "-m", "onceonly.cli", "serve", "--host", "127.0.0.1"]
    return [*argv, "--port", str(port), "--log-level", "warning", "--no-access-log"]


def serve_env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEONLY_")}
    env["ONCEONLY_STRIPE_SECRET"] = receive.SECRET
    env["ONCEONLY_DATABASE_URL"] = url
    return env


def measure_receive(
    procs: Processes,
    workdir: Path,
    url: str,
    args: argparse.Namespace,
    problems: list[str],
) -> tuple[ReceiveFigures, list[float], WalReport | None, _pgio.PhaseIo | None]:
    """The receive phase's figures, the server's full collections while
    measured (ms) and, on PostgreSQL, its write-ahead log meanwhile and what
    the database did per event stored (warm-up included)."""
    port = free_port()
    ready = ("GET", "/healthz", None)
    before = count(url, "SELECT count(*) FROM onceonly_events")
    io_before = _pgio.snapshot(url)
    wal = Watch.of(url, priming=args.wal_prime)
    with server(
        procs, "onceonly", serve_argv(port), port=port, env=serve_env(url), cwd=workdir, ready=ready
    ) as srv:
        if args.wrk_path:
            figures, expected = _receive_wrk(procs, workdir, port, args, problems, wal)
        else:
            figures, expected = _receive_python(port, args, problems, wal)
        wal_report = wal.measurement_ends()
    # The server stopped gracefully: everything it answered, or took in, is committed.
    io_after = _pgio.snapshot(url)  # the server has stopped: its statistics are in
    added = count(url, "SELECT count(*) FROM onceonly_events") - before
    low, high = expected
    if not low <= added <= high:
        problems.append(f"receive: {added} new rows, expected {low} to {high}")
    # The WAL of this window holds the priming's too (see _wal.py): the
    # measurement's own is the `wal` line's.
    io = _pgio.between(io_before, io_after, added, with_wal=False)
    return figures, srv.full_collections(figures.since, figures.until), wal_report, io


def _receive_wrk(
    procs: Processes,
    workdir: Path,
    port: int,
    args: argparse.Namespace,
    problems: list[str],
    wal: Watch,
) -> tuple[ReceiveFigures, tuple[int, int]]:
    seconds = args.warmup + args.duration
    requests = receive.write_requests(
        workdir / "requests.txt",
        max(300_000, 25_000 * seconds),
        receive.SECRET,
        scattered=args.ids == "random",
    )
    split = requests.count * args.warmup // seconds if args.warmup else 0

    def wrk(first: int, last: int, duration: int) -> receive.WrkResult:
        return receive.run_wrk(
            procs,
            args.wrk_path,
            port,
            requests,
            first,
            last,
            duration=duration,
            connections=args.connections,
            threads=1,
        )

    runs: list[receive.WrkResult] = []
    if args.warmup:
        wal.warm_up_starts()
        runs.append(wrk(0, split, args.warmup))
    wal.measurement_starts(runs[0].duration_s if runs else 0.0, args.duration)
    since = time.time()
    runs.append(wrk(split, requests.count, args.duration))
    until = time.time()
    for run in runs:
        if run.non_2xx or any(run.socket_errors.values()) or run.wraps:
            problems.append(
                f"receive: {run.non_2xx} non-2xx, socket errors {run.socket_errors}, "
                f"{run.wraps} wraps"
            )
    ok = sum(r.ok_2xx for r in runs)
    measured = runs[-1]
    figures = ReceiveFigures(
        round(measured.rps, 1),
        measured.latency_ms["p50"],
        measured.latency_ms["p99"],
        "wrk",
        since,
        until,
    )
    # wrk leaves up to one request per connection unanswered, but sent.
    return figures, (ok, ok + args.connections * len(runs))


def _receive_python(
    port: int, args: argparse.Namespace, problems: list[str], wal: Watch
) -> tuple[ReceiveFigures, tuple[int, int]]:
    deliveries = _load.Deliveries(scattered=args.ids == "random")

    def load(duration: int) -> _load.LoadRun:
        return asyncio.run(
            _load.closed_loop(port, deliveries, connections=args.connections, duration=duration)
        )

    warm = None
    if args.warmup:
        wal.warm_up_starts()
        warm = load(args.warmup)
    wal.measurement_starts(warm.ended - warm.started if warm else 0.0, args.duration)
    since = time.time()
    run = load(args.duration)
    until = time.time()
    ok = run.ok + (warm.ok if warm else 0)
    errors = run.errors + (warm.errors if warm else 0)
    if errors:
        problems.append(f"receive: {errors} answers were not 2xx (or failed)")
    latencies = [s.latency * 1000 for s in run.samples]
    seconds = run.ended - run.started
    figures = ReceiveFigures(
        round(len(run.samples) / seconds, 1) if seconds else 0.0,
        round(_load.percentile(latencies, 50), 2),
        round(_load.percentile(latencies, 99), 2),
        "python (asyncio)",
        since,
        until,
    )
    return figures, (ok, ok)


# ---------------------------------------------------------------------------
# Run


class Run(Workspace):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__("onceonly-cost-", args)
        self.args = args
        self.results: list[SizeResult] = []
        self.templates: list[_prefill.Fill] = []

    def prepare(self, fill: _prefill.Fill) -> str:
        if self.args.engine == "sqlite":
            path = self.workdir / "onceonly.db"
            for leftover in self.workdir.glob("onceonly.db*"):
                leftover.unlink()
            log(f"filling {path} ({fill.rows:,} rows)")
            return _prefill.sqlite_fill(str(path), fill)
        self.created_db = True
        if fill not in self.templates:
            self.templates.append(fill)
        return _prefill.pg_prepare(
            self.pg_admin_url, self.pg_database, fill, template_prefix=TEMPLATE_PREFIX
        )

    def measure(self, rows: int) -> SizeResult:
        args = self.args
        fill = _prefill.Fill(rows=rows, pending=args.pending, ids=args.ids)
        url = self.prepare(fill)
        problems: list[str] = []
        flush_writes()
        if args.wait_quiet:
            wait_for_quiet(args.wait_quiet)
        meter = _harness.CpuMeter(0)
        log(f"[{rows:,} rows] claims")
        claims = measure_claims(url, args.claim_samples, args.claim_batch, problems)
        log(f"[{rows:,} rows] worker, {args.pending:,} events")
        worker, worker_io = measure_worker(url, fill, args.concurrency, args.batch_size, problems)
        log(f"[{rows:,} rows] receive")
        rec, collections, wal, receive_io = measure_receive(
            self.procs, self.workdir, url, args, problems
        )
        cpu = meter.stop()
        return SizeResult(
            rows=rows,
            claim_p50_ms=round(_load.percentile(claims, 50) * 1000, 2),
            claim_p99_ms=round(_load.percentile(claims, 99) * 1000, 2),
            claim_samples=len(claims),
            worker_events_per_s=round(worker, 1),
            receive_requests_per_s=rec.requests_per_s,
            receive_p50_ms=rec.p50_ms,
            receive_p99_ms=rec.p99_ms,
            receive_client=rec.client,
            other_cpu_pct=cpu.other_pct,
            receive_collections_ms=collections,
            receive_wal=wal,
            worker_io=worker_io,
            receive_io=receive_io,
            problems=problems,
        )

    def measure_all(self) -> None:
        for rows in self.args.rows:
            self.results.append(self.measure(rows))
        base = next((r for r in self.results if r.rows == 0), None)
        if base is None:
            return
        for r in self.results:
            r.ratios = {
                "claim_p50": _ratio(r.claim_p50_ms, base.claim_p50_ms),
                "claim_p99": _ratio(r.claim_p99_ms, base.claim_p99_ms),
                "worker": _ratio(r.worker_events_per_s, base.worker_events_per_s),
                "receive": _ratio(r.receive_requests_per_s, base.receive_requests_per_s),
                "receive_p99": _ratio(r.receive_p99_ms, base.receive_p99_ms),
            }

    def cleanup(self) -> None:
        super().cleanup()
        if self.args.engine == "postgresql" and not self.args.cache_templates:
            for fill in self.templates:
                try:
                    _prefill.pg_drop_template(self.pg_admin_url, TEMPLATE_PREFIX, fill)
                except Exception as exc:
                    log(f"warning: could not drop a template database: {exc!r}")


def _ratio(value: float, base: float) -> float:
    return round(value / base, 3) if base else 0.0


def goal_met(r: SizeResult) -> bool | None:
    if not r.ratios or r.rows == 0:
        return None
    q = r.ratios
    slower = max(q["claim_p50"], q["claim_p99"], q["receive_p99"])
    faster = min(q["worker"], q["receive"])
    return slower <= 1 + GOAL and faster >= 1 - GOAL


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = parser_for("python benchmarks/cost_curve.py", __doc__)
    parser.add_argument("--engine", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument(
        "--rows",
        default=None,
        help="comma-separated table sizes; default 0,1000000,10000000 on PostgreSQL, "
        "0,1000000 on SQLite",
    )
    parser.add_argument("--pending", type=int, default=20_000, help="due events for the worker")
    parser.add_argument(
        "--ids",
        choices=_prefill.IDS,
        default="random",
        help="event ids of the prefill, the pending events and the receive load: heads "
        "of md5 digests, which land anywhere in the dedup index as UUIDs do, or numbered, each "
        "next to the last (the kind case, which runs before 2026-12-08 measured)",
    )
    parser.add_argument("--claim-samples", type=int, default=300, help="claims timed")
    parser.add_argument("--claim-batch", type=int, default=32, help="events per claim")
    parser.add_argument("--concurrency", type=int, default=4, help="worker threads")
    parser.add_argument("--batch-size", type=int, default=32, help="events per transaction")
    parser.add_argument("--duration", type=int, default=10, help="receive: seconds measured")
    parser.add_argument("--warmup", type=int, default=2, help="receive: seconds before (0: none)")
    parser.add_argument("--connections", type=int, default=32, help="receive: connections")
    parser.add_argument("--wrk", default="wrk", help="the wrk binary (Python client if absent)")
    parser.add_argument(
        "--cache-templates",
        action="store_true",
        help="PostgreSQL: keep the filled template databases for the next run",
    )
    add_pg_admin_url(parser)
    parser.add_argument(
        "--pg-database", default="onceonly_bench_cost", help="database measured (recreated)"
    )
    add_wait_quiet(parser)
    parser.add_argument(
        "--wal-prime",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="PostgreSQL: before receive is measured, ready the WAL segments it will need "
        "(a scratch table's inserts, then CHECKPOINT), as a steady load would",
    )
    parser.add_argument("--keep-db", action="store_true", help="keep the measured database")
    parser.add_argument("--keep-temp", action="store_true", help="keep the temporary directory")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    default = "0,1000000,10000000" if args.engine == "postgresql" else "0,1000000"
    try:
        args.rows = [int(x) for x in (args.rows or default).split(",") if x.strip()]
    except ValueError:
        parser.error("--rows takes comma-separated integers")
    if not args.rows or any(r < 0 for r in args.rows):
        parser.error("--rows needs sizes >= 0")
    if args.pending < args.claim_batch or args.claim_batch < 1 or args.claim_samples < 1:
        parser.error("needs --pending >= --claim-batch >= 1 and --claim-samples >= 1")
    if args.duration < 1 or args.warmup < 0 or args.connections < 1 or args.wait_quiet < 0:
        parser.error("needs --duration >= 1, --warmup >= 0, --connections >= 1")
    args.wrk_path = shutil.which(args.wrk)
    return args


def print_table(results: Sequence[SizeResult], env: dict[str, Any]) -> None:
    print(
        f"\ncost curve on {env['engine']} {env['engine_version']}; Python {env['python']}, "
        f"{env['cpus']} CPUs; event ids {env['ids']}; "
        f"receive client: {results[0].receive_client if results else '-'}"
    )
    header = (
        f"{'rows':>11}{'claim p50':>10}{'p99 ms':>8}{'worker/s':>10}{'recv/s':>9}"
        f"{'p99 ms':>8}{'other':>7}  vs 0 rows: claim p50, p99, worker, recv, recv p99"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        q = r.ratios
        ratios = (
            f"{q['claim_p50']:.2f} {q['claim_p99']:.2f} {q['worker']:.2f} "
            f"{q['receive']:.2f} {q['receive_p99']:.2f}"
            if q
            else "-"
        )
        goal = {None: "", True: " met", False: " MISSED"}[goal_met(r)]
        print(
            f"{r.rows:>11,}{r.claim_p50_ms:>10.2f}{r.claim_p99_ms:>8.2f}"
            f"{r.worker_events_per_s:>10,.0f}{r.receive_requests_per_s:>9,.0f}"
            f"{r.receive_p99_ms:>8.2f}{r.other_cpu_pct:>6.0f}%  {ratios}{goal}"
        )
    print(f"goal: every figure within {GOAL:.0%} of the 0-row figure")
    for r in results:
        print(
            f"collections {r.rows:,} rows: in the server while receive was measured, "
            f"{describe_collections(r.receive_collections_ms)}"
        )
        if r.receive_wal is not None:
            print(f"wal {r.rows:,} rows: {r.receive_wal.describe()}")
        if r.worker_io is not None:
            print(f"database {r.rows:,} rows, worker: {r.worker_io.describe()}")
        if r.receive_io is not None:
            print(f"database {r.rows:,} rows, receive: {r.receive_io.describe()}")
    print_problems(results)


def print_problems(results: Sequence[SizeResult]) -> None:
    for r in results:
        if warning := _harness.foreign_load_warning(r.other_cpu_pct):
            print(f"!!! WARNING [{r.rows:,} rows]: {warning}")
        if r.receive_wal is not None and (wal_warning := r.receive_wal.warning()):
            print(f"!!! WARNING [{r.rows:,} rows]: {wal_warning}")
        for problem in r.problems:
            print(f"!!! CHECK FAILED [{r.rows:,} rows]: {problem.upper()}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.wrk_path is None:
        log(f"{args.wrk} not found: receive is loaded by a Python client (see --help)")
    exit_on_signals()
    run = Run(args)
    try:
        env: dict[str, Any] = {
            "engine": args.engine,
            "engine_version": sqlite3.sqlite_version
            if args.engine == "sqlite"
            else asyncio.run(pg_version(args.pg_admin_url, "--engine")),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "ids": args.ids,
            "onceonly": dist_version("onceonly"),
            **_harness.onceonly_source(),
        }
        run.measure_all()
    except BenchmarkError as exc:
        log(f"error: {exc}")
        return 2
    except KeyboardInterrupt:
        log("interrupted; cleaning up")
        return 130
    finally:
        run.cleanup()
    ok = all(r.ok for r in run.results)
    if args.json:
        report = {
            "environment": env,
            "settings": {k: v for k, v in vars(args).items() if k not in ("wrk_path",)},
            "results": [{**asdict(r), "ok": r.ok, "goal_met": goal_met(r)} for r in run.results],
            "ok": ok,
        }
        print(json.dumps(report, indent=2))
    else:
        print_table(run.results, env)
    if not ok:
        log("!!! ONE OR MORE CHECKS FAILED: SEE ABOVE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
