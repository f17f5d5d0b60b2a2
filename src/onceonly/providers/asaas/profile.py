"""Asaas as ``onceonly dev`` plays it: its retries, its events and its API."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from ..profile import (
    HOUR,
    ApiAnswer,
    ApiObject,
    DeliverySchedule,
    DevProfile,
    FakeListing,
    FakeRoute,
    ListingState,
    Outgoing,
    PaymentFacts,
    credential_matches,
    encode,
    iso_time,
    query_int,
)

__all__ = ["PROFILE", "AsaasProfile"]


class AsaasProfile(DevProfile):
    name = "asaas"
    schedule = DeliverySchedule(
        "asaas",
        (30.0, 60.0, 210.0, 600.0, 1800.0, HOUR, 1.25 * HOUR),
        timeout=30.0,
        success=frozenset({200}),
        pause_after_failures=15,
        source="Asaas: only 200 counts; 30 s, 1 min, 3.5 min, ... up to 3 h (the later "
        "steps are an approximation); the queue pauses after 15 consecutive failures. "
        "The 30 s timeout is an assumption.",
    )
    event_type = "PAYMENT_RECEIVED"
    paid_status = "RECEIVED"
    routes = (FakeRoute("/v3/payments/{object_id}", "payment"),)
    listings = (FakeListing("/v3/payments", "payments"), FakeListing("/v3/webhooks", "webhooks"))

    def object_id(self, digits: str, token: str) -> str:
        return f"pay_{token}"

    def build_event(
        self, kind: str, event_id: str | None, facts: PaymentFacts, token: str, r: random.Random
    ) -> Outgoing:
        eid = event_id or f"evt_{token}"
        body = {
            "id": eid,
            "event": kind,
            "dateCreated": iso_time(),
            "payment": {
                "object": "payment",
                "id": facts.object_id,
                "customer": facts.customer,
                "value": facts.amount / 100,
                "netValue": facts.amount / 100,
                "billingType": "PIX",
                "status": "RECEIVED" if facts.status == "succeeded" else facts.status.upper(),
                **facts.extra,
            },
        }
        return Outgoing(eid, encode(body))

    def api_objects(
        self, event: Outgoing, body: Any, facts: PaymentFacts, state: str
    ) -> list[ApiObject]:
        # The API's payment has its creation day, which the list filters on.
        payment = {**body["payment"], "status": state, "dateCreated": body["dateCreated"][:10]}
        return [("payment", facts.object_id, payment)]

    def listing(self, name: str, state: ListingState, query: Mapping[str, list[str]]) -> ApiAnswer:
        if name == "webhooks":
            # The webhook configuration with its queue state: ``interrupted``
            # once the queue paused after 15 failures in a row.
            hook = {
                "object": "webhook",
                "id": "wh_onceonly_dev",
                "name": "onceonly dev gateway",
                "url": state.queue.get("url", ""),
                "enabled": True,
                "interrupted": bool(state.queue.get("interrupted", False)),
                "penalizedRequestsCount": int(state.queue.get("penalized", 0)),
            }
            return ApiAnswer(200, _page([hook], 0, 10, 1))
        payments = state.objects.get("payment", [])
        for param, keep in (("dateCreated[ge]", str.__ge__), ("dateCreated[le]", str.__le__)):
            day = query.get(param)
            if day:
                payments = [p for p in payments if keep(str(p.get("dateCreated", "")), day[0])]
        offset = query_int(query, "offset", 0, 10**9)
        limit = query_int(query, "limit", 10, 100) or 10
        return ApiAnswer(
            200, _page(payments[offset : offset + limit], offset, limit, len(payments))
        )

    def authorized(
        self,
        kind: str,
        headers: Mapping[str, str],
        query: Mapping[str, str],
        token: str,
        account: str,
    ) -> bool:
        # Asaas takes its key in a header of its own, not as a Bearer token.
        given = headers.get("access_token", "")
        return credential_matches(given.strip(), token)

    def not_found(self, kind: str, object_id: str) -> ApiAnswer:
        label = kind.replace("_", " ")
        return ApiAnswer(
            404, {"errors": [{"code": "not_found", "description": f"{label} not found"}]}
        )

    def unauthorized(self, kind: str) -> ApiAnswer:
        error = {"code": "invalid_access_token", "description": "invalid credentials"}
        return ApiAnswer(401, {"errors": [error]})


PROFILE = AsaasProfile()


def _page(data: list[dict[str, Any]], offset: int, limit: int, total: int) -> dict[str, Any]:
    return {
        "object": "list",
        "hasMore": offset + len(data) < total,
        "totalCount": total,
        "limit": limit,
        "offset": offset,
        "data": data,
    }
