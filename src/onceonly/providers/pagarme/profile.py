"""Pagar.me as ``onceonly dev`` plays it: its retries, its order webhooks and its API v5."""

from __future__ import annotations

import base64
import binascii
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

__all__ = ["PROFILE", "PagarmeProfile"]


class PagarmeProfile(DevProfile):
    name = "pagarme"
    schedule = DeliverySchedule(
        "pagarme",
        (60.0, 5 * 60.0, 15 * 60.0, HOUR, 3 * HOUR, 6 * HOUR),
        timeout=10.0,
        source="Pagar.me's retry schedule and timeout were not found in its "
        "documentation: these are assumptions.",
    )
    event_type = "order.paid"
    paid_status = "paid"
    routes = (
        FakeRoute("/core/v5/orders/{object_id}", "order"),
        FakeRoute("/core/v5/charges/{object_id}", "charge"),
    )

    def object_id(self, digits: str, token: str) -> str:
        return f"or_{token}"

    def build_event(
        self, kind: str, event_id: str | None, facts: PaymentFacts, token: str, r: random.Random
    ) -> Outgoing:
        eid = event_id or f"hook_{token[:16]}"
        status = "paid" if facts.status == "succeeded" else facts.status
        charge = {
            "id": f"ch_{token[:16]}",
            "code": token[:10],
            "amount": facts.amount,
            "paid_amount": facts.amount if status == "paid" else 0,
            "status": status,
            "currency": facts.currency.upper(),
            "payment_method": "pix",
            "paid_at": iso_time(),
        }
        body = {
            "id": eid,
            "account": {"id": "acc_onceonlydev0001", "name": "onceonly dev"},
            "type": kind,
            "created_at": iso_time(),
            "data": {
                "id": facts.object_id,
                "code": token[:10],
                "amount": facts.amount,
                "currency": facts.currency.upper(),
                "closed": True,
                "status": status,
                "customer": {"id": facts.customer, "email": facts.email},
                "charges": [charge],
                **facts.extra,
            },
        }
        return Outgoing(eid, encode(body))

    def api_objects(
        self, event: Outgoing, body: Any, facts: PaymentFacts, state: str
    ) -> list[ApiObject]:
        data = body["data"]
        charges = [{**c, "status": state} for c in data.get("charges", [])]
        order = {**data, "status": state, "charges": charges}
        order_ref = {"id": order["id"], "code": order.get("code"), "status": state}
        return [("order", order["id"], order)] + [
            ("charge", c["id"], {**c, "order": order_ref}) for c in charges
        ]

    def authorized(
        self,
        kind: str,
        headers: Mapping[str, str],
        query: Mapping[str, str],
        token: str,
        account: str,
    ) -> bool:
        # Basic, the secret key as the user and an empty password.
        scheme, _, encoded = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, _ = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        except (binascii.Error, ValueError):
            return False
        return credential_matches(user, token)

    def not_found(self, kind: str, object_id: str) -> ApiAnswer:
        label = kind.replace("_", " ").capitalize()
        return ApiAnswer(404, {"message": f"{label} not found."})

    def unauthorized(self, kind: str) -> ApiAnswer:
        return ApiAnswer(401, {"message": "Authorization has been denied for this request."})


PROFILE = PagarmeProfile()
