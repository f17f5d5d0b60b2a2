"""``onceonly serve --workers 2`` on PostgreSQL: two processes share the port.

What the operator notices, seen from outside: deliveries sent at once over
many connections are each stored once, more than one process answers them, a
process that dies is replaced, and SIGTERM to the one process they started
stops them all and exits 0; a process that cannot start stops them all with a
failure status, which a service manager sees. Which process holds which
connection is read from ``/proc`` (sockets are inodes there), so the server
exposes nothing for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from onceonly.cli.server import PROCESS_SPEC_ENV
from onceonly.db import create_engine
from ports import free_port
from processes import scalar, wait_for
from support import ONCEONLY, STRIPE_SECRET, Server, stripe_delivery

LISTEN, ESTABLISHED = "0A", "01"
CLIENTS = 8
EVENTS_PER_CLIENT = 15


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


def sockets_of(pid: int) -> set[int]:
    inodes: set[int] = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def tcp_sockets(port: int, state: str) -> set[int]:
    """Inodes of the TCP sockets whose local port is `port`, in `state`."""
    inodes: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == state:
                inodes.add(int(fields[9]))
    return inodes


def serving(server: Server) -> set[int]:
    """The parent's children that hold the listening socket (not, say,
    multiprocessing's resource tracker)."""
    listening = tcp_sockets(server.port, LISTEN)
    return {pid for pid in children(server.process.pid) if sockets_of(pid) & listening}


def answering(server: Server, pids: set[int]) -> set[int]:
    """Those of `pids` holding an open connection from a client."""
    established = tcp_sockets(server.port, ESTABLISHED)
    return {pid for pid in pids if sockets_of(pid) & established}


def deliver_round(server: Server, round_no: int) -> tuple[set[str], set[int]]:
    """Every event of the round sent twice, by two clients at once; the event
    ids, and the processes that held the clients' connections."""
    ids = [[f"evt_r{round_no}_c{c}_{i}" for i in range(EVENTS_PER_CLIENT)] for c in range(CLIENTS)]
    clients = [httpx.Client(base_url=server.url, timeout=30) for _ in range(CLIENTS)]

    def send(c: int) -> list[int]:
        codes = []
        for event_id in [*ids[c], *ids[(c + 1) % CLIENTS]]:
            body, headers = stripe_delivery(event_id)
            codes.append(clients[c].post("/webhooks/stripe", content=body, headers=headers))
        return [r.status_code for r in codes]

    try:
        with ThreadPoolExecutor(CLIENTS) as pool:
            codes = [code for result in pool.map(send, range(CLIENTS)) for code in result]
        # The clients keep their connections open (keep-alive): read who holds them.
        holders = answering(server, serving(server))
    finally:
        for client in clients:
            client.close()
    assert codes == [200] * (2 * CLIENTS * EVENTS_PER_CLIENT)
    return {event_id for batch in ids for event_id in batch}, holders


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_two_processes_store_each_delivery_once_and_stop_together(
    database_url: str, tmp_path: Path
) -> None:
    env = {**os.environ, "ONCEONLY_DATABASE_URL": database_url}
    env["ONCEONLY_STRIPE_SECRET"] = STRIPE_SECRET
    server = Server(env, tmp_path, "--workers", "2")
    try:
        wait_for("two serving processes", lambda: len(serving(server)) == 2, 20)
        first = serving(server)

        sent: set[str] = set()
        answered: set[int] = set()
        # The kernel hands each new connection to whichever process accepts
        # first; a round or two spreads eight of them over both.
        for round_no in range(5):
            ids, holders = deliver_round(server, round_no)
            sent |= ids
            answered |= holders
            if len(answered) > 1:
                break
        assert answered == first, f"only {answered} of {first} answered"

        engine = create_engine(database_url)
        try:
            stored = scalar(engine, "SELECT count(*) FROM onceonly_events")
            distinct = scalar(engine, "SELECT count(DISTINCT event_id) FROM onceonly_events")
        finally:
            engine.dispose()
        assert stored == distinct == len(sent)

        # A process that dies is replaced; the port keeps answering meanwhile.
        victim = min(first)
        os.kill(victim, signal.SIGKILL)

        def replaced() -> bool:
            # One snapshot: two would let the first see the victim not yet
            # dead (two processes) and the second see it gone (not in it),
            # with no replacement at all.
            now = serving(server)
            return len(now) == 2 and victim not in now

        wait_for("a replacement process", replaced, 30)
        body, headers = stripe_delivery("evt_after_restart")
        assert httpx.post(f"{server.url}/webhooks/stripe", content=body, headers=headers).is_success
        everyone = children(server.process.pid)
    except BaseException:
        kill_all(server, children(server.process.pid))
        raise

    started = time.monotonic()
    try:
        output = server.stop()
        assert server.process.returncode == 0, output
        assert time.monotonic() - started < 15, output
        assert f"serve process {victim} was killed by SIGKILL; process" in output, output
        assert "Traceback" not in output, output
        wait_for("its processes to be gone", lambda: not children_left(everyone), 5)
    finally:
        kill_all(server, children_left(everyone))


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_processes_stop_when_their_supervisor_is_killed(database_url: str, tmp_path: Path) -> None:
    # SIGKILL (the OOM killer, say) gives the supervisor no chance to stop its
    # processes: they must notice and stop, or they serve on, orphans holding
    # the port a restarted serve needs.
    env = {**os.environ, "ONCEONLY_DATABASE_URL": database_url}
    env["ONCEONLY_STRIPE_SECRET"] = STRIPE_SECRET
    server = Server(env, tmp_path, "--workers", "2")
    processes: set[int] = set()
    try:
        wait_for("two serving processes", lambda: len(serving(server)) == 2, 20)
        processes = serving(server)
        server.process.kill()
        server.process.wait(10)
        wait_for("the orphaned processes to stop", lambda: not children_left(processes), 15)
        # Their output ends when the last of them is gone.
        output = server.stop()
        for pid in processes:
            assert f"serve process {pid} stops" in output, output
        assert "Traceback" not in output, output
        # The port is free again for the next serve.
        with socket.create_server(("127.0.0.1", server.port)):
            pass
    finally:
        kill_all(server, children_left(processes))


