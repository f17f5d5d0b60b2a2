"""Where Idempotency-Key records live: one table per engine, in the onceonly store.

The claim is decided by the database: ``INSERT ... ON CONFLICT (scope, key) DO
UPDATE ... WHERE`` the existing record has expired, or is in flight with a lock
that ran out *and* the same request fingerprint (a crashed request retried).
Otherwise nothing is written and the existing record is read: done (replay) or
running (409). Every take-over increments ``fence``; a completion only lands
``WHERE fence = ?``, so a stale owner cannot overwrite a newer one.

Records are read before the claim (in the same statement on PostgreSQL, under
the write lock on SQLite), so that keys the record already answers are not
written at all; only absent, expired or abandoned keys reach the INSERT. A
batch costs one round trip on PostgreSQL and one transaction on SQLite.
"""

from __future__ import annotations

import functools
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from .._exceptions import StoreError
from ..batching import ThreadGroupCommit
from ..store import Store
from .records import ClaimOutcome, Completion, KeyClaim, StoredResponse

__all__ = ["KeyStore", "SQLiteKeyStore", "in_order", "key_store_for", "split"]

_KEYS = "onceonly_idempotency_keys"
_CHUNKS = "onceonly_idempotency_chunks"
_READ = (
    f"SELECT scope, key, fingerprint, status, fence, response_status, response_headers,"
    f" response_body, chunked, expires_at FROM {_KEYS}"
)


def _outcome(row: Any) -> ClaimOutcome:
    response = None
    if row[3] == "done":
        body = None if row[8] else bytes(row[7] or b"")
        response = StoredResponse.from_columns(row[5], row[6], body)
    return ClaimOutcome(row[3], int(row[4]), row[2], response, float(row[9]))


class KeyStore(ABC):
    @abstractmethod
    async def apply(
        self,
        completions: Sequence[Completion],
        claims: Sequence[KeyClaim],
        *,
        now: float,
        lock_seconds: float,
        ttl: float,
    ) -> tuple[list[bool], list[ClaimOutcome]]:
        """Store responses, then claim keys, in one transaction: one commit
        serves both kinds (group commit batches them together).

        For each completion, False where the claim was lost (stale owner). For
        each claim, its outcome, in order; the same (scope, key) twice in a
        batch: the first claims, the next see it running. Completions go first
        so that a claim of a key completed in the same batch sees it done."""

    async def claim(
        self, claims: Sequence[KeyClaim], *, now: float, lock_seconds: float, ttl: float
    ) -> list[ClaimOutcome]:
        return (await self.apply([], claims, now=now, lock_seconds=lock_seconds, ttl=ttl))[1]

    async def complete(self, completions: Sequence[Completion], *, now: float) -> list[bool]:
        return (await self.apply(completions, [], now=now, lock_seconds=0, ttl=0))[0]

    @abstractmethod
    async def release(self, scope: str, key: str, fence: int) -> None:
        """Forget a claim whose response is not to be stored."""

    @abstractmethod
    async def append_chunks(
        self, scope: str, key: str, fence: int, first_seq: int, chunks: Sequence[bytes]
    ) -> None: ...

    @abstractmethod
    async def read_chunks(
        self, scope: str, key: str, fence: int, from_seq: int, limit: int
    ) -> list[bytes]: ...

    @abstractmethod
    async def purge(self, *, now: float) -> int:
        """Delete expired records; return how many."""


def key_store_for(store: Store) -> KeyStore:
    from ..store.postgres import PostgresStore
    from ..store.sqlite import SQLiteStore

    if isinstance(store, SQLiteStore):
        return SQLiteKeyStore(store)
    if isinstance(store, PostgresStore):
        from .postgres import PostgresKeyStore

        return PostgresKeyStore(store)
    raise TypeError(f"no Idempotency-Key storage for a {type(store).__name__}")


