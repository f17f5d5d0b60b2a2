"""Run async code to completion from synchronous code, wherever it is called from."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ._exceptions import ConfigurationError

__all__ = ["LoopThread", "background_loop", "run_on_own_loop"]

T = TypeVar("T")


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
    callers (WSGI server threads) to run onceonly's coroutines on.

    A store's connections belong to the loop that opened them (asyncpg's
    pool does), so everything a WSGI process does with a store goes through
    one loop: :func:`background_loop`. Group commit then batches the claims
    and deliveries of all the server's threads together, as it batches
    concurrent requests on an ASGI server.
    """

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on the loop; block the calling thread until it is done."""
        if threading.current_thread() is self.thread:
            work.close()
            # Waiting on itself would never end.
            raise ConfigurationError(
                "synchronous onceonly code (a WSGI front end) called from its own loop"
            )
        return asyncio.run_coroutine_threadsafe(work, self.loop).result()


class _Background:
    loop: LoopThread | None = None
    lock = threading.Lock()


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
