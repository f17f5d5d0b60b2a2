"""Receive throughput through Django: onceonly's URL against a bare Django view.

    python benchmarks/receive_django.py [--engine sqlite|postgresql] [--duration 10]

One gunicorn serves the test project (tests/djangoproject: the full default
middleware stack, CSRF included) with the same settings for both targets, one
after the other in the same run:

  bare      POST /bare/: a Django view that reads the body and answers 200;
  onceonly  POST /webhooks/stripe: ``include("onceonly.contrib.django.urls")``,
            verifying each Stripe signature and storing each event (group
            commit on each process's inbox thread) before its 200.

The requests are benchmarks/receive.py's: distinct, pre-signed Stripe events
cycled by benchmarks/receive.lua, disjoint slices for every phase, so each
onceonly 2xx is a fresh insert. Its rows are checked against what wrk sent
(rows == 2xx + requests in flight at wrk's stop), as receive.py does. The
figure is the ratio of requests/s, onceonly to bare.

Needs wrk (apt-get install wrk) and the test extra (django, gunicorn).

Exit status: 0 all checks passed, 1 a check failed, 2 the benchmark could not run.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import signal
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
    parser.add_argument("--duration", type=int, default=10, help="seconds measured per target")
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
    if args.duration < 1 or args.warmup < 0 or args.workers < 1 or args.worker_threads < 1:
        parser.error("needs --duration >= 1, --warmup >= 0, --workers >= 1, --worker-threads >= 1")
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
    # Four disjoint slices: warm-up and measurement of each target.
    quarter = math.floor(args.events / 4)
    slices = {
        ("bare", "warm-up"): (0, quarter),
        ("bare", "measured"): (quarter, 2 * quarter),
        ("onceonly", "warm-up"): (2 * quarter, 3 * quarter),
        ("onceonly", "measured"): (3 * quarter, 4 * quarter),
    }
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
    results: dict[str, WrkResult] = {}
    ready = ("POST", PATHS["bare"], b"{}")
    with server(
        run.procs, "gunicorn", gunicorn, port=port, env=env, cwd=run.workdir, ready=ready
    ) as srv:
        for target in ("bare", "onceonly"):
            if args.wait_quiet:
                wait_for_quiet(args.wait_quiet)
            for phase, seconds in (("warm-up", args.warmup), ("measured", args.duration)):
                if not seconds:
                    continue
                first, last = slices[(target, phase)]
                log(f"[{target}] {phase} {seconds} s")
                results[f"{target} {phase}"] = _wrk(
                    run, wrk, port, PATHS[target], requests, first, last, seconds, args
                )
        # SIGTERM: gunicorn's graceful stop, every request in flight answered.
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(60)
    problems: list[str] = []
    for name, result in results.items():
        if result.non_2xx or any(result.socket_errors.values()):
            problems.append(
                f"{name}: {result.non_2xx} non-2xx, socket errors {result.socket_errors}"
            )
    phases = [p for p in ("warm-up", "measured") if f"onceonly {p}" in results]
    ranges = [
        (
            requests.event_id(slices[("onceonly", p)][0]),
            requests.event_id(slices[("onceonly", p)][1]),
        )
        for p in phases
    ]
    total, per_phase = count_rows(database_url, ranges)
    for phase, rows in zip(phases, per_phase, strict=True):
        check = check_rows(phase, rows, results[f"onceonly {phase}"], args.connections)
        problems += check.problems
        print(f"rows onceonly {phase}: {rows} = {check.ok_2xx} 2xx + {check.in_flight} in flight")
    if total != sum(per_phase):
        problems.append(f"{total - sum(per_phase)} rows this run never sent")
    bare, onceonly = results["bare measured"], results["onceonly measured"]
    print(
        f"\nreceive through Django: gunicorn {dist_version('gunicorn')} ({args.workers} "
        f"{worker_class} workers x {args.worker_threads} threads), Django "
        f"{dist_version('django')}, Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"{args.engine}; wrk -t{args.threads} -c{args.connections} -d{args.duration}s"
    )
    for name, r in (("bare", bare), ("onceonly", onceonly)):
        print(
            f"{name:<10}{r.rps:>10,.0f} req/s  p50 {r.latency_ms['p50']:.2f} ms  "
            f"p99 {r.latency_ms['p99']:.2f} ms"
        )
    ratio = onceonly.rps / bare.rps if bare.rps else 0.0
    print(f"ratio onceonly / bare: {ratio:.2f}")
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
