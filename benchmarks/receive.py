"""Receive throughput: onceonly against bare Starlette endpoints, measured with wrk.

One run measures, one after the other, with the same wrk settings and the same
request bytes, every target at every --connections count (default 8, 32, 128):

  lean      benchmarks/bare_app.py's lean app: Starlette under uvicorn, one fixed
            route, POST /webhooks/stripe, that awaits the body and answers an
            empty 200 (no JSON). The reference the goal is stated against;
  bare      benchmarks/bare_app.py's bare app: POST /webhooks/{provider} reads
            the body and answers 200 JSON (no verification, no database). The
            reference of older figures, kept as a second ratio;
  sqlite    `onceonly serve` on a fresh SQLite file in a temporary directory;
  postgres  `onceonly serve` on a fresh PostgreSQL database (dropped and created
            for each measurement, dropped again at exit unless --keep-db);
  nodb      only when asked for (--targets): `onceonly serve` with the store
            replaced by the in-memory test double (benchmarks/nodb_app.py).
            Nothing is stored, so it has no row checks and no goal: it is the
            ceiling of the receive path once the database costs nothing.

The connection counts are the outer loop: at each count the targets run back
to back, so each ratio compares measurements a minute or so apart. Every
measurement starts a fresh server (and, for onceonly, a fresh database).

A quiet machine is not always a steady one: on a shared VM the same lean
server has served 12,000 requests/s and 25,000 within ten minutes, with no
other process using the CPU. So, with other targets measured, lean runs again
after them at each count ("lean again" in the table), and the ratios are
taken against the mean of its two runs. When the two differ by more than
10% (_harness.MAX_BASELINE_DRIFT), the machine's speed moved under the measurements: the goal is
then met only if it is met against the faster of the two, missed only if it
is missed against the slower, and otherwise reported UNSTEADY (--lean-once:
measure lean once, as before).

--workers N (N > 1) runs every server with N processes: `onceonly serve
--workers N` on PostgreSQL, and uvicorn's --workers N for lean and bare, so the
ratios compare the same process count. onceonly on SQLite refuses more than one
serve process: with --workers > 1 the sqlite target is left out, and the
report says so.

--pg-delay-ms MS puts benchmarks/delay_proxy.py between the postgres server and
PostgreSQL, adding MS milliseconds each way: a database farther away (another
zone, a network) than the one on this machine. Only the server's connections
go through it; the proxy's CPU counts with the load, and a `delay` line gives
SELECT 1's round trip through it and directly. The group commit's batches in
flight were chosen against it as well as against the local server.

Every request is a distinct Stripe event (unique `evt_` id) with a valid
Stripe-Signature, signed ahead of time into a file that benchmarks/receive.lua
cycles through, one slice per wrk thread; warm-up and measurement use disjoint
slices. So onceonly does real verification and real inserts, never duplicates.
The ids are numbered, each sorting next to the last, so every insert reaches
the last pages of the dedup index; --ids random scatters them as UUID
delivery ids are (GitHub's, Shopify's), and each insert reaches a page of
its own: more pages written per commit.

After each onceonly run the script counts the rows the run stored and checks
them against what wrk sent: rows == 2xx + requests still in flight when wrk
stopped (wrk closes its connections without waiting for the last answers, but
those events reach the server and are committed), in flight <= connections, no
non-2xx answer, no socket error, no event sent twice. Since every id is sent
once, this equality also proves each 2xx answer was a fresh insert. A failed
check is printed in capitals and makes the exit status 1.

The table has one row per target and connection count: requests/s, latency,
the ratio to lean and to bare at the same connection count, and the server's
CPU per request: the CPU time (user + system, from /proc/<pid>/stat) of the
server process and all its children (its worker processes) during the
measurement, divided by the requests answered, in microseconds. Then the
server's CPU use (% of one core, summed over its processes: near 100% with one
process means the event loop is the limit) and the CPU used by anything outside
the benchmark (% of the machine). Before each measurement the script waits
(--wait-quiet) for the machine to be nearly idle; foreign load above 10%
during a measurement is reported as a warning: the figures are then unreliable.
A `collections` line per target gives the garbage collector's full passes in
the server while it was measured (benchmarks/collections_probe): each one holds
the event loop, and every delivery in flight, for its whole length.

PostgreSQL makes a new WAL segment (16 MB of zeros, written and fsynced while
every commit waits) whenever its log needs one and no recycled one is ready:
on a new cluster, or under a load above any it met. On this project's
2-core VM, 60 s with 49 segments made held batches up to 175 ms and put the
p99 at 54 ms; the next 60 s, on recycled segments, gave 6.3 ms
(benchmarks/_wal.py). A server under a steady load writes into
recycled segments; so, by default, between the warm-up and the measurement
the script readies the WAL the measurement will need (the warm-up's rate,
plus a quarter): it writes that much into a scratch table, drops it and runs
CHECKPOINT. A `wal` line per postgres target says what was written while
measured, what was ready, what was primed and how many segments the server
still made; --no-wal-prime measures a cold log as it is.

The project's goal (2-core machine, 32 connections): onceonly >= 50% of the
lean endpoint's requests/s on SQLite and on PostgreSQL, with p99 <= 25 ms. It
is checked on the 32-connection measurements (not at all without 32 in
--connections or without the lean target). Missing the goal is reported, not
an error.

The report starts with where it came from: date (UTC), git commit of this
checkout (+dirty when tracked files differ from it), Python, CPU model and
count, and the exact command line. --json PATH also writes that, the settings,
the versions and every result to PATH; --json alone prints the JSON instead of
the table.

wrk and the servers share the machine's cores: keep --threads 1 on 2 cores.
Needs wrk (apt-get install wrk) and, for the postgres target, a PostgreSQL
server reachable at --pg-admin-url with rights to create databases.

Exit status: 0 all checks passed, 1 a check failed, 2 the benchmark could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import math
import os
import platform
import secrets
import select
import shlex
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

import _harness
from _harness import (
    BenchmarkError,
    CpuMeter,
    Processes,
    Workspace,
    add_pg_admin_url,
    add_run_options,
    add_wait_quiet,
    asyncpg_url,
    check_common,
    describe_collections,
    dist_version,
    exit_on_signals,
    find_wrk,
    foreign_load_warning,
    free_port,
    log,
    onceonly_source,
    parser_for,
    per_request,
    pg_version,
    server,
    wait_for_quiet,
    wrk_version,
)
from _wal import WalReport, Watch

HERE = Path(__file__).resolve().parent
LUA_SCRIPT = HERE / "receive.lua"
BARE_APP = HERE / "bare_app.py"
PATH = "/webhooks/stripe"
SECRET = "whsec_onceonly_benchmark_secret"
TARGETS = ("lean", "bare", "nodb", "sqlite", "postgres")
DEFAULT_TARGETS = ("lean", "bare", "sqlite", "postgres")
# Held to the goal, and counted in the CPU budget: onceonly with a database.
ONCEONLY_TARGETS = ("sqlite", "postgres")
NODB_APP = "nodb_app:app"
# The bare_app.py app each baseline target runs.
BASELINE_APPS = {"lean": "lean", "bare": "bare"}
DEFAULT_CONNECTIONS = (8, 32, 128)
GOAL_RATIO = 0.50
GOAL_P99_MS = 25.0
GOAL_CONNECTIONS = 32
STRIPE_TOLERANCE_S = 300
RESULT_PREFIX = "RECEIVE_RESULT "

# A payment_intent.succeeded event as Stripe sends it (compact: one line per
# request in the requests file), about 600 bytes. %(...)s are filled per event.
_EVENT = {
    "id": "%(evt)s",
    "object": "event",
    "api_version": "2024-06-20",
    "created": "%(created)s",
    "data": {
        "object": {
            "id": "pi_3%(key)s",
            "object": "payment_intent",
            "amount": 2000,
            "created": "%(created)s",
            "currency": "usd",
            "customer": "cus_Q%(key)s",
            "description": "Order %(n)s",
            "livemode": False,
            "metadata": {"order_id": "%(n)s"},
            "payment_method": "pm_1%(key)s",
            "payment_method_types": ["card"],
            "status": "succeeded",
        }
    },
    "livemode": False,
    "pending_webhooks": 1,
    "request": {"id": "req_%(key)s", "idempotency_key": "%(idem)s"},
    "type": "payment_intent.succeeded",
}
BODY_TEMPLATE = json.dumps(_EVENT, separators=(",", ":")).replace('"%(created)s"', "%(created)d")


# ---------------------------------------------------------------------------
# Signed requests


def event_id(tag: str, index: int, *, scattered: bool = False) -> str:
    """The id of a run's `index`-th event: numbered after the run's `tag`, so
    that each sorts next to the one before and a run's events are one range of
    ids; or, `scattered`, the head of an md5 digest of both, as long as the
    numbered id (the same row size), which lands anywhere among the ids
    already stored, as UUIDs do."""
    if scattered:
        digest = hashlib.md5(f"{tag}{index}".encode()).hexdigest()
        return "evt_" + digest[: len(tag) + 11]
    return f"evt_1{tag}{index:010d}"


@dataclass
class RequestsFile:
    path: Path
    count: int
    tag: str
    signed_at: int
    scattered: bool = False

    def event_id(self, index: int) -> str:
        return event_id(self.tag, index, scattered=self.scattered)

    def id_range(self, lo: int, hi: int) -> tuple[str, str]:
        """[first, last) event ids of events lo to hi (numbered ids only)."""
        if self.scattered:
            raise ValueError("scattered event ids form no range")
        return self.event_id(lo), self.event_id(hi)

    def age(self) -> float:
        return time.time() - self.signed_at


def write_requests(path: Path, count: int, secret: str, *, scattered: bool = False) -> RequestsFile:
    """`count` distinct events, each signed as Stripe does; one per line.
    Their ids: see :func:`event_id`."""
    tag = "".join(
        secrets.choice("ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz") for _ in range(8)
    )
    now = int(time.time())
    key = secret.encode()
    prefix = f"{now}.".encode()
    sig_prefix = f"t={now},v1="
    with path.open("w", encoding="ascii", newline="\n") as out:
        for i in range(count):
            body = BODY_TEMPLATE % {
                "evt": event_id(tag, i, scattered=scattered),
                "created": now,
                "key": f"{tag}{i:010d}Bn",
                "n": f"{i:08d}",
                "idem": f"{tag[:8]}-{i >> 16:04x}-4{i & 0xFFF:03x}-8000-{i:012x}",
            }
            raw = body.encode()
            signature = hmac.new(key, prefix + raw, hashlib.sha256).hexdigest()
            out.write(f"{sig_prefix}{signature}\t{body}\n")
        # On disk now: otherwise the kernel writes these ~200 MB back some 30 s
        # later, in the middle of a measurement, and every fsync waits behind it.
        out.flush()
        os.fsync(out.fileno())
    return RequestsFile(path, count, tag, now, scattered)


# ---------------------------------------------------------------------------
# wrk


@dataclass
class WrkResult(_harness.WrkResult):
    wraps: int  # times a thread ran out of its slice and began resending events


def run_wrk(
    procs: Processes,
    wrk: str,
    port: int,
    requests: RequestsFile,
    first: int,
    last: int,
    *,
    duration: int,
    connections: int,
    threads: int,
) -> WrkResult:
    argv = [
        wrk,
        f"-t{threads}",
        f"-c{connections}",
        f"-d{duration}s",
        "-s",
        str(LUA_SCRIPT),
        f"http://127.0.0.1:{port}{PATH}",
        "--",
        str(requests.path),
        str(first),
        str(last),
        str(threads),
    ]
    fields, per_thread = _harness.run_wrk(
        procs, argv, duration=duration, result_prefix=RESULT_PREFIX
    )
    return WrkResult(**fields, wraps=sum(int(t["wraps"]) for t in per_thread))


# ---------------------------------------------------------------------------
# Databases


_COUNT_RANGE = (
    "SELECT count(*) FROM onceonly_events WHERE provider = 'stripe'"
    " AND event_id >= {lo} AND event_id < {hi}"
)


_COUNT_IDS_SQLITE = (
    "SELECT count(*) FROM onceonly_events WHERE provider = 'stripe'"
    " AND event_id IN (SELECT value FROM json_each(?))"
)
_COUNT_IDS_PG = (
    "SELECT count(*) FROM onceonly_events WHERE provider = 'stripe' AND event_id = ANY($1::text[])"
)


def count_ids(url: str, id_lists: Sequence[Sequence[str]]) -> tuple[int, list[int]]:
    """(all rows, rows per list of event ids) in onceonly_events at `url`:
    count_rows for ids that form no range (scattered)."""
    return _count_each(
        url,
        (_COUNT_IDS_SQLITE, [(json.dumps(list(ids)),) for ids in id_lists]),
        (_COUNT_IDS_PG, [(list(ids),) for ids in id_lists]),
    )


def count_rows(url: str, ranges: Sequence[tuple[str, str]]) -> tuple[int, list[int]]:
    """(all rows, rows per [lo, hi) event-id range) in onceonly_events at `url`."""
    return _count_each(
        url,
        (_COUNT_RANGE.format(lo="?", hi="?"), ranges),
        (_COUNT_RANGE.format(lo="$1", hi="$2"), ranges),
    )


_Counts = tuple[str, Sequence[Sequence[object]]]


def _count_each(url: str, on_sqlite: _Counts, on_postgres: _Counts) -> tuple[int, list[int]]:
    """(all rows in onceonly_events at `url`, the count of the engine's
    statement for each of its parameter tuples)."""
    if url.startswith("sqlite:///"):
        sql, params = on_sqlite
        conn = sqlite3.connect(f"file:{url[len('sqlite:///') :]}?mode=ro", uri=True)
        try:
            total = int(conn.execute("SELECT count(*) FROM onceonly_events").fetchone()[0])
            per = [int(conn.execute(sql, p).fetchone()[0]) for p in params]
        finally:
            conn.close()
        return total, per

    async def pg() -> tuple[int, list[int]]:
        import asyncpg

        sql, params = on_postgres
        conn = await asyncpg.connect(url, timeout=5)
        try:
            total = int(await conn.fetchval("SELECT count(*) FROM onceonly_events"))
            per = [int(await conn.fetchval(sql, *p)) for p in params]
        finally:
            await conn.close()
        return total, per

    return asyncio.run(pg())


# ---------------------------------------------------------------------------
# One target


@dataclass
class RowCheck:
    phase: str
    rows: int
    sent: int
    ok_2xx: int
    in_flight: int
    wraps: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_rows(phase: str, rows: int, run: WrkResult, connections: int) -> RowCheck:
    check = RowCheck(phase, rows, run.sent, run.ok_2xx, run.in_flight, run.wraps)
    if run.wraps:
        check.problems.append(
            f"the requests file ran out {run.wraps} time(s): events were sent twice "
            "(raise --events)"
        )
    if rows < run.ok_2xx:
        check.problems.append(
            f"{run.ok_2xx - rows} 2xx answers have no new row (duplicates, or lost events)"
        )
    if rows != run.ok_2xx + run.in_flight:
        check.problems.append(
            f"rows {rows} != 2xx {run.ok_2xx} + in flight at wrk's stop {run.in_flight}"
        )
    if not 0 <= run.in_flight <= connections:
        check.problems.append(f"{run.in_flight} requests in flight with {connections} connections")
    return check


@dataclass
class TargetResult:
    target: str
    connections: int
    workers: int
    database: str | None
    requests: int
    duration_s: float
    requests_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    non_2xx: int
    socket_errors: int
    warmup_requests_per_s: float
    warmup_non_2xx: int
    server_cpu_pct: float  # the server's process tree, % of one core
    other_cpu_pct: float
    server_cpu_s: float  # the server's process tree, user + system
    server_processes: int
    cpu_us_per_request: float | None  # server_cpu_s / requests
    ratio_vs_lean: float | None = None
    ratio_vs_bare: float | None = None
    # The rest of the machine's CPU per request: PostgreSQL's processes (None
    # on the other targets) and the load generator (wrk and this script).
    db_us_per_request: float | None = None
    load_us_per_request: float | None = None
    idle_pct: float | None = None  # the machine's idle time, % of all its CPUs
    # How long each full garbage collection in the server held its event loop
    # during the measurement (ms; _harness's collections probe).
    full_collections_ms: list[float] = field(default_factory=list)
    # PostgreSQL's write-ahead log while measured (postgres only): benchmarks/_wal.py.
    wal: WalReport | None = None
    # With --pg-delay-ms: SELECT 1's round trip through the delay proxy and
    # directly, measured before the server started.
    round_trip_ms: RoundTrip | None = None
    # lean's second run at this connection count, after the other targets.
    again: bool = False
    # lean's requests/s at this connection count, each run (two unless
    # --lean-once); filled in by compare().
    lean_runs: list[float] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    row_checks: list[RowCheck] = field(default_factory=list)
    total_rows: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(c.ok for c in self.row_checks)

    @property
    def name(self) -> str:
        return f"{self.target} again" if self.again else self.target

    @property
    def lean_drift(self) -> float | None:
        """How far lean's runs at this connection count differ, as a share of
        the faster; None when it ran once."""
        return _harness.baseline_drift(self.lean_runs)

    @property
    def unsteady(self) -> bool:
        """lean's runs differ too much for a ratio to their mean to be trusted."""
        drift = self.lean_drift
        return drift is not None and drift > _harness.MAX_BASELINE_DRIFT

    def _judged(self) -> bool:
        return (
            self.target in ONCEONLY_TARGETS
            and self.connections == GOAL_CONNECTIONS
            and self.ratio_vs_lean is not None
        )

    def goal_met(self) -> bool | None:
        """None where the goal does not apply (baselines, other connection
        counts) or where lean's runs disagree on it (:attr:`unsteady`)."""
        if not self._judged():
            return None
        if self.p99_ms > GOAL_P99_MS:
            return False
        return _harness.goal_against_baseline(
            self.requests_per_s, self.ratio_vs_lean or 0, self.lean_runs, GOAL_RATIO
        )

    def goal_verdict(self) -> str:
        """What the table's goal column says: met, MISSED, UNSTEADY or -."""
        met = self.goal_met()
        if met is None and self._judged():
            return "UNSTEADY"
        return {None: "-", True: "met", False: "MISSED"}[met]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["row_checks"] = [{**asdict(c), "ok": c.ok} for c in self.row_checks]
        data["ok"] = self.ok
        data["goal_met"] = self.goal_met()
        data["goal"] = self.goal_verdict()
        return data


