"""Where Idempotency-Key records live: one table per engine, in the onceonly store.

The claim is decided by the database: ``INSERT ... ON CONFLICT (scope, key) DO
UPDATE ... WHERE`` the existing record has expired, or is in flight with a lock
that ran out *and* the same request fingerprint (a crashed request retried).
Otherwise nothing is written and the existing record is read: done (replay) or
running (409). Every take-over increments ``fence``; a completion only lands
``WHERE fence = ?``, so a stale owner cannot overwrite a newer one.
"""

from __future__ import annotations

import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from ..store import Store
from .records import ClaimOutcome, Completion, KeyClaim, StoredResponse

__all__ = ["KeyStore", "key_store_for"]

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
        return PostgresKeyStore(store)
    raise TypeError(f"no Idempotency-Key storage for a {type(store).__name__}")


_SQLITE_CLAIM = f"""
    INSERT INTO {_KEYS} AS k
        (scope, key, fingerprint, status, locked_until, expires_at, created_at)
    VALUES (?, ?, ?, 'running', ?, ?, ?)
    ON CONFLICT (scope, key) DO UPDATE SET
        fingerprint = excluded.fingerprint, status = 'running', fence = k.fence + 1,
        locked_until = excluded.locked_until, expires_at = excluded.expires_at,
        created_at = excluded.created_at, response_status = NULL, response_headers = NULL,
        response_body = NULL, chunked = 0, completed_at = NULL
    WHERE k.expires_at < excluded.created_at
       OR (k.status = 'running' AND k.locked_until < excluded.created_at
           AND k.fingerprint = excluded.fingerprint)
    RETURNING fence
"""
_COMPLETE = f"""
    UPDATE {_KEYS} SET status = 'done', response_status = ?, response_headers = ?,
        response_body = ?, chunked = ?, completed_at = ?, locked_until = NULL
    WHERE scope = ? AND key = ? AND fence = ? AND status = 'running'
"""


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
        def run(conn: sqlite3.Connection) -> tuple[list[bool], list[ClaimOutcome]]:
            conn.execute("BEGIN IMMEDIATE")
            landed = [self._complete_one(conn, c, now) for c in completions]
            outcomes = [self._claim_one(conn, c, now, lock_seconds, ttl) for c in claims]
            conn.execute("COMMIT")
            return landed, outcomes

        return await self._run(run)  # type: ignore[no-any-return]

    @staticmethod
    def _claim_one(
        conn: sqlite3.Connection, c: KeyClaim, now: float, lock_seconds: float, ttl: float
    ) -> ClaimOutcome:
        row = conn.execute(
            _SQLITE_CLAIM, (c.scope, c.key, c.fingerprint, now + lock_seconds, now + ttl, now)
        ).fetchone()
        if row is not None:
            return ClaimOutcome("acquired", row[0], c.fingerprint)
        existing = conn.execute(f"{_READ} WHERE scope = ? AND key = ?", (c.scope, c.key))
        return _outcome(existing.fetchone())

    @staticmethod
    def _complete_one(conn: sqlite3.Connection, c: Completion, now: float) -> bool:
        r = c.response
        cur = conn.execute(
            _COMPLETE,
            (r.status, r.headers_json(), r.body, int(r.chunked), now, c.scope, c.key, c.fence),
        )
        if r.chunked and cur.rowcount == 1:
            conn.execute(
                f"DELETE FROM {_CHUNKS} WHERE scope = ? AND key = ? AND fence <> ?",
                (c.scope, c.key, c.fence),
            )
        return cur.rowcount == 1

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
            conn.execute("BEGIN IMMEDIATE")
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


