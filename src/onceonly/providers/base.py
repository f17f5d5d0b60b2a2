"""The provider interface: verify a delivery's signature, then say which event it is.

A provider is a small class. Adding one is one file: subclass :class:`Provider`,
implement :meth:`Provider.verify` and :meth:`Provider.identify` (and
:meth:`Provider.sign`, so the fake gateway and tests can send it deliveries),
and register it in :data:`onceonly.providers.PROVIDER_CLASSES` under its route
name.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import hmac
import secrets as _random
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, tzinfo
from typing import Any, ClassVar, Literal, Self

from .. import jsontext
from .._exceptions import ConfigurationError, PayloadError, SignatureError
from ..events import Delivery, EventInfo

__all__ = [
    "TYPE_SIGNED_HEADER",
    "UNVERIFIED",
    "Clock",
    "Provider",
    "TimestampedProvider",
    "UnsignedPolicy",
    "is_unverified",
]

Clock = Callable[[], float]

#: What to do with a delivery its sender does not sign at all (Mercado Pago QR
#: and legacy IPN notifications, PagSeguro's legacy form post): ``"reject"`` it,
#: or accept it only as a trigger to ``"fetch"`` the real state from the API.
UnsignedPolicy = Literal["reject", "fetch"]
UNSIGNED_POLICIES: tuple[UnsignedPolicy, ...] = ("reject", "fetch")

#: Prefix of the event id and event type of a delivery accepted unsigned (the
#: ``fetch`` policy). On the type, it keeps handlers registered for the signed
#: types (``payment.updated``) from running on it; on the id, it keeps an
#: unsigned delivery from ever taking the id of a signed event, which would make
#: the real one a "duplicate". The stored headers also say
#: ``onceonly-verified: false``.
UNVERIFIED = "unverified:"


#: Stored header (``"false"``) on an event whose type comes from a header the
#: sender does not sign (GitHub's ``X-GitHub-Event``, Shopify's
#: ``X-Shopify-Topic``): anyone holding one signed body can send it under
#: another type. Handlers must not let the type decide anything of value; they
#: read the object's state from the body (signed) or from the API.
TYPE_SIGNED_HEADER = "onceonly-type-signed"


def is_unverified(event_type: str | None) -> bool:
    """True for the type of an event accepted without a signature: only its
    object id may be used, to fetch the real state from the provider's API."""
    return event_type is not None and event_type.startswith(UNVERIFIED)


