"""Pagar.me (Basic credentials, RS256 ``X-Webhook-Asymmetric-Signature``) and
Efí Pix (a secret in the ``hmac`` query parameter, a proxy's client-certificate
verdict): what passes, what is refused, and which event a delivery is.

Pagar.me publishes no signed test vector; the signatures here are made with
``cryptography`` as Pagar.me's own plugin verifies them (RSASSA-PKCS1-v1_5,
SHA-256, over the raw body; key by ``kid`` from a JWK Set).
"""

from __future__ import annotations

import base64
import json
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
)

from onceonly import (
    ConfigurationError,
    Delivery,
    DeliveryRejected,
    NotFetchable,
    PayloadError,
    SignatureError,
)
from onceonly.clients import EfiClient, PagarmeClient, Target
from onceonly.events import Event, EventStatus
from onceonly.providers import PROVIDER_CLASSES, Efi, Pagarme, Provider, StandardWebhooks

# Pagar.me.

BODY = json.dumps(
    {
        "id": "hook_RyEKQO789TRpZjv5",
        "account": {"id": "acc_jZkdN857et650oNv", "name": "Lojinha"},
        "type": "order.paid",
        "created_at": "2017-06-29T20:23:47",
        "data": {
            "id": "or_ZdnB5BBCmYhk534R",
            "status": "paid",
            "charges": [{"id": "ch_d22356Jf4WuGr8no", "status": "paid"}],
        },
    }
).encode()
CREDENTIALS = "pagarme-hook:s3cret"


