"""The webhook providers, checked against each sender's documented signing scheme.

Every signature here is computed in the test itself with ``hmac``/``hashlib``/
``base64``, following the provider's documentation, never with onceonly's own
helpers. The official SDKs (``stripe``, ``standardwebhooks``, ``svix``) are used
as a second opinion: what they sign onceonly accepts, and what the tests sign
they accept.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import pytest
import standardwebhooks
import stripe
import svix.webhooks

from onceonly import (
    ConfigurationError,
    Delivery,
    DeliveryRejected,
    EventInfo,
    PayloadError,
    SignatureError,
)
from onceonly.providers import (
    HMAC,
    GitHub,
    Provider,
    StandardWebhooks,
    Stripe,
    TimestampedProvider,
)

NOW = 1_700_000_000
BODY = b'{"id":"evt_1NqGzL2eZvKYlo2C","object":"event","type":"invoice.paid","data":{}}'
TAMPERED = BODY.replace(b"invoice.paid", b"invoice.void")

STRIPE_SECRET = "whsec_primary0123456789abcdef"
STRIPE_OLD_SECRET = "whsec_previous9876543210fedcba"

SW_KEY = b"0123456789abcdef01234567"  # 24 bytes, like the keys Svix issues
SW_OLD_KEY = b"previous-key-for-rotation-32byte"
MSG_ID = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"

GITHUB_SECRET = "It's a Secret to Everybody"
GITHUB_VECTOR = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
GITHUB_DELIVERY = "72d3162e-cc78-11e3-81ab-4c9367dc0958"

HMAC_SECRET = "generic-shared-secret"

Headers = dict[str, str]


# -- signing, as each provider documents it ------------------------------------


def mac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def fixed_clock(at: float = NOW) -> Callable[[], float]:
    """A frozen ``time.time``: it returns a float, as the real clock does."""

    def clock() -> float:
        return float(at)

    return clock


def whsec(key: bytes) -> str:
    """A Standard Webhooks secret: ``whsec_`` followed by the base64 of the key."""
    return "whsec_" + base64.b64encode(key).decode()


def stripe_sig(body: bytes, secret: str = STRIPE_SECRET, timestamp: int | str = NOW) -> str:
    """Stripe: hex HMAC-SHA256 over ``"{t}." + body``, keyed with the whole ``whsec_`` string."""
    return mac(secret.encode(), f"{timestamp}.".encode() + body).hex()


def stripe_header(body: bytes, secret: str = STRIPE_SECRET, timestamp: int | str = NOW) -> str:
    return f"t={timestamp},v1={stripe_sig(body, secret, timestamp)}"


def sw_sig(
    body: bytes, key: bytes = SW_KEY, msg_id: str = MSG_ID, timestamp: int | str = NOW
) -> str:
    """Standard Webhooks: ``v1,`` + base64 HMAC-SHA256 over ``"{id}.{ts}." + body``."""
    return "v1," + base64.b64encode(mac(key, f"{msg_id}.{timestamp}.".encode() + body)).decode()


def sw_headers(
    body: bytes,
    *,
    key: bytes = SW_KEY,
    timestamp: int = NOW,
    prefix: str = "webhook",
    signature: str | None = None,
) -> Headers:
    return {
        f"{prefix}-id": MSG_ID,
        f"{prefix}-timestamp": str(timestamp),
        f"{prefix}-signature": signature or sw_sig(body, key, MSG_ID, timestamp),
    }


def github_sig(body: bytes, secret: str = GITHUB_SECRET) -> str:
    """GitHub: ``sha256=`` + hex HMAC-SHA256 over the raw body."""
    return "sha256=" + mac(secret.encode(), body).hex()


def hmac_sig(body: bytes, encoding: str, prefix: str = "", secret: str = HMAC_SECRET) -> str:
    digest = mac(secret.encode(), body)
    return prefix + (digest.hex() if encoding == "hex" else base64.b64encode(digest).decode())


def random_b64(rng: random.Random, size: int = 32) -> str:
    return base64.b64encode(rng.randbytes(size)).decode()


BAD_HEX = "f" * 64
BAD_B64 = "v1," + random_b64(random.Random(1))


def delivery(provider: Provider, body: bytes, headers: Mapping[str, str | None]) -> Delivery:
    """A delivery as the receiver builds it: lower-case header names; ``None`` drops one."""
    kept = {name.lower(): value for name, value in headers.items() if value is not None}
    return Delivery(provider=provider.name, body=body, headers=kept, query={})


def rejected(provider: Provider, body: bytes, headers: Mapping[str, str | None]) -> SignatureError:
    with pytest.raises(SignatureError) as caught:
        provider.verify(delivery(provider, body, headers))
    return caught.value


# -- the providers under test, each with how its sender signs --------------------


def sign_stripe(body: bytes, timestamp: int) -> Headers:
    return {"stripe-signature": stripe_header(body, timestamp=timestamp)}


def sign_standardwebhooks(body: bytes, timestamp: int) -> Headers:
    return sw_headers(body, timestamp=timestamp)


def sign_svix(body: bytes, timestamp: int) -> Headers:
    return sw_headers(body, timestamp=timestamp, prefix="svix")


def sign_github(body: bytes, timestamp: int) -> Headers:
    return {
        "x-hub-signature-256": github_sig(body),
        "x-github-delivery": GITHUB_DELIVERY,
        "x-github-event": "push",
    }


def sign_hmac_hex(body: bytes, timestamp: int) -> Headers:
    return {"x-signature": hmac_sig(body, "hex")}


def sign_hmac_base64(body: bytes, timestamp: int) -> Headers:
    return {"x-sig": hmac_sig(body, "base64", "sha256="), "x-event-id": f"ev-{timestamp}"}


@dataclass(frozen=True)
class Scheme:
    """One provider as the tests configure it, and how its sender signs a delivery."""

    id: str
    factory: Callable[..., Provider]
    secret: str
    sign: Callable[[bytes, int], Headers]
    options: Mapping[str, Any] = field(default_factory=dict)

    def provider(self, secrets: str | list[str] | None = None, **overrides: Any) -> Provider:
        options = {**self.options, **overrides}
        return self.factory(self.secret if secrets is None else secrets, **options)


STRIPE = Scheme("stripe", Stripe, STRIPE_SECRET, sign_stripe, {"clock": fixed_clock()})
STANDARD = Scheme(
    "standardwebhooks",
    StandardWebhooks,
    whsec(SW_KEY),
    sign_standardwebhooks,
    {"clock": fixed_clock()},
)
SVIX = Scheme("svix", StandardWebhooks, whsec(SW_KEY), sign_svix, {"clock": fixed_clock()})
GITHUB = Scheme("github", GitHub, GITHUB_SECRET, sign_github)
HMAC_HEX = Scheme("hmac-hex", HMAC, HMAC_SECRET, sign_hmac_hex)
HMAC_B64 = Scheme(
    "hmac-base64",
    HMAC,
    HMAC_SECRET,
    sign_hmac_base64,
    {
        "header": "X-Sig",
        "encoding": "base64",
        "prefix": "sha256=",
        "event_id": "header:X-Event-Id",
        "event_type": None,
    },
)

SCHEMES = [STRIPE, STANDARD, SVIX, GITHUB, HMAC_HEX, HMAC_B64]
TIMESTAMPED = [STRIPE, STANDARD, SVIX]


def scheme_ids(scheme: Scheme) -> str:
    return scheme.id


# -- shared across providers -----------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES, ids=scheme_ids)
def test_a_correctly_signed_delivery_is_accepted(scheme: Scheme) -> None:
    provider = scheme.provider()
    provider.verify(delivery(provider, BODY, scheme.sign(BODY, NOW)))


@pytest.mark.parametrize("scheme", SCHEMES, ids=scheme_ids)
@pytest.mark.parametrize("status", [None, 403, 406])
@pytest.mark.parametrize("fault", ["tampered body", "no headers"])
def test_rejection_status_is_401_unless_configured(
    scheme: Scheme, status: int | None, fault: str
) -> None:
    provider = scheme.provider() if status is None else scheme.provider(rejection_status=status)
    headers = scheme.sign(BODY, NOW) if fault == "tampered body" else {}
    assert rejected(provider, TAMPERED, headers).status == (status or 401)


@pytest.mark.parametrize("scheme", SCHEMES, ids=scheme_ids)
@pytest.mark.parametrize(
    ("secrets", "options"),
    [
        pytest.param("   ", {}, id="blank secret"),
        pytest.param([], {}, id="no secrets"),
        pytest.param(None, {"rejection_status": 500}, id="5xx rejection status"),
        pytest.param(None, {"rejection_status": 200}, id="2xx rejection status"),
    ],
)
def test_bad_configuration_is_refused(
    scheme: Scheme, secrets: str | list[str] | None, options: dict[str, Any]
) -> None:
    with pytest.raises(ConfigurationError):
        scheme.provider(secrets, **options)


OLD_SECRETS = {
    "stripe": STRIPE_OLD_SECRET,
    "standardwebhooks": whsec(SW_OLD_KEY),
    "svix": whsec(SW_OLD_KEY),
}


@pytest.mark.parametrize("scheme", SCHEMES, ids=scheme_ids)
@pytest.mark.parametrize("signer_first", [True, False], ids=["signer first", "signer second"])
def test_secret_rotation_accepts_either_secret(scheme: Scheme, signer_first: bool) -> None:
    """Configured with two secrets, a delivery signed with either one passes."""
    other = OLD_SECRETS.get(scheme.id, "old-" + scheme.secret)
    secrets = [scheme.secret, other] if signer_first else [other, scheme.secret]
    provider = scheme.provider(secrets)
    provider.verify(delivery(provider, BODY, scheme.sign(BODY, NOW)))
    # The same delivery is refused by a provider that knows only the other secret.
    rejected(scheme.provider(other), BODY, scheme.sign(BODY, NOW))


# -- timestamp tolerance (Stripe, Standard Webhooks, Svix) -------------------------


@pytest.mark.parametrize("scheme", TIMESTAMPED, ids=scheme_ids)
@pytest.mark.parametrize(
    ("offset", "accepted"),
    [
        (0, True),
        (-300, True),
        (300, True),
        (-301, False),
        (301, False),
        (-86_400, False),
        (86_400, False),
    ],
)
def test_default_tolerance_is_five_minutes_both_ways(
    scheme: Scheme, offset: int, accepted: bool
) -> None:
    provider = scheme.provider()
    headers = scheme.sign(BODY, NOW + offset)
    if accepted:
        provider.verify(delivery(provider, BODY, headers))
    else:
        assert rejected(provider, BODY, headers).status == 401


@pytest.mark.parametrize("scheme", TIMESTAMPED, ids=scheme_ids)
@pytest.mark.parametrize(
    ("tolerance", "offset", "accepted"),
    [
        (60, 60, True),
        (60, -60, True),
        (60, 61, False),
        (60, -61, False),
        (3600, -3600, True),
        (0, -365 * 86_400, True),  # 0 disables the check, as in Stripe's SDK
        (0, 365 * 86_400, True),
    ],
)
def test_tolerance_is_configurable(
    scheme: Scheme, tolerance: int, offset: int, accepted: bool
) -> None:
    provider = scheme.provider(tolerance=tolerance)
    headers = scheme.sign(BODY, NOW + offset)
    if accepted:
        provider.verify(delivery(provider, BODY, headers))
    else:
        rejected(provider, BODY, headers)


@pytest.mark.parametrize(
    ("cls", "prefix"),
    [(Stripe, "ONCEONLY_STRIPE_"), (StandardWebhooks, "ONCEONLY_STANDARDWEBHOOKS_")],
)
def test_tolerance_and_status_from_environ(cls: type[TimestampedProvider], prefix: str) -> None:
    environ = {prefix + "TOLERANCE": "10", prefix + "REJECTION_STATUS": "400"}
    provider = cls.from_environ(environ, [whsec(SW_KEY)])
    assert (provider.tolerance, provider.rejection_status) == (10, 400)


@pytest.mark.parametrize("scheme", TIMESTAMPED, ids=scheme_ids)
def test_negative_tolerance_is_refused(scheme: Scheme) -> None:
    with pytest.raises(ConfigurationError):
        scheme.provider(tolerance=-1)


@pytest.mark.parametrize("scheme", TIMESTAMPED, ids=scheme_ids)
@pytest.mark.parametrize("timestamp", [10**400, -(10**400)], ids=["huge", "huge negative"])
def test_absurd_timestamp_is_a_signature_error_not_a_crash(scheme: Scheme, timestamp: int) -> None:
    """An integer too large for a float must be rejected like any other stale timestamp."""
    rejected(scheme.provider(), BODY, scheme.sign(BODY, timestamp))


# -- Stripe ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        pytest.param("t={t},v1={sig}", id="single v1"),
        pytest.param("t={t},v1={bad},v1={sig}", id="several v1, last matches"),
        pytest.param("t={t},v1={sig},v1={bad}", id="several v1, first matches"),
        pytest.param("t={t},v0={bad},v1={bad},v1={sig}", id="with a v0 entry"),
        pytest.param("v1={sig},t={t}", id="t after v1"),
        pytest.param("t={t}, v1={sig}", id="space after comma"),
    ],
)
def test_stripe_accepts(template: str) -> None:
    header = template.format(t=NOW, sig=stripe_sig(BODY), bad=BAD_HEX)
    provider = STRIPE.provider()
    provider.verify(delivery(provider, BODY, {"Stripe-Signature": header}))


GOOD_STRIPE = stripe_sig(BODY)


@pytest.mark.parametrize(
    ("body", "header"),
    [
        pytest.param(TAMPERED, stripe_header(BODY), id="tampered body"),
        pytest.param(BODY, stripe_header(BODY, "whsec_wrong"), id="wrong secret"),
        pytest.param(BODY, stripe_header(BODY, STRIPE_SECRET[:-1]), id="secret prefix"),
        pytest.param(BODY, stripe_header(BODY, timestamp=NOW - 301), id="stale"),
        pytest.param(BODY, stripe_header(BODY, timestamp=NOW - 86_400), id="a day old"),
        pytest.param(BODY, stripe_header(BODY, timestamp=NOW + 301), id="future"),
        pytest.param(BODY, f"t={NOW + 1},v1={GOOD_STRIPE}", id="t not the signed one"),
        pytest.param(BODY, f"t={NOW},v1={BAD_HEX},v1={BAD_HEX[1:]}", id="no v1 matches"),
        pytest.param(BODY, None, id="missing header"),
        pytest.param(BODY, "", id="empty header"),
        pytest.param(BODY, f"v1={GOOD_STRIPE}", id="no t="),
        pytest.param(BODY, f"t={NOW}", id="no v1="),
        pytest.param(BODY, f"t={NOW},v0={GOOD_STRIPE}", id="only v0"),
        pytest.param(BODY, stripe_header(BODY, timestamp="abc"), id="non-integer t"),
        pytest.param(BODY, stripe_header(BODY, timestamp="1.7e9"), id="float t"),
        pytest.param(BODY, "t=,v1=", id="empty values"),
        pytest.param(BODY, GOOD_STRIPE, id="bare signature"),
    ],
)
def test_stripe_rejects(body: bytes, header: str | None) -> None:
    error = rejected(STRIPE.provider(), body, {"Stripe-Signature": header})
    assert error.status == 401


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (BODY, EventInfo("evt_1NqGzL2eZvKYlo2C", "invoice.paid")),
        (b'{"id": "evt_2"}', EventInfo("evt_2", None)),
        (b'{"id": "evt_3", "type": 7}', EventInfo("evt_3", None)),
        (b'{"id": 42, "type": "x"}', EventInfo("42", "x")),
    ],
)
@pytest.mark.parametrize("scheme", [STRIPE, HMAC_HEX], ids=scheme_ids)
def test_identify_reads_body_id_and_type(scheme: Scheme, body: bytes, expected: EventInfo) -> None:
    provider = scheme.provider()
    assert provider.identify(delivery(provider, body, scheme.sign(body, NOW))) == expected


BAD_PAYLOADS = [
    pytest.param(b"not json", id="not json"),
    pytest.param(b"", id="empty"),
    pytest.param(b"\xff\xfe\x00", id="not utf-8"),
    pytest.param(b'[{"id": "evt_1"}]', id="array"),
    pytest.param(b'"evt_1"', id="string"),
    pytest.param(b"null", id="null"),
    pytest.param(b'{"type": "invoice.paid"}', id="missing id"),
    pytest.param(b'{"id": null}', id="null id"),
    pytest.param(b'{"id": ""}', id="empty id"),
    pytest.param(b'{"id": true}', id="boolean id"),
    pytest.param(b'{"id": 1.5}', id="float id"),
    pytest.param(b'{"id": {"x": 1}}', id="object id"),
    pytest.param(json.dumps({"id": "e" * 256}).encode(), id="id over 255 chars"),
    pytest.param(b'{"id": "evt_1"', id="truncated"),
]


@pytest.mark.parametrize("body", BAD_PAYLOADS)
@pytest.mark.parametrize("scheme", [STRIPE, HMAC_HEX], ids=scheme_ids)
def test_identify_without_a_body_id_is_a_payload_error(scheme: Scheme, body: bytes) -> None:
    provider = scheme.provider()
    with pytest.raises(PayloadError) as caught:
        provider.identify(delivery(provider, body, scheme.sign(body, NOW)))
    assert caught.value.status == 400
    assert not isinstance(caught.value, SignatureError)


@pytest.mark.parametrize("scheme", [STRIPE, STANDARD, HMAC_HEX], ids=scheme_ids)
def test_identify_deeply_nested_json_is_a_payload_error(scheme: Scheme) -> None:
    """20 kB of nesting (well under the 1 MiB body limit) must not escape as RecursionError."""
    body = b"[" * 10_000 + b"]" * 10_000
    provider = scheme.provider()
    with pytest.raises(PayloadError):
        provider.identify(delivery(provider, body, scheme.sign(body, NOW)))


# -- Standard Webhooks and Svix ----------------------------------------------------

SW_PREFIXES = ["webhook", "svix"]


@pytest.mark.parametrize("prefix", SW_PREFIXES)
@pytest.mark.parametrize(
    "template",
    [
        pytest.param("{sig}", id="single"),
        pytest.param("{bad} {sig}", id="several, last matches"),
        pytest.param("{sig} {bad}", id="several, first matches"),
        pytest.param("v1a,{b64} {sig}", id="v1a ignored"),
        pytest.param("v2,{b64} {sig}", id="unknown version ignored"),
        pytest.param("  {sig}  ", id="surrounding spaces"),
    ],
)
def test_standardwebhooks_accepts(prefix: str, template: str) -> None:
    signature = template.format(sig=sw_sig(BODY), bad=BAD_B64, b64=BAD_B64[3:])
    provider = STANDARD.provider()
    provider.verify(delivery(provider, BODY, sw_headers(BODY, prefix=prefix, signature=signature)))


VALID_SW_SIG = sw_sig(BODY)


@pytest.mark.parametrize("prefix", SW_PREFIXES)
@pytest.mark.parametrize(
    ("body", "changes"),
    [
        pytest.param(TAMPERED, {}, id="tampered body"),
        pytest.param(BODY, {"signature": sw_sig(BODY, SW_OLD_KEY)}, id="wrong key"),
        pytest.param(
            BODY,
            {"signature": "v1," + base64.b64encode(mac(whsec(SW_KEY).encode(), BODY)).decode()},
            id="keyed with the whsec_ text",
        ),
        pytest.param(BODY, {"id": "msg_other"}, id="id not the signed one"),
        pytest.param(BODY, {"timestamp": str(NOW + 1)}, id="timestamp not the signed one"),
        pytest.param(BODY, {"signature": "v1a," + VALID_SW_SIG[3:]}, id="valid mac as v1a"),
        pytest.param(BODY, {"signature": "v2," + VALID_SW_SIG[3:]}, id="valid mac as v2"),
        pytest.param(BODY, {"signature": VALID_SW_SIG[3:]}, id="no version"),
        pytest.param(BODY, {"signature": "v1"}, id="v1 without comma"),
        pytest.param(BODY, {"signature": BAD_B64}, id="no v1 matches"),
        pytest.param(BODY, {"signature": "v1,"}, id="empty v1"),
        pytest.param(BODY, {"timestamp": "soon"}, id="non-integer timestamp"),
        pytest.param(BODY, {"id": None}, id="missing id"),
        pytest.param(BODY, {"timestamp": None}, id="missing timestamp"),
        pytest.param(BODY, {"signature": None}, id="missing signature"),
        pytest.param(BODY, {"id": ""}, id="empty id"),
    ],
)
def test_standardwebhooks_rejects(prefix: str, body: bytes, changes: dict[str, str | None]) -> None:
    headers: dict[str, str | None] = {**sw_headers(BODY, prefix=prefix)}
    headers.update({f"{prefix}-{name}": value for name, value in changes.items()})
    assert rejected(STANDARD.provider(), body, headers).status == 401


@pytest.mark.parametrize("prefix", SW_PREFIXES)
@pytest.mark.parametrize(
    ("body", "expected_type"),
    [(BODY, "invoice.paid"), (b"{}", None), (b'{"type": ["x"]}', None)],
)
def test_standardwebhooks_identify(prefix: str, body: bytes, expected_type: str | None) -> None:
    provider = STANDARD.provider()
    info = provider.identify(delivery(provider, body, sw_headers(body, prefix=prefix)))
    assert info == EventInfo(MSG_ID, expected_type)


@pytest.mark.parametrize(
    ("signed", "unsigned"), [("svix", "webhook"), ("webhook", "svix")], ids=["svix", "webhook"]
)
def test_standardwebhooks_id_comes_from_the_verified_family(signed: str, unsigned: str) -> None:
    # A captured delivery replayed with another id in the other family's
    # header must keep its signed id: else each replay is a new event.
    provider = STANDARD.provider()
    headers = {**sw_headers(BODY, prefix=signed), f"{unsigned}-id": "msg_forged"}
    if unsigned == "svix":
        headers["svix-timestamp"] = str(NOW)
        headers["svix-signature"] = BAD_B64
    checked = delivery(provider, BODY, headers)
    provider.verify(checked)
    assert provider.identify(checked).event_id == MSG_ID


@pytest.mark.parametrize(
    ("body", "drop"),
    [
        pytest.param(b"not json", None, id="not json"),
        pytest.param(b"[]", None, id="array"),
        pytest.param(BODY, "webhook-id", id="no id header"),
    ],
)
def test_standardwebhooks_identify_payload_errors(body: bytes, drop: str | None) -> None:
    provider = STANDARD.provider()
    headers: dict[str, str | None] = {**sw_headers(body)}
    if drop:
        headers[drop] = None
    with pytest.raises(PayloadError):
        provider.identify(delivery(provider, body, headers))


@pytest.mark.parametrize(
    "secret",
    [
        pytest.param("whsec_not base64!", id="not base64"),
        pytest.param("whsec_", id="empty key"),
    ],
)
def test_standardwebhooks_bad_secret_is_a_configuration_error(secret: str) -> None:
    """An empty key would make every signature forgeable; the SDK refuses it too."""
    with pytest.raises(ConfigurationError):
        StandardWebhooks(secret)


def test_standardwebhooks_secret_without_prefix_is_the_same_key() -> None:
    provider = StandardWebhooks(base64.b64encode(SW_KEY).decode(), clock=fixed_clock())
    provider.verify(delivery(provider, BODY, sw_headers(BODY)))


# -- GitHub ------------------------------------------------------------------------


def test_github_published_vector() -> None:
    assert github_sig(b"Hello, World!") == GITHUB_VECTOR  # the test's own helper agrees
    provider = GitHub(GITHUB_SECRET)
    provider.verify(delivery(provider, b"Hello, World!", {"X-Hub-Signature-256": GITHUB_VECTOR}))


@pytest.mark.parametrize(
    ("body", "header"),
    [
        pytest.param(
            BODY,
            "sha1=" + hmac.new(GITHUB_SECRET.encode(), BODY, hashlib.sha1).hexdigest(),
            id="sha1 prefix",
        ),
        pytest.param(BODY, "sha1=" + github_sig(BODY)[7:], id="sha256 mac, sha1 prefix"),
        pytest.param(BODY, github_sig(BODY)[7:], id="no prefix"),
        pytest.param(TAMPERED, github_sig(BODY), id="tampered body"),
        pytest.param(BODY, github_sig(BODY, "wrong secret"), id="wrong secret"),
        pytest.param(BODY, "sha256=", id="empty signature"),
        pytest.param(BODY, None, id="missing header"),
    ],
)
def test_github_rejects(body: bytes, header: str | None) -> None:
    assert rejected(GitHub(GITHUB_SECRET), body, {"X-Hub-Signature-256": header}).status == 401


UNSIGNED_TYPE = {"onceonly-type-signed": "false"}


def test_github_identify() -> None:
    provider = GITHUB.provider()
    body = b"payload=not-json"
    info = provider.identify(delivery(provider, body, sign_github(body, NOW)))
    # Only the body is signed: the id comes from it, the type is marked unsigned.
    assert info == EventInfo("sha256:" + hashlib.sha256(body).hexdigest(), "push", UNSIGNED_TYPE)


def test_github_identify_without_event_header_has_no_type() -> None:
    provider = GITHUB.provider()
    headers = {**sign_github(BODY, NOW), "x-github-event": None}
    assert provider.identify(delivery(provider, BODY, headers)).event_type is None


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"x-github-delivery": "00000000-0000-0000-0000-000000000000"}, id="guid"),
        pytest.param({"x-github-event": "release"}, id="event"),
        pytest.param({"x-github-delivery": None}, id="no guid"),
    ],
)
def test_github_unsigned_headers_do_not_change_the_id(changes: dict[str, str | None]) -> None:
    provider = GITHUB.provider()
    genuine = provider.identify(delivery(provider, BODY, sign_github(BODY, NOW)))
    replayed = delivery(provider, BODY, {**sign_github(BODY, NOW), **changes})
    provider.verify(replayed)
    assert provider.identify(replayed).event_id == genuine.event_id


# -- generic HMAC ------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["hex", "base64"])
@pytest.mark.parametrize("prefix", ["", "sha256="])
def test_hmac_encodings_and_prefix(encoding: Literal["hex", "base64"], prefix: str) -> None:
    provider = HMAC(HMAC_SECRET, header="X-Body-Signature", encoding=encoding, prefix=prefix)

    def verify(body: bytes, signature: str) -> None:
        provider.verify(delivery(provider, body, {"X-Body-Signature": signature}))

    verify(BODY, hmac_sig(BODY, encoding, prefix))
    for bad in (
        hmac_sig(TAMPERED, encoding, prefix),
        hmac_sig(BODY, encoding, prefix, secret="other"),
        hmac_sig(BODY, "base64" if encoding == "hex" else "hex", prefix),
        hmac_sig(BODY, encoding, "md5=" if prefix else "sha256="),
    ):
        with pytest.raises(SignatureError):
            verify(BODY, bad)


@pytest.mark.parametrize(
    ("options", "headers", "body", "expected"),
    [
        pytest.param({}, {}, b'{"id": "a1", "type": "t"}', EventInfo("a1", "t"), id="defaults"),
        pytest.param(
            {"event_id": "header:X-Event-Id", "event_type": "header:X-Event-Type"},
            {"X-Event-Id": "h-1", "X-Event-Type": "order.paid"},
            b"form=not-json",
            EventInfo("h-1", "order.paid"),
            id="both in headers, body not parsed",
        ),
        pytest.param(
            {"event_id": "body:data.id", "event_type": "body:data.kind"},
            {},
            b'{"data": {"id": "pay_9", "kind": "payment"}}',
            EventInfo("pay_9", "payment"),
            id="dotted body path",
        ),
        pytest.param(
            {"event_id": "body:data.id"},
            {},
            b'{"data": {"id": 123456789012}}',
            EventInfo("123456789012", None),
            id="numeric id becomes str",
        ),
        pytest.param(
            {"event_id": "header:x-event-id", "event_type": None},
            {"X-EVENT-ID": "h-2"},
            b"",
            EventInfo("h-2", None),
            id="header name case-insensitive",
        ),
    ],
)
def test_hmac_identify(
    options: dict[str, Any], headers: Headers, body: bytes, expected: EventInfo
) -> None:
    provider = HMAC(HMAC_SECRET, **options)
    assert provider.identify(delivery(provider, body, headers)) == expected


@pytest.mark.parametrize(
    ("options", "headers", "body"),
    [
        pytest.param({"event_id": "body:data.id"}, {}, b'{"data": {}}', id="path missing"),
        pytest.param({"event_id": "body:data.id"}, {}, b'{"data": 5}', id="path through number"),
        pytest.param({"event_id": "header:X-Event-Id"}, {}, b'{"id": "x"}', id="header missing"),
        pytest.param({"event_id": "header:X-Event-Id"}, {"x-event-id": ""}, b"{}", id="empty"),
        pytest.param({}, {}, b"not json", id="default body:id, not json"),
    ],
)
def test_hmac_identify_payload_errors(
    options: dict[str, Any], headers: Headers, body: bytes
) -> None:
    provider = HMAC(HMAC_SECRET, **options)
    with pytest.raises(PayloadError):
        provider.identify(delivery(provider, body, headers))


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"encoding": "base32"}, id="encoding base32"),
        pytest.param({"encoding": "HEX"}, id="encoding HEX"),
        pytest.param({"event_id": "id"}, id="event_id without kind"),
        pytest.param({"event_id": "query:id"}, id="event_id unknown kind"),
        pytest.param({"event_id": "header:"}, id="event_id empty header"),
        pytest.param({"event_id": "body:"}, id="event_id empty path"),
        pytest.param({"event_type": "cookie:type"}, id="event_type unknown kind"),
    ],
)
def test_hmac_bad_configuration(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        HMAC(HMAC_SECRET, **options)


def test_hmac_from_environ() -> None:
    environ = {
        "ONCEONLY_HMAC_HEADER": "X-Webhook-Signature",
        "ONCEONLY_HMAC_ENCODING": "base64",
        "ONCEONLY_HMAC_PREFIX": "sha256=",
        "ONCEONLY_HMAC_EVENT_ID": "header:X-Event-Id",
        "ONCEONLY_HMAC_EVENT_TYPE": "body:event",
        "ONCEONLY_HMAC_REJECTION_STATUS": "403",
    }
    provider = HMAC.from_environ(environ, [HMAC_SECRET])
    body = b'{"event": "user.created"}'
    headers = {"X-Webhook-Signature": hmac_sig(body, "base64", "sha256="), "X-Event-Id": "42"}
    provider.verify(delivery(provider, body, headers))
    assert provider.identify(delivery(provider, body, headers)) == EventInfo("42", "user.created")
    bad = {**headers, "X-Webhook-Signature": hmac_sig(body, "hex", "sha256=")}
    assert rejected(provider, body, bad).status == 403


def test_hmac_from_environ_defaults() -> None:
    provider = HMAC.from_environ({}, [HMAC_SECRET])
    headers = {"X-Signature": hmac_sig(BODY, "hex")}
    provider.verify(delivery(provider, BODY, headers))
    assert provider.identify(delivery(provider, BODY, headers)) == EventInfo(
        "evt_1NqGzL2eZvKYlo2C", "invoice.paid"
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ONCEONLY_HMAC_ENCODING", "binary"),
        ("ONCEONLY_HMAC_EVENT_ID", "data.id"),
        ("ONCEONLY_HMAC_REJECTION_STATUS", "forbidden"),
    ],
)
def test_hmac_from_environ_bad_values(name: str, value: str) -> None:
    with pytest.raises(ConfigurationError):
        HMAC.from_environ({name: value}, [HMAC_SECRET])


# -- cross-checks with the official SDKs -------------------------------------------

SDK_BODIES = [
    pytest.param(BODY, id="ascii"),
    pytest.param(
        '{"id":"evt_utf8","object":"event","type":"x","data":{"name":"São Paulo ✓"}}'.encode(),
        id="utf-8",
    ),
]


@pytest.mark.parametrize("body", SDK_BODIES)
def test_stripe_sdk_signature_is_accepted(body: bytes) -> None:
    header: str = stripe.WebhookSignature.generate_signature_header(
        body.decode(), STRIPE_SECRET, timestamp=NOW
    )
    provider = STRIPE.provider()
    provider.verify(delivery(provider, body, {"Stripe-Signature": header}))


@pytest.mark.parametrize("body", SDK_BODIES)
@pytest.mark.parametrize("several", [False, True], ids=["one v1", "several v1"])
def test_test_built_stripe_header_is_accepted_by_stripe_sdk(body: bytes, several: bool) -> None:
    now = int(time.time())
    header = stripe_header(body, timestamp=now)
    if several:
        header = f"t={now},v1={BAD_HEX},v1={stripe_sig(body, timestamp=now)}"
    event = stripe.Webhook.construct_event(body, header, STRIPE_SECRET)
    assert event["id"] == json.loads(body)["id"]
    provider = Stripe(STRIPE_SECRET)  # the real clock, as the SDK uses
    provider.verify(delivery(provider, body, {"Stripe-Signature": header}))


@pytest.mark.parametrize(
    ("body", "secret", "age"),
    [
        pytest.param(TAMPERED, STRIPE_SECRET, 0, id="tampered body"),
        pytest.param(BODY, "whsec_wrong", 0, id="wrong secret"),
        pytest.param(BODY, STRIPE_SECRET, 310, id="stale"),
    ],
)
def test_stripe_sdk_and_onceonly_agree_on_rejection(body: bytes, secret: str, age: int) -> None:
    header = stripe_header(BODY, secret, int(time.time()) - age)
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.Webhook.construct_event(body, header, STRIPE_SECRET)
    rejected(Stripe(STRIPE_SECRET), body, {"Stripe-Signature": header})


class StandardWebhooksSDK(Protocol):
    def sign(self, msg_id: str, timestamp: datetime, data: str) -> str: ...
    def verify(self, data: bytes | str, headers: dict[str, str]) -> object: ...


SW_SDKS = [
    pytest.param(standardwebhooks.Webhook, "webhook", id="standardwebhooks"),
    pytest.param(svix.webhooks.Webhook, "svix", id="svix"),
]


@pytest.mark.parametrize(("sdk", "prefix"), SW_SDKS)
@pytest.mark.parametrize("body", SDK_BODIES)
def test_sdk_standardwebhooks_signature_is_accepted(
    sdk: Callable[[str], StandardWebhooksSDK], prefix: str, body: bytes
) -> None:
    signature = sdk(whsec(SW_KEY)).sign(MSG_ID, datetime.fromtimestamp(NOW, UTC), body.decode())
    assert signature == sw_sig(body)  # the SDK and the documented algorithm agree
    provider = STANDARD.provider()
    headers = sw_headers(body, prefix=prefix, signature=signature)
    provider.verify(delivery(provider, body, headers))


@pytest.mark.parametrize(("sdk", "prefix"), SW_SDKS)
@pytest.mark.parametrize("body", SDK_BODIES)
@pytest.mark.parametrize("several", [False, True], ids=["one v1", "several entries"])
def test_test_built_standardwebhooks_headers_are_accepted_by_sdk(
    sdk: Callable[[str], StandardWebhooksSDK], prefix: str, body: bytes, several: bool
) -> None:
    now = int(time.time())
    signature = sw_sig(body, timestamp=now)
    if several:
        signature = f"{BAD_B64} v1a,{BAD_B64[3:]} {signature}"
    headers = sw_headers(body, timestamp=now, prefix=prefix, signature=signature)
    sdk(whsec(SW_KEY)).verify(body, headers)
    provider = StandardWebhooks(whsec(SW_KEY))  # the real clock, as the SDK uses
    provider.verify(delivery(provider, body, headers))


@pytest.mark.parametrize(("sdk", "prefix"), SW_SDKS)
@pytest.mark.parametrize(
    ("body", "key", "age"),
    [
        pytest.param(TAMPERED, SW_KEY, 0, id="tampered body"),
        pytest.param(BODY, SW_OLD_KEY, 0, id="wrong key"),
        pytest.param(BODY, SW_KEY, 310, id="stale"),
        pytest.param(BODY, SW_KEY, -310, id="future"),
    ],
)
def test_standardwebhooks_sdk_and_onceonly_agree_on_rejection(
    sdk: Callable[[str], StandardWebhooksSDK], prefix: str, body: bytes, key: bytes, age: int
) -> None:
    now = int(time.time()) - age
    headers = sw_headers(BODY, key=key, timestamp=now, prefix=prefix)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        sdk(whsec(SW_KEY)).verify(body, headers)
    rejected(StandardWebhooks(whsec(SW_KEY)), body, headers)


# -- fuzzing: bad input is a 4xx, never a 500 --------------------------------------

FUZZ_CASES = 400
KEYWORDS = ["t", "v1", "v0", "v1a", "v2", "sha256", "sha1", "whsec_", "id", "null", "", " "]
SEPARATORS = [",", ", ", " ", "=", ".", ";", ""]


def fuzz_number(rng: random.Random) -> str:
    return rng.choice(
        [
            str(NOW + rng.randint(-400, 400)),
            str(rng.randint(-(10**12), 10**12)),
            "1" + "0" * rng.randint(18, 600),  # parses as int, too large for a float
            "9" * rng.randint(4301, 4400),  # over Python's int-parsing digit limit
            rng.choice(["-0", "+5", "1.5", "1e9", "nan", "inf", " 42 ", "0x1f", "1_000"]),
        ]
    )


def fuzz_token(rng: random.Random) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        return rng.choice(KEYWORDS)
    if kind == 1:
        return fuzz_number(rng)
    if kind == 2:
        return rng.randbytes(rng.randrange(40)).hex()
    if kind == 3:
        return random_b64(rng, rng.randrange(48))
    # Latin-1, as the receiver decodes header bytes.
    return "".join(chr(rng.randrange(256)) for _ in range(rng.randrange(24)))


def fuzz_header_value(rng: random.Random) -> str:
    parts = [fuzz_token(rng) for _ in range(rng.randint(1, 6))]
    return "".join(part + rng.choice(SEPARATORS) for part in parts)


def fuzz_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([rng.randint(-(10**6), 10**6), 10**30, -1, 0])
    if kind == 3:
        return rng.choice([rng.uniform(-1e9, 1e9), float("nan"), float("inf")])
    if kind in (4, 5):
        return fuzz_token(rng)
    if kind == 6:
        return [fuzz_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["id", "type", "data", "object", rng.choice(KEYWORDS)]
    return {rng.choice(keys): fuzz_json(rng, depth + 1) for _ in range(rng.randrange(5))}


def fuzz_body(rng: random.Random) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randbytes(rng.randrange(200))
    if kind == 1:
        return json.dumps(fuzz_json(rng)).encode()
    if kind == 2:
        event = {"id": fuzz_json(rng, 2), "type": fuzz_json(rng, 2), "data": fuzz_json(rng)}
        return json.dumps(event).encode()
    if kind == 3:
        text = json.dumps({"id": fuzz_token(rng), "type": fuzz_token(rng)}).encode()
        return text[: rng.randrange(len(text) + 1)]
    if kind == 4:
        depth = rng.choice([1, 64, 5_000])
        return rng.choice([b"[" * depth + b"]" * depth, b'{"id":' * depth + b"1" + b"}" * depth])
    return b'{"id": "' + rng.randbytes(8) + b'", "type": "\xff"}'


def fuzz_headers(rng: random.Random, scheme: Scheme, body: bytes) -> Headers:
    """Valid headers (so identify sees the random body), mutated ones, or pure noise."""
    timestamp = rng.choice([NOW, NOW + rng.randint(-400, 400), rng.randint(0, 10**12)])
    if rng.random() < 0.2:
        timestamp = rng.choice([1, -1]) * 10 ** rng.randint(10, 400)  # up to beyond a float
    signed = scheme.sign(body, timestamp)
    names = [*signed, "webhook-id", "svix-signature", "x-github-delivery", "x-event-id"]
    mode = rng.randrange(3)
    if mode == 0:
        return signed
    if mode == 1:
        headers = dict(signed)
        for name in signed:
            roll = rng.random()
            if roll < 0.4:
                headers[name] = fuzz_header_value(rng)
            elif roll < 0.55:
                del headers[name]
        return headers
    return {name: fuzz_header_value(rng) for name in names if rng.random() < 0.6}


@pytest.mark.parametrize("scheme", SCHEMES, ids=scheme_ids)
def test_fuzzed_deliveries_only_raise_delivery_rejected(scheme: Scheme) -> None:
    rng = random.Random(f"onceonly-{scheme.id}")
    provider = scheme.provider()
    escaped: dict[str, str] = {}
    accepted = 0
    for _ in range(FUZZ_CASES):
        body = fuzz_body(rng)
        item = delivery(provider, body, fuzz_headers(rng, scheme, body))
        try:
            provider.verify(item)
            provider.identify(item)
            accepted += 1
        except DeliveryRejected:
            pass
        except Exception as exc:
            key = f"{type(exc).__name__} in {scheme.id}: {str(exc)[:80]}"
            escaped.setdefault(key, f"headers={dict(item.headers)!r:.200} body={body[:60]!r}")
    assert not escaped, "\n".join(f"{key}\n    e.g. {example}" for key, example in escaped.items())
    assert accepted > 0  # the generator does reach identify() with random bodies
