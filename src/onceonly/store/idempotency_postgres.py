"""Idempotency-Key records on PostgreSQL: one round trip per batch.

See :mod:`.idempotency` for the claim's rules; this is the PostgreSQL
statement of them. Claims and completions run on the store's lookup
connection (:meth:`PostgresStore.lookup_connection`), the rest on its pool
(:meth:`PostgresStore.connection`); both turn asyncpg's errors into
onceonly's, as for the receive path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..jsontext import dumps
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
    import asyncpg

    from .postgres import PostgresStore

__all__ = ["PostgresKeyStore"]


class PostgresKeyStore(KeyStore):
    # One round trip for a batch of claims. `plan` reads the keys' records;
    # the INSERT is attempted only for keys that are absent, expired or an
    # abandoned claim of the same request, and the database decides it: ON
    # CONFLICT ... WHERE is the same test, re-checked on the latest row under
    # its lock. Keys the read already settles (done: replay; running: 409;
    # another request: 422) are answered from it and write nothing, so a
    # replay neither locks its row nor waits for a WAL flush.
    #
    # A batch travels as one JSON parameter, not as arrays: asyncpg inspects
    # every array element in Python, which cost more than the statement. It
    # is read as jsonb, parsed once: each ->> on a json value parses its text
    # again (seven times per completion row), and a header list nested as a
    # string was escaped and parsed on top. PostgreSQL's user CPU per batch
    # of 8 claims and 8 completions, measured: 630-760 µs as json, 450-610 µs
    # as jsonb (headers nested or not). The row count goes along as a
    # LIMIT, which is what the planner then expects: jsonb_array_elements()
    # alone counts as 100 rows, and against 100 probes a table of a few ten
    # thousand keys is cheaper to scan whole than to look up by primary key
    # (measured: 4.5 ms instead of 1 ms per batch at 24,000 keys, a table not
    # yet analyzed).
    #
    # These statements run on the store's lookup connection, planned once
    # with primary-key lookups as the only plan (see PostgresStore
    # .lookup_connection): planning each batch again was a quarter of its
    # time. So that no other join is left to plan, the answer is the rows as
    # the plan read them ('r'), the keys the INSERT claimed ('c') and, with
    # completions, those that landed ('l'), one after the other; Python pairs
    # them up, by the `kind` column: 'r' rows are RECORD_COLUMNS and
    # `settled`, for the keys that had a record (a new key claimed has its 'c'
    # row; one that lost to a concurrent claim has neither, and is read
    # again). Columns are named by the first SELECT of the UNION.
    _CLAIM_CTES = f"""
        plan AS (
            SELECT u.sc, u.ke, u.fp, e.fingerprint, e.status, e.fence, e.response_status,
                   e.response_headers, e.response_body, e.chunked, e.expires_at,
                   coalesce(e.expires_at >= $2::float8
                            AND NOT (e.status = 'running' AND e.locked_until < $2::float8
                                     AND e.fingerprint = u.fp), false) AS settled
            FROM (SELECT v->>0 AS sc, v->>1 AS ke, v->>2 AS fp
                  FROM jsonb_array_elements($1::jsonb) AS j(v) LIMIT $5) AS u
            LEFT JOIN {KEYS} AS e ON e.scope = u.sc AND e.key = u.ke
        ), claimed AS (
            INSERT INTO {KEYS} AS k
                (scope, key, fingerprint, status, locked_until, expires_at, created_at)
            SELECT sc, ke, fp, 'running', $2::float8 + $3::float8, $2::float8 + $4::float8,
                   $2::float8
            FROM plan WHERE NOT settled
            ON CONFLICT (scope, key) DO UPDATE SET
                fingerprint = excluded.fingerprint, status = 'running', fence = k.fence + 1,
                locked_until = excluded.locked_until, expires_at = excluded.expires_at,
                created_at = excluded.created_at, response_status = NULL,
                response_headers = NULL, response_body = NULL, chunked = false,
                completed_at = NULL
            WHERE k.expires_at < excluded.created_at
               OR (k.status = 'running' AND k.locked_until < excluded.created_at
                   AND k.fingerprint = excluded.fingerprint)
            RETURNING k.scope, k.key, k.fence
        )"""
    _CLAIM_SELECT = """
        SELECT sc AS scope, ke AS key, fingerprint, status, fence, response_status,
               response_headers, response_body, chunked, expires_at, settled, 'r' AS kind
        FROM plan
        WHERE fingerprint IS NOT NULL
        UNION ALL
        SELECT scope, key, NULL, NULL, fence, NULL, NULL, NULL, NULL, NULL, NULL, 'c'
        FROM claimed{landed}"""
    _CLAIM = f"WITH {_CLAIM_CTES} {_CLAIM_SELECT.format(landed='')}"
    _READ_MANY = f"""
        SELECT {RECORD_COLUMNS} FROM {KEYS}
        WHERE (scope, key) IN (SELECT * FROM unnest($1::text[], $2::text[]))
    """
    # Parameters ${0} (the rows, see _complete_args), ${1} (now) and ${2} (how
    # many rows): the claim statement's come first when the two share one.
    _UPDATE = """
        UPDATE {keys} AS k SET status = 'done', response_status = (c.v->>3)::int,
            response_headers = (c.v->4)::text, response_body = decode(c.v->>5, 'hex'),
            chunked = (c.v->>6)::bool, completed_at = ${1}::float8, locked_until = NULL
        FROM (SELECT v FROM jsonb_array_elements(${0}::jsonb) AS j(v) LIMIT ${2}) AS c(v)
        WHERE k.scope = c.v->>0 AND k.key = c.v->>1 AND k.fence = (c.v->>2)::bigint
          AND k.status = 'running'
        RETURNING k.scope, k.key"""
    _COMPLETE = _UPDATE.format(1, 2, 3, keys=KEYS)
    # A batch's completions and claims in one statement (one round trip, one
    # commit) when no key is in both: data-modifying CTEs share one snapshot,
    # so a key completed and claimed in the same batch takes two statements.
    _COMPLETE_AND_CLAIM = (
        f"WITH landed AS ({_UPDATE.format(6, 7, 8, keys=KEYS)}), {_CLAIM_CTES} "
        + _CLAIM_SELECT.format(
            landed="""
        UNION ALL
        SELECT scope, key, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'l'
        FROM landed"""
        )
    )

    def __init__(self, store: PostgresStore) -> None:
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
        # No BEGIN/COMMIT round trips: each statement is atomic on its own,
        # and the completions still commit before the claims run, so a claim
        # of a key completed in this batch finds it done.
        async with self.store.lookup_connection() as conn:
            if completions and claims and not self._overlap(completions, claims):
                return await self._complete_and_claim_on(
                    conn, completions, claims, now, lock_seconds, ttl
                )
            landed = await self._complete_on(conn, completions, now) if completions else []
            outcomes = await self._claim_on(conn, claims, now, lock_seconds, ttl) if claims else []
        return landed, outcomes

    @staticmethod
    def _overlap(completions: Sequence[Completion], claims: Sequence[KeyClaim]) -> bool:
        completing = {(c.scope, c.key) for c in completions}
        return any((c.scope, c.key) in completing for c in claims)

    # Batches are written with jsontext.dumps (orjson, measured with
    # benchmarks/idempotency_cpu.py --batches). What orjson refuses, a lone
    # surrogate in a scope that a custom `client` function made, is written
    # by the standard library, and PostgreSQL refuses that batch as before:
    # group commit retries its items one by one, so only that request fails.
    @staticmethod
    def _claim_args(
        unique: Sequence[KeyClaim], now: float, lock_seconds: float, ttl: float
    ) -> list[Any]:
        rows = dumps([(c.scope, c.key, c.fingerprint) for c in unique])
        return [rows, now, lock_seconds, ttl, len(unique)]

    @staticmethod
    def _complete_args(completions: Sequence[Completion], now: float) -> list[Any]:
        rows = [
            (
                c.scope,
                c.key,
                c.fence,
                c.response.status,
                c.response.headers,  # nested, stored as its JSON text
                None if c.response.body is None else c.response.body.hex(),
                c.response.chunked,
            )
            for c in completions
        ]
        return [dumps(rows), now, len(rows)]

    async def _complete_and_claim_on(
        self,
        conn: asyncpg.Connection,
        completions: Sequence[Completion],
        claims: Sequence[KeyClaim],
        now: float,
        lock_seconds: float,
        ttl: float,
    ) -> tuple[list[bool], list[ClaimOutcome]]:
        first = first_claims(claims)
        rows = await conn.fetch(
            self._COMPLETE_AND_CLAIM,
            *self._claim_args(list(first.values()), now, lock_seconds, ttl),
            *self._complete_args(completions, now),
        )
        landed = {(row["scope"], row["key"]) for row in rows if row["kind"] == "l"}
        await self._drop_old_chunks(conn, completions, landed)
        outcomes = await self._claim_outcomes(conn, claims, first, rows)
        return [(c.scope, c.key) in landed for c in completions], outcomes

    async def _claim_on(
        self,
        conn: asyncpg.Connection,
        claims: Sequence[KeyClaim],
        now: float,
        lock_seconds: float,
        ttl: float,
    ) -> list[ClaimOutcome]:
        first = first_claims(claims)
        rows = await conn.fetch(
            self._CLAIM, *self._claim_args(list(first.values()), now, lock_seconds, ttl)
        )
        return await self._claim_outcomes(conn, claims, first, rows)

    async def _claim_outcomes(
        self,
        conn: asyncpg.Connection,
        claims: Sequence[KeyClaim],
        first: dict[tuple[str, str], KeyClaim],
        rows: Sequence[asyncpg.Record],
    ) -> list[ClaimOutcome]:
        won: dict[tuple[str, str], int] = {}
        read: dict[tuple[str, str], asyncpg.Record] = {}
        for row in rows:
            kind = row["kind"]
            if kind == "c":
                won[(row["scope"], row["key"])] = row["fence"]
            elif kind == "r":
                read[(row["scope"], row["key"])] = row
        existing: dict[tuple[str, str], ClaimOutcome] = {}
        raced: list[KeyClaim] = []
        for ident, claim in first.items():
            if ident in won:
                continue
            record = read.get(ident)
            if record is not None and record["settled"]:
                existing[ident] = outcome(record)
            else:
                # Attempted and lost to a concurrent request: what the plan
                # read is out of date (or absent), read the record as it is now.
                raced.append(claim)
        if raced:
            for row in await conn.fetch(
                self._READ_MANY, [c.scope for c in raced], [c.key for c in raced]
            ):
                existing[(row["scope"], row["key"])] = outcome(row)
        return answers(claims, first, won, existing)

    async def _complete_on(
        self, conn: asyncpg.Connection, completions: Sequence[Completion], now: float
    ) -> list[bool]:
        rows = await conn.fetch(self._COMPLETE, *self._complete_args(completions, now))
        landed = {(row["scope"], row["key"]) for row in rows}
        await self._drop_old_chunks(conn, completions, landed)
        return [(c.scope, c.key) in landed for c in completions]

    @staticmethod
    async def _drop_old_chunks(
        conn: asyncpg.Connection, completions: Sequence[Completion], landed: set[tuple[str, str]]
    ) -> None:
        """Chunks of an earlier owner of a key (a take-over) are no longer replayable."""
        for c in completions:
            if c.response.chunked and (c.scope, c.key) in landed:
                await conn.execute(
                    f"DELETE FROM {CHUNKS} WHERE scope = $1 AND key = $2 AND fence <> $3",
                    c.scope,
                    c.key,
                    c.fence,
                )

    async def release(self, scope: str, key: str, fence: int) -> None:
        async with self.store.connection() as conn:
            await conn.execute(
                f"DELETE FROM {KEYS} WHERE scope = $1 AND key = $2 AND fence = $3"
                " AND status = 'running'",
                scope,
                key,
                fence,
            )

    async def append_chunks(
        self, scope: str, key: str, fence: int, first_seq: int, chunks: Sequence[bytes]
    ) -> None:
        async with self.store.connection() as conn:
            await conn.executemany(
                f"INSERT INTO {CHUNKS} (scope, key, fence, seq, data) VALUES ($1, $2, $3, $4, $5)",
                [(scope, key, fence, first_seq + i, c) for i, c in enumerate(chunks)],
            )

    async def read_chunks(
        self, scope: str, key: str, fence: int, from_seq: int, limit: int
    ) -> list[bytes]:
        async with self.store.connection() as conn:
            rows = await conn.fetch(
                f"SELECT data FROM {CHUNKS} WHERE scope = $1 AND key = $2 AND fence = $3"
                " AND seq >= $4 ORDER BY seq LIMIT $5",
                scope,
                key,
                fence,
                from_seq,
                limit,
            )
        return [bytes(r["data"]) for r in rows]

    async def purge(self, *, now: float) -> int:
        async with self.store.connection() as conn:
            result = await conn.execute(f"DELETE FROM {KEYS} WHERE expires_at < $1", now)
        return int(result.split()[-1])
