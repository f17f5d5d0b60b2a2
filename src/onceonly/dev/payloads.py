"""Event bodies shaped like each provider's, pointing at an object of its API.

:func:`build_event` returns an :class:`~onceonly.dev.delivery.Outgoing` whose
body, extra headers and query string look like what the provider sends for
that kind of event. The ids are random unless given, and the object the event
points to is described by :class:`PaymentFacts` so that the fake API can serve
the same payment (see :mod:`onceonly.dev.api`). The shapes themselves are in
each provider's profile (``onceonly/providers/<name>/profile.py``).
"""

from __future__ import annotations

import json
import random
from typing import Any

from .._exceptions import ConfigurationError
from ..providers.profile import DevProfile, Outgoing, PaymentFacts
from .profiles import profile_for, profiles

__all__ = ["DEFAULT_EVENT_TYPES", "PaymentFacts", "api_objects", "build_event"]

#: The event type sent when none is given: a payment that went through.
DEFAULT_EVENT_TYPES: dict[str, str] = {
    route: profile.event_type for route, profile in profiles().items()
}

# What a provider without a profile gets: the generic event, nothing in the API.
_GENERIC = DevProfile()


def default_object_id(provider: str, rng: random.Random | None = None) -> str:
    """A new id in the provider's style for the object an event points to."""
    r = rng or random.Random()
    # Both are drawn whatever the provider, so that a seed gives the same ids
    # as it always did.
    digits = str(r.randrange(10**10, 10**11))
    token = f"{r.getrandbits(64):016x}"
    return (profile_for(provider) or _GENERIC).object_id(digits, token)


def build_event(
    provider: str,
    *,
    event_type: str | None = None,
    event_id: str | None = None,
    facts: PaymentFacts | None = None,
    rng: random.Random | None = None,
) -> Outgoing:
    """An event of `provider` about a payment, ready for a
    :class:`~onceonly.dev.delivery.Sender`."""
    r = rng or random.Random()
    facts = facts or PaymentFacts(default_object_id(provider, r))
    profile = profile_for(provider)
    kind = event_type or (profile.event_type if profile is not None else None)
    if kind is None:
        raise ConfigurationError(f"no event shape known for provider {provider!r}")
    token = f"{r.getrandbits(96):024x}"
    return (profile or _GENERIC).build_event(kind, event_id, facts, token, r)


def api_objects(
    provider: str, event: Outgoing, facts: PaymentFacts, *, status: str | None = None
) -> list[tuple[str, str, dict[str, Any]]]:
    """The ``(kind, id, object)`` triples the fake API serves for `event`
    (see :class:`onceonly.dev.api.FakeApi`); empty for providers without an API.

    `status` is the payment's status as the API tells it; by default the
    provider's word for paid. Give another one ("pending") to play an event
    whose body claims more than the API confirms.
    """
    body = json.loads(event.body)
    profile = profile_for(provider) or _GENERIC
    state = status or profile.paid_status or facts.status
    return profile.api_objects(event, body, facts, state)
