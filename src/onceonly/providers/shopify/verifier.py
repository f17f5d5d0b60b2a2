"""Shopify: ``X-Shopify-Hmac-Sha256``, HMAC-SHA256 over the raw body, **base64**.

The key is the app's client secret (API secret key), as UTF-8 bytes. Nothing
time-based is signed (``X-Shopify-Triggered-At`` is not covered), so there is
no tolerance; replays are stopped by the event id instead.

Only the body is signed. Shopify also sends two ids and the topic, none of
them signed:

- ``X-Shopify-Webhook-Id``: one per delivery, kept on Shopify's retries of it.
- ``X-Shopify-Event-Id``: one per merchant action, shared by the deliveries of
  every topic (and every subscription) that action triggers.
- ``X-Shopify-Topic`` (``orders/create``): the type.

The default event id is ``sha256:<hex of the raw body>`` (``event_id="body"``):
Shopify's retries of a delivery send the same body, so they dedupe, and a
captured body replayed with another webhook id or another topic is a duplicate,
never a new event. What that costs: deliveries of several topics whose bodies
are byte for byte the same are one event, stored under the topic that arrived
first. The type is unsigned and is stored with ``onceonly-type-signed: false``;
handlers read the order's state from the (signed) body or the API, not from the
topic.

Shopify's Events deliveries (the newer subscription mechanism) send the same
headers without the ``X-`` prefix: ``Shopify-Hmac-Sha256``,
``Shopify-Webhook-Id``, ``Shopify-Event-Id``, ``Shopify-Topic``,
``Shopify-Triggered-At``. Both spellings are read; when a delivery carries
both, the ``X-`` one is read first.

``event_id="webhook-id"`` or ``"event-id"`` take the id from those unsigned
headers instead (the behaviour before issue 13): anyone holding one signed body
can then store it again under any number of new ids and topics. With
``"event-id"``, a delivery without that header falls back to its webhook id.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Literal

from ..._exceptions import ConfigurationError
from ...events import Delivery, EventInfo
from ..base import (
    TYPE_SIGNED_HEADER,
    Provider,
    any_match,
    as_event_id,
    body_hash_id,
    hmac_sha256,
    new_delivery_id,
)

__all__ = ["Shopify"]

EventIdHeader = Literal["body", "webhook-id", "event-id"]


def _event_id_choice(raw: str, what: str) -> EventIdHeader:
    value = raw.strip().lower()
    if value == "body":
        return "body"
    if value == "webhook-id":
        return "webhook-id"
    if value == "event-id":
        return "event-id"
    raise ConfigurationError(f"{what} must be 'body', 'webhook-id' or 'event-id', got {raw!r}")


def _header(delivery: Delivery, suffix: str) -> str | None:
    """``X-Shopify-<suffix>`` (classic webhooks) or ``Shopify-<suffix>`` (Events)."""
    headers = delivery.headers
    return headers.get(f"x-shopify-{suffix}") or headers.get(f"shopify-{suffix}") or None


class Shopify(Provider):
    """Shopify's base64 ``X-Shopify-Hmac-Sha256``; event id from the signed body by default."""

    name = "shopify"
    environ_options = (("event_id", _event_id_choice),)

    def __init__(
        self,
        secrets: Sequence[str] | str,
        *,
        event_id: EventIdHeader = "body",
        rejection_status: int = 401,
    ) -> None:
        super().__init__(secrets, rejection_status=rejection_status)
        self.event_id = _event_id_choice(event_id, "shopify event_id")

    def _signature(self, secret: str, body: bytes) -> bytes:
        return base64.b64encode(hmac_sha256(secret.encode(), body))

    def verify(self, delivery: Delivery) -> None:
        given = self.require_header(
            delivery, "x-shopify-hmac-sha256", "shopify-hmac-sha256"
        ).strip()
        # Base64 is case-sensitive: no normalising, unlike hex.
        expected = (self._signature(s, delivery.body) for s in self.secrets)
        if not any_match(expected, [given.encode("ascii", "replace")]):
            raise self.reject("X-Shopify-Hmac-Sha256 does not match")

    def identify(self, delivery: Delivery) -> EventInfo:
        if self.event_id == "body":
            event_id = body_hash_id(delivery.body)
        elif self.event_id == "event-id" and (shared := _header(delivery, "event-id")):
            event_id = as_event_id(shared, "X-Shopify-Event-Id header")
        else:
            event_id = as_event_id(_header(delivery, "webhook-id"), "X-Shopify-Webhook-Id")
        return EventInfo(event_id, _header(delivery, "topic"), {TYPE_SIGNED_HEADER: "false"})

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
