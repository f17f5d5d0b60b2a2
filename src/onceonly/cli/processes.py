"""The processes of ``onceonly serve --workers N``, supervised by uvicorn.

uvicorn's supervisor binds the port, spawns the processes, replaces one that
dies and stops them all on SIGTERM. Two things it does not tell the operator
are added here:

- A process that fails before it serves (its app or start-up is broken, so a
  replacement would fail the same way) makes uvicorn stop the others, and the
  supervisor's ``run`` then returns as if all went well: a service manager
  would read exit status 0 and not restart it. :attr:`ServeProcesses.failed_to_start`
  says so, and ``serve`` exits with uvicorn's own start-up failure status.
- A process that dies while serving (killed by the OOM killer, a crash in a C
  extension) is replaced with one line at info level. Here it is also a
  warning that says how it ended.

uvicorn tells a failed start from a crash by the exit status
:data:`STARTUP_FAILURE` alone, so a process whose app cannot be built exits
with it (:func:`onceonly.cli.server.serve_process_app`).

And one thing uvicorn does not do at all: when the supervisor itself is
killed (SIGKILL, the OOM killer), its processes would go on serving, orphans
holding the port, so that a restarted ``serve`` could not bind it and the old
code would answer forever. Each process watches for that
(:func:`stop_with_supervisor`) and stops gracefully.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess

__all__ = ["STARTUP_FAILURE", "ServeProcesses", "how_it_ended", "stop_with_supervisor"]

log = logging.getLogger("onceonly.serve")

#: How often (seconds) a serve process checks that its supervisor is alive.
SUPERVISOR_CHECK_S = 1.0


def how_it_ended(exitcode: int | None) -> str:
    """A process's exit code in words: "exited with status 1", "was killed by SIGKILL"."""
    if exitcode is None:
        return "is still running"
    if exitcode < 0:  # multiprocessing's way of saying "ended by this signal"
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name}"
    return f"exited with status {exitcode}"


class ServeProcesses(Multiprocess):
    """uvicorn's supervisor of `config.workers` processes on `sockets`."""

    @property
    def failed_to_start(self) -> list[int]:
        """The pids of the processes that failed before serving, which made
        the supervisor stop (empty while all is well)."""
        failed = [p for p in self.processes if p.exitcode == STARTUP_FAILURE]
        return [p.pid for p in failed if p.pid is not None]

    def keep_subprocess_alive(self) -> None:
        # uvicorn's check replaces a dead process in place: what changed in
        # the list is what died. One that failed to start is left in it.
        before = list(self.processes)
        super().keep_subprocess_alive()
        for old, new in zip(before, self.processes, strict=True):
            if new is not old:
                log.warning(
                    "serve process %s %s; process %s replaces it",
                    old.pid,
                    how_it_ended(old.exitcode),
                    new.pid,
                )


def stop_with_supervisor(supervisor: int, *, every: float = SUPERVISOR_CHECK_S) -> None:
    """In a serve process: SIGTERM to this process (uvicorn's graceful stop:
    in-flight deliveries are answered) once `supervisor` is no longer its
    parent, which on Linux means it died and this process was handed to init.

    A daemon thread that wakes every `every` seconds.
    """

    def watch() -> None:
        while os.getppid() == supervisor:
            time.sleep(every)
        log.warning(
            "the supervising serve process %s is gone; serve process %s stops",
            supervisor,
            os.getpid(),
        )
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="onceonly-supervisor-watch", daemon=True).start()
