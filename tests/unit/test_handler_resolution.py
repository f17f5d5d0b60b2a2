"""Which handlers run for an event, with which retry policy; ``Event.json()``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from onceonly import (
    ConfigurationError,
    Event,
    EventStatus,
    NewEvent,
    PayloadError,
    PayloadPurged,
)
from onceonly.handlers import HandlerRegistry, by_object


def named(name: str) -> Any:
    def handler(event: Event, ctx: Any) -> None:
        pass

    handler.__qualname__ = name
    return handler


def resolved(registry: HandlerRegistry, provider: str, event_type: str | None) -> str | None:
    route = registry.route(provider, event_type)
    return route.name.removeprefix(f"{__name__}.") if route else None


def test_exact_beats_longest_wildcard_beats_shorter_beats_catch_alls() -> None:
    registry = HandlerRegistry()
    for provider, event_type, name in [
        (None, None, "anything"),
        (None, "payment_intent.succeeded", "any_provider_exact"),
        (None, "payment_intent.*", "any_provider_wildcard"),
        ("stripe", None, "stripe_any"),
        ("stripe", "payment_intent.*", "intents"),
        ("stripe", "payment_intent.payment_failed.*", "failures"),
        ("stripe", "payment_intent.succeeded", "succeeded"),
        ("shopify", "orders/*", "orders"),
        ("mercadopago", "unverified:*", "unverified"),
    ]:
        registry.add(named(name), provider, event_type)

    assert resolved(registry, "stripe", "payment_intent.succeeded") == "succeeded"
    assert resolved(registry, "stripe", "payment_intent.created") == "intents"
    assert resolved(registry, "stripe", "payment_intent.payment_failed.card") == "failures"
    # The provider decides first: its catch-all beats another provider's match.
    assert resolved(registry, "stripe", "charge.succeeded") == "stripe_any"
    assert resolved(registry, "stripe", None) == "stripe_any"
    assert resolved(registry, "github", "payment_intent.succeeded") == "any_provider_exact"
    assert resolved(registry, "github", "payment_intent.canceled") == "any_provider_wildcard"
    assert resolved(registry, "shopify", "orders/create") == "orders"
    assert resolved(registry, "shopify", "orders") == "anything"
    assert resolved(registry, "github", "push") == "anything"
    assert resolved(registry, "mercadopago", "unverified:payment.created") == "unverified"
    assert resolved(registry, "mercadopago", "payment.created") == "anything"


def test_a_wildcard_matches_whole_segments_only() -> None:
    registry = HandlerRegistry()
    registry.add(named("intents"), "stripe", "payment_intent.*")
    assert resolved(registry, "stripe", "payment_intent.succeeded") == "intents"
    for other in ["payment_intent", "payment_intent.", "payment_intents.created", None]:
        assert resolved(registry, "stripe", other) is None, other
    # Mercado Pago's unverified types keep their prefix: not matched by accident.
    assert resolved(registry, "stripe", "unverified:payment_intent.created") is None


def test_a_lone_star_is_any_type() -> None:
    registry = HandlerRegistry()
    registry.add(named("all"), "stripe", "*")
    assert resolved(registry, "stripe", "invoice.paid") == "all"
    with pytest.raises(ConfigurationError, match="already registered"):
        registry.add(named("all"), "stripe", None)


@pytest.mark.parametrize(
    "pattern", ["*foo", "payment_intent.*.created", "payment*", "", ".*", "a..*", "**", "a.**"]
)
def test_patterns_that_cannot_work_are_refused_at_registration(pattern: str) -> None:
    registry = HandlerRegistry()
    with pytest.raises(ConfigurationError, match="event type"):
        registry.add(named("h"), "stripe", pattern)
    assert len(registry) == 0


def test_a_registration_after_a_lookup_is_seen() -> None:
    registry = HandlerRegistry()
    registry.add(named("stripe_any"), "stripe")
    assert resolved(registry, "stripe", "invoice.paid") == "stripe_any"
    registry.add(named("invoices"), "stripe", "invoice.*")
    assert resolved(registry, "stripe", "invoice.paid") == "invoices"


def test_several_handlers_of_one_type_run_in_order_and_name_their_effects_apart() -> None:
    registry = HandlerRegistry()
    registry.add(named("record"), "stripe", "charge.succeeded")
    registry.add(named("notify"), "stripe", "charge.succeeded")
    route = registry.route("stripe", "charge.succeeded")
    assert route is not None
    assert [r.name for r in route.registrations] == [f"{__name__}.record", f"{__name__}.notify"]
    assert route.name == f"{__name__}.record, {__name__}.notify"
    # The first keeps bare effect names (the keys a single handler always had).
    assert [r.effect_prefix for r in route.registrations] == ["", f"{__name__}.notify/"]
    assert len(registry) == 2
    with pytest.raises(ConfigurationError, match="already registered"):
        registry.add(named("notify"), "stripe", "charge.succeeded")


def test_handlers_of_one_type_share_one_retry_policy() -> None:
    registry = HandlerRegistry()
    registry.add(named("record"), "stripe", "charge.succeeded")
    registry.add(named("notify"), "stripe", "charge.succeeded", attempts=3, backoff=(1, 5))
    registry.add(named("audit"), "stripe", "charge.succeeded", attempts=3)
    route = registry.route("stripe", "charge.succeeded")
    assert route is not None
    assert (route.attempts, route.backoff) == (3, (1.0, 5.0))
    with pytest.raises(ConfigurationError, match="share one retry policy"):
        registry.add(named("late"), "stripe", "charge.succeeded", attempts=4)
    with pytest.raises(ConfigurationError, match="share one retry policy"):
        registry.add(named("slow"), "stripe", "charge.succeeded", backoff=(1, 60))


@pytest.mark.parametrize(
    "options",
    [
        {"attempts": 0},
        {"attempts": True},
        {"attempts": "3"},
        {"backoff": (0, 10)},
        {"backoff": (10, 1)},
        {"backoff": (1,)},
        {"backoff": ("a", 1)},
        {"backoff": 5},
        {"backoff": (1, float("inf"))},
    ],
)
def test_bad_attempts_and_backoff_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match=r"attempts|backoff"):
        HandlerRegistry().add(named("h"), "stripe", "x", **options)


def worker_delay(attempt: int) -> float:
    return 1000.0 + attempt


def test_the_policy_is_the_handlers_where_set_and_the_workers_elsewhere() -> None:
    registry = HandlerRegistry()
    registry.add(named("plain"), "stripe", "a")
    registry.add(named("fast"), "stripe", "b", attempts=2, backoff=(0.5, 1))
    registry.add(named("steps"), "stripe", "c", backoff=lambda n: [5.0, 60.0][n - 1])

    def policy(event_type: str) -> tuple[int, list[float]]:
        route = registry.route("stripe", event_type)
        assert route is not None
        chosen = route.policy(10, worker_delay)
        return chosen.max_attempts, [chosen.delay(n) for n in (1, 2)]

    assert policy("a") == (10, [1001.0, 1002.0])
    attempts, (first, second) = policy("b")
    assert attempts == 2
    assert 0.25 <= first <= 0.5
    assert 0.5 <= second <= 1.0
    assert policy("c") == (10, [5.0, 60.0])


@pytest.mark.parametrize("broken", [lambda n: 1 / 0, lambda n: -1.0, lambda n: float("nan")])
def test_a_broken_backoff_function_falls_back_to_the_workers(broken: Any) -> None:
    registry = HandlerRegistry()
    registry.add(named("h"), "stripe", "a", backoff=broken)
    route = registry.route("stripe", "a")
    assert route is not None
    assert route.policy(10, worker_delay).delay(1) == 1001.0


def make_event(body: bytes, **fields: Any) -> Event:
    return Event(
        id=7,
        provider="stripe",
        event_id="evt_7",
        event_type="charge.succeeded",
        body=body,
        headers={},
        received_at=datetime(2026, 1, 1, tzinfo=UTC),
        status=EventStatus.PROCESSING,
        attempts=1,
        **fields,
    )


def test_json_parses_once_and_leaves_the_record_alone() -> None:
    event = make_event(b'{"data": {"object": {"id": "pi_1"}}}')
    first = event.json()
    assert first == {"data": {"object": {"id": "pi_1"}}}
    assert event.json() is first
    assert event == make_event(event.body)
    assert "_parsed" not in repr(event)
    assert "_parsed" not in event.to_dict()


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"not json", "Expecting value"),
        (b'{"a": 1', "Expecting"),
        (b'{"a": "\xff"}', "invalid start byte"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)
def test_json_of_a_body_that_is_not_json_is_a_payload_error(body: bytes, why: str) -> None:
    event = make_event(body)
    with pytest.raises(PayloadError, match=f"event 7 \\(stripe evt_7\\).*{why}"):
        event.json()


def test_json_of_a_purged_event_says_so() -> None:
    event = make_event(b"", payload_purged_at=datetime(2026, 2, 1, tzinfo=UTC))
    with pytest.raises(PayloadPurged, match="purged"):
        event.json()


def test_handlers_of_one_event_share_one_order() -> None:
    registry = HandlerRegistry()

    def first(event: Event, ctx: object) -> None: ...

    def second(event: Event, ctx: object) -> None: ...

    def third(event: Event, ctx: object) -> None: ...

    registry.add(first, "stripe", "charge.*", ordering=by_object)
    registry.add(second, "stripe", "charge.*", ordering=by_object)
    with pytest.raises(ConfigurationError, match="share one order"):
        registry.add(third, "stripe", "charge.*")
    event = NewEvent("stripe", "evt_1", "charge.succeeded", b"{}", {}, object_id="ch_1")
    assert registry.ordering_key(event) == "stripe//ch_1"
