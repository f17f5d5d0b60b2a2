"""Every error onceonly raises derives from :class:`OnceonlyError`.

The hierarchy::

    OnceonlyError
    ├── ConfigurationError       bad settings, unknown provider class, bad URL
    │   └── ImportSetupError     file, table, key and import options cannot work together
    │       └── FileFormatError  the file cannot be read as CSV or XLSX
    ├── DeliveryRejected         a webhook delivery that must not be stored
    │   ├── SignatureError       missing, malformed or wrong signature; stale timestamp
    │   ├── PayloadError         body not parseable, no event id
    │   ├── UnknownProvider      no provider configured under that name
    │   ├── UnknownTenant        no such tenant (merchant account) for that provider
    │   ├── BodyTooLarge         body over the configured limit
    │   ├── HeadersTooLarge      request headers over the configured limit
    │   └── BodyTimeout          the body did not arrive in time
    ├── StoreError               the database did something unexpected
    │   ├── StoreUnavailable     the database cannot be reached right now (retry later)
    │   └── StoreRejected        the database refused a value of this item (retrying won't help)
    ├── TenantUnavailable        the tenant resolver failed (retry later)
    ├── PayloadPurged            replay of an event whose payload `purge` dropped
    ├── ApiError                 a provider's API answered with an error (4xx, bad body)
    │   └── ApiUnavailable       its API cannot be reached or kept failing (retry later)
    ├── NotFetchable             the event names no object of the kind asked for
    ├── EffectError              an effect's outcome cannot be recorded (not JSON)
    ├── LeaseLost                another worker owns the event now
    ├── RetryLater               raised by a handler: run the event again later, no attempt spent
    ├── NonRetryable             raised by a handler: no retry can succeed, the event is dead now
    ├── JobInProgress            another live caller runs this job key now
    ├── JobConflict              the job key was recorded for other arguments
    ├── InvalidKey               an Idempotency-Key header that is no usable key (a ValueError too)
    └── InvalidValue             an imported value that cannot be a key or fit its column
                                 (a ValueError too)

Every class is defined here and nowhere else; the modules that raise them
(guard, context, worker, idempotency.keys, importer.errors) import them from
here and keep their old names importable. This module imports nothing from
onceonly, so any module can import it without an import cycle.

Driver exceptions (sqlite3, asyncpg) never cross the store adapters: each adapter
translates them, so the receiver can answer 503 for "try again" without knowing
which engine is underneath.
"""

from __future__ import annotations

