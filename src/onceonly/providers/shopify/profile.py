"""Shopify as ``onceonly dev`` plays it: its retries and its order webhooks (no fake API)."""

from __future__ import annotations

import random

from ..profile import (
    HOUR,
    DeliverySchedule,
    DevProfile,
    Outgoing,
    PaymentFacts,
    doubling,
    encode,
    hex_id,
    iso_time,
)

__all__ = ["PROFILE", "ShopifyProfile"]


class ShopifyProfile(DevProfile):
    name = "shopify"
    schedule = DeliverySchedule(
        "shopify",
        doubling(60.0, 8, 4 * HOUR),
        timeout=5.0,
        source="Shopify: 8 retries over 4 hours, 5 s timeout (the steps are an "
        "approximation that adds up to 4 h).",
    )
    event_type = "orders/paid"

    def object_id(self, digits: str, token: str) -> str:
        return digits

    def build_event(
        self, kind: str, event_id: str | None, facts: PaymentFacts, token: str, r: random.Random
    ) -> Outgoing:
        # The per-delivery id goes in X-Shopify-Webhook-Id (kept on retries); the
        # receiver's event id is the hash of the signed body, so each event's body
        # differs (its update time, here also the delivery's own id).
        eid = event_id or hex_id(r)
        body = {
            "id": int(facts.object_id) if facts.object_id.isdigit() else facts.object_id,
            "admin_graphql_api_id": f"gid://shopify/Order/{facts.object_id}",
            "updated_at": iso_time(),
            "note": f"onceonly dev delivery {eid}",
            "email": facts.email,
            "created_at": iso_time(),
            "currency": facts.currency.upper(),
            "financial_status": "paid" if facts.status == "succeeded" else facts.status,
            "total_price": f"{facts.amount / 100:.2f}",
            "customer": {"id": facts.customer, "email": facts.email},
        }
        headers = {
            "x-shopify-topic": kind,
            "x-shopify-shop-domain": "onceonly-dev.myshopify.com",
            "x-shopify-api-version": "2024-07",
            "x-shopify-event-id": hex_id(r),
        }
        return Outgoing(eid, encode(body), headers=headers, delivery_id=eid)


PROFILE = ShopifyProfile()
