"""Public-key signatures for the providers that use them (Standard Webhooks
``v1a``, Pagar.me's ``X-Webhook-Asymmetric-Signature``), through the optional
:mod:`cryptography` package.

HMAC needs nothing beyond the standard library; ed25519 and RSA do. The
package is imported only when a provider is configured with a public key, so
an installation that verifies HMAC alone does not need it, and one that
configures a key without it gets a :class:`~onceonly.ConfigurationError` that
says what to install when the provider is built (at start-up), not on the
first delivery.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._exceptions import ConfigurationError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey

__all__ = [
    "INSTALL_HINT",
    "b64url_decode",
    "ed25519_private_key",
    "ed25519_public_key",
    "ed25519_verifies",
    "rsa_public_key_from_jwk",
    "rsa_sha256_verifies",
]

#: What to install for public-key signatures.
INSTALL_HINT = "pip install 'onceonly[asymmetric]' (or cryptography>=42)"


def _missing(what: str) -> ConfigurationError:
    return ConfigurationError(f"{what} needs the 'cryptography' package: {INSTALL_HINT}")


def b64url_decode(text: str) -> bytes:
    """Base64url without padding (JWK members, JWS signatures); ``ValueError`` if not."""
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("not base64url") from None


def ed25519_public_key(raw: bytes, what: str) -> Ed25519PublicKey:
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    except ImportError:
        raise _missing(what) from None
    if len(raw) != 32:
        raise ConfigurationError(f"{what}: an ed25519 public key is 32 bytes, got {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def ed25519_private_key(raw: bytes, what: str) -> Ed25519PrivateKey:
    """From the 32-byte seed, or libsodium's 64 bytes (seed then public key)."""
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    except ImportError:
        raise _missing(what) from None
    if len(raw) not in (32, 64):
        raise ConfigurationError(
            f"{what}: an ed25519 secret key is 32 bytes (or 64 with its public key), got {len(raw)}"
        )
    key = Ed25519PrivateKey.from_private_bytes(raw[:32])
    if len(raw) == 64:
        public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        if public != raw[32:]:
            raise ConfigurationError(f"{what}: the public half does not belong to the seed")
    return key


def ed25519_verifies(key: Ed25519PublicKey, signature: bytes, data: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        key.verify(signature, data)
    except InvalidSignature:
        return False
    return True


def rsa_public_key_from_jwk(jwk: Mapping[str, Any], what: str) -> RSAPublicKey:
    """An RSA public key from a JWK's ``n`` and ``e`` (RFC 7518 section 6.3.1)."""
    try:
        from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicNumbers
    except ImportError:
        raise _missing(what) from None
    n, e = jwk.get("n"), jwk.get("e")
    if not isinstance(n, str) or not isinstance(e, str):
        raise ConfigurationError(f"{what}: an RSA JWK needs 'n' and 'e'")
    try:
        numbers = RSAPublicNumbers(
            int.from_bytes(b64url_decode(e), "big"), int.from_bytes(b64url_decode(n), "big")
        )
        key = numbers.public_key()
    except ValueError as exc:
        raise ConfigurationError(f"{what}: not a usable RSA key ({exc})") from None
    if key.key_size < 2048:
        # Anything shorter is forgeable in practice; no sender should use one.
        raise ConfigurationError(f"{what}: RSA key of {key.key_size} bits is too short")
    return key


def rsa_sha256_verifies(key: RSAPublicKey, signature: bytes, data: bytes) -> bool:
    """RS256: RSASSA-PKCS1-v1_5 with SHA-256."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    try:
        key.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        return False
    return True
