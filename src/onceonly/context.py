"""What a handler gets besides its event: the transaction's connection, the
effect ledger, and the outbox.

The effect ledger (G4). ``ctx.effect("charge", fn)`` calls ``fn(key)`` at most
once per event and name, as far as physics allows: the outcome is recorded
under ``(event, name)`` in its own transaction, committed before
``ctx.effect()`` returns, so it survives a rollback of the handler, and a
retry gets the recorded outcome back instead of calling again. ``key`` is
deterministic (the same on every attempt): pass it to APIs that accept an
idempotency key. The one window left is a crash after the external call and
before its record: the retry then calls again, with the same key, and a
provider that honours idempotency keys answers with the first result instead
of acting twice. Where the other side takes no key, that window is the
residual risk; it lasts as long as one database write, on both engines and
whatever the batch size (on SQLite the records live in a file of their own:
see :mod:`onceonly.ledger`).

The outbox. ``ctx.stage("email", payload)`` inserts a row in the handler's own
transaction; the action registered under that name runs after the commit, so a
rolled-back attempt sends nothing. A row is claimed before it is sent, so one
runner at a time sends it (see :mod:`onceonly.outbox`); actions run at least
once only across a crash after sending and before marking sent, with ``key``
to pass on for once.

The real state. ``ctx.fetch()`` (``await ctx.afetch()`` in an async handler)
reads the object the event points to from the provider's API (see
:mod:`onceonly.clients`): the payload is a hint, the API's answer is what to act
on. The answer is kept for the rest of the attempt; a retry reads it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.orm import Session

from ._exceptions import ConfigurationError, EffectError
from .clients import CLIENT_CLASSES, ApiClient, Target
from .events import Event
from .ledger import EffectLedger
from .logs import event_fields
from .providers.base import env_name
from .store.ordering import newer_applied
from .store.outbox import OutboxRecords
from .store.savepoints import HandlerSavepoints  # re-exported: the batch opens them
from .tracing import Attributes, Tracing

if TYPE_CHECKING:
    from .tenants import Tenants

__all__ = [
    "AttemptServices",
    "Context",
    "EffectError",
    "HandlerSavepoints",
    "api_client_for",
    "effect_key",
    "serialised_outcome",
]

T = TypeVar("T")

log = logging.getLogger("onceonly.effects")
_NO_TRACING = Tracing()


def effect_key(provider: str, event_id: str, name: str, tenant: str = "") -> str:
    """The idempotency key of effect `name` of an event: stable across attempts,
    workers and machines, at most 64 characters, safe in an HTTP header.

    Two merchants' events may share an id (each account numbers its own), so a
    tenant's keys include the tenant; an event without one keeps the key it
    always had."""
    text = f"{provider}\x00{event_id}\x00{name}"
    if tenant:
        text += f"\x00{tenant}"
    digest = hashlib.sha256(text.encode()).hexdigest()
    return f"oo-{digest[:40]}"


async def api_client_for(
    event: Event, api_clients: Mapping[str, ApiClient], tenants: Tenants | None
) -> ApiClient | None:
    """The client that reads what `event` points to: its route's client, or
    for a tenant's event that client with the tenant's credential (``None``:
    no client configured)."""
    client = api_clients.get(event.provider)
    if not event.tenant:
        return client
    if tenants is None:
        raise ConfigurationError(
            f"event {event.id} belongs to tenant {event.tenant!r}, and this deployment "
            "has no tenant resolver (Onceonly(tenants=...))"
        )
    return await tenants.client(
        event.provider, event.tenant, client, CLIENT_CLASSES.get(event.provider)
    )


def serialised_outcome(name: str, outcome: Any, *, then: str) -> str:
    """An effect's outcome as the JSON its record keeps; :class:`EffectError`
    if it has none (the call was already made: `then` is what its key protects)."""
    try:
        return json.dumps(outcome)
    except (TypeError, ValueError) as exc:
        raise EffectError(
            f"effect {name!r} returned a value that is not JSON-serialisable ({exc}); "
            f"the call was made, and its key protects {then}"
        ) from exc


@dataclass(frozen=True, slots=True)
class AttemptServices:
    """What the worker lends a handler's attempt: the effect ledger, the
    outbox's actions and records, the API clients for ``fetch()``, the worker
    thread's event loop, and the answers it prefetched."""

    ledger: EffectLedger
    actions: frozenset[str]
    api_clients: Mapping[str, ApiClient] = field(default_factory=dict)
    event_loop: Callable[[], asyncio.AbstractEventLoop] | None = None
    fetched: Mapping[Target, dict[str, Any] | Exception] = field(default_factory=dict)
    #: The outbox's statements; by default those of the attempt's database.
    outbox: OutboxRecords | None = None
    #: Where ``onceonly.effect`` spans go (none by default), and the worker's
    #: name for the log lines.
    tracing: Tracing = _NO_TRACING
    worker: str | None = None
    #: Tenants' API credentials, for a tenant's event's fetch().
    tenants: Tenants | None = None


