"""Mercado Pago: ``x-signature: ts=<ts>,v1=<hex>`` and ``x-request-id``.

The signature is HMAC-SHA256 (hex) over the manifest
``id:<data.id>;request-id:<x-request-id>;ts:<ts>;`` keyed with the webhook's
secret signature. A part whose value is missing is left out (the trailing ``;``
of the others stays). ``data.id`` comes from the **query string** of the
notification URL (``?data.id=...&type=payment``), not from the body, and is
signed exactly as received: Mercado Pago's SDKs lower-cased it until mid-2026
and now keep its case (order ids such as ``ORD01J...`` are upper-case), so a
signature over either form is accepted; both need the secret.

The body is **not** signed: only ``data.id``, the request id and the timestamp
are. That is why the signed query string is stored with the event (header
``onceonly-query``) and why a handler must fetch the payment by that id rather
than believe the body.

``ts`` has been seen in seconds and in milliseconds; 12 digits or more means
milliseconds. Mercado Pago documents no tolerance and does not say whether a
retry (every 15 minutes) is signed again, so, like its SDK, onceonly checks no
tolerance unless ``ONCEONLY_MERCADOPAGO_TOLERANCE`` sets one.

Event id: only what is signed, ``<data.id>:<x-request-id>`` (``data.id`` is
the payment and repeats across its notifications, the request id names one
notification). The body's ``id`` is not signed: taking the id from it let
anyone holding one captured signature store new events under ids of their
choosing, and take the id of a future genuine notification so that it was
answered as a duplicate. The timestamp is left out so that a resend signed
again with a new ``ts`` still dedupes; a notification signed without a request
id is identified by ``<data.id>:ts:<ts>``. An id longer than 255 characters is
replaced by ``sha256:<hex>`` of the same text. Type: the body's ``action``
(``payment.updated``), else its ``type`` (unsigned, like the whole body: the
handler fetches the payment by the signed ``data.id``).

Unsigned notifications (QR code, legacy IPN ``?topic=payment&id=...``): policy
``unsigned="reject"`` (default) answers 401; ``unsigned="fetch"`` stores them as
triggers, with event id and type prefixed ``unverified:`` and the header
``onceonly-verified: false``. A present but wrong ``x-signature`` is always
rejected.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import urlencode

from ..._exceptions import PayloadError
from ...events import Delivery, EventInfo
from ..base import (
    UNVERIFIED,
    Clock,
    TimestampedProvider,
    UnsignedPolicy,
    any_match,
    as_event_id,
    hmac_sha256,
    json_object,
    lookup,
    moment,
    new_delivery_id,
    object_text,
    optional_text,
    parse_unsigned_policy,
    sha256_hex,
)

__all__ = ["MercadoPago", "manifest"]

#: Timestamps with at least this many digits are milliseconds (seconds reach
#: 12 digits in the year 5138).
_MILLISECOND_DIGITS = 12
_MAX_TS_DIGITS = 16
#: Longest event id the inbox stores.
_MAX_ID = 255


def manifest(data_id: str | None, request_id: str | None, ts: str) -> str:
    """The signed text, with the parts whose value is missing left out."""
    parts = []
    if data_id:
        parts.append(f"id:{data_id}")
    if request_id:
        parts.append(f"request-id:{request_id}")
    parts.append(f"ts:{ts}")
    return ";".join(parts) + ";"


def _signature_parts(header: str) -> tuple[str | None, list[str]]:
    """``ts`` and every ``v1`` hash of an ``x-signature`` header."""
    ts: str | None = None
    hashes: list[str] = []
    for item in header.split(","):
        key, sep, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or not value:
            continue
        if key == "ts" and ts is None:
            ts = value
        elif key == "v1":
            hashes.append(value.lower())
    return ts, hashes


class MercadoPago(TimestampedProvider):
    """Mercado Pago's ``x-signature`` manifest over the query's ``data.id``,
    ``x-request-id`` and ``ts``; unsigned notifications by explicit policy."""

    name = "mercadopago"
    environ_options = (("unsigned", parse_unsigned_policy),)
    #: None documented; the official SDK checks none by default either.
    default_tolerance = 0

    def __init__(
        self,
        secrets: Sequence[str] | str,
        *,
        unsigned: UnsignedPolicy = "reject",
        tolerance: int | None = None,
        rejection_status: int = 401,
        clock: Clock = time.time,
    ) -> None:
        super().__init__(
            secrets, tolerance=tolerance, rejection_status=rejection_status, clock=clock
        )
        self.unsigned = parse_unsigned_policy(unsigned, "mercadopago unsigned policy")

    @staticmethod
    def _is_unsigned(delivery: Delivery) -> bool:
        return not delivery.headers.get("x-signature", "").strip()

    def verify(self, delivery: Delivery) -> None:
        if self._is_unsigned(delivery):
            if self.unsigned == "fetch":
                return  # stored as an unverified trigger by identify()
            raise self.reject("missing x-signature header (unsigned notifications are rejected)")
        ts, hashes = _signature_parts(delivery.headers["x-signature"])
        if ts is None or not hashes:
            raise self.reject("malformed x-signature header: needs ts= and v1=")
        if not ts.isascii() or not ts.isdigit() or len(ts) > _MAX_TS_DIGITS:
            raise self.reject(f"malformed x-signature timestamp {ts[:40]!r}")
        seconds = int(ts) // 1000 if len(ts) >= _MILLISECOND_DIGITS else int(ts)
        self.check_timestamp(str(seconds))
        request_id = delivery.headers.get("x-request-id", "").strip() or None
        data_id = delivery.query.get("data.id", "").strip() or None
        # The case-preserving form first (what Mercado Pago signs today), then
        # the lower-cased one older SDKs and docs described.
        data_ids = (
            [data_id]
            if data_id is None or data_id == data_id.lower()
            else [
                data_id,
                data_id.lower(),
            ]
        )
        expected = [
            hmac_sha256(secret.encode(), manifest(d, request_id, ts).encode()).hex().encode()
            for secret in self.secrets
            for d in data_ids
        ]
        if not any_match(expected, [h.encode("ascii", "replace") for h in hashes]):
            raise self.reject("no v1 signature matches")

    def identify(self, delivery: Delivery) -> EventInfo:
        # Mercado Pago retries a non-2xx for days, and the body is not what is
        # signed: a body that is not a JSON object is kept (and identified by
        # its hash) rather than refused into endless retries.
        try:
            data = json_object(delivery)
        except PayloadError:
            data = {}
        event_type = optional_text(data.get("action")) or optional_text(data.get("type"))
        # Always set, so a header of the same name sent by the client can never
        # pass for the signed query string.
        extra = {"onceonly-verified": "true", "onceonly-query": urlencode(delivery.query)}
        # The payment (or order) the notification is about, and when Mercado
        # Pago created the notification.
        object_id = object_text(
            delivery.query.get("data.id") or delivery.query.get("id") or lookup(data, "data.id")
        )
        occurred_at = moment(data.get("date_created"))
        if not self._is_unsigned(delivery):
            identity = self._signed_identity(delivery)
            return EventInfo(identity, event_type, extra, object_id, occurred_at)
        unsigned = self._identify_unsigned(delivery, data, event_type, extra)
        return replace(unsigned, object_id=object_id, occurred_at=occurred_at)

    @staticmethod
    def _signed_identity(delivery: Delivery) -> str:
        """The event id from the signed manifest's parts alone (see the module
        docstring); `verify` has already checked that they are signed."""
        data_id = delivery.query.get("data.id", "").strip()
        request_id = delivery.headers.get("x-request-id", "").strip()
        if request_id:
            identity = f"{data_id}:{request_id}"
        else:
            ts, _ = _signature_parts(delivery.headers["x-signature"])
            identity = f"{data_id}:ts:{ts}"
        if len(identity) > _MAX_ID:
            return "sha256:" + sha256_hex(identity.encode())
        return identity

    def _identify_unsigned(
        self,
        delivery: Delivery,
        data: Mapping[str, Any],
        event_type: str | None,
        extra: dict[str, str],
    ) -> EventInfo:
        """An unsigned trigger: only the object id is used, to fetch the real state."""
        query = delivery.query
        topic = query.get("type") or query.get("topic") or event_type or "notification"
        object_id = query.get("data.id") or query.get("id") or lookup(data, "data.id")
        if object_id is None or object_id == "":
            raise PayloadError("unsigned notification names no object to fetch")
        # Dedupe what Mercado Pago identifies (the notification id, else the
        # request id). Without either, one event per second: a repeated
        # trigger costs one more fetch, a swallowed one could hide a change.
        raw_id = data.get("id") or delivery.headers.get("x-request-id")
        key = (
            as_event_id(raw_id, "body id")
            if raw_id
            else f"{topic}:{as_event_id(object_id, 'object id')}:{int(self.clock())}"
        )
        extra["onceonly-verified"] = "false"
        return EventInfo(UNVERIFIED + key, UNVERIFIED + (event_type or topic), extra)

    def sign(
        self,
        body: bytes,
        *,
        timestamp: int | None = None,
        delivery_id: str | None = None,
        query: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """``x-signature`` (``ts`` in milliseconds, as live notifications carry
        it) over ``query["data.id"]`` as given, and ``x-request-id``."""
        request_id = delivery_id or new_delivery_id()
        ts = str(self.now(timestamp) * 1000)
        data_id = (query or {}).get("data.id") or None
        text = manifest(data_id, request_id, ts)
        signature = hmac_sha256(self.secrets[0].encode(), text.encode()).hex()
        return {"x-signature": f"ts={ts},v1={signature}", "x-request-id": request_id}
