"""The job guard's keys in ``onceonly_jobs`` (see :mod:`onceonly.guard` for
what a key promises).

The claim is one ``INSERT ... ON CONFLICT DO NOTHING``; a take-over, a finish
and a failure are each one ``UPDATE`` conditional on the caller's ``fence``:
the database decides who runs, and a runner that lost its lease cannot mark
the key over the new owner. PostgreSQL computes times with ``now()`` on the
server; SQLite gets ``:now`` in unix seconds from the repository's clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from .engine import reading
from .errors import translated

__all__ = ["JobRecords", "JobRow"]


@dataclass(frozen=True, slots=True)
class JobRow:
    """What is recorded under a key, as seen now."""

    #: ``running``, ``done`` or ``failed``.
    status: str
    fence: int
    #: The result recorded on success (JSON), if any.
    result: str | None
    fingerprint: str | None
    #: Whether a running key's lease ran out (its runner died).
    expired: bool
    #: Whether a finished key's memory horizon passed.
    forgotten: bool


@dataclass(frozen=True, slots=True)
class _Statements:
    claim: str
    read: str
    #: A failed key, a running key whose lease ran out, or a finished key whose
    #: memory expired is taken like a new one.
    takeover: str
    finish: str
    fail: str
    extend: str
    #: Delete finished keys whose memory expired.
    purge: str
    #: The purge's own statement with its verb swapped: both always select
    #: the same rows.
    purgeable: str


def _counting(purge: str) -> str:
    return purge.replace("DELETE", "SELECT count(*)", 1)


_PURGE_POSTGRES = """
    DELETE FROM onceonly_jobs WHERE status IN ('done', 'failed') AND expires_at < now()
"""
_PURGE_SQLITE = """
    DELETE FROM onceonly_jobs WHERE status IN ('done', 'failed') AND expires_at < :now
