"""Shopify: ``X-Shopify-Hmac-Sha256``, HMAC-SHA256 over the raw body, **base64**.

The key is the app's client secret (API secret key), as UTF-8 bytes. Nothing
time-based is signed (``X-Shopify-Triggered-At`` is not covered), so there is
no tolerance; replays are stopped by the event id instead.

Shopify sends two ids:

- ``X-Shopify-Webhook-Id``: one per delivery, kept on Shopify's retries of it.
- ``X-Shopify-Event-Id``: one per merchant action, shared by the deliveries of
  every topic (and every subscription) that action triggers.

The default event id is the **webhook id** (``event_id="webhook-id"``): retries
of a delivery dedupe, and ``orders/create`` and ``orders/paid`` from one
checkout are two events, each reaching its own handler. Deduping on the event
id instead would store whichever topic arrived first and drop the others as
duplicates. Choose ``event_id="event-id"`` only when one endpoint subscribes
once per action and you want duplicate subscriptions collapsed; a delivery
without that header then falls back to its webhook id. Type: the
``X-Shopify-Topic`` header (``orders/create``).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Literal

from .._exceptions import ConfigurationError
from ..events import Delivery, EventInfo
from .base import Provider, any_match, as_event_id, hmac_sha256, new_delivery_id

__all__ = ["Shopify"]

EventIdHeader = Literal["webhook-id", "event-id"]


def _event_id_choice(raw: str, what: str) -> EventIdHeader:
    value = raw.strip().lower()
    if value == "webhook-id":
        return "webhook-id"
    if value == "event-id":
        return "event-id"
    raise ConfigurationError(f"{what} must be 'webhook-id' or 'event-id', got {raw!r}")


class Shopify(Provider):
    """Shopify's base64 ``X-Shopify-Hmac-Sha256``; event id per delivery by default."""

    name = "shopify"
    environ_options = (("event_id", _event_id_choice),)

    def __init__(
        self,
        secrets: Sequence[str] | str,
        *,
        event_id: EventIdHeader = "webhook-id",
        rejection_status: int = 401,
    ) -> None:
        super().__init__(secrets, rejection_status=rejection_status)
        self.event_id = _event_id_choice(event_id, "shopify event_id")

    def _signature(self, secret: str, body: bytes) -> bytes:
        return base64.b64encode(hmac_sha256(secret.encode(), body))

    def verify(self, delivery: Delivery) -> None:
        given = self.require_header(delivery, "x-shopify-hmac-sha256").strip()
        # Base64 is case-sensitive: no normalising, unlike hex.
        expected = (self._signature(s, delivery.body) for s in self.secrets)
        if not any_match(expected, [given.encode("ascii", "replace")]):
            raise self.reject("X-Shopify-Hmac-Sha256 does not match")

    def identify(self, delivery: Delivery) -> EventInfo:
        headers = delivery.headers
        if self.event_id == "event-id" and headers.get("x-shopify-event-id"):
            event_id = as_event_id(headers["x-shopify-event-id"], "X-Shopify-Event-Id header")
        else:
            event_id = as_event_id(headers.get("x-shopify-webhook-id"), "X-Shopify-Webhook-Id")
        return EventInfo(event_id, headers.get("x-shopify-topic") or None)

    def sign(
        self,
        body: bytes,
        *,
        timestamp: int | None = None,
        delivery_id: str | None = None,
        query: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """The signature, a webhook id (`delivery_id`), a fresh event id and
        ``x-shopify-triggered-at``; the caller adds ``x-shopify-topic``."""
        when = datetime.now(UTC) if timestamp is None else datetime.fromtimestamp(timestamp, UTC)
        return {
            "x-shopify-hmac-sha256": self._signature(self.secrets[0], body).decode(),
            "x-shopify-webhook-id": delivery_id or new_delivery_id(),
            "x-shopify-event-id": new_delivery_id(),
            "x-shopify-triggered-at": when.isoformat().replace("+00:00", "Z"),
        }
