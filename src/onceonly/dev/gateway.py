"""The fake gateway: a provider's API and its webhook sender, side by side.

:func:`prepare_events` makes a batch of payment events for a provider and puts
the objects they point to in a :class:`~onceonly.dev.api.FakeApi`, so a
handler that fetches the real state (``ctx.fetch()``) finds them.
:func:`provider_for` builds the signing side of a provider from a secret, as
``onceonly serve`` builds the verifying side from ``ONCEONLY_<NAME>_SECRET``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from urllib.parse import urlsplit

from .._exceptions import ConfigurationError
from ..providers import PROVIDER_CLASSES, Provider
from ..providers.base import env_name
from .api import FakeApi
from .delivery import DeliveryReport, Outgoing
from .payloads import PaymentFacts, api_objects, build_event, default_object_id

__all__ = ["prepare_events", "provider_for", "receiver_url", "record_deliveries"]


def provider_for(
    name: str, secret: str | None = None, environ: Mapping[str, str] | None = None
) -> Provider:
    """Provider `name` signing with `secret`, or with the first of
    ``ONCEONLY_<NAME>_SECRET`` (the receiver's own setting) when none is given."""
    env = os.environ if environ is None else environ
    cls = PROVIDER_CLASSES.get(name)
    if cls is None:
        known = ", ".join(sorted(PROVIDER_CLASSES))
        raise ConfigurationError(f"unknown provider {name!r} (known: {known})")
    if not secret:
        configured = env.get(env_name(name, "SECRET"), "")
        secret = next((s.strip() for s in configured.split(",") if s.strip()), None)
    if not secret:
        raise ConfigurationError(
            f"no secret to sign {name} deliveries with: pass --secret or set "
            f"{env_name(name, 'SECRET')} (the same value the receiver uses)"
        )
    return cls.from_environ(env, [secret])


def receiver_url(target: str, provider: str) -> str:
    """`target` as given when it has a path; else its ``/webhooks/<provider>`` route."""
    parts = urlsplit(target if "://" in target else f"http://{target}")
    if parts.path in ("", "/"):
        return f"{parts.scheme}://{parts.netloc}/webhooks/{provider}"
    return parts.geturl()


def prepare_events(
    provider: str,
    count: int,
    *,
    event_type: str | None = None,
    seed: int | None = None,
    api: FakeApi | None = None,
    api_status: str | None = None,
) -> list[Outgoing]:
    """`count` payment events of `provider`, each about its own payment, whose
    objects are stored in `api` (with status `api_status` if given)."""
    rng = random.Random(seed)
    events = []
    for n in range(1, count + 1):
        facts = PaymentFacts(
            object_id=default_object_id(provider, rng),
            amount=rng.choice([990, 1990, 4990, 9700]),
            customer=f"cus_{n:05d}",
            email=f"customer{n:05d}@example.com",
        )
        event = build_event(provider, event_type=event_type, facts=facts, rng=rng)
        if api is not None:
            for kind, object_id, obj in api_objects(provider, event, facts, status=api_status):
                api.put(provider, kind, object_id, obj)
        events.append(event)
    return events


def record_deliveries(api: FakeApi, provider: str, report: DeliveryReport, url: str = "") -> None:
    """Tell `api` how `report`'s deliveries went, so its listings answer as the
    provider's would: which events were acknowledged (Stripe's
    ``delivery_success``) and whether the queue paused (Asaas's ``interrupted``)."""
    for outcome in report.outcomes.values():
        api.record_delivery(provider, outcome.event_id, outcome.acknowledged)
    api.set_queue(
        provider,
        url=url,
        interrupted=report.stats.paused,
        penalized=report.stats.given_up,
    )