@dataclass
class Settings:
    duration: int
    warmup: int
    connections: list[int]
    threads: int
    workers: int
    events: int
    wrk: str
    pg_admin_url: str
    pg_database: str
    wait_quiet: int
    wal_prime: bool = True
    # Added to each direction between the server and PostgreSQL (ms), through
    # benchmarks/delay_proxy.py; None: the server connects directly.
    pg_delay_ms: float | None = None
    # "sequential" (numbered event ids) or "random" (scattered: see event_id).
    ids: str = "sequential"


def server_command(
    target: str, port: int, database_url: str | None, workers: int
) -> tuple[list[str], dict[str, str], tuple[str, str, bytes | None]]:
    """The server's argv, environment and readiness request for `target`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEONLY_")}
    # uvicorn reads its default worker count from there: only --workers decides.
    env.pop("WEB_CONCURRENCY", None)
    with_workers = ["--workers", str(workers)] if workers > 1 else []
    if target in BASELINE_APPS:
        argv = [sys.executable, str(BARE_APP), "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--app", BASELINE_APPS[target], *with_workers]
        return argv, env, ("POST", PATH, b"{}")
    env["ONCEONLY_STRIPE_SECRET"] = SECRET
    argv = [sys.executable, "-m", "onceonly.cli", "serve", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--log-level", "warning", "--no-access-log", *with_workers]
    if target == "nodb":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
        argv += ["--app", NODB_APP]
    else:
        assert database_url is not None
        env["ONCEONLY_DATABASE_URL"] = database_url
    return argv, env, ("GET", "/healthz", None)


DELAY_PROXY = HERE / "delay_proxy.py"


def start_delay_proxy(
    procs: Processes, database_url: str, delay_ms: float
) -> tuple[str, subprocess.Popen[bytes]]:
    """benchmarks/delay_proxy.py in front of `database_url`'s server: the URL
    that goes through it, and its process."""
    parts = urlsplit(database_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 5432
    argv = [sys.executable, str(DELAY_PROXY), "--listen", "0", "--target", f"{host}:{port}"]
    proc = procs.start([*argv, "--delay-ms", f"{delay_ms:g}"], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 10.0)
    line = proc.stdout.readline().decode(errors="replace").split() if ready else []
    if len(line) != 2 or line[0] != "ready" or not line[1].isdigit():
        procs.stop(proc, grace=1.0)
        raise BenchmarkError(f"benchmarks/delay_proxy.py did not start (it said {line!r})")
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{line[1]}" if userinfo else f"127.0.0.1:{line[1]}"
    return urlunsplit(parts._replace(netloc=netloc)), proc


@dataclass
class RoundTrip:
    """SELECT 1's round trip in ms, the median of 200: through the delay proxy
    and directly."""

    delay_ms: float  # added each way
    through_proxy: float
    direct: float

    @classmethod
    def measure(cls, delay_ms: float, direct_url: str, proxy_url: str) -> RoundTrip:
        through = asyncio.run(_select_one_ms(proxy_url))
        return cls(delay_ms, through, asyncio.run(_select_one_ms(direct_url)))

    def describe(self) -> str:
        return (
            f"the server reached PostgreSQL through benchmarks/delay_proxy.py, "
            f"+{self.delay_ms:g} ms "
            f"each way: SELECT 1 took {self.through_proxy:.2f} ms there and back (median of "
            f"200), {self.direct:.2f} ms direct"
        )


async def _select_one_ms(url: str) -> float:
    import asyncpg

    conn = await asyncpg.connect(asyncpg_url(url), timeout=10)
    try:
        for _ in range(20):
            await conn.fetchval("SELECT 1")
        times = []
        for _ in range(200):
            start = time.perf_counter()
            await conn.fetchval("SELECT 1")
            times.append(time.perf_counter() - start)
    finally:
        await conn.close()
    return round(statistics.median(times) * 1000, 3)


def warm_up(
    name: str,
    settings: Settings,
    wrk: Callable[[str, int], WrkResult],
    wal: Watch,
) -> WrkResult | None:
    """The warm-up, if any; then, on PostgreSQL, the WAL readied for the
    measurement by the warm-up's rate."""
    warm: WrkResult | None = None
    if settings.warmup:
        log(f"[{name}] warm-up {settings.warmup} s")
        wal.warm_up_starts()
        warm = wrk("warm-up", settings.warmup)
    if wal.url is not None:
        log(f"[{name}] readying the WAL")
    wal.measurement_starts(warm.duration_s if warm else 0.0, settings.duration)
    return warm


