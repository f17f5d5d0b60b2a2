"""Processing a claimed batch: transactions, savepoints, attempts, marks.

A worker thread hands its share of a claim to :meth:`BatchProcessor.process`.
The batch runs in as few transactions as the transaction budget allows, each:

1. re-reads the rows (locking them on PostgreSQL): an event whose ``fence``
   changed was lost to another worker: skip it, write nothing for it;
2. runs each handler on that transaction's connection, inside a savepoint
   that its failure rolls back (:meth:`BatchProcessor.attempt`);
3. ``UPDATE ... SET status='processed' WHERE id=? AND fence=?``, records the
   failures, and commits once.

So a handler's writes and its event's mark commit together (G3).

Whose transaction that is, is a :class:`Transactions`: by default
onceonly's own engine (:class:`OwnTransactions`); a web framework can lend its
own connection instead, so that its ORM's writes share the commit (the Django
app's worker does: :mod:`onceonly.contrib.django.transactions`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import traceback
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from ._exceptions import NonRetryable, RetryLater
from .clients import Target
from .context import AttemptServices, Context, HandlerSavepoints
from .handlers import RetryPolicy
from .hooks import Failure
from .logs import event_fields
from .prefetch import prefetch
from .store.engine import transaction
from .store.work_queue import Claimed, WorkQueue
from .store.write_lock import WriteLock
from .tracing import TRACEPARENT_HEADER, Attributes

if TYPE_CHECKING:
    import sqlalchemy as sa

    from .deployment import Deployment
    from .events import Event
    from .outbox import OutboxRunner

__all__ = ["BatchProcessor", "Claimed", "OwnTransactions", "Transactions"]

log = logging.getLogger("onceonly.worker")

# On SQLite, past this a batch commits and goes on in a new transaction even
# with no receiver waiting: other workers, purges and imports wait in SQLite's
# busy handler, and not for seconds.
_LONGEST_TRANSACTION = 0.25


#: What one attempt came to: the handler's name, or (error, handler name).
Outcome = str | tuple[Exception, str | None]


class Transactions(Protocol):
    """Where a batch's handlers run and their events' marks commit."""

    def open(self, what: str) -> AbstractContextManager[sa.Connection]:
        """A transaction, committed when the block ends normally and rolled
        back otherwise; its own failures raise :class:`~onceonly.StoreError`."""

    def run_async(self, work: Coroutine[Any, Any, None]) -> None:
        """Run an async handler's coroutine to its end on the calling thread's
        behalf (its database work must land in the open transaction)."""


class OwnTransactions:
    """The default: transactions of onceonly's own engine; async handlers on
    the worker thread's event loop."""

    def __init__(self, engine: sa.Engine, loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
        self.engine = engine
        self._loop = loop

    def open(self, what: str) -> AbstractContextManager[sa.Connection]:
        return transaction(self.engine, what)

    def run_async(self, work: Coroutine[Any, Any, None]) -> None:
        self._loop().run_until_complete(work)


class BatchProcessor:
    """Runs claimed events' handlers and records what came of them."""

    def __init__(
        self,
        app: Deployment,
        queue: WorkQueue,
        *,
        owner: str,
        transaction_budget: float,
        write_lock: WriteLock | None,
        outbox: OutboxRunner,
        loop: Callable[[], asyncio.AbstractEventLoop],
        delay: Callable[[int], float],
        transactions: Transactions | None = None,
    ) -> None:
        self.app = app
        self.engine = app.engine
        self.transactions = transactions or OwnTransactions(self.engine, loop)
        self.queue = queue
        self.owner = owner
        self.transaction_budget = transaction_budget
        self.write_lock = write_lock
        self.outbox = outbox
        self.metrics = app.metrics
        self.max_attempts = app.settings.worker.max_attempts
        self.hooks = app.hooks
        self.tracing = app.tracing
        self._loop = loop
        self._delay = delay
        self.processed = 0
        self.failed = 0
        #: RetryLater raised by handlers (not failures: no attempt spent).
        self.deferred = 0
        # Handlers already warned about that their ordered events came unordered.
        self._warned_unordered: set[str] = set()
        self._base_services: AttemptServices | None = None

    def process(self, batch: list[Claimed]) -> None:
        """Run a batch of claimed events, one savepoint each, in as few
        transactions as the budget allows.

        One commit serves the whole batch, unless the batch has held SQLite's
        write lock past ``transaction_budget`` while a receiver waits (or past
        ``_LONGEST_TRANSACTION`` in any case): then what is done commits and the
        rest goes on in a new transaction, so the receiver gets the lock between
        the two.
        """
        prefetched = prefetch(
            self.app.handlers,
            self.app.api_clients,
            [c.event for c in batch],
            self._loop,
            tenants=self.app.tenants,
        )
        remaining = batch
        while remaining:
            remaining = self._slice(remaining, prefetched)

    def _slice(
        self, batch: list[Claimed], prefetched: dict[int, dict[Target, Any]]
    ) -> list[Claimed]:
        """Process the head of `batch` in one transaction; the events left over
        when the budget ran out."""
        contexts: list[Context] = []
        processed: list[tuple[Claimed, str]] = []
        failures: list[tuple[Claimed, Exception, str | None]] = []
        #: For the failed-attempt hooks, and the events whose dead hooks were staged.
        recorded: list[Failure] = []
        deferred: list[tuple[Claimed, RetryLater, str | None]] = []
        left: list[Claimed] = []
        started: float | None = None
        try:
            # The transaction's own failures (BEGIN, the write lock, COMMIT)
            # leave it as StoreError, like its statements'.
            with self.transactions.open("processing events") as conn:
                started = time.monotonic()  # the lock is held from here on
                held = self.queue.lock_events(conn, batch)
                savepoints = HandlerSavepoints(conn)
                for n, item in enumerate(batch):
                    if n and self._over_budget(time.monotonic() - started):
                        left = batch[n:]
                        break
                    if item.event.id not in held:
                        log.warning(
                            "event %s: lease lost before processing; the new owner will finish it",
                            item.event.id,
                            extra=event_fields(item.event, worker=self.owner),
                        )
                        continue
                    outcome = self._traced_attempt(
                        conn, savepoints, item, contexts, prefetched.get(item.event.id, {})
                    )
                    if isinstance(outcome, tuple) and isinstance(outcome[0], RetryLater):
                        deferred.append((item, outcome[0], outcome[1]))
                    elif isinstance(outcome, tuple):
                        failures.append((item, *outcome))
                    else:
                        processed.append((item, outcome))
                # The rows were locked and their fences checked above, and
                # nobody can change a locked row: these updates all land.
                self.queue.mark_processed(conn, processed)
                savepoints.close()
                for item, exc, handler in failures:
                    recorded.append(self._record_failure(conn, item, exc, handler))
                for item, later, handler in deferred:
                    self._record_deferral(conn, item, later, handler)
        finally:
            for ctx in contexts:
                ctx.end_attempt()
            if started is not None:
                self.metrics.transaction_ended(time.monotonic() - started)
        self.processed += len(processed)
        self.failed += len(failures)
        self.deferred += len(deferred)
        # Counted once the transaction committed, so they match the table.
        self.metrics.batch_committed(
            processed=[_route(i) for i, _ in processed],
            failed=[_route(i) for i, e, _ in failures if not self.is_dead(i, e)],
            dead=[_route(i) for i, e, _ in failures if self.is_dead(i, e)],
        )
        if log.isEnabledFor(logging.DEBUG):
            for item, handler in processed:
                log.debug(
                    "event %s: processed by %s",
                    item.event.id,
                    handler,
                    extra=event_fields(item.event, worker=self.owner, handler=handler),
                )
        # After the commit, never inside it: no lock waits on a hook.
        if self.hooks.failed and recorded:
            self.hooks.attempt_failed(recorded, self._loop)
        # One id per event, even when several of its handlers staged rows.
        staged = list(dict.fromkeys(c.event.id for c in contexts if c.staged))
        staged += [f.event_pk for f in recorded if f.dead and self.hooks.dead]
        if staged:
            self.outbox.run_for(staged)
        return left

    def _over_budget(self, held: float) -> bool:
        """Whether a transaction open for `held` seconds should commit now."""
        if not self.transaction_budget or held <= self.transaction_budget:
            return False
        if self.write_lock is None or held > _LONGEST_TRANSACTION:
            return True
        return self.write_lock.receiver_waiting()

    def attempt(
        self,
        conn: sa.Connection,
        savepoints: HandlerSavepoints,
        item: Claimed,
        contexts: list[Context],
        prefetched: dict[Target, Any],
    ) -> Outcome:
        """Run one event's handlers in one savepoint: their names on success,
        (error, name of the handler that raised) on failure.

        Several handlers of one event run in registration order and stand or
        fall together: one that raises rolls back the others' writes too, and
        the retry runs them all again (their effects are in the ledger, so
        those are not called twice). See docs/handlers.md.
        """
        event = item.event
        route = self.app.handlers.route(event.provider, event.event_type)
        name = route.name if route else None
        max_attempts = route.max_attempts(self.max_attempts) if route else self.max_attempts
        if event.attempts > max_attempts:
            # Claimed again after workers died on it max_attempts times.
            return RuntimeError("the worker died during every attempt"), name
        if route is None:
            log.info(
                "event %s (%s %s): no handler registered; marked processed",
                event.id,
                event.provider,
                event.event_type,
                extra=event_fields(event, worker=self.owner),
            )
            return "(no handler registered)"
        route_head = route.registrations[0]
        if route_head.ordered and event.ordering_key is None:
            self._warn_unordered(route_head.name, event)
        services = self._services(prefetched)
        mine: list[Context] = []
        savepoints.arm()
        started = time.perf_counter()
        running = name
        try:
            for registration in route.registrations:
                running = registration.name
                ctx = Context.for_attempt(
                    event, conn, services, effect_prefix=registration.effect_prefix
                )
                contexts.append(ctx)
                mine.append(ctx)
                if registration.is_async:
                    self.transactions.run_async(registration.handler(event, ctx))
                else:
                    registration.handler(event, ctx)
                ctx.flush()
        except Exception as exc:
            for ctx in mine:
                ctx.end_attempt()
            savepoints.finish(success=False)
            for ctx in mine:
                ctx.discard_staged()  # their outbox rows went with the savepoint
            return exc, running
        finally:
            self.metrics.handler_ran(event.provider, time.perf_counter() - started)
        if not savepoints.finish(success=True):
            for ctx in mine:
                ctx.discard_staged()
            return RuntimeError(
                "the handler swallowed a database error that aborted its writes; "
                "they were rolled back"
            ), name
        return route.name

    def _services(self, prefetched: dict[Target, Any]) -> AttemptServices:
        """What an attempt is lent: one object kept for every attempt (built
        again only when outbox actions were registered since), copied only
        for an event with prefetched answers."""
        base = self._base_services
        if base is None or base.actions != self.app.handlers.actions.keys():
            base = self._base_services = AttemptServices(
                ledger=self.app.effect_ledger,
                outbox=self.outbox.records,
                actions=frozenset(self.app.handlers.actions),
                api_clients=self.app.api_clients,
                tenants=self.app.tenants,
                event_loop=self._loop,
                tracing=self.tracing,
                worker=self.owner,
            )
        return dataclasses.replace(base, fetched=prefetched) if prefetched else base

    def retry_policy(self, event: Event) -> RetryPolicy:
        """Attempts and backoff for `event`: those its handlers were registered
        with, the worker's settings where they set none."""
        route = self.app.handlers.route(event.provider, event.event_type)
        if route is None:
            return RetryPolicy(self.max_attempts, self._delay)
        return route.policy(self.max_attempts, self._delay)

    def _traced_attempt(
        self,
        conn: sa.Connection,
        savepoints: HandlerSavepoints,
        item: Claimed,
        contexts: list[Context],
        prefetched: dict[Target, Any],
    ) -> Outcome:
        """:meth:`attempt` inside an ``onceonly.handle`` span, a child of the
        event's receive span (see :mod:`onceonly.tracing`)."""
        if not self.tracing.enabled:
            return self.attempt(conn, savepoints, item, contexts, prefetched)
        event = item.event
        attributes: Attributes = {
            "onceonly.event_pk": event.id,
            "onceonly.provider": event.provider,
            "onceonly.event_id": event.event_id,
            "onceonly.event_type": event.event_type or "",
            "onceonly.attempt": event.attempts,
            "onceonly.worker": self.owner,
            "onceonly.tenant": event.tenant,
        }
        parent = event.headers.get(TRACEPARENT_HEADER)
        with self.tracing.span("onceonly.handle", attributes, parent=parent, root=True) as span:
            outcome = self.attempt(conn, savepoints, item, contexts, prefetched)
            if span is not None:
                if isinstance(outcome, tuple):
                    self.tracing.failed(span, outcome[0])
                    span.set_attribute("onceonly.dead", self.is_last(item))
                    name = outcome[1]
                else:
                    name = outcome
                span.set_attribute("onceonly.handler", name or "")
        return outcome

    def _record_failure(
        self, conn: sa.Connection, item: Claimed, exc: Exception, handler: str | None
    ) -> Failure:
        attempt = item.event.attempts
        policy = self.retry_policy(item.event)
        dead = isinstance(exc, NonRetryable) or attempt >= policy.max_attempts
        delay = 0.0 if dead else policy.delay(attempt)
        log.warning(
            "event %s (%s) attempt %d/%d failed%s: %s: %s",
            item.event.id,
            handler or "no handler",
            attempt,
            policy.max_attempts,
            "; now dead" if dead else f"; retry in {delay:.1f} s",
            type(exc).__name__,
            exc,
            extra=event_fields(item.event, worker=self.owner, handler=handler, dead=dead),
        )
        formatted = "".join(traceback.format_exception(exc))[-8000:]
        self.queue.mark_failed(
            conn, item, dead=dead, delay=delay, error=f"{type(exc).__name__}: {exc}"[:2000]
        )
        self.queue.insert_attempt(
            conn,
            item,
            worker=self.owner,
            outcome="dead" if dead else "failed",
            error_type=type(exc).__qualname__,
            error_message=str(exc)[:2000],
            traceback=formatted,
        )
        failure = Failure.of(
            item.event,
            exc,
            formatted,
            handler=handler,
            worker=self.owner,
            max_attempts=policy.max_attempts,
            dead=dead,
        )
        if dead:
            # In the transaction that marks it dead: the hook call commits with the death.
            self.hooks.stage_dead(conn, self.outbox.records, failure)
        return failure

    def _record_deferral(
        self, conn: sa.Connection, item: Claimed, later: RetryLater, handler: str | None
    ) -> None:
        log.info(
            "event %s (%s) deferred by the handler for %.1f s%s",
            item.event.id,
            handler,
            later.seconds,
            f": {later.reason}" if later.reason else "",
        )
        self.queue.defer(conn, item, delay=later.seconds)
        # Kept in the history, but not as a failure: the event's attempts and
        # last_error stay as they were.
        self.queue.insert_attempt(
            conn,
            item,
            worker=self.owner,
            outcome="deferred",
            error_type=type(later).__qualname__,
            error_message=str(later)[:2000],
        )

    def _warn_unordered(self, handler: str, event: Event) -> None:
        """Once per handler: its events should carry an ordering key and this
        one does not, so it runs unordered."""
        if handler in self._warned_unordered or event.object_id is None:
            # No object id: ordered=True had nothing to order by (a custom
            # key cannot be told apart here); not the receiver's fault.
            return
        self._warned_unordered.add(handler)
        log.warning(
            "event %s: handler %s wants its events ordered, but this one was stored "
            "without an ordering key, so it runs unordered: the process that received "
            "it did not load the handlers (run `onceonly serve --app` with the worker's "
            "app), or it arrived before the handler asked for order "
            "(warned once per handler)",
            event.id,
            handler,
        )

    def is_dead(self, item: Claimed, exc: Exception) -> bool:
        """Whether failing this attempt with `exc` makes the event dead."""
        return isinstance(exc, NonRetryable) or self.is_last(item)

    def is_last(self, item: Claimed) -> bool:
        """Whether a failure of this attempt makes the event dead."""
        return item.event.attempts >= self.retry_policy(item.event).max_attempts


def _route(item: Claimed) -> tuple[str, str]:
    """What the metrics count an event under: its provider and tenant."""
    return item.event.provider, item.event.tenant
