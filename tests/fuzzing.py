"""Deliveries for fuzzing the receiver: genuine ones, and what an attacker sends.

Each :class:`Shot` is one HTTP request and what must come of it. Genuine
deliveries are signed with the receiver's secrets through each provider's own
``sign()``; the hostile ones are everything else a stranger on the internet
can send: tampered bytes, forged or missing signatures, poisoned ids, bodies
and headers past the limits, other routes and methods.

Used twice: ``tests/integration/test_fuzz.py`` draws the hostile parts with
hypothesis (a bounded run in CI), and ``benchmarks/fuzz.py`` draws them from a
seeded ``random.Random`` for 100,000 requests.
"""

from __future__ import annotations

import json
import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from onceonly.events import Delivery
from onceonly.providers import GitHub, Provider, Shopify, StandardWebhooks, Stripe

STRIPE_SECRET = "whsec_fuzz_stripe_0123456789abcdef"
GITHUB_SECRET = "fuzz-github-secret"
SHOPIFY_SECRET = "fuzz-shopify-secret"
STANDARD_SECRET = "whsec_" + "ZnV6ei1zdGFuZGFyZC13ZWJob29rcy1zZWNyZXQ="

#: The receiver's providers, by route; limits small enough to reach cheaply.
PROVIDERS: dict[str, Provider] = {
    "stripe": Stripe(STRIPE_SECRET),
    "github": GitHub(GITHUB_SECRET),
    "shopify": Shopify(SHOPIFY_SECRET),
    "standardwebhooks": StandardWebhooks(STANDARD_SECRET),
}
#: Routes whose dedup identity comes from signed material only: a captured
#: delivery replayed with any unsigned header changed must create nothing.
IDENTITY_FROM_SIGNED = frozenset({"stripe", "github", "shopify", "standardwebhooks"})
MAX_BODY_BYTES = 16 * 1024
MAX_HEADER_BYTES = 8 * 1024


@dataclass(frozen=True)
class Shot:
    """One request; `genuine` names the event it must store (provider, id)."""

    method: str
    path: str
    body: bytes
    headers: dict[str, str]
    kind: str
    genuine: tuple[str, str] | None = None
    #: Statuses that are a correct answer (a hostile shot: any 4xx of these).
    expected: frozenset[int] = field(default_factory=lambda: frozenset({200}))


def new_id(prefix: str = "evt_fuzz_") -> str:
    return prefix + secrets.token_hex(8)


def _json(data: object) -> bytes:
    return json.dumps(data).encode()


def genuine(route: str, event_id: str) -> Shot:
    """A delivery its provider would send, for a new event `event_id` (its
    body differs from every other event's, as real ones do)."""
    provider = PROVIDERS[route]
    if route == "stripe":
        body = _json({"id": event_id, "type": "payment_intent.succeeded", "data": {}})
        headers = provider.sign(body)
    elif route == "github":
        body = _json({"action": "completed", "check_run": {"node_id": event_id}})
        headers = {**provider.sign(body, delivery_id=event_id), "x-github-event": "check_run"}
    elif route == "shopify":
        body = _json({"id": event_id, "total_price": "10.00"})
        headers = {
            **provider.sign(body, delivery_id=event_id),
            "x-shopify-topic": "orders/paid",
        }
    else:
        body = _json({"type": "invoice.paid", "data": {"id": event_id}})
        headers = provider.sign(body, delivery_id=event_id)
    headers = {**headers, "content-type": "application/json"}
    # The id the provider derives from it (for some, a hash of the signed body).
    stored_id = provider.identify(Delivery(route, body, headers)).event_id
    return Shot(
        "POST", f"/webhooks/{route}", body, headers, f"genuine {route}", genuine=(route, stored_id)
    )


def resend(shot: Shot) -> Shot:
    """The same delivery again, as a provider's retry sends it."""
    return Shot(shot.method, shot.path, shot.body, shot.headers, "resend", shot.genuine)


REJECTED = frozenset({400, 401, 403, 404, 405, 408, 413, 431})


