"""The inbox: verify a delivery, identify its event, and store it with group commit
(see :mod:`onceonly.batching`): no 2xx before the event is durable."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ._exceptions import PayloadError, StoreRejected, UnknownProvider, UnknownTenant
from .batching import GroupCommit
from .events import Delivery, NewEvent, Receipt
from .headers import ReadHeaders
from .providers import Provider
from .store import Store

if TYPE_CHECKING:
    from .tenants import Tenants

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


def _optional_text(value: str | None) -> str | None:
    """An auxiliary field (the object id) that no engine would store faithfully
    is left out rather than refusing the event it came with: the event is
    signed and identified, and the field is only a hint for search and order."""
    if value is None:
        return None
    try:
        _check_text(value, "object id")
    except PayloadError:
        return None
    return value


class Inbox:
    """Turns a :class:`Delivery` into a stored event, or a rejection.

    Raises the :class:`~onceonly.DeliveryRejected` family for deliveries to
    refuse (nothing stored) and :class:`~onceonly.StoreUnavailable` when the
    database cannot take the event now.
    """

    def __init__(
        self, store: Store, providers: Mapping[str, Provider], tenants: Tenants | None = None
    ) -> None:
        self.store = store
        self.providers = dict(providers)
        #: Where ``/{provider}/{tenant}`` deliveries find their secrets (None: no tenants).
        self.tenants = tenants
        self.commits: GroupCommit[NewEvent, Receipt] = GroupCommit(
            store.insert_events, max_in_flight=store.commit_concurrency
        )

    def provider(self, name: str) -> Provider:
        try:
            return self.providers[name]
        except KeyError:
            raise UnknownProvider(f"no provider is configured under {name!r}") from None

    async def verifier(self, name: str, tenant: str = "") -> Provider:
        """The provider that verifies deliveries to route `name` for `tenant`:
        the route's own, or for a tenant a copy holding only that tenant's
        secrets, so one merchant's secret never verifies another's delivery.

        Raises :class:`~onceonly.UnknownProvider`, :class:`~onceonly.UnknownTenant`
        (404s) and :class:`~onceonly.TenantUnavailable` (the resolver failed).
        """
        provider = self.provider(name)
        if not tenant:
            if provider.tenants_only:
                raise UnknownTenant(
                    f"provider {name!r} takes deliveries only at /{name}/{{tenant}}"
                )
            return provider
        if self.tenants is None:
            raise UnknownTenant("this deployment has no tenants")
        return await self.tenants.verifier(name, tenant, provider)

    async def receive(self, delivery: Delivery) -> Receipt:
        provider = await self.verifier(delivery.provider, delivery.tenant)
        headers = ReadHeaders(delivery.headers)
        delivery = Delivery(
            delivery.provider, delivery.body, headers, delivery.query, delivery.tenant
        )
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
            tenant=delivery.tenant,
            object_id=_optional_text(info.object_id),
            occurred_at=info.occurred_at,
        )
        try:
            return await self.commits.submit(event)
        except StoreRejected as exc:
            # Refused alone (see batching): this event only, never its neighbours.
            raise PayloadError(f"the database cannot store this event: {exc}") from None
