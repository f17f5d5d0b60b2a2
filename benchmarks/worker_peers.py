"""Worker throughput against its peers: onceonly, pgqueuer and procrastinate on one PostgreSQL.

    pip install -e '.[bench]'
    python benchmarks/worker_peers.py [--jobs 20000] [--only onceonly,pgqueuer,procrastinate]

Each system gets a database of its own on the same server (dropped and created
for the run, dropped at the end), installs its own tables there, and is given
the same work: N jobs whose handler does nothing, all enqueued before the
clock starts, then one worker timed from its start to the last job done
(committed as done in the database).

  onceonly       events inserted through the store, as the receiver inserts
                 them; one Worker (threads, --concurrency, --batch-size), each
                 batch's handlers and its `processed` marks in one transaction
                 (the same-transaction guarantee is not switched off);
  pgqueuer       jobs enqueued in batches with Queries.enqueue, one
                 QueueManager in drain mode (--batch-size jobs per dequeue);
                 its done-log is written by its buffer, flushed before run()
                 returns;
  procrastinate  jobs deferred with batch_defer_async, one worker with
                 wait=False (returns once the queue is caught up) and
                 --concurrency async slots; for reference.

After each run the script checks that every job ran exactly as often as it
should: the handler calls counted in Python equal N, and the database agrees
(onceonly: N rows `processed`; pgqueuer: queue table empty and N `successful`
log rows; procrastinate: N jobs `succeeded`). A lost or doubled job is printed
in capitals and makes the exit status 1.

The goal of issue 19: onceonly's events/s at least pgqueuer's (ratio >= 1.0).
A shared VM's speed can move between two runs a few seconds apart with no
other process busy, so with both measured, pgqueuer runs before and after
onceonly ("pgqueuer again"), and the ratio is to the mean of its two runs.
When those differ by more than 10% (_harness.MAX_BASELINE_DRIFT), the goal is met only if onceonly
beat the faster of them, missed only if it trailed the slower, and otherwise
reported UNSTEADY (--pgqueuer-once: one pgqueuer run, after onceonly, as
before).

Exit status: 0 all checks passed, 1 a check failed, 2 the benchmark could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

import _harness
from _harness import (
    BenchmarkError,
    add_pg_admin_url,
    add_wait_quiet,
    dist_version,
    drop_database,
    log,
    parser_for,
    pg_version,
    recreate_database,
    wait_for_quiet,
)

PEERS = ("onceonly", "pgqueuer", "procrastinate")
ENQUEUE_CHUNK = 1000
GOAL_RATIO = 1.0


@dataclass
class PeerResult:
    peer: str
    version: str | None
    jobs: int
    seconds: float
    jobs_per_s: float
    handler_calls: int
    done_in_db: int
    settings: dict[str, Any]
    other_cpu_pct: float
    problems: list[str] = field(default_factory=list)
    # pgqueuer's second run, after onceonly.
    again: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def name(self) -> str:
        return f"{self.peer} again" if self.again else self.peer


@dataclass
class Timing:
    seconds: float
    handler_calls: int
    done_in_db: int
    extra_problems: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------
# onceonly


async def _onceonly_enqueue(url: str, n: int) -> None:
    from onceonly import NewEvent, create_store

    async with create_store(url) as store:
        for start in range(0, n, ENQUEUE_CHUNK):
            await store.insert_events(
                [
                    NewEvent("stripe", f"evt_{i}", "charge.succeeded", b"{}", {})
                    for i in range(start, min(n, start + ENQUEUE_CHUNK))
                ]
            )


async def _count(url: str, sql: str) -> int:
    import asyncpg

    conn = await asyncpg.connect(url, timeout=10)
    try:
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


def run_onceonly(url: str, n: int, concurrency: int, batch_size: int, timeout: float) -> Timing:
    from onceonly import Event, Onceonly
    from onceonly.context import Context
    from onceonly.worker import Worker

    asyncio.run(_onceonly_enqueue(url, n))
    app = Onceonly(database_url=url, environ={})
    calls = 0
    lock = threading.Lock()

    @app.handler()
    def noop(event: Event, ctx: Context) -> None:
        nonlocal calls
        with lock:
            calls += 1

    worker = Worker(app, concurrency=concurrency, batch_size=batch_size)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    started = time.perf_counter()
    thread.start()
    deadline = time.monotonic() + timeout
    # worker.processed counts events whose transaction committed: the clock
    # stops at the last commit, not at the last handler call.
    while worker.processed < n and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.001)
    elapsed = time.perf_counter() - started
    worker.stop()
    thread.join()
    # Its LISTEN thread (not joined by run()) notices the stop within 0.5 s;
    # dropping the database under it would only log a lost connection.
    time.sleep(0.6)
    app.engine.dispose()  # its pooled connections, before the database is dropped
    done = asyncio.run(
        _count(url, "SELECT count(*) FROM onceonly_events WHERE status = 'processed'")
    )
    problems = [] if worker.processed >= n else [f"timed out after {timeout:.0f} s"]
    return Timing(elapsed, calls, done, problems)


# ---------------------------------------------------------------------------
# pgqueuer


async def _run_pgqueuer(url: str, n: int, batch_size: int, limit: float) -> Timing:
    import asyncpg
    from pgqueuer import Queries, QueueManager
    from pgqueuer.models import Job
    from pgqueuer.types import QueueExecutionMode

    conn = await asyncpg.connect(url)
    try:
        queries = Queries.from_asyncpg_connection(conn)
        await queries.install()
        for start in range(0, n, ENQUEUE_CHUNK):
            size = min(n, start + ENQUEUE_CHUNK) - start
            await queries.enqueue(["noop"] * size, [None] * size, [0] * size)
    finally:
        await conn.close()

    conn = await asyncpg.connect(url)
    calls = 0
    qm = QueueManager(Queries.from_asyncpg_connection(conn))

    async def noop(job: Job) -> None:
        nonlocal calls
        calls += 1

    # Registered by a call, not as a decorator: without the bench extra
    # installed (CI), mypy sees the decorator as untyped.
    qm.entrypoint("noop")(noop)

    started = time.perf_counter()
    problems: list[str] = []
    try:
        # Drain mode: run() returns once the queue is empty and every task has
        # finished; its status buffer is flushed on the way out, so the clock
        # stops after the last job's done-record is written. The periodic
        # log-to-statistics fold is off so the log rows can be counted after.
        await asyncio.wait_for(
            qm.run(
                batch_size=batch_size,
                mode=QueueExecutionMode.drain,
                log_aggregation_interval=timedelta(0),
            ),
            limit,
        )
    except TimeoutError:
        problems.append(f"timed out after {limit:.0f} s")
    elapsed = time.perf_counter() - started
    if not conn.is_closed():
        await conn.close()
    left = await _count(url, "SELECT count(*) FROM pgqueuer")
    if left:
        problems.append(f"{left} jobs still in the queue table")
    done = await _count(url, "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")
    return Timing(elapsed, calls, done, problems)


def run_pgqueuer(url: str, n: int, batch_size: int, timeout: float) -> Timing:
    return asyncio.run(_run_pgqueuer(url, n, batch_size, timeout))


# ---------------------------------------------------------------------------
# procrastinate


async def _run_procrastinate(url: str, n: int, concurrency: int, limit: float) -> Timing:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))
    calls = 0

    async def noop() -> None:
        nonlocal calls
        calls += 1

    task = app.task(name="noop")(noop)  # a call: see _run_pgqueuer

    problems: list[str] = []
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for start in range(0, n, ENQUEUE_CHUNK):
            size = min(n, start + ENQUEUE_CHUNK) - start
            await task.batch_defer_async(*({} for _ in range(size)))
        started = time.perf_counter()
        try:
            await asyncio.wait_for(
                app.run_worker_async(
                    wait=False, concurrency=concurrency, install_signal_handlers=False
                ),
                limit,
            )
        except TimeoutError:
            problems.append(f"timed out after {limit:.0f} s")
        elapsed = time.perf_counter() - started
    done = await _count(url, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")
    return Timing(elapsed, calls, done, problems)


def run_procrastinate(url: str, n: int, concurrency: int, timeout: float) -> Timing:
    return asyncio.run(_run_procrastinate(url, n, concurrency, timeout))


# ---------------------------------------------------------------------------
# Run


def measure(peer: str, url: str, args: argparse.Namespace, *, again: bool = False) -> PeerResult:
    n: int = args.jobs
    settings: dict[str, Any]
    if peer == "onceonly":
        settings = {"concurrency": args.concurrency, "batch_size": args.batch_size}
        version = dist_version("onceonly")
    elif peer == "pgqueuer":
        settings = {"batch_size": args.batch_size, "mode": "drain"}
        version = dist_version("pgqueuer")
    else:
        settings = {"concurrency": args.procrastinate_concurrency, "wait": False}
        version = dist_version("procrastinate")
    if args.wait_quiet:
        wait_for_quiet(args.wait_quiet)
    log(f"[{peer}{' again' if again else ''}] {n} jobs, {settings}")
    # The enqueueing happens inside the runners, before their clock starts; the
    # foreign-load meter covers the whole call, which slightly overstates "other".
    # pid 0: no server process; this process and PostgreSQL's count as ours.
    meter = _harness.CpuMeter(0)
    if peer == "onceonly":
        timing = run_onceonly(url, n, args.concurrency, args.batch_size, args.timeout)
    elif peer == "pgqueuer":
        timing = run_pgqueuer(url, n, args.batch_size, args.timeout)
    else:
        timing = run_procrastinate(url, n, args.procrastinate_concurrency, args.timeout)
    cpu = meter.stop()
    result = PeerResult(
        peer=peer,
        version=version,
        jobs=n,
        seconds=round(timing.seconds, 3),
        jobs_per_s=round(n / timing.seconds, 1) if timing.seconds else 0.0,
        handler_calls=timing.handler_calls,
        done_in_db=timing.done_in_db,
        settings=settings,
        other_cpu_pct=cpu.other_pct,
        problems=list(timing.extra_problems),
        again=again,
    )
    if timing.handler_calls != n:
        result.problems.append(f"handler ran {timing.handler_calls} times for {n} jobs")
    if timing.done_in_db != n:
        result.problems.append(f"database records {timing.done_in_db} jobs done of {n}")
    return result


def run_plan(peers: Sequence[str], pgqueuer_once: bool) -> list[tuple[str, bool]]:
    """The runs, in order, as (peer, again): pgqueuer on both sides of
    onceonly when both are measured, so that the ratio's baseline is seen
    before and after it; procrastinate (for reference) last."""
    if pgqueuer_once or not {"onceonly", "pgqueuer"} <= set(peers):
        return [(peer, False) for peer in peers]
    plan = [("pgqueuer", False), ("onceonly", False), ("pgqueuer", True)]
    return plan + [(peer, False) for peer in peers if peer not in ("onceonly", "pgqueuer")]


def missing_peers(peers: Sequence[str]) -> list[str]:
    return [p for p in peers if p != "onceonly" and dist_version(p) is None]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = parser_for("python benchmarks/worker_peers.py", __doc__)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per system")
    parser.add_argument(
        "--only",
        default=",".join(PEERS),
        help="comma-separated subset of " + ",".join(PEERS),
    )
    parser.add_argument("--concurrency", type=int, default=4, help="onceonly: handler threads")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="onceonly: events per transaction; pgqueuer: jobs per dequeue",
    )
    parser.add_argument(
        "--procrastinate-concurrency",
        type=int,
        default=16,
        help="procrastinate: concurrent async jobs",
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds a system may take before it fails"
    )
    add_pg_admin_url(parser)
    parser.add_argument(
        "--pg-database",
        default="onceonly_bench_peers",
        help="prefix of the databases dropped and created (one per system)",
    )
    parser.add_argument("--keep-db", action="store_true", help="keep the databases")
    add_wait_quiet(parser)
    parser.add_argument(
        "--pgqueuer-once",
        action="store_true",
        help="run pgqueuer once, after onceonly (by default it runs before and after it, "
        "and a goal that one run meets and the other misses is reported UNSTEADY)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    only = [p.strip() for p in args.only.split(",") if p.strip()]
    if not only or any(p not in PEERS for p in only):
        parser.error(f"--only takes a comma-separated subset of {','.join(PEERS)}")
    args.only = [p for p in PEERS if p in only]
    if args.jobs < 1 or args.concurrency < 1 or args.batch_size < 1:
        parser.error("--jobs, --concurrency and --batch-size must be >= 1")
    if args.procrastinate_concurrency < 1 or args.wait_quiet < 0:
        parser.error("needs --procrastinate-concurrency >= 1 and --wait-quiet >= 0")
    return args


def print_table(results: Sequence[PeerResult], env: dict[str, Any]) -> None:
    print(
        f"\nworker peers: no-op handlers, all jobs enqueued first, timed from worker "
        f"start to the last job done; PostgreSQL {env['postgresql']}, "
        f"Python {env['python']}, {env['cpus']} CPUs"
    )
    header = f"{'system':<16}{'version':<10}{'jobs':>8}{'seconds':>9}{'jobs/s':>10}"
    header += f"{'other':>7}  {'check':<7}settings"
    print(header)
    print("-" * len(header))
    for r in results:
        check = "OK" if r.ok else "FAILED"
        settings = ", ".join(f"{k}={v}" for k, v in r.settings.items())
        print(
            f"{r.name:<16}{r.version or '-':<10}{r.jobs:>8}{r.seconds:>9.2f}"
            f"{r.jobs_per_s:>10,.0f}{r.other_cpu_pct:>6.0f}%  {check:<7}{settings}"
        )
    ratio = ratio_of(results)
    if ratio is not None:
        line = f"ratio onceonly/pgqueuer (jobs/s): {ratio:.2f}"
        runs = pgqueuer_runs(results)
        if len(runs) > 1:
            low, high = (_onceonly_rate(results) / rate for rate in sorted(runs, reverse=True))
            line += f" to the mean of pgqueuer's two runs ({low:.2f} and {high:.2f} to each)"
        print(f"{line} (goal >= {GOAL_RATIO:g}: {verdict(results)})")
    print_problems(results)


def print_problems(results: Sequence[PeerResult]) -> None:
    for r in results:
        if warning := _harness.foreign_load_warning(r.other_cpu_pct):
            print(f"!!! WARNING [{r.name}]: {warning}")
        for problem in r.problems:
            print(f"!!! CHECK FAILED [{r.name}]: {problem.upper()}")
    if (drift := pgqueuer_drift(results)) is not None and drift > _harness.MAX_BASELINE_DRIFT:
        first, last = pgqueuer_runs(results)
        print(
            f"!!! WARNING: pgqueuer ran {first:,.0f} jobs/s before onceonly and {last:,.0f} "
            f"after it ({drift:.0%} apart, over {_harness.MAX_BASELINE_DRIFT:.0%}): "
            "the machine's speed moved"
        )


def pgqueuer_runs(results: Sequence[PeerResult]) -> list[float]:
    return [r.jobs_per_s for r in results if r.peer == "pgqueuer" and r.jobs_per_s]


def pgqueuer_drift(results: Sequence[PeerResult]) -> float | None:
    """How far pgqueuer's runs differ, as a share of the faster; None for one run."""
    return _harness.baseline_drift(pgqueuer_runs(results))


def _onceonly_rate(results: Sequence[PeerResult]) -> float:
    return next((r.jobs_per_s for r in results if r.peer == "onceonly"), 0.0)


def ratio_of(results: Sequence[PeerResult]) -> float | None:
    """onceonly's jobs/s to pgqueuer's (the mean of its runs)."""
    runs = pgqueuer_runs(results)
    if not runs or not any(r.peer == "onceonly" for r in results):
        return None
    return round(_onceonly_rate(results) / (sum(runs) / len(runs)), 3)


def verdict(results: Sequence[PeerResult]) -> str:
    """met, MISSED or UNSTEADY (pgqueuer's runs too far apart to tell); "-"
    without both systems."""
    ratio = ratio_of(results)
    if ratio is None:
        return "-"
    met = _harness.goal_against_baseline(
        _onceonly_rate(results), ratio, pgqueuer_runs(results), GOAL_RATIO
    )
    return {True: "met", False: "MISSED", None: "UNSTEADY"}[met]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    missing = missing_peers(args.only)
    if missing:
        log(f"error: {', '.join(missing)} not installed: pip install -e '.[bench]'")
        return 2
    _harness.exit_on_signals()
    results: list[PeerResult] = []
    created: list[str] = []
    try:
        env = {
            "postgresql": asyncio.run(pg_version(args.pg_admin_url, "--only")),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        }
        for peer, again in run_plan(args.only, args.pgqueuer_once):
            database = f"{args.pg_database}_{peer}"
            created.append(database)
            url = asyncio.run(recreate_database(args.pg_admin_url, database))
            results.append(measure(peer, url, args, again=again))
            if not args.keep_db:
                asyncio.run(drop_database(args.pg_admin_url, database))
                created.remove(database)
    except BenchmarkError as exc:
        log(f"error: {exc}")
        return 2
    except KeyboardInterrupt:
        log("interrupted; cleaning up")
        return 130
    finally:
        if not args.keep_db:
            for database in created:
                try:
                    asyncio.run(drop_database(args.pg_admin_url, database))
                except Exception as exc:
                    log(f"warning: could not drop {database}: {exc!r}")
    ok = all(r.ok for r in results)
    if args.json:
        report = {
            "environment": env,
            "jobs": args.jobs,
            "results": [{**asdict(r), "ok": r.ok} for r in results],
            "ratio_onceonly_pgqueuer": ratio_of(results),
            "pgqueuer_drift": pgqueuer_drift(results),
            "goal_ratio": GOAL_RATIO,
            "goal": verdict(results),
            "ok": ok,
        }
        print(json.dumps(report, indent=2))
    else:
        print_table(results, env)
    if not ok:
        log("!!! ONE OR MORE CHECKS FAILED: SEE ABOVE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
