"""Mercado Pago as ``onceonly dev`` plays it: its retries, its notifications and its API."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from ..profile import (
    ApiAnswer,
    ApiObject,
    DeliverySchedule,
    DevProfile,
    FakeListing,
    FakeRoute,
    ListingState,
    Outgoing,
    PaymentFacts,
    encode,
    hex_id,
    iso_time,
    query_int,
)

__all__ = ["PROFILE", "MercadoPagoProfile"]


class MercadoPagoProfile(DevProfile):
    name = "mercadopago"
    schedule = DeliverySchedule(
        "mercadopago",
        (15 * 60.0,) * 8,
        timeout=22.0,
        success=frozenset({200, 201}),
        source="Mercado Pago: answer 200 or 201 within 22 s; retries every 15 min "
        "(the number of retries differs between country pages: 8 here).",
    )
    event_type = "payment.updated"
    paid_status = "approved"
    routes = (FakeRoute("/v1/payments/{object_id}", "payment"),)
    listings = (FakeListing("/v1/payments/search", "payments"),)

    def object_id(self, digits: str, token: str) -> str:
        return digits

    def build_event(
        self, kind: str, event_id: str | None, facts: PaymentFacts, token: str, r: random.Random
    ) -> Outgoing:
        # The notification's own id is numeric; data.id (the payment) repeats across
        # the notifications of one payment and also travels in the query string.
        eid = event_id or str(r.randrange(10**10, 10**11))
        topic = kind.split(".", 1)[0]
        body = {
            "id": int(eid) if eid.isdigit() else eid,
            "live_mode": False,
            "type": topic,
            "date_created": iso_time(),
            "user_id": 44444444,
            "api_version": "v1",
            "action": kind,
            "data": {"id": facts.object_id},
        }
        return Outgoing(
            eid,
            encode(body),
            query={"data.id": facts.object_id, "type": topic},
            delivery_id=hex_id(r),
        )

    def api_objects(
        self, event: Outgoing, body: Any, facts: PaymentFacts, state: str
    ) -> list[ApiObject]:
        payment = {
            "id": int(facts.object_id) if facts.object_id.isdigit() else facts.object_id,
            "status": state,
            "status_detail": "accredited" if state == "approved" else state,
            "transaction_amount": facts.amount / 100,
            "currency_id": facts.currency.upper(),
            "payer": {"id": facts.customer, "email": facts.email},
            "date_created": body.get("date_created"),
        }
        return [("payment", facts.object_id, payment)]

    def listing(self, name: str, state: ListingState, query: Mapping[str, list[str]]) -> ApiAnswer:
        # GET /v1/payments/search: offset/limit paging; ``range`` with
        # ``begin_date``/``end_date`` filters on that field where it is set
        # (the fake compares ISO text, which orders like time in one zone).
        payments = state.objects.get("payment", [])
        field = query.get("range", [""])[0]
        if field:
            for param, keep in (("begin_date", str.__ge__), ("end_date", str.__le__)):
                bound = query.get(param, [""])[0]
                if bound and not bound.startswith("NOW"):
                    payments = [
                        p for p in payments if not p.get(field) or keep(str(p[field]), bound[:19])
                    ]
        offset = query_int(query, "offset", 0, 10**9)
        limit = query_int(query, "limit", 30, 1000) or 30
        paging = {"total": len(payments), "limit": limit, "offset": offset}
        return ApiAnswer(200, {"paging": paging, "results": payments[offset : offset + limit]})

    def not_found(self, kind: str, object_id: str) -> ApiAnswer:
        label = kind.replace("_", " ")
        body = {"message": f"{label} not found", "error": "not_found", "status": 404, "cause": []}
        return ApiAnswer(404, body)


PROFILE = MercadoPagoProfile()
