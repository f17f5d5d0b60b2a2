"""What the wrk benchmarks (receive.py, idempotency.py) share: child processes,
machine-quiet waiting and CPU accounting, server start and stop, running wrk and
reading its result line, the benchmark PostgreSQL database, the command-line
options both take, and the clean-up at exit.

Also the database helpers of the in-process benchmarks (worker.py, duplicates.py,
idempotency_cpu.py).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import importlib.metadata
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

BUSY_WARNING_PCT = 10.0
_T = TypeVar("_T")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class BenchmarkError(Exception):
    """The benchmark could not run (as opposed to a failed check)."""


# ---------------------------------------------------------------------------
# Processes


class Processes:
    """Every child this script starts, so that all of them end with it."""

    def __init__(self) -> None:
        self.live: list[subprocess.Popen[bytes]] = []

    def start(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        stdout: IO[bytes] | int | None = None,
        stderr: IO[bytes] | int | None = None,
    ) -> subprocess.Popen[bytes]:
        # Own session: a Ctrl-C in the terminal reaches only this script, which
        # then stops the children itself, in order.
        proc = subprocess.Popen(
            list(argv),
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        self.live.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], *, grace: float = 15.0) -> None:
        """SIGINT (uvicorn's graceful shutdown), then SIGKILL after `grace` seconds."""
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGINT)
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc in self.live:
            self.live.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self.live):
            self.stop(proc, grace=5.0)


# Ports for the servers a benchmark starts come from below Linux's ephemeral
# range (32768-60999) and below the tests' blocks (tests/ports.py, 20000-31999):
# a port read from bind(0) and closed can be handed to any outgoing connection
# (wrk's own, a test run's) before the server binds it, and the "is it up?"
# probe is then answered by a stranger.
_PORTS_FIRST, _PORTS_COUNT = 19000, 1000
_next_port = _PORTS_FIRST + os.getpid() % _PORTS_COUNT


def free_port() -> int:
    """A loopback port nothing holds now, from a range no kernel hands out."""
    global _next_port
    for _ in range(_PORTS_COUNT):
        port, _next_port = _next_port, _PORTS_FIRST + (_next_port + 1 - _PORTS_FIRST) % _PORTS_COUNT
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # another benchmark, or a local service, holds it
            return port
    raise BenchmarkError(
        f"no free loopback port in {_PORTS_FIRST}-{_PORTS_FIRST + _PORTS_COUNT - 1}"
    )


def http_status(port: int, method: str, path: str, body: bytes | None = None) -> int | None:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            headers = {"content-type": "application/json"} if body is not None else {}
            conn.request(method, path, body=body, headers=headers)
            return conn.getresponse().status
        finally:
            conn.close()
    except OSError:
        return None


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine; steal counts as neither."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, _steal = fields
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait


def _process_ticks(pid: int, *, reaped: bool = False) -> int:
    """utime + stime of a process (all its threads), 0 if it is gone; with
    `reaped`, plus that of the children it has waited for."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return 0
    ticks = int(fields[11]) + int(fields[12])
    return ticks + int(fields[13]) + int(fields[14]) if reaped else ticks


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()
    except OSError:
        return None


def _tree_ticks(pid: int) -> tuple[int, int]:
    """(CPU ticks, processes) of `pid` and all its descendants: utime + stime of
    each, plus cutime + cstime (children it has reaped, so a worker process that
    ends in the window keeps its share). A server with worker processes
    (uvicorn --workers) is counted whole."""
    parents: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry.name)
        if fields is None:
            continue
        child = int(entry.name)
        parents.setdefault(int(fields[1]), []).append(child)
        ticks[child] = sum(int(x) for x in fields[11:15])
    # A gone process has no tree; and pid 0 (CpuMeter(0): no server, foreign
    # load only) is the kernel's, parent of every process on the machine.
    if pid not in ticks:
        return 0, 0
    total, count, todo = 0, 0, [pid]
    while todo:
        current = todo.pop()
        total += ticks.get(current, 0)
        count += 1
        todo.extend(parents.get(current, ()))
    return total, count


def _postgres_ticks() -> int:
    """CPU of PostgreSQL's processes, including backends that have exited:
    the postmaster reaps them, and their time stays in its children's count
    (a worker benchmark's connections end before the meter stops; without
    this their work would show as foreign load)."""
    total = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/comm") as comm:
                    if comm.read().strip() != "postgres":
                        continue
            except OSError:
                continue
            total += _process_ticks(int(entry.name), reaped=True)
    return total


def _own_ticks() -> float:
    """CPU of this script and of its reaped children (wrk), in ticks."""
    ours = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = ours.ru_utime + ours.ru_stime + children.ru_utime + children.ru_stime
    return seconds * CLOCK_TICKS


def machine_busy_pct(seconds: float = 1.0) -> float:
    busy0, total0 = _machine_ticks()
    time.sleep(seconds)
    busy1, total1 = _machine_ticks()
    return 100 * (busy1 - busy0) / max(1, total1 - total0)


def _dirty_kb() -> int | None:
    """The machine's dirty page cache, in KiB (/proc/meminfo), if known."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("Dirty:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def flush_writes() -> None:
    """Write the machine's dirty pages out now (sync(2)). After a prefill of
    gigabytes the kernel's writeback would otherwise go on during the
    measurement, as CPU that no process of the benchmark owns: the 10M-row
    cost curve's measurements met 10% "other" CPU that way (2026-12-07)."""
    dirty = _dirty_kb()
    started = time.monotonic()
    os.sync()
    if dirty is not None:
        seconds = time.monotonic() - started
        log(f"wrote out {dirty / 1024:,.0f} MiB of dirty pages in {seconds:.1f} s")


