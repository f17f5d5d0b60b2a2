"""Stripe: ``GET /v1/events/{id}`` and ``GET /v1/payment_intents/{id}``.

Authenticated with the secret key as a Bearer token (``sk_live_...``,
``sk_test_...``, or a restricted ``rk_...`` key with read access to events and
payment intents); for a Connect platform's tenant, with the platform's key and
``Stripe-Account: acct_...`` (see :meth:`ApiClient.for_tenant`). By default
an event points to itself: the event as Stripe's API has it, which a forged
body cannot fake. ``fetch(event, "payment_intent")`` reads the payment intent
the event is about: ``data.object`` when it is one, else its
``payment_intent`` field (a charge, a refund, a dispute...).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any

from ..._exceptions import ApiError, NotFetchable
from ...events import Event
from ..base import lookup
from ..client import (
    RECONCILED_HEADER,
    ApiClient,
    Listed,
    Target,
    body_json,
    listed_body,
    path_id,
    safe_id,
)

__all__ = ["StripeClient"]

_PATHS = {"event": "/v1/events/{}", "payment_intent": "/v1/payment_intents/{}"}


class StripeClient(ApiClient):
    """Reads events and payment intents from Stripe's API (base ``https://api.stripe.com``)."""

    name = "stripe"
    default_base_url = "https://api.stripe.com"
    kinds = ("event", "payment_intent")
    lists_by_time = True
    # Stripe keeps 30 days of events and retries for 3: three days back
    # covers every event Stripe has given up on.
    default_window = 3 * 86400.0

    accounts = True

    def auth_headers(self) -> dict[str, str]:
        headers = super().auth_headers()
        if self.account is not None:
            # Stripe Connect: the platform's key, acting for the connected account.
            headers["stripe-account"] = self.account
        return headers

    def target(self, event: Event, kind: str | None = None) -> Target:
        kind = self.kind_or_default(kind)
        if kind == "event":
            return Target("event", safe_id(event.event_id, "the Stripe event id"))
        obj = lookup(body_json(event), "data.object")
        if not isinstance(obj, dict):
            raise NotFetchable(f"Stripe event {event.event_id} has no data.object")
        if obj.get("object") == "payment_intent":
            return Target(kind, safe_id(obj.get("id"), "data.object.id"))
        reference = obj.get("payment_intent")
        if isinstance(reference, dict):  # expanded
            reference = reference.get("id")
        if reference is None:
            raise NotFetchable(
                f"Stripe event {event.event_id} ({obj.get('object')}) names no payment intent"
            )
        return Target(kind, safe_id(reference, "data.object.payment_intent"))

    async def get(self, target: Target) -> dict[str, Any]:
        path = _PATHS[self.kind_or_default(target.kind)]
        return await self.get_json(path.format(path_id(target.id)))

    async def retrieve_event(self, event_id: str) -> dict[str, Any]:
        """``GET /v1/events/{event_id}``."""
        return await self.get(Target("event", safe_id(event_id, "event id")))

    async def retrieve_payment_intent(self, intent_id: str) -> dict[str, Any]:
        """``GET /v1/payment_intents/{intent_id}``."""
        return await self.get(Target("payment_intent", safe_id(intent_id, "payment intent id")))

    async def listing(
        self, since: datetime, *, ids: Sequence[str] = (), failed_only: bool = False
    ) -> AsyncIterator[Listed]:
        """``GET /v1/events?created[gte]=...`` page by page (``starting_after``),
        or ``GET /v1/events/{id}`` for `ids`. A listed event is the event, with
        the id and shape of its delivery: dedup with a delivered copy is exact.
        `failed_only` adds ``delivery_success=false`` (events still pending or
        whose every attempt to an endpoint failed)."""
        if ids:
            for event_id in ids:
                yield _listed(await self.retrieve_event(event_id), "events")
            return
        params = {"created[gte]": str(int(since.timestamp())), "limit": str(self.page_size)}
        if failed_only:
            params["delivery_success"] = "false"
        while True:
            page, data = await self.get_page("/v1/events", "data", params)
            for item in data:
                yield _listed(item, "events-list")
            if not page.get("has_more") or not data:
                return
            params["starting_after"] = safe_id(data[-1].get("id"), "the last listed event id")


def _listed(event: Any, source: str) -> Listed:
    if not isinstance(event, dict):
        raise ApiError("stripe API listed an event that is not an object", provider="stripe")
    event_id = safe_id(event.get("id"), "a listed Stripe event id")
    kind = event.get("type")
    return Listed(
        event_id,
        kind if isinstance(kind, str) else None,
        listed_body(event),
        {RECONCILED_HEADER: f"stripe:{source}"},
    )