@dataclass
class Context:
    """Passed to each handler call with the event it handles.

    Built by the worker with :meth:`for_attempt`; the attributes whose names
    start with ``_`` are its own."""

    event: Event
    #: The connection of the transaction that marks the event processed.
    connection: sa.Connection
    #: 1 for the first attempt.
    attempt: int
    _ledger: EffectLedger
    _outbox: OutboxRecords
    _actions: frozenset[str]
    _session: Session | None = None
    _staged: bool = False
    #: Provider route -> API client, for fetch(); the worker's loop for this thread.
    _api_clients: Mapping[str, ApiClient] = field(default_factory=dict)
    _event_loop: Callable[[], asyncio.AbstractEventLoop] | None = None
    #: Answers (or errors) read in this attempt, some before it began (prefetch).
    _fetched: dict[Target, dict[str, Any] | Exception] = field(default_factory=dict)
    #: Put before effect names: empty for an event's first handler, the
    #: handler's name and "/" for the others (see onceonly.handlers).
    _effect_prefix: str = ""
    _tracing: Tracing = _NO_TRACING
    _worker: str | None = None
    _tenants: Tenants | None = None
    _client: ApiClient | None = None

    @classmethod
    def for_attempt(
        cls,
        event: Event,
        connection: sa.Connection,
        services: AttemptServices,
        *,
        effect_prefix: str = "",
    ) -> Context:
        """The context of attempt number ``event.attempts`` of `event`, on the
        processing transaction's `connection`; `effect_prefix` namespaces the
        effects of a handler that is not its event's first."""
        return cls(
            _effect_prefix=effect_prefix,
            event=event,
            connection=connection,
            attempt=event.attempts,
            _ledger=services.ledger,
            _outbox=services.outbox or OutboxRecords.of(connection),
            _actions=services.actions,
            _api_clients=services.api_clients,
            _event_loop=services.event_loop,
            _fetched=dict(services.fetched),
            _tracing=services.tracing,
            _worker=services.worker,
            _tenants=services.tenants,
        )

    @property
    def session(self) -> Session:
        """An ORM session on this transaction; flushed before the event is marked.

        Use this rather than a ``Session`` of your own bound to
        ``ctx.connection``: its ``rollback()`` undoes only its own work."""
        if self._session is None:
            self._session = Session(
                bind=self.connection,
                expire_on_commit=False,
                join_transaction_mode="create_savepoint",
            )
        return self._session

    def effect_key(self, name: str) -> str:
        """The idempotency key that ``effect(name, ...)`` passes to its call."""
        return effect_key(
            self.event.provider, self.event.event_id, self._effect_prefix + name, self.event.tenant
        )

    def _recorded(self, name: str) -> tuple[bool, Any]:
        found = self._ledger.find(self.connection, self.event.id, self._effect_prefix + name)
        return (True, json.loads(found)) if found is not None else (False, None)

    def _record(self, name: str, key: str, outcome: Any) -> None:
        serialised = serialised_outcome(name, outcome, then="the retry")
        # Its own transaction, on another connection (another file on SQLite):
        # durable before the handler goes on, and survives a rollback of ours.
        self._ledger.record(self.event.id, self._effect_prefix + name, key, serialised)

    def effect(self, name: str, call: Callable[[str], T]) -> T:
        """Run ``call(key)`` once for this event and `name`; return its outcome.

        On a retry whose earlier attempt recorded an outcome, `call` is not
        called and the recorded outcome (as JSON round-tripped) is returned.
        """
        with self._effect_span(name) as note:
            found, outcome = self._recorded(name)
            if found:
                note(reused=True)
                return outcome  # type: ignore[no-any-return]
            key = self.effect_key(name)
            result = call(key)
            self._record(name, key, result)
            note(reused=False)
            return result

    async def aeffect(self, name: str, call: Callable[[str], Awaitable[T]]) -> T:
        """:meth:`effect` for a coroutine function."""
        with self._effect_span(name) as note:
            found, outcome = self._recorded(name)
            if found:
                note(reused=True)
                return outcome  # type: ignore[no-any-return]
            key = self.effect_key(name)
            result = await call(key)
            self._record(name, key, result)
            note(reused=False)
            return result

    @contextlib.contextmanager
    def _effect_span(self, name: str) -> Iterator[Callable[..., None]]:
        """An ``onceonly.effect`` span (a child of the attempt's) around one
        effect, and a log line saying whether it was called or reused."""

        def note(*, reused: bool) -> None:
            if span is not None:
                span.set_attribute("onceonly.effect.reused", reused)
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "event %s: effect %r %s",
                    self.event.id,
                    name,
                    "reused its recorded outcome" if reused else "called and recorded",
                    extra=event_fields(self.event, worker=self._worker, effect=name, reused=reused),
                )

        attributes: Attributes | None = (
            {
                "onceonly.effect": name,
                "onceonly.event_pk": self.event.id,
                "onceonly.attempt": self.attempt,
            }
            if self._tracing.enabled
            else None
        )
        with self._tracing.span("onceonly.effect", attributes) as span:
            yield note

    async def afetch(self, kind: str | None = None) -> dict[str, Any]:
        """The object this event points to, as the provider's API has it now.

        `kind` picks another object the event names (``"payment_intent"`` for
        a Stripe event); the default is what the event is about (see
        ``docs/fetching.md``). Read once per attempt: a second call returns
        the same answer without asking the API again. Raises
        :class:`~onceonly.ApiUnavailable` when the API cannot answer (the
        attempt fails and the worker retries later), :class:`~onceonly.ApiError`
        for a refusal (404, 401), :class:`~onceonly.NotFetchable` when the event
        names no such object, :class:`~onceonly.ConfigurationError` when the
        provider has no API client configured. A tenant's event is read with
        that tenant's credential (see :mod:`onceonly.tenants`).
        """
        client = self._client
        if client is None:
            client = await api_client_for(self.event, self._api_clients, self._tenants)
            self._client = client
        if client is None:
            raise ConfigurationError(
                f"no API client for provider {self.event.provider!r}: set "
                f"{env_name(self.event.provider, 'API_TOKEN')} or pass api_clients= to Onceonly"
            )
        target = client.target(self.event, kind)
        found = self._fetched.get(target)
        if isinstance(found, Exception):
            raise found
        if found is None:
            found = await client.get(target)
            self._fetched[target] = found
        return found

    def fetch(self, kind: str | None = None) -> dict[str, Any]:
        """:meth:`afetch` for a synchronous handler."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise ConfigurationError(
                "ctx.fetch() called inside a running event loop; use `await ctx.afetch()`"
            )
        if self._event_loop is not None:
            # The worker thread's own loop: its HTTP connections stay open for
            # the next event this thread handles.
            return self._event_loop().run_until_complete(self.afetch(kind))
        return asyncio.run(self._afetch_and_close(kind))

    async def _afetch_and_close(self, kind: str | None) -> dict[str, Any]:
        try:
            return await self.afetch(kind)
        finally:
            if self._client is not None:
                await self._client.aclose()

    def is_stale(self) -> bool:
        """Whether a newer event about the same provider object (same provider,
        account and ``object_id``; created strictly later) was already
        processed by a handler: this event is older than what was applied, and
        acting on it would roll the object's state back.

        With ``ordered=True`` that happens only to an event delivered after a
        newer one had run (the provider's retries arrive late). False when the
        event names no object or no creation time. A read in this handler's
        transaction; see docs/ordering.md.
        """
        return newer_applied(self.connection, self.event)

    def stage(self, action: str, payload: Any) -> None:
        """Stage `action` to run with `payload` after this transaction commits."""
        if action not in self._actions:
            raise ConfigurationError(
                f"no outbox action named {action!r}; register one with @app.action({action!r})"
            )
        # In the handler's transaction (and savepoint): a rollback unstages it.
        self._outbox.stage(self.connection, self.event.id, action, json.dumps(payload))
        self._staged = True

    # The worker's side of an attempt.

    @property
    def staged(self) -> bool:
        """Whether this attempt staged outbox rows that are still to commit."""
        return self._staged

    def discard_staged(self) -> None:
        """The attempt's writes were rolled back, its staged rows with them."""
        self._staged = False

    def flush(self) -> None:
        """Write what the ORM session holds (before the event is marked)."""
        if self._session is not None:
            self._session.flush()

    def end_attempt(self) -> None:
        """Close the ORM session, if the handler opened one."""
        if self._session is not None:
            self._session.close()
            self._session = None
