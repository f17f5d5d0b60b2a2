"""Asaas: a static ``asaas-access-token`` header, no HMAC.

The token is the one you type when creating the webhook in Asaas; it is sent
as is on every delivery, so it authenticates the sender but not the body (use
HTTPS). It is compared in constant time against every configured token: both
sides are hashed first, so neither the comparison time nor an early length
mismatch says how much of a guess was right.

Event id: the body's ``id`` (``evt_...``), kept on Asaas's retries. Type: the
body's ``event`` (``PAYMENT_RECEIVED``). Asaas counts only HTTP **200** as
delivered (not 201 or 204), which is what the receiver answers for a new event
and for a duplicate alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import timedelta, timezone
from typing import Any

from ...events import Delivery, EventInfo
from ..base import (
    Provider,
    any_match,
    as_event_id,
    json_object,
    moment,
    object_text,
    optional_text,
)

__all__ = ["Asaas"]


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


class Asaas(Provider):
    """Asaas's static ``asaas-access-token``, compared in constant time."""

    name = "asaas"

    def verify(self, delivery: Delivery) -> None:
        given = self.require_header(delivery, "asaas-access-token")
        if not any_match((_digest(t) for t in self.secrets), [_digest(given.strip())]):
            raise self.reject("asaas-access-token does not match")

    def identify(self, delivery: Delivery) -> EventInfo:
        data = json_object(delivery)
        return EventInfo(
            as_event_id(data.get("id"), "body id"),
            optional_text(data.get("event")),
            object_id=_object_id(data),
            # Asaas writes local times without an offset: Brasília's.
            occurred_at=moment(data.get("dateCreated"), zone=BRASILIA),
        )

    def sign(
        self,
        body: bytes,
        *,
        timestamp: int | None = None,
        delivery_id: str | None = None,
        query: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        # Nothing is computed: Asaas sends the configured token itself.
        return {"asaas-access-token": self.secrets[0]}


#: Asaas's times carry no offset; they are Brasília's (UTC-3, no daylight
#: saving since 2019).
BRASILIA = timezone(timedelta(hours=-3))


def _object_id(data: Mapping[str, Any]) -> str | None:
    """The payment (or transfer, subscription...) the event is about: the
    event's body names it under its kind (``"payment": {"id": "pay_..."}``)."""
    for key, value in data.items():
        if key != "id" and isinstance(value, Mapping) and (found := object_text(value.get("id"))):
            return found
    return None