@contextmanager
def database_reached(
    procs: Processes, settings: Settings, name: str, target: str, database_url: str | None
) -> Iterator[tuple[str | None, subprocess.Popen[bytes] | None, RoundTrip | None]]:
    """The URL the server is given, the delay proxy's process on the way to
    it (with --pg-delay-ms, on postgres) and the round trip through it."""
    if target != "postgres" or settings.pg_delay_ms is None or database_url is None:
        yield database_url, None, None
        return
    server_url, proxy = start_delay_proxy(procs, database_url, settings.pg_delay_ms)
    try:
        round_trip = RoundTrip.measure(settings.pg_delay_ms, database_url, server_url)
        log(f"[{name}] {round_trip.describe()}")
        yield server_url, proxy, round_trip
    finally:
        procs.stop(proxy, grace=1.0)


def measure(
    procs: Processes,
    settings: Settings,
    target: str,
    workdir: Path,
    requests: RequestsFile,
    database_url: str | None,
    connections: int,
    *,
    again: bool = False,
) -> TargetResult:
    """One target at one connection count; `again`: lean's second run there."""
    port = free_port()
    workers = settings.workers
    name = f"{target}{'-again' if again else ''}-c{connections}"

    # Disjoint slices: [0, split) warms up, [split, events) is measured.
    total = settings.warmup + settings.duration
    split = math.ceil(requests.count * settings.warmup / total) if settings.warmup else 0
    slices = {"warm-up": (0, split), "measured": (split, requests.count)}

    def wrk(phase: str, duration: int) -> WrkResult:
        first, last = slices[phase]
        return run_wrk(
            procs,
            settings.wrk,
            port,
            requests,
            first,
            last,
            duration=duration,
            connections=connections,
            threads=settings.threads,
        )

    wal = Watch.of(database_url, priming=settings.wal_prime)
    with database_reached(procs, settings, name, target, database_url) as (url, proxy, trip):
        argv, env, ready = server_command(target, port, url, workers)
        with server(procs, name, argv, port=port, env=env, cwd=workdir, ready=ready) as srv:
            log(f"[{name}] server pid {srv.proc.pid} on port {port}")
            warm = warm_up(name, settings, wrk, wal)
            log(f"[{name}] measuring {settings.duration} s")
            meter = CpuMeter(srv.proc.pid, helpers=[proxy.pid] if proxy is not None else [])
            run = wrk("measured", settings.duration)
            cpu = meter.stop()
            wal_report = wal.measurement_ends()
            if srv.proc.poll() is not None:
                raise BenchmarkError(f"{name} server died during the run:\n{srv.log_tail()}")
    # The server has shut down gracefully: every event it took is committed.

    result = TargetResult(
        target=target,
        connections=connections,
        workers=workers,
        database=database_url,
        **run.figures(),
        warmup_requests_per_s=round(warm.rps, 1) if warm else 0.0,
        warmup_non_2xx=warm.non_2xx if warm else 0,
        server_cpu_pct=cpu.server_pct,
        other_cpu_pct=cpu.other_pct,
        server_cpu_s=round(cpu.server_cpu_s, 3),
        server_processes=cpu.server_processes,
        cpu_us_per_request=per_request(cpu.server_cpu_s, run.requests),
        db_us_per_request=(
            per_request(cpu.postgres_cpu_s, run.requests) if target == "postgres" else None
        ),
        load_us_per_request=per_request(cpu.load_cpu_s, run.requests),
        idle_pct=cpu.idle_pct,
        full_collections_ms=srv.full_collections(cpu.since, cpu.until),
        wal=wal_report,
        round_trip_ms=trip,
        again=again,
    )
    if wal_report is not None and (warning := wal_report.warning()):
        result.warnings.append(warning)
    if workers > 1 and cpu.server_processes <= workers:
        result.warnings.append(
            f"{cpu.server_processes} server process(es) at the end of the measurement, "
            f"expected {workers} workers and their supervisor"
        )
    if warning := foreign_load_warning(cpu.other_pct):
        result.warnings.append(warning)
    for phase, phase_run in (("warm-up", warm), ("measured", run)):
        if phase_run is None:
            continue
        if phase_run.non_2xx:
            result.problems.append(f"{phase}: {phase_run.non_2xx} non-2xx responses")
        if any(phase_run.socket_errors.values()):
            result.problems.append(f"{phase}: socket errors {phase_run.socket_errors}")

    if database_url is not None:
        phases = [slices[p] for p in ("warm-up", "measured")]
        if requests.scattered:
            lists = [[requests.event_id(i) for i in range(lo, hi)] for lo, hi in phases]
            total_rows, (warm_rows, run_rows) = count_ids(database_url, lists)
        else:
            ranges = [requests.id_range(lo, hi) for lo, hi in phases]
            total_rows, (warm_rows, run_rows) = count_rows(database_url, ranges)
        result.total_rows = total_rows
        if warm is not None:
            result.row_checks.append(check_rows("warm-up", warm_rows, warm, connections))
        result.row_checks.append(check_rows("measured", run_rows, run, connections))
        if total_rows != warm_rows + run_rows:
            result.problems.append(
                f"{total_rows - warm_rows - run_rows} rows in the table that this run never sent"
            )
    return result


