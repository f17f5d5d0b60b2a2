"""Standard Webhooks (and Svix, which uses the same scheme under ``svix-*`` headers).

Headers ``webhook-id``, ``webhook-timestamp``, ``webhook-signature`` (or
``svix-id``, ``svix-timestamp``, ``svix-signature``). The signature header holds
space-separated ``v1,<base64>`` entries; each is HMAC-SHA256 over
``"{id}.{timestamp}." + raw body`` keyed with the base64-decoded secret (the
part after ``whsec_``). Timestamp tolerance: 5 minutes in both directions.

``v1a`` entries are ed25519 signatures (base64, 64 bytes) over the same
``"{id}.{timestamp}." + raw body``, checked against the public keys
configured as ``whpk_<base64 of the 32-byte key>``. A ``whsk_<base64>``
secret key (the 32-byte seed, or libsodium's 64 bytes) is accepted too: it
verifies with its public half and signs test deliveries. ``whsec_`` and
``whpk_`` secrets can be mixed, for a sender moving from one scheme to the
other; a delivery passes when any of its entries matches any configured key
of its scheme (entries of a scheme with no configured key are ignored). The
public keys are a trust list fixed in configuration: a key named by the
delivery itself is never used. Ed25519 needs the optional ``cryptography``
package (``onceonly[asymmetric]``), imported only when such a key is configured.

The event id is the id header of the
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
from ..crypto import ed25519_private_key, ed25519_public_key, ed25519_verifies

__all__ = ["StandardWebhooks"]


_ASYMMETRIC_PREFIXES = ("whpk_", "whsk_")
_MAX_V1A_ENTRIES = 8


def _decode_secret(secret: str) -> bytes:
    raw = secret
    for prefix in ("whsec_", *_ASYMMETRIC_PREFIXES):
        raw = raw.removeprefix(prefix)
    # Some dashboards show the secret without its base64 padding; the
    # reference SDK accepts that, so do we.
    raw += "=" * (-len(raw) % 4)
    try:
        key = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigurationError(
            "standardwebhooks secrets are 'whsec_', 'whpk_' or 'whsk_' followed by base64"
        ) from None
    if not key:
        # An empty key would let anyone sign.
        raise ConfigurationError("standardwebhooks secret decodes to an empty key")
    return key


def _entries(header: str, version: str) -> list[str]:
    return [
        sig
        for name, sep, sig in (entry.partition(",") for entry in header.split())
        if sep and name == version
    ]


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
        what = "standardwebhooks v1a key"
        self._keys = tuple(
            _decode_secret(s) for s in self.secrets if not s.startswith(_ASYMMETRIC_PREFIXES)
        )
        self._public_keys = tuple(
            ed25519_public_key(_decode_secret(s), what)
            if s.startswith("whpk_")
            else ed25519_private_key(_decode_secret(s), what).public_key()
            for s in self.secrets
            if s.startswith(_ASYMMETRIC_PREFIXES)
        )

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
        # Only the schemes a key is configured for count: a v1a entry is no
        # use to a receiver holding HMAC secrets alone, and the reverse.
        hmacs = _entries(header, "v1") if self._keys else []
        ed25519s = _entries(header, "v1a") if self._public_keys else []
        if not hmacs and not ed25519s:
            wanted = " or ".join(
                v for v, keys in (("v1", self._keys), ("v1a", self._public_keys)) if keys
            )
            raise self.reject(f"malformed signature header: no {wanted} signature")
        self.check_timestamp(timestamp)
        signed = (msg_id.encode(), b".", timestamp.encode(), b".", delivery.body)
        expected = (base64.b64encode(hmac_sha256(key, *signed)) for key in self._keys)
        if hmacs and any_match(expected, [s.encode("ascii", "replace") for s in hmacs]):
            return
        if ed25519s and self._ed25519_matches(b"".join(signed), ed25519s):
            return
        tried = [v for v, entries in (("v1", hmacs), ("v1a", ed25519s)) if entries]
        raise self.reject(f"no {' or '.join(tried)} signature matches")

    def _ed25519_matches(self, message: bytes, entries: list[str]) -> bool:
        # A signature made with a public key reveals nothing about a secret,
        # so no constant-time comparison is needed here: verification is
        # the library's. A sender rotating keys sends two or three entries;
        # past a few, a header is someone making the receiver burn CPU.
        for entry in entries[:_MAX_V1A_ENTRIES]:
            try:
                signature = base64.b64decode(entry, validate=True)
            except (binascii.Error, ValueError):
                continue
            if len(signature) != 64:
                continue
            if any(ed25519_verifies(key, signature, message) for key in self._public_keys):
                return True
        return False

    def sign(
        self,
        body: bytes,
        *,
        timestamp: int | None = None,
        delivery_id: str | None = None,
        query: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """``webhook-*`` headers (the standard's names; Svix sends ``svix-*``):
        a ``v1`` signature with a first ``whsec_`` secret, a ``v1a`` one with a
        first ``whsk_`` key. A first ``whpk_`` key cannot sign (only the sender
        holds its secret half)."""
        msg_id = delivery_id or new_delivery_id("msg_")
        t = str(self.now(timestamp))
        parts = (msg_id.encode(), b".", t.encode(), b".", body)
        first = self.secrets[0]
        if first.startswith("whpk_"):
            raise ConfigurationError(
                "standardwebhooks: cannot sign with a public key (whpk_); "
                "configure the whsk_ secret key first to sign test deliveries"
            )
        if first.startswith("whsk_"):
            key = ed25519_private_key(_decode_secret(first), "standardwebhooks v1a key")
            signature = "v1a," + base64.b64encode(key.sign(b"".join(parts))).decode()
        else:
            signature = "v1," + base64.b64encode(hmac_sha256(self._keys[0], *parts)).decode()
        return {"webhook-id": msg_id, "webhook-timestamp": t, "webhook-signature": signature}

    def identify(self, delivery: Delivery) -> EventInfo:
        header = f"{self._prefix(delivery)}-id"
        msg_id = delivery.headers.get(header)
        data = json_object(delivery)
        return EventInfo(as_event_id(msg_id, f"{header} header"), optional_text(data.get("type")))