# SQLite has one writer: a batch runs in one BEGIN IMMEDIATE transaction on
# the store's thread, with one multi-row statement for its completions and one
# for its claims (each statement a single hand-off of the GIL, not one per row).
_SQLITE_ROWS = 500  # rows per statement: 7 parameters each, far below SQLite's limit
_SQLITE_CLAIM = f"""
    INSERT INTO {_KEYS} AS k
        (scope, key, fingerprint, status, locked_until, expires_at, created_at)
    VALUES {{rows}}
    ON CONFLICT (scope, key) DO UPDATE SET
        fingerprint = excluded.fingerprint, status = 'running', fence = k.fence + 1,
        locked_until = excluded.locked_until, expires_at = excluded.expires_at,
        created_at = excluded.created_at, response_status = NULL, response_headers = NULL,
        response_body = NULL, chunked = 0, completed_at = NULL
    WHERE k.expires_at < excluded.created_at
       OR (k.status = 'running' AND k.locked_until < excluded.created_at
           AND k.fingerprint = excluded.fingerprint)
    RETURNING scope, key, fence
"""
_SQLITE_CLAIM_ROW = "(?, ?, ?, 'running', ?, ?, ?)"
# column1..column7 of the VALUES list: scope, key, fence, status, headers, body, chunked.
_SQLITE_COMPLETE = f"""
    UPDATE {_KEYS} SET status = 'done', response_status = c.column4,
        response_headers = c.column5, response_body = c.column6, chunked = c.column7,
        completed_at = ?, locked_until = NULL
    FROM (VALUES {{rows}}) AS c
    WHERE {_KEYS}.scope = c.column1 AND {_KEYS}.key = c.column2
      AND {_KEYS}.fence = c.column3 AND {_KEYS}.status = 'running'
    RETURNING scope, key
"""
_SQLITE_COMPLETE_ROW = "(?, ?, ?, ?, ?, ?, ?)"
# CROSS JOIN keeps the VALUES list as the outer loop: one primary-key lookup
# per key (a row-value IN list would scan the table).
# locked_until comes last (index 10), after the columns _outcome() reads.
_SQLITE_READ_MANY = _READ.replace(
    f"FROM {_KEYS}",
    f", locked_until FROM (VALUES {{rows}}) AS v CROSS JOIN {_KEYS}"
    f" WHERE {_KEYS}.scope = v.column1 AND {_KEYS}.key = v.column2",
)
# Statement results cost the GIL once per row on this thread, while the event
# loop wants it too: the common cases below run without RETURNING and learn
# their outcome from the row count (see _claim_all and _complete_all).
_SQLITE_CLAIM_QUIET = _SQLITE_CLAIM.replace("RETURNING scope, key, fence", "")
_SQLITE_COMPLETE_QUIET = _SQLITE_COMPLETE.replace("RETURNING scope, key", "")
_SQLITE_LANDED = (
    f"SELECT scope, key FROM (VALUES {{rows}}) AS v CROSS JOIN {_KEYS}"
    f" WHERE {_KEYS}.scope = v.column1 AND {_KEYS}.key = v.column2"
    f" AND {_KEYS}.fence = v.column3 AND status = 'done' AND completed_at = ?"
)


@functools.lru_cache(maxsize=256)
def _sqlite_sql(template: str, row: str, count: int) -> str:
    """`template` with `count` VALUES rows (a few sizes recur: cached)."""
    return template.format(rows=", ".join([row] * count))


def split(ops: Sequence[KeyClaim | Completion]) -> tuple[list[Completion], list[KeyClaim]]:
    """A group-commit batch as the two arguments of `apply`."""
    completions = [op for op in ops if isinstance(op, Completion)]
    claims = [op for op in ops if isinstance(op, KeyClaim)]
    return completions, claims


def in_order(
    ops: Sequence[KeyClaim | Completion], landed: list[bool], outcomes: list[ClaimOutcome]
) -> list[ClaimOutcome | bool]:
    """The answers of `apply` put back in the order of the batch's items."""
    landed_it, outcome_it = iter(landed), iter(outcomes)
    return [next(landed_it) if isinstance(op, Completion) else next(outcome_it) for op in ops]


def _unique(claims: Sequence[KeyClaim]) -> dict[tuple[str, str], KeyClaim]:
    """The first claim of each (scope, key): ON CONFLICT may not touch a row
    twice in one statement, so repeats within a batch are answered from it."""
    first: dict[tuple[str, str], KeyClaim] = {}
    for c in claims:
        first.setdefault((c.scope, c.key), c)
    return first


