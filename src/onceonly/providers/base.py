"""The provider interface: verify a delivery's signature, then say which event it is.

A provider is a small class. Adding one is one file: subclass :class:`Provider`,
implement :meth:`Provider.verify` and :meth:`Provider.identify`, and register it
in :data:`onceonly.providers.PROVIDER_CLASSES` under its route name.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Self

from .._exceptions import ConfigurationError, PayloadError, SignatureError
from ..events import Delivery, EventInfo

__all__ = ["Clock", "Provider", "TimestampedProvider"]

Clock = Callable[[], float]


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

    @abstractmethod
    def verify(self, delivery: Delivery) -> None:
        """Raise :class:`SignatureError` unless the delivery is authentic."""

    @abstractmethod
    def identify(self, delivery: Delivery) -> EventInfo:
        """Return the event id and type; raise :class:`PayloadError` when there is none."""

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


def env_name(provider: str, suffix: str) -> str:
    return f"ONCEONLY_{provider.upper().replace('-', '_')}_{suffix}"


def parse_int(raw: str, what: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(f"{what} must be an integer, got {raw!r}") from None


def hmac_sha256(key: bytes, *parts: bytes) -> bytes:
    mac = hmac.new(key, digestmod=hashlib.sha256)
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


def json_object(delivery: Delivery) -> dict[str, Any]:
    """The body as a JSON object, or a :class:`PayloadError` saying why not."""
    try:
        data = json.loads(delivery.body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadError(f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise PayloadError("body is JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise PayloadError("body is JSON but not an object")
    return data


def lookup(data: Mapping[str, Any], dotted: str) -> Any:
    """``lookup({"data": {"id": 1}}, "data.id") == 1``; ``None`` when a step is missing."""
    current: Any = data
    for step in dotted.split("."):
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
