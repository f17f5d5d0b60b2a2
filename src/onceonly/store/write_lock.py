"""SQLite's write lock, taken in turns: the receiver first, and never left idle.

SQLite has one write lock per database file, and ``BEGIN IMMEDIATE`` takes
it. A writer that finds it taken waits in SQLite's busy handler, which
sleeps and tries again: 1, 2, 5, 10 ms and so on, up to 100 ms between tries.
Two things go wrong under load. Workers end one transaction and begin the
next within microseconds, so a receiver can sleep through every gap and
answer 503 after ``busy_timeout``, while the gateway is the party that cannot
wait. And when the holder commits, the lock stays idle until some waiter
wakes, up to 100 ms: with a few workers, most of the time.

So onceonly takes the lock itself (:meth:`WriteLock.begin`): it tries
``BEGIN IMMEDIATE`` without SQLite's wait and, while the lock is taken,
tries again after at most 2 ms, up to ``busy_timeout`` in all. And a
receiver says it is waiting: it holds a shared ``flock`` on a file beside the
database (``<db>-priority``, created by the receiver) until its ``BEGIN``
returns. Before each try at the lock, workers check for that ``flock`` (one
non-blocking exclusive ``flock``) and, while a receiver waits, hold back, for
up to a second in all. The receiver then gets the lock as soon as the
transaction in progress ends, and a worker in the middle of a batch commits
at its next handler to let it in (the worker's transaction budget).

``flock`` locks belong to an open file, so each thread uses its own
descriptor, and the kernel drops them when a process dies: a receiver killed
while waiting leaves nothing behind. When the file cannot be opened (a
read-only directory, say), the priority is off and the retries alone decide.
Writers outside onceonly (the ``sqlite3`` shell, the user's scripts) still
meet onceonly's transactions through their own busy handler.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, MutableMapping

__all__ = ["WriteLock"]

log = logging.getLogger("onceonly.store")

# The longest a worker-side transaction holds back for waiting receivers: they
# get the lock when the transaction in progress ends, so a longer wait means a
# writer outside onceonly holds it, and then nobody should wait on us.
GIVE_WAY_SECONDS = 1.0
# Between two tries of BEGIN IMMEDIATE: from 0.25 ms, doubling, at most 2 ms.
_FIRST_PAUSE = 0.00025
_LONGEST_PAUSE = 0.002

# Marks, in a connection's info, that it holds its process's turn.
_TURN = "onceonly.write_turn"

_instances: dict[str, WriteLock] = {}
_instances_lock = threading.Lock()


def _is_busy(exc: BaseException) -> bool:
    """Whether `exc` (sqlite3's, or SQLAlchemy's wrapping it) says the lock is taken."""
    original = getattr(exc, "orig", exc)
    if not isinstance(original, sqlite3.OperationalError):
        return False
    code = getattr(original, "sqlite_errorcode", None)
    if code is not None:
        return bool(code & 0xFF == sqlite3.SQLITE_BUSY)
    return "locked" in str(original)


class WriteLock:
    """The write lock of one SQLite file, as onceonly's writers take it."""

    def __init__(self, priority_path: str | None) -> None:
        self.priority_path = priority_path
        self._local = threading.local()
        self._disabled = priority_path is None
        self._turn = threading.Lock()

    @classmethod
    def of(cls, database_path: str) -> WriteLock:
        """The write lock of the file at `database_path`, one per process and file."""
        in_memory = database_path in ("", ":memory:") or database_path.startswith("file::memory:")
        key = ":memory:" if in_memory else os.path.abspath(database_path)
        with _instances_lock:
            found = _instances.get(key)
            if found is None:
                found = _instances[key] = cls(None if in_memory else key + "-priority")
            return found

    def begin(
        self,
        execute: Callable[[str], object],
        *,
        timeout: float,
        receiver: bool,
        driver: Callable[[str], object] | None = None,
        turn: MutableMapping[str, object] | None = None,
    ) -> None:
        """``BEGIN IMMEDIATE`` with SQLite's own wait (``busy_timeout``,
        restored afterwards) turned off. Tries and pragmas go through `driver`
        (the driver connection's execute: a failed try costs little); the last
        try, past `timeout`, through `execute`, so that its error is the one
        the caller's layer raises (SQLAlchemy's, say).

        `receiver`: announce the wait, so that workers give way; otherwise
        give way, before every try, to receivers that wait (for up to
        GIVE_WAY_SECONDS in all). `turn` (a connection's ``info``): take this
        process's turn first, so that its threads wait for each other on a
        lock of their own instead of all trying SQLite's; :meth:`end` gives it
        back. Raises the last "database is locked" once `timeout` seconds have
        passed."""
        deadline = time.monotonic() + timeout
        # Threads of one process queue here rather than all polling (each try
        # takes the GIL from the thread whose handlers run).
        if turn is not None and self._turn.acquire(timeout=timeout):
            turn[_TURN] = True
        try:
            self._begin(execute, driver or execute, deadline, timeout, receiver=receiver)
        except BaseException:
            if turn is not None:
                self.end(turn)
            raise

    def prepare_receiver(self) -> None:
        """Create the priority file now, from a receiver's thread: a worker
        that finds it absent looks again only a second later, and a receiver
        whose first tries all succeed would otherwise create it only when it
        first waits."""
        self._fd(create=True)

    def try_begin(self, execute: Callable[[str], object], *, busy_timeout_ms: int) -> bool:
        """One ``BEGIN IMMEDIATE`` without SQLite's wait: True if it took the
        lock, False if another writer holds it (then nothing is begun).
        ``busy_timeout`` is `busy_timeout_ms` again afterwards."""
        execute("PRAGMA busy_timeout = 0")
        try:
            execute("BEGIN IMMEDIATE")
        except Exception as exc:
            if _is_busy(exc):
                return False
            raise
        finally:
            execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        return True

    def end(self, turn: MutableMapping[str, object]) -> None:
        """The transaction begun with this `turn` ended: the next thread's turn."""
        if turn.pop(_TURN, None):
            self._turn.release()

    def _begin(
        self,
        execute: Callable[[str], object],
        driver: Callable[[str], object],
        deadline: float,
        timeout: float,
        *,
        receiver: bool,
    ) -> None:
        with self._waiting() if receiver else contextlib.nullcontext():
            polite_until = time.monotonic() + GIVE_WAY_SECONDS
            driver("PRAGMA busy_timeout = 0")
            try:
                pause = _FIRST_PAUSE
                while time.monotonic() < deadline:
                    if receiver or time.monotonic() > polite_until or not self.receiver_waiting():
                        try:
                            driver("BEGIN IMMEDIATE")
                            return
                        except Exception as exc:
                            if not _is_busy(exc):
                                raise
                    time.sleep(pause)
                    pause = min(pause * 2, _LONGEST_PAUSE)
                execute("BEGIN IMMEDIATE")  # raises "database is locked", or gets it
            finally:
                driver(f"PRAGMA busy_timeout = {int(timeout * 1000)}")

    def _fd(self, *, create: bool) -> int | None:
        fd: int | None = getattr(self._local, "fd", None)
        if fd is None and not self._disabled and self.priority_path is not None:
            if not create and time.monotonic() < getattr(self._local, "absent_until", 0.0):
                return None
            flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
            try:
                fd = os.open(self.priority_path, flags, 0o666)
            except FileNotFoundError:
                # No receiver has waited on this file yet: look again in a
                # second rather than at every transaction.
                self._local.absent_until = time.monotonic() + 1.0
                return None
            except OSError as exc:
                log.warning("SQLite write priority off (%s: %s)", self.priority_path, exc)
                self._disabled = True
                return None
            self._local.fd = fd
        return fd

    @contextlib.contextmanager
    def _waiting(self) -> Iterator[None]:
        fd = self._fd(create=True)
        if fd is None:
            yield
            return
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def receiver_waiting(self) -> bool:
        """Whether a receiver waits for the lock now (one non-blocking ``flock``)."""
        fd = self._fd(create=False)
        if fd is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