class PostgresKeyStore(KeyStore):
    _CLAIM = f"""
        INSERT INTO {_KEYS} AS k
            (scope, key, fingerprint, status, locked_until, expires_at, created_at)
        SELECT s, k, f, 'running', $4::float8 + $5::float8, $4::float8 + $6::float8, $4::float8
        FROM unnest($1::text[], $2::text[], $3::text[]) AS u(s, k, f)
        ON CONFLICT (scope, key) DO UPDATE SET
            fingerprint = excluded.fingerprint, status = 'running', fence = k.fence + 1,
            locked_until = excluded.locked_until, expires_at = excluded.expires_at,
            created_at = excluded.created_at, response_status = NULL,
            response_headers = NULL, response_body = NULL, chunked = false, completed_at = NULL
        WHERE k.expires_at < excluded.created_at
           OR (k.status = 'running' AND k.locked_until < excluded.created_at
               AND k.fingerprint = excluded.fingerprint)
        RETURNING scope, key, fence
    """
    _READ_MANY = f"""
        {_READ} WHERE (scope, key) IN (SELECT * FROM unnest($1::text[], $2::text[]))
    """
    _COMPLETE = f"""
        UPDATE {_KEYS} AS k SET status = 'done', response_status = c.st,
            response_headers = c.h, response_body = c.b, chunked = c.ch,
            completed_at = $8::float8, locked_until = NULL
        FROM unnest($1::text[], $2::text[], $3::bigint[], $4::int[], $5::text[], $6::bytea[],
                    $7::bool[]) AS c(s, k, f, st, h, b, ch)
        WHERE k.scope = c.s AND k.key = c.k AND k.fence = c.f AND k.status = 'running'
        RETURNING k.scope, k.key
    """

    def __init__(self, store: Any) -> None:
        self.store = store

    async def apply(
        self,
        completions: Sequence[Completion],
        claims: Sequence[KeyClaim],
        *,
        now: float,
        lock_seconds: float,
        ttl: float,
    ) -> tuple[list[bool], list[ClaimOutcome]]:
        async with self.store._connection() as conn, conn.transaction():
            landed = await self._complete_on(conn, completions, now) if completions else []
            outcomes = await self._claim_on(conn, claims, now, lock_seconds, ttl) if claims else []
        return landed, outcomes

    async def _claim_on(
        self, conn: Any, claims: Sequence[KeyClaim], now: float, lock_seconds: float, ttl: float
    ) -> list[ClaimOutcome]:
        # ON CONFLICT DO UPDATE may not touch one row twice in a statement:
        # repeats of a key within the batch are answered from the first.
        first: dict[tuple[str, str], KeyClaim] = {}
        for c in claims:
            first.setdefault((c.scope, c.key), c)
        unique = list(first.values())
        won = {
            (r["scope"], r["key"]): r["fence"]
            for r in await conn.fetch(
                self._CLAIM,
                [c.scope for c in unique],
                [c.key for c in unique],
                [c.fingerprint for c in unique],
                now,
                lock_seconds,
                ttl,
            )
        }
        lost = [c for c in unique if (c.scope, c.key) not in won]
        existing = {}
        if lost:
            for row in await conn.fetch(
                self._READ_MANY, [c.scope for c in lost], [c.key for c in lost]
            ):
                existing[(row["scope"], row["key"])] = _outcome(tuple(row))
        outcomes = []
        answered: set[tuple[str, str]] = set()
        for c in claims:
            ident = (c.scope, c.key)
            if ident in won and ident not in answered:
                outcomes.append(ClaimOutcome("acquired", won[ident], c.fingerprint))
            elif ident in won:
                outcomes.append(ClaimOutcome("running", won[ident], first[ident].fingerprint))
            else:
                outcomes.append(existing[ident])
            answered.add(ident)
        return outcomes

    async def _complete_on(
        self, conn: Any, completions: Sequence[Completion], now: float
    ) -> list[bool]:
        landed = {
            (r["scope"], r["key"])
            for r in await conn.fetch(
                self._COMPLETE,
                [c.scope for c in completions],
                [c.key for c in completions],
                [c.fence for c in completions],
                [c.response.status for c in completions],
                [c.response.headers_json() for c in completions],
                [c.response.body for c in completions],
                [c.response.chunked for c in completions],
                now,
            )
        }
        for c in completions:
            if c.response.chunked and (c.scope, c.key) in landed:
                await conn.execute(
                    f"DELETE FROM {_CHUNKS} WHERE scope = $1 AND key = $2 AND fence <> $3",
                    c.scope,
                    c.key,
                    c.fence,
                )
        return [(c.scope, c.key) in landed for c in completions]

    async def release(self, scope: str, key: str, fence: int) -> None:
        async with self.store._connection() as conn:
            await conn.execute(
                f"DELETE FROM {_KEYS} WHERE scope = $1 AND key = $2 AND fence = $3"
                " AND status = 'running'",
                scope,
                key,
                fence,
            )

    async def append_chunks(
        self, scope: str, key: str, fence: int, first_seq: int, chunks: Sequence[bytes]
    ) -> None:
        async with self.store._connection() as conn:
            await conn.executemany(
                f"INSERT INTO {_CHUNKS} (scope, key, fence, seq, data) VALUES ($1, $2, $3, $4, $5)",
                [(scope, key, fence, first_seq + i, c) for i, c in enumerate(chunks)],
            )

    async def read_chunks(
        self, scope: str, key: str, fence: int, from_seq: int, limit: int
    ) -> list[bytes]:
        async with self.store._connection() as conn:
            rows = await conn.fetch(
                f"SELECT data FROM {_CHUNKS} WHERE scope = $1 AND key = $2 AND fence = $3"
                " AND seq >= $4 ORDER BY seq LIMIT $5",
                scope,
                key,
                fence,
                from_seq,
                limit,
            )
        return [bytes(r["data"]) for r in rows]

    async def purge(self, *, now: float) -> int:
        async with self.store._connection() as conn:
            result = await conn.execute(f"DELETE FROM {_KEYS} WHERE expires_at < $1", now)
        return int(result.split()[-1])
