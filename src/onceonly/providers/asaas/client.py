"""Asaas: ``GET /v3/payments/{id}`` with the API key in the ``access_token`` header.

A ``PAYMENT_*`` event carries the payment (``payment.id``, ``pay_...``); its
``status`` in the body is what it was when the event was queued. Asaas also
requires a ``User-Agent`` on every call (sent). The sandbox lives at
``https://api-sandbox.asaas.com``, with its own keys.
"""

from __future__ import annotations

from typing import Any

from ..._exceptions import NotFetchable
from ...events import Event
from ..base import lookup
from ..client import ApiClient, Target, body_json, path_id, safe_id

__all__ = ["AsaasClient"]


class AsaasClient(ApiClient):
    """Reads payments (cobranças) from Asaas's API (base ``https://api.asaas.com``)."""

    name = "asaas"
    default_base_url = "https://api.asaas.com"
    kinds = ("payment",)

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
