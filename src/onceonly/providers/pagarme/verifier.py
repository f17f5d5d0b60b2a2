"""Pagar.me (API v5, "core"): webhooks checked by HTTP Basic credentials, by
Pagar.me's RS256 signature, or both.

**Basic credentials.** A secret ``user:password`` is what you type as the
webhook's user and password in Pagar.me's dashboard; Pagar.me sends them as
``Authorization: Basic ...`` on every delivery. Compared in constant time
(both sides hashed first, as for Asaas). It authenticates the sender, not the
body: use HTTPS.

**Signature.** Pagar.me's own plugins (``pagarme/woocommerce``,
``pagarme/magento2`` through ``pagarme/ecommerce-module-core``) check the
header ``X-Webhook-Asymmetric-Signature: alg=RS256; kid=<key id>;
signature=<base64url>``: RSASSA-PKCS1-v1_5 with SHA-256 over the raw body,
with the public key of that ``kid`` in the JWKS Pagar.me publishes at
``https://hubapi.pagar.me/.well-known/jwks.json``. A secret ``jwks:<path>``
names a copy of that JSON file (a JWK Set, or one JWK); the receiver never
fetches keys over the network while it answers, and never uses a key the
delivery names that is not in the configured file. Needs the optional
``cryptography`` package. Nothing time-based is signed, so there is no
tolerance: a replay is stopped by the event id.

When both kinds of secret are configured, a delivery must pass both checks.

Event id: the body's ``id`` (``hook_...``), one per webhook, kept on
Pagar.me's retries. Type: the body's ``type`` (``order.paid``,
``charge.paid``).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..._exceptions import ConfigurationError
from ...events import Delivery, EventInfo
from ..base import (
    Provider,
    any_match,
    as_event_id,
    json_object,
    lookup,
    moment,
    object_text,
    optional_text,
)
from ..crypto import b64url_decode, rsa_public_key_from_jwk, rsa_sha256_verifies

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey

__all__ = ["Pagarme", "parse_signature_header"]

SIGNATURE_HEADER = "x-webhook-asymmetric-signature"
JWKS_PREFIX = "jwks:"


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


def basic_authorization(credentials: str) -> str:
    """The ``Authorization`` value Pagar.me sends for ``user:password``."""
    return "Basic " + base64.b64encode(credentials.encode()).decode()


def parse_signature_header(value: str) -> dict[str, str]:
    """``alg=RS256; kid=...; signature=...`` as a dict (the signature may hold ``=``)."""
    parts: dict[str, str] = {}
    for part in value.split(";"):
        name, sep, item = part.strip().partition("=")
        if sep and name:
            parts.setdefault(name.strip().lower(), item.strip())
    return parts


def load_jwks(path: str) -> dict[str, RSAPublicKey]:
    """The RSA signing keys of a JWK Set (or a single JWK) file, by ``kid``."""
    what = f"pagarme JWKS {path!r}"
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"{what}: cannot read it ({exc.strerror})") from None
    except ValueError:
        raise ConfigurationError(f"{what} is not JSON") from None
    if isinstance(document, dict) and "keys" not in document:
        document = {"keys": [document]}
    keys = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(keys, list):
        raise ConfigurationError(f"{what} is neither a JWK Set nor a JWK")
    found: dict[str, RSAPublicKey] = {}
    for jwk in keys:
        # The same filter as Pagar.me's plugins: RSA keys meant for signatures.
        if not isinstance(jwk, dict) or jwk.get("kty") != "RSA":
            continue
        if jwk.get("use", "sig") != "sig" or jwk.get("alg", "RS256") != "RS256":
            continue
        kid = jwk.get("kid")
        if not isinstance(kid, str) or not kid:
            raise ConfigurationError(f"{what}: every key needs a 'kid'")
        found[kid] = rsa_public_key_from_jwk(jwk, f"{what} key {kid!r}")
    if not found:
        raise ConfigurationError(f"{what} holds no RSA signing key")
    return found


class Pagarme(Provider):
    """Pagar.me v5 webhooks: Basic credentials (``user:password``) and/or the
    RS256 ``X-Webhook-Asymmetric-Signature`` (``jwks:<path>`` secrets)."""

    name = "pagarme"

    def __init__(self, secrets: Sequence[str] | str, *, rejection_status: int = 401) -> None:
        super().__init__(secrets, rejection_status=rejection_status)
        self._derive()

    @classmethod
    def _unguessable_secret(cls) -> str:
        # Basic credentials nobody knows: the form every secret here must have.
        return f"onceonly:{super()._unguessable_secret()}"

    def _use_secrets(self, secrets: Sequence[str] | str) -> None:
        # A tenant's copy (with_secrets) derives its own credentials and keys.
        super()._use_secrets(secrets)
        self._derive()

    def _derive(self) -> None:
        self.credentials = tuple(s for s in self.secrets if not s.startswith(JWKS_PREFIX))
        for credentials in self.credentials:
            if ":" not in credentials:
                raise ConfigurationError(
                    "pagarme secrets are 'user:password' (the webhook's Basic "
                    "credentials) or 'jwks:<path to Pagar.me's JWKS file>'"
                )
        self.keys: dict[str, RSAPublicKey] = {}
        for secret in self.secrets:
            if secret.startswith(JWKS_PREFIX):
                self.keys.update(load_jwks(secret.removeprefix(JWKS_PREFIX).strip()))

    def verify(self, delivery: Delivery) -> None:
        if self.credentials:
            given = self.require_header(delivery, "authorization").strip()
            scheme, _, rest = given.partition(" ")
            if scheme.lower() == "basic":  # the scheme is case-insensitive (RFC 9110)
                given = "Basic " + rest.strip()
            expected = (_digest(basic_authorization(c)) for c in self.credentials)
            if not any_match(expected, [_digest(given)]):
                raise self.reject("Authorization does not match the webhook's credentials")
        if self.keys:
            self._verify_signature(delivery)

    def _verify_signature(self, delivery: Delivery) -> None:
        parts = parse_signature_header(self.require_header(delivery, SIGNATURE_HEADER))
        if parts.get("alg") != "RS256":
            raise self.reject(f"{SIGNATURE_HEADER}: alg must be RS256")
        key = self.keys.get(parts.get("kid", ""))
        if key is None:
            # Only configured keys count; a kid we do not hold is a forgery
            # or a rotation the configuration has not caught up with.
            raise self.reject(f"{SIGNATURE_HEADER}: unknown kid {parts.get('kid', '')[:40]!r}")
        raw = parts.get("signature", "").replace("+", "-").replace("/", "_").rstrip("=")
        try:
            signature = b64url_decode(raw)
        except ValueError:
            raise self.reject(f"{SIGNATURE_HEADER}: signature is not base64") from None
        if not signature or not rsa_sha256_verifies(key, signature, delivery.body):
            raise self.reject(f"{SIGNATURE_HEADER} does not match")

    def identify(self, delivery: Delivery) -> EventInfo:
        data = json_object(delivery)
        return EventInfo(
            as_event_id(data.get("id"), "body id"),
            optional_text(data.get("type")),
            # The order or charge the hook is about, and when Pagar.me made the hook.
            object_id=object_text(lookup(data, "data.id")),
            occurred_at=moment(data.get("created_at")),
        )

    def sign(
        self,
        body: bytes,
        *,
        timestamp: int | None = None,
        delivery_id: str | None = None,
        query: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """The Basic credentials, as Pagar.me sends them. The RS256 signature
        needs Pagar.me's private key: a provider configured with keys only
        cannot sign."""
        if not self.credentials:
            raise ConfigurationError(
                "pagarme: cannot sign with Pagar.me's public keys; configure "
                "'user:password' credentials to send test deliveries"
            )
        return {"authorization": basic_authorization(self.credentials[0])}
