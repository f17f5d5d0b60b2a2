"""Idempotency-Key for your own API: ASGI middleware backed by the onceonly store."""

from __future__ import annotations

from .keys import ClientScope, InvalidKey, by_header, fingerprint, parse_key, public_scope
from .middleware import DEFAULT_RELEASE_STATUSES, IdempotencyMiddleware
from .records import StoredResponse

__all__ = [
    "DEFAULT_RELEASE_STATUSES",
    "ClientScope",
    "IdempotencyMiddleware",
    "InvalidKey",
    "StoredResponse",
    "by_header",
    "fingerprint",
    "parse_key",
    "public_scope",
]
