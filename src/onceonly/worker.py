"""The worker: claims events, runs their handlers once, retries, gives up loudly.

The event row is the job. A worker claims a batch of due events in one
statement (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; one ``UPDATE ...
RETURNING`` on SQLite), which sets ``status='processing'``, its own name as
``lease_owner``, a lease expiry, and bumps ``fence``. Its parts:

- this module: the claim loop, the thread pool that runs each thread's share
  of a claim, LISTEN/NOTIFY, signals and the graceful stop;
- :mod:`onceonly.batch`: one share in as few transactions as the budget
  allows, one savepoint per handler, the marks (G3);
- :mod:`onceonly.prefetch`: API reads done before the transaction opens;
- :mod:`onceonly.leases`: the leases kept alive, the unstarted given back;
- :mod:`onceonly.outbox`: the actions staged by handlers, after the commit.

A handler that raises rolls back; the event becomes ``failed`` with a retry
time (exponential backoff with jitter), and after ``max_attempts`` it becomes
``dead``. Every failed attempt's error, type and traceback is kept in
``onceonly_attempts``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import FrameType
from typing import TYPE_CHECKING

from ._exceptions import LeaseLost, StoreError, StoreUnavailable
from .backoff import backoff
from .batch import BatchProcessor, Claimed, Transactions
from .leases import LeaseKeeper
from .logs import event_fields
from .outbox import OutboxRunner
from .store import migrate_blocking
from .store.engine import write_lock_of
from .store.notifications import EventNotifications
from .store.outbox import OutboxRecords
from .store.work_queue import WorkQueue
from .tracing import TRACEPARENT_HEADER

if TYPE_CHECKING:
    from .deployment import Deployment
    from .reconcile import ScheduledReconcile

__all__ = ["Claimed", "LeaseLost", "Worker", "backoff"]

log = logging.getLogger("onceonly.worker")


class Worker:
    """Processes events for one :class:`~onceonly.Onceonly` until stopped.

    `transactions` is where each batch's handlers run and its marks commit
    (:class:`~onceonly.batch.Transactions`); by default, onceonly's own engine.
    Claims, leases, the effect ledger and the outbox runner use that engine
    in any case.
    """

    def __init__(
        self,
        app: Deployment,
        *,
        concurrency: int = 4,
        batch_size: int | None = None,
        poll_interval: float | None = None,
        name: str | None = None,
        transaction_budget: float | None = None,
        transactions: Transactions | None = None,
        reconcile: ScheduledReconcile | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.app = app
        self.concurrency = concurrency
        # Events per processing transaction, at most: one commit serves them all.
        self.batch_size = batch_size or 32
        self.engine = app.engine
        self.kind = app.engine_kind
        self.queue = WorkQueue(self.kind)
        # PostgreSQL workers wake on NOTIFY and poll only as a fallback; SQLite
        # has no notifications, and a claim that finds nothing is a cheap
        # indexed read of a local file, so it polls often.
        default_poll = 1.0 if self.queue.notifies else 0.1
        self.poll_interval = min(poll_interval or default_poll, 1.0)
        settings = app.settings.worker
        self.lease = settings.lease_seconds
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{id(self) & 0xFFFF:x}"
        # How long a batch may hold SQLite's write lock while a receiver waits
        # (see BatchProcessor.process); 0, one transaction per batch, is the
        # default on PostgreSQL, where a batch locks only its own rows.
        budget = (
            transaction_budget if transaction_budget is not None else settings.transaction_budget
        )
        self.transaction_budget = (
            budget if budget is not None else (0.01 if self.queue.single_writer else 0.0)
        )
        if self.transaction_budget < 0:
            raise ValueError("transaction_budget must be >= 0")
        # The effect ledger's and the outbox's statements, which the outbox
        # runner and the handlers' contexts take (not the work queue's).
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._held: dict[int, Claimed] = {}
        self._started: set[int] = set()
        self._busy = 0  # chunks being processed or queued for a thread
        # Claims run one chunk per thread ahead of the threads: a thread that
        # ends its batch finds the next one queued, instead of waiting on the
        # claim's round trips and commit. Queued chunks' leases are renewed like
        # the running ones' and given back on a graceful stop.
        self._chunks = 2 * concurrency
        self._lock = threading.Lock()
        self._loops = threading.local()
        self.metrics = app.metrics
        #: Runs ``onceonly reconcile`` periodically in a thread of its own
        #: (see :class:`~onceonly.reconcile.ScheduledReconcile`), or ``None``.
        self.reconcile = reconcile
        self._db_failures = 0  # consecutive failed claims, for the back-off
        self.outbox = OutboxRunner(
            self.engine,
            OutboxRecords(self.kind),
            # The dead hooks' calls are outbox rows too (see onceonly.hooks).
            app.hooks.actions(app.handlers.actions),
            owner=self.name,
            lease=settings.outbox_lease,
            max_attempts=settings.max_attempts,
            delay=self._delay,
            loop=self._loop,
            on_database_error=self._database_failed,
        )
        self.batches = BatchProcessor(
            app,
            self.queue,
            owner=self.name,
            transaction_budget=self.transaction_budget,
            write_lock=write_lock_of(self.engine),
            outbox=self.outbox,
            loop=self._loop,
            delay=self._delay,
            transactions=transactions,
        )
        self.leases = LeaseKeeper(
            self.engine,
            self.queue,
            owner=self.name,
            lease=self.lease,
            held=self._held_ids,
            outbox=self.outbox,
            on_database_error=self._database_failed,
        )

    @property
    def processed(self) -> int:
        """Events this worker marked processed."""
        return self.batches.processed

    @property
    def failed(self) -> int:
        """Failed attempts this worker recorded."""
        return self.batches.failed

    # Public.

    def stop(self) -> None:
        """Finish the events being handled, give back the others, then return from run()."""
        self._stop.set()
        self._wake.set()

    def run(self, *, install_signals: bool = True) -> None:
        """Run until :meth:`stop` (or SIGTERM/SIGINT when `install_signals`)."""
        if install_signals:
            self.install_signals()
        log.info("worker %s: concurrency %d, lease %.0f s", self.name, self.concurrency, self.lease)
        if not self._ensure_schema():
            return
        threading.Thread(
            target=self.leases.run, args=(self._stop,), name="onceonly-leases", daemon=True
        ).start()
        if self.queue.notifies:
            threading.Thread(target=self._listen, name="onceonly-listen", daemon=True).start()
        if self.reconcile is not None:
            threading.Thread(
                target=self.reconcile.run,
                args=(self._stop,),
                name="onceonly-reconcile",
                daemon=True,
            ).start()
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="onceonly-handler")
        next_sweep = 0.0
        try:
            while not self._stop.is_set():
                free = self._chunks - self._busy
                claimed = self._claim(free * self.batch_size) if free else []
                for chunk in self._chunked(claimed):
                    if chunk:
                        with self._lock:
                            self._busy += 1
                            self._held.update({c.event.id: c for c in chunk})
                        pool.submit(self._run_chunk, chunk).add_done_callback(self._done)
                if time.monotonic() >= next_sweep:
                    self.outbox.sweep()  # logs and counts its own database errors
                    next_sweep = time.monotonic() + 2.0
                if claimed and len(claimed) == free * self.batch_size:
                    continue  # more may be due
                self._wake.wait(self.poll_interval)
                self._wake.clear()
        finally:
            # Graceful: chunks not yet started go back to the queue at once; the
            # ones being handled finish.
            pool.shutdown(wait=False, cancel_futures=True)
            self._release_unstarted()
            pool.shutdown(wait=True)
            self._stop.set()
            log.info(
                "worker %s stopped: %d processed, %d failed", self.name, self.processed, self.failed
            )

    def run_until_idle(self, timeout: float = 60.0) -> None:
        """Process until nothing is due (for scripts and tests), then return."""
        deadline = time.monotonic() + timeout
        thread = threading.Thread(target=self.run, kwargs={"install_signals": False})
        thread.start()
        try:
            idle_since: float | None = None
            while time.monotonic() < deadline:
                time.sleep(0.05)
                due = self._due_count()
                if self._held or due is None or due > 0:
                    idle_since = None
                elif idle_since is None:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > 0.2:
                    return
        finally:
            self.stop()
            thread.join()

    def _ensure_schema(self) -> bool:
        """Create or upgrade the tables; False if stopped while the database was down.

        A worker may be the first thing to touch a fresh database (a new deploy,
        or a worker thread inside a web application), so it cannot assume the
        receiver created the tables.
        """
        while not self._stop.is_set():
            try:
                migrate_blocking(self.app.settings.database_url)
                return True
            except (StoreUnavailable, OSError) as exc:
                self._database_failed("start", exc)
                log.warning("database not reachable at start, retrying in 1 s: %s", exc)
                self._stop.wait(1.0)
        return False

    # Claiming.

    def _claim(self, n: int) -> list[Claimed]:
        started_ns = time.time_ns()
        try:
            claimed = self.queue.claim(self.engine, n, owner=self.name, lease=self.lease)
        except StoreError as exc:
            self._database_failed("claim", exc)
            # Backed off, doubling up to 5 s: a database that is away is not
            # hammered by every worker at once, and a short blip costs little.
            self._db_failures += 1
            pause = min(5.0, self.poll_interval * 2 ** min(self._db_failures, 8))
            log.warning("claim failed (retry in %.1f s): %s", pause, exc)
            self._stop.wait(pause)
            return []
        if self._db_failures:
            log.info("database reachable again after %d failed claims", self._db_failures)
            self._db_failures = 0
        self.metrics.worker_database_ok()
        if claimed:
            self._claimed(claimed, started_ns)
        return claimed

    def _claimed(self, claimed: list[Claimed], started_ns: int) -> None:
        """The log lines and the ``onceonly.claim`` span of a claim that found
        events (an empty poll, every 0.1 s on SQLite, is worth neither)."""
        if log.isEnabledFor(logging.DEBUG):
            for item in claimed:
                log.debug(
                    "event %s: claimed (attempt %d)",
                    item.event.id,
                    item.event.attempts,
                    extra=event_fields(item.event, worker=self.name),
                )
        tracing = self.app.tracing
        if tracing.enabled:
            tracing.record(
                "onceonly.claim",
                started_ns,
                {"onceonly.worker": self.name, "onceonly.claimed": len(claimed)},
                links=(c.event.headers.get(TRACEPARENT_HEADER) for c in claimed),
            )

    def _database_failed(self, operation: str, exc: BaseException) -> None:
        self.metrics.worker_database_error(operation)

    def _due_count(self) -> int | None:
        """Events claimable now; None when the database cannot say (it is
        down: ``run_until_idle`` then waits, as the worker itself does)."""
        try:
            # Its own claims too: one committed an instant ago is not in
            # _held yet, and stopping then would give it back unprocessed.
            return self.queue.due_count(self.engine, owner=self.name)
        except StoreError as exc:
            self._database_failed("due-count", exc)
            log.warning("could not count due events: %s", exc)
            return None

    def _chunked(self, claimed: list[Claimed]) -> list[list[Claimed]]:
        """A claim cut into the chunks the threads run, each in one
        transaction (one commit, one fsync for the lot): spread over the idle
        threads, and only what they cannot take queued in more chunks of
        `batch_size`."""
        idle = max(self.concurrency - self._busy, 0)
        n = max(min(idle, len(claimed)), -(-len(claimed) // self.batch_size))
        return [claimed[i::n] for i in range(n)]

    def _done(self, future: Future[None]) -> None:
        with self._lock:
            self._busy -= 1
        self._wake.set()

    # Processing.

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop | None = getattr(self._loops, "loop", None)
        if loop is None:
            loop = asyncio.new_event_loop()
            self._loops.loop = loop
        return loop

    def _run_chunk(self, chunk: list[Claimed]) -> None:
        ids = [c.event.id for c in chunk]
        with self._lock:
            self._started.update(ids)
        try:
            self.batches.process(chunk)
        except StoreError as exc:
            self._database_failed("batch", exc)
            log.warning("events %s: database error (leases will expire): %s", ids, exc)
        except Exception:  # never let one batch kill the worker thread
            log.exception("events %s: unexpected error in the worker; leases will expire", ids)
        finally:
            with self._lock:
                for i in ids:
                    self._held.pop(i, None)
                    self._started.discard(i)

    def _process(self, item: Claimed) -> None:
        """Process one claimed event (a batch of one)."""
        self.batches.process([item])

    def _release_unstarted(self) -> None:
        with self._lock:
            waiting = [c for i, c in self._held.items() if i not in self._started]
            for c in waiting:
                self._held.pop(c.event.id, None)
        self.leases.release(waiting)

    def _held_ids(self) -> list[int]:
        with self._lock:
            return list(self._held)

    def _delay(self, attempt: int) -> float:
        retry = self.app.settings.worker
        return backoff(attempt, base=retry.retry_base, cap=retry.retry_cap)

    # Waking up.

    def _listen(self) -> None:
        """LISTEN on PostgreSQL: a new event wakes the claim loop at once."""
        with EventNotifications(self.app.settings.database_url) as notifications:
            while not self._stop.is_set():
                try:
                    # Short waits, so that a stop is noticed within half a second.
                    if notifications.wait(0.5):
                        self._wake.set()
                except StoreError as exc:
                    log.warning("LISTEN connection lost (polling meanwhile): %s", exc)
                    self._stop.wait(1.0)

    def install_signals(self) -> None:
        """Make SIGTERM and SIGINT stop this worker cleanly (main thread only)."""

        def handle(signum: int, frame: FrameType | None) -> None:
            log.info("received %s: finishing events in hand", signal.Signals(signum).name)
            self.stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)


@contextlib.contextmanager
def running(worker: Worker) -> Iterator[Worker]:
    """Run `worker` in a background thread for the duration of a ``with`` block."""
    thread = threading.Thread(
        target=worker.run, kwargs={"install_signals": False}, name="onceonly-worker", daemon=True
    )
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join()
