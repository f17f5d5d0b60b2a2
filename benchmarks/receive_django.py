"""Receive throughput through Django: onceonly's URL against a bare Django view.

    python benchmarks/receive_django.py [--engine sqlite|postgresql] [--rounds 3] [--duration 6]

One gunicorn serves the test project (tests/djangoproject: the full default
middleware stack, CSRF included) with the same settings for both targets, one
after the other in the same run:

  bare      POST /bare/: a Django view that reads the body and answers 200;
  onceonly  POST /webhooks/stripe: ``include("onceonly.contrib.django.urls")``,
            verifying each Stripe signature and storing each event (group
            commit on each process's inbox thread) before its 200.

The two alternate for --rounds rounds (bare first in odd rounds, onceonly
first in even ones), so load from elsewhere on a shared machine falls on both.
The requests are benchmarks/receive.py's: distinct, pre-signed Stripe events
cycled by benchmarks/receive.lua, disjoint slices for every phase, so each
onceonly 2xx is a fresh insert. Its rows are checked against what wrk sent
(rows == 2xx + requests in flight at wrk's stop), as receive.py does. The
figure is the ratio of requests/s, onceonly to bare: per round, and the
median.

Needs wrk (apt-get install wrk) and the test extra (django, gunicorn).

Exit status: 0 all checks passed, 1 a check failed, 2 the benchmark could not run.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import _harness
from _harness import (
    BenchmarkError,
    Workspace,
    add_pg_admin_url,
    add_run_options,
    add_wait_quiet,
    check_common,
    dist_version,
    exit_on_signals,
    find_wrk,
    free_port,
    log,
    parser_for,
    server,
    wait_for_quiet,
)
from receive import (
    LUA_SCRIPT,
    RESULT_PREFIX,
    SECRET,
    RequestsFile,
    WrkResult,
    check_rows,
    count_rows,
    write_requests,
)

PROJECT = Path(__file__).resolve().parent.parent / "tests" / "djangoproject"
PATHS = {"bare": "/bare/", "onceonly": "/webhooks/stripe"}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = parser_for("python benchmarks/receive_django.py", __doc__)
    parser.add_argument("--engine", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument(
        "--duration", type=int, default=6, help="seconds measured per target and round"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of bare then onceonly (alternating order)"
    )
    parser.add_argument("--warmup", type=int, default=2, help="seconds of load before each")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections (-c)")
    parser.add_argument("--threads", type=int, default=1, help="wrk threads (-t)")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument(
        "--worker-threads",
        type=int,
        default=8,
        help="threads per gunicorn worker (gthread; 1: sync workers)",
    )
    parser.add_argument("--events", type=int, default=200_000, help="signed events to prepare")
    parser.add_argument("--pg-database", default="onceonly_bench_django")
    add_pg_admin_url(parser)
    add_wait_quiet(parser)
    add_run_options(parser)
    args = parser.parse_args(argv)
    if min(args.duration, args.rounds, args.workers, args.worker_threads) < 1 or args.warmup < 0:
        parser.error("needs --duration, --rounds, --workers, --worker-threads >= 1, --warmup >= 0")
    check_common(parser, args)
    return args


def project_env(database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEONLY_")}
    env.update(
        ONCEONLY_TEST_DJANGO_DB=database_url,
        ONCEONLY_TEST_STRIPE_SECRET=SECRET,
        DJANGO_SETTINGS_MODULE="project.settings",
        PYTHONPATH=os.pathsep.join([str(PROJECT), env.get("PYTHONPATH", "")]),
    )
    return env


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    wrk = find_wrk(args.wrk)
    if wrk is None:
        return 2
    exit_on_signals()
    run = Workspace("onceonly-bench-django-", args)
    try:
        return measure(args, run, wrk)
    except BenchmarkError as exc:
        log(f"error: {exc}")
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        run.cleanup()


def measure(args: argparse.Namespace, run: Workspace, wrk: str) -> int:
    if args.engine == "sqlite":
        database_url = f"sqlite:///{run.workdir / 'db.sqlite3'}"
    else:
        database_url = run.recreate_db()
    env = project_env(database_url)
    subprocess.run(
        [sys.executable, str(PROJECT / "manage.py"), "migrate", "--verbosity", "0"],
        env=env,
        cwd=run.workdir,
        check=True,
    )
    log(f"signing {args.events:,} events")
    requests = write_requests(run.workdir / "requests.txt", args.events, SECRET)
    # Disjoint slices of the events: a warm-up per target, then one per
    # target and round. The two targets alternate, round after round, so a
    # load that comes and goes on a shared machine falls on both alike.
    phases = [("bare", "warm-up"), ("onceonly", "warm-up")]
    for n in range(1, args.rounds + 1):
        order = ("bare", "onceonly") if n % 2 else ("onceonly", "bare")
        phases += [(target, f"round {n}") for target in order]
    size = args.events // len(phases)
    slices = {phase: (i * size, (i + 1) * size) for i, phase in enumerate(phases)}
    port = free_port()
    worker_class = "gthread" if args.worker_threads > 1 else "sync"
    gunicorn = [
        sys.executable,
        "-m",
        "gunicorn",
        "project.wsgi:application",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(args.workers),
        "--threads",
        str(args.worker_threads),
        "--worker-class",
        worker_class,
        "--log-level",
        "warning",
    ]
    results: dict[tuple[str, str], WrkResult] = {}
    ready = ("POST", PATHS["bare"], b"{}")
    with server(
        run.procs, "gunicorn", gunicorn, port=port, env=env, cwd=run.workdir, ready=ready
    ) as srv:
        if args.wait_quiet:
            wait_for_quiet(args.wait_quiet)
        for target, phase in phases:
            seconds = args.warmup if phase == "warm-up" else args.duration
            if not seconds:
                continue
            first, last = slices[(target, phase)]
            log(f"[{target}] {phase} {seconds} s")
            results[(target, phase)] = _wrk(
                run, wrk, port, PATHS[target], requests, first, last, seconds, args
            )
        # SIGTERM: gunicorn's graceful stop, every request in flight answered.
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(60)
    problems: list[str] = []
    for (target, phase), result in results.items():
        if result.non_2xx or any(result.socket_errors.values()):
            problems.append(
                f"{target} {phase}: {result.non_2xx} non-2xx, socket errors {result.socket_errors}"
            )
    checked = [phase for target, phase in results if target == "onceonly"]
    ranges = [requests.id_range(*slices[("onceonly", p)]) for p in checked]
    total, per_phase = count_rows(database_url, ranges)
    for phase, rows in zip(checked, per_phase, strict=True):
        check = check_rows(phase, rows, results[("onceonly", phase)], args.connections)
        problems += check.problems
        print(f"rows onceonly {phase}: {rows} = {check.ok_2xx} 2xx + {check.in_flight} in flight")
    if total != sum(per_phase):
        problems.append(f"{total - sum(per_phase)} rows this run never sent")
    print(
        f"\nreceive through Django: gunicorn {dist_version('gunicorn')} ({args.workers} "
        f"{worker_class} workers x {args.worker_threads} threads), Django "
        f"{dist_version('django')}, Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"{args.engine}; wrk -t{args.threads} -c{args.connections} -d{args.duration}s per round"
    )
    ratios = []
    for n in range(1, args.rounds + 1):
        bare, onceonly = results[("bare", f"round {n}")], results[("onceonly", f"round {n}")]
        ratio = onceonly.rps / bare.rps if bare.rps else 0.0
        ratios.append(ratio)
        print(
            f"round {n}: bare {bare.rps:>7,.0f} req/s (p99 {bare.latency_ms['p99']:.1f} ms)  "
            f"onceonly {onceonly.rps:>7,.0f} req/s (p50 {onceonly.latency_ms['p50']:.1f} ms, "
            f"p99 {onceonly.latency_ms['p99']:.1f} ms)  ratio {ratio:.2f}"
        )
    print(f"ratio onceonly / bare, median of {args.rounds} rounds: {statistics.median(ratios):.2f}")
    for problem in problems:
        print(f"!!! CHECK FAILED: {problem.upper()}", file=sys.stderr)
    return 1 if problems else 0


def _wrk(
    run: Workspace,
    wrk: str,
    port: int,
    path: str,
    requests: RequestsFile,
    first: int,
    last: int,
    seconds: int,
    args: argparse.Namespace,
) -> WrkResult:
    """receive.py's wrk run, posting to `path`."""
    argv = [
        wrk,
        f"-t{args.threads}",
        f"-c{args.connections}",
        f"-d{seconds}s",
        "-s",
        str(LUA_SCRIPT),
        f"http://127.0.0.1:{port}{path}",
        "--",
        str(requests.path),
        str(first),
        str(last),
        str(args.threads),
    ]
    fields, per_thread = _harness.run_wrk(
        run.procs, argv, duration=seconds, result_prefix=RESULT_PREFIX
    )
    return WrkResult(**fields, wraps=sum(int(t["wraps"]) for t in per_thread))


if __name__ == "__main__":
    sys.exit(main())