def wait_for_quiet(limit: float) -> None:
    """Wait up to `limit` seconds until the machine is nearly idle (another test
    suite running alongside would skew the figures)."""
    deadline = time.monotonic() + limit
    busy = machine_busy_pct()
    if busy < BUSY_WARNING_PCT:
        return
    log(f"machine busy ({busy:.0f}% CPU); waiting up to {limit:.0f} s for it to calm down")
    while time.monotonic() < deadline:
        busy = machine_busy_pct()
        if busy < BUSY_WARNING_PCT:
            return
    log(f"still {busy:.0f}% busy; measuring anyway")


@dataclass
class CpuUse:
    server_pct: float  # the server's process tree, % of one core
    other_pct: float  # processes that are not part of the benchmark, % of the machine
    server_cpu_s: float = 0.0  # the server's process tree, CPU seconds (user + system)
    server_processes: int = 1  # processes in that tree at the end (uvicorn workers + 1)
    postgres_cpu_s: float = 0.0  # PostgreSQL's processes (0 on the other targets)
    load_cpu_s: float = 0.0  # this script and its children: the load generator (wrk)
    idle_pct: float = 0.0  # the machine's idle time, % of all its CPUs
    # The wall-clock times the meter ran between (time.time()): the
    # measurement's window, for what the server logged meanwhile.
    since: float = 0.0
    until: float = 0.0


class CpuMeter:
    """Who used the CPU while wrk ran: the server, and anything foreign.

    Foreign load (another test suite, a build) on a 2-core machine moves the
    figures a lot; it is measured so that a disturbed run can be told apart.
    Ours are the server and its child processes, wrk and this script (reaped
    children), and PostgreSQL's processes (part of the system under test on the
    postgres target). `helpers`, this script's children that run through the
    measurement (receive.py's delay proxy), count with the load.
    """

    def __init__(self, server_pid: int, *, helpers: Sequence[int] = ()) -> None:
        self.pid = server_pid
        self.helpers = list(helpers)
        self.helper_ticks = sum(_tree_ticks(pid)[0] for pid in self.helpers)
        self.since = time.time()
        self.start = time.monotonic()
        self.machine = _machine_ticks()
        self.server = _tree_ticks(server_pid)[0]
        self.postgres = _postgres_ticks()
        self.own = _own_ticks()

    def stop(self) -> CpuUse:
        elapsed = time.monotonic() - self.start
        busy, total = _machine_ticks()
        server_ticks, processes = _tree_ticks(self.pid)
        server = server_ticks - self.server
        postgres = _postgres_ticks() - self.postgres
        own = _own_ticks() - self.own
        own += sum(_tree_ticks(pid)[0] for pid in self.helpers) - self.helper_ticks
        machine_busy, machine_total = busy - self.machine[0], max(1, total - self.machine[1])
        foreign = machine_busy - server - postgres - own
        return CpuUse(
            server_pct=round(100 * server / CLOCK_TICKS / elapsed, 1),
            other_pct=round(max(0.0, 100 * foreign / machine_total), 1),
            server_cpu_s=server / CLOCK_TICKS,
            server_processes=processes,
            postgres_cpu_s=postgres / CLOCK_TICKS,
            load_cpu_s=own / CLOCK_TICKS,
            idle_pct=round(100 - 100 * machine_busy / machine_total, 1),
            since=self.since,
            until=time.time(),
        )


