"""Real onceonly subprocesses for the acceptance tests, and reading their database.

``onceonly serve`` and ``onceonly worker`` run as the user runs them, with
``tests/acceptance`` (``payments_app`` and the like) importable; their output goes to log files
that a failing test prints.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from ports import free_port

ONCEONLY = [sys.executable, "-m", "onceonly.cli"]
#: Where the apps that subprocesses load (``--app payments_app:...``) live.
HERE = Path(__file__).resolve().parent / "acceptance"


def app_env(database_url: str, **extra: str) -> dict[str, str]:
    """The environment of an onceonly subprocess: our database, payments_app importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEONLY_")}
    path = [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]
    env.update(
        ONCEONLY_DATABASE_URL=database_url,
        PYTHONPATH=os.pathsep.join(path),
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


@dataclass
class Proc:
    """A subprocess whose output goes to a log file (a pipe nobody reads would fill up)."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, name: str, args: list[str], env: dict[str, str], cwd: Path) -> Proc:
        log = cwd / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [*ONCEONLY, *args], env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT
            )
        return cls(name, process, log)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        if self.alive():
            self.process.kill()
        self.process.wait(10)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait: a worker finishes what it holds and exits 0."""
        # A process still importing Python has no handler yet and would die of
        # the signal; that is not what this test is about, so wait for the
        # worker's start-up line first.
        deadline = time.monotonic() + timeout
        while (
            self.name.startswith("worker")
            and self.alive()
            and "onceonly worker:" not in self.output()
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise AssertionError(
                f"{self.name} did not stop within {timeout} s of SIGTERM:\n{self.output()[-3000:]}"
            ) from None


def start_gunicorn(
    procs: list[Proc], target: str, options: list[str], env: dict[str, str], cwd: Path
) -> tuple[str, Proc]:
    """gunicorn serving `target` (``module:app``) with `options`, on a free
    port; its URL (once it answers anything at ``/``) and its process. Stopped by
    :func:`stop_cleanly`, or killed with the other processes."""
    port = free_port()
    args = [sys.executable, "-m", "gunicorn", *options, "--bind", f"127.0.0.1:{port}", target]
    log = cwd / "gunicorn.log"
    with log.open("wb") as out:
        process = subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    proc = Proc("gunicorn", process, log)
    procs.append(proc)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"{url}/", timeout=1)
            return url, proc
        except httpx.TransportError:
            if not proc.alive() or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"gunicorn did not start:\n{proc.output()[-5000:]}") from None
            time.sleep(0.05)


def stop_cleanly(proc: Proc) -> None:
    """SIGTERM `proc`, and fail if it logged a traceback on its way."""
    proc.stop()
    output = proc.output()
    assert "Traceback" not in output, output


def start_worker(
    procs: list[Proc], name: str, app: str, env: dict[str, str], cwd: Path, concurrency: int = 2
) -> Proc:
    args = ["worker", "--app", f"payments_app:{app}", "--concurrency", str(concurrency)]
    proc = Proc.start(name, [*args, "--log-level", "warning"], env, cwd)
    procs.append(proc)
    return proc


def start_server(procs: list[Proc], app: str, env: dict[str, str], cwd: Path) -> str:
    port = free_port()
    args = ["serve", "--app", f"payments_app:{app}", "--port", str(port), "--log-level", "warning"]
    proc = Proc.start("serve", args, env, cwd)
    procs.append(proc)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return url
        except httpx.TransportError:
            pass
        if not proc.alive() or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"onceonly serve did not come up:\n{proc.output()[-5000:]}")
        time.sleep(0.1)


# The database, as the tests see it.


def rows(engine: sa.Engine, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(sa.text(sql), params)]


def scalar(engine: sa.Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar_one()


def statuses(engine: sa.Engine) -> dict[str, int]:
    found = rows(engine, "SELECT status, count(*) FROM onceonly_events GROUP BY status")
    return {str(status): int(n) for status, n in found}


def wait_for(
    what: str,
    check: Callable[[], bool],
    timeout: float,
    watch: list[Proc] | None = None,
    interval: float = 0.1,
) -> float:
    """Poll `check` until true; return the seconds it took. Fail with the logs of `watch`."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            logs = "\n".join(f"--- {p.name}:\n{p.output()[-2000:]}" for p in watch or [])
            raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{logs}")
        time.sleep(interval)
    return time.monotonic() - started
