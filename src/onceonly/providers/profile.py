"""What ``onceonly dev`` needs to play a provider: the one interface of a provider's
development profile (``onceonly/providers/<name>/profile.py``).

A profile says how the provider retries a delivery (:class:`DeliverySchedule`),
what its events look like (:meth:`DevProfile.build_event`) and, for a provider
with an API, which paths the fake API serves for it and how those paths answer.
:mod:`onceonly.dev` reads every provider through this class alone, so it holds
no provider names of its own.

Standard library only: the profiles import it, and :mod:`onceonly.dev` imports
the profiles, so it must import neither.
"""

from __future__ import annotations

import hmac
import json
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

__all__ = [
    "DAY",
    "HOUR",
    "ApiAnswer",
    "ApiObject",
    "DeliverySchedule",
    "DevProfile",
    "FakeListing",
    "FakeRoute",
    "ListingState",
    "Outgoing",
    "PaymentFacts",
    "credential_matches",
    "doubling",
    "encode",
    "hex_id",
    "iso_time",
    "query_int",
]

HOUR = 3600.0
DAY = 24 * HOUR


@dataclass(frozen=True, slots=True)
class DeliverySchedule:
    """How a provider retries a webhook delivery to us (not how onceonly retries
    its calls to a provider's API: that is :class:`onceonly.clients.ApiRetryPolicy`).

    `delays[n]` is the wait after failed attempt ``n + 1`` before the next one,
    so there are ``len(delays) + 1`` attempts in all. `success` lists the only
    statuses that count (``None``: any 2xx). `pause_after_failures` stops the
    whole queue after that many consecutive failed attempts (Asaas).
    """

    provider: str
    delays: tuple[float, ...]
    timeout: float
    success: frozenset[int] | None = None
    pause_after_failures: int | None = None
    disable_on: frozenset[int] = frozenset()
    source: str = ""

    @property
    def max_attempts(self) -> int:
        return len(self.delays) + 1

    @property
    def total_seconds(self) -> float:
        """From the first attempt to the last, at real speed."""
        return float(sum(self.delays))

    def succeeded(self, status: int) -> bool:
        if self.success is not None:
            return status in self.success
        return 200 <= status < 300

    def delay_after(self, attempt: int) -> float | None:
        """Seconds to wait after failed attempt `attempt` (1-based); ``None``: no more."""
        if attempt < 1 or attempt > len(self.delays):
            return None
        return self.delays[attempt - 1]


def doubling(first: float, steps: int, total: float) -> tuple[float, ...]:
    """`steps` delays doubling from `first`, the last one stretched or cut so that
    they add up to `total` (for providers that document a total, not the steps)."""
    delays = [first * 2**i for i in range(steps - 1)]
    return (*delays, max(first, total - sum(delays)))


@dataclass(frozen=True, slots=True)
class PaymentFacts:
    """The payment an event is about: what the fake API serves for `object_id`."""

    object_id: str
    amount: int = 1999  # minor units (cents, centavos)
    currency: str = "brl"
    customer: str = "cus_0001"
    email: str = "customer@example.com"
    status: str = "succeeded"
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One event to deliver.

    `headers` are sent as they are, besides the signature headers (an event
    type header, for instance). `delivery_id` stays the same on every retry of
    this event, as the senders that put an id in a header keep it.
    """

    event_id: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, str] = field(default_factory=dict)
    delivery_id: str | None = None


@dataclass(frozen=True, slots=True)
class FakeRoute:
    """A path of the provider's API the fake serves, and the kind of object there."""

    path: str  # with an ``{object_id}`` parameter, unless the profile answers it itself
    kind: str
    #: HTTP methods served (an OAuth token endpoint is a POST).
    methods: tuple[str, ...] = ("GET",)


@dataclass(frozen=True, slots=True)
class FakeListing:
    """A listing path of the provider's API the fake serves (no path parameter):
    :meth:`DevProfile.listing` answers it under `name`."""

    path: str
    name: str


@dataclass(frozen=True, slots=True)
class ListingState:
    """What a fake listing answers from: the stored objects by kind (in the
    order they were stored), which events were delivered, the webhook queue."""

    objects: Mapping[str, list[dict[str, Any]]]
    #: Event id -> whether a delivery of it was acknowledged (absent: never tried).
    delivered: Mapping[str, bool]
    #: The sender's queue as the provider reports it (Asaas: ``interrupted``).
    queue: Mapping[str, Any]


def query_int(query: Mapping[str, list[str]], name: str, default: int, top: int) -> int:
    """An integer query parameter, bounded to ``[0, top]`` (a bad one: `default`)."""
    try:
        value = int(query.get(name, [str(default)])[0])
    except ValueError:
        return default
    return max(0, min(value, top))


