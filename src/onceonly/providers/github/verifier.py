"""GitHub: ``X-Hub-Signature-256: sha256=<hex>``, HMAC-SHA256 over the raw body.

Only the body is signed: not ``X-GitHub-Delivery``, not ``X-GitHub-Event``, and
nothing time-based (so there is no timestamp tolerance). The event id is
therefore ``sha256:<hex of the raw body>``: a captured delivery replayed with
another delivery GUID or another event header is a duplicate, never a new
event. A "Redeliver" from GitHub sends the same payload (and the same GUID), so
it dedupes too. The GUID stays visible in the stored ``x-github-delivery``
header. The type is the ``X-GitHub-Event`` header, unsigned: the stored header
``onceonly-type-signed: false`` says so. The body is not parsed: GitHub can
also send form-encoded payloads, and the raw bytes are stored either way.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...events import Delivery, EventInfo
from ..base import (
    TYPE_SIGNED_HEADER,
    Provider,
    any_match,
    body_hash_id,
    hmac_sha256,
    new_delivery_id,
)

__all__ = ["GitHub"]


class GitHub(Provider):
    name = "github"

    def verify(self, delivery: Delivery) -> None:
        header = self.require_header(delivery, "x-hub-signature-256")
        algorithm, sep, signature = header.strip().partition("=")
        if not sep or algorithm != "sha256" or not signature:
            raise self.reject("malformed X-Hub-Signature-256 header: expected sha256=<hex>")
        expected = (hmac_sha256(s.encode(), delivery.body).hex().encode() for s in self.secrets)
        if not any_match(expected, [signature.lower().encode("ascii", "replace")]):
            raise self.reject("signature does not match")

    def sign(
        self,
        body: bytes,
        *,
        timestamp: int | None = None,
        delivery_id: str | None = None,
        query: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        # GitHub signs no timestamp; the event type (X-GitHub-Event) is the
        # caller's to add.
        return {
            "x-hub-signature-256": "sha256=" + hmac_sha256(self.secrets[0].encode(), body).hex(),
            "x-github-delivery": delivery_id or new_delivery_id(),
        }

    def identify(self, delivery: Delivery) -> EventInfo:
        return EventInfo(
            body_hash_id(delivery.body),
            delivery.headers.get("x-github-event") or None,
            {TYPE_SIGNED_HEADER: "false"},
        )