@pytest.fixture(scope="module")
def keys() -> tuple[rsa.RSAPrivateKey, rsa.RSAPrivateKey]:
    # Two 2048-bit keys, made once: the signer's and an impostor's.
    return (
        rsa.generate_private_key(public_exponent=65537, key_size=2048),
        rsa.generate_private_key(public_exponent=65537, key_size=2048),
    )


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwk(key: rsa.RSAPrivateKey, kid: str, **extra: str) -> dict[str, str]:
    numbers = key.public_key().public_numbers()
    n = numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")
    e = numbers.e.to_bytes((numbers.e.bit_length() + 7) // 8, "big")
    return {"kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid, "n": b64url(n), "e": b64url(e)}


def jwks_file(tmp_path: Path, *entries: dict[str, Any]) -> str:
    path = tmp_path / "pagarme-jwks.json"
    path.write_text(json.dumps({"keys": list(entries)}))
    return f"jwks:{path}"


def signature(
    key: rsa.RSAPrivateKey, body: bytes = BODY, kid: str = "k1", alg: str = "RS256"
) -> str:
    raw = key.sign(body, padding.PKCS1v15(), hashes.SHA256())
    return f"alg={alg}; kid={kid}; signature={b64url(raw)}"


def basic(credentials: str = CREDENTIALS) -> str:
    return "Basic " + base64.b64encode(credentials.encode()).decode()


def pagarme(headers: dict[str, str], body: bytes = BODY) -> Delivery:
    return Delivery("pagarme", body, headers)


def test_pagarme_basic_credentials() -> None:
    p = Pagarme(["old-user:old", CREDENTIALS])
    item = pagarme({"authorization": basic()})
    p.verify(item)
    p.verify(pagarme({"authorization": "basic " + basic().split(" ", 1)[1]}))
    info = p.identify(item)
    assert (info.event_id, info.event_type) == ("hook_RyEKQO789TRpZjv5", "order.paid")
    assert p.sign(BODY) == {"authorization": basic("old-user:old")}
    for wrong in ({"authorization": basic("pagarme-hook:guess")}, {}, {"authorization": "s3cret"}):
        with pytest.raises(SignatureError) as caught:
            p.verify(pagarme(wrong))
        assert caught.value.status == 401


def test_pagarme_rs256_signature(
    tmp_path: Path, keys: tuple[rsa.RSAPrivateKey, rsa.RSAPrivateKey]
) -> None:
    signer, _ = keys
    p = Pagarme(jwks_file(tmp_path, jwk(signer, "k1")))
    p.verify(pagarme({"x-webhook-asymmetric-signature": signature(signer)}))
    # Standard base64 (not url-safe) is accepted too, as Pagar.me's plugin does.
    raw = signer.sign(BODY, padding.PKCS1v15(), hashes.SHA256())
    std = f"alg=RS256; kid=k1; signature={base64.b64encode(raw).decode()}"
    p.verify(pagarme({"x-webhook-asymmetric-signature": std}))


@pytest.mark.parametrize(
    "case", ["tampered body", "wrong key", "unknown kid", "other alg", "missing", "garbage"]
)
def test_pagarme_rs256_refusals(
    case: str, tmp_path: Path, keys: tuple[rsa.RSAPrivateKey, rsa.RSAPrivateKey]
) -> None:
    signer, impostor = keys
    p = Pagarme(jwks_file(tmp_path, jwk(signer, "k1")))
    header, body = signature(signer), BODY
    if case == "tampered body":
        body = BODY.replace(b"paid", b"pair")
    elif case == "wrong key":
        header = signature(impostor)
    elif case == "unknown kid":
        header = signature(signer, kid="k9")
    elif case == "other alg":
        header = signature(signer, alg="HS256")
    elif case == "garbage":
        header = "alg=RS256; kid=k1; signature=%%"
    headers = {} if case == "missing" else {"x-webhook-asymmetric-signature": header}
    with pytest.raises(SignatureError) as caught:
        p.verify(pagarme(headers, body))
    assert caught.value.status == 401


def test_pagarme_rotation_and_both_checks(
    tmp_path: Path, keys: tuple[rsa.RSAPrivateKey, rsa.RSAPrivateKey]
) -> None:
    old, new = keys
    both = Pagarme([CREDENTIALS, jwks_file(tmp_path, jwk(old, "k1"), jwk(new, "k2"))])
    signed_new = signature(new, kid="k2")
    both.verify(pagarme({"authorization": basic(), "x-webhook-asymmetric-signature": signed_new}))
    # Both are configured, so both are required.
    with pytest.raises(SignatureError):
        both.verify(pagarme({"x-webhook-asymmetric-signature": signed_new}))
    with pytest.raises(SignatureError):
        both.verify(pagarme({"authorization": basic()}))


def test_pagarme_with_keys_only_cannot_sign(
    tmp_path: Path, keys: tuple[rsa.RSAPrivateKey, rsa.RSAPrivateKey]
) -> None:
    with pytest.raises(ConfigurationError, match="cannot sign"):
        Pagarme(jwks_file(tmp_path, jwk(keys[0], "k1"))).sign(BODY)


def test_pagarme_configuration_errors(tmp_path: Path) -> None:
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    for secrets in (
        "no-colon-here",
        f"jwks:{tmp_path / 'absent.json'}",
        jwks_file(tmp_path, {"kty": "EC", "kid": "e1"}),
        jwks_file(tmp_path, jwk(small, "short")),
    ):
        with pytest.raises(ConfigurationError):
            Pagarme(secrets)


def test_pagarme_body_without_an_id_is_a_payload_error() -> None:
    with pytest.raises(PayloadError):
        Pagarme(CREDENTIALS).identify(pagarme({}, b'{"type":"order.paid"}'))


def stored(provider: str, body: bytes, event_id: str = "e") -> Event:
    return Event(
        id=1,
        provider=provider,
        event_id=event_id,
        event_type=None,
        body=body,
        headers={},
        received_at=datetime.now(UTC),
        status=EventStatus.PENDING,
        attempts=0,
    )


def test_pagarme_client_points_to_the_order_or_charge() -> None:
    client = PagarmeClient("sk_test_1")
    order = stored("pagarme", BODY)
    assert client.target(order) == Target("order", "or_ZdnB5BBCmYhk534R")
    assert client.target(order, "charge") == Target("charge", "ch_d22356Jf4WuGr8no")
    charge = stored("pagarme", b'{"id":"hook_1","data":{"id":"ch_1","order":{"id":"or_1"}}}')
    assert client.target(charge) == Target("charge", "ch_1")
    assert client.target(charge, "order") == Target("order", "or_1")
    with pytest.raises(NotFetchable):
        client.target(stored("pagarme", b'{"data":{"id":"cus_1"}}'))
    assert client.auth_headers() == {
        "authorization": "Basic " + base64.b64encode(b"sk_test_1:").decode()
    }


# Efí.

E2E = "E09089356202612021530abcdef12345"
PIX = {"endToEndId": E2E, "txid": "t" * 26, "valor": "19.99", "horario": "2026-12-02T15:30:00Z"}


def efi_body(*items: dict[str, Any]) -> bytes:
    return json.dumps({"pix": list(items)}).encode()


def efi(
    query: dict[str, str], body: bytes = efi_body(PIX), headers: dict[str, str] | None = None
) -> Delivery:
    return Delivery("efi", body, headers or {}, query)


def test_efi_hmac_query_secret() -> None:
    p = Efi(["new-secret", "old-secret"])
    p.verify(efi({"hmac": "old-secret", "ignorar": "/pix"}))
    p.verify(efi({"hmac": "new-secret/pix"}))  # registered without "&ignorar="
    assert p.sign_query({"x": "1"}) == {"x": "1", "hmac": "new-secret", "ignorar": "/pix"}
    assert p.sign(b"") == {}
    for query in ({"hmac": "guess"}, {}, {"hmac": ""}, {"HMAC": "new-secret"}, {"hmac": "/pix"}):
        with pytest.raises(SignatureError) as caught:
            p.verify(efi(query))
        assert caught.value.status == 401


def test_efi_proxy_client_certificate_header() -> None:
    p = Efi("s", client_cert_header="X-SSL-Client-Verify")
    p.verify(efi({"hmac": "s"}, headers={"x-ssl-client-verify": "SUCCESS"}))
    for verdict in ({"x-ssl-client-verify": "FAILED:unable to verify"}, {}):
        with pytest.raises(SignatureError, match="client certificate"):
            p.verify(efi({"hmac": "s"}, headers=verdict))
    # The hmac is required even behind the proxy.
    with pytest.raises(SignatureError):
        p.verify(efi({}, headers={"x-ssl-client-verify": "SUCCESS"}))
    assert p.sign(b"") == {"x-ssl-client-verify": "SUCCESS"}
    env = PROVIDER_CLASSES["efi"].from_environ(
        {
            "ONCEONLY_EFI_CLIENT_CERT_HEADER": "X-Client-Verified",
            "ONCEONLY_EFI_CLIENT_CERT_VALUE": "yes",
        },
        ["s"],
    )
    assert isinstance(env, Efi)
    assert (env.client_cert_header, env.client_cert_value) == ("x-client-verified", "yes")


def test_efi_one_pix_is_its_end_to_end_id() -> None:
    info = Efi("s").identify(efi({}))
    assert (info.event_id, info.event_type) == (E2E, "pix")


def test_efi_several_pix_are_one_event_whatever_their_order() -> None:
    other = {**PIX, "endToEndId": "E09089356202612021531zzzzzzzzzzz"}
    p = Efi("s")
    one = p.identify(efi({}, efi_body(PIX, other)))
    swapped = p.identify(efi({}, efi_body(other, PIX)))
    assert one.event_id == swapped.event_id
    assert one.event_id.startswith("pix:")
    assert one.event_id != p.identify(efi({}, efi_body(PIX))).event_id


def test_efi_a_refund_is_a_new_event_and_its_new_status_too() -> None:
    p = Efi("s")
    paid = p.identify(efi({})).event_id
    asked = {**PIX, "devolucoes": [{"id": "D1", "rtrId": "D0908", "status": "EM_PROCESSAMENTO"}]}
    done = {**PIX, "devolucoes": [{"id": "D1", "rtrId": "D0908", "status": "DEVOLVIDO"}]}
    ids = {
        paid,
        p.identify(efi({}, efi_body(asked))).event_id,
        p.identify(efi({}, efi_body(done))).event_id,
    }
    assert len(ids) == 3
    assert p.identify(efi({}, efi_body(done))).event_type == "pix.devolucao"


@pytest.mark.parametrize(
    "body",
    [b'{"pix": []}', b"{}", b'{"pix": [1]}', b'{"pix": [{"txid": "t"}]}', b"[]", b"not json"],
)
def test_efi_a_body_without_pix_is_a_payload_error(body: bytes) -> None:
    with pytest.raises(PayloadError):
        Efi("s").identify(efi({}, body))


def test_efi_client_fetches_one_pix_never_guesses_among_several() -> None:
    client = EfiClient("Client_Id_1", "Client_Secret_1")
    assert client.target(stored("efi", efi_body(PIX))) == Target("pix", E2E)
    with pytest.raises(NotFetchable, match="retrieve_pix"):
        client.target(stored("efi", efi_body(PIX, {**PIX, "endToEndId": "E2"})))
    with pytest.raises(ConfigurationError):
        EfiClient("", "secret")
    with pytest.raises(ConfigurationError, match="not a file"):
        EfiClient("id", "secret", cert="/nonexistent/efi.pem")
    assert EfiClient.from_environ({"ONCEONLY_EFI_API_CLIENT_ID": "id"}, "efi") is None


# Hostile input: anything a sender posts is accepted or a DeliveryRejected
# (a 4xx from the receiver), never another exception (a 500).


def fuzz_text(rng: random.Random) -> str:
    pieces = [
        "alg=RS256",
        "kid=k1",
        "signature=",
        "; ",
        "=",
        "Basic ",
        "v1a,",
        "v1,",
        " ",
        "%%",
        "9" * rng.randint(1, 3000),
        base64.b64encode(rng.randbytes(rng.choice([12, 64, 256]))).decode(),
        b64url(rng.randbytes(256)),
        "".join(chr(rng.randrange(256)) for _ in range(rng.randrange(12))),
    ]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))