# ---------------------------------------------------------------------------
# Report


def cpu_model() -> tuple[str | None, int]:
    """The CPU's model name and the number of CPUs, from /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor() or None, os.cpu_count() or 0
    model: str | None = None
    count = 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "processor":
            count += 1
        # "model name" on x86; ARM kernels give "Model" or "Hardware" instead.
        elif key in ("model name", "Model", "Hardware") and value and model is None:
            model = value
    return model, count or os.cpu_count() or 0


def git_commit() -> str | None:
    """This checkout's commit, short, "+dirty" when tracked files differ from it."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "-C", str(HERE), *args], capture_output=True, text=True, check=False
        )

    try:
        head = git("rev-parse", "--short", "HEAD")
        if head.returncode != 0:
            return None
        status = git("status", "--porcelain", "--untracked-files=no")
    except OSError:  # no git
        return None
    dirty = status.returncode != 0 or bool(status.stdout.strip())
    return head.stdout.strip() + ("+dirty" if dirty else "")


def command_line(argv: Sequence[str] | None) -> str:
    """The command as it was typed (the interpreter's own argv), quoted for a shell."""
    if argv is not None:  # called from Python
        return shlex.join(["python", "benchmarks/receive.py", *argv])
    try:
        raw = Path("/proc/self/cmdline").read_bytes()
        parts = [p.decode(errors="replace") for p in raw.rstrip(b"\0").split(b"\0")]
    except OSError:
        parts = [sys.executable, *sys.argv]
    return shlex.join(parts)


