"""Webhook senders onceonly knows, by route name."""

from __future__ import annotations

from .asaas import Asaas
from .base import (
    TYPE_SIGNED_HEADER,
    UNVERIFIED,
    Provider,
    TimestampedProvider,
    UnsignedPolicy,
    is_unverified,
)
from .github import GitHub
from .hmac import HMAC
from .mercadopago import MercadoPago
from .pagbank import PagBank
from .shopify import Shopify
from .standardwebhooks import StandardWebhooks
from .stripe import Stripe

__all__ = [
    "HMAC",
    "PROVIDER_CLASSES",
    "TYPE_SIGNED_HEADER",
    "UNVERIFIED",
    "Asaas",
    "GitHub",
    "MercadoPago",
    "PagBank",
    "Provider",
    "Shopify",
    "StandardWebhooks",
    "Stripe",
    "TimestampedProvider",
    "UnsignedPolicy",
    "is_unverified",
]

#: Route name -> provider class, used to build providers from the environment.
PROVIDER_CLASSES: dict[str, type[Provider]] = {
    cls.name: cls
    for cls in (Stripe, StandardWebhooks, GitHub, HMAC, MercadoPago, Asaas, PagBank, Shopify)
}
