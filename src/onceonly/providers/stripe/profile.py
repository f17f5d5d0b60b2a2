"""Stripe as ``onceonly dev`` plays it: its retries, its events and its API's answers."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from typing import Any

from ..profile import (
    DAY,
    ApiAnswer,
    ApiObject,
    DeliverySchedule,
    DevProfile,
    FakeListing,
    FakeRoute,
    ListingState,
    Outgoing,
    PaymentFacts,
    doubling,
    encode,
    query_int,
)

__all__ = ["PROFILE", "StripeProfile"]


class StripeProfile(DevProfile):
    name = "stripe"
    schedule = DeliverySchedule(
        "stripe",
        doubling(60.0, 12, 3 * DAY),
        timeout=10.0,
        source="Stripe documents exponential backoff for up to 3 days, not the steps: "
        "these double from 1 min and add up to 3 days. The 10 s timeout is an assumption.",
    )
    event_type = "payment_intent.succeeded"
    paid_status = "succeeded"
    routes = (
        FakeRoute("/v1/events/{object_id}", "event"),
        FakeRoute("/v1/payment_intents/{object_id}", "payment_intent"),
    )
    listings = (FakeListing("/v1/events", "events"),)

    def object_id(self, digits: str, token: str) -> str:
        return f"pi_{token}"

    def build_event(
        self, kind: str, event_id: str | None, facts: PaymentFacts, token: str, r: random.Random
    ) -> Outgoing:
        eid = event_id or f"evt_{token}"
        body = {
            "id": eid,
            "object": "event",
            "api_version": "2024-06-20",
            "created": int(time.time()),
            "livemode": False,
            "pending_webhooks": 1,
            "type": kind,
            "data": {
                "object": {
                    "id": facts.object_id,
                    "object": "payment_intent",
                    "amount": facts.amount,
                    "amount_received": facts.amount,
                    "currency": facts.currency,
                    "customer": facts.customer,
                    "receipt_email": facts.email,
                    "status": facts.status,
                    **facts.extra,
                }
            },
        }
        return Outgoing(eid, encode(body))

    def api_objects(
        self, event: Outgoing, body: Any, facts: PaymentFacts, state: str
    ) -> list[ApiObject]:
        # The event is served too (GET /v1/events/{id}), carrying the intent as
        # the API tells it, not as the delivered body claimed.
        intent = {**body["data"]["object"], "status": state}
        stored = {**body, "data": {"object": intent}}
        return [("event", event.event_id, stored), ("payment_intent", facts.object_id, intent)]

    def not_found(self, kind: str, object_id: str) -> ApiAnswer:
        label = kind.replace("_", " ")
        error = {
            "type": "invalid_request_error",
            "code": "resource_missing",
            "message": f"No such {label}: '{object_id}'",
        }
        return ApiAnswer(404, {"error": error})

    def unauthorized(self, kind: str) -> ApiAnswer:
        error = {"type": "invalid_request_error", "message": "invalid credentials"}
        return ApiAnswer(401, {"error": error})

    def listing(self, name: str, state: ListingState, query: Mapping[str, list[str]]) -> ApiAnswer:
        # GET /v1/events: newest first, ``created[gte|gt|lte|lt]``,
        # ``delivery_success`` (false: never acknowledged, which includes the
        # deliveries lost for good), ``types[]``/``type``, ``starting_after``.
        events = list(reversed(state.objects.get("event", [])))
        events.sort(key=lambda e: -int(e.get("created", 0)))  # stable: ties keep order
        bounds = {"gte": int.__ge__, "gt": int.__gt__, "lte": int.__le__, "lt": int.__lt__}
        for op, test in bounds.items():
            raw = query.get(f"created[{op}]")
            if raw and raw[0].lstrip("-").isdigit():
                limit_at = int(raw[0])
                events = [e for e in events if test(int(e.get("created", 0)), limit_at)]
        success = query.get("delivery_success")
        if success:
            wanted = success[0] == "true"
            events = [e for e in events if state.delivered.get(e["id"], False) is wanted]
        types = query.get("types[]") or query.get("type")
        if types:
            events = [e for e in events if e.get("type") in types]
        after = query.get("starting_after")
        if after:
            ids = [e["id"] for e in events]
            if after[0] not in ids:
                return self.not_found("event", after[0])
            events = events[ids.index(after[0]) + 1 :]
        limit = query_int(query, "limit", 10, 100) or 10
        page = events[:limit]
        body = {"object": "list", "url": "/v1/events", "has_more": len(events) > limit}
        return ApiAnswer(200, {**body, "data": page})

    def set_status(self, kind: str, obj: dict[str, Any], status: Any) -> None:
        # An event's status is that of the object it carries.
        if kind == "event" and isinstance(obj.get("data"), dict):
            nested = obj["data"].get("object")
            if isinstance(nested, dict):
                nested["status"] = status
                return
        obj["status"] = status


PROFILE = StripeProfile()
