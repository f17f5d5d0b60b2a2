"""Settings: frozen, validated values, read once from code or the environment.

:class:`Settings` is what one deployment is configured with; it is split into
the slices each component needs (:class:`ReceiverSettings`,
:class:`WorkerSettings`, :class:`RetentionSettings`,
:class:`DashboardSettings`), so a component can be given its slice instead of
the whole application. Every slice validates itself when it is built, also
through :meth:`Settings.replace`, so no value can skip the checks, and an
explicit zero is checked like any other value instead of being taken for
"not given" (``max_attempts=0`` is refused, not silently made 10).

The environment variables are listed in :mod:`onceonly.config`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ._exceptions import ConfigurationError
from .retention import DEFAULT_RETENTION_IDS, DEFAULT_RETENTION_PAYLOADS, duration

__all__ = [
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_DATABASE_URL",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_HEADER_BYTES",
    "DashboardSettings",
    "ReceiverSettings",
    "RetentionSettings",
    "Settings",
    "WorkerSettings",
]

# Written here rather than imported from the store package so that settings
# stay a leaf module; tests/unit/test_settings.py checks both agree.
DEFAULT_DATABASE_URL = "sqlite:///onceonly.db"
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
#: Every provider's headers fit in a few KiB (Stripe's signature header with
#: several v1 entries included); 32 KiB leaves room for proxies' additions.
DEFAULT_MAX_HEADER_BYTES = 32 * 1024
#: Providers send a webhook's body at once; a sender still trickling after
#: this many seconds holds a connection open for nothing.
DEFAULT_BODY_TIMEOUT = 10.0
#: An outbox row's claim must outlast a runner's wait for the database (on
#: SQLite a mark can wait busy_timeout, 5 s, for the write lock, and a second
#: runner that got the lock first would send again), so by default it is at
#: least this long however short the event lease; it costs only the delay of a
#: crashed runner's sends.
MIN_DEFAULT_OUTBOX_LEASE = 30.0

_OFF = ("0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class ReceiverSettings:
    """What the webhook receiver accepts and how it answers when it cannot."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    #: Seconds announced with a 503.
    retry_after: int = 5

    def __post_init__(self) -> None:
        if self.max_body_bytes <= 0:
            raise ConfigurationError("max_body_bytes must be positive")
        if self.max_header_bytes <= 0:
            raise ConfigurationError("max_header_bytes must be positive")
        if self.body_timeout <= 0:
            raise ConfigurationError("body_timeout must be positive")
        if self.retry_after < 0:
            raise ConfigurationError("retry_after must be >= 0")


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """How events are claimed, retried and given up on."""

    max_attempts: int = 10
    lease_seconds: float = 30.0
    #: None: ``max(30, lease_seconds)`` (see MIN_DEFAULT_OUTBOX_LEASE).
    outbox_lease_seconds: float | None = None
    #: None: the engine's default, chosen by the worker (0: no bound).
    transaction_budget: float | None = None
    retry_base: float = 2.0
    retry_cap: float = 3600.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError("max_attempts must be at least 1")
        if self.lease_seconds <= 0:
            raise ConfigurationError("lease_seconds must be positive")
        if self.outbox_lease_seconds is None:
            # Frozen: the derived default is written once, here, so readers
            # never see None.
            object.__setattr__(
                self, "outbox_lease_seconds", max(MIN_DEFAULT_OUTBOX_LEASE, self.lease_seconds)
            )
        elif self.outbox_lease_seconds <= 0:
            raise ConfigurationError("outbox_lease_seconds must be positive")
        if self.transaction_budget is not None and self.transaction_budget < 0:
            raise ConfigurationError("transaction_budget must be >= 0 (0: no bound)")
        if self.retry_base < 0:
            raise ConfigurationError("retry_base must be >= 0")
        if self.retry_cap < 0:
            raise ConfigurationError("retry_cap must be >= 0")

    @property
    def outbox_lease(self) -> float:
        """`outbox_lease_seconds`, typed as always set."""
        assert self.outbox_lease_seconds is not None  # set in __post_init__
        return self.outbox_lease_seconds


@dataclass(frozen=True, slots=True)
class RetentionSettings:
    """What ``onceonly purge`` keeps by default."""

    payloads: timedelta = dataclasses.field(
        default_factory=lambda: duration(DEFAULT_RETENTION_PAYLOADS)
    )
    ids: timedelta = dataclasses.field(default_factory=lambda: duration(DEFAULT_RETENTION_IDS))

    def __post_init__(self) -> None:
        # duration() refuses negative values and turns "30d" into a timedelta.
        object.__setattr__(self, "payloads", duration(self.payloads, "retention_payloads"))
        object.__setattr__(self, "ids", duration(self.ids, "retention_ids"))


@dataclass(frozen=True, slots=True)
class DashboardSettings:
    """Where the dashboard lives, who may reach it and what it hides."""

    #: None: no dashboard.
    path: str | None = "/dashboard"
    token: str | None = None
    redact: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.path is not None:
            object.__setattr__(self, "path", dashboard_path(self.path))
        if self.token is not None and len(self.token) < 16:
            raise ConfigurationError(
                "the dashboard token must be at least 16 characters (try `openssl rand -hex 24`)"
            )
        object.__setattr__(self, "redact", _redact_fields(self.redact))


@dataclass(frozen=True, slots=True)
class Settings:
    """One deployment's settings; build with :meth:`from_environ`, change
    with :meth:`replace` (which returns new, validated settings)."""

    database_url: str = DEFAULT_DATABASE_URL
    metrics: bool = True
    receiver: ReceiverSettings = dataclasses.field(default_factory=ReceiverSettings)
    worker: WorkerSettings = dataclasses.field(default_factory=WorkerSettings)
    retention: RetentionSettings = dataclasses.field(default_factory=RetentionSettings)
    dashboard: DashboardSettings = dataclasses.field(default_factory=DashboardSettings)

    def __post_init__(self) -> None:
        if not self.database_url:
            raise ConfigurationError("database_url must not be empty")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None, **given: Any) -> Settings:
        """Settings from `given` (the flat names :class:`~onceonly.Onceonly`
        takes, ``None`` meaning "not given") over ``ONCEONLY_*`` variables
        over the defaults."""
        env = os.environ if environ is None else environ
        unknown = set(given) - set(FLAT_NAMES)
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}
        for name, (variable, parse) in _ENVIRON.items():
            value = given.get(name)
            if value == "" and name in _EMPTY_IS_UNSET:
                # As before: an empty URL, path or token means "not given".
                value = None
            if value is None:
                raw = env.get(variable)
                # An empty variable counts as unset, as it always has.
                if raw is not None and (raw.strip() or name == "dashboard_redact"):
                    value = parse(raw, variable)
            if value is not None:
                values[name] = value
        return cls().replace(**values)

    def replace(self, **changes: Any) -> Settings:
        """New settings with `changes` (flat names, as ``Onceonly`` takes them)."""
        unknown = set(changes) - set(FLAT_NAMES)
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
        slices: dict[str, dict[str, Any]] = {}
        top: dict[str, Any] = {}
        for name, value in changes.items():
            part, field = FLAT_NAMES[name]
            if part is None:
                top[field] = value
            else:
                slices.setdefault(part, {})[field] = value
        for part, fields in slices.items():
            top[part] = dataclasses.replace(getattr(self, part), **fields)
        return dataclasses.replace(self, **top)

    def flat(self, name: str) -> Any:
        """The value of one flat name (``"max_attempts"``, ``"dashboard_path"``, ...)."""
        part, field = FLAT_NAMES[name]
        holder = self if part is None else getattr(self, part)
        return getattr(holder, field)


def dashboard_path(raw: str) -> str | None:
    """``/dashboard`` style, or ``None`` for ``off``; never a path the receiver owns."""
    if raw.strip().lower() in (*_OFF, "none"):
        return None
    path = "/" + raw.strip().strip("/")
    if path == "/" or path.split("/")[1] in ("webhooks", "healthz", "metrics"):
        raise ConfigurationError(
            f"dashboard path {raw!r} must be a path of its own, such as /dashboard"
        )
    return path


def _redact_fields(raw: str | Sequence[str]) -> tuple[str, ...]:
    parts = raw.split(",") if isinstance(raw, str) else raw
    return tuple(p.strip() for p in parts if p.strip())


def _int(raw: str, what: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(f"{what} must be an integer, got {raw!r}") from None


def _float(raw: str, what: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ConfigurationError(f"{what} must be a number, got {raw!r}") from None


def _flag(raw: str, what: str) -> bool:
    return raw.strip().lower() not in _OFF


def _text(raw: str, what: str) -> str:
    return raw


def _fields(raw: str, what: str) -> tuple[str, ...]:
    return _redact_fields(raw)


#: Each flat name (the keyword ``Onceonly`` takes, and its attribute) and
#: where it lives: (slice or None for the top level, field).
FLAT_NAMES: dict[str, tuple[str | None, str]] = {
    "database_url": (None, "database_url"),
    "metrics": (None, "metrics"),
    "max_body_bytes": ("receiver", "max_body_bytes"),
    "max_header_bytes": ("receiver", "max_header_bytes"),
    "body_timeout": ("receiver", "body_timeout"),
    "retry_after": ("receiver", "retry_after"),
    "max_attempts": ("worker", "max_attempts"),
    "lease_seconds": ("worker", "lease_seconds"),
    "outbox_lease_seconds": ("worker", "outbox_lease_seconds"),
    "transaction_budget": ("worker", "transaction_budget"),
    "retry_base": ("worker", "retry_base"),
    "retry_cap": ("worker", "retry_cap"),
    "retention_payloads": ("retention", "payloads"),
    "retention_ids": ("retention", "ids"),
    "dashboard_path": ("dashboard", "path"),
    "dashboard_token": ("dashboard", "token"),
    "dashboard_redact": ("dashboard", "redact"),
}

_EMPTY_IS_UNSET = frozenset(
    {"database_url", "dashboard_path", "dashboard_token", "retention_payloads", "retention_ids"}
)

_ENVIRON: dict[str, tuple[str, Any]] = {
    "database_url": ("ONCEONLY_DATABASE_URL", _text),
    "metrics": ("ONCEONLY_METRICS", _flag),
    "max_body_bytes": ("ONCEONLY_MAX_BODY_BYTES", _int),
    "max_header_bytes": ("ONCEONLY_MAX_HEADER_BYTES", _int),
    "body_timeout": ("ONCEONLY_BODY_TIMEOUT", _float),
    "retry_after": ("ONCEONLY_RETRY_AFTER", _int),
    "max_attempts": ("ONCEONLY_MAX_ATTEMPTS", _int),
    "lease_seconds": ("ONCEONLY_LEASE_SECONDS", _float),
    "outbox_lease_seconds": ("ONCEONLY_OUTBOX_LEASE_SECONDS", _float),
    "transaction_budget": ("ONCEONLY_TRANSACTION_BUDGET", _float),
    "retry_base": ("ONCEONLY_RETRY_BASE_SECONDS", _float),
    "retry_cap": ("ONCEONLY_RETRY_CAP_SECONDS", _float),
    "retention_payloads": ("ONCEONLY_RETENTION_PAYLOADS", duration),
    "retention_ids": ("ONCEONLY_RETENTION_IDS", duration),
    "dashboard_path": ("ONCEONLY_DASHBOARD_PATH", _text),
    "dashboard_token": ("ONCEONLY_DASHBOARD_TOKEN", _text),
    "dashboard_redact": ("ONCEONLY_DASHBOARD_REDACT", _fields),
}
