"""The inbox: verify a delivery, identify its event, and store it with group commit
(see :mod:`onceonly.batching`): no 2xx before the event is durable."""

from __future__ import annotations

from collections.abc import Mapping

from ._exceptions import UnknownProvider
from .batching import GroupCommit
from .events import Delivery, NewEvent, Receipt
from .providers import Provider
from .store import Store

__all__ = ["GroupCommit", "Inbox"]


class Inbox:
    """Turns a :class:`Delivery` into a stored event, or a rejection.

    Raises the :class:`~onceonly.DeliveryRejected` family for deliveries to
    refuse (nothing stored) and :class:`~onceonly.StoreUnavailable` when the
    database cannot take the event now.
    """

    def __init__(self, store: Store, providers: Mapping[str, Provider]) -> None:
        self.store = store
        self.providers = dict(providers)
        self.commits: GroupCommit[NewEvent, Receipt] = GroupCommit(
            store.insert_events, max_in_flight=store.commit_concurrency
        )

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
                headers=(
                    {**delivery.headers, **info.extra_headers}
                    if info.extra_headers
                    else delivery.headers
                ),
            )
        )