"""

_POSTGRES = _Statements(
    claim="""
        INSERT INTO onceonly_jobs (key, status, owner, lease_expires_at, fingerprint)
        VALUES (:key, 'running', :owner, now() + make_interval(secs => :lease), :fingerprint)
        ON CONFLICT (key) DO NOTHING RETURNING fence
    """,
    read="""
        SELECT status, fence, result, fingerprint, lease_expires_at < now() AS expired,
            coalesce(expires_at < now(), false) AS forgotten
        FROM onceonly_jobs WHERE key = :key
    """,
    takeover="""
        UPDATE onceonly_jobs SET status = 'running', owner = :owner, fence = fence + 1,
            lease_expires_at = now() + make_interval(secs => :lease), runs = runs + 1,
            started_at = now(), error = NULL, fingerprint = :fingerprint, expires_at = NULL
        WHERE key = :key AND fence = :fence
            AND (status = 'failed' OR (status = 'running' AND lease_expires_at < now())
                 OR (status = 'done' AND expires_at < now()))
        RETURNING fence
    """,
    finish="""
        UPDATE onceonly_jobs SET status = 'done', result = :result, finished_at = now(),
            lease_expires_at = NULL,
            expires_at = now() + make_interval(secs => CAST(:ttl AS DOUBLE PRECISION))
        WHERE key = :key AND fence = :fence AND status = 'running'
    """,
    fail="""
        UPDATE onceonly_jobs SET status = 'failed', error = :error, finished_at = now(),
            lease_expires_at = NULL,
            expires_at = now() + make_interval(secs => CAST(:ttl AS DOUBLE PRECISION))
        WHERE key = :key AND fence = :fence AND status = 'running'
    """,
    extend="""
        UPDATE onceonly_jobs SET lease_expires_at = now() + make_interval(secs => :lease)
        WHERE key = :key AND fence = :fence AND status = 'running'
    """,
    purge=_PURGE_POSTGRES,
    purgeable=_counting(_PURGE_POSTGRES),
)

_SQLITE = _Statements(
    claim="""
        INSERT INTO onceonly_jobs (key, status, owner, lease_expires_at, fingerprint)
        VALUES (:key, 'running', :owner, :now + :lease, :fingerprint)
        ON CONFLICT (key) DO NOTHING RETURNING fence
    """,
    read="""
        SELECT status, fence, result, fingerprint, lease_expires_at < :now AS expired,
            coalesce(expires_at < :now, 0) AS forgotten
        FROM onceonly_jobs WHERE key = :key
    """,
    takeover="""
        UPDATE onceonly_jobs SET status = 'running', owner = :owner, fence = fence + 1,
            lease_expires_at = :now + :lease, runs = runs + 1,
            started_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), error = NULL,
            fingerprint = :fingerprint, expires_at = NULL
        WHERE key = :key AND fence = :fence
            AND (status = 'failed' OR (status = 'running' AND lease_expires_at < :now)
                 OR (status = 'done' AND expires_at < :now))
        RETURNING fence
    """,
    finish="""
        UPDATE onceonly_jobs SET status = 'done', result = :result, lease_expires_at = NULL,
            finished_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), expires_at = :now + :ttl
        WHERE key = :key AND fence = :fence AND status = 'running'
    """,
    fail="""
        UPDATE onceonly_jobs SET status = 'failed', error = :error, lease_expires_at = NULL,
            finished_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), expires_at = :now + :ttl
        WHERE key = :key AND fence = :fence AND status = 'running'
    """,
    extend="""
        UPDATE onceonly_jobs SET lease_expires_at = :now + :lease
        WHERE key = :key AND fence = :fence AND status = 'running'
    """,
    purge=_PURGE_SQLITE,
    purgeable=_counting(_PURGE_SQLITE),
)

_STATEMENTS = {"postgresql": _POSTGRES, "sqlite": _SQLITE}


class JobRecords:
    """The job guard's statements for one engine (stateless, thread-safe).

    Methods taking an engine run in a transaction of their own; :meth:`read`
    and :meth:`take_over` run in the caller's (:meth:`transaction`), so that
    what was read and the take-over it decided are one unit.
    """

    def __init__(self, kind: str, clock: Callable[[], float] = time.time) -> None:
        self.kind = kind
        self.clock = clock
        self._s = _STATEMENTS[kind]

    @contextmanager
    def transaction(self, engine: sa.Engine) -> Iterator[sa.Connection]:
        """A transaction on `engine`, committed when the block ends; a database
        error in it (or in its commit) leaves as a StoreError."""
        with translated("reading or taking over a job key"), engine.begin() as conn:
            yield conn

    def claim(
        self,
        engine: sa.Engine,
        key: str,
        *,
        owner: str,
        lease: float,
        fingerprint: str | None = None,
    ) -> int | None:
        """Claim a key nobody recorded yet: its fence, or None if it exists."""
        params = self._params(key=key, owner=owner, lease=lease, fingerprint=fingerprint)
        with translated("claiming a job key"), engine.begin() as conn:
            fence = conn.execute(sa.text(self._s.claim), params).scalar()
        return None if fence is None else int(fence)

    def read(self, conn: sa.Connection, key: str) -> JobRow | None:
        """What `key` holds now, or None if nothing (never claimed, or purged)."""
        with translated("reading a job key"):
            row = conn.execute(sa.text(self._s.read), self._params(key=key)).first()
        if row is None:
            return None
        return JobRow(
            status=row.status,
            fence=int(row.fence),
            result=row.result,
            fingerprint=row.fingerprint,
            # NULL (no lease, no horizon) is neither expired nor forgotten.
            expired=bool(row.expired),
            forgotten=bool(row.forgotten),
        )

    def take_over(
        self,
        conn: sa.Connection,
        key: str,
        *,
        fence: int,
        owner: str,
        lease: float,
        fingerprint: str | None = None,
    ) -> int | None:
        """Take a failed, abandoned or forgotten key whose fence is still
        `fence`: the new fence, or None if another caller came first."""
        params = self._params(
            key=key, fence=fence, owner=owner, lease=lease, fingerprint=fingerprint
        )
        with translated("taking over a job key"):
            taken = conn.execute(sa.text(self._s.takeover), params).scalar()
        return None if taken is None else int(taken)

    def finish(
        self, engine: sa.Engine, key: str, *, fence: int, result: str | None, ttl: float | None
    ) -> bool:
        """Mark a key done with `result` (JSON), remembered `ttl` seconds
        (None: forever); False if this fence no longer holds it."""
        params = self._params(key=key, fence=fence, result=result, ttl=ttl)
        with translated("finishing a job key"), engine.begin() as conn:
            return conn.execute(sa.text(self._s.finish), params).rowcount == 1

    def finish_in(
        self, conn: sa.Connection, key: str, *, fence: int, result: str | None, ttl: float | None
    ) -> bool:
        """:meth:`finish` in the caller's transaction (a keyed task's, so that
        its writes and the done mark commit together); False if this fence no
        longer holds the key."""
        params = self._params(key=key, fence=fence, result=result, ttl=ttl)
        with translated("finishing a job key"):
            return conn.execute(sa.text(self._s.finish), params).rowcount == 1

    def fail(
        self, engine: sa.Engine, key: str, *, fence: int, error: str, ttl: float | None
    ) -> bool:
        """Mark a key failed (the next call runs it again); False if this fence
        no longer holds it."""
        params = self._params(key=key, fence=fence, error=error, ttl=ttl)
        with translated("recording a failed job"), engine.begin() as conn:
            return conn.execute(sa.text(self._s.fail), params).rowcount == 1

    def extend(self, engine: sa.Engine, key: str, *, fence: int, lease: float) -> None:
        """Extend the lease of a running key this fence holds."""
        params = self._params(key=key, fence=fence, lease=lease)
        with translated("extending a job lease"), engine.begin() as conn:
            conn.execute(sa.text(self._s.extend), params)

    def purge(self, engine: sa.Engine, *, dry_run: bool = False) -> int:
        """Delete (or only count) finished keys whose memory expired; how many."""
        params = self._params()
        if dry_run:
            with translated("counting expired job keys"), reading(engine) as conn:
                return int(conn.execute(sa.text(self._s.purgeable), params).scalar_one())
        with translated("purging expired job keys"), engine.begin() as conn:
            return conn.execute(sa.text(self._s.purge), params).rowcount

    def _params(self, **values: Any) -> dict[str, Any]:
        return {"now": self.clock(), **values}