class Provider(ABC):
    """Verifies and identifies deliveries from one sender.

    `secrets` holds every secret accepted at once, so a secret can be rotated
    without losing deliveries signed with the old one. `rejection_status` is the
    HTTP status for a bad signature (401 by default; some senders expect
    another).
    """

    #: The route and environment name, e.g. ``stripe`` for ``/webhooks/stripe``
    #: and ``ONCEONLY_STRIPE_SECRET``.
    name: ClassVar[str]

    #: Provider-specific keyword options that :meth:`from_environ` reads from
    #: ``ONCEONLY_<NAME>_<OPTION>``: ``(option, parser)`` pairs, the parser
    #: called as ``parser(raw, variable_name)``.
    environ_options: ClassVar[tuple[tuple[str, Callable[[str, str], Any]], ...]] = ()

    #: True for a provider made by :meth:`for_tenants`: it has no secret of
    #: its own and takes deliveries only at ``/{route}/{tenant}``. (A class
    #: default too, for subclasses whose ``__init__`` does not call ours.)
    tenants_only: bool = False

    def __init__(self, secrets: Sequence[str] | str, *, rejection_status: int = 401) -> None:
        if isinstance(secrets, str):
            secrets = [secrets]
        cleaned = [s.strip() for s in secrets if s.strip()]
        if not cleaned:
            raise ConfigurationError(f"provider {self.name!r} needs at least one secret")
        if not 400 <= rejection_status <= 499:
            raise ConfigurationError(
                f"provider {self.name!r}: rejection_status must be a 4xx code, "
                f"got {rejection_status}"
            )
        self.secrets: tuple[str, ...] = tuple(cleaned)
        self.rejection_status = rejection_status

    @classmethod
    def for_tenants(cls, **options: Any) -> Self:
        """This provider with no secret of its own, for a deployment where each
        merchant has theirs: deliveries are taken only at
        ``/webhooks/{route}/{tenant}``, verified with the secrets the tenant
        resolver gives (see :class:`~onceonly.Tenants`); the tenant-less route
        answers 404. `options` are the class's own keywords (``tolerance``, ...).
        """
        # A random secret nobody knows stands in, so that even a check
        # forgotten somewhere could not make this provider accept anything.
        provider = cls(cls._unguessable_secret(), **options)
        provider.tenants_only = True
        return provider

    @classmethod
    def _unguessable_secret(cls) -> str:
        return _random.token_hex(32)

    def with_secrets(self, secrets: Sequence[str] | str) -> Self:
        """A copy of this provider (same options) that accepts `secrets` only:
        one merchant's verifier, built from the deployment's template."""
        twin = copy.copy(self)
        twin._use_secrets(secrets)
        twin.tenants_only = False
        return twin

    def _use_secrets(self, secrets: Sequence[str] | str) -> None:
        """Replace the secrets (subclasses that derive keys from them extend this)."""
        if isinstance(secrets, str):
            secrets = [secrets]
        cleaned = tuple(s.strip() for s in secrets if s.strip())
        if not cleaned:
            raise ConfigurationError(f"provider {self.name!r} needs at least one secret")
        self.secrets = cleaned

    @abstractmethod
    def verify(self, delivery: Delivery) -> None:
        """Raise :class:`SignatureError` unless the delivery is authentic."""

    @abstractmethod
    def identify(self, delivery: Delivery) -> EventInfo:
        """Return the event id and type; raise :class:`PayloadError` when there is none."""

    def sign(
        self,
        body: bytes,
        *,
        timestamp: int | None = None,
        delivery_id: str | None = None,
        query: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """The lower-case headers that make `body` an authentic delivery.

        Signed with the first secret, exactly as the sender signs it, so that
        ``verify(Delivery(name, body, sign(body), query))`` passes. `timestamp`
        (Unix seconds) defaults to the provider's clock and matters only where
        the sender signs one. `delivery_id` goes where the sender puts an id in
        a header (``webhook-id``, ``x-github-delivery``, ``x-shopify-webhook-id``,
        ``x-request-id``); a random one is made when it is ``None``. `query` is
        the query string the delivery will be posted with, for senders that
        sign part of it (Mercado Pago's ``data.id``).

        The fake gateway (``onceonly dev send``) and tests use this; a custom
        provider that does not override it cannot be sent deliveries by them.
        """
        raise NotImplementedError(f"provider {self.name!r} does not implement sign()")

    def sign_query(self, query: Mapping[str, str] | None = None) -> dict[str, str]:
        """The query string a delivery is posted with, given the event's own:
        what a sender that authenticates in the URL adds to it (Efí's
        ``?hmac=``), with the first secret. Default: `query` unchanged.

        The fake gateway posts every delivery with this next to :meth:`sign`'s
        headers.
        """
        return dict(query or {})

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], secrets: Sequence[str]) -> Self:
        """Build the provider from ``ONCEONLY_<NAME>_*`` variables."""
        return cls(secrets, **cls._common_options(environ))

    @classmethod
    def _common_options(cls, environ: Mapping[str, str]) -> dict[str, Any]:
        options: dict[str, Any] = {}
        raw = environ.get(env_name(cls.name, "REJECTION_STATUS"))
        if raw:
            options["rejection_status"] = parse_int(raw, env_name(cls.name, "REJECTION_STATUS"))
        for option, parse in cls.environ_options:
            variable = env_name(cls.name, option.upper())
            raw = environ.get(variable)
            if raw:
                options[option] = parse(raw, variable)
        return options

    # Helpers shared by the concrete providers.

    def reject(self, detail: str) -> SignatureError:
        return SignatureError(detail, status=self.rejection_status)

    def require_header(self, delivery: Delivery, *names: str) -> str:
        for name in names:
            value = delivery.headers.get(name)
            if value:
                return value
        raise self.reject(f"missing {' or '.join(names)} header")


class TimestampedProvider(Provider):
    """A provider whose signature covers a timestamp, checked against a tolerance.

    The tolerance applies in both directions: a timestamp too far in the future
    is as suspicious as a stale one. A tolerance of 0 disables the check (not
    recommended: it re-opens replay of captured deliveries).
    """

    default_tolerance: ClassVar[int] = 300

    def __init__(
        self,
        secrets: Sequence[str] | str,
        *,
        tolerance: int | None = None,
        rejection_status: int = 401,
        clock: Clock = time.time,
    ) -> None:
        super().__init__(secrets, rejection_status=rejection_status)
        self.tolerance = self.default_tolerance if tolerance is None else tolerance
        if self.tolerance < 0:
            raise ConfigurationError(f"provider {self.name!r}: tolerance must be >= 0")
        self.clock = clock

    @classmethod
    def _common_options(cls, environ: Mapping[str, str]) -> dict[str, Any]:
        options = super()._common_options(environ)
        raw = environ.get(env_name(cls.name, "TOLERANCE"))
        if raw:
            options["tolerance"] = parse_int(raw, env_name(cls.name, "TOLERANCE"))
        return options

    def now(self, timestamp: int | None = None) -> int:
        """`timestamp`, or the provider clock's current second when it is ``None``."""
        return int(self.clock()) if timestamp is None else timestamp

    def check_timestamp(self, raw: str) -> int:
        try:
            timestamp = int(raw)
        except ValueError:
            raise self.reject(f"malformed timestamp {raw[:40]!r}") from None
        # Integer arithmetic: a 400-digit timestamp must be "out of tolerance",
        # not an OverflowError (a float clock minus a huge int overflows).
        if self.tolerance and abs(int(self.clock()) - timestamp) > self.tolerance:
            raise self.reject(f"timestamp {timestamp} is outside the {self.tolerance} s tolerance")
        return timestamp


