"""Does `onceonly purge` stall the receiver? Receive latency before and during a purge.

    python benchmarks/purge_stall.py [--engine postgresql] [--rows 1000000] [--rate 200]

The database is prefilled with --rows events received 31 to 91 days ago
(mostly processed, with ~1 KB bodies; 0.5% dead and 0.5% failed, which a purge
keeps; see benchmarks/_prefill.py). `onceonly serve` runs on it and receives
distinct, signed Stripe deliveries at a fixed --rate per second (over at most
--connections connections; latency counted from the moment each request was
due, so a stall cannot hide by delaying the sender). After --before seconds of
that, the real CLI `onceonly purge --older-than 30d` runs as a subprocess,
concurrently, dropping the payloads of every processed prefilled event; the
load goes on until --after seconds after the purge has exited.

Reported for the window before the purge and the window during it: requests,
p50/p99/max latency, and the longest stall (the longest time in the window
with no response completing; at 200 requests/s the normal gap is 5 ms). Also
the purge's duration and the payloads it dropped.

On PostgreSQL each window also gives what was written to the write-ahead
log in it (by anything on that server), and how many new segment files the
server made: a purge writes
far more WAL than the load, and each new segment holds every commit while it
is written and fsynced (benchmarks/_wal.py). Nothing is primed: a purge's
burst above the steady load is what a production server meets too.

The goal of issue 19: no receive stall over 100 ms during the purge.

Checks (a failure is printed in capitals, exit status 1): every request was
answered 2xx and left exactly one new row; the purge exited 0 and dropped the
payload of every processed prefilled event, and no other.

PostgreSQL: the prefill is made once into a template database and copied for
the measurement (--cache-templates keeps the template for the next run).
SQLite: filled in a temporary directory each run.

Exit status: 0 all checks passed, 1 a check failed, 2 the benchmark could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import _harness
import _load
import _prefill
from _harness import (
    BenchmarkError,
    Workspace,
    add_pg_admin_url,
    add_wait_quiet,
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
from _wal import Sampler, WalState, WalUnknown, made_through, read_state
from cost_curve import count, serve_argv, serve_env
from onceonly.retention import MAX_PURGE_PAUSE

GOAL_STALL_MS = 100.0
TEMPLATE_PREFIX = "onceonly_bench_purge_tpl"


@dataclass
class Window:
    name: str
    seconds: float
    requests: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    longest_stall_ms: float
    # How long each full garbage collection in the server held its event loop
    # in this window (ms; _harness's collections probe): one cause of a stall.
    full_collections_ms: list[float] = field(default_factory=list)
    # PostgreSQL only: WAL written in the window, and new segment files made
    # (at least: _wal.made_through over the readings taken every 0.1 s); None
    # elsewhere, or where the role may not read pg_wal.
    wal_bytes: int | None = None
    wal_segments_made: int | None = None
    # How many readings of the WAL that count rests on, both ends included.
    wal_readings: int | None = None


def window(
    name: str,
    run: _load.LoadRun,
    start: float,
    end: float,
    srv: _harness.Server | None = None,
    wal: tuple[WalState | None, WalState | None] = (None, None),
    sampled: Sequence[WalState] = (),
) -> Window:
    """The samples due between `start` and `end` (perf_counter), the
    server's full collections that ended meanwhile and, given the WAL read at
    both ends (and `sampled`, the readings between them), what was written
    to it and the segments made."""
    inside = [s for s in run.samples if start <= s.due < end]
    latencies = [s.latency * 1000 for s in inside]
    # The probe logs wall-clock times: this window's, on that clock.
    to_wall = time.time() - time.perf_counter()
    return Window(
        name=name,
        seconds=round(end - start, 3),
        requests=len(inside),
        p50_ms=round(_load.percentile(latencies, 50), 2),
        p99_ms=round(_load.percentile(latencies, 99), 2),
        max_ms=round(max(latencies, default=0.0), 2),
        longest_stall_ms=round(_load.longest_gap(run.samples, start, end) * 1000, 2),
        full_collections_ms=(
            srv.full_collections(start + to_wall, end + to_wall) if srv is not None else []
        ),
        wal_bytes=wal[1].lsn - wal[0].lsn if wal[0] and wal[1] else None,
        wal_segments_made=made_through([wal[0], *sampled, wal[1]]) if wal[0] and wal[1] else None,
        wal_readings=len(sampled) + 2 if wal[0] and wal[1] else None,
    )


@dataclass
class Result:
    engine: str
    rows: int
    rate: float
    purge_seconds: float
    payloads_dropped: int | None
    expected_dropped: int
    windows: list[Window]
    other_cpu_pct: float
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def goal_met(self) -> bool:
        during = next(w for w in self.windows if w.name == "during purge")
        return during.longest_stall_ms <= GOAL_STALL_MS


@dataclass
class Purged:
    """What :func:`load_and_purge` saw: the load, the purge's start and end
    (perf_counter), its exit code and output, and on PostgreSQL the WAL read
    when the load started, the purge started, it ended and the load ended,
    and every 0.1 s in between (`sampler`)."""

    run: _load.LoadRun
    start: float
    end: float
    code: int
    out: str
    wal: list[WalState | None]
    sampler: Sampler | None = None


async def _wal_now(url: str, engine: str) -> WalState | None:
    if engine != "postgresql":
        return None
    try:
        return await read_state(url)
    except WalUnknown as exc:
        log(f"note: the WAL is not known ({exc})")
        return None


async def load_and_purge(port: int, url: str, args: argparse.Namespace, workdir: Any) -> Purged:
    """Steady load; the purge subprocess after --before seconds; the load stops
    --after seconds after it exits."""
    deliveries = _load.Deliveries()
    wal = [await _wal_now(url, args.engine)]
    sampler = Sampler(url).start() if wal[0] is not None else None
    stop = asyncio.Event()
    load = asyncio.create_task(
        _load.open_loop(port, deliveries, rate=args.rate, connections=args.connections, until=stop)
    )
    proc: asyncio.subprocess.Process | None = None
    try:
        await asyncio.sleep(args.before)
        env = serve_env(url)
        argv = [sys.executable, "-m", "onceonly.cli", "purge", "--older-than", args.older_than]
        argv += ["--batch-size", str(args.batch_size), "--pause", str(args.pause)]
        argv += ["--format", "json"]
        log(f"purging: {' '.join(argv[1:])}")
        wal.append(await _wal_now(url, args.engine))
        purge_start = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            cwd=workdir,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), args.timeout)
        purge_end = time.perf_counter()
        wal.append(await _wal_now(url, args.engine))
        code = proc.returncode if proc.returncode is not None else -1
        log(f"purge exited {code} after {purge_end - purge_start:.1f} s")
        await asyncio.sleep(args.after)
    except TimeoutError:
        raise BenchmarkError(f"the purge took longer than --timeout {args.timeout} s") from None
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        stop.set()
        run = await load
        if sampler is not None:
            await asyncio.to_thread(sampler.stop)
    wal.append(await _wal_now(url, args.engine))
    out_text = out.decode(errors="replace")
    return Purged(run, purge_start, purge_end, code, out_text, wal, sampler)


class Run(Workspace):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__("onceonly-purge-", args)
        self.args = args
        self.fill = _prefill.Fill(rows=args.rows, span_days=60.0, newest_age_days=31.0)
        self.result: Result | None = None

    def prepare(self) -> str:
        if self.args.engine == "sqlite":
            path = self.workdir / "onceonly.db"
            log(f"filling {path} ({self.fill.rows:,} rows)")
            return _prefill.sqlite_fill(str(path), self.fill)
        self.created_db = True
        return _prefill.pg_prepare(
            self.pg_admin_url, self.pg_database, self.fill, template_prefix=TEMPLATE_PREFIX
        )

    def measure(self) -> Result:
        args = self.args
        url = self.prepare()
        expected = self.fill.processed_count()
        before_rows = count(url, "SELECT count(*) FROM onceonly_events")
        flush_writes()
        if args.wait_quiet:
            wait_for_quiet(args.wait_quiet)
        port = free_port()
        meter = _harness.CpuMeter(0)
        with server(
            self.procs,
            "onceonly",
            serve_argv(port),
            port=port,
            env=serve_env(url),
            cwd=self.workdir,
            ready=("GET", "/healthz", None),
        ) as srv:
            log(f"receiving at {args.rate:g}/s on port {port} (pid {srv.proc.pid})")
            purged = asyncio.run(load_and_purge(port, url, args, self.workdir))
        run, p0, p1, wal = purged.run, purged.start, purged.end, purged.wal
        sampler = purged.sampler

        def sampled(start: float, end: float) -> list[WalState]:
            return sampler.between(start, end) if sampler is not None else []

        cpu = meter.stop()
        problems: list[str] = []
        dropped: int | None = None
        if purged.code != 0:
            problems.append(f"onceonly purge exited {purged.code}: {purged.out[-2000:]}")
        else:
            try:
                dropped = int(json.loads(purged.out)["payloads_dropped"])
            except (ValueError, KeyError, TypeError):
                problems.append(f"cannot read the purge's report: {purged.out[-2000:]}")
        if dropped is not None and dropped != expected:
            problems.append(f"purge dropped {dropped} payloads, expected {expected}")
        left = count(
            url,
            "SELECT count(*) FROM onceonly_events WHERE event_id LIKE 'evt_prefill_%'"
            " AND status = 'processed' AND payload_purged_at IS NULL",
        )
        if left:
            problems.append(f"{left} processed prefilled events still have their payload")
        if run.errors:
            problems.append(f"{run.errors} of {len(run.samples)} answers were not 2xx")
        added = count(url, "SELECT count(*) FROM onceonly_events") - before_rows
        if added != run.ok:
            problems.append(f"{added} new rows for {run.ok} 2xx answers")
        return Result(
            engine=args.engine,
            rows=args.rows,
            rate=args.rate,
            purge_seconds=round(p1 - p0, 3),
            payloads_dropped=dropped,
            expected_dropped=expected,
            windows=[
                window(
                    "before purge",
                    run,
                    run.started,
                    p0,
                    srv,
                    (wal[0], wal[1]),
                    sampled(run.started, p0),
                ),
                window("during purge", run, p0, p1, srv, (wal[1], wal[2]), sampled(p0, p1)),
                window(
                    "after purge",
                    run,
                    p1,
                    run.ended,
                    srv,
                    (wal[2], wal[3]),
                    sampled(p1, run.ended),
                ),
            ],
            other_cpu_pct=cpu.other_pct,
            problems=problems,
        )

    def cleanup(self) -> None:
        super().cleanup()
        if self.args.engine == "postgresql" and not self.args.cache_templates:
            try:
                _prefill.pg_drop_template(self.pg_admin_url, TEMPLATE_PREFIX, self.fill)
            except Exception as exc:
                log(f"warning: could not drop the template database: {exc!r}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = parser_for("python benchmarks/purge_stall.py", __doc__)
    parser.add_argument("--engine", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument("--rows", type=int, default=1_000_000, help="old events to purge")
    parser.add_argument("--rate", type=float, default=200.0, help="deliveries per second")
    parser.add_argument("--connections", type=int, default=16, help="connections at most")
    parser.add_argument("--before", type=float, default=5.0, help="seconds of load before")
    parser.add_argument("--after", type=float, default=2.0, help="seconds of load after")
    parser.add_argument("--older-than", default="30d", help="the purge's --older-than")
    parser.add_argument(
        "--batch-size", type=int, default=250, help="the purge's --batch-size (its default)"
    )
    parser.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="the purge's --pause: seconds it waits after each batch (its default: 0)",
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds the purge may take")
    parser.add_argument(
        "--cache-templates",
        action="store_true",
        help="PostgreSQL: keep the filled template database for the next run",
    )
    add_pg_admin_url(parser)
    parser.add_argument(
        "--pg-database", default="onceonly_bench_purge", help="database measured (recreated)"
    )
    add_wait_quiet(parser)
    parser.add_argument("--keep-db", action="store_true", help="keep the measured database")
    parser.add_argument("--keep-temp", action="store_true", help="keep the temporary directory")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if not 0 <= args.pause <= MAX_PURGE_PAUSE:
        parser.error(f"--pause takes 0 to {MAX_PURGE_PAUSE:g} seconds, as the purge does")
    if args.rows < 1 or args.rate <= 0 or args.connections < 1 or args.batch_size < 1:
        parser.error("needs --rows, --rate, --connections and --batch-size > 0")
    if args.before <= 0 or args.after < 0 or args.wait_quiet < 0:
        parser.error("needs --before > 0, --after >= 0, --wait-quiet >= 0")
    return args


def print_report(r: Result, env: dict[str, Any]) -> None:
    print(
        f"\npurge stall on {r.engine} {env['engine_version']}: {r.rows:,} old events, "
        f"receiving at {r.rate:g}/s; Python {env['python']}, {env['cpus']} CPUs"
    )
    print(
        f"purge: {r.purge_seconds:.1f} s, {r.payloads_dropped} payloads dropped "
        f"(expected {r.expected_dropped})"
    )
    header = f"{'window':<14}{'seconds':>8}{'requests':>9}{'p50 ms':>8}{'p99 ms':>8}"
    header += f"{'max ms':>8}{'stall ms':>9}{'WAL MB':>8}{'segs':>6}  full collections"
    print(header)
    print("-" * len(header))
    for w in r.windows:
        wal_mb = f"{w.wal_bytes / 1e6:,.0f}" if w.wal_bytes is not None else "-"
        made = str(w.wal_segments_made) if w.wal_segments_made is not None else "-"
        print(
            f"{w.name:<14}{w.seconds:>8.1f}{w.requests:>9}{w.p50_ms:>8.2f}{w.p99_ms:>8.2f}"
            f"{w.max_ms:>8.2f}{w.longest_stall_ms:>9.2f}{wal_mb:>8}{made:>6}  "
            f"{_harness.describe_collections(w.full_collections_ms)}"
        )
    print(
        "WAL MB: written to PostgreSQL's write-ahead log in the window, by anything on that "
        "server; segs: new 16 MB segment files it made meanwhile, at least, from the files "
        "counted every 0.1 s (each new one holds every commit; benchmarks/_wal.py)"
    )
    verdict = "met" if r.goal_met() else "MISSED"
    print(f"goal: no stall over {GOAL_STALL_MS:g} ms during the purge: {verdict}")
    if warning := _harness.foreign_load_warning(r.other_cpu_pct):
        print(f"!!! WARNING: {warning}")
    for problem in r.problems:
        print(f"!!! CHECK FAILED: {problem.upper()}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_signals()
    run = Run(args)
    try:
        env: dict[str, Any] = {
            "engine_version": sqlite3.sqlite_version
            if args.engine == "sqlite"
            else asyncio.run(pg_version(args.pg_admin_url, "--engine")),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "onceonly": dist_version("onceonly"),
            **_harness.onceonly_source(),
        }
        result = run.measure()
    except BenchmarkError as exc:
        log(f"error: {exc}")
        return 2
    except KeyboardInterrupt:
        log("interrupted; cleaning up")
        return 130
    finally:
        run.cleanup()
    if args.json:
        report = {
            "environment": env,
            "settings": vars(args),
            "result": {**asdict(result), "ok": result.ok, "goal_met": result.goal_met()},
        }
        print(json.dumps(report, indent=2))
    else:
        print_report(result, env)
    if not result.ok:
        log("!!! ONE OR MORE CHECKS FAILED: SEE ABOVE")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