__all__ = [
    "ApiError",
    "ApiUnavailable",
    "BodyTimeout",
    "BodyTooLarge",
    "ConfigurationError",
    "DeliveryRejected",
    "EffectError",
    "FileFormatError",
    "HeadersTooLarge",
    "ImportSetupError",
    "InvalidKey",
    "InvalidValue",
    "JobConflict",
    "JobInProgress",
    "LeaseLost",
    "NonRetryable",
    "NotFetchable",
    "OnceonlyError",
    "PayloadError",
    "PayloadPurged",
    "RetryLater",
    "SignatureError",
    "StoreError",
    "StoreRejected",
    "StoreUnavailable",
    "TenantUnavailable",
    "UnknownProvider",
    "UnknownTenant",
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


class UnknownTenant(DeliveryRejected):
    """The tenant in ``/webhooks/{provider}/{tenant}`` is not a valid name, or
    the tenant resolver knows no such merchant account for that provider."""

    status = 404
    reason = "unknown-tenant"


class BodyTooLarge(DeliveryRejected):
    """The body is larger than the configured limit."""

    status = 413
    reason = "too-large"


class HeadersTooLarge(DeliveryRejected):
    """The request's headers together are larger than the configured limit."""

    status = 431
    reason = "headers-too-large"


class BodyTimeout(DeliveryRejected):
    """The sender did not finish sending the body within the configured time."""

    status = 408
    reason = "body-timeout"


class StoreError(OnceonlyError):
    """The database failed in a way that is not a plain outage."""


class StoreUnavailable(StoreError):
    """The database cannot be reached now; the caller should retry later."""


class StoreRejected(StoreError):
    """The database refused a value of this item (an encoding it cannot hold,
    a size over one of its limits): the same item will be refused again, and
    other items are not concerned."""


class TenantUnavailable(OnceonlyError):
    """The tenant resolver raised (its database is down, its API timed out):
    the receiver answers 503 with ``Retry-After``, so the sender keeps the
    delivery and sends it again."""


class PayloadPurged(OnceonlyError):
    """The event cannot be replayed: ``onceonly purge`` dropped its body and
    headers, and running its handler on an empty body would be wrong."""


class ApiError(OnceonlyError):
    """A provider's API refused a request or answered something unusable.

    `status` is the HTTP status (``None`` when no answer came), `body` a short
    excerpt of the answer, `provider` the client's provider name. No credential
    ever appears in the message. A handler that raises it fails its attempt, and
    the worker retries the event later.
    """

    def __init__(
        self, message: str, *, provider: str, status: int | None = None, body: str = ""
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.status = status
        self.body = body


class ApiUnavailable(ApiError):
    """The API could not be reached, timed out, or kept answering 5xx/429 after
    every retry: the object's real state is unknown now; try again later."""


class NotFetchable(OnceonlyError):
    """``ctx.fetch(kind)`` on an event that names no object of that kind, or
    whose id cannot be a real one (it is never sent to the API)."""


class ImportSetupError(ConfigurationError):
    """The import cannot start: no such table, a key without a unique
    constraint, a header that maps nowhere, a NOT NULL column the file lacks."""


class FileFormatError(ImportSetupError):
    """The file is not a CSV or XLSX we can read (an old .xls, an unknown
    encoding, no header row)."""


class InvalidValue(OnceonlyError, ValueError):
    """One cell that cannot go into its column. The message is the reason a
    person reads next to the line number, so it names the problem, not the code."""


class EffectError(OnceonlyError):
    """An effect's outcome could not be recorded (it must be JSON-serialisable)."""


class LeaseLost(OnceonlyError):
    """Another worker owns the event now; this one must not commit anything."""


#: The longest deferral :class:`RetryLater` accepts: past it, a retention purge
#: or a forgotten event is likelier than a useful retry.
MAX_RETRY_LATER = 30 * 86400.0


class RetryLater(OnceonlyError):
    """Raised by a handler: not now, try this event again in `seconds`.

    The attempt's writes roll back, as for any exception, but it is not a
    failure: the attempt count is given back, so deferring never brings the
    event closer to ``dead``. `seconds` (a number; ``delta.total_seconds()``
    for a :class:`~datetime.timedelta`) must be above 0 and at most 30 days;
    anything else raises :class:`ValueError` where the handler builds it (and
    that error, like any other, fails the attempt).
    """

    def __init__(self, seconds: float, reason: str = "") -> None:
        value = seconds
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"RetryLater takes seconds as a number, not {value!r}")
        if not 0 < value <= MAX_RETRY_LATER:  # also refuses NaN
            raise ValueError(
                f"RetryLater seconds must be above 0 and at most {MAX_RETRY_LATER:.0f} "
                f"(30 days), not {value!r}"
            )
        self.seconds = float(value)
        self.reason = reason
        super().__init__(f"retry in {self.seconds:g} s" + (f": {reason}" if reason else ""))


class NonRetryable(OnceonlyError):
    """Raised by a handler: this event can never succeed (a payload the
    application refuses, an object that does not exist); it goes to ``dead``
    at once instead of spending its remaining attempts. Chain the cause with
    ``raise NonRetryable("...") from exc`` to keep it in the traceback."""


class JobInProgress(OnceonlyError):
    """Another live caller is running this key now; retry later."""


class JobConflict(OnceonlyError):
    """The key was recorded for a call with other arguments: answering with that
    call's result would be wrong, and running again would break the key's promise."""


class InvalidKey(OnceonlyError, ValueError):
    """The header is present but is not a usable key.

    Also a ValueError, as it was before it joined onceonly's root, so code that
    catches ``ValueError`` around :func:`~onceonly.idempotency.parse_key` still works."""
