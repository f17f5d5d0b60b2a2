"""Run async code to completion from synchronous code, wherever it is called from."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from ._exceptions import ConfigurationError

__all__ = ["LoopThread", "background_loop", "run_on_own_loop"]

T = TypeVar("T")

log = logging.getLogger("onceonly")

# How long closing at exit may take: a store's close, at most.
_CLOSE_TIMEOUT = 10.0


def run_on_own_loop(work: Callable[[], Coroutine[Any, Any, T]], *, name: str) -> T:
    """Run ``work()`` on a short-lived thread with its own event loop.

    ``asyncio.run`` refuses to start inside a running loop, and synchronous
    entry points (``migrate_blocking``, ``purge``) are called from CLI code,
    from worker threads and from inside async applications alike.
    """
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(asyncio.run(work()))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


class LoopThread:
    """An event loop running forever on a daemon thread, for synchronous
    callers (WSGI server threads, Django's sync views) to run onceonly's
    coroutines on.

    A store's connections belong to the loop that opened them (asyncpg's
    pool does), so everything a process does with a store from synchronous
    code goes through one loop: :func:`background_loop`. Group commit then
    batches the claims and deliveries of all the server's threads together,
    as it batches concurrent requests on an ASGI server. Coroutines
    registered with :meth:`on_close` (closing a store) run on it at exit.
    """

    def __init__(self, name: str = "onceonly-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        self._closers: list[Callable[[], Awaitable[None]]] = []
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def submit(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `work` on the loop; its future, for a caller on another loop
        (``await asyncio.wrap_future(...)``)."""
        return asyncio.run_coroutine_threadsafe(work, self.loop)

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on the loop; block the calling thread until it is done."""
        if threading.current_thread() is self.thread:
            work.close()
            # Waiting on itself would never end.
            raise ConfigurationError(
                "synchronous onceonly code (a WSGI front end) called from its own loop"
            )
        return self.submit(work).result()

    def on_close(self, close: Callable[[], Awaitable[None]]) -> None:
        """Run `close()` on the loop when this thread is closed (at exit)."""
        self._closers.append(close)

    def close(self) -> None:
        """Run the registered closers, then stop the loop and its thread."""
        if not self.thread.is_alive():
            return

        async def closing() -> None:
            for close in reversed(self._closers):
                try:
                    await close()
                except Exception:  # the others must still close
                    log.exception("closing onceonly's background loop at exit failed")
            self._closers.clear()

        try:
            self.submit(closing()).result(_CLOSE_TIMEOUT)
        except (concurrent.futures.TimeoutError, RuntimeError):
            log.warning("onceonly's background loop did not close within %.0f s", _CLOSE_TIMEOUT)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(_CLOSE_TIMEOUT)
        if not self.thread.is_alive():
            self.loop.close()


class _Background:
    loop: LoopThread | None = None
    lock = threading.Lock()

    @classmethod
    def close(cls) -> None:
        current = cls.loop
        # A forked child must not close its parent's thread (it has none).
        if current is not None and current.pid == os.getpid():
            cls.loop = None
            current.close()

    @classmethod
    def forget_after_fork(cls) -> None:
        # The lock may have been held by another thread at the fork.
        cls.lock = threading.Lock()
        cls.loop = None


def background_loop() -> LoopThread:
    """The process's loop for synchronous callers, started on first use.

    A fork (gunicorn's workers, when the app is loaded before forking) keeps
    the parent's loop object but not its thread: a child starts its own.
    """
    loop = _Background.loop
    if loop is not None and loop.pid == os.getpid():
        return loop
    with _Background.lock:
        loop = _Background.loop
        if loop is None or loop.pid != os.getpid():
            loop = _Background.loop = LoopThread("onceonly-loop")
        return loop


atexit.register(_Background.close)
os.register_at_fork(after_in_child=_Background.forget_after_fork)
