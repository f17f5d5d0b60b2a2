"""The inbox for synchronous callers: one background event loop per process.

The inbox is asynchronous (its store's connections and its group commit live
on one event loop). A WSGI view runs on a server thread with no loop, and a
loop per request would give every request a store of its own and no shared
commit. So every synchronous caller of a process hands its coroutine to one
long-lived loop on a daemon thread: concurrent requests on different threads
meet in the same group commit, as they do under ``onceonly serve``.

The thread is started on first use, and again in a child process after a
fork (gunicorn ``--preload`` forks after the application was imported: the
parent's thread does not exist in the child). At interpreter exit the
coroutines registered with :meth:`InboxThread.on_close` (closing the store)
run on it, then it stops.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ClassVar, TypeVar

__all__ = ["InboxThread"]

log = logging.getLogger("onceonly.receiver")

T = TypeVar("T")

# How long closing at exit may take: the store's close, at most.
_CLOSE_TIMEOUT = 10.0


class InboxThread:
    """An event loop on a daemon thread, shared by a process's synchronous callers."""

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _shared: ClassVar[InboxThread | None] = None

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self._closers: list[Callable[[], Awaitable[None]]] = []
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="onceonly-inbox", daemon=True
        )
        self._thread.start()

    @classmethod
    def shared(cls) -> InboxThread:
        """This process's loop thread, started on first use (and in a forked child)."""
        current = cls._shared
        if current is not None and current.pid == os.getpid():
            return current
        with cls._lock:
            current = cls._shared
            if current is None or current.pid != os.getpid():
                current = cls._shared = InboxThread()
            return current

    def submit(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `work` on the loop; its future, for a caller on another loop
        (``await asyncio.wrap_future(...)``)."""
        return asyncio.run_coroutine_threadsafe(work, self.loop)

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on the loop and wait for its result (or its exception)."""
        if threading.current_thread() is self._thread:
            work.close()
            raise RuntimeError("InboxThread.run() called from its own loop: it would wait forever")
        return self.submit(work).result()

    def on_close(self, close: Callable[[], Awaitable[None]]) -> None:
        """Run `close()` on the loop when this thread is closed (at exit)."""
        self._closers.append(close)

    def close(self) -> None:
        """Run the registered closers, then stop the loop and its thread."""
        if not self._thread.is_alive():
            return

        async def closing() -> None:
            for close in reversed(self._closers):
                try:
                    await close()
                except Exception:  # the others must still close
                    log.exception("closing the inbox at exit failed")
            self._closers.clear()

        try:
            self.submit(closing()).result(_CLOSE_TIMEOUT)
        except (concurrent.futures.TimeoutError, RuntimeError):
            log.warning("the inbox did not close within %.0f s", _CLOSE_TIMEOUT)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(_CLOSE_TIMEOUT)
        if not self._thread.is_alive():
            self.loop.close()

    @classmethod
    def _close_shared(cls) -> None:
        current = cls._shared
        # A forked child must not close its parent's thread (it has none).
        if current is not None and current.pid == os.getpid():
            cls._shared = None
            current.close()

    @classmethod
    def _forget_after_fork(cls) -> None:
        # The lock may have been held by another thread at the fork.
        cls._lock = threading.Lock()
        cls._shared = None


atexit.register(InboxThread._close_shared)
os.register_at_fork(after_in_child=InboxThread._forget_after_fork)
