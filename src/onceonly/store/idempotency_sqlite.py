"""Idempotency-Key records on SQLite: one transaction per batch, on the store's thread.

SQLite has one writer: a batch runs in one ``BEGIN IMMEDIATE`` transaction
(taken through :meth:`SQLiteStore.begin`, ahead of the workers, like the
receiver) on the store's thread, with one multi-row statement for its
completions and one for its claims (each statement a single hand-off of the
GIL, not one per row). See :mod:`.idempotency` for the claim's rules.

Everything runs through :meth:`SQLiteStore.run_in_connection` (or
``call_in_connection`` on that thread), which rolls back what a failure left
open and turns sqlite3's errors into onceonly's, as for the receive path.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
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
# column1..column7 of the VALUES list: scope, key, fence, status, headers, body, chunked.
_COMPLETE = f"""
    UPDATE {KEYS} SET status = 'done', response_status = c.column4,
        response_headers = c.column5, response_body = c.column6, chunked = c.column7,
        completed_at = ?, locked_until = NULL
    FROM (VALUES {{rows}}) AS c
    WHERE {KEYS}.scope = c.column1 AND {KEYS}.key = c.column2
      AND {KEYS}.fence = c.column3 AND {KEYS}.status = 'running'
    RETURNING scope, key
"""
_COMPLETE_ROW = "(?, ?, ?, ?, ?, ?, ?)"
# CROSS JOIN keeps the VALUES list as the outer loop: one primary-key lookup
# per key (a row-value IN list would scan the table).
_READ_MANY = (
    f"SELECT {RECORD_COLUMNS}, locked_until FROM (VALUES {{rows}}) AS v CROSS JOIN {KEYS}"
    f" WHERE {KEYS}.scope = v.column1 AND {KEYS}.key = v.column2"
)
# Statement results cost the GIL once per row on this thread, while the event
# loop wants it too: the common cases below run without RETURNING and learn
# their outcome from the row count (see _claim_all and _complete_all).
_CLAIM_QUIET = _CLAIM.replace("RETURNING scope, key, fence", "")
_COMPLETE_QUIET = _COMPLETE.replace("RETURNING scope, key", "")
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


def _named(conn: sqlite3.Connection) -> sqlite3.Cursor:
    """A cursor whose rows are read by column name. The connection is the
    store's, shared with the receive path: its own row factory stays as it is."""
    cursor = conn.cursor()
    cursor.row_factory = sqlite3.Row
    return cursor


class SQLiteKeyStore(KeyStore):
    def __init__(self, store: SQLiteStore) -> None:
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
        outcomes = self._claim_all(cursor, claims, now, lock_seconds, ttl) if claims else []
        return landed, outcomes

    @staticmethod
    def _claim_all(
        cursor: sqlite3.Cursor,
        claims: Sequence[KeyClaim],
        now: float,
        lock_seconds: float,
        ttl: float,
    ) -> list[ClaimOutcome]:
        first = first_claims(claims)
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
        won: dict[tuple[str, str], int] = {}
        locked_until, expires_at = now + lock_seconds, now + ttl
        quiet = not any((c.scope, c.key) in records for c in attempts)
        for i in range(0, len(attempts), _ROWS):
            part = attempts[i : i + _ROWS]
            params: list[Any] = []
            for c in part:
                params += (c.scope, c.key, c.fingerprint, locked_until, expires_at, now)
            if quiet:
                # New keys only: each row inserted is a claim won, with fence 1.
                sql = _sql(_CLAIM_QUIET, _CLAIM_ROW, len(part))
                if cursor.execute(sql, params).rowcount != len(part):
                    raise StoreError("idempotency keys appeared under the write lock")
                won.update(((c.scope, c.key), 1) for c in part)
                continue
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
        landed: set[tuple[str, str]] = set()
        for i in range(0, len(completions), _ROWS):
            part = completions[i : i + _ROWS]
            params: list[Any] = [now]
            for c in part:
                r = c.response
                params += (
                    c.scope, c.key, c.fence, r.status, r.headers_json(), r.body, int(r.chunked)
                )  # fmt: skip
            sql = _sql(_COMPLETE_QUIET, _COMPLETE_ROW, len(part))
            if cursor.execute(sql, params).rowcount == len(part):
                landed.update((c.scope, c.key) for c in part)
                continue
            # Some came from a stale owner (rare): ask which ones landed.
            sql = _sql(_LANDED, "(?, ?, ?)", len(part))
            keys = [v for c in part for v in (c.scope, c.key, c.fence)]
            landed.update((row["scope"], row["key"]) for row in cursor.execute(sql, [*keys, now]))
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
