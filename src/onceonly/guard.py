"""``once`` for any job: Celery, RQ, Dramatiq, cron, a script run twice.

Memory, not a lock (G7). "Unique job" features hold a lock while a job runs and
release it when the job ends, so the same work five minutes later runs again.
The guard remembers: a key that completed stays completed. ::

    guard = Guard("postgresql://app@db/app")

    with guard.once(f"nightly-report:{day}") as run:
        if run:
            build_and_send_report(day)

    @guard.job(lambda order_id: f"receipt:{order_id}")
    def send_receipt(order_id: int) -> str:
        return mailer.send(order_id)       # returned again, not re-sent, on a repeat

Semantics of a key:

- first call: runs; on success the key is ``done`` with the block's result
  (``run.result = ...``; the decorator records the return value when it is
  JSON-serialisable);
- later calls: skipped (the decorator returns the recorded result);
- while another caller runs it: :class:`JobInProgress` is raised, so the queue
  retries later (skipping silently would lose the work if the first one fails);
- the block raised: the key is ``failed`` and the next call runs it again;
- the runner died (SIGKILL): after its lease (renewed every third of it while
  alive) runs out, the next call takes over. A runner that lost its lease
  cannot mark the key done over the new owner (fencing).

The claim is one ``INSERT ... ON CONFLICT DO NOTHING``; take-overs are one
conditional ``UPDATE``: the database decides who runs.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

import sqlalchemy as sa

from ._exceptions import OnceonlyError
from .db import create_engine, engine_kind
from .queries import QUERIES
from .store import migrate_blocking

__all__ = ["Guard", "JobInProgress", "Run"]

P = ParamSpec("P")
T = TypeVar("T")


class JobInProgress(OnceonlyError):
    """Another live caller is running this key now; retry later."""


class Run:
    """Truthy when this caller must do the work; falsy when it was done before."""

    def __init__(self, key: str, acquired: bool, result: Any = None) -> None:
        self.key = key
        self.acquired = acquired
        #: Set it inside the block to record a JSON-serialisable result; on a
        #: skipped run it holds the result recorded by the run that did the work.
        self.result = result

    def __bool__(self) -> bool:
        return self.acquired

    def __repr__(self) -> str:
        return f"Run(key={self.key!r}, acquired={self.acquired})"


class Guard:
    """Runs blocks once per key, remembered in ``onceonly_jobs``."""

    def __init__(
        self,
        database_url: str,
        *,
        engine: sa.Engine | None = None,
        lease_seconds: float = 300.0,
    ) -> None:
        self.database_url = database_url
        self.engine = engine or create_engine(database_url)
        self.q = QUERIES[engine_kind(database_url)]
        self._migrated = False
        self.lease = lease_seconds
        self.owner = f"{socket.gethostname()}:{os.getpid()}"

    def _params(self, **extra: Any) -> dict[str, Any]:
        return {"owner": self.owner, "lease": self.lease, "now": time.time(), **extra}

    def _acquire(self, key: str) -> tuple[int | None, Any]:
        """(fence, None) when acquired; (None, recorded result) when already done."""
        if not self._migrated:
            migrate_blocking(self.database_url)  # a Celery worker may be first to run
            self._migrated = True
        with self.engine.begin() as conn:
            fence = conn.execute(sa.text(self.q.job_claim), self._params(key=key)).scalar()
        if fence is not None:
            return int(fence), None
        with self.engine.begin() as conn:
            row = conn.execute(sa.text(self.q.job_read), self._params(key=key)).first()
            if row is None:  # purged in between: claim again
                return self._acquire(key)
            if row.status == "done":
                return None, json.loads(row.result) if row.result is not None else None
            if row.status == "running" and not row.expired:
                raise JobInProgress(f"job {key!r} is running elsewhere; retry later")
            taken = conn.execute(
                sa.text(self.q.job_takeover), self._params(key=key, fence=row.fence)
            ).scalar()
        if taken is None:
            raise JobInProgress(f"job {key!r} was just taken over by another caller")
        return int(taken), None

    @contextmanager
    def once(self, key: str) -> Iterator[Run]:
        """Context manager: ``with guard.once(key) as run: if run: ...``."""
        if not key:
            raise ValueError("a job key must not be empty")
        fence, recorded = self._acquire(key)
        if fence is None:
            yield Run(key, acquired=False, result=recorded)
            return
        run = Run(key, acquired=True)
        stop = threading.Event()
        keeper = threading.Thread(
            target=self._keep, args=(key, fence, stop), name="onceonly-job-lease", daemon=True
        )
        keeper.start()
        try:
            yield run
        except BaseException as exc:
            stop.set()
            keeper.join()
            with self.engine.begin() as conn:
                conn.execute(
                    sa.text(self.q.job_fail),
                    {"key": key, "fence": fence, "error": f"{type(exc).__name__}: {exc}"[:2000]},
                )
            raise
        stop.set()
        keeper.join()
        try:
            result = json.dumps(run.result)
        except (TypeError, ValueError):
            result = None
        with self.engine.begin() as conn:
            done = conn.execute(
                sa.text(self.q.job_finish), {"key": key, "fence": fence, "result": result}
            )
        if done.rowcount != 1:
            raise JobInProgress(
                f"job {key!r}: this run's lease ran out and another caller took over; "
                "its completion was not recorded"
            )

    def job(self, key: str | Callable[..., str]) -> Callable[[Callable[P, T]], Callable[P, T]]:
        """Decorator: run the function once per key.

        `key` is a function of the call's arguments, or a format string
        (``"receipt:{0}"``, ``"import:{path}"``). A repeat returns the recorded
        result (JSON round-tripped), or ``None`` if it was not serialisable.
        """

        def decorate(fn: Callable[P, T]) -> Callable[P, T]:
            @functools.wraps(fn)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
                k = key(*args, **kwargs) if callable(key) else key.format(*args, **kwargs)
                with self.once(k) as run:
                    if not run:
                        return run.result  # type: ignore[no-any-return]
                    run.result = fn(*args, **kwargs)
                    return run.result  # type: ignore[no-any-return]

            return wrapper

        return decorate

    def _keep(self, key: str, fence: int, stop: threading.Event) -> None:
        while not stop.wait(self.lease / 3):
            try:
                with self.engine.begin() as conn:
                    conn.execute(sa.text(self.q.job_extend), self._params(key=key, fence=fence))
            except sa.exc.OperationalError:
                continue
