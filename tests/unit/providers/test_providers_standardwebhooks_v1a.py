"""Standard Webhooks ``v1a``: ed25519 over ``"{id}.{timestamp}.{body}"``, public
keys configured as ``whpk_<base64>``.

No official v1a test vector is published with its key (the spec's example
header shows a v1a entry but not the key that made it), and the
``standardwebhooks`` package verifies v1 only. The signatures here are made
with ``cryptography`` directly from the spec's text, independently of the
provider's own ``sign``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import sys

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from onceonly import ConfigurationError, Delivery, SignatureError
from onceonly.providers import StandardWebhooks

NOW = 1_700_000_000
MSG_ID = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"
BODY = b'{"type":"contact.created","timestamp":"2022-11-03T20:26:10.344522Z","data":{"id":"1"}}'
HMAC_KEY = b"0123456789abcdef01234567"
WHSEC = "whsec_" + base64.b64encode(HMAC_KEY).decode()


def frozen() -> float:
    return float(NOW)


def new_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def whpk(key: Ed25519PrivateKey) -> str:
    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return "whpk_" + base64.b64encode(raw).decode()


def whsk(key: Ed25519PrivateKey) -> str:
    from cryptography.hazmat.primitives.serialization import NoEncryption, PrivateFormat

    seed = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return "whsk_" + base64.b64encode(seed).decode()


def v1a(key: Ed25519PrivateKey, body: bytes = BODY, t: int = NOW, msg_id: str = MSG_ID) -> str:
    signed = f"{msg_id}.{t}.".encode() + body
    return "v1a," + base64.b64encode(key.sign(signed)).decode()


def v1(body: bytes = BODY, t: int = NOW, msg_id: str = MSG_ID, key: bytes = HMAC_KEY) -> str:
    mac = hmac.new(key, f"{msg_id}.{t}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def delivery(signature: str, body: bytes = BODY, t: int = NOW, prefix: str = "webhook") -> Delivery:
    headers = {
        f"{prefix}-id": MSG_ID,
        f"{prefix}-timestamp": str(t),
        f"{prefix}-signature": signature,
    }
    return Delivery("standardwebhooks", body, headers)


KEY = new_key()
OTHER = new_key()


def provider(*secrets: str, tolerance: int | None = None) -> StandardWebhooks:
    return StandardWebhooks(list(secrets), clock=frozen, tolerance=tolerance)


@pytest.mark.parametrize("prefix", ["webhook", "svix"])
def test_a_v1a_signature_verifies_with_its_public_key(prefix: str) -> None:
    p = provider(whpk(KEY))
    item = delivery(v1a(KEY), prefix=prefix)
    p.verify(item)
    assert p.identify(item).event_id == MSG_ID


@pytest.mark.parametrize(
    ("signature", "body", "t"),
    [
        pytest.param(v1a(KEY), BODY.replace(b'"1"', b'"2"'), NOW, id="tampered body"),
        pytest.param(v1a(OTHER), BODY, NOW, id="wrong key"),
        pytest.param(v1a(KEY, t=NOW + 1), BODY, NOW, id="other timestamp"),
        pytest.param(v1a(KEY, msg_id="msg_other"), BODY, NOW, id="other id"),
        pytest.param("v1a,not-base64!!", BODY, NOW, id="garbage"),
        pytest.param("v1a," + base64.b64encode(b"x" * 63).decode(), BODY, NOW, id="short"),
        pytest.param(v1(), BODY, NOW, id="only v1, no whsec configured"),
    ],
)
def test_anything_else_is_refused(signature: str, body: bytes, t: int) -> None:
    with pytest.raises(SignatureError) as caught:
        provider(whpk(KEY)).verify(delivery(signature, body, t))
    assert caught.value.status == 401


def test_missing_header_is_refused() -> None:
    item = delivery(v1a(KEY))
    headers = {k: v for k, v in item.headers.items() if k != "webhook-signature"}
    with pytest.raises(SignatureError, match="missing"):
        provider(whpk(KEY)).verify(Delivery("standardwebhooks", BODY, headers))


def test_a_replay_outside_the_tolerance_is_refused_both_ways() -> None:
    p = provider(whpk(KEY), tolerance=300)
    for t in (NOW - 301, NOW + 301):
        with pytest.raises(SignatureError, match="tolerance"):
            p.verify(delivery(v1a(KEY, t=t), t=t))
    p.verify(delivery(v1a(KEY, t=NOW - 300), t=NOW - 300))


def test_rotation_any_configured_key_and_any_entry() -> None:
    # The sender signs with old and new keys during a rotation; the receiver
    # may hold either.
    header = f"{v1a(OTHER)} {v1a(KEY)}"
    provider(whpk(KEY)).verify(delivery(header))
    provider(whpk(OTHER)).verify(delivery(header))
    provider(whpk(new_key()), whpk(KEY)).verify(delivery(v1a(KEY)))


def test_mixed_v1_and_v1a_secrets_and_headers() -> None:
    mixed = provider(WHSEC, whpk(KEY))
    mixed.verify(delivery(v1()))
    mixed.verify(delivery(v1a(KEY)))
    mixed.verify(delivery(f"v1,AAAA {v1a(KEY)}"))  # a wrong v1 beside a good v1a
    mixed.verify(delivery(f"{v1a(OTHER)} {v1()}"))
    with pytest.raises(SignatureError, match="no v1 or v1a signature matches"):
        mixed.verify(delivery(f"{v1a(OTHER)} v1,AAAA"))
    # A receiver with the HMAC secret only still ignores v1a entries, as before.
    hmac_only = provider(WHSEC)
    hmac_only.verify(delivery(f"{v1a(OTHER)} {v1()}"))
    with pytest.raises(SignatureError, match="no v1 signature"):
        hmac_only.verify(delivery(v1a(KEY)))


def test_a_whsk_secret_key_signs_and_its_public_half_verifies() -> None:
    signer = provider(whsk(KEY))
    headers = signer.sign(BODY, timestamp=NOW, delivery_id=MSG_ID)
    assert headers["webhook-signature"].startswith("v1a,")
    item = Delivery("standardwebhooks", BODY, headers)
    provider(whpk(KEY)).verify(item)
    signer.verify(item)
    # What sign() makes is what the spec describes (ed25519 is deterministic).
    assert headers["webhook-signature"] == v1a(KEY)


def test_a_public_key_cannot_sign() -> None:
    with pytest.raises(ConfigurationError, match="public key"):
        provider(whpk(KEY)).sign(BODY)


@pytest.mark.parametrize(
    "secret",
    [
        "whpk_" + base64.b64encode(b"short").decode(),
        "whpk_not base64",
        "whsk_" + base64.b64encode(b"x" * 40).decode(),
    ],
)
def test_a_malformed_key_is_a_configuration_error(secret: str) -> None:
    with pytest.raises(ConfigurationError):
        provider(secret)


def test_without_cryptography_a_public_key_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.asymmetric.ed25519", None)
    with pytest.raises(ConfigurationError, match=r"onceonly\[asymmetric\]"):
        provider(whpk(KEY))
    provider(WHSEC).verify(delivery(v1()))  # HMAC alone needs nothing
