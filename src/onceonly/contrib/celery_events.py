"""Received events processed by the team's Celery workers instead of ``onceonly worker``.

::

    app = Onceonly()                       # its handlers, as for onceonly worker
    outlet = EventOutlet(app, celery_app)  # registers the task "onceonly.process_event"

    outlet.run()                           # in one small process: the dispatcher

The dispatcher claims due events from the inbox as a worker would (the same
statement: ``FOR UPDATE SKIP LOCKED`` on PostgreSQL), leased for
``lease_seconds``, and sends one Celery message per event naming that claim
(the event's id and the claim's fence). The Celery task reads the event back
only while that claim holds and processes it exactly as ``onceonly worker``
does: the handler's writes and the processed mark commit in one transaction,
failures are retried with backoff and go dead after ``max_attempts``, effects
and outbox work as in any handler.

A message that is lost, or waits in the queue past the lease, leaves the claim
to expire: the dispatcher claims the event again (a new fence) and sends it
again, and the old message, if it ever runs, finds its claim over and does
nothing. Two messages can never both process an event: the mark is fenced,
and on PostgreSQL the row is locked while its handler runs.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import TYPE_CHECKING, Any

from celery import Celery, Task

from ..store import migrate_blocking
from ..store.work_queue import Claimed, WorkQueue

if TYPE_CHECKING:
    from ..config import Onceonly
    from ..worker import Worker

__all__ = ["EventOutlet"]

log = logging.getLogger("onceonly.contrib.celery")


class EventOutlet:
    """Hands `app`'s received events to Celery `celery`, one task per event.

    `queue` is the Celery queue the messages go to (the app's default
    otherwise); `lease_seconds` how long a claimed event waits for its task
    before the dispatcher sends it again (the worker's lease by default).
    """

    def __init__(
        self,
        app: Onceonly,
        celery: Celery,
        *,
        task_name: str = "onceonly.process_event",
        queue: str | None = None,
        lease_seconds: float | None = None,
        batch_size: int = 100,
    ) -> None:
        self.app = app
        self.celery = celery
        self.work = WorkQueue(app.engine_kind)
        self.lease = lease_seconds or app.settings.worker.lease_seconds
        self.batch_size = batch_size
        self.owner = f"outlet:{socket.gethostname()}:{os.getpid()}"
        self._send_options: dict[str, Any] = {"queue": queue} if queue else {}
        self._worker: Worker | None = None
        self._lock = threading.Lock()
        self._migrated = False

        # A plain function: Celery reads the task's arguments off its signature.
        def process_event(event_pk: int, fence: int) -> str:
            return self._process(event_pk, fence)

        self.task: Task[[int, int], str] = celery.task(
            name=task_name, acks_late=True, reject_on_worker_lost=True
        )(process_event)

    def _process(self, event_pk: int, fence: int) -> str:
        claimed = self.work.claimed(self.app.engine, event_pk, fence)
        if claimed is None:
            # Processed already, or claimed again and sent in another message.
            return "stale"
        self._processor().batches.process([claimed])
        return "processed"

    def _processor(self) -> Worker:
        """The worker whose batch processor runs the events (made per process)."""
        if self._worker is None:
            with self._lock:
                if self._worker is None:
                    name = f"celery:{socket.gethostname()}:{os.getpid()}"
                    self._worker = self.app.worker(concurrency=1, name=name)
        return self._worker

    def dispatch(self) -> int:
        """Claim up to ``batch_size`` due events and send a message for each;
        how many were sent. A send that fails gives back what was not sent."""
        if not self._migrated:
            migrate_blocking(self.app.settings.database_url)
            self._migrated = True
        claimed = self.work.claim(
            self.app.engine, self.batch_size, owner=self.owner, lease=self.lease
        )
        for n, item in enumerate(claimed):
            try:
                self._send(item)
            except Exception:
                self.work.release(self.app.engine, claimed[n:])
                raise
        return len(claimed)

    def _send(self, item: Claimed) -> None:
        self.task.apply_async((item.event.id, item.fence), **self._send_options)

    def run(self, *, poll_interval: float = 0.5, stop: threading.Event | None = None) -> None:
        """Dispatch until `stop` is set: at once while events are due, else
        every `poll_interval` seconds. Errors are logged and retried."""
        stop = stop or threading.Event()
        while not stop.is_set():
            try:
                sent = self.dispatch()
            except Exception:
                log.exception("dispatching events failed; retrying in %.1f s", poll_interval)
                sent = 0
            if sent < self.batch_size:
                stop.wait(poll_interval)