def run_header(argv: Sequence[str] | None) -> dict[str, Any]:
    model, count = cpu_model()
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "git": git_commit(),
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
        "cpu_model": model,
        "cpu_count": count,
        "usable_cpus": len(os.sched_getaffinity(0)),
        "command": command_line(argv),
    }


def header_lines(header: dict[str, Any]) -> list[str]:
    cpus = f"{header['cpu_count']} CPUs"
    if header["usable_cpus"] != header["cpu_count"]:
        cpus += f" ({header['usable_cpus']} usable)"
    return [
        f"receive benchmark, {header['date']}, git {header['git'] or 'n/a'}, "
        f"Python {header['python']}, CPU {header['cpu_model'] or 'unknown'}, {cpus}",
        f"command: {header['command']}",
    ]


def environment(settings: Settings, targets: Sequence[str]) -> dict[str, Any]:
    env: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "onceonly": dist_version("onceonly"),
        "uvicorn": dist_version("uvicorn"),
        "uvloop": dist_version("uvloop"),
        "httptools": dist_version("httptools"),
        "starlette": dist_version("starlette"),
        "sqlite": sqlite3.sqlite_version,
        "wrk": wrk_version(settings.wrk),
    }
    if "sqlite" in targets or "postgres" in targets:
        env.update(onceonly_source())
    if "postgres" in targets:
        env["postgresql"] = asyncio.run(pg_version(settings.pg_admin_url))
    return env


