"""``once`` for any job: Celery, RQ, Dramatiq, cron, a script run twice.

Memory, not a lock (G7). "Unique job" features hold a lock while a job runs and
release it when the job ends, so the same work five minutes later runs again.
The guard remembers: a key that completed stays completed. ::

    guard = Guard("postgresql://app@db/app")

    with guard.once(f"nightly-report:{day}") as run:
        if run:
            build_and_send_report(day)

    async with guard.aonce(f"nightly-report:{day}") as run:   # the same, async
        if run:
            await build_and_send_report(day)

    @guard.job(lambda order_id: f"receipt:{order_id}")
    def send_receipt(order_id: int) -> str:      # or an ``async def``
        return mailer.send(order_id)       # returned again, not re-sent, on a repeat

Semantics of a key:

- first call: runs; on success the key is ``done`` with the block's result
  (``run.result = ...``; the decorator records the return value when it is
  JSON-serialisable);
- later calls: skipped (the decorator returns the recorded result);
- a later call with other arguments (the decorator fingerprints them; ``once``
  takes ``fingerprint=``): :class:`JobConflict`, never another call's result;
- while another caller runs it: :class:`JobInProgress` is raised, so the queue
  retries later (skipping silently would lose the work if the first one fails);
- the block raised: the key is ``failed`` and the next call runs it again;
- the runner died (SIGKILL): after its lease (renewed every third of it while
  alive) runs out, the next call takes over. A runner that lost its lease
  cannot mark the key done over the new owner (fencing);
- memory has a horizon: a finished key is remembered for ``ttl_seconds``
  (30 days by default; ``None`` keeps it until deleted), then a call runs it
  again, and :meth:`Guard.purge` (also run by ``onceonly purge``) deletes it.
  Pick a horizon longer than any repeat you need to stop.

The claim is one ``INSERT ... ON CONFLICT DO NOTHING``; take-overs are one
conditional ``UPDATE``: the database decides who runs. The statements are
:class:`~onceonly.store.jobs.JobRecords`'; a database error leaves the guard as
a :class:`~onceonly.StoreError`.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import json
import os
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from ._exceptions import JobConflict, JobInProgress, StoreError
from .db import create_engine, engine_kind
from .store import migrate_blocking
from .store.jobs import JobRecords

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = ["DEFAULT_TTL", "Guard", "Held", "JobConflict", "JobInProgress", "Run", "fingerprint_of"]

P = ParamSpec("P")
T = TypeVar("T")

#: How long a finished key is remembered by default: 30 days.
DEFAULT_TTL = 30 * 86400.0


def fingerprint_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A stable digest of a call's arguments (JSON; other values by ``repr``)."""
    encoded = json.dumps([list(args), kwargs], sort_keys=True, default=repr)
    return hashlib.sha256(encoded.encode()).hexdigest()[:32]


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


@dataclass
class Held:
    """A key this caller runs: its fence and the thread keeping its lease."""

    key: str
    fence: int
    stop: threading.Event
    keeper: threading.Thread

    def release(self) -> None:
        """Stop renewing the lease: the run ended (or is about to be recorded)."""
        self.stop.set()
        self.keeper.join()


