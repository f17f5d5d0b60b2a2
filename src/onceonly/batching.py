"""Group commit: concurrent callers share one database transaction.

While one batch is being committed, the items that arrive queue up; when it
finishes, all of them go into the next batch together. Under load, N concurrent
callers cost about one round trip and one fsync instead of N, and a lone caller
still commits at once (after one turn of the event loop; nothing waits on a timer). Every caller's answer waits
for the commit of the batch that holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Generic, TypeVar

from ._exceptions import StoreError, StoreUnavailable

__all__ = ["GroupCommit", "ThreadGroupCommit"]

T = TypeVar("T")
R = TypeVar("R")


class GroupCommit(Generic[T, R]):
    """Batches concurrent calls to `flush`, which takes a batch and returns one
    result per item, in order, after its transaction committed."""

    def __init__(
        self,
        flush: Callable[[Sequence[T]], Awaitable[Sequence[R]]],
        *,
        max_batch: int = 1000,
        max_in_flight: int = 1,
    ) -> None:
        self.flush = flush
        self.max_batch = max_batch
        # More than one batch in flight pays off where the database commits
        # several transactions in parallel (PostgreSQL); SQLite has one writer.
        self.max_in_flight = max_in_flight
        self._queue: list[tuple[T, asyncio.Future[R]]] = []
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()  # strong references only
        #: Transactions committed and items carried, for tests and metrics.
        self.batches = 0
        self.items = 0

    async def submit(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._running < self.max_in_flight:
            # Counted here and uncounted in _run's finally, with no await in
            # between the empty-queue check and it: an item is never left
            # queued with no flusher coming.
            self._running += 1
            task = asyncio.create_task(self._run())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _run(self) -> None:
        try:
            # One turn of the event loop before the first batch: the requests
            # it has read meanwhile join this commit instead of waiting for the
            # next one (measured: docs/benchmarks.md, 11% more deliveries per
            # second on SQLite). A lone caller waits that one turn, no timer.
            await asyncio.sleep(0)
            while self._queue:
                batch = self._queue[: self.max_batch]
                del self._queue[: self.max_batch]
                try:
                    results = await self.flush([item for item, _ in batch])
                except asyncio.CancelledError:
                    # Shutting down mid-commit: we cannot know whether it landed,
                    # so the callers get "unavailable" and their clients retry.
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(StoreUnavailable("shutting down"))
                    raise
                except Exception as exc:
                    if _one_by_one(exc, batch):
                        await self._each_alone(batch)
                        continue
                    # The whole transaction failed: nothing in it was stored, so
                    # every caller in it gets the error.
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                self.batches += 1
                self.items += len(batch)
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():  # the caller may have gone away
                        future.set_result(result)
        finally:
            self._running -= 1

    async def _each_alone(self, batch: Sequence[tuple[T, asyncio.Future[R]]]) -> None:
        """The batch's items again, one transaction each: only the one the
        database refuses fails."""
        for n, (item, future) in enumerate(batch):
            try:
                (result,) = await self.flush([item])
            except asyncio.CancelledError:
                for _, waiting in batch[n:]:
                    if not waiting.done():
                        waiting.set_exception(StoreUnavailable("shutting down"))
                raise
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)
                continue
            self.batches += 1
            self.items += 1
            if not future.done():
                future.set_result(result)


class ThreadGroupCommit(Generic[T, R]):
    """Group commit for a store served by one thread (SQLite).

    As `GroupCommit`, but the store's thread takes the next batch itself the
    moment it has committed one, instead of waiting for the event loop to
    hand it over (under load the loop is busy, and that hand-over was half of
    every batch's time). `apply` runs on the store's thread; `schedule` runs a
    function there. The thread gives its turn back after `max_seconds` of
    back-to-back batches, so other work queued for it is not starved.
    """

    def __init__(
        self,
        apply: Callable[[Sequence[T]], Sequence[R]],
        schedule: Callable[[Callable[[], None]], Awaitable[None]],
        *,
        max_batch: int = 1000,
        max_seconds: float = 0.05,
    ) -> None:
        self.apply = apply
        self.schedule = schedule
        self.max_batch = max_batch
        self.max_seconds = max_seconds
        self._lock = threading.Lock()
        self._queue: list[tuple[T, asyncio.Future[R]]] = []
        self._draining = False
        self._tasks: set[asyncio.Future[None]] = set()  # strong references only
        #: Transactions committed and items carried, for tests and metrics.
        self.batches = 0
        self.items = 0

    async def submit(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._queue.append((item, future))
            start = not self._draining
            self._draining = True
        if start:
            self._start()
        return await future

    def _start(self) -> None:
        task = asyncio.ensure_future(self.schedule(self._drain))
        self._tasks.add(task)
        task.add_done_callback(self._drained)

    def _drained(self, task: asyncio.Future[None]) -> None:
        """On the loop, after a turn on the thread: fail what it could not take
        (the thread was unreachable) or hand it another turn."""
        self._tasks.discard(task)
        failure: BaseException | None = None
        if task.cancelled():
            failure = StoreUnavailable("shutting down")
        elif task.exception() is not None:
            failure = task.exception()
        with self._lock:
            stranded: list[tuple[T, asyncio.Future[R]]] = []
            if failure is not None:
                stranded, self._queue = self._queue, []
                self._draining = False
            restart = bool(self._queue) and not self._draining
            if restart:
                self._draining = True
        for _, future in stranded:
            if not future.done():
                future.set_exception(failure)  # type: ignore[arg-type]
        if restart:
            self._start()

    def _each_alone(self, batch: Sequence[tuple[T, asyncio.Future[R]]]) -> list[R | BaseException]:
        """On the store's thread: one transaction per item (see GroupCommit)."""
        answers: list[R | BaseException] = []
        for item, _ in batch:
            try:
                (result,) = self.apply([item])
            except Exception as exc:
                answers.append(exc)
                continue
            self.batches += 1
            self.items += 1
            answers.append(result)
        return answers

    def _drain(self) -> None:
        """On the store's thread: commit batch after batch while items wait."""
        deadline = time.monotonic() + self.max_seconds
        first = True
        try:
            while True:
                with self._lock:
                    # At least one batch per turn, or no progress would be made.
                    if not self._queue or (not first and time.monotonic() > deadline):
                        self._draining = False  # _drained() restarts if items wait
                        return
                    first = False
                    batch = self._queue[: self.max_batch]
                    del self._queue[: self.max_batch]
                results: Sequence[R | BaseException] | BaseException
                try:
                    results = self.apply([i for i, _ in batch])
                except Exception as exc:
                    # The whole transaction failed: nothing in it was stored.
                    results = self._each_alone(batch) if _one_by_one(exc, batch) else exc
                else:
                    self.batches += 1
                    self.items += len(batch)
                # Each answer goes back on its caller's loop (normally there is one).
                for loop, mine, answers in _by_loop(batch, results):
                    # RuntimeError: the loop is closed, nobody is waiting any more.
                    with contextlib.suppress(RuntimeError):
                        loop.call_soon_threadsafe(_settle, mine, answers)
        except BaseException:
            with self._lock:
                self._draining = False
            raise


def _by_loop(
    batch: Sequence[tuple[T, asyncio.Future[R]]],
    results: Sequence[R | BaseException] | BaseException,
) -> Iterator[
    tuple[
        asyncio.AbstractEventLoop,
        Sequence[tuple[T, asyncio.Future[R]]],
        Sequence[R | BaseException] | BaseException,
    ]
]:
    """The batch and its results split by the callers' event loops."""
    loops = {future.get_loop() for _, future in batch}
    if len(loops) == 1:  # the usual case: no need to split
        yield loops.pop(), batch, results
        return
    for loop in loops:
        mine = [entry for entry in batch if entry[1].get_loop() is loop]
        answers = (
            results
            if isinstance(results, BaseException)
            else [r for r, entry in zip(results, batch, strict=True) if entry[1].get_loop() is loop]
        )
        yield loop, mine, answers


def _settle(
    batch: Sequence[tuple[T, asyncio.Future[R]]],
    results: Sequence[R | BaseException] | BaseException,
) -> None:
    for i, (_, future) in enumerate(batch):
        if future.done():  # the caller went away
            continue
        answer = results if isinstance(results, BaseException) else results[i]
        if isinstance(answer, BaseException):
            future.set_exception(answer)
        else:
            future.set_result(answer)


def _one_by_one(failure: Exception, batch: Sequence[object]) -> bool:
    """Whether a failed batch is worth trying again item by item: the database
    refused something in it, and not because it is down (then every item
    would fail alike, and one transaction each would only add load). Without
    this, one delivery the database cannot store would fail every delivery
    that happened to share its commit."""
    return (
        len(batch) > 1
        and isinstance(failure, StoreError)
        and not isinstance(failure, StoreUnavailable)
    )