#: Put first on each server's PYTHONPATH: its sitecustomize logs the server's
#: full garbage collections (see :meth:`Server.full_collections`).
COLLECTIONS_PROBE = Path(__file__).resolve().parent / "collections_probe"
COLLECTIONS_ENV = "ONCEONLY_BENCH_COLLECTIONS"


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    collections_path: Path | None = None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def full_collections(self, since: float, until: float) -> list[float]:
        """How long (ms) each full garbage collection held the server's
        processes, of those that ended between the wall-clock times `since`
        and `until`: each is a stall of its event loop."""
        if self.collections_path is None:
            return []
        return read_collections(self.collections_path, since, until)


def read_collections(path: Path, since: float, until: float) -> list[float]:
    """The pauses (ms) logged in `path` by collections_probe, between `since`
    and `until` (wall clock); none when the file does not exist."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    pauses = []
    for line in lines:
        ended, _pid, held_ms = line.split()
        if since <= float(ended) <= until:
            pauses.append(float(held_ms))
    return pauses


def describe_collections(pauses: Sequence[float]) -> str:
    """`pauses` in a few words, for a report line."""
    if not pauses:
        return "no full collection"
    noun = "collection" if len(pauses) == 1 else "collections"
    return f"{len(pauses)} full {noun}, longest {max(pauses):.1f} ms"


@contextmanager
def server(
    procs: Processes,
    name: str,
    argv: Sequence[str],
    *,
    port: int,
    env: dict[str, str],
    cwd: Path,
    ready: tuple[str, str, bytes | None],
    timeout: float = 30.0,
) -> Iterator[Server]:
    log_path = cwd / f"{name}.log"
    collections_path = cwd / f"{name}.collections"
    collections_path.unlink(missing_ok=True)
    env = {
        **env,
        COLLECTIONS_ENV: str(collections_path),
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(COLLECTIONS_PROBE), env.get("PYTHONPATH")])
        ),
    }
    with log_path.open("wb") as log_file:
        proc = procs.start(argv, env=env, cwd=cwd, stdout=log_file, stderr=subprocess.STDOUT)
    srv = Server(name, proc, port, log_path, collections_path)
    try:
        method, path, body = ready
        deadline = time.monotonic() + timeout
        while http_status(port, method, path, body) != 200:
            if proc.poll() is not None:
                raise BenchmarkError(
                    f"{name} server exited with {proc.returncode}:\n{srv.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise BenchmarkError(
                    f"{name} server not ready after {timeout} s:\n{srv.log_tail()}"
                )
            time.sleep(0.1)
        yield srv
    finally:
        procs.stop(proc)


# ---------------------------------------------------------------------------
# wrk


@dataclass
class WrkResult:
    """What every benchmark's Lua script reports; scripts add their own counters."""

    duration_s: float
    requests: int  # responses received
    non_2xx: int  # wrk counts statuses > 399; nothing here answers 1xx/3xx
    socket_errors: dict[str, int]
    latency_ms: dict[str, float]
    sent: int  # requests written (request() calls, less wrk's start-up parse check)

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s else 0.0

    @property
    def ok_2xx(self) -> int:
        return self.requests - self.non_2xx

    @property
    def in_flight(self) -> int:
        return self.sent - self.requests

    def figures(self) -> dict[str, Any]:
        """What every script's result row keeps of a measured run, by the
        row's field names: ``Row(**run.figures(), ...)``."""
        return {
            "requests": self.requests,
            "duration_s": round(self.duration_s, 3),
            "requests_per_s": round(self.rps, 1),
            "p50_ms": self.latency_ms["p50"],
            "p90_ms": self.latency_ms["p90"],
            "p99_ms": self.latency_ms["p99"],
            "max_ms": self.latency_ms["max"],
            "non_2xx": self.non_2xx,
            "socket_errors": sum(self.socket_errors.values()),
        }


