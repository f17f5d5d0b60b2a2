"""The tests' one signing helper (``support.signed``) is built on Provider.sign:
what it signs, the provider it is given verifies."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from onceonly import Delivery, SignatureError
from onceonly.providers import GitHub, Stripe
from support import STRIPE_SECRET, signed, stripe_delivery

BODY = b'{"id": "evt_helper", "type": "x"}'


def test_signed_defaults_to_stripe_with_the_test_secret() -> None:
    body, headers = signed(BODY)
    assert body == BODY
    assert headers["content-type"] == "application/json"
    provider = Stripe(STRIPE_SECRET)
    provider.verify(Delivery("stripe", body, headers))
    with pytest.raises(SignatureError):
        Stripe("whsec_other").verify(Delivery("stripe", body, headers))


def test_signed_follows_the_provider_it_is_given() -> None:
    provider = GitHub("gh-secret")
    body, headers = signed(BODY, provider, delivery_id="guid-1")
    assert headers["x-github-delivery"] == "guid-1"
    provider.verify(Delivery("github", body, headers))


def test_stripe_delivery_matches_stripe_s_documented_scheme() -> None:
    # Stripe's scheme written out here, independently of our signer: v1 is the
    # HMAC-SHA256 hex of "{t}.{body}" with the endpoint secret.
    body, headers = stripe_delivery("evt_doc", timestamp=1_700_000_000)
    assert json.loads(body)["id"] == "evt_doc"
    expected = hmac.new(STRIPE_SECRET.encode(), b"1700000000." + body, hashlib.sha256).hexdigest()
    assert headers["stripe-signature"] == f"t=1700000000,v1={expected}"
