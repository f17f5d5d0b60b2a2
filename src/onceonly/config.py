"""Configuration: the :class:`Onceonly` object, from the environment or from code.

Environment variables:

- ``ONCEONLY_DATABASE_URL``: default ``sqlite:///onceonly.db`` in the working directory.
- ``ONCEONLY_<PROVIDER>_SECRET``: enables a provider; several secrets
  comma-separated (rotation). ``<PROVIDER>`` is the route name upper-cased:
  ``STRIPE``, ``STANDARDWEBHOOKS``, ``GITHUB``, ``HMAC``, ``MERCADOPAGO``,
  ``ASAAS``, ``PAGBANK``, ``SHOPIFY``.
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
  ``ASAAS``, ``PAGBANK``); ``ONCEONLY_API_TIMEOUT`` / ``ONCEONLY_API_RETRIES``
  (see :mod:`onceonly.clients` and docs/fetching.md).
- ``ONCEONLY_DASHBOARD_PATH`` (default ``/dashboard``; ``off`` turns it off),
  ``ONCEONLY_DASHBOARD_TOKEN`` (required to reach the dashboard from anywhere
  but this machine, at least 16 characters) and ``ONCEONLY_DASHBOARD_REDACT``
  (payload fields hidden, e.g. ``card.number,payer.email``); see docs/dashboard.md.

In code, build an :class:`Onceonly` and point the CLI at it with
``--app module:attribute``; what the object sets wins over the environment.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, TypeVar

import sqlalchemy as sa

from ._exceptions import ConfigurationError
from .clients import ApiClient, clients_from_environ
from .db import create_engine, engine_kind
from .handlers import Action, Handler, HandlerRegistry
from .inbox import Inbox
from .providers import PROVIDER_CLASSES, Provider
from .providers.base import env_name, parse_int
from .retention import DEFAULT_RETENTION_IDS, DEFAULT_RETENTION_PAYLOADS, duration
from .store import DEFAULT_DATABASE_URL, Store, create_store

if TYPE_CHECKING:
    from .dashboard import Dashboard
    from .guard import Guard
    from .ledger import EffectLedger
    from .metrics import Metrics
    from .receiver import Receiver
    from .worker import Worker

H = TypeVar("H", bound=Handler)
A = TypeVar("A", bound=Action)

__all__ = [
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_HEADER_BYTES",
    "Onceonly",
    "load_app",
]

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
#: Every provider's headers fit in a few KiB (Stripe's signature header with
#: several v1 entries included); 32 KiB leaves room for proxies' additions.
DEFAULT_MAX_HEADER_BYTES = 32 * 1024
#: Providers send a webhook's body at once; a sender still trickling after
#: this many seconds holds a connection open for nothing.
DEFAULT_BODY_TIMEOUT = 10.0


def providers_from_environ(environ: Mapping[str, str]) -> dict[str, Provider]:
    """Every provider whose ``ONCEONLY_<NAME>_SECRET`` is set."""
    found: dict[str, Provider] = {}
    for name, cls in PROVIDER_CLASSES.items():
        raw = environ.get(env_name(name, "SECRET"), "")
        secrets = [s for s in (part.strip() for part in raw.split(",")) if s]
        if secrets:
            found[name] = cls.from_environ(environ, secrets)
    return found


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
    the same route. `api_clients` (also keyed by route, e.g.
    ``{"stripe": StripeClient("sk_test_...")}``) serve ``ctx.fetch()``; those
    from ``ONCEONLY_<ROUTE>_API_TOKEN`` are added the same way.
    """

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
        dashboard_path: str | None = None,
        dashboard_token: str | None = None,
        dashboard_redact: str | Sequence[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self.database_url = database_url or env.get("ONCEONLY_DATABASE_URL") or DEFAULT_DATABASE_URL
        self.providers: dict[str, Provider] = providers_from_environ(env)
        self.providers.update(providers or {})
        self.api_clients: dict[str, ApiClient] = clients_from_environ(env, self.providers)
        self.api_clients.update(api_clients or {})
        for name in self.providers:
            if not name or "/" in name:
                raise ConfigurationError(f"provider route name {name!r} is not a path segment")
        self.max_body_bytes = (
            max_body_bytes
            if max_body_bytes is not None
            else parse_int(
                env.get("ONCEONLY_MAX_BODY_BYTES", str(DEFAULT_MAX_BODY_BYTES)),
                "ONCEONLY_MAX_BODY_BYTES",
            )
        )
        self.max_header_bytes = (
            max_header_bytes
            if max_header_bytes is not None
            else parse_int(
                env.get("ONCEONLY_MAX_HEADER_BYTES", str(DEFAULT_MAX_HEADER_BYTES)),
                "ONCEONLY_MAX_HEADER_BYTES",
            )
        )
        self.body_timeout = (
            body_timeout
            if body_timeout is not None
            else _float(env, "ONCEONLY_BODY_TIMEOUT", DEFAULT_BODY_TIMEOUT)
        )
        self.retry_after = (
            retry_after
            if retry_after is not None
            else parse_int(env.get("ONCEONLY_RETRY_AFTER", "5"), "ONCEONLY_RETRY_AFTER")
        )
        self.max_attempts = max_attempts or parse_int(
            env.get("ONCEONLY_MAX_ATTEMPTS", "10"), "ONCEONLY_MAX_ATTEMPTS"
        )
        self.lease_seconds = lease_seconds or _float(env, "ONCEONLY_LEASE_SECONDS", 30.0)
        self.retry_base = (
            retry_base
            if retry_base is not None
            else _float(env, "ONCEONLY_RETRY_BASE_SECONDS", 2.0)
        )
        self.retry_cap = (
            retry_cap
            if retry_cap is not None
            else _float(env, "ONCEONLY_RETRY_CAP_SECONDS", 3600.0)
        )
        if self.max_attempts < 1:
            raise ConfigurationError("max_attempts must be at least 1")
        if self.lease_seconds <= 0:
            raise ConfigurationError("lease_seconds must be positive")
        # An outbox row's claim must outlast a runner's wait for the database
        # (on SQLite a mark can wait busy_timeout, 5 s, for the write lock, and
        # a second runner that got the lock first would send again), so it is
        # at least 30 s however short the event lease; it costs only the delay
        # of a crashed runner's sends.
        self.outbox_lease_seconds = outbox_lease_seconds or _float(
            env, "ONCEONLY_OUTBOX_LEASE_SECONDS", max(30.0, self.lease_seconds)
        )
        if self.outbox_lease_seconds <= 0:
            raise ConfigurationError("outbox_lease_seconds must be positive")
        # None: the engine's default, chosen by the worker (see Worker).
        self.transaction_budget = _transaction_budget(env, transaction_budget)
        self.handlers = HandlerRegistry()
        self._engine: sa.Engine | None = None
        self._effect_ledger: EffectLedger | None = None
        if self.max_body_bytes <= 0:
            raise ConfigurationError("max_body_bytes must be positive")
        if self.max_header_bytes <= 0:
            raise ConfigurationError("max_header_bytes must be positive")
        if self.body_timeout <= 0:
            raise ConfigurationError("body_timeout must be positive")
        if self.retry_after < 0:
            raise ConfigurationError("retry_after must be >= 0")
        self._store: Store | None = None
        self._inbox: Inbox | None = None
        self.metrics_enabled = (
            metrics
            if metrics is not None
            else env.get("ONCEONLY_METRICS", "1").strip().lower() not in ("0", "false", "no", "off")
        )
        self._metrics: Metrics | None = None
        self.retention_payloads = duration(
            retention_payloads
            or env.get("ONCEONLY_RETENTION_PAYLOADS", DEFAULT_RETENTION_PAYLOADS),
            "ONCEONLY_RETENTION_PAYLOADS",
        )
        self.retention_ids = duration(
            retention_ids or env.get("ONCEONLY_RETENTION_IDS", DEFAULT_RETENTION_IDS),
            "ONCEONLY_RETENTION_IDS",
        )
        self.dashboard_path = _dashboard_path(
            dashboard_path or env.get("ONCEONLY_DASHBOARD_PATH") or "/dashboard"
        )
        self.dashboard_token = dashboard_token or env.get("ONCEONLY_DASHBOARD_TOKEN") or None
        if self.dashboard_token is not None and len(self.dashboard_token) < 16:
            raise ConfigurationError(
                "the dashboard token must be at least 16 characters (try `openssl rand -hex 24`)"
            )
        raw_redact = (
            dashboard_redact
            if dashboard_redact is not None
            else env.get("ONCEONLY_DASHBOARD_REDACT", "")
        )
        parts = raw_redact.split(",") if isinstance(raw_redact, str) else raw_redact
        self.dashboard_redact = tuple(p.strip() for p in parts if p.strip())

    @property
    def store(self) -> Store:
        """The store for `database_url`, created on first use (not yet connected)."""
        if self._store is None:
            self._store = create_store(self.database_url)
        return self._store

    @property
    def inbox(self) -> Inbox:
        if self._inbox is None:
            self._inbox = Inbox(self.store, self.providers)
        return self._inbox

    @property
    def metrics(self) -> Metrics:
        """This deployment's Prometheus metrics, in a registry of their own."""
        if self._metrics is None:
            from .metrics import Metrics

            self._metrics = Metrics(self)
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
    ) -> Callable[[H], H]:
        """Register a handler for `provider` and `event_type` (``None``: any).

        ::

            @app.handler("stripe", "payment_intent.succeeded")
            def on_payment(event, ctx): ...

        `prefetch` reads what ``ctx.fetch()`` will return (``True``: the object
        the event points to; a kind or kinds: those) from the provider's API
        before the handler's transaction opens, so no database lock waits on
        the network (see docs/fetching.md).
        """
        kinds: tuple[str | None, ...]
        if isinstance(prefetch, bool):
            kinds = (None,) if prefetch else ()
        elif isinstance(prefetch, str):
            kinds = (prefetch,)
        else:
            kinds = tuple(prefetch)

        def register(fn: H) -> H:
            self.handlers.add(fn, provider, event_type, kinds)
            return fn

        return register

    def action(self, name: str) -> Callable[[A], A]:
        """Register an outbox action, run after commit for ``ctx.stage(name, payload)``."""

        def register(fn: A) -> A:
            self.handlers.add_action(name, fn)
            return fn

        return register

    def worker(
        self,
        *,
        concurrency: int = 4,
        batch_size: int | None = None,
        poll_interval: float | None = None,
        name: str | None = None,
        transaction_budget: float | None = None,
    ) -> Worker:
        """A :class:`~onceonly.worker.Worker` for this deployment's handlers."""
        from .worker import Worker

        return Worker(
            self,
            concurrency=concurrency,
            batch_size=batch_size,
            poll_interval=poll_interval,
            name=name,
            transaction_budget=transaction_budget,
        )

    def guard(
        self, *, lease_seconds: float = 300.0, ttl_seconds: float | None = 30 * 86400.0
    ) -> Guard:
        """A :class:`~onceonly.guard.Guard` on this database: ``once`` for any job;
        finished keys remembered for `ttl_seconds` (None: until deleted)."""
        from .guard import Guard

        return Guard(
            self.database_url,
            engine=self.engine,
            lease_seconds=lease_seconds,
            ttl_seconds=ttl_seconds,
        )

    def receiver(self) -> Receiver:
        """The ASGI app for ``POST /{provider}``; mount it at ``/webhooks``."""
        from .receiver import Receiver

        return Receiver(self)

    def asgi(self) -> Receiver:
        """The whole server as ``onceonly serve`` runs it: ``POST /webhooks/{provider}``."""
        from .receiver import Receiver

        return Receiver(self, prefix="/webhooks")

    def dashboard(self) -> Dashboard:
        """The operator dashboard as an ASGI app (see docs/dashboard.md)::

        app = Starlette(routes=[Mount("/dashboard", app=onceonly_app.dashboard())])
        """
        from .dashboard import Dashboard

        return Dashboard(self)


def _dashboard_path(raw: str) -> str | None:
    """``/dashboard`` style, or ``None`` for ``off``; never a path the receiver owns."""
    if raw.strip().lower() in ("off", "0", "false", "no", "none"):
        return None
    path = "/" + raw.strip().strip("/")
    if path == "/" or path.split("/")[1] in ("webhooks", "healthz", "metrics"):
        raise ConfigurationError(
            f"dashboard path {raw!r} must be a path of its own, such as /dashboard"
        )
    return path


def _transaction_budget(env: Mapping[str, str], given: float | None) -> float | None:
    """Seconds a worker's processing transaction may run before it commits
    and goes on in a new one; None when neither code nor environment says."""
    if given is None and env.get("ONCEONLY_TRANSACTION_BUDGET"):
        given = _float(env, "ONCEONLY_TRANSACTION_BUDGET", 0.0)
    if given is not None and given < 0:
        raise ConfigurationError("transaction_budget must be >= 0 (0: no bound)")
    return given


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a number, got {raw!r}") from None


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