def run_wrk(
    procs: Processes, argv: Sequence[str], *, duration: int, result_prefix: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run wrk and read the JSON line its Lua script prints after `result_prefix`:
    the WrkResult fields, and the script's per-thread counters."""
    proc = procs.start(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=duration + 120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise BenchmarkError("wrk did not finish in time") from None
    finally:
        procs.stop(proc)
    text = out.decode(errors="replace")
    line = next((ln for ln in text.splitlines() if ln.startswith(result_prefix)), None)
    if proc.returncode != 0 or line is None:
        raise BenchmarkError(
            f"wrk failed (exit {proc.returncode}):\n{text}\n{err.decode(errors='replace')}"
        )
    data: dict[str, Any] = json.loads(line[len(result_prefix) :])
    errors = data["errors"]
    per_thread: list[dict[str, Any]] = data["threads"]
    fields = {
        "duration_s": data["duration_us"] / 1e6,
        "requests": data["requests"],
        "non_2xx": errors["status"],
        "socket_errors": {k: errors[k] for k in ("connect", "read", "write", "timeout")},
        "latency_ms": {k: v / 1000 for k, v in data["latency_us"].items()},
        # wrk calls request() once before the run to check the script's request
        # parses (thread 1 only); that one is never sent.
        "sent": sum(int(t["calls"]) for t in per_thread) - 1,
    }
    return fields, per_thread


def per_request(cpu_s: float, requests: int) -> float | None:
    """CPU seconds spread over the requests answered, in microseconds."""
    return round(cpu_s * 1e6 / requests, 1) if requests else None


def foreign_load_warning(other_pct: float) -> str | None:
    if other_pct <= BUSY_WARNING_PCT:
        return None
    return (
        f"other processes used {other_pct:.0f}% of the machine's CPU during the "
        "measurement: figures unreliable, run again on a quiet machine"
    )


# ---------------------------------------------------------------------------
# A goal judged against a baseline measured twice

# A shared VM's speed can move between two runs a minute apart with nothing
# else busy, so the floor scripts measure their baseline before and after the
# target. Past this share apart, a ratio to the mean of the two runs is not
# trusted on its own.
MAX_BASELINE_DRIFT = 0.10


def baseline_drift(runs: Sequence[float]) -> float | None:
    """How far a baseline's runs differ, as a share of the faster; None when
    it ran once (or not at all, or at zero)."""
    if len(runs) < 2 or not max(runs):
        return None
    return round(1 - min(runs) / max(runs), 3)


def goal_against_baseline(
    rate: float, ratio: float, runs: Sequence[float], goal: float
) -> bool | None:
    """Whether ``rate`` (``ratio`` times the mean of the baseline's ``runs``)
    reaches ``goal`` times the baseline.

    With the runs within MAX_BASELINE_DRIFT of each other the mean's ratio
    decides. Further apart, the machine's speed moved: the goal is met only
    if met against the faster run, missed only if missed against the slower
    one, and otherwise None (unsteady: the runs disagree).
    """
    drift = baseline_drift(runs)
    if drift is None or drift <= MAX_BASELINE_DRIFT:
        return ratio >= goal
    if rate >= goal * max(runs):
        return True
    if rate < goal * min(runs):
        return False
    return None


# ---------------------------------------------------------------------------
# Databases


def pg_url_for(admin_url: str, database: str) -> str:
    return urlunsplit(urlsplit(admin_url)._replace(path=f"/{database}"))


def asyncpg_url(database_url: str) -> str:
    """asyncpg's URL for a SQLAlchemy one (``postgresql+asyncpg://``)."""
    return database_url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def execute_sql(url: str, statements: Sequence[str], *, connect_timeout: float = 60) -> None:
    """`statements` in turn on one connection to `url`; asyncpg's errors as they come."""
    import asyncpg

    conn = await asyncpg.connect(url, timeout=connect_timeout)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


async def recreate_database(admin_url: str, database: str, *, connect_timeout: float = 60) -> str:
    """Drop and create `database`; its URL. Errors are asyncpg's, for the
    benchmarks that run in an event loop; pg_recreate() is the synchronous one."""
    drop, create = (
        f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)',
        f'CREATE DATABASE "{database}"',
    )
    await execute_sql(admin_url, [drop, create], connect_timeout=connect_timeout)
    return pg_url_for(admin_url, database)


async def drop_database(admin_url: str, database: str, *, connect_timeout: float = 60) -> None:
    await execute_sql(
        admin_url,
        [f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'],
        connect_timeout=connect_timeout,
    )


def _admin(admin_url: str, work: Coroutine[Any, Any, _T]) -> _T:
    import asyncpg

    try:
        return asyncio.run(work)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        raise BenchmarkError(f"PostgreSQL at {admin_url}: {exc!r}") from exc


def pg_recreate(admin_url: str, database: str) -> str:
    return _admin(admin_url, recreate_database(admin_url, database, connect_timeout=5))


def pg_drop(admin_url: str, database: str) -> None:
    _admin(admin_url, drop_database(admin_url, database, connect_timeout=5))


async def pg_version(admin_url: str, option: str = "--targets") -> str:
    """The server's version; `option` is the one that leaves PostgreSQL out."""
    import asyncpg

    try:
        conn = await asyncpg.connect(admin_url, timeout=5)
        try:
            return str(await conn.fetchval("SHOW server_version"))
        finally:
            await conn.close()
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        raise BenchmarkError(
            f"PostgreSQL not reachable at {admin_url} ({exc!r}); start it, pass "
            f"--pg-admin-url, or leave postgres out of {option}"
        ) from exc


# ---------------------------------------------------------------------------
# Environment


def dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def wrk_version(wrk: str) -> str:
    first = subprocess.run([wrk, "-v"], capture_output=True, text=True, check=False).stdout
    return first.split("\n")[0].strip()


def onceonly_source() -> dict[str, str | None]:
    """Which onceonly the servers will import (PYTHONPATH can point elsewhere), and
    its git revision: the code under test may change between runs."""
    found = subprocess.run(
        [sys.executable, "-c", "import onceonly; print(onceonly.__file__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        raise BenchmarkError(f"cannot import onceonly:\n{found.stderr}")
    package = Path(found.stdout.strip()).parent
    try:
        git = subprocess.run(
            ["git", "-C", str(package), "describe", "--always", "--dirty", "--exclude", "*"],
            capture_output=True,
            text=True,
            check=False,
        )
        revision = git.stdout.strip() if git.returncode == 0 else None
    except OSError:  # no git
        revision = None
    return {"onceonly_path": str(package), "onceonly_git": revision}


# ---------------------------------------------------------------------------
# Command line and run


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default."""


def parser_for(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """A parser whose help is the script's docstring (`doc`)."""
    summary, _, rest = (doc or "").partition("\n\n")
    return argparse.ArgumentParser(
        prog=prog, description=summary, epilog=rest, formatter_class=HelpFormatter
    )


def add_pg_admin_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pg-admin-url",
        default=os.environ.get(
            "ONCEONLY_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
        ),
        help="PostgreSQL URL used to drop and create the benchmark database "
        "[env: ONCEONLY_BENCH_POSTGRES_URL]",
    )


def add_wait_quiet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait-quiet",
        type=int,
        default=60,
        metavar="SECONDS",
        help="before each target, wait up to this long for the machine to be nearly "
        f"idle (< {BUSY_WARNING_PCT:g}%% CPU); 0: do not wait",
    )


def add_run_options(parser: argparse.ArgumentParser, *, json_path: bool = False) -> None:
    """--keep-db, --keep-temp, --wrk, --json; with `json_path`, --json takes an
    optional PATH (args.json is then None, "-" for stdout, or the path)."""
    parser.add_argument("--keep-db", action="store_true", help="keep the PostgreSQL database")
    parser.add_argument("--keep-temp", action="store_true", help="keep the temporary directory")
    parser.add_argument("--wrk", default="wrk", help="the wrk binary")
    if json_path:
        parser.add_argument(
            "--json",
            nargs="?",
            const="-",
            metavar="PATH",
            help="also write the results as JSON to PATH; --json alone (or PATH -): "
            "print the JSON instead of the table",
        )
    else:
        parser.add_argument(
            "--json", action="store_true", help="print the results as JSON instead of a table"
        )


def check_common(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    # A list when the script measures several connection counts (receive.py).
    connections = args.connections
    if min(connections if isinstance(connections, list) else [connections]) < args.threads:
        parser.error("--connections must be >= --threads")
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", args.pg_database):
        parser.error("--pg-database must be a plain lower-case identifier")


def find_wrk(name: str) -> str | None:
    wrk = shutil.which(name)
    if wrk is None:
        log(f"error: {name} not found; install it (apt-get install -y wrk)")
    return wrk


def _raise_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def exit_on_signals() -> None:
    """SIGTERM and SIGHUP unwind like Ctrl-C does, through the clean-up."""
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)


class Workspace:
    """The children, temporary directory and PostgreSQL database of one
    invocation: everything to undo at exit."""

    def __init__(self, prefix: str, args: argparse.Namespace) -> None:
        self.procs = Processes()
        self.workdir = Path(tempfile.mkdtemp(prefix=prefix))
        self.pg_admin_url: str = args.pg_admin_url
        self.pg_database: str = args.pg_database
        self.keep_db: bool = args.keep_db
        self.keep_temp: bool = args.keep_temp
        self.created_db = False

    def recreate_db(self) -> str:
        self.created_db = True
        return pg_recreate(self.pg_admin_url, self.pg_database)

    def cleanup(self) -> None:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # let cleanup finish
        try:
            self.procs.stop_all()
            if self.created_db and not self.keep_db:
                try:
                    pg_drop(self.pg_admin_url, self.pg_database)
                except Exception as exc:
                    log(f"warning: could not drop {self.pg_database}: {exc!r}")
            if self.keep_temp:
                log(f"kept {self.workdir}")
            else:
                shutil.rmtree(self.workdir, ignore_errors=True)
        finally:
            signal.signal(signal.SIGINT, previous)
