"""Idempotency-Key records on SQLite: one transaction per batch.

SQLite has one writer: a batch runs in one ``BEGIN IMMEDIATE`` transaction
(taken ahead of the workers, like the receiver's, by the store's request
writes), on the event loop while commits are quick. Its completions are one
``executemany`` of a one-row UPDATE. Its claims take one of two ways:

- **New keys** (fresh requests, the common case): one ``executemany`` of a
  one-row ``INSERT ... ON CONFLICT DO NOTHING``, in a savepoint. When it
  inserted every key, each is a claim won, with fence 1, and nothing was read.
  When a key was already there, the savepoint is rolled back and the batch
  goes the other way.
- **Known keys** (replays, repeats in flight, take-overs): one read of the
  batch's keys; keys their record settles are answered from it and not
  written; the others go to one ``INSERT ... ON CONFLICT DO UPDATE ...
  WHERE``, which decides each.

Either way the database decides, under the write lock. The store takes the
way the last batch's keys called for: after a batch of new keys, the insert
first; after one with known keys, the read first, so that replays do not
pay for an insert that fails. See :mod:`.idempotency` for the claim's rules.

The batch goes through :meth:`SQLiteStore.write_on_request_path`, as the
receiver's deliveries do; the rest (releases, chunks, purges) through
:meth:`SQLiteStore.run_in_connection`. Both roll back what a failure left open
and turn sqlite3's errors into onceonly's.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .._exceptions import StoreError
from .idempotency import (
    CHUNKS,
    KEYS,
    RECORD_COLUMNS,
    ClaimOutcome,
    Completion,
    KeyClaim,
    KeyStore,
    answers,
    first_claims,
    outcome,
)

if TYPE_CHECKING:
    from .sqlite import SQLiteStore

__all__ = ["SQLiteKeyStore"]

_ROWS = 500  # rows per statement: 7 parameters each, far below SQLite's limit
_CLAIM = f"""
    INSERT INTO {KEYS} AS k
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
_CLAIM_ROW = "(?, ?, ?, 'running', ?, ?, ?)"
# A key the read found absent, claimed under the write lock: one row per
# execution of executemany(), which steps one prepared statement in C. For 16
# UUID4 keys a multi-row VALUES list took twice as long; for 16 numbered keys,
# which land side by side, it was a fifth quicker (docs/benchmarks.md,
# 2026-12-06). Clients send UUID4 keys.
_CLAIM_NEW = f"""
    INSERT INTO {KEYS} (scope, key, fingerprint, status, locked_until, expires_at, created_at)
    VALUES (?, ?, ?, 'running', ?, ?, ?)
    ON CONFLICT (scope, key) DO NOTHING
"""
# One row per execution of executemany(), as for _CLAIM_NEW.
_COMPLETE_ONE = f"""
    UPDATE {KEYS} SET status = 'done', response_status = ?, response_headers = ?,
        response_body = ?, chunked = ?, completed_at = ?, locked_until = NULL
    WHERE scope = ? AND key = ? AND fence = ? AND status = 'running'
"""
# CROSS JOIN keeps the VALUES list as the outer loop: one primary-key lookup
# per key (a row-value IN list would scan the table).
_READ_MANY = (
    f"SELECT {RECORD_COLUMNS}, locked_until FROM (VALUES {{rows}}) AS v CROSS JOIN {KEYS}"
    f" WHERE {KEYS}.scope = v.column1 AND {KEYS}.key = v.column2"
)
_LANDED = (
    f"SELECT scope, key FROM (VALUES {{rows}}) AS v CROSS JOIN {KEYS}"
    f" WHERE {KEYS}.scope = v.column1 AND {KEYS}.key = v.column2"
    f" AND {KEYS}.fence = v.column3 AND status = 'done' AND completed_at = ?"
)
_DROP_OLD_CHUNKS = f"DELETE FROM {CHUNKS} WHERE scope = ? AND key = ? AND fence <> ?"
_RELEASE = f"DELETE FROM {KEYS} WHERE scope = ? AND key = ? AND fence = ? AND status = 'running'"
_APPEND = f"INSERT INTO {CHUNKS} (scope, key, fence, seq, data) VALUES (?, ?, ?, ?, ?)"
_READ_CHUNKS = (
    f"SELECT data FROM {CHUNKS} WHERE scope = ? AND key = ? AND fence = ?"
    " AND seq >= ? ORDER BY seq LIMIT ?"
)
_PURGE = f"DELETE FROM {KEYS} WHERE expires_at < ?"


