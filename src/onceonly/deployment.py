"""What a component built for a deployment may read of it.

:class:`~onceonly.Onceonly` composes: it reads the settings once and builds the
store, the engine, the metrics and the components from them. The components
(the worker and its batches, the dashboard, retention, the Idempotency-Key
middleware) are handed the deployment back, but they see it through
:class:`Deployment`: its frozen settings and the resources it already built,
nothing that changes it. Typing them against this protocol rather than the
class keeps them below ``config.py`` in the import graph (``.importlinter``
checks it): the application imports its components, never the other way
round.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import sqlalchemy as sa

    from .clients import ApiClient
    from .handlers import HandlerRegistry
    from .hooks import FailureHooks
    from .ledger import EffectLedger
    from .metrics import Metrics
    from .settings import Settings
    from .tenants import Tenants
    from .tracing import Tracing

__all__ = ["Deployment"]


class Deployment(Protocol):
    """The read-only face of an :class:`~onceonly.Onceonly` its components use."""

    @property
    def settings(self) -> Settings:
        """The frozen settings everything is built from."""

    @property
    def handlers(self) -> HandlerRegistry:
        """Handlers and outbox actions, by provider and event type."""

    @property
    def hooks(self) -> FailureHooks:
        """The failed-attempt and dead hooks."""

    @property
    def tracing(self) -> Tracing:
        """Where spans go (possibly nowhere: ``tracing.enabled``)."""

    @property
    def api_clients(self) -> Mapping[str, ApiClient]:
        """The provider API clients ``ctx.fetch()`` reads with."""

    @property
    def tenants(self) -> Tenants | None:
        """Per-merchant secrets and API credentials (``None``: one account)."""

    @property
    def engine(self) -> sa.Engine:
        """The synchronous engine handlers run on (created on first use)."""

    @property
    def engine_kind(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""

    @property
    def metrics(self) -> Metrics:
        """The deployment's Prometheus metrics."""

    @property
    def effect_ledger(self) -> EffectLedger:
        """Where ``ctx.effect`` records outcomes (created on first use)."""