def kill_all(server: Server, pids: set[int]) -> None:
    """After a failure: no process is left holding the port (SIGKILL to the
    supervisor alone would leave its children running for a second or so)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if server.process.poll() is None:
        print(server.stop(signal.SIGKILL))


def children_left(pids: set[int]) -> set[int]:
    return {pid for pid in pids if Path(f"/proc/{pid}").exists()}


#: Apps that load in the supervising process and fail in the processes it
#: spawns (as an app would that reads a file or a secret only they can reach),
#: and the error each one logs there.
FAILS_IN_PROCESSES = {
    "building the app": (
        "import os\n"
        "from onceonly import Onceonly\n"
        f"if {PROCESS_SPEC_ENV!r} in os.environ:\n"
        "    raise RuntimeError('the signing secret file is not readable here')\n"
        "app = Onceonly(database_url=os.environ['TEST_DATABASE_URL'])\n",
        "the signing secret file is not readable here",
    ),
    # A bug in start-up code (a migration, say) rather than a database that
    # is down, which the server rides out with 503s.
    # (Each app names its database: serve's --database-url, or its variable,
    # would build a new store, without this patch.)
    "starting up": (
        "import os\n"
        "from onceonly import Onceonly\n"
        "app = Onceonly(database_url=os.environ['TEST_DATABASE_URL'])\n"
        f"if {PROCESS_SPEC_ENV!r} in os.environ:\n"
        "    async def broken_open():\n"
        "        raise RuntimeError('migration 7 cannot read its own table')\n"
        "    app.store.open = broken_open\n",
        "migration 7 cannot read its own table",
    ),
}


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
@pytest.mark.parametrize("failing", sorted(FAILS_IN_PROCESSES))
def test_a_process_that_cannot_start_stops_serve_with_a_failure_status(
    database_url: str, tmp_path: Path, failing: str
) -> None:
    source, error = FAILS_IN_PROCESSES[failing]
    (tmp_path / "startup_app.py").write_text(source)
    env = {**os.environ, "TEST_DATABASE_URL": database_url}
    env.pop("ONCEONLY_DATABASE_URL", None)
    env["ONCEONLY_STRIPE_SECRET"] = STRIPE_SECRET
    started = time.monotonic()
    args = ["serve", "--app", "startup_app:app", "--workers", "2", "--port", str(free_port())]
    done = subprocess.run(
        [*ONCEONLY, *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 3, output
    assert error in output
    assert "of 2 serve processes failed to start" in output
    assert "so serve stopped them all" in output
    # Stopped at the first failure: no replacement was started.
    assert "replaces it" not in output, output
    assert time.monotonic() - started < 30, output
