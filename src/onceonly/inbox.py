"""The inbox: verify a delivery, identify its event, and store it with group commit.

Group commit: while one transaction is being committed, the deliveries that
arrive queue up; when it finishes, all of them go into the next transaction
together. Under load, N concurrent deliveries cost about one round trip and
one fsync instead of N, and a lone delivery still commits at once (nothing
waits on a timer). Every delivery's answer waits for the commit of the batch
that holds it: no 2xx before the event is durable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from ._exceptions import StoreUnavailable, UnknownProvider
from .events import Delivery, NewEvent, Receipt
from .providers import Provider
from .store import Store

__all__ = ["GroupCommit", "Inbox"]


class GroupCommit:
    """Batches concurrent ``insert_events`` calls into shared transactions."""

    def __init__(self, store: Store, *, max_batch: int = 1000) -> None:
        self.store = store
        self.max_batch = max_batch
        self._queue: list[tuple[NewEvent, asyncio.Future[Receipt]]] = []
        self._flusher: asyncio.Task[None] | None = None
        #: Transactions committed and events carried, for tests and metrics.
        self.batches = 0
        self.events = 0

    async def submit(self, event: NewEvent) -> Receipt:
        future: asyncio.Future[Receipt] = asyncio.get_running_loop().create_future()
        self._queue.append((event, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        try:
            while self._queue:
                batch = self._queue[: self.max_batch]
                del self._queue[: self.max_batch]
                try:
                    receipts = await self.store.insert_events([event for event, _ in batch])
                except asyncio.CancelledError:
                    # Shutting down mid-commit: we cannot know whether it landed,
                    # so answer 503 and let the sender retry (a duplicate is safe).
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(StoreUnavailable("shutting down"))
                    raise
                except Exception as exc:
                    # The whole transaction failed: nothing in it was stored, so
                    # every delivery in it gets the error (and the sender retries).
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                self.batches += 1
                self.events += len(batch)
                for (_, future), receipt in zip(batch, receipts, strict=True):
                    if not future.done():  # the client may have gone away
                        future.set_result(receipt)
        finally:
            self._flusher = None


class Inbox:
    """Turns a :class:`Delivery` into a stored event, or a rejection.

    Raises the :class:`~onceonly.DeliveryRejected` family for deliveries to
    refuse (nothing stored) and :class:`~onceonly.StoreUnavailable` when the
    database cannot take the event now.
    """

    def __init__(self, store: Store, providers: Mapping[str, Provider]) -> None:
        self.store = store
        self.providers = dict(providers)
        self.commits = GroupCommit(store)

    def provider(self, name: str) -> Provider:
        try:
            return self.providers[name]
        except KeyError:
            raise UnknownProvider(f"no provider is configured under {name!r}") from None

    async def receive(self, delivery: Delivery) -> Receipt:
        provider = self.provider(delivery.provider)
        # Authenticate first: nothing from an unverified body is parsed or kept.
        provider.verify(delivery)
        info = provider.identify(delivery)
        return await self.commits.submit(
            NewEvent(
                provider=delivery.provider,
                event_id=info.event_id,
                event_type=info.event_type,
                body=delivery.body,
                headers=delivery.headers,
            )
        )