def check_serve_workers() -> None:
    """`onceonly serve` must take --workers: fail before any measurement if not."""
    found = subprocess.run(
        [sys.executable, "-m", "onceonly.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0 or "--workers" not in found.stdout:
        raise BenchmarkError(
            "this onceonly's `serve` has no --workers option; run without --workers "
            "or against a tree that has it (PYTHONPATH=<tree>/src)"
        )


def budget_lines(results: Sequence[TargetResult]) -> list[str]:
    """Whether this machine has the CPU for the goal's rate at the CPU per
    request measured: server, PostgreSQL and the load generator share it."""
    cpus = len(os.sched_getaffinity(0))
    lines = []
    for r in results:
        lean = lean_rate(results, r.connections)
        if r.target not in ONCEONLY_TARGETS or lean is None or r.cpu_us_per_request is None:
            continue
        rate = GOAL_RATIO * lean
        whole = r.cpu_us_per_request + (r.db_us_per_request or 0) + (r.load_us_per_request or 0)
        budget = cpus * 1e6 / rate
        lines.append(
            f"budget {r.target} c{r.connections}: at {GOAL_RATIO:.0%} of lean ({rate:,.0f} "
            f"req/s) {cpus} CPUs give {budget:.0f} µs per request; this run used {whole:.0f} "
            f"(server {r.cpu_us_per_request:.0f}, database {r.db_us_per_request or 0:.0f}, "
            f"load {r.load_us_per_request or 0:.0f}), so the rate "
            f"{'fits' if whole <= budget else 'does not fit'} in the machine"
        )
        if r.server_processes == 1 and r.cpu_us_per_request * rate > 1e6:
            # One event loop: its thread, and on SQLite the store's, share one GIL.
            lines.append(
                f"  and the one server process would need {r.cpu_us_per_request * rate / 1e4:.0f}% "
                "of a core at that rate"
            )
    return lines


def goal_lines(results: Sequence[TargetResult], settings: Settings) -> list[str]:
    goal = (
        f"goal at {GOAL_CONNECTIONS} connections: onceonly >= {GOAL_RATIO:.0%} of lean "
        f"requests/s and p99 <= {GOAL_P99_MS:g} ms"
    )
    if GOAL_CONNECTIONS not in settings.connections:
        return [f"{goal}: not checked ({GOAL_CONNECTIONS} not in --connections)"]
    at_goal = [r for r in results if r.connections == GOAL_CONNECTIONS]
    if not any(r.target == "lean" for r in at_goal):
        return [f"{goal}: not checked (lean not measured)"]
    verdicts = []
    for r in at_goal:
        verdict = r.goal_verdict()
        if verdict == "-":
            continue
        ratio = f"{r.ratio_vs_lean:.0%}" if r.ratio_vs_lean is not None else "-"
        moved = ""
        if r.unsteady:
            low, high = (r.requests_per_s / rate for rate in sorted(r.lean_runs, reverse=True))
            moved = f"; lean's runs {r.lean_drift:.0%} apart: {low:.0%} to {high:.0%} of them"
        verdicts.append(f"{r.target} {verdict} ({ratio}, p99 {r.p99_ms:.1f} ms{moved})")
    return [f"{goal}: {'; '.join(verdicts) or 'no onceonly target measured'}"]


def _ratio(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else "-"


def print_table(
    results: Sequence[TargetResult],
    settings: Settings,
    env: dict[str, Any],
    header: dict[str, Any],
    notes: Sequence[str],
) -> None:
    print()
    for line in header_lines(header):
        print(line)
    connections = ",".join(str(c) for c in settings.connections)
    workers = f"{settings.workers} server processes" if settings.workers > 1 else "1 server process"
    print(
        f"wrk -t{settings.threads} -c{connections} -d{settings.duration}s after a "
        f"{settings.warmup} s warm-up; {workers}; event ids {settings.ids}; "
        f"uvicorn {env['uvicorn']}, "
        f"uvloop {env['uvloop']}, httptools {env['httptools']}, starlette {env['starlette']}; "
        f"{env['wrk']}"
    )
    if "onceonly_path" in env:
        print(
            f"onceonly from {env['onceonly_path']} (git {env['onceonly_git'] or 'n/a'}), "
            f"SQLite {env['sqlite']}, PostgreSQL {env.get('postgresql', 'n/a')}"
        )
    for note in notes:
        print(f"note: {note}")
    columns = (
        f"{'target':<10}{'conns':>6}{'requests/s':>11}{'p50 ms':>8}{'p99 ms':>8}{'non-2xx':>8}"
        f"{'vs lean':>8}{'vs bare':>8}{'µs/req':>8}{'db µs':>7}{'load µs':>8}"
        f"{'srv CPU':>8}{'idle':>6}{'other':>7}  {'checks':<8}{'goal':<8}"
    )
    print(columns)
    print("-" * len(columns))
    for r in results:
        check = ("OK" if r.ok else "FAILED") if r.database is not None or not r.ok else "-"
        goal = r.goal_verdict()
        cpu, db, load = (
            f"{v:.0f}" if v is not None else "-"
            for v in (r.cpu_us_per_request, r.db_us_per_request, r.load_us_per_request)
        )
        idle = f"{r.idle_pct:.0f}%" if r.idle_pct is not None else "-"
        print(
            f"{r.name:<10}{r.connections:>6}{r.requests_per_s:>11,.0f}{r.p50_ms:>8.2f}"
            f"{r.p99_ms:>8.2f}{r.non_2xx:>8}{_ratio(r.ratio_vs_lean):>8}"
            f"{_ratio(r.ratio_vs_bare):>8}{cpu:>8}{db:>7}{load:>8}{r.server_cpu_pct:>7.0f}%"
            f"{idle:>6}{r.other_cpu_pct:>6.0f}%  {check:<8}{goal:<8}"
        )
    for line in goal_lines(results, settings):
        print(line)
    for line in budget_lines(results):
        print(line)
    for r in results:
        print(
            f"collections {r.name} c{r.connections}: in the server while measured, "
            f"{describe_collections(r.full_collections_ms)}"
        )
    for r in results:
        if r.wal is not None:
            print(f"wal {r.name} c{r.connections}: {r.wal.describe()}")
    for r in results:
        if r.round_trip_ms is not None:
            print(f"delay {r.name} c{r.connections}: {r.round_trip_ms.describe()}")
    print(
        "vs lean, vs bare: requests/s against that baseline at the same connection count "
        "(lean: the mean of its runs there)"
    )
    print(
        "µs/req: CPU time (user + system) of the server and its child processes per request "
        "answered;\ndb µs: the same for PostgreSQL's processes; load µs: for wrk and this "
        "script (and the delay proxy);\nsrv CPU: the server's, % of one core; "
        "idle: the machine's idle time, % of all its CPUs;\n"
        "other: CPU used by anything outside the benchmark, % of the machine"
    )
    for r in results:
        for c in r.row_checks:
            verdict = "OK" if c.ok else "FAILED"
            print(
                f"rows {r.target} c{r.connections} {c.phase}: {c.rows} rows = {c.ok_2xx} "
                f"answered 2xx + {c.in_flight} in flight at wrk's stop (sent {c.sent}, "
                f"resent {c.wraps}): {verdict}"
            )
        if r.total_rows is not None:
            print(f"rows {r.target} c{r.connections} table total: {r.total_rows}")
    print_problems(results, sys.stdout)


def print_problems(results: Sequence[TargetResult], out: IO[str]) -> None:
    for r in results:
        where = f"{r.name} c{r.connections}"
        for warning in r.warnings:
            print(f"!!! WARNING [{where}]: {warning}", file=out)
        for problem in r.problems + [p for c in r.row_checks for p in c.problems]:
            print(f"!!! CHECK FAILED [{where}]: {problem.upper()}", file=out)


# ---------------------------------------------------------------------------
# Main


def connection_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}"
        ) from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"connection counts must be >= 1: {text!r}")
    return list(dict.fromkeys(counts))  # each once, in the order given


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = parser_for("python benchmarks/receive.py", __doc__)
    parser.add_argument(
        "--duration", type=int, default=10, help="seconds measured per target and connection count"
    )
    parser.add_argument(
        "--warmup", type=int, default=2, help="seconds of load before each measurement (0: none)"
    )
    parser.add_argument(
        "--connections",
        type=connection_counts,
        default=",".join(str(c) for c in DEFAULT_CONNECTIONS),
        metavar="N,N,...",
        help="wrk connections (-c): every target is measured at each of these counts",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="wrk threads (-t); each gets its own events"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="server processes: `onceonly serve --workers N` and uvicorn --workers N for "
        "lean and bare; above 1, the sqlite target is left out (SQLite takes one serve "
        "process)",
    )
    parser.add_argument(
        "--targets",
        default=",".join(DEFAULT_TARGETS),
        help=f"comma-separated subset of {','.join(TARGETS)} (nodb: only when named)",
    )
    parser.add_argument(
        "--events",
        type=int,
        default=0,
        help="signed events to prepare; 0: 25,000 per second of warm-up and "
        "measurement, at least 300,000",
    )
    add_pg_admin_url(parser)
    parser.add_argument(
        "--pg-database",
        default="onceonly_bench",
        help="database dropped and created for each measurement",
    )
    add_wait_quiet(parser)
    parser.add_argument(
        "--wal-prime",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="before measuring postgres, ready the WAL segments the measurement will "
        "need (a scratch table's inserts, then CHECKPOINT), as a steady load would; "
        "--no-wal-prime: measure with the log as it is, new segments made mid-run",
    )
    parser.add_argument(
        "--pg-delay-ms",
        type=float,
        default=None,
        metavar="MS",
        help="postgres: the server reaches PostgreSQL through benchmarks/delay_proxy.py, "
        "which adds MS milliseconds each way, as a database farther away would (the "
        "server's connections only); SELECT 1's round trip through it is printed",
    )
    parser.add_argument(
        "--ids",
        choices=("sequential", "random"),
        default="sequential",
        help="event ids: numbered, each sorting next to the last, so that every insert "
        "reaches the dedup index's last pages (as every figure before 2026-12-08); or "
        "random, scattered as UUID delivery ids are (the head of an md5 digest, as long): "
        "each insert then reaches a page of the index of its own",
    )
    parser.add_argument(
        "--lean-once",
        action="store_true",
        help="measure lean once per connection count (by default it runs again after the "
        "other targets; when its two runs differ by more than "
        # "%%": argparse formats help strings with %.
        f"{_harness.MAX_BASELINE_DRIFT:.0%}%, a goal that one run meets and the other misses "
        "is reported UNSTEADY)",
    )
    add_run_options(parser, json_path=True)
    args = parser.parse_args(argv)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if not targets or any(t not in TARGETS for t in targets):
        parser.error(f"--targets takes a comma-separated subset of {','.join(TARGETS)}")
    args.targets = [t for t in TARGETS if t in targets]
    args.notes = []
    if args.workers > 1 and "sqlite" in args.targets:
        args.targets.remove("sqlite")
        args.notes.append(
            f"sqlite left out: onceonly serve on SQLite refuses --workers {args.workers}; "
            "onceonly measured on postgres only"
            if "postgres" in args.targets
            else f"sqlite left out: onceonly serve on SQLite refuses --workers {args.workers}"
        )
        if not args.targets:
            parser.error("with --workers > 1 the sqlite target cannot run; pick others")
    if (
        args.duration < 1
        or args.warmup < 0
        or args.threads < 1
        or args.workers < 1
        or args.events < 0
        or args.wait_quiet < 0
        or (args.pg_delay_ms is not None and not 0 <= args.pg_delay_ms <= 1000)
    ):
        parser.error(
            "needs --duration >= 1, --warmup >= 0, --threads >= 1, --workers >= 1, "
            "--events >= 0, --wait-quiet >= 0, --pg-delay-ms between 0 and 1000"
        )
    check_common(parser, args)
    return args


