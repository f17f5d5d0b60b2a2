"""``Provider.sign``: what the fake gateway and tests send is what each
provider's ``verify`` accepts, what the official SDKs accept, and is signed with
the first configured secret. Also a fuzz run over the newer providers: bad input
is a 4xx, never a 500.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import standardwebhooks
import stripe
import svix.webhooks

from onceonly import Delivery, DeliveryRejected, EventInfo, SignatureError
from onceonly.providers import (
    HMAC,
    Asaas,
    GitHub,
    MercadoPago,
    PagBank,
    Provider,
    Shopify,
    StandardWebhooks,
    Stripe,
)

NOW = 1_700_000_000
BODY = b'{"id":"evt_sign_1","type":"payment.updated","action":"payment.updated","data":{"id":"42"}}'
QUERY = {"data.id": "42", "type": "payment"}


def whsec(key: bytes) -> str:
    return "whsec_" + base64.b64encode(key).decode()


def frozen() -> float:
    return float(NOW)


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[list[str]], Provider]
    secrets: tuple[str, str]
    #: Where `delivery_id` must show up, if anywhere.
    id_header: str | None
    #: Whether the signature covers the body (Mercado Pago's and Asaas's do not).
    signs_body: bool = True


CASES = [
    Case("stripe", lambda s: Stripe(s, clock=frozen), ("whsec_a1", "whsec_b2"), None),
    Case(
        "standardwebhooks",
        lambda s: StandardWebhooks(s, clock=frozen),
        (whsec(b"k" * 24), whsec(b"j" * 24)),
        "webhook-id",
    ),
    Case("github", GitHub, ("gh-one", "gh-two"), "x-github-delivery"),
    Case("hmac", HMAC, ("h-one", "h-two"), None),
    Case(
        "hmac-header-id",
        lambda s: HMAC(s, encoding="base64", prefix="sha256=", event_id="header:X-Event-Id"),
        ("h-one", "h-two"),
        "x-event-id",
    ),
    Case(
        "mercadopago",
        lambda s: MercadoPago(s, clock=frozen, tolerance=300),
        ("mp-one", "mp-two"),
        "x-request-id",
        signs_body=False,
    ),
    Case("asaas", Asaas, ("as-one", "as-two"), None, signs_body=False),
    Case("pagbank", PagBank, ("pb-one", "pb-two"), None),
    Case("shopify", Shopify, ("sh-one", "sh-two"), "x-shopify-webhook-id"),
]


def case_id(case: Case) -> str:
    return case.id


def deliver(provider: Provider, headers: dict[str, str], body: bytes = BODY) -> Delivery:
    return Delivery(provider.name, body, headers, QUERY)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_signed_delivery_verifies_and_identifies(case: Case) -> None:
    provider = case.make(list(case.secrets))
    headers = provider.sign(BODY, timestamp=NOW, delivery_id="dlv-123", query=QUERY)
    assert all(name == name.lower() for name in headers)
    item = deliver(provider, headers)
    provider.verify(item)
    info = provider.identify(item)
    if case.id_header:
        assert headers[case.id_header] == "dlv-123"
    if case.id in ("standardwebhooks", "hmac-header-id"):
        assert info.event_id == "dlv-123"
    if case.id in ("github", "shopify"):
        # Their delivery ids are unsigned: the id comes from the signed body.
        assert info.event_id.startswith("sha256:")


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_signed_with_the_first_secret_only(case: Case) -> None:
    first, second = case.secrets
    headers = case.make([first, second]).sign(BODY, timestamp=NOW, query=QUERY)
    only_first, only_second = case.make([first]), case.make([second])
    only_first.verify(deliver(only_first, headers))
    with pytest.raises(SignatureError):
        only_second.verify(deliver(only_second, headers))


@pytest.mark.parametrize("case", [c for c in CASES if c.signs_body], ids=case_id)
def test_a_body_changed_after_signing_is_rejected(case: Case) -> None:
    provider = case.make(list(case.secrets))
    headers = provider.sign(BODY, timestamp=NOW, query=QUERY)
    with pytest.raises(SignatureError):
        provider.verify(deliver(provider, headers, BODY.replace(b"42", b"43")))


@pytest.mark.parametrize("case", [c for c in CASES if c.id_header], ids=case_id)
def test_a_random_delivery_id_when_none_is_given(case: Case) -> None:
    provider = case.make(list(case.secrets))
    one, two = (provider.sign(BODY, timestamp=NOW, query=QUERY) for _ in range(2))
    assert case.id_header
    assert one[case.id_header]
    assert one[case.id_header] != two[case.id_header]


@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[5]], ids=case_id)
def test_timestamp_defaults_to_the_provider_clock(case: Case) -> None:
    provider = case.make(list(case.secrets))
    assert provider.sign(BODY, delivery_id="d", query=QUERY) == provider.sign(
        BODY, timestamp=NOW, delivery_id="d", query=QUERY
    )


def test_a_stale_signed_timestamp_is_rejected() -> None:
    provider = Stripe("whsec_a1", clock=frozen)
    with pytest.raises(SignatureError):
        provider.verify(deliver(provider, provider.sign(BODY, timestamp=NOW - 301)))


def test_stripe_sdk_accepts_sign() -> None:
    headers = Stripe("whsec_a1").sign(BODY)  # the real clock, as the SDK uses
    event = stripe.Webhook.construct_event(BODY, headers["stripe-signature"], "whsec_a1")
    assert event["id"] == "evt_sign_1"


@pytest.mark.parametrize("prefix", ["webhook", "svix"])
def test_standardwebhooks_and_svix_sdks_accept_sign(prefix: str) -> None:
    secret = whsec(b"k" * 24)
    headers = StandardWebhooks(secret).sign(BODY, delivery_id="msg_1")
    standardwebhooks.Webhook(secret).verify(BODY, headers)
    renamed = {name.replace("webhook-", f"{prefix}-"): value for name, value in headers.items()}
    svix.webhooks.Webhook(secret).verify(BODY, renamed)


class Custom(Provider):
    name = "custom"

    def verify(self, delivery: Delivery) -> None:
        """Accept everything."""

    def identify(self, delivery: Delivery) -> EventInfo:
        """Every delivery is one event."""
        return EventInfo("one")


def test_a_custom_provider_without_sign_says_so() -> None:
    with pytest.raises(NotImplementedError, match="custom"):
        Custom("s").sign(BODY)


# -- fuzzing the newer providers --------------------------------------------------------

FUZZ_CASES = 300
NAMES = [
    "x-signature",
    "x-request-id",
    "asaas-access-token",
    "x-authenticity-token",
    "x-shopify-hmac-sha256",
    "x-shopify-webhook-id",
    "x-shopify-event-id",
    "x-shopify-topic",
]


def fuzz_text(rng: random.Random) -> str:
    pieces = [
        "ts=",
        "v1=",
        ",",
        "=",
        ";",
        str(NOW),
        str(NOW * 1000),
        "9" * rng.randint(1, 5000),
        "-1",
        rng.randbytes(16).hex(),
        base64.b64encode(rng.randbytes(12)).decode(),
        "".join(chr(rng.randrange(256)) for _ in range(rng.randrange(12))),
        " ",
    ]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))


def fuzz_body(rng: random.Random) -> bytes:
    values: list[object] = [None, True, 7, 10**40, "x", [], {}, {"id": None}, 1.5]
    kind = rng.randrange(5)
    if kind == 0:
        return rng.randbytes(rng.randrange(64))
    if kind == 1:
        obj = {k: rng.choice(values) for k in ("id", "type", "action", "event", "status")}
        obj["charges"] = rng.choice([[{"id": rng.choice(values), "amount": {"summary": 1}}], 5])
        obj["data"] = rng.choice([{"id": rng.choice(values)}, "x"])
        return json.dumps(obj).encode()
    if kind == 2:
        return b"notificationCode=" + fuzz_text(rng).encode("latin-1") + b"&notificationType=t"
    if kind == 3:
        return b"[" * 3000 + b"]" * 3000
    return fuzz_text(rng).encode("latin-1")


@pytest.mark.parametrize("case", CASES[5:], ids=case_id)
def test_fuzzed_deliveries_only_raise_delivery_rejected(case: Case) -> None:
    rng = random.Random(f"onceonly-sign-{case.id}")
    lenient = case.make(list(case.secrets))
    if isinstance(lenient, MercadoPago | PagBank):
        lenient.unsigned = "fetch"  # the most permissive policy: the most code reached
    escaped: dict[str, str] = {}
    accepted = 0
    for _ in range(FUZZ_CASES):
        body = fuzz_body(rng)
        query = rng.choice([{}, QUERY, {"topic": "payment", "id": fuzz_text(rng)}])
        headers = lenient.sign(body, timestamp=rng.choice([NOW, NOW - 10**6]), query=query)
        for name in NAMES:
            roll = rng.random()
            if roll < 0.25:
                headers[name] = fuzz_text(rng)
            elif roll < 0.4:
                headers.pop(name, None)
        item = Delivery(lenient.name, body, headers, query)
        try:
            lenient.verify(item)
            lenient.identify(item)
            accepted += 1
        except DeliveryRejected:
            pass
        except Exception as exc:
            key = f"{type(exc).__name__}: {str(exc)[:80]}"
            escaped.setdefault(key, f"headers={headers!r:.200} body={body[:60]!r}")
    assert not escaped, "\n".join(f"{k}\n    e.g. {v}" for k, v in escaped.items())
    assert accepted > 0
