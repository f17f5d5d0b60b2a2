"""The inbox: verify a delivery, identify its event, and store it with group commit
(see :mod:`onceonly.batching`): no 2xx before the event is durable."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from ._exceptions import PayloadError, StoreRejected, UnknownProvider, UnknownTenant
from .batching import GroupCommit
from .events import Delivery, NewEvent, Receipt
from .handlers import HandlerRegistry
from .headers import ReadHeaders
from .providers import Provider
from .store import Store
from .tracing import TRACEPARENT_HEADER, Tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

if TYPE_CHECKING:
    from .tenants import Tenants

__all__ = ["GroupCommit", "Inbox"]

log = logging.getLogger("onceonly.receiver")

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


def refused(exc: StoreRejected) -> PayloadError:
    """A delivery whose event the database refused (a value it cannot store):
    a 400 for that delivery only, never its batch's neighbours (see batching)."""
    return PayloadError(f"the database cannot store this event: {exc}")


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

    `handlers` (the application's) give each event its ordering key before it
    is stored; without them every event is stored unordered.
    """

    def __init__(
        self,
        store: Store,
        providers: Mapping[str, Provider],
        handlers: HandlerRegistry | None = None,
        *,
        tenants: Tenants | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.store = store
        self.providers = dict(providers)
        self.handlers = handlers
        #: Where ``/{provider}/{tenant}`` deliveries find their secrets (None: no tenants).
        self.tenants = tenants
        self.tracing = tracing or Tracing()
        # Decided once: without tracing the hot path has not even a wrapper call.
        flush = self._traced_commit if self.tracing.enabled else store.insert_events
        self.commits: GroupCommit[NewEvent, Receipt] = GroupCommit(
            flush,
            max_batch=store.commit_batch,
            max_in_flight=store.commit_concurrency,
            share=store.commit_share,
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
        event = self._about(event)
        if self.handlers is not None and (key := self.handlers.ordering_key(event)) is not None:
            event = replace(event, ordering_key=key)
        try:
            return await self.commits.submit(event)
        except StoreRejected as exc:
            raise refused(exc) from None

    def _about(self, event: NewEvent) -> NewEvent:
        """`event` with the object and creation time its provider reads from a
        delivery of the same body, so that an admitted event is found, ordered
        and judged stale like a delivered one."""
        provider = self.providers.get(event.provider)
        if provider is None or (event.object_id is not None and event.occurred_at is not None):
            return event
        try:
            info = provider.identify(Delivery(event.provider, event.body, event.headers))
        except PayloadError:
            return event
        return replace(
            event,
            object_id=event.object_id or _optional_text(info.object_id),
            occurred_at=event.occurred_at or info.occurred_at,
        )

    def own_verifier(self, name: str) -> Provider:
        """:meth:`verifier` for a delivery to ``/{name}``, with no tenant:
        nothing to look up, so no need to await."""
        provider = self.provider(name)
        if provider.tenants_only:
            raise UnknownTenant(f"provider {name!r} takes deliveries only at /{name}/{{tenant}}")
        return provider

    async def verifier(self, name: str, tenant: str = "") -> Provider:
        """The provider that verifies deliveries to route `name` for `tenant`:
        the route's own, or for a tenant a copy holding only that tenant's
        secrets, so one merchant's secret never verifies another's delivery.

        Raises :class:`~onceonly.UnknownProvider`, :class:`~onceonly.UnknownTenant`
        (404s) and :class:`~onceonly.TenantUnavailable` (the resolver failed).
        """
        if not tenant:
            return self.own_verifier(name)
        provider = self.provider(name)
        if self.tenants is None:
            raise UnknownTenant("this deployment has no tenants")
        return await self.tenants.verifier(name, tenant, provider)

    async def receive(self, delivery: Delivery, verifier: Provider | None = None) -> Receipt:
        """Verify, identify and store `delivery`. `verifier`: what
        :meth:`verifier` gave for its route and tenant, when the caller asked
        already (the receiver does, to answer 404 before reading the body)."""
        if self.tracing.enabled:
            return await self._traced_receive(delivery, verifier)
        return await self._receive(delivery, None, verifier)

    async def _traced_receive(self, delivery: Delivery, verifier: Provider | None) -> Receipt:
        """:meth:`receive` in an ``onceonly.receive`` span, which lasts until
        the commit that holds the event (see :mod:`onceonly.tracing`)."""
        # The sender's traceparent is its claim, not ours to build on: a link.
        sender = delivery.headers.get("traceparent")
        with self.tracing.span(
            "onceonly.receive",
            {"onceonly.provider": delivery.provider, "onceonly.tenant": delivery.tenant},
            links=(sender,),
        ) as span:
            receipt = await self._receive(delivery, span, verifier)
            if span is not None:
                span.set_attribute("onceonly.duplicate", receipt.duplicate)
                if receipt.id is not None:
                    span.set_attribute("onceonly.event_pk", receipt.id)
            return receipt

    async def _traced_commit(self, batch: Sequence[NewEvent]) -> Sequence[Receipt]:
        """One group commit as an ``onceonly.commit`` span of its own, linked
        to the receive span of each request it holds."""
        with self.tracing.span(
            "onceonly.commit",
            {"onceonly.events": len(batch)},
            root=True,
            links=(event.headers.get(TRACEPARENT_HEADER) for event in batch),
        ):
            return await self.store.insert_events(batch)

    async def _receive(
        self, delivery: Delivery, span: Span | None, verifier: Provider | None
    ) -> Receipt:
        provider = (
            verifier
            if verifier is not None
            else await self.verifier(delivery.provider, delivery.tenant)
        )
        event = self.prepare(delivery, provider, span)
        try:
            receipt = await self.commits.submit(event)
        except StoreRejected as exc:
            # Refused alone (see batching): this event only, never its neighbours.
            raise refused(exc) from None
        self.log_receipt(event, receipt)
        return receipt

    def prepare(self, delivery: Delivery, provider: Provider, span: Span | None = None) -> NewEvent:
        """What :meth:`receive` stores for `delivery`, verified by `provider`
        (:meth:`verifier`'s for its route and tenant), before the commit.

        Raises the :class:`~onceonly.DeliveryRejected` family. ``onceonly
        serve``'s protocol calls it when the whole request is in hand, and
        hands the event to :attr:`commits` itself.
        """
        headers = delivery.headers
        if not isinstance(headers, ReadHeaders):
            headers = ReadHeaders(headers)
            delivery = Delivery(
                delivery.provider, delivery.body, headers, delivery.query, delivery.tenant
            )
        # Authenticate first: nothing from an unverified body is parsed or kept.
        provider.verify(delivery)
        info = provider.identify(delivery)
        _check_text(info.event_id, "event id")
        if info.event_type is not None:
            _check_text(info.event_type, "event type")
        kept = headers.kept(info.extra_headers)
        # Only our own receive span names the trace an event's processing joins.
        kept.pop(TRACEPARENT_HEADER, None)
        if span is not None:
            span.set_attribute("onceonly.event_id", info.event_id)
            span.set_attribute("onceonly.event_type", info.event_type or "")
            traceparent = self.tracing.traceparent(span)
            if traceparent is not None:
                kept[TRACEPARENT_HEADER] = traceparent
        event = NewEvent(
            provider=delivery.provider,
            event_id=info.event_id,
            event_type=info.event_type,
            body=delivery.body,
            headers=kept,
            tenant=delivery.tenant,
            object_id=_optional_text(info.object_id),
            occurred_at=info.occurred_at,
        )
        if self.handlers is not None and (key := self.handlers.ordering_key(event)) is not None:
            event = replace(event, ordering_key=key)
        return event

    @staticmethod
    def log_receipt(event: NewEvent, receipt: Receipt) -> None:
        """The debug line for a stored (or duplicate) delivery."""
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "event %s (%s %s): %s",
                receipt.id,
                event.provider,
                event.event_id,
                "duplicate delivery" if receipt.duplicate else "received",
                extra={
                    "event_pk": receipt.id,
                    "provider": event.provider,
                    "event_id": event.event_id,
                    "event_type": event.event_type,
                    "tenant": event.tenant,
                    "duplicate": receipt.duplicate,
                },
            )