def fuzz_body(rng: random.Random, valid: bytes) -> bytes:
    values: list[object] = [None, True, 7, 10**40, "x", "", [], {}, {"id": None}, 1.5]
    item = {k: rng.choice(values) for k in ("endToEndId", "txid", "devolucoes")}
    choices = [
        valid,
        rng.randbytes(rng.randrange(64)),
        json.dumps({"pix": rng.choice([[item], item, [item, "x"], None])}).encode(),
        json.dumps({"id": rng.choice(values), "type": rng.choice(values)}).encode(),
        json.dumps({"pix": [{**PIX, "devolucoes": rng.choice([[{"id": 1}], ["x"], 3])}]}).encode(),
        b"[" * 3000 + b"]" * 3000,
        fuzz_text(rng).encode("latin-1"),
    ]
    return rng.choice(choices)


@pytest.mark.parametrize("name", ["pagarme", "efi", "standardwebhooks-v1a"])
def test_fuzzed_deliveries_only_raise_delivery_rejected(
    name: str, tmp_path: Path, keys: tuple[rsa.RSAPrivateKey, rsa.RSAPrivateKey]
) -> None:
    signer, _ = keys
    rng = random.Random(f"onceonly-fuzz-{name}")
    provider: Provider
    if name == "pagarme":
        provider = Pagarme([CREDENTIALS, jwks_file(tmp_path, jwk(signer, "k1"))])
        valid, names = BODY, ["authorization", "x-webhook-asymmetric-signature"]
    elif name == "efi":
        provider = Efi("s", client_cert_header="x-ssl-client-verify")
        valid, names = efi_body(PIX), ["x-ssl-client-verify"]
    else:
        ed = Ed25519PrivateKey.generate()
        seed = ed.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        provider = StandardWebhooks("whsk_" + base64.b64encode(seed).decode())
        valid, names = BODY, ["webhook-id", "webhook-timestamp", "webhook-signature"]
    escaped: dict[str, str] = {}
    accepted = 0
    for _ in range(150):
        body = fuzz_body(rng, valid)
        if name == "pagarme":
            raw = signer.sign(body, padding.PKCS1v15(), hashes.SHA256())
            headers = {
                "authorization": basic(),
                "x-webhook-asymmetric-signature": f"alg=RS256; kid=k1; signature={b64url(raw)}",
            }
        else:
            headers = provider.sign(body)
        query = provider.sign_query({})
        for header in names:
            roll = rng.random()
            if roll < 0.2:
                headers[header] = fuzz_text(rng)
            elif roll < 0.3:
                headers.pop(header, None)
        if rng.random() < 0.2:
            query["hmac"] = fuzz_text(rng)
        item = Delivery(provider.name, body, headers, query)
        try:
            provider.verify(item)
            provider.identify(item)
            accepted += 1
        except DeliveryRejected:
            pass
        except Exception as exc:
            key = f"{type(exc).__name__}: {str(exc)[:80]}"
            escaped.setdefault(key, f"headers={headers!r:.200} body={body[:60]!r}")
    assert not escaped, "\n".join(f"{k}\n    e.g. {v}" for k, v in escaped.items())
    assert accepted > 0
