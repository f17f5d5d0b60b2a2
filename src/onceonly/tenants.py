"""Many merchants, one deployment: ``/webhooks/{provider}/{tenant}``.

A platform where each merchant links their own Asaas, PagBank or Stripe
account gets deliveries signed with each merchant's secret. The tenant (the
merchant's name in the URL) picks the secrets its deliveries are verified
with; the tenant is stored with the event, is part of the dedup key
``(provider, tenant, event_id)``, and picks the credential ``ctx.fetch()``
reads the provider's API with.

The secrets come from a *resolver*, a function of the application's::

    def credentials(provider: str, tenant: str) -> TenantCredentials | None:
        row = merchants.get(provider, tenant)      # the application's own table
        if row is None:
            return None                            # unknown tenant: 404
        return TenantCredentials(secrets=[row.webhook_secret], api_token=row.api_key)

    app = Onceonly(providers={"asaas": Asaas.for_tenants()}, tenants=credentials)

It may be ``async``; a plain function runs in a thread, so a database lookup
does not stop the receiver's event loop. Concurrent deliveries for one
tenant share one call, and its answers are cached (see :class:`Tenants`):
known tenants for ``ttl`` seconds, unknown ones for ``unknown_ttl`` in a
smaller cache of their own, so a flood of made-up tenant names can neither
grow memory without bound nor push the real merchants out.
A resolver that raises makes the receiver answer 503 with ``Retry-After``:
the provider keeps the delivery and sends it again.

The tenant in the URL is unsigned input: it only *chooses* the secrets, and a
delivery is stored only when it verifies with those. A name outside
``[A-Za-z0-9][A-Za-z0-9_.-]{0,63}`` is answered 404 before the resolver is
asked.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeAlias, TypeVar

from ._exceptions import ConfigurationError, TenantUnavailable, UnknownTenant
from .providers.base import Provider
from .providers.client import ApiClient

__all__ = [
    "MAX_TENANT_LENGTH",
    "OTHER_TENANTS",
    "TenantCredentials",
    "TenantResolver",
    "Tenants",
    "valid_tenant",
]

log = logging.getLogger("onceonly.tenants")

#: Longest tenant name a URL may carry.
MAX_TENANT_LENGTH = 64
_TENANT = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_TENANT_LENGTH - 1}}}")
#: The metrics label of every tenant not named in ``metrics_tenants``.
OTHER_TENANTS = "(other)"


def valid_tenant(name: str) -> bool:
    """Whether `name` can be a tenant: 1 to 64 of ``A-Z a-z 0-9 _ . -``,
    starting with a letter or digit (so never ``..`` nor a path)."""
    return _TENANT.fullmatch(name) is not None


@dataclass(frozen=True, slots=True, init=False)
class TenantCredentials:
    """What one merchant's account is verified and read with.

    `secrets`: the webhook secrets (tokens) of this merchant's account, every
    one accepted at once (rotation); none means the tenant receives no
    deliveries (404). `api_token`: the merchant's own API credential for
    ``ctx.fetch()`` (Asaas API key, PagBank token, Mercado Pago access token).
    `api_account`: Stripe Connect's connected account id (``acct_...``),
    sent as ``Stripe-Account`` with the platform's own key. None of the
    credentials appears in ``repr()``.
    """

    secrets: tuple[str, ...] = field(repr=False)
    api_token: str | None = field(repr=False)
    api_account: str | None

    def __init__(
        self,
        secrets: Sequence[str] | str = (),
        api_token: str | None = None,
        api_account: str | None = None,
    ) -> None:
        raw = (secrets,) if isinstance(secrets, str) else secrets
        if not isinstance(raw, Iterable) or not all(isinstance(s, str) for s in raw):
            raise ConfigurationError("tenant secrets must be strings")
        object.__setattr__(self, "secrets", tuple(s.strip() for s in raw if s.strip()))
        object.__setattr__(self, "api_token", (api_token or "").strip() or None)
        object.__setattr__(self, "api_account", (api_account or "").strip() or None)


Resolved: TypeAlias = TenantCredentials | Sequence[str] | str | None
#: ``resolve(provider_route, tenant)``: the tenant's credentials, its webhook
#: secrets alone, or ``None`` for a tenant it does not know. Sync or async.
TenantResolver: TypeAlias = Callable[[str, str], Resolved | Awaitable[Resolved]]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """A least-recently-used cache whose entries also expire after `ttl`
    seconds; at most `max_entries` (the least recently used goes first).
    Thread-safe: the receiver's loop and the worker's threads share one."""

    def __init__(
        self, max_entries: int, ttl: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_entries < 0 or ttl < 0:
            raise ConfigurationError("cache sizes and times must be >= 0")
        self.max_entries = max_entries
        self.ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        """The live value under `key`, or ``None``."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            expires, value = found
            if self._clock() >= expires:
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        if self.max_entries == 0 or self.ttl == 0:
            return
        with self._lock:
            self._entries[key] = (self._clock() + self.ttl, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def discard(self, match: Callable[[K], bool]) -> None:
        with self._lock:
            for key in [k for k in self._entries if match(k)]:
                del self._entries[key]


class _Known:
    """A known tenant's credentials and what was built from them, cached together
    so that a new answer from the resolver replaces all of it at once."""

    __slots__ = ("clients", "credentials", "verifier")

    def __init__(self, credentials: TenantCredentials) -> None:
        self.credentials = credentials
        self.verifier: Provider | None = None
        self.clients: dict[int, ApiClient] = {}


class Tenants:
    """The tenant resolver with its caches, and the verifiers and API clients
    built per tenant.

    `ttl`: seconds a known tenant's credentials are kept (a rotated secret is
    seen after at most this long, or at once after :meth:`forget`).
    `unknown_ttl`: seconds an unknown tenant is remembered as unknown (a
    merchant who just signed up waits at most this long). `max_known` and
    `max_unknown` bound the two caches. `metrics_tenants`: the tenants that
    get a ``tenant`` label of their own in the metrics; every other one is
    counted as ``"(other)"``, so the number of series stays bounded.
    """

    def __init__(
        self,
        resolve: TenantResolver,
        *,
        ttl: float = 300.0,
        unknown_ttl: float = 30.0,
        max_known: int = 10_000,
        max_unknown: int = 1_000,
        metrics_tenants: Iterable[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not callable(resolve):
            raise ConfigurationError("the tenant resolver must be callable")
        self.resolve = resolve
        self._known: TtlCache[tuple[str, str], _Known] = TtlCache(max_known, ttl, clock=clock)
        self._unknown: TtlCache[tuple[str, str], bool] = TtlCache(
            max_unknown, unknown_ttl, clock=clock
        )
        self.metrics_tenants = frozenset(metrics_tenants)
        #: How many times the resolver was called (for tests and debugging).
        self.lookups = 0
        self._inflight: dict[tuple[int, tuple[str, str]], asyncio.Task[_Known | None]] = {}

    def __repr__(self) -> str:
        return f"Tenants(resolve={getattr(self.resolve, '__qualname__', self.resolve)!r})"

    def metrics_label(self, tenant: str) -> str:
        """The ``tenant`` label a delivery or event is counted under."""
        if not tenant or tenant in self.metrics_tenants:
            return tenant
        return OTHER_TENANTS

    def forget(self, provider: str | None = None, tenant: str | None = None) -> None:
        """Drop cached answers (all, one provider's, one tenant's): call it when
        a merchant's secrets change or a merchant signs up."""

        def match(key: tuple[str, str]) -> bool:
            return (provider is None or key[0] == provider) and (tenant is None or key[1] == tenant)

        self._known.discard(match)
        self._unknown.discard(match)

    async def credentials(self, provider: str, tenant: str) -> TenantCredentials | None:
        """`tenant`'s credentials for `provider` (a route name), ``None`` for a
        tenant the resolver does not know or a name that cannot be one.
        Raises :class:`~onceonly.TenantUnavailable` when the resolver fails."""
        known = await self._entry(provider, tenant)
        return known.credentials if known is not None else None

    async def verifier(self, provider: str, tenant: str, template: Provider) -> Provider:
        """`template` (the route's provider) with `tenant`'s secrets; raises
        :class:`~onceonly.UnknownTenant` (404) when there are none."""
        known = await self._entry(provider, tenant)
        if known is None or not known.credentials.secrets:
            raise UnknownTenant(f"no tenant {tenant[:80]!r} for provider {provider!r}")
        if known.verifier is None:
            try:
                known.verifier = template.with_secrets(known.credentials.secrets)
            except ConfigurationError as exc:
                # A secret this provider cannot use (a standardwebhooks secret
                # that is not base64): the operator's data, not the sender's.
                log.error("tenant %r of %r: unusable webhook secret: %s", tenant, provider, exc)
                raise TenantUnavailable(f"tenant {tenant!r} has an unusable secret") from None
        return known.verifier

    async def client(
        self,
        provider: str,
        tenant: str,
        template: ApiClient | None,
        client_class: type[ApiClient] | None = None,
    ) -> ApiClient:
        """The API client ``ctx.fetch()`` uses for `tenant`'s events: the
        route's client (`template`) with the tenant's token or Stripe
        account, or a new `client_class` client with the tenant's token.

        Never the platform's own credential alone: reading one merchant's
        object with another account's key is what tenants are kept apart for.
        """
        known = await self._entry(provider, tenant)
        if known is None:
            raise ConfigurationError(
                f"tenant {tenant!r} of provider {provider!r} is unknown to the tenant resolver"
            )
        credentials = known.credentials
        if credentials.api_token is None and credentials.api_account is None:
            raise ConfigurationError(
                f"tenant {tenant!r} of provider {provider!r} has no API credential: "
                "return TenantCredentials(api_token=...) or (api_account=...) from the resolver"
            )
        key = id(template) if template is not None else id(client_class)
        found = known.clients.get(key)
        if found is not None:
            return found
        if template is not None:
            built = template.for_tenant(
                token=credentials.api_token, account=credentials.api_account
            )
        elif client_class is not None and credentials.api_token is not None:
            built = client_class(credentials.api_token)
        else:
            raise ConfigurationError(
                f"no API client for provider {provider!r}: a Stripe account id needs the "
                "platform's client (api_clients= or ONCEONLY_<ROUTE>_API_TOKEN)"
            )
        known.clients[key] = built
        return built

    async def _entry(self, provider: str, tenant: str) -> _Known | None:
        if not valid_tenant(tenant):
            return None
        key = (provider, tenant)
        known = self._known.get(key)
        if known is not None:
            return known
        if self._unknown.get(key):
            return None
        # Deliveries for one tenant arriving together (a provider's retries
        # after an outage) share one lookup: one task asks, every delivery
        # waits for its answer; a delivery whose sender hangs up does not
        # cancel it for the others. Per event loop: a task belongs to one.
        loop = asyncio.get_running_loop()
        flight = (id(loop), key)
        task = self._inflight.get(flight)
        if task is None:
            task = loop.create_task(self._lookup(key))
            self._inflight[flight] = task
            task.add_done_callback(lambda done: self._landed(flight, done))
        return await asyncio.shield(task)

    def _landed(
        self, flight: tuple[int, tuple[str, str]], task: asyncio.Task[_Known | None]
    ) -> None:
        self._inflight.pop(flight, None)
        if not task.cancelled():
            task.exception()  # retrieved here, should every waiter have gone

    async def _lookup(self, key: tuple[str, str]) -> _Known | None:
        credentials = await self._ask(*key)
        if credentials is None:
            self._unknown.put(key, True)
            return None
        known = _Known(credentials)
        self._known.put(key, known)
        return known

    async def _ask(self, provider: str, tenant: str) -> TenantCredentials | None:
        self.lookups += 1
        try:
            if inspect.iscoroutinefunction(self.resolve):
                answer = await self.resolve(provider, tenant)
            else:
                # In a thread: a resolver that queries a database must not
                # stop every other delivery on the receiver's event loop.
                answer = await asyncio.to_thread(self.resolve, provider, tenant)
                if inspect.isawaitable(answer):
                    answer = await answer
        except Exception as exc:
            log.warning("tenant resolver failed for %r of %r: %r", tenant, provider, exc)
            raise TenantUnavailable(f"the tenant resolver failed: {type(exc).__name__}") from exc
        try:
            return _credentials(answer)
        except ConfigurationError as exc:
            log.error("tenant resolver answered %r of %r with %s", tenant, provider, exc)
            raise TenantUnavailable("the tenant resolver gave an unusable answer") from None


def _credentials(answer: object) -> TenantCredentials | None:
    if answer is None or isinstance(answer, TenantCredentials):
        return answer
    if isinstance(answer, str | list | tuple):
        return TenantCredentials(secrets=answer)
    raise ConfigurationError(
        f"a {type(answer).__name__}, not TenantCredentials, a list of secrets or None"
    )


def as_tenants(value: Tenants | TenantResolver | None) -> Tenants | None:
    """``Onceonly(tenants=...)`` takes a :class:`Tenants` or a bare resolver."""
    if value is None or isinstance(value, Tenants):
        return value
    return Tenants(value)
