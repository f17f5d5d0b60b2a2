"""Logs the garbage collector's full passes of a benchmark's server process.

benchmarks/_harness.py puts this directory first on a server's PYTHONPATH
and names a file in ONCEONLY_BENCH_COLLECTIONS; Python imports this module
at start-up (``site``), before the server's own code. Each full
(generation 2) collection appends one line: the wall-clock time it ended,
the process id and how long it held the interpreter, in milliseconds.
Nothing happens without the variable. A full pass holds the event loop for
its whole length, so it is a stall every request in flight waits through.
"""

from __future__ import annotations

import os

_LOG = os.environ.get("ONCEONLY_BENCH_COLLECTIONS")

if _LOG:
    import gc
    import time
    from typing import Any

    _started = [0.0]
    _path: str = _LOG

    def _timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            _started[0] = time.perf_counter()
        elif info["generation"] == 2:
            held_ms = (time.perf_counter() - _started[0]) * 1e3
            # One short line per write, in append mode: the processes of a
            # server started with --workers share the file.
            with open(_path, "a") as log:
                log.write(f"{time.time():.6f} {os.getpid()} {held_ms:.3f}\n")

    gc.callbacks.append(_timed)
