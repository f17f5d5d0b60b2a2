"""Ordering keys named at receive time, RetryLater's bounds, the decorator's options."""

from __future__ import annotations

import json
import logging
import math

import pytest

from onceonly import (
    ConfigurationError,
    Delivery,
    Inbox,
    NewEvent,
    NonRetryable,
    Onceonly,
    OnceonlyError,
    RetryLater,
)
from onceonly.handlers import HandlerRegistry
from onceonly.providers import Stripe
from onceonly.store.memory import MemoryStore
from support import STRIPE_SECRET, signed


def noop(event: object, ctx: object) -> None:
    pass


def new_event(
    *,
    provider: str = "stripe",
    tenant: str = "",
    object_id: str | None = "pi_1",
    body: bytes = b"{}",
) -> NewEvent:
    return NewEvent(
        provider, "evt_1", "payment_intent.succeeded", body, {}, tenant=tenant, object_id=object_id
    )


def test_ordered_keys_by_the_providers_object_within_provider_and_tenant() -> None:
    registry = HandlerRegistry()
    registry.add(noop, "stripe", ordering=lambda e: e.object_id)
    registry.add(noop, "asaas", ordering=lambda e: e.object_id)
    assert registry.ordering_key(new_event()) == "stripe//pi_1"
    # The same id at another provider or for another account is another object.
    assert registry.ordering_key(new_event(provider="asaas")) == "asaas//pi_1"
    assert registry.ordering_key(new_event(tenant="acme")) == "stripe/acme/pi_1"
    # No object named: nothing to order by.
    assert registry.ordering_key(new_event(object_id=None)) is None


def test_unordered_and_unhandled_events_get_no_key() -> None:
    registry = HandlerRegistry()
    registry.add(noop, "stripe", "charge.succeeded")
    assert registry.ordering_key(new_event()) is None  # no handler for its type
    registry.add(noop, "stripe")
    assert registry.ordering_key(new_event()) is None  # a handler that wants no order


def test_a_key_function_that_fails_leaves_the_event_unordered_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = HandlerRegistry()
    registry.add(noop, "stripe", ordering=lambda e: json.loads(e.body)["customer"])
    with caplog.at_level(logging.WARNING, logger="onceonly.handlers"):
        assert registry.ordering_key(new_event(body=b"{}")) is None
    assert "stored unordered" in caplog.text
    assert "KeyError" in caplog.text
    assert registry.ordering_key(new_event(body=b'{"customer": "cus_9"}')) == "stripe//cus_9"


@pytest.mark.parametrize("bad", [42, "", "a\x00b", "\ud800"])
def test_a_key_no_engine_stores_is_refused(bad: object, caplog: pytest.LogCaptureFixture) -> None:
    registry = HandlerRegistry()
    registry.add(noop, "stripe", ordering=lambda e: bad)  # type: ignore[arg-type, return-value]
    with caplog.at_level(logging.WARNING, logger="onceonly.handlers"):
        assert registry.ordering_key(new_event()) is None
    assert "stored unordered" in caplog.text


def test_a_long_key_is_stored_as_its_digest() -> None:
    registry = HandlerRegistry()
    registry.add(noop, "stripe", ordering=lambda e: "x" * 5000)
    key = registry.ordering_key(new_event())
    assert key is not None
    assert key.startswith("stripe//sha256:")
    assert len(key) < 100
    assert registry.ordering_key(new_event()) == key  # the same key, the same digest


def test_the_decorator_takes_one_way_of_naming_the_key() -> None:
    app = Onceonly(database_url="sqlite:///unused.db", environ={})
    with pytest.raises(ConfigurationError, match="not both"):
        app.handler("stripe", ordered=True, ordering_key=lambda e: "k")
    with pytest.raises(ConfigurationError, match="function of the event"):
        app.handler("stripe", ordering_key="data.object.customer")  # type: ignore[arg-type]

    @app.handler("stripe", "payment_intent.succeeded", ordered=True)
    def on_intent(event: object, ctx: object) -> None: ...

    @app.handler("stripe", "customer.updated", ordering_key=lambda e: "cus")
    def on_customer(event: object, ctx: object) -> None: ...

    @app.handler("stripe")
    def anything(event: object, ctx: object) -> None: ...

    assert app.handlers.ordering_key(new_event()) == "stripe//pi_1"
    customer = NewEvent("stripe", "evt_2", "customer.updated", b"{}", {})
    assert app.handlers.ordering_key(customer) == "stripe//cus"
    other = NewEvent("stripe", "evt_3", "charge.succeeded", b"{}", {}, object_id="ch_1")
    assert app.handlers.ordering_key(other) is None


async def test_the_inbox_stores_the_key_its_handlers_name() -> None:
    registry = HandlerRegistry()
    registry.add(noop, "stripe", ordering=lambda e: e.object_id)
    store = MemoryStore()
    inbox = Inbox(store, {"stripe": Stripe(STRIPE_SECRET)}, registry)
    body = json.dumps(
        {
            "id": "evt_a",
            "type": "payment_intent.succeeded",
            "created": 1700000000,
            "data": {"object": {"id": "pi_7"}},
        }
    ).encode()
    receipt = await inbox.receive(Delivery("stripe", *signed(body)))
    assert receipt.id is not None
    stored = store.events[receipt.id]
    assert stored.ordering_key == "stripe//pi_7"
    assert stored.occurred_at is not None
    assert stored.occurred_at.timestamp() == 1700000000
    # An inbox that does not know the handlers stores every event unordered.
    plain = Inbox(MemoryStore(), {"stripe": Stripe(STRIPE_SECRET)})
    receipt = await plain.receive(Delivery("stripe", *signed(body)))
    assert receipt.id is not None
    assert plain.store.events[receipt.id].ordering_key is None  # type: ignore[attr-defined]


def test_retry_later_and_non_retryable_are_onceonly_errors() -> None:
    assert issubclass(RetryLater, OnceonlyError)
    assert issubclass(NonRetryable, OnceonlyError)
    later = RetryLater(1.5, "the bank's API is closed at night")
    assert later.seconds == 1.5
    assert str(later) == "retry in 1.5 s: the bank's API is closed at night"
    assert RetryLater(30 * 86400).seconds == 30 * 86400


@pytest.mark.parametrize("seconds", [0, -1, 30 * 86400 + 1, math.nan, math.inf, True, "5"])
def test_retry_later_refuses_a_delay_out_of_bounds(seconds: object) -> None:
    with pytest.raises(ValueError, match="RetryLater"):
        RetryLater(seconds)  # type: ignore[arg-type]