class Run(Workspace):
    """The targets measured in one invocation."""

    def __init__(self, settings: Settings, args: argparse.Namespace) -> None:
        super().__init__("onceonly-bench-", args)
        self.settings = settings
        self.args = args
        self.results: list[TargetResult] = []

    def measure_all(self) -> None:
        settings = self.settings
        seconds = settings.warmup + settings.duration
        path = self.workdir / "requests.txt"
        log(f"signing {settings.events:,} events into {path}")
        scattered = settings.ids == "random"
        requests = write_requests(path, settings.events, SECRET, scattered=scattered)
        # lean again after the others, to see whether the machine's speed held.
        runs = [(target, False) for target in self.args.targets]
        if self.lean_again:
            runs.append(("lean", True))
        for connections in settings.connections:
            for target, again in runs:
                if settings.wait_quiet:
                    wait_for_quiet(settings.wait_quiet)
                # Timestamps must stay inside Stripe's 300 s tolerance until the end.
                if requests.age() + seconds + 60 > STRIPE_TOLERANCE_S:
                    log("re-signing the events with a fresh timestamp")
                    requests = write_requests(path, settings.events, SECRET, scattered=scattered)
                # A fresh database per measurement: the row checks count what this
                # measurement sent, and the table's size stays the same for each.
                database_url: str | None = None
                if target == "sqlite":
                    database_url = f"sqlite:///{self.workdir / f'onceonly-c{connections}.db'}"
                elif target == "postgres":
                    database_url = self.recreate_db()
                self.results.append(
                    measure(
                        self.procs,
                        settings,
                        target,
                        self.workdir,
                        requests,
                        database_url,
                        connections,
                        again=again,
                    )
                )
        compare(self.results)

    @property
    def lean_again(self) -> bool:
        """Whether lean runs a second time after the others at each count."""
        targets = self.args.targets
        return not self.args.lean_once and "lean" in targets and len(targets) > 1


