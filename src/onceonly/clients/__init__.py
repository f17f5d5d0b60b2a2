"""Clients for the payment providers' APIs: the payload is a hint, the API is the truth.

Each client lives in its provider's folder (``onceonly/providers/<name>/client.py``,
on the base in :mod:`onceonly.providers.client`); this package is where they
are imported from and configured.

Each client reads the object an event points to (``client.fetch(event)``), with
timeouts, retries with backoff on 5xx/429/network errors, and errors translated
into :class:`~onceonly.ApiError` / :class:`~onceonly.ApiUnavailable`. Inside a
handler use ``ctx.fetch()`` or ``await ctx.afetch()``; see ``docs/fetching.md``.

Configuration per provider route (``<ROUTE>`` upper-cased, as for secrets):

- ``ONCEONLY_<ROUTE>_API_TOKEN``: the credential (Stripe secret key, Mercado
  Pago access token, Asaas API key, PagBank token); setting it enables the client.
- ``ONCEONLY_<ROUTE>_API_BASE``: the API's base URL (a sandbox, or the fake
  API of ``onceonly dev``).
- Pagar.me: ``ONCEONLY_PAGARME_API_TOKEN`` is the secret key (``sk_...``).
- Efí: ``ONCEONLY_EFI_API_CLIENT_ID`` and ``ONCEONLY_EFI_API_CLIENT_SECRET``
  (both enable the client, which fetches OAuth2 tokens itself),
  ``ONCEONLY_EFI_API_CERT`` (PEM certificate and key for mutual TLS) and
  ``ONCEONLY_EFI_API_KEY`` (the key, when in its own file).
- PagBank's legacy notifications: ``ONCEONLY_PAGBANK_LEGACY_EMAIL``,
  ``ONCEONLY_PAGBANK_LEGACY_TOKEN`` (default: the API token),
  ``ONCEONLY_PAGBANK_LEGACY_API_BASE``.
- For every client: ``ONCEONLY_API_TIMEOUT`` (seconds per request phase,
  default 10) and ``ONCEONLY_API_RETRIES`` (default 3).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..providers import PROVIDER_CLASSES, Provider
from ..providers.asaas.client import AsaasClient
from ..providers.client import (
    RECONCILED_HEADER,
    ApiClient,
    ApiRetryPolicy,
    Listed,
    RetryPolicy,
    Target,
)
from ..providers.efi.client import EfiClient
from ..providers.folder import companion
from ..providers.mercadopago.client import MercadoPagoClient
from ..providers.pagarme.client import PagarmeClient
from ..providers.pagbank.client import PagBankClient
from ..providers.stripe.client import StripeClient

__all__ = [
    "CLIENT_CLASSES",
    "RECONCILED_HEADER",
    "ApiClient",
    "ApiRetryPolicy",
    "AsaasClient",
    "EfiClient",
    "Listed",
    "MercadoPagoClient",
    "PagBankClient",
    "PagarmeClient",
    "RetryPolicy",
    "StripeClient",
    "Target",
    "clients_from_environ",
]


def _client_classes() -> dict[str, type[ApiClient]]:
    # Each provider's client is the ApiClient of its name defined in the
    # client.py beside its verifier: a new provider folder needs no line here.
    found: dict[str, type[ApiClient]] = {}
    for provider in PROVIDER_CLASSES.values():
        module = companion(provider, "client")
        if module is None:
            continue
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, ApiClient)
                and value.__module__ == module.__name__
                and value.name == provider.name
            ):
                found[provider.name] = value
    return found


#: Provider name -> its API client class.
CLIENT_CLASSES: dict[str, type[ApiClient]] = _client_classes()


def clients_from_environ(
    environ: Mapping[str, str], providers: Mapping[str, Provider] | None = None
) -> dict[str, ApiClient]:
    """The API clients configured in `environ`, keyed by provider route.

    A route is a provider name (``stripe``) or any configured route whose
    provider is one (``stripe-connect`` with a :class:`~onceonly.providers.Stripe`).
    """
    routes = {name: name for name in CLIENT_CLASSES}
    for route, provider in (providers or {}).items():
        routes[route] = provider.name
    found: dict[str, ApiClient] = {}
    for route, provider_name in routes.items():
        cls = CLIENT_CLASSES.get(provider_name)
        client = cls.from_environ(environ, route) if cls is not None else None
        if client is not None:
            found[route] = client
    return found
