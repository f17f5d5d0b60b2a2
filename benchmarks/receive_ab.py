"""Two trees of onceonly on the receive path, measured at the same time: A against B.

On a shared VM the machine's speed moves by 2-3x from one minute to the next
(another tenant's load), so two benchmark runs a minute apart cannot tell a 5%
change from that drift. Here both servers run side by side, each under its own
wrk, for the same seconds: whatever slows the machine slows both, and their
ratio stays readable. Each server gets half the machine or so, so the absolute
figures are lower than receive.py's; read the ratio B/A.

    python benchmarks/receive_ab.py --a HEAD~1                # A: that commit, B: this checkout
    python benchmarks/receive_ab.py --a main --b my-branch --engine postgresql --rounds 7

--a and --b each take a git revision (its ``src/`` is exported with ``git
archive`` into a temporary directory) or ``.`` (this checkout's ``src/``, with
its uncommitted changes: the default for --b). Each tree runs as ``python -m
onceonly.cli serve`` with that ``src`` first on PYTHONPATH, with this
interpreter and its installed packages: a tree that needs other dependencies
cannot be compared this way.

Every round starts two fresh servers on fresh databases (SQLite files in a
temporary directory, or two PostgreSQL databases on --pg-admin-url), warms both
up at once, then measures both at once. Every request is a distinct signed
Stripe event (as in receive.py); after each round the rows each server stored
are counted against what its wrk sent, and any non-2xx answer, socket error or
missing row fails the run (exit status 1). Which tree is started first
alternates from round to round.

Printed per round: requests/s and server CPU per request of each, and B/A for
both; at the end the median of each ratio over the rounds. A ratio of requests/s
above 1 means B served more in the same seconds; of CPU per request below 1, B
spent less per request.

Exit status: 0 all checks passed, 1 a check failed, 2 the benchmark could not run.
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import receive
from _harness import (
    BenchmarkError,
    CpuMeter,
    Processes,
    Server,
    add_pg_admin_url,
    add_wait_quiet,
    exit_on_signals,
    find_wrk,
    free_port,
    log,
    parser_for,
    pg_drop,
    pg_recreate,
    server,
    wait_for_quiet,
)

ROOT = Path(__file__).resolve().parent.parent
THIS_CHECKOUT = "."


@dataclass
class Side:
    """One of the two trees."""

    label: str  # "A" or "B"
    revision: str
    src: Path


@dataclass
class Measured:
    requests_per_s: float
    cpu_us_per_request: float
    p99_ms: float
    problems: list[str]


def export_src(revision: str, into: Path) -> Path:
    """`revision`'s ``src/`` under `into` (``.``: this checkout's, as it is)."""
    if revision == THIS_CHECKOUT:
        return ROOT / "src"
    archive = into / "src.tar"
    done = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), revision, "src"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise BenchmarkError(f"cannot export src/ of {revision!r}: {done.stderr.strip()}")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()
    return into / "src"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = parser_for("python benchmarks/receive_ab.py", __doc__)
    parser.add_argument("--a", required=True, metavar="REV", help="tree A: a git revision or .")
    parser.add_argument(
        "--b", default=THIS_CHECKOUT, metavar="REV", help="tree B: a git revision or ."
    )
    parser.add_argument("--engine", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the medians are printed")
    parser.add_argument("--duration", type=int, default=8, help="seconds measured per round")
    parser.add_argument("--warmup", type=int, default=2, help="seconds of load before each")
    parser.add_argument(
        "--connections", type=int, default=16, help="wrk connections to each server"
    )
    add_pg_admin_url(parser)
    add_wait_quiet(parser)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.duration < 1 or args.warmup < 0 or args.connections < 1:
        parser.error("needs --rounds >= 1, --duration >= 1, --warmup >= 0, --connections >= 1")
    return args


class Comparison:
    def __init__(self, args: argparse.Namespace, wrk: str) -> None:
        self.args = args
        self.wrk = wrk
        self.procs = Processes()
        self.workdir = Path(tempfile.mkdtemp(prefix="onceonly-ab-"))
        self.databases: list[str] = []
        self.sides = [
            Side("A", args.a, export_src(args.a, self._dir("tree-a"))),
            Side("B", args.b, export_src(args.b, self._dir("tree-b"))),
        ]
        self.results: dict[str, list[Measured]] = {"A": [], "B": []}

    def _dir(self, name: str) -> Path:
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def database(self, side: Side, round_no: int) -> str:
        if self.args.engine == "sqlite":
            return f"sqlite:///{self._dir(f'round-{round_no}') / f'{side.label.lower()}.db'}"
        name = f"onceonly_bench_ab_{side.label.lower()}"
        if name not in self.databases:
            self.databases.append(name)
        return pg_recreate(self.args.pg_admin_url, name)

    def round(self, round_no: int) -> None:
        args = self.args
        per_second = 12_000  # more than one server takes here, with room to spare
        events = max(60_000, per_second * (args.warmup + args.duration))
        split = math.ceil(events * args.warmup / (args.warmup + args.duration))
        order = self.sides if round_no % 2 == 0 else self.sides[::-1]
        requests = {
            side.label: receive.write_requests(
                self._dir(f"round-{round_no}") / f"requests-{side.label.lower()}.txt",
                events,
                receive.SECRET,
            )
            for side in order
        }
        urls = {side.label: self.database(side, round_no) for side in order}
        with self._servers(order, urls, round_no) as servers:
            if args.warmup:
                self._load(servers, requests, 0, split, args.warmup)
            runs, cpu = self._load(servers, requests, split, events, args.duration)
        line = []
        for side in self.sides:
            run = runs[side.label]
            problems = self._check(run, urls[side.label], requests[side.label], split)
            measured = Measured(
                requests_per_s=run.rps,
                cpu_us_per_request=cpu[side.label] / max(1, run.requests) * 1e6,
                p99_ms=run.latency_ms["p99"],
                problems=problems,
            )
            self.results[side.label].append(measured)
            line.append(
                f"{side.label} {measured.requests_per_s:8,.0f} req/s "
                f"{measured.cpu_us_per_request:6.1f} µs/req p99 {measured.p99_ms:6.1f} ms"
            )
            for problem in problems:
                log(f"!!! round {round_no} {side.label}: {problem}")
        a, b = self.results["A"][-1], self.results["B"][-1]
        print(
            f"round {round_no + 1}: {' | '.join(line)} | B/A req/s "
            f"{b.requests_per_s / a.requests_per_s:.3f}, µs/req "
            f"{b.cpu_us_per_request / a.cpu_us_per_request:.3f}",
            flush=True,
        )

    @contextmanager
    def _servers(
        self, order: Sequence[Side], urls: dict[str, str], round_no: int
    ) -> Iterator[dict[str, Server]]:
        """Both servers, started in `order`, each on its tree and database."""
        with ExitStack() as stack:
            started: dict[str, Server] = {}
            for side in order:
                port = free_port()
                target = "sqlite" if self.args.engine == "sqlite" else "postgres"
                argv, env, ready = receive.server_command(target, port, urls[side.label], 1)
                env["PYTHONPATH"] = str(side.src)
                started[side.label] = stack.enter_context(
                    server(
                        self.procs,
                        f"{side.label.lower()}-round{round_no}",
                        argv,
                        port=port,
                        env=env,
                        cwd=self._dir(f"round-{round_no}"),
                        ready=ready,
                    )
                )
            yield started

    def _load(
        self,
        servers: dict[str, Server],
        requests: dict[str, receive.RequestsFile],
        first: int,
        last: int,
        duration: int,
    ) -> tuple[dict[str, receive.WrkResult], dict[str, float]]:
        """wrk on both servers at once; (results, server CPU seconds) by side."""
        runs: dict[str, receive.WrkResult] = {}
        errors: list[BaseException] = []
        meters = {label: CpuMeter(srv.proc.pid) for label, srv in servers.items()}

        def one(label: str) -> None:
            try:
                runs[label] = receive.run_wrk(
                    self.procs,
                    self.wrk,
                    servers[label].port,
                    requests[label],
                    first,
                    last,
                    duration=duration,
                    connections=self.args.connections,
                    threads=1,
                )
            except BaseException as exc:  # re-raised on the main thread
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(label,)) for label in servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        cpu = {label: meter.stop().server_cpu_s for label, meter in meters.items()}
        for label, srv in servers.items():
            if srv.proc.poll() is not None:
                raise BenchmarkError(f"server {label} died:\n{srv.log_tail()}")
        return runs, cpu

    def _check(
        self, run: receive.WrkResult, url: str, requests: receive.RequestsFile, split: int
    ) -> list[str]:
        """What is wrong with one server's measured run (nothing: an empty list)."""
        problems = []
        if run.non_2xx:
            problems.append(f"{run.non_2xx} non-2xx answers")
        if sum(run.socket_errors.values()):
            problems.append(f"socket errors: {run.socket_errors}")
        lo, hi = requests.id_range(split, requests.count)
        _, (rows,) = receive.count_rows(url, [(lo, hi)])
        problems += receive.check_rows("measured", rows, run, self.args.connections).problems
        return problems

    def summary(self) -> int:
        a, b = self.results["A"], self.results["B"]
        rps = [y.requests_per_s / x.requests_per_s for x, y in zip(a, b, strict=True)]
        cpu = [y.cpu_us_per_request / x.cpu_us_per_request for x, y in zip(a, b, strict=True)]
        print(
            f"A = {self.sides[0].revision}, B = {self.sides[1].revision}, {self.args.engine}, "
            f"{self.args.connections} connections each, {len(rps)} rounds of "
            f"{self.args.duration} s: B/A requests/s median {statistics.median(rps):.3f} "
            f"(range {min(rps):.3f}-{max(rps):.3f}); B/A CPU per request median "
            f"{statistics.median(cpu):.3f} (range {min(cpu):.3f}-{max(cpu):.3f})"
        )
        failed = any(m.problems for m in a + b)
        if failed:
            log("!!! ONE OR MORE CHECKS FAILED: SEE ABOVE")
        return 1 if failed else 0

    def cleanup(self) -> None:
        self.procs.stop_all()
        for name in self.databases:
            try:
                pg_drop(self.args.pg_admin_url, name)
            except Exception as exc:
                log(f"warning: could not drop {name}: {exc!r}")
        shutil.rmtree(self.workdir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    wrk = find_wrk("wrk")
    if wrk is None:
        return 2
    exit_on_signals()
    try:
        comparison = Comparison(args, wrk)
    except BenchmarkError as exc:
        log(f"error: {exc}")
        return 2
    try:
        for round_no in range(args.rounds):
            if args.wait_quiet:
                wait_for_quiet(args.wait_quiet)
            comparison.round(round_no)
    except BenchmarkError as exc:
        log(f"error: {exc}")
        return 2
    except KeyboardInterrupt:
        log("interrupted; cleaning up")
        return 130
    finally:
        comparison.cleanup()
    return comparison.summary()


if __name__ == "__main__":
    sys.exit(main())