def hostile(
    kind: str, body: bytes, headers: dict[str, str], path: str = "/webhooks/stripe"
) -> Shot:
    return Shot("POST", path, body, headers, kind, None, REJECTED)


def tampered(seed: Shot, position: int, flip: int) -> Shot:
    """A genuine delivery with one byte of its body changed: the signature
    no longer matches."""
    body = bytearray(seed.body)
    body[position % len(body)] ^= flip or 1
    return hostile("tampered body", bytes(body), seed.headers, seed.path)


def forged(body: bytes, signature: str) -> Shot:
    return hostile("forged signature", body, {"stripe-signature": signature})


def unsigned(body: bytes) -> Shot:
    return hostile("no signature", body, {"content-type": "application/json"})


def signed_stripe(body: bytes, kind: str) -> Shot:
    """A body the attacker cannot sign; signed here to reach what comes after
    verification (a provider's own bug, or a leaked secret, could send it)."""
    return hostile(kind, body, PROVIDERS["stripe"].sign(body))


def poisoned_ids() -> list[bytes]:
    return [
        b'{"id": "evt_\\u0000", "type": "x"}',
        b'{"id": "evt_\\ud800", "type": "x"}',
        b'{"id": ' + b"9" * 3000 + b', "type": "x"}',
        b'{"id": "' + b"e" * 300 + b'", "type": "x"}',
        b'{"id": ["not", "a", "string"]}',
        b'{"id": null}',
        b"[" * 5_000 + b"]" * 5_000,
        b"not json at all",
        b'{"type": "no id"}',
    ]


def oversized_body(body: bytes) -> Shot:
    big = body + b" " * (MAX_BODY_BYTES + 1)
    return hostile("oversized body", big, PROVIDERS["stripe"].sign(big))


def oversized_headers(seed: Shot) -> Shot:
    padding = {f"x-pad-{n}": "p" * 1024 for n in range(MAX_HEADER_BYTES // 1024 + 1)}
    return hostile("oversized headers", seed.body, {**seed.headers, **padding}, seed.path)


def replay_altered(seed: Shot, header: str, value: str) -> Shot:
    """A captured genuine delivery sent again with one unsigned header changed."""
    return Shot(
        "POST",
        seed.path,
        seed.body,
        {**seed.headers, header: value},
        f"replay with {header} changed",
        None,
        frozenset({200, *REJECTED}),
    )


def other_route(body: bytes, route: str) -> Shot:
    return hostile("unknown provider", body, {}, f"/webhooks/{route}")


def wrong_method(seed: Shot) -> Shot:
    return Shot("GET", seed.path, b"", {}, "wrong method", None, REJECTED)


def random_shot(rng: random.Random, sent: list[Shot]) -> Shot:
    """One shot for the long run (benchmarks/fuzz.py): genuine about half the
    time, resends of earlier genuine ones, and every hostile kind."""
    roll = rng.random()
    route = rng.choice(sorted(PROVIDERS))
    if roll < 0.45 or not sent:
        return genuine(route, new_id())
    seed = rng.choice(sent)
    noise = rng.randbytes(rng.randint(0, 64))
    choices: list[Callable[[], Shot]] = [
        lambda: resend(seed),
        lambda: tampered(seed, rng.randint(0, 10**6), rng.randint(1, 255)),
        lambda: forged(seed.body, rng.choice(["t=1,v1=", "v1=", "", "t=x,"]) + noise.hex()),
        lambda: unsigned(seed.body),
        lambda: signed_stripe(rng.choice(poisoned_ids()), "poisoned id"),
        lambda: signed_stripe(noise, "signed noise"),
        lambda: oversized_body(seed.body),
        lambda: oversized_headers(seed),
        lambda: (
            replay_altered(seed, rng.choice(list(seed.headers)), noise.hex())
            if seed.path.rsplit("/", 1)[-1] in IDENTITY_FROM_SIGNED
            else resend(seed)
        ),
        lambda: other_route(noise, rng.choice(["paypal", "x" * 300, "%00", ".."])),
        lambda: wrong_method(seed),
    ]
    return rng.choice(choices)()
