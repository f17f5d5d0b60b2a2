"""Configuration: the :class:`Onceonly` object, from the environment or from code.

Environment variables:

- ``ONCEONLY_DATABASE_URL``: default ``sqlite:///onceonly.db`` in the working directory.
- ``ONCEONLY_<PROVIDER>_SECRET``: enables a provider; several secrets
  comma-separated (rotation). ``<PROVIDER>`` is the route name upper-cased:
  ``STRIPE``, ``STANDARDWEBHOOKS``, ``GITHUB``, ``HMAC``, ``MERCADOPAGO``,
  ``ASAAS``, ``PAGBANK``, ``SHOPIFY``, ``PAGARME``, ``EFI``.
- ``ONCEONLY_<PROVIDER>_TOLERANCE`` (seconds, timestamped providers) and
  ``ONCEONLY_<PROVIDER>_REJECTION_STATUS`` (default 401); provider-specific
  ones (``ONCEONLY_MERCADOPAGO_UNSIGNED``, ...) in ``docs/providers/``.
- ``ONCEONLY_MAX_BODY_BYTES``: default 1 MiB.
- ``ONCEONLY_MAX_HEADER_BYTES``: all request headers together, default 32 KiB
  (more gets 431).
- ``ONCEONLY_BODY_TIMEOUT``: seconds a sender has to send its whole body,
  default 10 (a slower one gets 408).
- ``ONCEONLY_RETRY_AFTER``: seconds announced with a 503, default 5.
- ``ONCEONLY_MAX_ATTEMPTS``: attempts before an event is ``dead``, default 10.
- ``ONCEONLY_LEASE_SECONDS``: how long a claimed event stays with a worker that
  stops renewing it (a killed one), default 30.
- ``ONCEONLY_RETRY_BASE_SECONDS`` / ``ONCEONLY_RETRY_CAP_SECONDS``: backoff
  after failure n is ``min(cap, base * 2**(n-1))`` times a jitter in [0.5, 1];
  defaults 2 and 3600.
- ``ONCEONLY_METRICS``: ``0`` turns ``GET /metrics`` off (default on).
- ``ONCEONLY_RETENTION_PAYLOADS`` / ``ONCEONLY_RETENTION_IDS``: what ``onceonly
  purge`` keeps by default: payloads of processed events for ``30d``, their
  dedup memory (provider, event id) for ``400d`` (see docs/operations.md).
- ``ONCEONLY_<PROVIDER>_API_TOKEN`` / ``ONCEONLY_<PROVIDER>_API_BASE``: the
  provider's API client for ``ctx.fetch()`` (``STRIPE``, ``MERCADOPAGO``,
  ``ASAAS``, ``PAGBANK``, ``PAGARME``; Efí's are ``_API_CLIENT_ID`` and
  ``_API_CLIENT_SECRET``); ``ONCEONLY_API_TIMEOUT`` / ``ONCEONLY_API_RETRIES``
  (see :mod:`onceonly.clients` and docs/fetching.md).
- ``ONCEONLY_DASHBOARD_PATH`` (default ``/dashboard``; ``off`` turns it off),
  ``ONCEONLY_DASHBOARD_TOKEN`` (required to reach the dashboard from anywhere
  but this machine, at least 16 characters) and ``ONCEONLY_DASHBOARD_REDACT``
  (payload fields hidden, e.g. ``card.number,payer.email``); see docs/dashboard.md.

The CLI's own: ``ONCEONLY_LOG_FORMAT`` (``text`` or ``json``; see
docs/observability.md for the log fields and the hooks).

In code, build an :class:`Onceonly` and point the CLI at it with
``--app module:attribute``; what the object sets wins over the environment.
Everything is read once into :class:`~onceonly.settings.Settings` (frozen and
validated, an explicit ``0`` included); ``--database-url`` and the other CLI
options make a new object with :meth:`Onceonly.replace`.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import sqlalchemy as sa

from ._exceptions import ConfigurationError
from .clients import ApiClient, clients_from_environ
from .handlers import Action, Backoff, Handler, HandlerRegistry, OrderingKey, by_object
from .hooks import FailureHook, FailureHooks
from .inbox import Inbox
from .providers import PROVIDER_CLASSES, Provider
from .providers.base import env_name
from .settings import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_HEADER_BYTES,
    Settings,
)
from .store import Store, create_store
from .store.engine import create_engine, engine_kind
from .tenants import TenantResolver, Tenants, as_tenants
from .tracing import Tracing

if TYPE_CHECKING:
    from .batch import Transactions
    from .dashboard import Dashboard
    from .guard import Guard
    from .ledger import EffectLedger
    from .metrics import Metrics
    from .receiver import Receiver
    from .worker import Worker

H = TypeVar("H", bound=Handler)
A = TypeVar("A", bound=Action)
F = TypeVar("F", bound=FailureHook)
T = TypeVar("T")

__all__ = [
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_HEADER_BYTES",
    "Onceonly",
    "load_app",
]


def providers_from_environ(environ: Mapping[str, str]) -> dict[str, Provider]:
    """Every provider whose ``ONCEONLY_<NAME>_SECRET`` is set."""
    found: dict[str, Provider] = {}
    for name, cls in PROVIDER_CLASSES.items():
        raw = environ.get(env_name(name, "SECRET"), "")
        secrets = [s for s in (part.strip() for part in raw.split(",")) if s]
        if secrets:
            found[name] = cls.from_environ(environ, secrets)
    return found


class _Setting(Generic[T]):
    """One of :class:`Settings`' values as an attribute of :class:`Onceonly`.

    Reading goes to the frozen settings; assigning builds new, validated
    settings, and is refused once a resource (store, engine, ...) was built
    from the old ones: that resource would silently keep the old value.
    """

    def __init__(self, flat: str | None = None) -> None:
        self.flat = flat or ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.flat = self.flat or name

    @overload
    def __get__(self, obj: None, owner: type) -> _Setting[T]: ...
    @overload
    def __get__(self, obj: Onceonly, owner: type) -> T: ...
    def __get__(self, obj: Onceonly | None, owner: type) -> T | _Setting[T]:
        if obj is None:
            return self
        value: T = obj.settings.flat(self.flat)
        return value

    def __set__(self, obj: Onceonly, value: T) -> None:
        obj._change(self.flat, value)


class Onceonly:
    """One onceonly deployment: where events are stored and who may send them.

    ::

        from onceonly import Onceonly
        from onceonly.providers import Stripe, GitHub

        app = Onceonly(
            database_url="postgresql://app@db/app",
            providers={"stripe": Stripe(["whsec_new", "whsec_old"]), "github": GitHub("s3cret")},
        )

    Providers are keyed by route name: ``/webhooks/stripe``. Two Stripe
    accounts can live side by side as ``{"stripe": ..., "stripe-connect": Stripe(...)}``.
    Providers configured in the environment are added unless `providers` names
    the same route. `tenants` (a resolver ``resolve(route, tenant)``, or a
    :class:`~onceonly.Tenants` with its cache settings) opens
    ``/webhooks/{provider}/{tenant}`` for platforms where each merchant has
    their own secrets (see docs/tenants.md). `api_clients` (also keyed by route, e.g.
    ``{"stripe": StripeClient("sk_test_...")}``) serve ``ctx.fetch()``; those
    from ``ONCEONLY_<ROUTE>_API_TOKEN`` are added the same way.

    The other keywords are read once, with the environment, into
    :attr:`settings` (frozen, validated; ``None`` means "not given"). The
    object builds its store, engine, inbox, metrics and components from them;
    once one exists, the settings cannot change (build another object with
    :meth:`replace`).

    `tracer_provider` (an OpenTelemetry ``TracerProvider``) is where spans
    go; by default the global one, if an SDK set one up when the receiver or
    worker is built. ``tracing=False`` turns spans off, ``True`` insists on
    them (see docs/observability.md). Both need the ``otel`` extra.
    """

    database_url = _Setting[str]()
    max_body_bytes = _Setting[int]()
    max_header_bytes = _Setting[int]()
    body_timeout = _Setting[float]()
    retry_after = _Setting[int]()
    max_attempts = _Setting[int]()
    lease_seconds = _Setting[float]()
    outbox_lease_seconds = _Setting[float]()
    #: None: the engine's default, chosen by the worker (see Worker).
    transaction_budget = _Setting[float | None]()
    retry_base = _Setting[float]()
    retry_cap = _Setting[float]()
    metrics_enabled = _Setting[bool]("metrics")
    retention_payloads = _Setting[timedelta]()
    retention_ids = _Setting[timedelta]()
    dashboard_path = _Setting[str | None]()
    dashboard_token = _Setting[str | None]()
    dashboard_redact = _Setting[tuple[str, ...]]()

    def __init__(
        self,
        database_url: str | None = None,
        providers: Mapping[str, Provider] | None = None,
        *,
        max_body_bytes: int | None = None,
        max_header_bytes: int | None = None,
        body_timeout: float | None = None,
        retry_after: int | None = None,
        max_attempts: int | None = None,
        lease_seconds: float | None = None,
        outbox_lease_seconds: float | None = None,
        transaction_budget: float | None = None,
        retry_base: float | None = None,
        retry_cap: float | None = None,
        metrics: bool | None = None,
        retention_payloads: str | timedelta | None = None,
        retention_ids: str | timedelta | None = None,
        api_clients: Mapping[str, ApiClient] | None = None,
        tenants: Tenants | TenantResolver | None = None,
        dashboard_path: str | None = None,
        dashboard_token: str | None = None,
        dashboard_redact: str | Sequence[str] | None = None,
        tracer_provider: Any = None,
        tracing: bool | None = None,
        environ: Mapping[str, str] | None = None,
        settings: Settings | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        given: dict[str, Any] = {
            "database_url": database_url,
            "max_body_bytes": max_body_bytes,
            "max_header_bytes": max_header_bytes,
            "body_timeout": body_timeout,
            "retry_after": retry_after,
            "max_attempts": max_attempts,
            "lease_seconds": lease_seconds,
            "outbox_lease_seconds": outbox_lease_seconds,
            "transaction_budget": transaction_budget,
            "retry_base": retry_base,
            "retry_cap": retry_cap,
            "metrics": metrics,
            "retention_payloads": retention_payloads,
            "retention_ids": retention_ids,
            "dashboard_path": dashboard_path,
            "dashboard_token": dashboard_token,
            "dashboard_redact": dashboard_redact,
        }
        if settings is None:
            settings = Settings.from_environ(env, **given)
        elif any(value is not None for value in given.values()):
            raise ConfigurationError("give either settings or keyword settings, not both")
        self._settings = settings
        self.providers: dict[str, Provider] = providers_from_environ(env)
        self.providers.update(providers or {})
        self.api_clients: dict[str, ApiClient] = clients_from_environ(env, self.providers)
        self.api_clients.update(api_clients or {})
        #: Per-merchant secrets and API credentials; None: one account.
        self.tenants: Tenants | None = as_tenants(tenants)
        for name in self.providers:
            if not name or "/" in name:
                raise ConfigurationError(f"provider route name {name!r} is not a path segment")
        self.handlers = HandlerRegistry()
        #: The failed-attempt and dead hooks (@app.on_attempt_failed, @app.on_dead).
        self.hooks = FailureHooks()
        self._tracer_provider = tracer_provider
        self._tracing_wanted = tracing
        self._tracing: Tracing | None = None
        self._engine: sa.Engine | None = None
        self._effect_ledger: EffectLedger | None = None
        self._store: Store | None = None
        self._inbox: Inbox | None = None
        self._metrics: Metrics | None = None
        #: Set when a component (worker, receiver, ...) was built: it reads
        #: these settings from now on.
        self._composed = False

    @property
    def settings(self) -> Settings:
        """The frozen, validated settings everything here is built from."""
        return self._settings

    def replace(self, **changes: Any) -> Onceonly:
        """A new deployment with `changes` (the keywords ``Onceonly`` takes,
        e.g. ``database_url=...``) applied to these settings; the same
        providers, API clients and handlers, and resources of its own.

        The CLI applies its options this way, so ``--database-url`` reaches
        every resource, even when the ``--app`` object had built its store.
        """
        twin = Onceonly(
            providers=self.providers,
            environ={},
            settings=self._settings.replace(**_flat(changes)),
        )
        twin.api_clients = dict(self.api_clients)
        twin.tenants = self.tenants
        twin.handlers = self.handlers
        twin.hooks = self.hooks
        twin._tracer_provider = self._tracer_provider
        twin._tracing_wanted = self._tracing_wanted
        return twin

    def _change(self, name: str, value: Any) -> None:
        """Assigning a setting: new validated settings, unless something was
        already built from the current ones."""
        built = [
            label
            for label, resource in (
                ("store", self._store),
                ("engine", self._engine),
                ("inbox", self._inbox),
                ("metrics", self._metrics),
                ("effect ledger", self._effect_ledger),
            )
            if resource is not None
        ]
        if built or self._composed:
            what = ", ".join(built) or "a component"
            raise ConfigurationError(
                f"cannot change {name}: {what} already built from the current settings "
                "would keep the old value; set it before first use, or build a new "
                "deployment with app.replace(...)"
            )
        self._settings = self._settings.replace(**_flat({name: value}))

    @property
    def store(self) -> Store:
        """The store for `database_url`, created on first use (not yet connected)."""
        if self._store is None:
            self._store = create_store(self.database_url)
        return self._store

    @property
    def inbox(self) -> Inbox:
        if self._inbox is None:
            # The handlers name each event's ordering key as it is stored.
            self._inbox = Inbox(
                self.store,
                self.providers,
                self.handlers,
                tenants=self.tenants,
                tracing=self.tracing,
            )
        return self._inbox

    @property
    def metrics(self) -> Metrics:
        """This deployment's Prometheus metrics, in a registry of their own."""
        if self._metrics is None:
            from .metrics import Metrics

            self._metrics = Metrics(
                self.providers,
                engine=lambda: self.engine,
                engine_kind=self.engine_kind,
                tenant_label=self.tenants.metrics_label if self.tenants else None,
            )
        return self._metrics

    @property
    def engine_kind(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return engine_kind(self.database_url)

    @property
    def engine(self) -> sa.Engine:
        """A synchronous SQLAlchemy engine on the same database, for handlers and
        the worker (created on first use)."""
        if self._engine is None:
            self._engine = create_engine(self.database_url)
        return self._engine

    @property
    def tracing(self) -> Tracing:
        """Where this deployment's spans go, decided on first use (see
        :mod:`onceonly.tracing`): ``tracing.enabled`` False means nowhere."""
        if self._tracing is None:
            self._tracing = Tracing.create(
                enabled=self._tracing_wanted, provider=self._tracer_provider
            )
        return self._tracing

    @property
    def effect_ledger(self) -> EffectLedger:
        """Where ``ctx.effect()`` records outcomes (created on first use)."""
        if self._effect_ledger is None:
            from .ledger import EffectLedger

            self._effect_ledger = EffectLedger(self.database_url, self.engine)
        return self._effect_ledger

    def handler(
        self,
        provider: str | None = None,
        event_type: str | None = None,
        *,
        prefetch: bool | str | Sequence[str] = False,
        attempts: int | None = None,
        backoff: Backoff | None = None,
        ordered: bool = False,
        ordering_key: OrderingKey | None = None,
    ) -> Callable[[H], H]:
        """Register a handler for `provider` and `event_type` (``None``: any).

        ::

            @app.handler("stripe", "payment_intent.succeeded")
            def on_payment(event, ctx): ...

        `event_type` may end in a wildcard segment (``"payment_intent.*"``,
        ``"orders/*"``); the most specific registration wins, and every
        handler registered under that one (provider, type) runs, in order, in
        one transaction (see docs/handlers.md).

        `prefetch` reads what ``ctx.fetch()`` will return (``True``: the object
        the event points to; a kind or kinds: those) from the provider's API
        before the handler's transaction opens, so no database lock waits on
        the network (see docs/fetching.md).

        `attempts` (before the event is ``dead``) and `backoff` (``(base, cap)``
        seconds for the worker's formula, or a function ``attempt -> seconds``)
        replace the worker's ``max_attempts`` and retry base/cap for the events
        this handler owns.

        `ordered` runs the events of one provider object (a payment's id) one
        at a time, in the order the provider created them; `ordering_key`
        names another key, ``ordering_key(new_event) -> str | None``. Both
        are read where events are received, so the receiving process must
        load this same app (see docs/ordering.md).
        """
        if ordered and ordering_key is not None:
            raise ConfigurationError("give either ordered=True or ordering_key=, not both")
        if ordering_key is not None and not callable(ordering_key):
            raise ConfigurationError(
                f"ordering_key must be a function of the event, not {ordering_key!r}"
            )
        ordering = by_object if ordered else ordering_key
        kinds: tuple[str | None, ...]
        if isinstance(prefetch, bool):
            kinds = (None,) if prefetch else ()
        elif isinstance(prefetch, str):
            kinds = (prefetch,)
        else:
            kinds = tuple(prefetch)

        def register(fn: H) -> H:
            self.handlers.add(
                fn,
                provider,
                event_type,
                kinds,
                attempts=attempts,
                backoff=backoff,
                ordering=ordering,
            )
            return fn

        return register

    def action(self, name: str) -> Callable[[A], A]:
        """Register an outbox action, run after commit for ``ctx.stage(name, payload)``."""

        def register(fn: A) -> A:
            self.handlers.add_action(name, fn)
            return fn

        return register

    def on_attempt_failed(self, hook: F) -> F:
        """Register `hook(failure)`, called after each failed attempt of any
        event's handler (the last one too) is recorded; best-effort::

            @app.on_attempt_failed
            def report(failure: Failure) -> None:
                sentry_sdk.capture_exception(failure.exception)

        See :class:`~onceonly.hooks.Failure` and docs/observability.md.
        """
        self.hooks.add_failed(hook)
        return hook

    def on_dead(self, hook: F) -> F:
        """Register `hook(failure)`, called once when an event goes dead, even
        across a worker crash (it is staged with the dead mark and run after
        the commit, retried with the same ``failure.key`` if it raises)::

            @app.on_dead
            def page(failure: Failure) -> None:
                slack.post(f"event {failure.event_id} is dead: {failure.error}")
        """
        self.hooks.add_dead(hook)
        return hook

    def worker(
        self,
        *,
        concurrency: int = 4,
        batch_size: int | None = None,
        poll_interval: float | None = None,
        name: str | None = None,
        transaction_budget: float | None = None,
        transactions: Transactions | None = None,
        reconcile: Sequence[str] = (),
        reconcile_every: float | None = None,
    ) -> Worker:
        """A :class:`~onceonly.worker.Worker` for this deployment's handlers
        (`transactions`: whose transactions its batches run in; see
        :class:`~onceonly.batch.Transactions`). With `reconcile` (provider
        routes) and `reconcile_every` (seconds), it also runs ``onceonly
        reconcile`` for them every period, one worker at a time (see
        docs/reconcile.md)."""
        from .worker import Worker

        scheduled = None
        if reconcile or reconcile_every is not None:
            from .reconcile import ScheduledReconcile

            scheduled = ScheduledReconcile(self, reconcile, reconcile_every or 0.0)
        self._composed = True
        return Worker(
            self,
            concurrency=concurrency,
            batch_size=batch_size,
            poll_interval=poll_interval,
            name=name,
            transaction_budget=transaction_budget,
            transactions=transactions,
            reconcile=scheduled,
        )

    def guard(
        self, *, lease_seconds: float = 300.0, ttl_seconds: float | None = 30 * 86400.0
    ) -> Guard:
        """A :class:`~onceonly.guard.Guard` on this database: ``once`` for any job;
        finished keys remembered for `ttl_seconds` (None: until deleted)."""
        from .guard import Guard

        self._composed = True
        return Guard(
            self.database_url,
            engine=self.engine,
            lease_seconds=lease_seconds,
            ttl_seconds=ttl_seconds,
        )

    def receiver(self) -> Receiver:
        """The ASGI app for ``POST /{provider}``; mount it at ``/webhooks``."""
        return self._receiver(prefix="")

    def asgi(self) -> Receiver:
        """The whole server as ``onceonly serve`` runs it: ``POST /webhooks/{provider}``."""
        return self._receiver(prefix="/webhooks")

    def _receiver(self, *, prefix: str) -> Receiver:
        from .receiver import Receiver

        self._composed = True
        return Receiver(
            self.inbox,
            self.metrics,
            self.settings.receiver,
            serve_metrics=self.metrics_enabled,
            prefix=prefix,
        )

    def dashboard(self) -> Dashboard:
        """The operator dashboard as an ASGI app (see docs/dashboard.md)::

        app = Starlette(routes=[Mount("/dashboard", app=onceonly_app.dashboard())])
        """
        from .dashboard import Dashboard

        self._composed = True
        return Dashboard(self)


def _flat(changes: Mapping[str, Any]) -> dict[str, Any]:
    """``metrics_enabled`` (the attribute) is ``metrics`` (the keyword)."""
    return {("metrics" if k == "metrics_enabled" else k): v for k, v in changes.items()}


def load_app(spec: str | None, environ: Mapping[str, str] | None = None) -> Onceonly:
    """Resolve ``module:attribute`` to an :class:`Onceonly`; without one, use the environment.

    The attribute may also be a function that takes no argument and returns one.
    The working directory is importable, as with uvicorn.
    """
    if not spec:
        return Onceonly(environ=environ)
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(f"--app must look like module:attribute, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from exc
    try:
        target = getattr(module, attribute)
    except AttributeError:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if callable(target) and not isinstance(target, Onceonly):
        target = target()
    if not isinstance(target, Onceonly):
        raise ConfigurationError(
            f"{spec} is a {type(target).__name__}, expected an onceonly.Onceonly"
        )
    return target
