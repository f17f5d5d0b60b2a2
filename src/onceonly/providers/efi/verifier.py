"""Efí (ex-Gerencianet) Pix webhooks: mutual TLS, plus a secret in the URL.

Efí signs nothing in the body. Its deliveries are authenticated by **mutual
TLS**: Efí presents a client certificate, and the receiving server must ask
for it and check it against Efí's CA chain (``certificate-chain-prod.crt``).
That happens in the TLS layer, before onceonly sees a byte, usually in a
proxy (nginx ``ssl_verify_client on``). onceonly checks, per delivery:

- the **hmac** query parameter: a secret you put in the webhook URL you
  register at Efí (``...?hmac=<secret>&ignorar=``), compared in constant time
  against every configured secret. Efí recommends it as the second factor,
  and as the only one when the webhook is registered with
  ``x-skip-mtls-checking: true`` (mTLS not enforced on your side). Required.
- optionally, a header set by the proxy that terminated the TLS connection,
  naming the outcome of its client-certificate check
  (``client_cert_header="x-ssl-client-verify"``, expected value
  ``client_cert_value="SUCCESS"``, nginx's ``$ssl_client_verify``). Only
  meaningful if the proxy always sets it itself, overwriting what the client
  sent.

Efí appends ``/pix`` to the registered URL; registering it with a trailing
``&ignorar=`` parameter makes that suffix land in an ignored query parameter
(``?hmac=...&ignorar=/pix``), so the route stays ``/webhooks/efi``; without
it, the suffix sticks to the secret (``?hmac=<secret>/pix``), which is
accepted too.

The body is ``{"pix": [{"endToEndId", "txid", "valor", "horario", ...}]}``,
and one delivery can carry **several** Pix. A delivery is one event (see
:func:`pix_event_id`); the handler iterates over ``pix``. A refund
(``devolucoes`` inside a Pix) is reported again under the same
``endToEndId``, with its own id and status: that is part of the event id, so
it is a new event, not a duplicate of the payment.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..._exceptions import ConfigurationError, PayloadError
from ...events import Delivery, EventInfo
from ..base import (
    Provider,
    any_match,
    as_event_id,
    json_object,
    moment,
    object_text,
    sha256_hex,
)

__all__ = ["Efi", "pix_event_id", "pix_items"]

#: The query parameter that carries the secret.
HMAC_PARAM = "hmac"


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


def pix_items(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Pix of a notification body; :class:`PayloadError` when it has none."""
    items = data.get("pix")
    if not isinstance(items, list) or not items:
        raise PayloadError("body has no 'pix' list")
    if not all(isinstance(item, dict) for item in items):
        raise PayloadError("'pix' holds something that is not an object")
    for item in items:
        as_event_id(item.get("endToEndId"), "pix[].endToEndId")
    return items


def _refunds(item: Mapping[str, Any]) -> list[list[str]]:
    refunds = item.get("devolucoes")
    if not isinstance(refunds, list):
        return []
    return sorted(
        [str(refund.get("id") or refund.get("rtrId") or ""), str(refund.get("status") or "")]
        for refund in refunds
        if isinstance(refund, dict)
    )


def pix_event_id(data: Mapping[str, Any]) -> str:
    """The event id of one Efí delivery.

    One Pix without refunds: its ``endToEndId`` (readable, and the same id
    the API knows it by). Anything else: ``pix:`` and a SHA-256 of the sorted
    end-to-end ids with each one's refunds (id and status), so the order of
    the list does not matter, a resend of the same Pix dedupes, and a refund
    or a refund's new status is a new event.
    """
    items = pix_items(data)
    if len(items) == 1 and not _refunds(items[0]):
        return as_event_id(items[0]["endToEndId"], "pix[0].endToEndId")
    canonical = sorted([str(item["endToEndId"]), _refunds(item)] for item in items)
    return "pix:" + sha256_hex(json.dumps(canonical, separators=(",", ":")).encode())


class Efi(Provider):
    """Efí Pix: the ``hmac`` query secret, and optionally a proxy's client
    certificate verdict header."""

    name = "efi"
    environ_options = (
        ("client_cert_header", lambda raw, _: raw.strip().lower()),
        ("client_cert_value", lambda raw, _: raw.strip()),
    )

    def __init__(
        self,
        secrets: Sequence[str] | str,
        *,
        client_cert_header: str | None = None,
        client_cert_value: str = "SUCCESS",
        rejection_status: int = 401,
    ) -> None:
        super().__init__(secrets, rejection_status=rejection_status)
        self.client_cert_header = (client_cert_header or "").strip().lower() or None
        self.client_cert_value = client_cert_value.strip()
        if self.client_cert_header and not self.client_cert_value:
            raise ConfigurationError("efi: client_cert_value must not be empty")

    def verify(self, delivery: Delivery) -> None:
        given = delivery.query.get(HMAC_PARAM, "").strip()
        if not given:
            raise self.reject(f"missing {HMAC_PARAM} query parameter")
        # Registered without the trailing "&ignorar=", the "/pix" Efí appends
        # to the URL sticks to the secret: accept it there too (it adds no
        # way in: the secret itself still has to be right).
        candidates = [given, given.removesuffix("/pix")] if given.endswith("/pix") else [given]
        if not any_match((_digest(s) for s in self.secrets), [_digest(c) for c in candidates]):
            raise self.reject(f"{HMAC_PARAM} query parameter does not match")
        if self.client_cert_header:
            verdict = delivery.headers.get(self.client_cert_header, "").strip()
            if verdict != self.client_cert_value:
                raise self.reject(
                    f"{self.client_cert_header} header is not {self.client_cert_value!r}: "
                    "the proxy did not verify Efí's client certificate"
                )

    def identify(self, delivery: Delivery) -> EventInfo:
        data = json_object(delivery)
        event_id = pix_event_id(data)
        items = pix_items(data)
        refunded = any(_refunds(item) for item in items)
        # One Pix is about its charge (txid, or the Pix itself without one),
        # paid at `horario`; a delivery of several is about no single object.
        single = items[0] if len(items) == 1 else {}
        return EventInfo(
            event_id,
            "pix.devolucao" if refunded else "pix",
            object_id=object_text(single.get("txid")) or object_text(single.get("endToEndId")),
            occurred_at=moment(single.get("horario")),
        )

    def sign(
        self,
        body: bytes,
        *,
        timestamp: int | None = None,
        delivery_id: str | None = None,
        query: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """No header is signed; the secret goes in the query (:meth:`sign_query`).
        With a client certificate header configured, the fake gateway plays
        the proxy and sets it."""
        if self.client_cert_header:
            return {self.client_cert_header: self.client_cert_value}
        return {}

    def sign_query(self, query: Mapping[str, str] | None = None) -> dict[str, str]:
        """`query` with ``hmac`` (the first secret) and Efí's ``ignorar=/pix``."""
        return {**(query or {}), HMAC_PARAM: self.secrets[0], "ignorar": "/pix"}
