"""Webhook senders onceonly knows, by route name."""

from __future__ import annotations

from .base import Provider, TimestampedProvider
from .github import GitHub
from .hmac import HMAC
from .standardwebhooks import StandardWebhooks
from .stripe import Stripe

__all__ = [
    "HMAC",
    "PROVIDER_CLASSES",
    "GitHub",
    "Provider",
    "StandardWebhooks",
    "Stripe",
    "TimestampedProvider",
]

#: Route name -> provider class, used to build providers from the environment.
PROVIDER_CLASSES: dict[str, type[Provider]] = {
    cls.name: cls for cls in (Stripe, StandardWebhooks, GitHub, HMAC)
}
