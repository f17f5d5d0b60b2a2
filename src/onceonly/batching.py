"""Group commit: concurrent callers share one database transaction.

While one batch is being committed, the items that arrive queue up; when it
finishes, all of them go into the next batch together. Under load, N concurrent
callers cost about one round trip and one fsync instead of N, and a lone caller
still commits at once (after one turn of the event loop: nothing waits on a
timer). Every caller's answer waits for the commit of the batch that holds it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, Protocol, TypeVar

from ._exceptions import StoreError, StoreUnavailable

__all__ = ["GroupCommit", "Waiter"]

T = TypeVar("T")
R = TypeVar("R")
R_contra = TypeVar("R_contra", contravariant=True)


class Waiter(Protocol[R_contra]):
    """What a caller of :meth:`GroupCommit.add` waits with; an
    :class:`asyncio.Future` is one."""

    def done(self) -> bool: ...

    def set_result(self, result: R_contra, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


class GroupCommit(Generic[T, R]):
    """Batches concurrent calls to `flush`, which takes a batch and returns one
    result per item, in order, after its transaction committed."""

    def __init__(
        self,
        flush: Callable[[Sequence[T]], Awaitable[Sequence[R]]],
        *,
        max_batch: int = 1000,
        max_in_flight: int = 1,
        share: int | None = None,
    ) -> None:
        self.flush = flush
        self.max_batch = max_batch
        # More than one batch in flight pays off where the database commits
        # several transactions in parallel (PostgreSQL); SQLite has one writer.
        self.max_in_flight = max_in_flight
        if share is not None and not 1 <= share <= max_batch:
            raise ValueError("share must be between 1 and max_batch")
        #: With `share`, a batch takes `share` items, or its part of the queue
        #: (the queue over max_in_flight) when that is more, up to max_batch:
        #: a short queue goes out in several batches, so that the loop answers
        #: one while another commits, and a long one in few large batches,
        #: where small ones would hold the throughput to max_in_flight x share
        #: per round trip. Without it, a batch takes the queue up to max_batch.
        self.share = share
        self._queue: list[tuple[T, Waiter[R]]] = []
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()  # strong references only
        #: Transactions committed and items carried, for tests and metrics.
        self.batches = 0
        self.items = 0

    async def submit(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self.add(item, future)
        return await future

    def add(self, item: T, waiter: Waiter[R]) -> None:
        """:meth:`submit` for a caller that is not a coroutine: `waiter` is
        given `item`'s result (or the batch's error) once the batch holding
        it committed, from inside the group commit's task, so it must not
        raise (``onceonly serve``'s protocol answers from there, without a
        future and a callback per delivery). Call it on the event loop."""
        self._queue.append((item, waiter))
        if self._running < self.max_in_flight:
            # Counted here and uncounted in _run's finally, with no await in
            # between the empty-queue check and it: an item is never left
            # queued with no flusher coming.
            self._running += 1
            task = asyncio.create_task(self._run())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self) -> None:
        try:
            # One turn of the event loop before the first batch: the requests
            # it has read meanwhile join this commit instead of waiting for the
            # next one (measured: docs/benchmarks.md, 11% more deliveries per
            # second on SQLite). A lone caller waits that one turn, no timer.
            await asyncio.sleep(0)
            while self._queue:
                size = self._batch_size()
                batch = self._queue[:size]
                del self._queue[:size]
                try:
                    results = await self.flush([item for item, _ in batch])
                except asyncio.CancelledError:
                    # Shutting down mid-commit: we cannot know whether it landed,
                    # so the callers get "unavailable" and their clients retry.
                    for _, waiter in batch:
                        if not waiter.done():
                            waiter.set_exception(StoreUnavailable("shutting down"))
                    raise
                except Exception as exc:
                    if _one_by_one(exc, batch):
                        await self._each_alone(batch)
                        continue
                    # The whole transaction failed: nothing in it was stored, so
                    # every caller in it gets the error.
                    for _, waiter in batch:
                        if not waiter.done():
                            waiter.set_exception(exc)
                    continue
                self.batches += 1
                self.items += len(batch)
                for (_, waiter), result in zip(batch, results, strict=True):
                    if not waiter.done():  # the caller may have gone away
                        waiter.set_result(result)
        finally:
            self._running -= 1

    def _batch_size(self) -> int:
        if self.share is None:
            return self.max_batch
        return min(self.max_batch, max(self.share, len(self._queue) // self.max_in_flight))

    async def _each_alone(self, batch: Sequence[tuple[T, Waiter[R]]]) -> None:
        """The batch's items again, one transaction each: only the one the
        database refuses fails."""
        for n, (item, waiter) in enumerate(batch):
            try:
                (result,) = await self.flush([item])
            except asyncio.CancelledError:
                for _, waiting in batch[n:]:
                    if not waiting.done():
                        waiting.set_exception(StoreUnavailable("shutting down"))
                raise
            except Exception as exc:
                if not waiter.done():
                    waiter.set_exception(exc)
                continue
            self.batches += 1
            self.items += 1
            if not waiter.done():
                waiter.set_result(result)


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