@dataclass(frozen=True, slots=True)
class ApiAnswer:
    """An answer of the fake API: JSON `data`, or `content` of `media_type`."""

    status: int
    data: Any = None
    content: bytes | str | None = None
    media_type: str | None = None


#: ``(kind, id, object)``: one object the fake API serves.
ApiObject = tuple[str, str, dict[str, Any]]


def credential_matches(given: str, expected: str) -> bool:
    """Whether a request's credential is `expected`, in constant time."""
    return hmac.compare_digest(given.encode(), expected.encode())


def iso_time(ts: float | None = None) -> str:
    """A timestamp as providers write them (UTC, milliseconds, ``Z``)."""
    moment = datetime.fromtimestamp(ts if ts is not None else time.time(), UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def hex_id(r: random.Random) -> str:
    """A 32-hex-digit id, the form of the per-delivery ids senders put in headers."""
    return f"{r.getrandbits(128):032x}"


def encode(data: dict[str, Any]) -> bytes:
    """A body as senders send it: compact JSON."""
    return json.dumps(data, separators=(",", ":")).encode()


class DevProfile:
    """One provider as ``onceonly dev`` plays it; a profile subclasses this and
    overrides what its provider does differently.

    The defaults fit a provider with no API of its own (Standard Webhooks, the
    generic HMAC sender): a generic payment event and nothing for the fake API.
    """

    #: The provider's route name (``Provider.name``).
    name: ClassVar[str]
    #: How the provider retries a delivery.
    schedule: ClassVar[DeliverySchedule]
    #: The event type sent when none is given: a payment that went through.
    event_type: ClassVar[str]
    #: What a payment that went through is called in the provider's API
    #: (``None``: the facts' own status).
    paid_status: ClassVar[str | None] = None
    #: The paths of the provider's API the fake serves (none: no API).
    routes: ClassVar[tuple[FakeRoute, ...]] = ()
    #: The listing paths the fake serves (what ``onceonly reconcile`` reads).
    listings: ClassVar[tuple[FakeListing, ...]] = ()

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of object the fake API serves for this provider."""
        return tuple(route.kind for route in self.routes)

    # Events.

    def object_id(self, digits: str, token: str) -> str:
        """A new id in the provider's style for the object an event points to,
        made from random `digits` or a random hex `token`."""
        return f"obj_{token}"

    def build_event(
        self, kind: str, event_id: str | None, facts: PaymentFacts, token: str, r: random.Random
    ) -> Outgoing:
        """An event of type `kind` about `facts` (`token`: random hex for ids)."""
        eid = event_id or f"msg_{token}"
        body = {
            "id": eid,
            "type": kind,
            "timestamp": iso_time(),
            "data": {
                "id": facts.object_id,
                "amount": facts.amount,
                "currency": facts.currency,
                "customer": facts.customer,
                "email": facts.email,
                "status": facts.status,
            },
        }
        return Outgoing(eid, encode(body), delivery_id=eid)

    def api_objects(
        self, event: Outgoing, body: Any, facts: PaymentFacts, state: str
    ) -> list[ApiObject]:
        """What the fake API serves for `event` (`body` decoded), with the
        payment in status `state`."""
        return []

    # The fake API.

    def authorized(
        self,
        kind: str,
        headers: Mapping[str, str],
        query: Mapping[str, str],
        token: str,
        account: str,
    ) -> bool:
        """Whether a request carries the credential `token` (`account`: the
        seller's e-mail, for APIs that also ask for one). Default: Bearer."""
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return credential_matches(given.strip(), token)

    def not_found(self, kind: str, object_id: str) -> ApiAnswer:
        """The provider's answer for an object it does not have."""
        label = kind.replace("_", " ")
        return ApiAnswer(404, {"message": f"{label} not found", "error": "not_found"})

    def unauthorized(self, kind: str) -> ApiAnswer:
        """The provider's answer for a wrong credential."""
        return ApiAnswer(
            401, {"message": "invalid credentials", "error": "unauthorized", "status": 401}
        )

    def answer(self, kind: str, headers: Mapping[str, str], token: str) -> ApiAnswer | None:
        """An answer the profile makes itself, for a request already
        :meth:`authorized`, with no stored object behind it (an OAuth token
        endpoint). Default ``None``: serve the stored object."""
        return None

    def render(self, kind: str, obj: dict[str, Any]) -> ApiAnswer:
        """The provider's answer for a stored object. Default: the object as JSON."""
        return ApiAnswer(200, obj)

    def set_status(self, kind: str, obj: dict[str, Any], status: Any) -> None:
        """Change the status of stored `obj` in place. Default: its ``status``."""
        obj["status"] = status

    def listing(self, name: str, state: ListingState, query: Mapping[str, list[str]]) -> ApiAnswer:
        """The provider's answer to listing `name` with `query` (every value of
        each parameter). Default: nothing is listed here."""
        return self.not_found(name, "")
