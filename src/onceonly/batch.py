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
import logging
import time
import traceback
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from .clients import Target
from .context import AttemptServices, Context, HandlerSavepoints
from .prefetch import prefetch
from .store.engine import transaction
from .store.work_queue import Claimed, WorkQueue
from .store.write_lock import WriteLock

if TYPE_CHECKING:
    import sqlalchemy as sa

    from .deployment import Deployment
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
        self._loop = loop
        self._delay = delay
        self.processed = 0
        self.failed = 0

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
                        )
                        continue
                    outcome = self.attempt(
                        conn, savepoints, item, contexts, prefetched.get(item.event.id, {})
                    )
                    if isinstance(outcome, tuple):
                        failures.append((item, *outcome))
                    else:
                        processed.append((item, outcome))
                # The rows were locked and their fences checked above, and
                # nobody can change a locked row: these updates all land.
                self.queue.mark_processed(conn, processed)
                savepoints.close()
                for item, exc, handler in failures:
                    self._record_failure(conn, item, exc, handler)
        finally:
            for ctx in contexts:
                ctx.end_attempt()
            if started is not None:
                self.metrics.transaction_ended(time.monotonic() - started)
        self.processed += len(processed)
        self.failed += len(failures)
        # Counted once the transaction committed, so they match the table.
        self.metrics.batch_committed(
            processed=[(i.event.provider, i.event.tenant) for i, _ in processed],
            failed=[
                (i.event.provider, i.event.tenant) for i, _, _ in failures if not self.is_last(i)
            ],
            dead=[(i.event.provider, i.event.tenant) for i, _, _ in failures if self.is_last(i)],
        )
        staged = [c.event.id for c in contexts if c.staged]
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
        """Run one event's handler in a savepoint: the handler's name on
        success, (error, handler name) on failure."""
        event = item.event
        registration = self.app.handlers.resolve(event.provider, event.event_type)
        name = registration.name if registration else None
        if event.attempts > self.max_attempts:
            # Claimed again after workers died on it max_attempts times.
            return RuntimeError("the worker died during every attempt"), name
        if registration is None:
            log.info(
                "event %s (%s %s): no handler registered; marked processed",
                event.id,
                event.provider,
                event.event_type,
            )
            return "(no handler registered)"
        ctx = Context.for_attempt(
            event,
            conn,
            AttemptServices(
                ledger=self.app.effect_ledger,
                outbox=self.outbox.records,
                actions=frozenset(self.app.handlers.actions),
                api_clients=self.app.api_clients,
                tenants=self.app.tenants,
                event_loop=self._loop,
                fetched=prefetched,
            ),
        )
        contexts.append(ctx)
        savepoints.arm()
        started = time.perf_counter()
        try:
            if registration.is_async:
                self.transactions.run_async(registration.handler(event, ctx))
            else:
                registration.handler(event, ctx)
            ctx.flush()
        except Exception as exc:
            ctx.end_attempt()
            savepoints.finish(success=False)
            ctx.discard_staged()  # its outbox rows went with the savepoint
            return exc, name
        finally:
            self.metrics.handler_ran(event.provider, time.perf_counter() - started)
        if not savepoints.finish(success=True):
            ctx.discard_staged()
            return RuntimeError(
                "the handler swallowed a database error that aborted its writes; "
                "they were rolled back"
            ), name
        return registration.name

    def _record_failure(
        self, conn: sa.Connection, item: Claimed, exc: Exception, handler: str | None
    ) -> None:
        attempt = item.event.attempts
        dead = self.is_last(item)
        delay = 0.0 if dead else self._delay(attempt)
        log.warning(
            "event %s (%s) attempt %d/%d failed%s: %s: %s",
            item.event.id,
            handler or "no handler",
            attempt,
            self.max_attempts,
            "; now dead" if dead else f"; retry in {delay:.1f} s",
            type(exc).__name__,
            exc,
        )
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
            traceback="".join(traceback.format_exception(exc))[-8000:],
        )

    def is_last(self, item: Claimed) -> bool:
        """Whether a failure of this attempt makes the event dead."""
        return item.event.attempts >= self.max_attempts


def _route(item: Claimed) -> tuple[str, str]:
    """What the metrics count an event under: its provider and tenant."""
    return item.event.provider, item.event.tenant