def _answers(
    claims: Sequence[KeyClaim],
    first: dict[tuple[str, str], KeyClaim],
    won: dict[tuple[str, str], int],
    existing: dict[tuple[str, str], ClaimOutcome],
) -> list[ClaimOutcome]:
    outcomes = []
    answered: set[tuple[str, str]] = set()
    for c in claims:
        ident = (c.scope, c.key)
        if ident in won:
            fp = first[ident].fingerprint
            if ident in answered:  # a repeat within the batch: the first runs it
                outcomes.append(ClaimOutcome("running", won[ident], fp))
            else:
                outcomes.append(ClaimOutcome("acquired", won[ident], fp))
        elif ident in existing:
            outcomes.append(existing[ident])
        else:
            # Lost the claim, then the record went away before it could be
            # read (released after a 4xx): "in progress", the client retries.
            outcomes.append(ClaimOutcome("running", 0, c.fingerprint))
        answered.add(ident)
    return outcomes


class SQLiteKeyStore(KeyStore):
    def __init__(self, store: Any) -> None:
        self.store = store

    async def _run(self, fn: Any) -> Any:
        await self.store.open()  # creates the tables on first use; then free
        return await self.store._run(fn)

    async def apply(
        self,
        completions: Sequence[Completion],
        claims: Sequence[KeyClaim],
        *,
        now: float,
        lock_seconds: float,
        ttl: float,
    ) -> tuple[list[bool], list[ClaimOutcome]]:
        return await self._run(  # type: ignore[no-any-return]
            lambda conn: self._apply_on(conn, completions, claims, now, lock_seconds, ttl)
        )

    def group_commit(
        self, *, lock_seconds: float, ttl: float
    ) -> ThreadGroupCommit[KeyClaim | Completion, ClaimOutcome | bool]:
        """Batches of claims and completions, committed back to back on the
        store's thread (see ThreadGroupCommit)."""

        def apply(ops: Sequence[KeyClaim | Completion]) -> list[ClaimOutcome | bool]:
            completions, claims = split(ops)
            landed, outcomes = self.store._call(
                lambda conn: self._apply_on(
                    conn, completions, claims, time.time(), lock_seconds, ttl
                )
            )
            return in_order(ops, landed, outcomes)

        async def schedule(fn: Callable[[], None]) -> None:
            await self.store.open()
            await self.store._run(lambda conn: fn())

        return ThreadGroupCommit(apply, schedule)

    def _apply_on(
        self,
        conn: sqlite3.Connection,
        completions: Sequence[Completion],
        claims: Sequence[KeyClaim],
        now: float,
        lock_seconds: float,
        ttl: float,
    ) -> tuple[list[bool], list[ClaimOutcome]]:
        # On the request path like the receiver: ahead of the workers.
        self.store.begin(conn)
        landed = self._complete_all(conn, completions, now) if completions else []
        outcomes = self._claim_all(conn, claims, now, lock_seconds, ttl) if claims else []
        conn.execute("COMMIT")
        return landed, outcomes

    @staticmethod
    def _claim_all(
        conn: sqlite3.Connection,
        claims: Sequence[KeyClaim],
        now: float,
        lock_seconds: float,
        ttl: float,
    ) -> list[ClaimOutcome]:
        first = _unique(claims)
        unique = list(first.values())
        # Read first (the write lock is held since BEGIN IMMEDIATE): a key
        # that is done, or running under a live lock, or bound to another
        # request, is answered from its record and not written at all. The
        # others (absent, expired, an abandoned claim of this request) go to
        # INSERT ... ON CONFLICT DO UPDATE WHERE, which decides the claim.
        records: dict[tuple[str, str], Any] = {}
        for i in range(0, len(unique), _SQLITE_ROWS):
            part = unique[i : i + _SQLITE_ROWS]
            sql = _sqlite_sql(_SQLITE_READ_MANY, "(?, ?)", len(part))
            for row in conn.execute(sql, [v for c in part for v in (c.scope, c.key)]):
                records[(row[0], row[1])] = row
        existing: dict[tuple[str, str], ClaimOutcome] = {}
        attempts: list[KeyClaim] = []
        for c in unique:
            row = records.get((c.scope, c.key))
            if (
                row is not None
                and row[9] >= now
                and not (
                    row[3] == "running"
                    and row[10] is not None
                    and row[10] < now
                    and row[2] == c.fingerprint
                )
            ):
                existing[(c.scope, c.key)] = _outcome(row)
            else:
                attempts.append(c)
        won: dict[tuple[str, str], int] = {}
        locked_until, expires_at = now + lock_seconds, now + ttl
        quiet = not any((c.scope, c.key) in records for c in attempts)
        for i in range(0, len(attempts), _SQLITE_ROWS):
            part = attempts[i : i + _SQLITE_ROWS]
            params: list[Any] = []
            for c in part:
                params += (c.scope, c.key, c.fingerprint, locked_until, expires_at, now)
            if quiet:
                # New keys only: each row inserted is a claim won, with fence 1.
                sql = _sqlite_sql(_SQLITE_CLAIM_QUIET, _SQLITE_CLAIM_ROW, len(part))
                if conn.execute(sql, params).rowcount != len(part):
                    raise StoreError("idempotency keys appeared under the write lock")
                won.update(((c.scope, c.key), 1) for c in part)
                continue
            sql = _sqlite_sql(_SQLITE_CLAIM, _SQLITE_CLAIM_ROW, len(part))
            for scope, key, fence in conn.execute(sql, params):
                won[(scope, key)] = fence
        lost = [c for c in attempts if (c.scope, c.key) not in won]
        for i in range(0, len(lost), _SQLITE_ROWS):
            part = lost[i : i + _SQLITE_ROWS]
            sql = _sqlite_sql(_SQLITE_READ_MANY, "(?, ?)", len(part))
            for row in conn.execute(sql, [v for c in part for v in (c.scope, c.key)]):
                existing[(row[0], row[1])] = _outcome(row)
        return _answers(claims, first, won, existing)

    @staticmethod
    def _complete_all(
        conn: sqlite3.Connection, completions: Sequence[Completion], now: float
    ) -> list[bool]:
        landed: set[tuple[str, str]] = set()
        for i in range(0, len(completions), _SQLITE_ROWS):
            part = completions[i : i + _SQLITE_ROWS]
            params: list[Any] = [now]
            for c in part:
                r = c.response
                params += (
                    c.scope, c.key, c.fence, r.status, r.headers_json(), r.body, int(r.chunked)
                )  # fmt: skip
            sql = _sqlite_sql(_SQLITE_COMPLETE_QUIET, _SQLITE_COMPLETE_ROW, len(part))
            if conn.execute(sql, params).rowcount == len(part):
                landed.update((c.scope, c.key) for c in part)
                continue
            # Some came from a stale owner (rare): ask which ones landed.
            sql = _sqlite_sql(_SQLITE_LANDED, "(?, ?, ?)", len(part))
            keys = [v for c in part for v in (c.scope, c.key, c.fence)]
            landed.update(conn.execute(sql, [*keys, now]))
        for c in completions:
            if c.response.chunked and (c.scope, c.key) in landed:
                conn.execute(
                    f"DELETE FROM {_CHUNKS} WHERE scope = ? AND key = ? AND fence <> ?",
                    (c.scope, c.key, c.fence),
                )
        return [(c.scope, c.key) in landed for c in completions]

    async def release(self, scope: str, key: str, fence: int) -> None:
        def run(conn: sqlite3.Connection) -> None:
            conn.execute(
                f"DELETE FROM {_KEYS} WHERE scope = ? AND key = ? AND fence = ?"
                " AND status = 'running'",
                (scope, key, fence),
            )

        await self._run(run)

    async def append_chunks(
        self, scope: str, key: str, fence: int, first_seq: int, chunks: Sequence[bytes]
    ) -> None:
        def run(conn: sqlite3.Connection) -> None:
            self.store.begin(conn)
            conn.executemany(
                f"INSERT INTO {_CHUNKS} (scope, key, fence, seq, data) VALUES (?, ?, ?, ?, ?)",
                [(scope, key, fence, first_seq + i, c) for i, c in enumerate(chunks)],
            )
            conn.execute("COMMIT")

        await self._run(run)

    async def read_chunks(
        self, scope: str, key: str, fence: int, from_seq: int, limit: int
    ) -> list[bytes]:
        rows = await self._run(
            lambda conn: conn.execute(
                f"SELECT data FROM {_CHUNKS} WHERE scope = ? AND key = ? AND fence = ?"
                " AND seq >= ? ORDER BY seq LIMIT ?",
                (scope, key, fence, from_seq, limit),
            ).fetchall()
        )
        return [bytes(r[0]) for r in rows]

    async def purge(self, *, now: float) -> int:
        def run(conn: sqlite3.Connection) -> int:
            return conn.execute(f"DELETE FROM {_KEYS} WHERE expires_at < ?", (now,)).rowcount

        return await self._run(run)  # type: ignore[no-any-return]
