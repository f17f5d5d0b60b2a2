"""Efí Pix API: ``GET /v2/pix/{endToEndId}``, with an OAuth2 access token and,
in production, mutual TLS.

Efí's Pix API takes an access token from ``POST /oauth/token`` (HTTP Basic
with the application's Client_Id and Client_Secret, JSON body
``{"grant_type": "client_credentials"}``; the answer carries
``access_token`` and ``expires_in``), and every call, the token request
included, must present the application's certificate (the ``.p12`` Efí
issues, converted to PEM: ``openssl pkcs12 -in cert.p12 -out cert.pem
-nodes``). The client asks for a token on first use, keeps it until a minute
before it expires, and asks again once when the API answers 401.

Base URLs: ``https://pix.api.efipay.com.br`` (production),
``https://pix-h.api.efipay.com.br`` (homologation).

A delivery can carry several Pix: ``ctx.fetch()`` reads the one it carries,
and on a delivery with several raises :class:`~onceonly.NotFetchable` (which
one would it be?); iterate over ``pix`` and call :meth:`EfiClient.retrieve_pix`
for each.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from ..._exceptions import ApiError, ApiUnavailable, ConfigurationError, NotFetchable
from ...events import Event
from ..base import env_name
from ..client import (
    EXCERPT_CHARS,
    ApiClient,
    ApiRetryPolicy,
    Target,
    body_json,
    path_id,
    safe_id,
)

if TYPE_CHECKING:
    import httpx

__all__ = ["EfiClient"]

#: Ask for a new token this long before the current one expires.
_EARLY = 60.0


class EfiClient(ApiClient):
    """Reads Pix from Efí's Pix API (base ``https://pix.api.efipay.com.br``).

    `client_secret` is the ``token`` of the base class (it is what is masked
    in messages, with the access token). `cert` is the path of the PEM file
    with the application's certificate and key (`key`: the key's own file,
    when separate); without one, no client certificate is presented (the
    fake API of ``onceonly dev``; Efí's real API refuses the connection).
    """

    name = "efi"
    default_base_url = "https://pix.api.efipay.com.br"
    kinds = ("pix",)

    def __init__(
        self,
        client_id: str,
        client_secret: str,
        *,
        cert: str | None = None,
        key: str | None = None,
        base_url: str | None = None,
        timeout: float = 10.0,
        retry: ApiRetryPolicy | None = None,
    ) -> None:
        super().__init__(client_secret, base_url=base_url, timeout=timeout, retry=retry)
        self.client_id = client_id.strip()
        if not self.client_id:
            raise ConfigurationError("the efi API client needs a client_id")
        self.cert = cert
        self.key = key
        self._ssl: ssl.SSLContext | None = None
        if cert:
            # Loaded now: a wrong path is a start-up error, not a failed event.
            self._ssl = self._load_certificate(cert, key)
        self._access_token: str | None = None
        self._expires_at = 0.0

    @staticmethod
    def _load_certificate(cert: str, key: str | None) -> ssl.SSLContext:
        import httpx

        for path in (cert, key):
            if path and not Path(path).is_file():
                raise ConfigurationError(f"efi API certificate {path!r} is not a file")
        context = httpx.create_ssl_context()
        try:
            context.load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigurationError(f"efi API certificate {cert!r}: {exc}") from None
        return context

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], route: str) -> Self | None:
        """``ONCEONLY_<ROUTE>_API_CLIENT_ID`` and ``_API_CLIENT_SECRET`` (both
        needed), ``_API_CERT`` (PEM path), ``_API_KEY`` (its key, if separate)
        and ``_API_BASE``."""
        client_id = environ.get(env_name(route, "API_CLIENT_ID"), "").strip()
        client_secret = environ.get(env_name(route, "API_CLIENT_SECRET"), "").strip()
        if not client_id or not client_secret:
            return None
        return cls(
            client_id,
            client_secret,
            cert=environ.get(env_name(route, "API_CERT")) or None,
            key=environ.get(env_name(route, "API_KEY")) or None,
            **cls.common_options(environ, route),
        )

    def ssl_context(self) -> ssl.SSLContext:
        return self._ssl if self._ssl is not None else super().ssl_context()

    def secrets(self) -> tuple[str, ...]:
        return (self.token, self._access_token or "")

    def auth_headers(self) -> dict[str, str]:
        # The access token is added per request (it is fetched, not configured).
        return {}

    # OAuth2 client credentials.

    async def access_token(self) -> str:
        """A valid access token: the cached one, or a new one from ``/oauth/token``."""
        if self._access_token and time.monotonic() < self._expires_at:
            return self._access_token
        import httpx

        basic = base64.b64encode(f"{self.client_id}:{self.token}".encode()).decode()
        try:
            response = await self._http().post(
                "/oauth/token",
                content=json.dumps({"grant_type": "client_credentials"}),
                headers={
                    "authorization": f"Basic {basic}",
                    "content-type": "application/json",
                    "accept": "application/json",
                },
            )
        except httpx.RequestError as exc:
            raise ApiUnavailable(
                f"efi API unavailable for POST /oauth/token ({type(exc).__name__})",
                provider=self.name,
            ) from None
        excerpt = self.redact(response.text[:EXCERPT_CHARS])
        if response.status_code >= 500 or response.status_code == 429:
            raise ApiUnavailable(
                f"efi API answered {response.status_code} to POST /oauth/token: {excerpt}",
                provider=self.name,
                status=response.status_code,
                body=excerpt,
            )
        token, lifetime = self._parse_token(response)
        if token is None:
            raise ApiError(
                f"efi API refused the client credentials ({response.status_code}): {excerpt}",
                provider=self.name,
                status=response.status_code,
                body=excerpt,
            )
        self._access_token = token
        self._expires_at = time.monotonic() + max(0.0, lifetime - _EARLY)
        return token

    @staticmethod
    def _parse_token(response: httpx.Response) -> tuple[str | None, float]:
        if response.status_code != 200:
            return None, 0.0
        try:
            data = response.json()
        except (ValueError, UnicodeDecodeError):
            return None, 0.0
        token = data.get("access_token") if isinstance(data, dict) else None
        if not isinstance(token, str) or not token:
            return None, 0.0
        lifetime = data.get("expires_in", 3600)
        return token, float(lifetime) if isinstance(lifetime, int | float) else 3600.0

    async def request(
        self,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        token = await self.access_token()
        try:
            return await super().request(
                path, params=params, headers={"authorization": f"Bearer {token}", **(headers or {})}
            )
        except ApiError as exc:
            if isinstance(exc, ApiUnavailable) or exc.status != 401:
                raise
        # Revoked or expired early: one new token, one more try.
        self._access_token = None
        token = await self.access_token()
        return await super().request(
            path, params=params, headers={"authorization": f"Bearer {token}", **(headers or {})}
        )

    # Objects.

    def target(self, event: Event, kind: str | None = None) -> Target:
        self.kind_or_default(kind)
        items = body_json(event).get("pix")
        if not isinstance(items, list) or not items:
            raise NotFetchable(f"Efí event {event.event_id} carries no pix")
        if len(items) > 1:
            raise NotFetchable(
                f"Efí event {event.event_id} carries {len(items)} pix: iterate over "
                "them and call retrieve_pix(endToEndId) for each"
            )
        first = items[0] if isinstance(items[0], dict) else {}
        return Target("pix", safe_id(first.get("endToEndId"), "Efí pix[0].endToEndId"))

    async def get(self, target: Target) -> dict[str, Any]:
        self.kind_or_default(target.kind)
        return await self.get_json(f"/v2/pix/{path_id(target.id)}")

    async def retrieve_pix(self, end_to_end_id: str) -> dict[str, Any]:
        """``GET /v2/pix/{end_to_end_id}``."""
        return await self.get(Target("pix", safe_id(end_to_end_id, "endToEndId")))