@functools.lru_cache(maxsize=256)
def _sql(template: str, row: str, count: int) -> str:
    """`template` with `count` VALUES rows (a few sizes recur: cached)."""
    return template.format(rows=", ".join([row] * count))


def _insert_new(
    cursor: sqlite3.Cursor, claims: Iterable[KeyClaim], now: float, lock_seconds: float, ttl: float
) -> int:
    """Insert `claims` as new running records (_CLAIM_NEW); how many went in."""
    locked_until, expires_at = now + lock_seconds, now + ttl
    rows = [(c.scope, c.key, c.fingerprint, locked_until, expires_at, now) for c in claims]
    return int(cursor.executemany(_CLAIM_NEW, rows).rowcount)


def _named(conn: sqlite3.Connection) -> sqlite3.Cursor:
    """A cursor whose rows are read by column name. The connection is the
    store's, shared with the receive path: its own row factory stays as it is."""
    cursor = conn.cursor()
    cursor.row_factory = sqlite3.Row
    return cursor


class SQLiteKeyStore(KeyStore):
    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        # Which way the next batch's claims go first (see the module's
        # docstring): the way the last batch's keys called for. A wrong guess
        # costs a failed insert or a read, never a wrong answer.
        self.expect_new = True

    async def apply(
        self,
        completions: Sequence[Completion],
        claims: Sequence[KeyClaim],
        *,
        now: float,
        lock_seconds: float,
        ttl: float,
    ) -> tuple[list[bool], list[ClaimOutcome]]:
        return await self.store.write_on_request_path(
            lambda conn: self._apply_on(conn, completions, claims, now, lock_seconds, ttl),
            size=sum(len(c.response.body or b"") for c in completions),
        )

    def _apply_on(
        self,
        conn: sqlite3.Connection,
        completions: Sequence[Completion],
        claims: Sequence[KeyClaim],
        now: float,
        lock_seconds: float,
        ttl: float,
    ) -> tuple[list[bool], list[ClaimOutcome]]:
        cursor = _named(conn)
        landed = self._complete_all(cursor, completions, now) if completions else []
        outcomes: list[ClaimOutcome] = []
        if claims:
            first = first_claims(claims)
            claimed = self._claim_new(cursor, first, now, lock_seconds, ttl)
            if claimed is not None:
                outcomes = answers(claims, first, claimed, {})
            else:
                outcomes = self._claim_all(cursor, claims, first, now, lock_seconds, ttl)
        return landed, outcomes

    def _claim_new(
        self,
        cursor: sqlite3.Cursor,
        first: dict[tuple[str, str], KeyClaim],
        now: float,
        lock_seconds: float,
        ttl: float,
    ) -> dict[tuple[str, str], int] | None:
        """Claim every key of `first` as a new record, fence 1, if none of
        them has one; otherwise write nothing and return ``None``."""
        if not self.expect_new:
            return None
        cursor.execute("SAVEPOINT onceonly_claims")
        if _insert_new(cursor, first.values(), now, lock_seconds, ttl) == len(first):
            cursor.execute("RELEASE onceonly_claims")
            return dict.fromkeys(first, 1)
        # A key has a record (a replay, a repeat, a take-over): undo the rows
        # this inserted, and let the read decide the batch.
        cursor.execute("ROLLBACK TO onceonly_claims")
        cursor.execute("RELEASE onceonly_claims")
        self.expect_new = False
        return None

    def _claim_all(
        self,
        cursor: sqlite3.Cursor,
        claims: Sequence[KeyClaim],
        first: dict[tuple[str, str], KeyClaim],
        now: float,
        lock_seconds: float,
        ttl: float,
    ) -> list[ClaimOutcome]:
        unique = list(first.values())
        # Read first (the write lock is held since BEGIN IMMEDIATE): a key
        # that is done, or running under a live lock, or bound to another
        # request, is answered from its record and not written at all. The
        # others (absent, expired, an abandoned claim of this request) go to
        # INSERT ... ON CONFLICT DO UPDATE WHERE, which decides the claim.
        records: dict[tuple[str, str], sqlite3.Row] = {}
        for i in range(0, len(unique), _ROWS):
            part = unique[i : i + _ROWS]
            sql = _sql(_READ_MANY, "(?, ?)", len(part))
            for row in cursor.execute(sql, [v for c in part for v in (c.scope, c.key)]):
                records[(row["scope"], row["key"])] = row
        existing: dict[tuple[str, str], ClaimOutcome] = {}
        attempts: list[KeyClaim] = []
        for c in unique:
            row = records.get((c.scope, c.key))
            if (
                row is not None
                and row["expires_at"] >= now
                and not (
                    row["status"] == "running"
                    and row["locked_until"] is not None
                    and row["locked_until"] < now
                    and row["fingerprint"] == c.fingerprint
                )
            ):
                existing[(c.scope, c.key)] = outcome(row)
            else:
                attempts.append(c)
        # The next batch tries the insert first again when this one's keys
        # were all new.
        self.expect_new = not records
        won: dict[tuple[str, str], int] = {}
        if not any((c.scope, c.key) in records for c in attempts):
            # No key to claim has a record: each row inserted is a claim won,
            # with fence 1, and no row needs reading back.
            if _insert_new(cursor, attempts, now, lock_seconds, ttl) != len(attempts):
                raise StoreError("idempotency keys appeared under the write lock")
            won.update(((c.scope, c.key), 1) for c in attempts)
            return answers(claims, first, won, existing)
        locked_until, expires_at = now + lock_seconds, now + ttl
        for i in range(0, len(attempts), _ROWS):
            part = attempts[i : i + _ROWS]
            params: list[Any] = []
            for c in part:
                params += (c.scope, c.key, c.fingerprint, locked_until, expires_at, now)
            sql = _sql(_CLAIM, _CLAIM_ROW, len(part))
            for row in cursor.execute(sql, params):
                won[(row["scope"], row["key"])] = row["fence"]
        lost = [c for c in attempts if (c.scope, c.key) not in won]
        for i in range(0, len(lost), _ROWS):
            part = lost[i : i + _ROWS]
            sql = _sql(_READ_MANY, "(?, ?)", len(part))
            for row in cursor.execute(sql, [v for c in part for v in (c.scope, c.key)]):
                existing[(row["scope"], row["key"])] = outcome(row)
        return answers(claims, first, won, existing)

    @staticmethod
    def _complete_all(
        cursor: sqlite3.Cursor, completions: Sequence[Completion], now: float
    ) -> list[bool]:
        rows = [
            (r.status, r.headers_json(), r.body, int(r.chunked), now, scope, key, fence)
            for scope, key, fence, r in completions
        ]
        if cursor.executemany(_COMPLETE_ONE, rows).rowcount == len(rows):
            landed = {(c.scope, c.key) for c in completions}
        else:
            # Some came from a stale owner (rare): ask which ones landed.
            landed = set()
            for i in range(0, len(completions), _ROWS):
                part = completions[i : i + _ROWS]
                sql = _sql(_LANDED, "(?, ?, ?)", len(part))
                keys = [v for c in part for v in (c.scope, c.key, c.fence)]
                found = cursor.execute(sql, [*keys, now])
                landed.update((row["scope"], row["key"]) for row in found)
        for c in completions:
            if c.response.chunked and (c.scope, c.key) in landed:
                # Chunks of an earlier owner of the key (a take-over) are no
                # longer replayable.
                cursor.execute(_DROP_OLD_CHUNKS, (c.scope, c.key, c.fence))
        return [(c.scope, c.key) in landed for c in completions]

    async def release(self, scope: str, key: str, fence: int) -> None:
        await self.store.run_in_connection(
            lambda conn: conn.execute(_RELEASE, (scope, key, fence)).close()
        )

    async def append_chunks(
        self, scope: str, key: str, fence: int, first_seq: int, chunks: Sequence[bytes]
    ) -> None:
        def run(conn: sqlite3.Connection) -> None:
            self.store.begin(conn)
            conn.executemany(
                _APPEND, [(scope, key, fence, first_seq + i, c) for i, c in enumerate(chunks)]
            )
            conn.execute("COMMIT")

        await self.store.run_in_connection(run)

    async def read_chunks(
        self, scope: str, key: str, fence: int, from_seq: int, limit: int
    ) -> list[bytes]:
        rows = await self.store.run_in_connection(
            lambda conn: (
                _named(conn).execute(_READ_CHUNKS, (scope, key, fence, from_seq, limit)).fetchall()
            )
        )
        return [bytes(row["data"]) for row in rows]

    async def purge(self, *, now: float) -> int:
        return await self.store.run_in_connection(
            lambda conn: conn.execute(_PURGE, (now,)).rowcount
        )
