"""onceonly: make retried work take effect once.

The public surface is what ``__all__`` lists; modules starting with ``_`` are
private.
"""

from __future__ import annotations

from ._exceptions import (
    ApiError,
    ApiUnavailable,
    BodyTooLarge,
    ConfigurationError,
    DeliveryRejected,
    NotFetchable,
    OnceonlyError,
    PayloadError,
    PayloadPurged,
    SignatureError,
    StoreError,
    StoreUnavailable,
    UnknownProvider,
)
from .config import Onceonly, load_app
from .context import Context, EffectError
from .events import Delivery, Event, EventInfo, EventStatus, NewEvent, Receipt
from .guard import Guard, JobInProgress
from .inbox import GroupCommit, Inbox
from .receiver import Receiver
from .store import Store, create_store
from .worker import Worker

__version__ = "0.1.0"

__all__ = [
    "ApiError",
    "ApiUnavailable",
    "BodyTooLarge",
    "ConfigurationError",
    "Context",
    "Delivery",
    "DeliveryRejected",
    "EffectError",
    "Event",
    "EventInfo",
    "EventStatus",
    "GroupCommit",
    "Guard",
    "Inbox",
    "JobInProgress",
    "NewEvent",
    "NotFetchable",
    "Onceonly",
    "OnceonlyError",
    "PayloadError",
    "PayloadPurged",
    "Receipt",
    "Receiver",
    "SignatureError",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "UnknownProvider",
    "Worker",
    "__version__",
    "create_store",
    "load_app",
]
