"""Mercado Pago: ``GET /v1/payments/{id}`` with the access token as Bearer.

A notification points to a payment by ``data.id``. Where it comes from, in
order of trust: the query string of the notification URL (``?data.id=...``;
it is what the ``x-signature`` covers, stored with the event as the
``onceonly-query`` header), the legacy IPN query (``?topic=payment&id=...``),
then the body (``data.id``, or an IPN feed's ``resource``). The body is never
signed, so for a signed notification the query wins when both are present.
Unsigned notifications (QR code, IPN) accepted with ``unsigned="fetch"`` are
triggers only: the payment fetched here is the only thing to act on.

A notification about something else (``merchant_order``, ``subscription_...``)
raises :class:`~onceonly.NotFetchable` rather than reading a payment with an
unrelated id.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl

from ..._exceptions import ApiError, NotFetchable
from ...events import Event
from ..base import lookup
from ..client import (
    RECONCILED_HEADER,
    ApiClient,
    Listed,
    Target,
    body_json,
    listed_body,
    path_id,
    safe_id,
)

__all__ = ["MercadoPagoClient"]

#: Where the mercadopago provider keeps the notification's query string.
QUERY_HEADER = "onceonly-query"


def _topic(value: Any) -> str | None:
    """``payment`` from ``payment`` or ``payment.updated``."""
    if not isinstance(value, str) or not value:
        return None
    return value.split(".", 1)[0]


class MercadoPagoClient(ApiClient):
    """Reads payments from Mercado Pago's API (base ``https://api.mercadopago.com``)."""

    name = "mercadopago"
    default_base_url = "https://api.mercadopago.com"
    kinds = ("payment",)
    lists_by_time = True

    def target(self, event: Event, kind: str | None = None) -> Target:
        kind = self.kind_or_default(kind)
        query = dict(parse_qsl(event.headers.get(QUERY_HEADER, "")))
        body = body_json(event)
        topic = (
            _topic(query.get("type"))
            or _topic(query.get("topic"))
            or _topic(body.get("type"))
            or _topic(body.get("topic"))
            or _topic(body.get("action"))
        )
        if topic is not None and topic != "payment":
            raise NotFetchable(
                f"Mercado Pago notification {event.event_id} is about a {topic!r}, not a payment"
            )
        candidates: list[tuple[Any, str]] = [
            (query.get("data.id"), "query data.id"),
            (query.get("id"), "query id"),
            (lookup(body, "data.id"), "body data.id"),
            (_resource_id(body.get("resource")), "body resource"),
        ]
        for value, where in candidates:
            if value not in (None, ""):
                return Target(kind, safe_id(value, f"Mercado Pago {where}"))
        raise NotFetchable(f"Mercado Pago notification {event.event_id} names no payment")

    async def get(self, target: Target) -> dict[str, Any]:
        self.kind_or_default(target.kind)
        return await self.get_json(f"/v1/payments/{path_id(target.id)}")

    async def retrieve_payment(self, payment_id: str | int) -> dict[str, Any]:
        """``GET /v1/payments/{payment_id}``."""
        return await self.get(Target("payment", safe_id(payment_id, "payment id")))

    async def listing(
        self, since: datetime, *, ids: Sequence[str] = (), failed_only: bool = False
    ) -> AsyncIterator[Listed]:
        """``GET /v1/payments/search`` over ``date_last_updated`` from `since`
        to now (``range``, ``begin_date``, ``end_date``; ``offset``/``limit``
        paging, ``results`` and ``paging.total``), or ``GET /v1/payments/{id}``
        for `ids`: each payment as a ``payment.updated`` notification with the
        deterministic id ``reconciled:<payment id>:<status>`` and the payment
        itself under ``payment``."""
        if ids:
            for payment_id in ids:
                yield _notification(await self.retrieve_payment(payment_id), "payment")
            return
        offset = 0
        params = {
            "sort": "date_last_updated",
            "criteria": "asc",
            "range": "date_last_updated",
            "begin_date": _mp_time(since),
            "end_date": _mp_time(datetime.now(UTC)),
            "limit": str(self.page_size),
        }
        while True:
            params["offset"] = str(offset)
            page, results = await self.get_page("/v1/payments/search", "results", params)
            for item in results:
                yield _notification(item, "payments-search")
            total = lookup(page, "paging.total")
            offset += len(results)
            if not results:
                return
            # Without a usable total, a short page is the last one.
            if isinstance(total, int) and not isinstance(total, bool):
                if offset >= total:
                    return
            elif len(results) < self.page_size:
                return


def _resource_id(resource: Any) -> Any:
    """An IPN feed's ``resource`` is an id or a URL ending in one."""
    if isinstance(resource, str) and "/" in resource:
        return resource.rstrip("/").rsplit("/", 1)[-1]
    return resource


def _mp_time(moment: datetime) -> str:
    # Mercado Pago's search takes ISO 8601 with milliseconds and an offset.
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000-00:00")


def _notification(payment: Any, source: str) -> Listed:
    if not isinstance(payment, dict):
        raise ApiError(
            "mercadopago API listed a payment that is not an object", provider="mercadopago"
        )
    payment_id = safe_id(payment.get("id"), "a listed Mercado Pago payment id")
    status = str(payment.get("status") or "unknown")
    event_id = f"reconciled:{payment_id}:{status}"
    body = {
        "id": event_id,
        "type": "payment",
        "action": "payment.updated",
        "data": {"id": payment_id},
        "payment": payment,
    }
    return Listed(
        event_id, "payment.updated", listed_body(body), {RECONCILED_HEADER: f"mercadopago:{source}"}
    )
