"""What the receiver answers a delivery, whatever the web framework around it.

:class:`Reception` owns the receiver's decisions: a delivery goes into the
inbox, and what came of it (stored, duplicate, refused, database away) becomes
an :class:`Answer` (status, body, headers), counted in the metrics once. The
ASGI :class:`~onceonly.receiver.Receiver` sends that answer with ASGI messages;
the Django views (:mod:`onceonly.contrib.django.views`) as an ``HttpResponse``.
So ``onceonly serve`` and a framework's URL give the same answers, from one
table (see :mod:`onceonly.receiver`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._exceptions import (
    DeliveryRejected,
    StoreError,
    StoreRejected,
    TenantUnavailable,
)
from .events import Delivery, NewEvent, Receipt
from .inbox import refused
from .settings import ReceiverSettings

if TYPE_CHECKING:
    from .inbox import Inbox
    from .metrics import Metrics
    from .providers import Provider

__all__ = ["METHOD_NOT_ALLOWED", "NOT_FOUND", "Answer", "Reception", "problem"]

log = logging.getLogger("onceonly.receiver")

Headers = tuple[tuple[bytes, bytes], ...]

_JSON = (b"content-type", b"application/json")
_PROBLEM = (b"content-type", b"application/problem+json")


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer to a delivery; `headers` have lower-case names and do
    not include ``content-length`` (the server adds it)."""

    status: int
    body: bytes
    headers: Headers
    #: `headers` and the body's ``content-length``, as ASGI sends them: made
    #: once, since the hot path's two answers are built once.
    asgi_headers: Headers = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        length = (b"content-length", str(len(self.body)).encode())
        object.__setattr__(self, "asgi_headers", (*self.headers, length))


def problem(status: int, reason: str, title: str, detail: str, extra: Headers = ()) -> Answer:
    """An RFC 9457 problem document; `reason` names its type."""
    body = json.dumps(
        {
            "type": f"urn:onceonly:problem:{reason}",
            "title": title,
            "status": status,
            "detail": detail,
        }
    ).encode()
    return Answer(status, body, (_PROBLEM, *extra))


NOT_FOUND = problem(404, "not-found", "Not Found", "no such route")
METHOD_NOT_ALLOWED = problem(
    405, "method", "Method Not Allowed", "use POST", ((b"allow", b"POST"),)
)

# Built once: the two answers of the hot path.
_STORED = Answer(
    200, b'{"received":true,"duplicate":false}', (_JSON, (b"onceonly-duplicate", b"false"))
)
_DUPLICATE = Answer(
    200, b'{"received":true,"duplicate":true}', (_JSON, (b"onceonly-duplicate", b"true"))
)

_TITLES = {
    "signature": "Invalid Signature",
    "payload": "Invalid Payload",
    "unknown-provider": "Unknown Provider",
    "unknown-tenant": "Unknown Tenant",
    "too-large": "Payload Too Large",
    "headers-too-large": "Request Header Fields Too Large",
    "body-timeout": "Request Timeout",
    "rejected": "Rejected",
}


class Reception:
    """Deliveries in, answers out: the inbox, the metrics and the receiver's
    settings (body and header limits, ``Retry-After``)."""

    def __init__(self, inbox: Inbox, metrics: Metrics, settings: ReceiverSettings) -> None:
        self.inbox = inbox
        self.metrics = metrics
        self.max_body_bytes = settings.max_body_bytes
        self.max_header_bytes = settings.max_header_bytes
        self.body_timeout = settings.body_timeout
        retry_after = ((b"retry-after", str(settings.retry_after).encode()),)
        self.unavailable = problem(
            503,
            "unavailable",
            "Service Unavailable",
            "the event could not be stored; retry later",
            retry_after,
        )
        self.tenant_unavailable = problem(
            503,
            "unavailable",
            "Service Unavailable",
            "the tenant's secrets could not be looked up; retry later",
            retry_after,
        )
        #: The health check's answer when the database is away.
        self.unhealthy = problem(
            503, "unavailable", "Service Unavailable", "the database is not reachable", retry_after
        )

    async def receive(self, delivery: Delivery, verifier: Provider | None = None) -> Answer:
        """Store `delivery`; 200 only once its event is committed (or was
        already). `verifier`: as :meth:`Inbox.receive <onceonly.inbox.Inbox.receive>`'s."""
        tenant = delivery.tenant
        try:
            receipt = await self.inbox.receive(delivery, verifier)
        except DeliveryRejected as exc:
            return self.rejected(delivery.provider, exc, tenant)
        except StoreError as exc:
            return self.store_failed(delivery.provider, exc, tenant)
        except TenantUnavailable as exc:
            return self.tenant_failed(delivery.provider, exc, tenant)
        return self._accepted(delivery.provider, tenant, receipt)

    def _accepted(self, provider: str, tenant: str, receipt: Receipt) -> Answer:
        self.metrics.accepted(provider, duplicate=receipt.duplicate, tenant=tenant)
        return _DUPLICATE if receipt.duplicate else _STORED

    def settled(self, event: NewEvent, outcome: Receipt | BaseException) -> Answer:
        """The answer to a delivery whose `event` went into the group commit
        by :meth:`GroupCommit.add <onceonly.batching.GroupCommit.add>`
        (``onceonly serve``'s protocol), given what came of it: the same
        answer, and the same count in the metrics, as :meth:`receive` gives.
        Raises what :meth:`receive` would not catch."""
        if isinstance(outcome, Receipt):
            self.inbox.log_receipt(event, outcome)
            return self._accepted(event.provider, event.tenant, outcome)
        if isinstance(outcome, StoreRejected):
            return self.rejected(event.provider, refused(outcome), event.tenant)
        if isinstance(outcome, StoreError):
            return self.store_failed(event.provider, outcome, event.tenant)
        raise outcome

    def rejected(self, provider: str, exc: DeliveryRejected, tenant: str = "") -> Answer:
        """The 4xx for a delivery refused before or during :meth:`receive`
        (unknown provider or tenant, limits, signature, payload): nothing was stored."""
        self.metrics.rejected(provider, exc.reason, tenant=tenant)
        log.debug("rejected delivery to %s: %s", provider, exc.detail)
        return problem(exc.status, exc.reason, _TITLES.get(exc.reason, "Rejected"), exc.detail)

    def store_failed(self, provider: str, exc: StoreError, tenant: str = "") -> Answer:
        """503 with ``Retry-After``: the sender keeps the event and sends it again."""
        self.metrics.rejected(provider, "unavailable", tenant=tenant)
        log.warning("database unavailable, answering 503: %s", exc)
        return self.unavailable

    def tenant_failed(self, provider: str, exc: TenantUnavailable, tenant: str) -> Answer:
        """503 with ``Retry-After`` when the tenant resolver failed (it logged why)."""
        self.metrics.rejected(provider, "unavailable", tenant=tenant)
        return self.tenant_unavailable
