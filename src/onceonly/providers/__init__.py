"""Webhook senders onceonly knows, by route name.

A provider is one folder, ``onceonly/providers/<name>/``, named by its route
name (``Provider.name``):

- ``verifier.py``: the :class:`Provider` subclass that checks a delivery's
  signature, finds its event id and type, and signs test deliveries;
- ``client.py`` (providers with an API): the
  :class:`~onceonly.providers.client.ApiClient` that reads the object an event
  points to, behind ``ctx.fetch()``; :mod:`onceonly.clients` re-exports it;
- ``profile.py``: its development profile, ``PROFILE``, a
  :class:`~onceonly.providers.profile.DevProfile`: how it retries a delivery,
  what its events look like, and for a provider with an API the paths, the
  credential and the answers of its fake API. :mod:`onceonly.dev` plays every
  provider through this interface alone and names none;
- ``__init__.py``: exports the provider class.

Beside the folders: :mod:`.base` (the ``Provider`` base and its helpers),
:mod:`.client` (the API clients' base), :mod:`.profile` (the profile
interface) and :mod:`.folder` (which finds a folder's client and profile from
its class). Adding a provider is its folder plus its class in
:data:`PROVIDER_CLASSES` below: its client and profile are then found by
themselves (export the client's class from :mod:`onceonly.clients` to make its
name public). ``docs/providers.md`` says what each part must do.
"""

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
from .efi import Efi
from .github import GitHub
from .hmac import HMAC
from .mercadopago import MercadoPago
from .pagarme import Pagarme
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
    "Efi",
    "GitHub",
    "MercadoPago",
    "PagBank",
    "Pagarme",
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
    for cls in (
        Stripe,
        StandardWebhooks,
        GitHub,
        HMAC,
        MercadoPago,
        Asaas,
        PagBank,
        Shopify,
        Pagarme,
        Efi,
    )
}