def lean_rate(results: Sequence[TargetResult], connections: int) -> float | None:
    """lean's requests/s at `connections`: the mean of its runs there."""
    rates = [
        r.requests_per_s
        for r in results
        if r.target == "lean" and r.connections == connections and r.requests_per_s
    ]
    return sum(rates) / len(rates) if rates else None


def compare(results: Sequence[TargetResult]) -> None:
    """Each result's ratios to the baselines at its connection count (to the
    mean of lean's runs there) and, where lean ran twice, how far apart."""
    for connections in dict.fromkeys(r.connections for r in results):
        here = [r for r in results if r.connections == connections]
        leans = [r.requests_per_s for r in here if r.target == "lean"]
        bare = next((r.requests_per_s for r in here if r.target == "bare"), None)
        base = {"lean": lean_rate(results, connections), "bare": bare}
        for r in here:
            r.lean_runs = list(leans)
            for baseline, rate in base.items():
                if rate:
                    setattr(r, f"ratio_vs_{baseline}", round(r.requests_per_s / rate, 3))
            if r.again and r.unsteady:
                r.warnings.append(
                    f"lean served {leans[0]:,.0f} requests/s before the other targets and "
                    f"{leans[-1]:,.0f} after them ({r.lean_drift:.0%} apart, over "
                    f"{_harness.MAX_BASELINE_DRIFT:.0%}): the machine's speed moved, so the "
                    f"ratios at {connections} connections are uncertain by as much"
                )


def write_json(path: str, report: dict[str, Any]) -> None:
    text = json.dumps(report, indent=2)
    if path == "-":
        print(text)
        return
    try:
        Path(path).write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        raise BenchmarkError(f"cannot write --json {path}: {exc}") from exc
    log(f"results written to {path}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    header = run_header(argv)
    # On stderr first, with the progress lines; on stdout again above the table.
    for line in header_lines(header):
        log(line)
    for note in args.notes:
        log(f"note: {note}")
    wrk = find_wrk(args.wrk)
    if wrk is None:
        return 2
    settings = Settings(
        duration=args.duration,
        warmup=args.warmup,
        connections=args.connections,
        threads=args.threads,
        workers=args.workers,
        events=args.events or max(300_000, 25_000 * (args.warmup + args.duration)),
        wrk=wrk,
        pg_admin_url=args.pg_admin_url,
        pg_database=args.pg_database,
        wait_quiet=args.wait_quiet,
        wal_prime=args.wal_prime,
        pg_delay_ms=args.pg_delay_ms,
        ids=args.ids,
    )
    exit_on_signals()

    run = Run(settings, args)
    try:
        env = environment(settings, args.targets)
        if settings.workers > 1 and "postgres" in args.targets:
            check_serve_workers()
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
    if args.json != "-":
        print_table(run.results, settings, env, header, args.notes)
    if args.json:
        report = {
            "header": header,
            "settings": {k: v for k, v in asdict(settings).items() if k != "wrk"},
            "environment": env,
            "notes": args.notes,
            "goal": {
                "ratio_vs_lean": GOAL_RATIO,
                "p99_ms": GOAL_P99_MS,
                "connections": GOAL_CONNECTIONS,
                "summary": goal_lines(run.results, settings),
            },
            "results": [r.to_dict() for r in run.results],
            "ok": ok,
        }
        try:
            write_json(args.json, report)
        except BenchmarkError as exc:
            log(f"error: {exc}")
            return 2
        if args.json == "-":
            print_problems(run.results, sys.stderr)
    if not ok:
        log("!!! ONE OR MORE CHECKS FAILED: SEE ABOVE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
