"""Run async code to completion from synchronous code, wherever it is called from."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["run_on_own_loop"]

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
