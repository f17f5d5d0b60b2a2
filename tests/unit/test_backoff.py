"""One backoff formula, shared by the worker and the API clients."""

from __future__ import annotations

import pytest

import onceonly.providers.client
from onceonly import worker
from onceonly.backoff import backoff
from onceonly.clients import ApiRetryPolicy, RetryPolicy
from onceonly.dev import schedules
from onceonly.providers.profile import DeliverySchedule


def test_backoff_doubles_up_to_the_cap_with_jitter() -> None:
    for attempt, full in [(1, 2.0), (2, 4.0), (3, 8.0), (4, 10.0), (9, 10.0)]:
        for _ in range(50):
            assert full / 2 <= backoff(attempt, base=2.0, cap=10.0) <= full
    assert backoff(0, base=2.0, cap=10.0) <= 2.0


def test_the_worker_and_the_clients_use_the_same_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    assert worker.backoff is backoff
    calls: list[tuple[int, float, float]] = []

    def fake(attempt: int, *, base: float, cap: float) -> float:
        calls.append((attempt, base, cap))
        return 1.25

    monkeypatch.setattr(onceonly.providers.client, "backoff", fake)
    assert ApiRetryPolicy(base=0.5, cap=8.0).delay(3) == 1.25
    assert calls == [(3, 0.5, 8.0)]


def test_the_two_retry_policies_have_names_that_say_which() -> None:
    # The old name of each stays an alias, for code written against it.
    assert RetryPolicy is ApiRetryPolicy
    assert schedules.RetryPolicy is schedules.DeliverySchedule is DeliverySchedule
    assert ApiRetryPolicy.__name__ != DeliverySchedule.__name__
