"""Every error onceonly raises derives from :class:`OnceonlyError`.

The hierarchy::

    OnceonlyError
    ├── ConfigurationError       bad settings, unknown provider class, bad URL
    ├── DeliveryRejected         a webhook delivery that must not be stored
    │   ├── SignatureError       missing, malformed or wrong signature; stale timestamp
    │   ├── PayloadError         body not parseable, no event id
    │   ├── UnknownProvider      no provider configured under that name
    │   └── BodyTooLarge         body over the configured limit
    └── StoreError               the database did something unexpected
        └── StoreUnavailable     the database cannot be reached right now (retry later)

Driver exceptions (sqlite3, asyncpg) never cross the store adapters: each adapter
translates them, so the receiver can answer 503 for "try again" without knowing
which engine is underneath.
"""

from __future__ import annotations

__all__ = [
    "BodyTooLarge",
    "ConfigurationError",
    "DeliveryRejected",
    "OnceonlyError",
    "PayloadError",
    "SignatureError",
    "StoreError",
    "StoreUnavailable",
    "UnknownProvider",
]


class OnceonlyError(Exception):
    """Root of every onceonly error."""


class ConfigurationError(OnceonlyError):
    """The configuration (environment, `--app` object, URL) is invalid."""


class DeliveryRejected(OnceonlyError):
    """A webhook delivery that is refused and not stored.

    `status` is the HTTP status the receiver answers with; `reason` is a short
    machine-readable word (also used as the problem type).
    """

    status: int = 400
    reason: str = "rejected"

    def __init__(self, detail: str, *, status: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if status is not None:
            self.status = status


class SignatureError(DeliveryRejected):
    """The signature is missing, malformed, wrong, or its timestamp is out of tolerance."""

    status = 401
    reason = "signature"


class PayloadError(DeliveryRejected):
    """The body cannot be parsed, or it names no event id."""

    status = 400
    reason = "payload"


class UnknownProvider(DeliveryRejected):
    """No provider is configured under the name in the URL."""

    status = 404
    reason = "unknown-provider"


class BodyTooLarge(DeliveryRejected):
    """The body is larger than the configured limit."""

    status = 413
    reason = "too-large"


class StoreError(OnceonlyError):
    """The database failed in a way that is not a plain outage."""


class StoreUnavailable(StoreError):
    """The database cannot be reached now; the caller should retry later."""
