"""Time limits for many concurrent requests, kept by one timer per event loop.

``asyncio.timeout`` schedules a timer for every use and cancels it on the way
out: about 5 to 8 µs of the event loop per request (measured on the receive
path, where every delivery bounds the time its body may take). Here a limit is
an entry in a dict, and one timer per loop sweeps the entries every
:data:`RESOLUTION` seconds while there are any, cancelling the tasks whose
time is up. So a limit fires between its time and that time plus the
resolution; in exchange, a request pays a dict insert and a delete.

As with ``asyncio.timeout``, the block ends with :class:`TimeoutError` when
its time ran out, and a cancellation from elsewhere (the client went away,
the server stops) goes through untouched.
"""

from __future__ import annotations

import asyncio
import weakref
from types import TracebackType

__all__ = ["RESOLUTION", "Deadlines"]

#: How often the entries are swept, in seconds: how late a limit may fire.
RESOLUTION = 0.1


class _Sweep:
    """The entries of one event loop and its timer."""

    __slots__ = ("due", "expired", "loop", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.due: dict[asyncio.Task[object], float] = {}
        self.expired: set[asyncio.Task[object]] = set()
        self.timer: asyncio.TimerHandle | None = None

    def add(self, task: asyncio.Task[object], seconds: float) -> None:
        self.due[task] = self.loop.time() + seconds
        if self.timer is None:
            self.timer = self.loop.call_later(RESOLUTION, self.run)

    def run(self) -> None:
        now = self.loop.time()
        late = [task for task, due in self.due.items() if due <= now]
        for task in late:
            del self.due[task]
            self.expired.add(task)
            task.cancel("deadline")
        # No entries, no timer: an idle loop is not woken ten times a second.
        self.timer = self.loop.call_later(RESOLUTION, self.run) if self.due else None


class Deadlines:
    """Limits on how long a block may take, for the tasks of any event loop."""

    def __init__(self) -> None:
        self._sweeps: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Sweep] = (
            weakref.WeakKeyDictionary()
        )
        # The loop of the last call: nearly always the one of the next.
        self._last: _Sweep | None = None

    def limit(self, seconds: float) -> _Limit:
        """``with deadlines.limit(5): await ...``: :class:`TimeoutError` after
        `seconds` (at most :data:`RESOLUTION` later). Use it inside a task."""
        return _Limit(self, seconds)

    def _sweep(self) -> _Sweep:
        loop = asyncio.get_running_loop()
        sweep = self._last
        if sweep is None or sweep.loop is not loop:
            sweep = self._sweeps.get(loop)
            if sweep is None:
                sweep = self._sweeps[loop] = _Sweep(loop)
            self._last = sweep
        return sweep


class _Limit:
    __slots__ = ("_cancelling", "_deadlines", "_seconds", "_sweep", "_task")

    def __init__(self, deadlines: Deadlines, seconds: float) -> None:
        self._deadlines = deadlines
        self._seconds = seconds

    def __enter__(self) -> None:
        sweep = self._sweep = self._deadlines._sweep()
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline is kept for a task; there is none running")
        self._task = task
        # Cancellations asked before the block are not ours to turn into a timeout.
        self._cancelling = task.cancelling()
        sweep.add(task, self._seconds)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        sweep, task = self._sweep, self._task
        sweep.due.pop(task, None)
        if task in sweep.expired:
            sweep.expired.discard(task)
            # Ours, and no other cancellation asked meanwhile: a timeout.
            if task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc
