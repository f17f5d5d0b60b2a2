"""onceonly: make retried work take effect once.

The public surface is what ``__all__`` lists; modules starting with ``_`` are
private.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._exceptions import (
    ApiError,
    ApiUnavailable,
    BodyTimeout,
    BodyTooLarge,
    ConfigurationError,
    DeliveryRejected,
    HeadersTooLarge,
    NonRetryable,
    NotFetchable,
    OnceonlyError,
    PayloadError,
    PayloadPurged,
    RetryLater,
    SignatureError,
    StoreError,
    StoreRejected,
    StoreUnavailable,
    TenantUnavailable,
    UnknownProvider,
    UnknownTenant,
)
from ._version import __version__

if TYPE_CHECKING:
    from .config import Onceonly, load_app
    from .context import Context, EffectError
    from .events import Delivery, Event, EventInfo, EventStatus, NewEvent, Receipt
    from .guard import Guard, JobConflict, JobInProgress
    from .hooks import Failure
    from .inbox import GroupCommit, Inbox
    from .receiver import Receiver
    from .settings import (
        DashboardSettings,
        ReceiverSettings,
        RetentionSettings,
        Settings,
        WorkerSettings,
    )
    from .store import Store, create_store
    from .tenants import TenantCredentials, Tenants
    from .worker import Worker

# Each name is imported on first use (PEP 562), so that an application that
# only needs, say, the Idempotency-Key middleware and a store does not load
# SQLAlchemy, the providers and the worker: a quarter of a second at start-up,
# and twice the objects every full garbage collection has to walk.
_LAZY = {
    "Onceonly": "config",
    "load_app": "config",
    "Context": "context",
    "EffectError": "context",
    "Delivery": "events",
    "Event": "events",
    "EventInfo": "events",
    "EventStatus": "events",
    "NewEvent": "events",
    "Receipt": "events",
    "Failure": "hooks",
    "Guard": "guard",
    "JobConflict": "guard",
    "JobInProgress": "guard",
    "GroupCommit": "inbox",
    "Inbox": "inbox",
    "Receiver": "receiver",
    "Settings": "settings",
    "ReceiverSettings": "settings",
    "WorkerSettings": "settings",
    "RetentionSettings": "settings",
    "DashboardSettings": "settings",
    "Store": "store",
    "create_store": "store",
    "TenantCredentials": "tenants",
    "Tenants": "tenants",
    "Worker": "worker",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'onceonly' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups do not come back here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ApiError",
    "ApiUnavailable",
    "BodyTimeout",
    "BodyTooLarge",
    "ConfigurationError",
    "Context",
    "DashboardSettings",
    "Delivery",
    "DeliveryRejected",
    "EffectError",
    "Event",
    "EventInfo",
    "EventStatus",
    "Failure",
    "GroupCommit",
    "Guard",
    "HeadersTooLarge",
    "Inbox",
    "JobConflict",
    "JobInProgress",
    "NewEvent",
    "NonRetryable",
    "NotFetchable",
    "Onceonly",
    "OnceonlyError",
    "PayloadError",
    "PayloadPurged",
    "Receipt",
    "Receiver",
    "ReceiverSettings",
    "RetentionSettings",
    "RetryLater",
    "Settings",
    "SignatureError",
    "Store",
    "StoreError",
    "StoreRejected",
    "StoreUnavailable",
    "TenantCredentials",
    "TenantUnavailable",
    "Tenants",
    "UnknownProvider",
    "UnknownTenant",
    "Worker",
    "WorkerSettings",
    "__version__",
    "create_store",
    "load_app",
]
