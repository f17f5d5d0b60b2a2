"""How each provider retries a delivery: schedule, timeout, and what counts as success.

The facts come from ``reference/providers.md`` (the providers' documentation);
where a provider documents the shape but not the steps, the steps below are an
approximation with the documented total, and :attr:`RetryPolicy.source` says so.

A delivery attempt ends in one of three ways: an HTTP status, a timeout (the
sender stopped waiting), or a connection error. :func:`decide` turns that into
what the sender does next.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .._exceptions import ConfigurationError

__all__ = ["RETRY_POLICIES", "RetryPolicy", "Verdict", "decide", "policy_for"]


class Verdict(enum.StrEnum):
    """What the sender does after one attempt."""

    ACKNOWLEDGED = "acknowledged"  # done: the event counts as delivered
    RETRY = "retry"  # send again after the next delay
    GIVE_UP = "give-up"  # schedule exhausted: the event is not delivered
    DISABLE = "disable"  # the endpoint asked to be disabled (Standard Webhooks' 410)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """One provider's delivery behaviour.

    `delays[n]` is the wait after failed attempt ``n + 1`` before the next one,
    so there are ``len(delays) + 1`` attempts in all. `success` lists the only
    statuses that count (``None``: any 2xx). `pause_after_failures` stops the
    whole queue after that many consecutive failed attempts (Asaas).
    """

    provider: str
    delays: tuple[float, ...]
    timeout: float
    success: frozenset[int] | None = None
    pause_after_failures: int | None = None
    disable_on: frozenset[int] = frozenset()
    source: str = ""

    @property
    def max_attempts(self) -> int:
        return len(self.delays) + 1

    @property
    def total_seconds(self) -> float:
        """From the first attempt to the last, at real speed."""
        return float(sum(self.delays))

    def succeeded(self, status: int) -> bool:
        if self.success is not None:
            return status in self.success
        return 200 <= status < 300

    def delay_after(self, attempt: int) -> float | None:
        """Seconds to wait after failed attempt `attempt` (1-based); ``None``: no more."""
        if attempt < 1 or attempt > len(self.delays):
            return None
        return self.delays[attempt - 1]


def decide(policy: RetryPolicy, attempt: int, status: int | None) -> Verdict:
    """The sender's decision after attempt `attempt` (1-based) ended with `status`.

    `status` is ``None`` for a timeout or a connection error: the sender cannot
    tell whether the receiver committed, so it sends again, which is exactly
    how one payment arrives twice.
    """
    if status is not None and policy.succeeded(status):
        return Verdict.ACKNOWLEDGED
    if status is not None and status in policy.disable_on:
        return Verdict.DISABLE
    if policy.delay_after(attempt) is None:
        return Verdict.GIVE_UP
    return Verdict.RETRY


def _doubling(first: float, steps: int, total: float) -> tuple[float, ...]:
    """`steps` delays doubling from `first`, the last one stretched or cut so that
    they add up to `total`."""
    delays = [first * 2**i for i in range(steps - 1)]
    return (*delays, max(first, total - sum(delays)))


_HOUR = 3600.0
_DAY = 24 * _HOUR

RETRY_POLICIES: dict[str, RetryPolicy] = {
    policy.provider: policy
    for policy in (
        RetryPolicy(
            "stripe",
            _doubling(60.0, 12, 3 * _DAY),
            timeout=10.0,
            source="Stripe documents exponential backoff for up to 3 days, not the steps: "
            "these double from 1 min and add up to 3 days. The 10 s timeout is an assumption.",
        ),
        RetryPolicy(
            "mercadopago",
            (15 * 60.0,) * 8,
            timeout=22.0,
            success=frozenset({200, 201}),
            source="Mercado Pago: answer 200 or 201 within 22 s; retries every 15 min "
            "(the number of retries differs between country pages: 8 here).",
        ),
        RetryPolicy(
            "asaas",
            (30.0, 60.0, 210.0, 600.0, 1800.0, _HOUR, 1.25 * _HOUR),
            timeout=30.0,
            success=frozenset({200}),
            pause_after_failures=15,
            source="Asaas: only 200 counts; 30 s, 1 min, 3.5 min, ... up to 3 h (the later "
            "steps are an approximation); the queue pauses after 15 consecutive failures. "
            "The 30 s timeout is an assumption.",
        ),
        RetryPolicy(
            "pagbank",
            (60.0, 5 * 60.0, 15 * 60.0, _HOUR, 3 * _HOUR),
            timeout=10.0,
            source="PagBank does not document its retries: this schedule and timeout are "
            "assumptions.",
        ),
        RetryPolicy(
            "shopify",
            _doubling(60.0, 8, 4 * _HOUR),
            timeout=5.0,
            source="Shopify: 8 retries over 4 hours, 5 s timeout (the steps are an "
            "approximation that adds up to 4 h).",
        ),
        RetryPolicy(
            "github",
            (),
            timeout=10.0,
            source="GitHub: no automatic retries (redeliver by hand); 10 s timeout.",
        ),
        RetryPolicy(
            "standardwebhooks",
            (5.0, 5 * 60.0, 30 * 60.0, 2 * _HOUR, 5 * _HOUR, 10 * _HOUR, 10 * _HOUR),
            timeout=15.0,
            disable_on=frozenset({410}),
            source="Standard Webhooks / Svix: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h; 410 "
            "disables the endpoint. The 15 s timeout is an assumption.",
        ),
        RetryPolicy(
            "hmac",
            (5.0, 60.0, 5 * 60.0, 30 * 60.0),
            timeout=10.0,
            source="Generic HMAC sender: no provider behind it; a modest schedule.",
        ),
    )
}


def policy_for(provider: str) -> RetryPolicy:
    """The retry behaviour of `provider` (a route name such as ``stripe``)."""
    try:
        return RETRY_POLICIES[provider]
    except KeyError:
        known = ", ".join(sorted(RETRY_POLICIES))
        raise ConfigurationError(
            f"no retry behaviour known for {provider!r} (known: {known})"
        ) from None
