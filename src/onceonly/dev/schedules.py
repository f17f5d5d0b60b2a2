"""How each provider retries a delivery: schedule, timeout, and what counts as success.

The facts come from ``reference/providers.md`` (the providers' documentation)
and live in each provider's profile (``onceonly/providers/<name>/profile.py``);
where a provider documents the shape but not the steps, the steps are an
approximation with the documented total, and :attr:`DeliverySchedule.source`
says so.

A delivery attempt ends in one of three ways: an HTTP status, a timeout (the
sender stopped waiting), or a connection error. :func:`decide` turns that into
what the sender does next.
"""

from __future__ import annotations

import enum

from .._exceptions import ConfigurationError
from ..providers.profile import DeliverySchedule
from .profiles import profile_for, profiles

__all__ = [
    "RETRY_POLICIES",
    "DeliverySchedule",
    "RetryPolicy",
    "Verdict",
    "decide",
    "policy_for",
]

#: The name :class:`DeliverySchedule` had first; kept for code written against it.
RetryPolicy = DeliverySchedule


class Verdict(enum.StrEnum):
    """What the sender does after one attempt."""

    ACKNOWLEDGED = "acknowledged"  # done: the event counts as delivered
    RETRY = "retry"  # send again after the next delay
    GIVE_UP = "give-up"  # schedule exhausted: the event is not delivered
    DISABLE = "disable"  # the endpoint asked to be disabled (Standard Webhooks' 410)


def decide(policy: DeliverySchedule, attempt: int, status: int | None) -> Verdict:
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


#: Route name -> how that provider retries, from the providers' profiles.
RETRY_POLICIES: dict[str, DeliverySchedule] = {
    route: profile.schedule for route, profile in profiles().items()
}


def policy_for(provider: str) -> DeliverySchedule:
    """The retry behaviour of `provider` (a route name such as ``stripe``)."""
    profile = profile_for(provider)
    if profile is None:
        known = ", ".join(sorted(profiles()))
        raise ConfigurationError(f"no retry behaviour known for {provider!r} (known: {known})")
    return profile.schedule
