"""Pagar.me: ``GET /core/v5/orders/{id}`` and ``GET /core/v5/charges/{id}``,
HTTP Basic with the secret key (``sk_...``) as the user and no password.

A webhook's ``data`` is the order (``or_...``) or the charge (``ch_...``) as
it was when the webhook was queued; by default an event points to that
object. ``fetch(event, "charge")`` on an order reads its first charge, and
``fetch(event, "order")`` on a charge reads the order it belongs to. Test and
live accounts share the base URL ``https://api.pagar.me`` (the key decides).
"""

from __future__ import annotations

import base64
from typing import Any

from ..._exceptions import NotFetchable
from ...events import Event
from ..client import ApiClient, Target, body_json, path_id, safe_id

__all__ = ["PagarmeClient", "object_kind"]

_PATHS = {"order": "/core/v5/orders/{}", "charge": "/core/v5/charges/{}"}
_PREFIXES = {"or_": "order", "ch_": "charge"}


def object_kind(object_id: Any) -> str | None:
    """``order`` or ``charge``, from the id's prefix."""
    return _PREFIXES.get(object_id[:3]) if isinstance(object_id, str) else None


class PagarmeClient(ApiClient):
    """Reads orders and charges from Pagar.me's API v5 (base ``https://api.pagar.me``)."""

    name = "pagarme"
    default_base_url = "https://api.pagar.me"
    kinds = ("order", "charge")

    def auth_headers(self) -> dict[str, str]:
        # The secret key is the Basic user; the password is empty.
        return {"authorization": "Basic " + base64.b64encode(f"{self.token}:".encode()).decode()}

    def target(self, event: Event, kind: str | None = None) -> Target:
        if kind is not None:
            self.kind_or_default(kind)
        data = body_json(event).get("data")
        data = data if isinstance(data, dict) else {}
        own = object_kind(data.get("id"))
        if own is None:
            raise NotFetchable(f"Pagar.me event {event.event_id} carries no order or charge")
        wanted = kind or own
        if wanted == own:
            return Target(own, safe_id(data["id"], f"Pagar.me {own} id"))
        if wanted == "charge":
            charges = data.get("charges")
            first = charges[0] if isinstance(charges, list) and charges else None
            if isinstance(first, dict) and first.get("id"):
                return Target("charge", safe_id(first["id"], "Pagar.me data.charges[0].id"))
        if wanted == "order":
            order = data.get("order")
            if isinstance(order, dict) and order.get("id"):
                return Target("order", safe_id(order["id"], "Pagar.me data.order.id"))
        raise NotFetchable(f"Pagar.me event {event.event_id} (a {own}) names no {wanted}")

    async def get(self, target: Target) -> dict[str, Any]:
        kind = self.kind_or_default(target.kind)
        return await self.get_json(_PATHS[kind].format(path_id(target.id)))

    async def retrieve_order(self, order_id: str) -> dict[str, Any]:
        """``GET /core/v5/orders/{order_id}``."""
        return await self.get(Target("order", safe_id(order_id, "order id")))

    async def retrieve_charge(self, charge_id: str) -> dict[str, Any]:
        """``GET /core/v5/charges/{charge_id}``."""
        return await self.get(Target("charge", safe_id(charge_id, "charge id")))
