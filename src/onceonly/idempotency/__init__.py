"""Idempotency-Key for your own API: ASGI and WSGI middleware backed by the onceonly store."""

from __future__ import annotations

from .keys import ClientScope, InvalidKey, by_header, fingerprint, parse_key, public_scope
from .middleware import DEFAULT_RELEASE_STATUSES, IdempotencyMiddleware
from .records import StoredResponse
from .wsgi import EnvironScope, WSGIIdempotencyMiddleware

__all__ = [
    "DEFAULT_RELEASE_STATUSES",
    "ClientScope",
    "EnvironScope",
    "IdempotencyMiddleware",
    "InvalidKey",
    "StoredResponse",
    "WSGIIdempotencyMiddleware",
    "by_header",
    "fingerprint",
    "parse_key",
    "public_scope",
]
