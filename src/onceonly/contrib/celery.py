"""Celery tasks that act once: keyed by their arguments, remembered after they end.

::

    from celery import Celery
    from onceonly.contrib.celery import OnceTasks

    app = Celery("shop", broker="redis://127.0.0.1:6379/0")
    once = OnceTasks(app)                   # onceonly's database from ONCEONLY_DATABASE_URL

    @once.task(key="charge:{order_id}")
    def charge(ctx, order_id: int, amount: int) -> str:
        card = ctx.effect("charge", lambda key: cards.charge(amount, idempotency_key=key))
        ctx.connection.execute(payments.insert().values(order_id=order_id, charge=card["id"]))
        return card["id"]

    charge.delay(42, amount=1990)           # a second .delay(42, ...) does not charge again

What each task gets is :mod:`onceonly.tasks`' (the same core serves RQ and
Dramatiq): its writes on ``ctx.connection`` and the key's done mark commit
together; ``ctx.effect`` records each outside call before returning; a repeat
of a completed key returns the recorded result without running.

Celery's side of it, set by default on every task declared here:

- ``acks_late=True``: the message is acknowledged after the task ends, so a
  worker killed mid-task leaves it to be delivered again (on Redis, after the
  broker's ``visibility_timeout``; on RabbitMQ, when the connection drops);
- ``reject_on_worker_lost=True``: a prefork child that dies sends the message
  back to the queue instead of failing it;
- while the key runs elsewhere (its lease is held), or the database cannot be
  reached, the task retries itself (``self.retry(countdown=...)``), never
  skips: the other run may yet fail. ``max_retries=None``: it keeps waiting
  for as long as the holder renews its lease.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from celery import Celery, Task

from .._exceptions import JobInProgress, StoreUnavailable
from ..guard import Guard
from ..tasks import KeyedTasks, TaskContext, names_of
from .celery_events import EventOutlet

__all__ = ["EventOutlet", "OnceTasks", "TaskContext"]

P = ParamSpec("P")
R = TypeVar("R")

#: Seconds a task waits before trying again a key that runs elsewhere.
DEFAULT_RETRY_COUNTDOWN = 5.0


class OnceTasks:
    """Declares Celery tasks on `app` that run once per key.

    `guard` is the :class:`~onceonly.guard.Guard` whose database remembers the
    keys (and holds the tables the tasks write), or a function that makes one;
    by default one is made from the environment (``ONCEONLY_DATABASE_URL``), in
    the worker process, on the first task it runs.
    """

    def __init__(
        self,
        app: Celery,
        guard: Guard | Callable[[], Guard] | None = None,
        *,
        retry_countdown: float = DEFAULT_RETRY_COUNTDOWN,
    ) -> None:
        self.app = app
        self._guard = guard
        self._tasks: KeyedTasks | None = None
        self._lock = threading.Lock()
        self.retry_countdown = retry_countdown

    @property
    def tasks(self) -> KeyedTasks:
        """The keyed-task runner, made on first use (after Celery forked its pool)."""
        if self._tasks is None:
            with self._lock:  # a threads pool's first tasks start together
                if self._tasks is None:
                    self._tasks = KeyedTasks(self._make_guard())
        return self._tasks

    def _make_guard(self) -> Guard:
        if isinstance(self._guard, Guard):
            return self._guard
        if self._guard is not None:
            return self._guard()
        from ..config import Onceonly

        return Onceonly().guard()

    def task(
        self,
        key: str | Callable[..., str],
        *,
        fingerprint: bool | Callable[..., str] = True,
        ttl: float | None = None,
        retry_countdown: float | None = None,
        **options: Any,
    ) -> Callable[[Callable[Concatenate[TaskContext, P], R]], Task[P, R]]:
        """Decorator: ``fn(ctx, *args, **kwargs)`` becomes a Celery task of
        ``(*args, **kwargs)`` that runs once per key.

        `key` is a function of the task's arguments or a format string
        (``"charge:{order_id}"``, ``"import:{0}"``); a repeat of a completed key
        with other arguments raises :class:`~onceonly.JobConflict` (compare
        `fingerprint`, a function of them, instead, or False for nothing).
        `ttl` is how long a completed key is remembered (the guard's by
        default). `options` go to ``app.task`` (``name``, ``queue``, ...) and
        may override ``acks_late``, ``reject_on_worker_lost`` and
        ``max_retries``.
        """
        countdown = self.retry_countdown if retry_countdown is None else retry_countdown
        options.setdefault("acks_late", True)
        options.setdefault("reject_on_worker_lost", True)
        options.setdefault("max_retries", None)
        options["bind"] = True

        def decorate(fn: Callable[Concatenate[TaskContext, P], R]) -> Task[P, R]:
            def run(task: Task[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
                k, fp = names_of(key, fingerprint, args, kwargs)
                try:
                    return self.tasks.run(
                        k, lambda ctx: fn(ctx, *args, **kwargs), fingerprint=fp, ttl=ttl
                    )
                except (JobInProgress, StoreUnavailable) as exc:
                    raise task.retry(exc=exc, countdown=countdown) from exc

            for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
                setattr(run, attribute, getattr(fn, attribute))
            # Celery checks a call's arguments against this (``typing``): the
            # task's first parameter is ``ctx`` where Celery expects ``self``.
            run.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
            declare = cast(Callable[[Callable[..., R]], "Task[P, R]"], self.app.task(**options))
            return declare(run)

        return decorate
