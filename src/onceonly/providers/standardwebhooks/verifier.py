"""Standard Webhooks (and Svix, which uses the same scheme under ``svix-*`` headers).

Headers ``webhook-id``, ``webhook-timestamp``, ``webhook-signature`` (or
``svix-id``, ``svix-timestamp``, ``svix-signature``). The signature header holds
space-separated ``v1,<base64>`` entries; each is HMAC-SHA256 over
``"{id}.{timestamp}." + raw body`` keyed with the base64-decoded secret (the
part after ``whsec_``). Timestamp tolerance: 5 minutes in both directions.
``v1a`` (ed25519) entries are ignored. The event id is the id header of the
family that was verified (``webhook-id`` when ``webhook-signature`` is
present, else ``svix-id``): the id is signed, so a captured delivery replayed
with another id in the other family's header is a duplicate, not a new event.
The type is the body's ``type`` when present (the body is signed).
"""

from __future__ import annotations

import base64
import binascii
import os
import time
from collections.abc import Mapping, Sequence

from ..._exceptions import ConfigurationError
from ...events import Delivery, EventInfo
from ..base import (
    Clock,
    TimestampedProvider,
    any_match,
    as_event_id,
    hmac_sha256,
    json_object,
    new_delivery_id,
    optional_text,
)

__all__ = ["StandardWebhooks"]


def _decode_secret(secret: str) -> bytes:
    raw = secret.removeprefix("whsec_")
    # Some dashboards show the secret without its base64 padding; the
    # reference SDK accepts that, so do we.
    raw += "=" * (-len(raw) % 4)
    try:
        key = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigurationError(
            "standardwebhooks secrets are 'whsec_' followed by base64"
        ) from None
    if not key:
        # An empty key would let anyone sign.
        raise ConfigurationError("standardwebhooks secret decodes to an empty key")
    return key


class StandardWebhooks(TimestampedProvider):
    name = "standardwebhooks"
    default_tolerance = 300

    def __init__(
        self,
        secrets: Sequence[str] | str,
        *,
        tolerance: int | None = None,
        rejection_status: int = 401,
        clock: Clock = time.time,
    ) -> None:
        super().__init__(
            secrets, tolerance=tolerance, rejection_status=rejection_status, clock=clock
        )
        self._keys = tuple(_decode_secret(s) for s in self.secrets)

    @classmethod
    def _unguessable_secret(cls) -> str:
        return "whsec_" + base64.b64encode(os.urandom(32)).decode()

    def _use_secrets(self, secrets: Sequence[str] | str) -> None:
        super()._use_secrets(secrets)
        self._keys = tuple(_decode_secret(s) for s in self.secrets)

    @staticmethod
    def _prefix(delivery: Delivery) -> str:
        """The header family verified, and so the one every signed value comes from."""
        return "webhook" if "webhook-signature" in delivery.headers else "svix"

    def _headers(self, delivery: Delivery) -> tuple[str, str, str]:
        prefix = self._prefix(delivery)
        return (
            self.require_header(delivery, f"{prefix}-id"),
            self.require_header(delivery, f"{prefix}-timestamp"),
            self.require_header(delivery, f"{prefix}-signature"),
        )

    def verify(self, delivery: Delivery) -> None:
        msg_id, timestamp, header = self._headers(delivery)
        signatures = [
            sig.encode("ascii", "replace")
            for version, sep, sig in (entry.partition(",") for entry in header.split())
            if sep and version == "v1"
        ]
        if not signatures:
            raise self.reject("malformed signature header: no v1 signature")
        self.check_timestamp(timestamp)
        signed = (msg_id.encode(), b".", timestamp.encode(), b".", delivery.body)
        expected = (base64.b64encode(hmac_sha256(key, *signed)) for key in self._keys)
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
        """``webhook-*`` headers (the standard's names; Svix sends ``svix-*``)."""
        msg_id = delivery_id or new_delivery_id("msg_")
        t = str(self.now(timestamp))
        digest = hmac_sha256(self._keys[0], msg_id.encode(), b".", t.encode(), b".", body)
        return {
            "webhook-id": msg_id,
            "webhook-timestamp": t,
            "webhook-signature": "v1," + base64.b64encode(digest).decode(),
        }

    def identify(self, delivery: Delivery) -> EventInfo:
        header = f"{self._prefix(delivery)}-id"
        msg_id = delivery.headers.get(header)
        data = json_object(delivery)
        return EventInfo(as_event_id(msg_id, f"{header} header"), optional_text(data.get("type")))
