"""Efí Pix as ``onceonly dev`` plays it: its retries, its Pix notifications and
its API, including the OAuth2 token endpoint (no mutual TLS in the fake)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import random
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ..profile import (
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

__all__ = ["PROFILE", "EfiProfile", "fake_access_token"]

#: Efí's ISPB, the first digits of the end-to-end ids of Pix it settles.
_ISPB = "09089356"


def fake_access_token(client_secret: str) -> str:
    """The access token the fake API issues for `client_secret`: derived, so
    the fake keeps no session state and any of its processes accepts it."""
    return "efi-dev-" + hashlib.sha256(b"efi-dev:" + client_secret.encode()).hexdigest()[:32]


class EfiProfile(DevProfile):
    name = "efi"
    schedule = DeliverySchedule(
        "efi",
        (60.0, 5 * 60.0, 15 * 60.0),
        timeout=10.0,
        source="Efí Pix: a few retries when no 2xx comes (third-party guides say up to "
        "3); the delays and the timeout are assumptions.",
    )
    event_type = "pix"
    paid_status = None
    routes = (
        FakeRoute("/v2/pix/{object_id}", "pix"),
        FakeRoute("/oauth/token", "token", methods=("POST",)),
    )

    def object_id(self, digits: str, token: str) -> str:
        # E + ISPB (8) + yyyyMMddHHmm + 11 characters: 32 in all.
        moment = datetime.fromtimestamp(time.time(), UTC).strftime("%Y%m%d%H%M")
        return f"E{_ISPB}{moment}{token[:11]}"

    def build_event(
        self, kind: str, event_id: str | None, facts: PaymentFacts, token: str, r: random.Random
    ) -> Outgoing:
        pix: dict[str, Any] = {
            "endToEndId": facts.object_id,
            "txid": token[:26],
            "chave": "onceonly-dev@example.com",
            "valor": f"{facts.amount / 100:.2f}",
            "horario": iso_time(),
            "infoPagador": f"onceonly dev {event_id or token[:8]}",
            **facts.extra,
        }
        return Outgoing(event_id or facts.object_id, encode({"pix": [pix]}))

    def api_objects(
        self, event: Outgoing, body: Any, facts: PaymentFacts, state: str
    ) -> list[ApiObject]:
        # A received Pix has no status of its own at Efí (a refund has one);
        # the fake keeps the gateway's state in "status" so it can be changed.
        return [("pix", item["endToEndId"], {**item, "status": state}) for item in body["pix"]]

    def authorized(
        self,
        kind: str,
        headers: Mapping[str, str],
        query: Mapping[str, str],
        token: str,
        account: str,
    ) -> bool:
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if kind == "token":
            # Basic Client_Id:Client_Secret; the fake's token is the secret.
            if scheme.lower() != "basic":
                return False
            try:
                decoded = base64.b64decode(given.strip(), validate=True).decode()
            except (binascii.Error, ValueError):
                return False
            client_id, _, secret = decoded.partition(":")
            return bool(client_id) & credential_matches(secret, token)
        if scheme.lower() != "bearer":
            return False
        return credential_matches(given.strip(), fake_access_token(token))

    def answer(self, kind: str, headers: Mapping[str, str], token: str) -> ApiAnswer | None:
        if kind != "token":
            return None
        return ApiAnswer(
            200,
            {
                "access_token": fake_access_token(token),
                "token_type": "Bearer",
                "expires_in": 3600,
                "scope": "pix.read",
            },
        )

    def not_found(self, kind: str, object_id: str) -> ApiAnswer:
        return ApiAnswer(
            404,
            {
                "nome": "pix_nao_encontrado",
                "mensagem": "Pix não encontrado para o e2eid informado",
            },
        )

    def unauthorized(self, kind: str) -> ApiAnswer:
        if kind == "token":
            return ApiAnswer(
                401,
                {"error": "invalid_client", "error_description": "Invalid or inactive credentials"},
            )
        return ApiAnswer(401, {"nome": "nao_autorizado", "mensagem": "Requisição não autorizada"})


PROFILE = EfiProfile()