class Guard:
    """Runs blocks once per key, remembered in ``onceonly_jobs``."""

    def __init__(
        self,
        database_url: str,
        *,
        engine: sa.Engine | None = None,
        lease_seconds: float = 300.0,
        ttl_seconds: float | None = DEFAULT_TTL,
    ) -> None:
        if ttl_seconds is not None and ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive, or None to remember forever")
        self.database_url = database_url
        self.engine = engine or create_engine(database_url)
        self.records = JobRecords(engine_kind(database_url))
        self._migrated = False
        self.lease = lease_seconds
        self.ttl = ttl_seconds
        self.owner = f"{socket.gethostname()}:{os.getpid()}"

    def _acquire(self, key: str, fingerprint: str | None = None) -> tuple[int | None, Any]:
        """(fence, None) when acquired; (None, recorded result) when already done."""
        if not self._migrated:
            migrate_blocking(self.database_url)  # a Celery worker may be first to run
            self._migrated = True
        fence = self.records.claim(
            self.engine, key, owner=self.owner, lease=self.lease, fingerprint=fingerprint
        )
        if fence is not None:
            return fence, None
        with self.records.transaction(self.engine) as conn:
            row = self.records.read(conn, key)
            if row is None:  # purged in between: claim again
                return self._acquire(key, fingerprint)
            if row.status == "done" and not row.forgotten:
                if fingerprint and row.fingerprint and row.fingerprint != fingerprint:
                    raise JobConflict(
                        f"job {key!r} was done for a call with other arguments; "
                        "use a key that names everything the job depends on"
                    )
                return None, json.loads(row.result) if row.result is not None else None
            if row.status == "running" and not row.expired:
                raise JobInProgress(f"job {key!r} is running elsewhere; retry later")
            taken = self.records.take_over(
                conn,
                key,
                fence=row.fence,
                owner=self.owner,
                lease=self.lease,
                fingerprint=fingerprint,
            )
        if taken is None:
            raise JobInProgress(f"job {key!r} was just taken over by another caller")
        return taken, None

    def start(self, key: str, fingerprint: str | None = None) -> tuple[Run, Held | None]:
        """Claim `key`: ``(run, held)`` when this caller must run it (its lease
        renewed until ``held.release()``), ``(run, None)`` when it was done
        (``run.result`` is the recorded result). Raises :class:`JobInProgress`
        or :class:`JobConflict` as :meth:`once` does. For runners that record
        the completion themselves (:mod:`onceonly.tasks`); most code wants
        :meth:`once`."""
        if not key:
            raise ValueError("a job key must not be empty")
        fence, recorded = self._acquire(key, fingerprint)
        if fence is None:
            return Run(key, acquired=False, result=recorded), None
        stop = threading.Event()
        keeper = threading.Thread(
            target=self._keep, args=(key, fence, stop), name="onceonly-job-lease", daemon=True
        )
        keeper.start()
        return Run(key, acquired=True), Held(key, fence, stop, keeper)

    def record_failure(self, held: Held, exc: BaseException, ttl: float | None) -> None:
        """Mark a held key failed with `exc` (the next call runs it again)."""
        error = f"{type(exc).__name__}: {exc}"[:2000]
        self.records.fail(self.engine, held.key, fence=held.fence, error=error, ttl=ttl)

    def _end(self, held: Held, run: Run, exc: BaseException | None, ttl: float | None) -> None:
        held.release()
        if exc is not None:
            self.record_failure(held, exc, ttl)
            return
        try:
            result = json.dumps(run.result)
        except (TypeError, ValueError):
            result = None
        if not self.records.finish(self.engine, held.key, fence=held.fence, result=result, ttl=ttl):
            raise JobInProgress(
                f"job {held.key!r}: this run's lease ran out and another caller took over; "
                "its completion was not recorded"
            )

    def horizon(self, ttl: float | None) -> float | None:
        """How long a key finished now is remembered: `ttl`, or the guard's."""
        if ttl is not None and ttl <= 0:
            raise ValueError("ttl must be positive")
        return self.ttl if ttl is None else ttl

    @contextmanager
    def once(
        self, key: str, *, fingerprint: str | None = None, ttl: float | None = None
    ) -> Iterator[Run]:
        """Context manager: ``with guard.once(key) as run: if run: ...``.

        `fingerprint` (any string naming the call's inputs) makes a later call
        of the same key with another fingerprint raise :class:`JobConflict`;
        `ttl` overrides the guard's memory horizon for this key.
        """
        ttl = self.horizon(ttl)
        run, held = self.start(key, fingerprint)
        if held is None:
            yield run
            return
        try:
            yield run
        except BaseException as exc:
            self._end(held, run, exc, ttl)
            raise
        self._end(held, run, None, ttl)

    @asynccontextmanager
    async def aonce(
        self, key: str, *, fingerprint: str | None = None, ttl: float | None = None
    ) -> AsyncIterator[Run]:
        """:meth:`once` for async code: ``async with guard.aonce(key) as run:``.

        The database calls run in a thread, so the event loop never waits on them.
        """
        ttl = self.horizon(ttl)
        run, held = await asyncio.to_thread(self.start, key, fingerprint)
        if held is None:
            yield run
            return
        try:
            yield run
        except BaseException as exc:
            await asyncio.to_thread(self._end, held, run, exc, ttl)
            raise
        await asyncio.to_thread(self._end, held, run, None, ttl)

    def job(
        self,
        key: str | Callable[..., str],
        *,
        fingerprint: bool | Callable[..., str] = True,
        ttl: float | None = None,
    ) -> Callable[[Callable[P, T]], Callable[P, T]]:
        """Decorator: run the function (sync or ``async def``) once per key.

        `key` is a function of the call's arguments, or a format string
        (``"receipt:{0}"``, ``"import:{path}"``). A repeat returns the recorded
        result (JSON round-tripped), or ``None`` if it was not serialisable. A
        repeat with other arguments raises :class:`JobConflict`: `fingerprint`
        (by default :func:`fingerprint_of` the arguments) is a function of them
        to compare instead, or False to compare nothing.
        """

        def names(*args: Any, **kwargs: Any) -> tuple[str, str | None]:
            k = key(*args, **kwargs) if callable(key) else key.format(*args, **kwargs)
            if fingerprint is True:
                return k, fingerprint_of(args, kwargs)
            return k, fingerprint(*args, **kwargs) if callable(fingerprint) else None

        def decorate(fn: Callable[P, T]) -> Callable[P, T]:
            if inspect.iscoroutinefunction(fn):
                coroutine_fn = cast(Callable[..., Awaitable[Any]], fn)

                @functools.wraps(fn)
                async def awrapper(*args: Any, **kwargs: Any) -> Any:
                    k, fp = names(*args, **kwargs)
                    async with self.aonce(k, fingerprint=fp, ttl=ttl) as run:
                        if run:
                            run.result = await coroutine_fn(*args, **kwargs)
                        return run.result

                return cast(Callable[P, T], awrapper)

            @functools.wraps(fn)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
                k, fp = names(*args, **kwargs)
                with self.once(k, fingerprint=fp, ttl=ttl) as run:
                    if not run:
                        return run.result  # type: ignore[no-any-return]
                    run.result = fn(*args, **kwargs)
                    return run.result  # type: ignore[no-any-return]

            return wrapper

        return decorate

    def purge(self, *, dry_run: bool = False) -> int:
        """Delete (or count) finished keys whose memory expired; how many."""
        if not self._migrated:
            migrate_blocking(self.database_url)
            self._migrated = True
        return self.records.purge(self.engine, dry_run=dry_run)

    def _keep(self, key: str, fence: int, stop: threading.Event) -> None:
        while not stop.wait(self.lease / 3):
            try:
                self.records.extend(self.engine, key, fence=fence, lease=self.lease)
            except StoreError:
                continue  # the lease may run out; fencing keeps a take-over safe
