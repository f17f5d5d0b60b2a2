"""A generic HMAC-SHA256 sender, for anything that signs the raw body.

Configure which header carries the signature, whether it is hex or base64, an
optional prefix before it (``sha256=``), and where the event id and type live:
``header:<Name>`` or ``body:<dotted.path>`` in a JSON body.

Environment: ``ONCEONLY_HMAC_SECRET``, ``ONCEONLY_HMAC_HEADER`` (default
``X-Signature``), ``ONCEONLY_HMAC_ENCODING`` (``hex`` or ``base64``),
``ONCEONLY_HMAC_PREFIX``, ``ONCEONLY_HMAC_EVENT_ID`` (default ``body:id``),
``ONCEONLY_HMAC_EVENT_TYPE`` (default ``body:type``).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Self

from ..._exceptions import ConfigurationError
from ...events import Delivery, EventInfo
from ..base import (
    Provider,
    any_match,
    as_event_id,
    env_name,
    hmac_sha256,
    json_object,
    lookup,
    new_delivery_id,
    optional_text,
)

__all__ = ["HMAC"]

Encoding = Literal["hex", "base64"]


def _location(spec: str, what: str) -> tuple[str, str]:
    kind, sep, where = spec.partition(":")
    if not sep or kind not in ("header", "body") or not where:
        raise ConfigurationError(
            f"{what} must be 'header:<Name>' or 'body:<dotted.path>', got {spec!r}"
        )
    return kind, where.lower() if kind == "header" else where


class HMAC(Provider):
    name = "hmac"

    def __init__(
        self,
        secrets: Sequence[str] | str,
        *,
        header: str = "X-Signature",
        encoding: Encoding = "hex",
        prefix: str = "",
        event_id: str = "body:id",
        event_type: str | None = "body:type",
        rejection_status: int = 401,
    ) -> None:
        super().__init__(secrets, rejection_status=rejection_status)
        if encoding not in ("hex", "base64"):
            raise ConfigurationError(f"hmac encoding must be 'hex' or 'base64', got {encoding!r}")
        self.header = header.lower()
        self.encoding: Encoding = encoding
        self.prefix = prefix
        self.event_id = _location(event_id, "event_id")
        self.event_type = _location(event_type, "event_type") if event_type else None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], secrets: Sequence[str]) -> Self:
        options: dict[str, Any] = cls._common_options(environ)
        for option in ("header", "encoding", "prefix", "event_id", "event_type"):
            value = environ.get(env_name(cls.name, option.upper()))
            if value is not None:
                options[option] = value
        return cls(secrets, **options)

    def _encode(self, digest: bytes) -> bytes:
        return digest.hex().encode() if self.encoding == "hex" else base64.b64encode(digest)

    def verify(self, delivery: Delivery) -> None:
        value = self.require_header(delivery, self.header).strip()
        if self.prefix:
            if not value.startswith(self.prefix):
                raise self.reject(f"signature header does not start with {self.prefix!r}")
            value = value[len(self.prefix) :]
        if self.encoding == "hex":
            value = value.lower()
        expected = (self._encode(hmac_sha256(s.encode(), delivery.body)) for s in self.secrets)
        if not any_match(expected, [value.encode("ascii", "replace")]):
            raise self.reject("signature does not match")

    def sign(
        self,
        body: bytes,
        *,
        timestamp: int | None = None,
        delivery_id: str | None = None,
        query: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """The signature header; plus the event id header when the id is read from one."""
        digest = hmac_sha256(self.secrets[0].encode(), body)
        headers = {self.header: self.prefix + self._encode(digest).decode()}
        kind, where = self.event_id
        if kind == "header":
            headers[where] = delivery_id or new_delivery_id()
        return headers

    def identify(self, delivery: Delivery) -> EventInfo:
        locations = [self.event_id] + ([self.event_type] if self.event_type else [])
        # Parse the body only when an id or type lives in it: a sender that puts
        # both in headers may send any content type.
        body = json_object(delivery) if any(k == "body" for k, _ in locations) else {}

        def find(location: tuple[str, str]) -> Any:
            kind, where = location
            return delivery.headers.get(where) if kind == "header" else lookup(body, where)

        event_id = as_event_id(find(self.event_id), ":".join(self.event_id))
        event_type = optional_text(find(self.event_type)) if self.event_type else None
        return EventInfo(event_id, event_type)
