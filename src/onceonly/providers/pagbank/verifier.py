"""PagBank (PagSeguro): the current API and the legacy form post.

**Current API.** Header ``x-authenticity-token``: the SHA-256 hex digest of
``"{token}-{raw body}"``, a plain hash and not an HMAC, where the token is the
account's API token. Compared in constant time against every configured
token.

The body is the order or charge itself (``ORDE_...``, ``CHAR_...``) and carries
no event id, so onceonly derives one: ``<object id>:<state>``, where the state
is a short hash of the object's ``status`` and, for each charge, its id,
``status`` and ``amount.summary`` (total, paid, refunded). A resend of the same
notification yields the same id even if other fields (timestamps, links)
differ, so it dedupes; a payment, a cancellation or a partial refund changes
the state, so it is a new event and is not swallowed as a duplicate. A body
without ``id`` gets ``sha256:<hex of the raw body>``. Type: ``order`` or
``charge`` (from the id prefix; ``order`` for a body with ``charges``), else
``None``.

**Legacy PagSeguro.** A form post ``notificationCode=...&notificationType=
transaction`` with no signature at all: the only safe use is to look the
notification up in the API. Policy ``unsigned="fetch"`` (default) stores it as
a trigger with event id ``unverified:<notificationCode>`` (a resend has the
same code), type ``unverified:<notificationType>`` and header
``onceonly-verified: false``; ``unsigned="reject"`` answers 401.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs

from ...events import Delivery, EventInfo
from ..base import (
    UNVERIFIED,
    Provider,
    UnsignedPolicy,
    any_match,
    as_event_id,
    body_hash_id,
    json_object,
    lookup,
    moment,
    parse_unsigned_policy,
    sha256_hex,
)

__all__ = ["PagBank", "authenticity_token", "object_kind"]

_KINDS = {"ORDE_": "order", "CHAR_": "charge"}


def object_kind(object_id: Any, data: Mapping[str, Any]) -> str | None:
    """``order`` or ``charge``: what a current-API notification body is, by its
    id's prefix (an order, when the id says nothing but the body lists charges).
    The event type here, and what the API client fetches for the event."""
    if isinstance(object_id, str) and (kind := _KINDS.get(object_id[:5])):
        return kind
    return "order" if isinstance(data.get("charges"), list) else None


def authenticity_token(token: str, body: bytes) -> str:
    """What PagBank sends in ``x-authenticity-token`` for `body`."""
    return sha256_hex(token.encode(), b"-", body)


def _state(data: Mapping[str, Any]) -> str:
    """A short, stable digest of what changes when the object changes state."""
    charges = data.get("charges")
    charge_states = sorted(
        (
            [str(charge.get("id")), charge.get("status"), lookup(charge, "amount.summary")]
            for charge in (charges if isinstance(charges, list) else [])
            if isinstance(charge, dict)
        ),
        key=lambda item: json.dumps(item, sort_keys=True, default=str),
    )
    state = [data.get("status"), lookup(data, "amount.summary"), charge_states]
    canonical = json.dumps(state, sort_keys=True, separators=(",", ":"), default=str)
    return sha256_hex(canonical.encode())[:16]


class PagBank(Provider):
    """PagBank's ``x-authenticity-token`` (a plain SHA-256, not an HMAC) and,
    by policy, PagSeguro's unsigned legacy form post as a trigger to fetch."""

    name = "pagbank"
    environ_options = (("unsigned", parse_unsigned_policy),)

    def __init__(
        self,
        secrets: Sequence[str] | str,
        *,
        unsigned: UnsignedPolicy = "fetch",
        rejection_status: int = 401,
    ) -> None:
        super().__init__(secrets, rejection_status=rejection_status)
        self.unsigned = parse_unsigned_policy(unsigned, "pagbank unsigned policy")

    @staticmethod
    def _legacy_form(delivery: Delivery) -> dict[str, str] | None:
        """The legacy notification's fields, when the delivery is one."""
        if delivery.headers.get("x-authenticity-token", "").strip():
            return None
        try:
            fields = parse_qs(delivery.body.decode("utf-8"), strict_parsing=True)
        except (UnicodeDecodeError, ValueError):
            return None
        if not fields.get("notificationCode"):
            return None
        return {name: values[0] for name, values in fields.items()}

    def verify(self, delivery: Delivery) -> None:
        if self._legacy_form(delivery) is not None:
            if self.unsigned == "fetch":
                return  # stored as an unverified trigger by identify()
            raise self.reject("legacy PagSeguro notifications are unsigned and rejected")
        given = self.require_header(delivery, "x-authenticity-token").strip().lower()
        expected = (authenticity_token(t, delivery.body).encode() for t in self.secrets)
        if not any_match(expected, [given.encode("ascii", "replace")]):
            raise self.reject("x-authenticity-token does not match")

    def identify(self, delivery: Delivery) -> EventInfo:
        form = self._legacy_form(delivery)
        if form is not None:
            code = as_event_id(form["notificationCode"], "notificationCode")
            topic = form.get("notificationType") or "notification"
            return EventInfo(UNVERIFIED + code, UNVERIFIED + topic, {"onceonly-verified": "false"})
        data = json_object(delivery)
        raw_id = data.get("id")
        if raw_id is None:
            return EventInfo(body_hash_id(delivery.body))
        object_id = as_event_id(raw_id, "body id")
        return EventInfo(
            f"{object_id}:{_state(data)}",
            object_kind(object_id, data),
            object_id=object_id,
            occurred_at=moment(data.get("updated_at") or data.get("created_at")),
        )

    def sign(
        self,
        body: bytes,
        *,
        timestamp: int | None = None,
        delivery_id: str | None = None,
        query: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """``x-authenticity-token`` for the current API (PagBank signs no
        timestamp and sends no delivery id)."""
        return {"x-authenticity-token": authenticity_token(self.secrets[0], body)}
