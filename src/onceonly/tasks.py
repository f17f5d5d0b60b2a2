"""Keyed tasks: a queue's task (Celery, RQ, Dramatiq, cron) that acts once.

The guard (:mod:`onceonly.guard`) remembers that a key completed. A keyed task
adds what a webhook handler has (G3, G4):

- the task's own database writes, made on ``ctx.connection`` (or
  ``ctx.session``), and the key's *done* mark commit in ONE transaction: a
  worker killed before that commit leaves neither, and the task runs again;
  after it, the task never runs again (a repeat returns the recorded result);
- ``ctx.effect(name, call)`` calls ``call(key)`` for the outside world (charge
  a card, send an e-mail) with a key that is the same on every run of the task
  key, and records the outcome in its own transaction before returning, so a
  run after a crash gets the recorded outcome back instead of calling again.
  The window left is a crash after the call and before its record: the next
  run calls again with the same key, which an API that honours idempotency
  keys answers with its first result.

::

    tasks = KeyedTasks(Guard("postgresql://app@db/app"))

    def charge(ctx: TaskContext, order_id: int) -> str:
        charge = ctx.effect("charge", lambda key: cards.charge(order_id, idempotency_key=key))
        ctx.connection.execute(payments.insert().values(order_id=order_id, charge=charge["id"]))
        return charge["id"]

    tasks.run(f"charge:{order_id}", lambda ctx: charge(ctx, order_id))

The transaction begins when the task first touches ``ctx.connection`` or
``ctx.session`` (or, if it never does, just for the mark), so the calls made
before the writes hold no transaction open: on SQLite, whose one write lock
that transaction takes, other tasks run meanwhile; a task holding the lock
makes another wait (``busy_timeout``), then retry.

While another live worker runs the key, :meth:`KeyedTasks.run` raises
:class:`~onceonly.JobInProgress`: the queue must retry the task later (the
Celery adapter, :mod:`onceonly.contrib.celery`, does), not drop it, since the
other run may yet fail. A worker that died holds the key until its lease runs
out; the guard's ``lease_seconds`` is how long a redelivered task waits.

The task's writes share onceonly's database: the tables the task writes must
live in the database of the guard's URL.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

import sqlalchemy as sa
from sqlalchemy.orm import Session

from ._exceptions import JobInProgress, StoreError
from .context import serialised_outcome
from .db import create_engine
from .guard import Guard, Held, fingerprint_of
from .ledger import effects_url
from .store.engine import transaction
from .store.job_effects import JobEffectRecords

__all__ = ["KeyedTasks", "TaskContext", "task_effect_key"]

P = ParamSpec("P")
T = TypeVar("T")

log = logging.getLogger("onceonly.tasks")


def task_effect_key(job_key: str, name: str) -> str:
    """The idempotency key of effect `name` of task key `job_key`: the same on
    every run, worker and machine, at most 64 characters, safe in a header."""
    digest = hashlib.sha256(f"task\x00{job_key}\x00{name}".encode()).hexdigest()
    return f"oo-{digest[:40]}"


@dataclass
class TaskContext:
    """What a keyed task gets: the transaction that marks it done, and effects."""

    #: The task's key (what makes two calls the same work).
    key: str
    _begin: Callable[[], sa.Connection] = field(repr=False)
    _tasks: KeyedTasks = field(repr=False)
    _session: Session | None = field(default=None, repr=False)

    @property
    def connection(self) -> sa.Connection:
        """The connection of the transaction that marks the key done.

        The transaction begins on first use, so the calls a task makes before
        its writes hold no transaction open (on SQLite, no write lock)."""
        return self._begin()

    @property
    def session(self) -> Session:
        """An ORM session on this transaction; written before the key is marked."""
        if self._session is None:
            self._session = Session(
                bind=self.connection,
                expire_on_commit=False,
                join_transaction_mode="create_savepoint",
            )
        return self._session

    def effect_key(self, name: str) -> str:
        return task_effect_key(self.key, name)

    def effect(self, name: str, call: Callable[[str], T]) -> T:
        """Run ``call(key)`` once for this task key and `name`; return its outcome.

        When an earlier run of this key recorded an outcome, `call` is not
        called and that outcome (JSON round-tripped) is returned.
        """
        tasks = self._tasks
        found = tasks.records.find(tasks.effects_engine, self.key, name)
        if found is not None:
            return json.loads(found)  # type: ignore[no-any-return]
        key = self.effect_key(name)
        outcome = call(key)
        serialised = serialised_outcome(name, outcome, then="the next run")
        # Its own transaction, on another connection (another file on SQLite):
        # durable before the task goes on, and survives a rollback of the task's.
        tasks.records.record(tasks.effects_engine, self.key, name, key, serialised)
        return outcome

    def _finish(self) -> None:
        if self._session is not None:
            # Releases the session's SAVEPOINT into the task's transaction,
            # which the mark then commits; closing it first would roll it back.
            self._session.commit()

    def _close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None


class KeyedTasks:
    """Runs tasks once per key on a guard's database (thread-safe).

    The queue adapters (:mod:`onceonly.contrib.celery`, and the RQ and
    Dramatiq recipes in ``docs/celery.md``) are thin layers over :meth:`run`.
    """

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self.records = JobEffectRecords(guard.records.kind)
        separate = self.records.separate_file
        self.effects_engine = (
            create_engine(effects_url(guard.database_url)) if separate else guard.engine
        )
        self._ready = not separate

    def prepare(self) -> None:
        """Create the records table where it is not a migration's (SQLite's own file)."""
        if not self._ready:
            self.records.create_table(self.effects_engine)
            self._ready = True

    def run(
        self,
        key: str,
        fn: Callable[[TaskContext], T],
        *,
        fingerprint: str | None = None,
        ttl: float | None = None,
    ) -> T:
        """Run ``fn(ctx)`` for `key` unless it completed; return its result.

        A completed key returns the result recorded by the run that did the
        work (JSON round-tripped; None if it was not serialisable). Raises
        :class:`~onceonly.JobInProgress` while another live caller holds the
        key, :class:`~onceonly.JobConflict` when it completed with another
        `fingerprint`; what `fn` raises leaves the key failed (the next call
        runs it again) and is raised again.
        """
        ttl = self.guard.horizon(ttl)
        run, held = self.guard.start(key, fingerprint)
        if held is None:
            return run.result  # type: ignore[no-any-return]
        self.prepare()
        try:
            result = self._run_held(held, fn, ttl)
        except BaseException as exc:
            held.release()
            try:
                self.guard.record_failure(held, exc, ttl)
            except StoreError:
                # The database is away: the key stays running until its lease
                # runs out, then the next call takes it over.
                log.warning("could not record the failure of task %r", key, exc_info=True)
            raise
        # After the commit: on SQLite the lease keeper waits for the write
        # lock this transaction held; its renewal of a done key changes nothing.
        held.release()
        if self.records.separate_file:
            # Outside the committed transaction (another file): a crash here
            # leaves records that only a forgotten and re-run key would read.
            try:
                self.records.forget(self.effects_engine, key)
            except StoreError:
                log.warning("could not delete the effect records of task %r", key, exc_info=True)
        return result

    def _run_held(self, held: Held, fn: Callable[[TaskContext], T], ttl: float | None) -> T:
        with ExitStack() as stack:
            opened: list[sa.Connection] = []

            def begin() -> sa.Connection:
                if not opened:
                    what = "running a keyed task"
                    opened.append(stack.enter_context(transaction(self.guard.engine, what)))
                return opened[0]

            ctx = TaskContext(key=held.key, _begin=begin, _tasks=self)
            try:
                result = fn(ctx)
                ctx._finish()
            finally:
                ctx._close()
            # What the task raised rolls this transaction back (the stack's exit).
            conn = begin()
            try:
                recorded: str | None = json.dumps(result)
            except (TypeError, ValueError):
                recorded = None
            if not self.records.separate_file:
                self.records.forget(conn, held.key)
            # Fenced: a run that lost its key cannot mark it over the new owner.
            done = self.guard.records.finish_in(
                conn, held.key, fence=held.fence, result=recorded, ttl=ttl
            )
            if not done:
                raise JobInProgress(
                    f"task {held.key!r}: this run's lease ran out and another caller took "
                    "over; its writes were rolled back and its completion not recorded"
                )
        return result

    def task(
        self,
        key: str | Callable[..., str],
        *,
        fingerprint: bool | Callable[..., str] = True,
        ttl: float | None = None,
    ) -> Callable[[Callable[Concatenate[TaskContext, P], T]], Callable[P, T]]:
        """Decorator for queues that call plain functions (RQ, Dramatiq).

        ``fn(ctx, *args, **kwargs)`` becomes ``fn(*args, **kwargs)``, run once
        per key. `key` is a function of the arguments or a format string
        (``"charge:{order_id}"``); `fingerprint` as for :meth:`Guard.job`.
        """

        def decorate(fn: Callable[Concatenate[TaskContext, P], T]) -> Callable[P, T]:
            @functools.wraps(fn)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
                k, fp = names_of(key, fingerprint, args, kwargs)
                return self.run(k, lambda ctx: fn(ctx, *args, **kwargs), fingerprint=fp, ttl=ttl)

            return wrapper

        return decorate

    def dispose(self) -> None:
        if self.effects_engine is not self.guard.engine:
            self.effects_engine.dispose()


def names_of(
    key: str | Callable[..., str],
    fingerprint: bool | Callable[..., str],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[str, str | None]:
    """The key and the fingerprint of a call, as the decorators compute them."""
    k = key(*args, **kwargs) if callable(key) else key.format(*args, **kwargs)
    if fingerprint is True:
        return k, fingerprint_of(args, kwargs)
    return k, fingerprint(*args, **kwargs) if callable(fingerprint) else None
