"""Stripe: ``Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>...]``.

The signed bytes are ``"{t}." + raw body``; the key is the whole ``whsec_...``
string as UTF-8 (it is not base64-decoded). Any ``v1`` may match: Stripe sends
one per active secret while you roll a secret. The event id is the body's ``id``
(``evt_...``); the type is its ``type``.

Stripe's SDK only rejects stale timestamps; onceonly also rejects timestamps
more than the tolerance in the future.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...events import Delivery, EventInfo
from ..base import (
    TimestampedProvider,
    any_match,
    as_event_id,
    hmac_sha256,
    json_object,
    lookup,
    moment,
    object_text,
    optional_text,
)

__all__ = ["Stripe"]


class Stripe(TimestampedProvider):
    name = "stripe"
    default_tolerance = 300

    def verify(self, delivery: Delivery) -> None:
        header = self.require_header(delivery, "stripe-signature")
        timestamp: str | None = None
        signatures: list[bytes] = []
        for item in header.split(","):
            key, sep, value = item.strip().partition("=")
            if not sep:
                continue
            if key == "t" and timestamp is None:  # the first t= counts, as in Stripe's SDK
                timestamp = value
            elif key == "v1":
                signatures.append(value.lower().encode("ascii", "replace"))
        if timestamp is None or not signatures:
            raise self.reject("malformed Stripe-Signature header: needs t= and v1=")
        self.check_timestamp(timestamp)
        signed = timestamp.encode()
        expected = [
            hmac_sha256(secret.encode(), signed, b".", delivery.body).hex().encode()
            for secret in self.secrets
        ]
        if not any_match(expected, signatures):
            raise self.reject("no v1 signature matches")

    def sign(
        self,
        body: bytes,
        *,
        timestamp: int | None = None,
        delivery_id: str | None = None,
        query: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        # Stripe puts no id in a header: the event id is in the body.
        t = str(self.now(timestamp))
        signature = hmac_sha256(self.secrets[0].encode(), t.encode(), b".", body).hex()
        return {"stripe-signature": f"t={t},v1={signature}"}

    def identify(self, delivery: Delivery) -> EventInfo:
        data = json_object(delivery)
        return EventInfo(
            as_event_id(data.get("id"), "body id"),
            optional_text(data.get("type")),
            object_id=object_text(lookup(data, "data.object.id")),
            occurred_at=moment(data.get("created")),
        )
