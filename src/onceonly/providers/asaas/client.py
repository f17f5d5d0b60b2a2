"""Asaas: ``GET /v3/payments/{id}`` with the API key in the ``access_token`` header.

A ``PAYMENT_*`` event carries the payment (``payment.id``, ``pay_...``); its
``status`` in the body is what it was when the event was queued. Asaas also
requires a ``User-Agent`` on every call (sent). The sandbox lives at
``https://api-sandbox.asaas.com``, with its own keys.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
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

#: A payment's status -> the webhook event Asaas sends when it enters it, so a
#: reconciled payment reaches the handler registered for that event.
EVENT_FOR_STATUS = {
    "PENDING": "PAYMENT_CREATED",
    "CONFIRMED": "PAYMENT_CONFIRMED",
    "RECEIVED": "PAYMENT_RECEIVED",
    "RECEIVED_IN_CASH": "PAYMENT_RECEIVED",
    "OVERDUE": "PAYMENT_OVERDUE",
    "REFUNDED": "PAYMENT_REFUNDED",
    "REFUND_REQUESTED": "PAYMENT_REFUND_IN_PROGRESS",
    "CHARGEBACK_REQUESTED": "PAYMENT_CHARGEBACK_REQUESTED",
    "AWAITING_RISK_ANALYSIS": "PAYMENT_AWAITING_RISK_ANALYSIS",
}

__all__ = ["AsaasClient"]


class AsaasClient(ApiClient):
    """Reads payments (cobranças) from Asaas's API (base ``https://api.asaas.com``)."""

    name = "asaas"
    default_base_url = "https://api.asaas.com"
    kinds = ("payment",)
    lists_by_time = True
    # Asaas keeps undelivered events for 14 days; a paused queue holds them
    # all. Three days back is the usual catch-up; ask for more with --since.
    default_window = 3 * 86400.0

    def auth_headers(self) -> dict[str, str]:
        return {"access_token": self.token}

    def target(self, event: Event, kind: str | None = None) -> Target:
        kind = self.kind_or_default(kind)
        payment_id = lookup(body_json(event), "payment.id")
        if payment_id is None:
            raise NotFetchable(f"Asaas event {event.event_id} carries no payment")
        return Target(kind, safe_id(payment_id, "Asaas payment.id"))

    async def get(self, target: Target) -> dict[str, Any]:
        self.kind_or_default(target.kind)
        return await self.get_json(f"/v3/payments/{path_id(target.id)}")

    async def retrieve_payment(self, payment_id: str) -> dict[str, Any]:
        """``GET /v3/payments/{payment_id}``."""
        return await self.get(Target("payment", safe_id(payment_id, "payment id")))

    async def listing(
        self, since: datetime, *, ids: Sequence[str] = (), failed_only: bool = False
    ) -> AsyncIterator[Listed]:
        """``GET /v3/payments?dateCreated[ge]=<day>`` page by page (``offset``,
        ``limit``, ``hasMore``), or ``GET /v3/payments/{id}`` for `ids`: each
        payment as the event Asaas sends for its current status, with the
        deterministic id ``reconciled:<payment id>:<status>``. Asaas filters by
        creation day only, so the window starts on `since`'s (UTC) day."""
        if ids:
            for payment_id in ids:
                yield payment_event(await self.retrieve_payment(payment_id), "payment")
            return
        day = since.astimezone(UTC).date().isoformat()
        offset = 0
        while True:
            params = {"dateCreated[ge]": day, "offset": str(offset), "limit": str(self.page_size)}
            page, data = await self.get_page("/v3/payments", "data", params)
            for item in data:
                yield payment_event(item, "payments-list")
            if not page.get("hasMore") or not data:
                return
            offset += len(data)

    async def queue_state(self) -> dict[str, Any] | None:
        """``GET /v3/webhooks``: each webhook's ``enabled`` and ``interrupted``
        (the queue Asaas pauses after 15 failures in a row) and, where given,
        ``penalizedRequestsCount``."""
        page = await self.get_json("/v3/webhooks")
        data = page.get("data")
        hooks: list[Any] = data if isinstance(data, list) else []
        keep = ("id", "name", "url", "enabled", "interrupted", "penalizedRequestsCount")
        found = [{k: h[k] for k in keep if k in h} for h in hooks if isinstance(h, dict)]
        return {
            "webhooks": found,
            "interrupted": any(h.get("interrupted") for h in found),
        }


def payment_event(payment: Any, source: str) -> Listed:
    """A listed Asaas payment as the webhook event of its status."""
    if not isinstance(payment, dict):
        raise ApiError("asaas API listed a payment that is not an object", provider="asaas")
    payment_id = safe_id(payment.get("id"), "a listed Asaas payment id")
    status = str(payment.get("status") or "UNKNOWN")
    event_type = EVENT_FOR_STATUS.get(status, "PAYMENT_UPDATED")
    event_id = f"reconciled:{payment_id}:{status}"
    body = {"id": event_id, "event": event_type, "payment": payment}
    return Listed(event_id, event_type, listed_body(body), {RECONCILED_HEADER: f"asaas:{source}"})
