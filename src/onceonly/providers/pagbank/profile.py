"""PagBank as ``onceonly dev`` plays it: its retries, its orders and its API,
including the legacy PagSeguro notification lookup (which answers XML)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any
from xml.etree.ElementTree import Element, SubElement, tostring

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

__all__ = ["PROFILE", "PagBankProfile"]


def _xml(tag: str, value: Any, parent: Element | None = None) -> Element:
    element = Element(tag) if parent is None else SubElement(parent, tag)
    if isinstance(value, Mapping):
        for key, item in value.items():
            for one in item if isinstance(item, list) else [item]:
                _xml(str(key), one, element)
    elif value is not None:
        element.text = str(value)
    return element


class PagBankProfile(DevProfile):
    name = "pagbank"
    schedule = DeliverySchedule(
        "pagbank",
        (60.0, 5 * 60.0, 15 * 60.0, HOUR, 3 * HOUR),
        timeout=10.0,
        source="PagBank does not document its retries: this schedule and timeout are assumptions.",
    )
    event_type = "PAID"
    paid_status = "PAID"
    routes = (
        FakeRoute("/orders/{object_id}", "order"),
        FakeRoute("/charges/{object_id}", "charge"),
        FakeRoute("/v3/transactions/notifications/{object_id}", "notification"),
    )

    def object_id(self, digits: str, token: str) -> str:
        return f"ORDE_{token.upper()}"

    def build_event(
        self, kind: str, event_id: str | None, facts: PaymentFacts, token: str, r: random.Random
    ) -> Outgoing:
        # PagBank sends the order itself; the receiver derives the event id from the
        # order's state (see onceonly.providers.pagbank). The id below only names
        # the event for the gateway's report.
        charge = f"CHAR_{token.upper()}"
        reference = event_id or f"ref-{token[:12]}"
        body = {
            "id": facts.object_id,
            "reference_id": reference,
            "created_at": iso_time(),
            "customer": {"name": "Cliente", "email": facts.email},
            "charges": [
                {
                    "id": charge,
                    "reference_id": reference,
                    "status": kind,
                    "paid_at": iso_time(),
                    "amount": {"value": facts.amount, "currency": facts.currency.upper()},
                    "payment_method": {"type": "PIX"},
                }
            ],
        }
        return Outgoing(event_id or f"{facts.object_id}:{charge}:{kind}", encode(body))

    def api_objects(
        self, event: Outgoing, body: Any, facts: PaymentFacts, state: str
    ) -> list[ApiObject]:
        charges = [{**c, "status": state} for c in body.get("charges", [])]
        order = {**body, "charges": charges}
        return [("order", facts.object_id, order)] + [("charge", c["id"], c) for c in charges]

    def authorized(
        self,
        kind: str,
        headers: Mapping[str, str],
        query: Mapping[str, str],
        token: str,
        account: str,
    ) -> bool:
        if kind != "notification":
            return super().authorized(kind, headers, query, token, account)
        # The legacy lookup takes the seller's e-mail and token in the query.
        given = query.get("token", "")
        email_ok = query.get("email", "") == account
        return email_ok & credential_matches(given, token)

    def not_found(self, kind: str, object_id: str) -> ApiAnswer:
        if kind == "notification":
            xml = b"<errors><error><code>404</code><message>Not Found</message></error></errors>"
            return ApiAnswer(404, content=xml, media_type="application/xml")
        label = kind.replace("_", " ")
        body = {"error_messages": [{"code": "40004", "description": f"{label} not found"}]}
        return ApiAnswer(404, body)

    def unauthorized(self, kind: str) -> ApiAnswer:
        if kind == "notification":
            return ApiAnswer(401, content="Unauthorized", media_type="text/plain")
        return super().unauthorized(kind)

    def render(self, kind: str, obj: dict[str, Any]) -> ApiAnswer:
        if kind == "notification":
            xml = tostring(_xml("transaction", obj), encoding="utf-8", xml_declaration=True)
            return ApiAnswer(200, content=xml, media_type="application/xml")
        return super().render(kind, obj)


PROFILE = PagBankProfile()
