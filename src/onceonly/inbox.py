"""The inbox: verify a delivery, identify its event, and store it with group commit
(see :mod:`onceonly.batching`): no 2xx before the event is durable."""

from __future__ import annotations

from collections.abc import Mapping

from ._exceptions import PayloadError, StoreRejected, UnknownProvider
from .batching import GroupCommit
from .events import Delivery, NewEvent, Receipt
from .headers import ReadHeaders
from .providers import Provider
from .store import Store

__all__ = ["GroupCommit", "Inbox"]

#: Longest event id or type stored. Providers' ids are a few dozen characters
#: (Stripe's ``evt_`` ids, UUIDs, Mercado Pago's numbers); the bound keeps a
#: key well inside every index's row limit, whatever JSON type it came as.
MAX_TEXT = 255


def _check_text(value: str, what: str) -> None:
    """Refuse, before it reaches a batch, text no engine stores faithfully."""
    if not value:
        raise PayloadError(f"the {what} is empty")
    if len(value) > MAX_TEXT:
        raise PayloadError(f"the {what} is longer than {MAX_TEXT} characters")
    if "\x00" in value:
        raise PayloadError(f"the {what} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise PayloadError(f"the {what} is not valid Unicode (a lone surrogate)") from None


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

    async def admit(self, event: NewEvent) -> Receipt:
        """Store an event that did not come as a delivery (``onceonly
        reconcile``: read from the provider's authenticated API), through the
        same group commit and unique constraint as deliveries, so a copy
        already delivered (or admitted) comes back as a duplicate."""
        _check_text(event.event_id, "event id")
        if event.event_type is not None:
            _check_text(event.event_type, "event type")
        try:
            return await self.commits.submit(event)
        except StoreRejected as exc:
            raise PayloadError(f"the database cannot store this event: {exc}") from None

    async def receive(self, delivery: Delivery) -> Receipt:
        provider = self.provider(delivery.provider)
        headers = ReadHeaders(delivery.headers)
        delivery = Delivery(delivery.provider, delivery.body, headers, delivery.query)
        # Authenticate first: nothing from an unverified body is parsed or kept.
        provider.verify(delivery)
        info = provider.identify(delivery)
        _check_text(info.event_id, "event id")
        if info.event_type is not None:
            _check_text(info.event_type, "event type")
        event = NewEvent(
            provider=delivery.provider,
            event_id=info.event_id,
            event_type=info.event_type,
            body=delivery.body,
            headers=headers.kept(info.extra_headers),
        )
        try:
            return await self.commits.submit(event)
        except StoreRejected as exc:
            # Refused alone (see batching): this event only, never its neighbours.
            raise PayloadError(f"the database cannot store this event: {exc}") from None