def parse_unsigned_policy(raw: str, what: str) -> UnsignedPolicy:
    value = raw.strip().lower()
    for policy in UNSIGNED_POLICIES:
        if value == policy:
            return policy
    raise ConfigurationError(f"{what} must be 'reject' or 'fetch', got {raw!r}")


def new_delivery_id(prefix: str = "") -> str:
    """A random delivery id for :meth:`Provider.sign` when the caller gives none."""
    return prefix + str(uuid.uuid4())


def env_name(provider: str, suffix: str) -> str:
    return f"ONCEONLY_{provider.upper().replace('-', '_')}_{suffix}"


def parse_int(raw: str, what: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(f"{what} must be an integer, got {raw!r}") from None


@functools.lru_cache(maxsize=1024)
def _keyed_sha256(key: bytes) -> hmac.HMAC:
    """HMAC-SHA256 keyed with `key` and fed nothing, to be copied for each
    message: the key is hashed into the HMAC's pads once, not per delivery
    (1.7 us a signature instead of 3.1 us, measured on a 479-byte body).
    Never updated itself, so threads may copy it at once."""
    return hmac.new(key, digestmod=hashlib.sha256)


def hmac_sha256(key: bytes, *parts: bytes) -> bytes:
    mac = _keyed_sha256(key).copy()
    for part in parts:
        mac.update(part)
    return mac.digest()


def any_match(expected: Iterable[bytes], given: Iterable[bytes]) -> bool:
    """Constant-time comparison of every (expected, given) pair.

    Every pair is compared even after a match, so the time taken does not tell
    which secret or which signature matched.
    """
    given = list(given)
    matched = False
    for exp in expected:
        for candidate in given:
            matched |= hmac.compare_digest(exp, candidate)
    return matched


def sha256_hex(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return digest.hexdigest()


def body_hash_id(body: bytes) -> str:
    """A deterministic event id for a body that carries none: a resend of the
    same bytes dedupes, any change in them is a new event."""
    return "sha256:" + sha256_hex(body)


def json_object(delivery: Delivery) -> dict[str, Any]:
    """The body as a JSON object, or a :class:`PayloadError` saying why not."""
    try:
        data = jsontext.loads(delivery.body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadError(f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise PayloadError("body is JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise PayloadError("body is JSON but not an object")
    return data


@functools.lru_cache(maxsize=256)
def _steps(dotted: str) -> tuple[str, ...]:
    # The paths are the providers' own constants: split each once.
    return tuple(dotted.split("."))


def lookup(data: Mapping[str, Any], dotted: str) -> Any:
    """``lookup({"data": {"id": 1}}, "data.id") == 1``; ``None`` when a step is missing."""
    current: Any = data
    for step in _steps(dotted):
        if not isinstance(current, Mapping) or step not in current:
            return None
        current = current[step]
    return current


def as_event_id(value: Any, where: str) -> str:
    """Event ids are strings; numbers are accepted and kept as their decimal text."""
    if isinstance(value, bool) or value is None:
        raise PayloadError(f"no event id at {where}")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value.strip():
        if len(value) > 255:
            raise PayloadError(f"event id at {where} is longer than 255 characters")
        return value
    raise PayloadError(f"no usable event id at {where}")


def optional_text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def object_text(value: Any) -> str | None:
    """An object's id as text (numbers as their decimal text), or ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    return optional_text(value)


def moment(value: Any, *, zone: tzinfo = UTC) -> datetime | None:
    """A provider's creation time: Unix seconds, or ISO 8601 text (a time
    without an offset is in `zone`); ``None`` for anything else, never an
    error: the time only orders an object's events."""
    if isinstance(value, bool):
        return None
    try:
        if isinstance(value, (int, float)):  # a tuple: no union object built per call
            return datetime.fromtimestamp(value, UTC)
        if isinstance(value, str) and value:
            parsed = datetime.fromisoformat(value)
            return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=zone)
    except (ValueError, OverflowError, OSError):
        return None
    return None
