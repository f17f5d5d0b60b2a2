"""The fake gateway without a network: retry schedules, decisions, and deliveries
that each provider's own verifier accepts."""

from __future__ import annotations

import base64
import itertools
import json
import random

import pytest

from onceonly import ConfigurationError, Delivery, SignatureError
from onceonly.dev.delivery import Faults, Sender
from onceonly.dev.gateway import prepare_events, provider_for, receiver_url
from onceonly.dev.payloads import DEFAULT_EVENT_TYPES, build_event
from onceonly.dev.schedules import RETRY_POLICIES, Verdict, decide, policy_for
from onceonly.providers import PROVIDER_CLASSES

HOUR = 3600.0

SECRETS = {
    "stripe": "whsec_unit",
    "standardwebhooks": "whsec_" + base64.b64encode(b"0123456789abcdef01234567").decode(),
    "github": "gh-secret",
    "hmac": "hmac-secret",
    "mercadopago": "mp-secret",
    "asaas": "asaas-token",
    "pagbank": "pagbank-token",
    "shopify": "shopify-secret",
    "pagarme": "hook-user:hook-password",
    "efi": "efi-url-secret",
}
OTHER_SECRETS = {
    "standardwebhooks": "whsec_" + base64.b64encode(b"another-key-of-24-bytes!").decode()
}


def test_every_provider_has_a_retry_behaviour_and_an_event_shape() -> None:
    assert set(PROVIDER_CLASSES) <= set(RETRY_POLICIES)
    assert set(PROVIDER_CLASSES) <= set(DEFAULT_EVENT_TYPES)
    with pytest.raises(ConfigurationError, match="known: "):
        policy_for("paypal")


def test_stripe_backs_off_exponentially_for_up_to_three_days() -> None:
    stripe = policy_for("stripe")
    delays = stripe.delays
    assert delays[0] == 60
    assert all(later >= earlier for earlier, later in itertools.pairwise(delays))
    assert delays[-2] == 2 * delays[-3]
    assert 2.5 * 24 * HOUR < stripe.total_seconds <= 3 * 24 * HOUR
    assert stripe.succeeded(200)
    assert stripe.succeeded(204)
    assert not stripe.succeeded(302)


def test_asaas_counts_only_200_and_pauses_the_queue() -> None:
    asaas = policy_for("asaas")
    assert asaas.delays[:3] == (30, 60, 210)
    assert asaas.total_seconds == 3 * HOUR
    assert asaas.pause_after_failures == 15
    assert decide(asaas, 1, 200) is Verdict.ACKNOWLEDGED
    for status in (201, 202, 204):
        assert decide(asaas, 1, status) is Verdict.RETRY


def test_mercadopago_accepts_200_and_201_and_retries_every_15_minutes() -> None:
    mp = policy_for("mercadopago")
    assert set(mp.delays) == {15 * 60}
    assert mp.timeout == 22
    assert decide(mp, 1, 201) is Verdict.ACKNOWLEDGED
    assert decide(mp, 1, 204) is Verdict.RETRY


def test_shopify_retries_eight_times_over_four_hours_with_a_5_second_timeout() -> None:
    shopify = policy_for("shopify")
    assert len(shopify.delays) == 8
    assert shopify.total_seconds == 4 * HOUR
    assert shopify.timeout == 5


def test_a_timeout_is_retried_until_the_schedule_runs_out() -> None:
    shopify = policy_for("shopify")
    for attempt in range(1, 9):
        assert decide(shopify, attempt, None) is Verdict.RETRY
        assert decide(shopify, attempt, 503) is Verdict.RETRY
    assert decide(shopify, 9, None) is Verdict.GIVE_UP
    assert shopify.delay_after(9) is None


def test_github_never_retries_and_410_disables_a_standard_webhooks_endpoint() -> None:
    assert decide(policy_for("github"), 1, 500) is Verdict.GIVE_UP
    sw = policy_for("standardwebhooks")
    assert sw.delays == (5, 300, 1800, 2 * HOUR, 5 * HOUR, 10 * HOUR, 10 * HOUR)
    assert decide(sw, 1, 410) is Verdict.DISABLE
    assert decide(sw, 1, 404) is Verdict.RETRY


@pytest.mark.parametrize("name", sorted(PROVIDER_CLASSES))
def test_what_the_gateway_sends_passes_the_providers_own_verifier(name: str) -> None:
    provider = provider_for(name, SECRETS[name], environ={})
    sender = Sender(provider, "http://127.0.0.1:1/")
    event = build_event(name, rng=random.Random(1))
    headers = sender.signed_headers(event)
    delivery = Delivery(name, event.body, headers, sender.signed_query(event))
    provider.verify(delivery)
    info = provider.identify(delivery)
    assert info.event_id
    # The same event signed again (a retry) is the same event to the receiver.
    again = Delivery(name, event.body, sender.signed_headers(event), sender.signed_query(event))
    assert provider.identify(again).event_id == info.event_id
    # And the signature covers what it should: a wrong secret is refused.
    wrong = OTHER_SECRETS.get(name, SECRETS[name] + "x")
    other = provider_for(name, wrong, environ={})
    forger = Sender(other, "http://127.0.0.1:1/")
    forged = Delivery(name, event.body, forger.signed_headers(event), forger.signed_query(event))
    with pytest.raises(SignatureError):
        provider.verify(forged)


def test_stripe_events_carry_their_id_and_type_and_the_object_they_point_to() -> None:
    event = build_event("stripe", event_type="charge.refunded", rng=random.Random(2))
    body = json.loads(event.body)
    assert body["id"] == event.event_id
    assert body["type"] == "charge.refunded"
    assert body["data"]["object"]["id"].startswith("pi_")


def test_mercadopago_puts_the_payment_id_in_the_query_string() -> None:
    event = build_event("mercadopago", rng=random.Random(3))
    body = json.loads(event.body)
    assert event.query["data.id"] == body["data"]["id"]
    assert str(body["id"]) == event.event_id
    assert body["action"] == "payment.updated"


def test_the_same_seed_makes_the_same_events() -> None:
    first = prepare_events("stripe", 5, seed=9)
    again = prepare_events("stripe", 5, seed=9)
    other = prepare_events("stripe", 5, seed=10)
    assert [e.body for e in first] == [e.body for e in again]
    assert {e.event_id for e in first}.isdisjoint(e.event_id for e in other)
    assert len({e.event_id for e in first}) == 5


def test_provider_secret_comes_from_the_receivers_setting() -> None:
    provider = provider_for("stripe", environ={"ONCEONLY_STRIPE_SECRET": " whsec_a , whsec_b"})
    assert provider.secrets == ("whsec_a",)
    with pytest.raises(ConfigurationError, match="ONCEONLY_ASAAS_SECRET"):
        provider_for("asaas", environ={})
    with pytest.raises(ConfigurationError, match="unknown provider"):
        provider_for("paypal", "x", environ={})


def test_receiver_url_adds_the_webhook_route_to_a_bare_address() -> None:
    assert receiver_url("127.0.0.1:8000", "asaas") == "http://127.0.0.1:8000/webhooks/asaas"
    assert receiver_url("http://h:1/", "stripe") == "http://h:1/webhooks/stripe"
    assert receiver_url("https://h/hooks/in", "stripe") == "https://h/hooks/in"


def test_fault_probabilities_are_checked() -> None:
    with pytest.raises(ValueError, match="probability"):
        Faults(duplicates=1.5)
    with pytest.raises(ValueError, match="copies"):
        Faults(copies=1)
