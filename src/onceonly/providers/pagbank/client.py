"""PagBank: ``GET /orders/{id}`` and ``GET /charges/{id}`` (Bearer token), and the
legacy PagSeguro notification lookup.

The current API's notifications carry the order (``ORDE_...``) or the charge
(``CHAR_...``) itself; by default an event points to that object, read again
from ``https://api.pagseguro.com`` (sandbox ``https://sandbox.api.pagseguro.com``).
``fetch(event, "charge")`` on an order reads its first charge.

The legacy form post (``notificationCode=...&notificationType=transaction``)
carries nothing but a code. Whether an event is one is read from what the
provider stored at receive time (its ``unverified:`` type), never from the
body's text: the transaction is read from
``GET /v3/transactions/notifications/{code}?email=...&token=...`` at
``https://ws.pagseguro.uol.com.br``, which answers XML. The answer is parsed
with :mod:`defusedxml` (no DTD, no entities: an XML bomb or an external entity
is refused, not expanded) into a dict of strings, e.g. ``{"code": ...,
"status": "3", ...}`` (PagSeguro's numeric status: 3 is paid); a repeated tag
becomes a list. The legacy API takes its credentials in the query string; they
are masked in messages and in the ``httpx`` logger's lines.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Self
from urllib.parse import parse_qs

from ..._exceptions import ApiError, ConfigurationError, NotFetchable
from ...events import Event
from ..base import env_name, is_unverified
from ..client import (
    EXCERPT_CHARS,
    RECONCILED_HEADER,
    ApiClient,
    ApiRetryPolicy,
    Listed,
    Target,
    body_json,
    check_base_url,
    listed_body,
    path_id,
    safe_id,
)
from .verifier import _state, object_kind

__all__ = ["PagBankClient", "parse_transaction_xml"]

_PATHS = {"order": "/orders/{}", "charge": "/charges/{}"}
# The XML answer of the legacy API: a few kilobytes. Anything far larger is
# not a transaction.
_MAX_XML_BYTES = 1024 * 1024


def _element_value(element: Any) -> Any:
    children = list(element)
    if not children:
        return (element.text or "").strip()
    out: dict[str, Any] = {}
    for child in children:
        value = _element_value(child)
        if child.tag in out:
            existing = out[child.tag]
            if isinstance(existing, list):
                existing.append(value)
            else:
                out[child.tag] = [existing, value]
        else:
            out[child.tag] = value
    return out


def parse_transaction_xml(content: bytes) -> dict[str, Any]:
    """The legacy API's ``<transaction>`` answer as a dict; ``ValueError`` when
    it is not one (malformed, a DTD or entities, another root element)."""
    from defusedxml import DefusedXmlException
    from defusedxml.ElementTree import ParseError, fromstring

    if len(content) > _MAX_XML_BYTES:
        raise ValueError("answer is larger than any transaction")
    try:
        root = fromstring(content, forbid_dtd=True)
    except (ParseError, DefusedXmlException) as exc:
        raise ValueError(f"not acceptable XML ({type(exc).__name__}: {exc})") from None
    if root.tag != "transaction":
        raise ValueError(f"root element is <{root.tag}>, not <transaction>")
    value = _element_value(root)
    return value if isinstance(value, dict) else {}


def _is_legacy(event: Event) -> bool:
    """What the provider recorded when it received the event: a legacy form post
    is stored with an ``unverified:`` type, a signed current-API notification
    never is. Never the body's text: a signed order's free-text field can hold
    ``&notificationCode=...`` and must not pick the transaction to read."""
    return is_unverified(event.event_type)


def _legacy_code(event: Event) -> str:
    try:
        text = event.body.decode("utf-8")
    except UnicodeDecodeError:
        text = event.body.decode("latin-1")
    return parse_qs(text).get("notificationCode", [""])[0]


class PagBankClient(ApiClient):
    """Reads orders and charges from PagBank's API, and legacy PagSeguro
    notifications (``legacy_email`` and a token needed for those)."""

    name = "pagbank"
    default_base_url = "https://api.pagseguro.com"
    default_legacy_base_url = "https://ws.pagseguro.uol.com.br"
    kinds = ("order", "charge", "notification")
    token_required = False

    def __init__(
        self,
        token: str = "",
        *,
        base_url: str | None = None,
        legacy_email: str | None = None,
        legacy_token: str | None = None,
        legacy_base_url: str | None = None,
        timeout: float = 10.0,
        retry: ApiRetryPolicy | None = None,
    ) -> None:
        super().__init__(token, base_url=base_url, timeout=timeout, retry=retry)
        self.legacy_email = (legacy_email or "").strip()
        self.legacy_token = (legacy_token or "").strip() or self.token
        self.legacy_base_url = check_base_url(
            (legacy_base_url or self.default_legacy_base_url).rstrip("/"), "legacy PagSeguro"
        )
        if not self.token and not (self.legacy_email and self.legacy_token):
            raise ConfigurationError(
                "the pagbank API client needs a token, or legacy_email and legacy_token"
            )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], route: str) -> Self | None:
        """``ONCEONLY_<ROUTE>_API_TOKEN`` / ``_API_BASE``, plus for the legacy API
        ``_LEGACY_EMAIL``, ``_LEGACY_TOKEN`` (default: the API token) and
        ``_LEGACY_API_BASE``."""
        token = environ.get(env_name(route, "API_TOKEN"), "").strip()
        email = environ.get(env_name(route, "LEGACY_EMAIL"), "").strip()
        legacy_token = environ.get(env_name(route, "LEGACY_TOKEN"), "").strip()
        if not token and not (email and legacy_token):
            return None
        return cls(
            token,
            legacy_email=email or None,
            legacy_token=legacy_token or None,
            legacy_base_url=environ.get(env_name(route, "LEGACY_API_BASE")) or None,
            **cls.common_options(environ, route),
        )

    def secrets(self) -> tuple[str, ...]:
        return (self.token, self.legacy_token)

    def for_tenant(self, *, token: str | None = None, account: str | None = None) -> Self:
        twin = super().for_tenant(token=token, account=account)
        # The legacy API's e-mail and token are the platform's own account:
        # never used to read a merchant's notifications.
        twin.legacy_email = ""
        twin.legacy_token = twin.token
        return twin

    def target(self, event: Event, kind: str | None = None) -> Target:
        if kind is not None:
            self.kind_or_default(kind)
        if _is_legacy(event):
            if kind not in (None, "notification"):
                raise NotFetchable(
                    f"a legacy PagSeguro notification points to a transaction, not a {kind}"
                )
            return Target("notification", safe_id(_legacy_code(event), "notificationCode"))
        if kind == "notification":
            raise NotFetchable(
                f"PagBank event {event.event_id} is a current-API notification, "
                "not a legacy PagSeguro one"
            )
        body = body_json(event)
        object_id = body.get("id")
        own = object_kind(object_id, body)
        if own is None:
            raise NotFetchable(f"PagBank event {event.event_id} carries no order or charge id")
        wanted = kind or own
        if wanted == own:
            return Target(own, safe_id(object_id, f"PagBank {own} id"))
        if wanted == "charge" and own == "order":
            charges = body.get("charges")
            first = charges[0] if isinstance(charges, list) and charges else None
            if isinstance(first, dict) and first.get("id"):
                return Target("charge", safe_id(first["id"], "PagBank charges[0].id"))
        raise NotFetchable(f"PagBank event {event.event_id} (a {own}) names no {wanted}")

    async def get(self, target: Target) -> dict[str, Any]:
        kind = self.kind_or_default(target.kind)
        if kind == "notification":
            return await self.retrieve_notification(target.id)
        if not self.token:
            raise ConfigurationError("the pagbank API client has no token for the current API")
        return await self.get_json(_PATHS[kind].format(path_id(target.id)))

    async def retrieve_notification(self, code: str) -> dict[str, Any]:
        """The transaction a legacy notification code points to."""
        if not (self.legacy_email and self.legacy_token):
            raise ConfigurationError(
                "legacy PagSeguro notifications need legacy_email and a token "
                "(ONCEONLY_PAGBANK_LEGACY_EMAIL)"
            )
        path = f"/v3/transactions/notifications/{path_id(safe_id(code, 'notificationCode'))}"
        response = await self.request(
            self.legacy_base_url + path,
            params={"email": self.legacy_email, "token": self.legacy_token},
            headers={"accept": "application/xml"},
        )
        try:
            return parse_transaction_xml(response.content)
        except ValueError as exc:
            excerpt = self.redact(response.text[:EXCERPT_CHARS])
            raise ApiError(
                f"legacy PagSeguro API answered GET {path} with an unusable body ({exc})",
                provider=self.name,
                status=response.status_code,
                body=excerpt,
            ) from None

    async def retrieve_order(self, order_id: str) -> dict[str, Any]:
        """``GET /orders/{order_id}``."""
        return await self.get(Target("order", safe_id(order_id, "order id")))

    async def retrieve_charge(self, charge_id: str) -> dict[str, Any]:
        """``GET /charges/{charge_id}``."""
        return await self.get(Target("charge", safe_id(charge_id, "charge id")))

    async def listing(
        self, since: datetime, *, ids: Sequence[str] = (), failed_only: bool = False
    ) -> AsyncIterator[Listed]:
        """PagBank's API has no endpoint that lists orders or charges by time:
        only ``GET /orders/{id}`` for `ids` (``ORDE_...``). Each order becomes
        the event a notification of that state would be, with the same id
        (``<order id>:<state digest>``, as :class:`~onceonly.providers.PagBank`
        identifies a delivery): dedup with a delivered copy is exact."""
        if not ids:
            raise ConfigurationError(
                "PagBank's API cannot list orders by time: pass the order ids to "
                "check (onceonly reconcile pagbank --id ORDE_...)"
            )
        for order_id in ids:
            order = await self.get(Target("order", safe_id(order_id, "order id")))
            object_id = safe_id(order.get("id"), "the PagBank order id")
            yield Listed(
                f"{object_id}:{_state(order)}",
                object_kind(object_id, order),
                listed_body(order),
                {RECONCILED_HEADER: "pagbank:order"},
            )
