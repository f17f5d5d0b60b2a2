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
    FakeRoute,
    Outgoing,
    PaymentFacts,
    credential_matches,
    encode,
    iso_time,
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
        return [("payment", facts.object_id, {**body["payment"], "status": state})]

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
