"""PostgreSQL, for production and for more than one machine.

The receive path uses asyncpg directly: a batch is one ``INSERT ... SELECT FROM
unnest(...) ON CONFLICT DO UPDATE ... RETURNING`` statement, one round trip and one
commit whatever the batch size. (Measured in the design prototype: SQLAlchemy's
async layer on the same path reached about 30% of a bare endpoint, asyncpg with
batching about 51%.)

The pool connects lazily and reconnects by itself: when PostgreSQL goes away the
store raises :class:`~onceonly.StoreUnavailable` (the receiver answers 503) and
the next call after it comes back simply works.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from .._exceptions import StoreError, StoreRejected, StoreUnavailable
from ..events import Event, EventStatus, NewEvent, Receipt
from ..jsontext import dumps_text
from . import migrations
from .base import Store, collapse, receipts
from .idempotency import KeyStore
from .idempotency_postgres import PostgresKeyStore
from .rows import event_columns, event_from_row

__all__ = ["PostgresStore"]

# A duplicate updates the row it collides with (counter and time) and comes
# back in RETURNING with duplicates >= 1; a new row comes back with 0.
_ON_CONFLICT = """
ON CONFLICT (provider, tenant, event_id) DO UPDATE SET
    duplicates = ev.duplicates + 1 + excluded.duplicates, last_duplicate_at = clock_timestamp()
RETURNING provider, tenant, event_id, id, duplicates
"""
_INSERT = (
    """
INSERT INTO onceonly_events AS ev
    (provider, tenant, event_id, event_type, body, headers, object_id, occurred_at, ordering_key)
SELECT p, n, e, t, b, h::jsonb, o, w, k
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::text[],
            $7::text[], $8::timestamptz[], $9::text[]) AS u(p, n, e, t, b, h, o, w, k)
"""
    + _ON_CONFLICT
)
# Only for a batch that holds one key more than once (rare): the copies are
# collapsed into one row carrying their count.
_INSERT_WITH_COPIES = (
    """
INSERT INTO onceonly_events AS ev
    (provider, tenant, event_id, event_type, body, headers, object_id, occurred_at, ordering_key,
     duplicates, last_duplicate_at)
SELECT p, n, e, t, b, h::jsonb, o, w, k, d, CASE WHEN d > 0 THEN clock_timestamp() END
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::text[],
            $7::text[], $8::timestamptz[], $9::text[], $10::int[])
    AS u(p, n, e, t, b, h, o, w, k, d)
"""
    + _ON_CONFLICT
)
_COLUMNS = event_columns()
# Any constant; it only has to be the same for every onceonly process.
_MIGRATION_LOCK = 0x6F6E6365  # "once"

_UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.AdminShutdownError,
    # The server closed the connection while it was idle (pg_terminate_backend,
    # a restart): asyncpg may notice only on the next statement, and say so
    # this way.
    asyncpg.InternalClientError,
    # The server took writes when this connection was opened and refuses them
    # now: it was demoted or fenced in a failover. Its connections are
    # dropped (see _acquire) so that the next ones, with
    # target_session_attrs=read-write, find the new primary.
    asyncpg.ReadOnlySQLTransactionError,
)


# A value the server (or asyncpg, encoding it) cannot take: a NUL in text, a
# lone surrogate, an index row over its size limit. The same value fails
# again; other rows are fine.
_REJECTED: tuple[type[BaseException], ...] = (
    asyncpg.DataError,
    asyncpg.ProgramLimitExceededError,
)


# The settings of lookup_connection()'s connection: every plan is made once
# per statement, and the only join it can use is a nested loop
# over a plain index scan. The other joins and scans stay possible, at a cost
# that makes the planner take them only when no index serves (disable_cost).
_LOOKUP_SETTINGS = {
    "plan_cache_mode": "force_generic_plan",
    "enable_seqscan": "off",
    "enable_bitmapscan": "off",
    "enable_hashjoin": "off",
    "enable_mergejoin": "off",
    "enable_material": "off",
}


async def _no_session_state(conn: asyncpg.Connection) -> None:
    """Pool reset: nothing to undo (see create_pool below)."""


def redact(url: str) -> str:
    """`url` fit for logs and error messages: every password form hidden.

    libpq takes a password in the user info (``user:pw@host``) and as query
    parameters (``?password=pw``, ``sslpassword=``), in any case; all are
    replaced by ``***``. Hosts and ports stay (they say where it failed).
    """
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":***"
    query = "&".join(
        f"{name}=***" if "password" in name.lower() else f"{name}{sep}{value}"
        for name, sep, value in (p.partition("=") for p in parts.query.split("&") if p)
    )
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{hosts}", query=query))


class PostgresStore(Store):
    engine = "postgresql"
    # Measured with benchmarks/receive.py: two batches in flight instead of one
    # keep PostgreSQL busy while a commit waits for its WAL flush, and a
    # database farther away busy while a batch travels (docs/benchmarks.md,
    # 2026-12-07 from 22:10: with a 0.7 ms round trip, one batch in flight
    # served a third fewer deliveries at 32 connections).
    commit_concurrency = 2
    # A batch takes 16 deliveries, or half of those waiting when more wait: at
    # 32 connections the deliveries go in two batches, and the event loop
    # verifies and answers one while the other waits for its commit, where one
    # batch of 32 left the loop idle for a third of the time (2026-12-06:
    # 50-56% of lean against 44%). At 128 connections a fixed 16 held the
    # throughput to 32 deliveries per round trip; halves served 5-22% more
    # (10-36% with PostgreSQL 0.7 ms away).
    commit_share = 16
    # The most in one statement, whatever the queue.
    commit_batch = 256

    def __init__(
        self,
        dsn: str,
        *,
        auto_migrate: bool = True,
        pool_size: int = 10,
        connect_timeout: float = 3.0,
        command_timeout: float = 10.0,
    ) -> None:
        self.dsn = dsn
        self.url = redact(dsn)
        self.auto_migrate = auto_migrate
        self.pool_size = pool_size
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self._pool: asyncpg.Pool | None = None
        self._lookup: asyncpg.Connection | None = None
        self._lookup_lock = asyncio.Lock()
        # The receive path's connections (see _inserting), idle ones here.
        self._inserters: list[asyncpg.Connection] = []
        self._inserting = asyncio.Semaphore(self.commit_concurrency)
        self._opening = asyncio.Lock()
        self._key_store: KeyStore | None = None

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[PoolConnectionProxy]:
        async with self._acquire(await self._ensure_pool()) as conn:
            yield conn

    def connection(self) -> AbstractAsyncContextManager[PoolConnectionProxy]:
        """A connection of the store's pool, for the repositories of this
        package: asyncpg's errors raised in the block leave it as
        :class:`~onceonly.StoreError` (the receive path's mapping)."""
        return self._connection()

    def idempotency_keys(self) -> KeyStore:
        if self._key_store is None:
            self._key_store = PostgresKeyStore(self)
        return self._key_store

    @asynccontextmanager
    async def lookup_connection(self) -> AsyncIterator[asyncpg.Connection]:
        """The connection for batches of primary-key lookups (Idempotency-Key
        claims and completions): one of its own, beside the store's pool.

        On the store's other connections each statement is planned again on
        every execution, so that a plan made while a table was small never
        outlives it (see _ensure_pool). Here plans are made once, and the
        settings leave them one shape whatever the table's size or
        statistics: a nested loop over the primary key, row by row. Planning
        was a quarter of a batch's time (0.77-0.85 ms a batch instead of
        1.01-1.14 ms, measured on a new table growing to 48,000 keys).
        Statements that need another plan must not run here.

        One connection, not a pool: its users (group commits) send one batch
        at a time, and a pool's acquire and release cost 21-31 µs of the event
        loop per batch (measured on an idle pool). Users take turns; it is
        opened on first use, and again after it broke.
        """
        await self._ensure_pool()  # the schema is current before any lookup
        async with self._lookup_lock:
            try:
                conn = self._lookup
                if conn is None or conn.is_closed():
                    conn = self._lookup = await asyncpg.connect(
                        self.dsn,
                        timeout=self.connect_timeout,
                        command_timeout=self.command_timeout,
                        server_settings=_LOOKUP_SETTINGS,
                    )
                yield conn
            except _UNAVAILABLE as exc:
                self._drop_lookup()
                raise StoreUnavailable(f"PostgreSQL at {self.url}: {exc!r}") from exc
            except asyncpg.PostgresError as exc:
                raise StoreError(f"PostgreSQL: {exc}") from exc
            except BaseException:
                # Cancelled in the middle of a statement: what the connection
                # is doing is unknown, the next user gets a new one.
                self._drop_lookup()
                raise

    @asynccontextmanager
    async def _inserter(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection for one batch of deliveries: one of the receive path's
        own, at most :attr:`commit_concurrency` of them, beside the pool.

        Not the pool's: its acquire and release cost the event loop more than
        the rest of the batch's client side (``benchmarks/receive.py``, where
        these connections took the CPU per delivery from 80-82 µs to 74-77
        µs). And the batch's one statement has one plan whatever the table
        holds (rows from ``unnest``, conflicts found through the unique
        index), so it is planned once per connection, not per batch as on the
        pool (see _ensure_pool).
        """
        await self._ensure_pool()  # the schema is current before any insert
        async with self._inserting:
            conn = self._inserters.pop() if self._inserters else None
            if conn is None or conn.is_closed():
                with self._connecting():
                    conn = await asyncpg.connect(
                        self.dsn,
                        timeout=self.connect_timeout,
                        command_timeout=self.command_timeout,
                        server_settings={"plan_cache_mode": "force_generic_plan"},
                    )
            try:
                yield conn
            except _UNAVAILABLE as exc:
                # Broken, or (read-only) demoted in a failover: the next
                # connection, with the DSN's target_session_attrs, finds the
                # primary.
                conn.terminate()
                raise StoreUnavailable(f"PostgreSQL at {self.url}: {exc!r}") from exc
            except _REJECTED as exc:
                self._give_back(conn)
                raise StoreRejected(f"PostgreSQL refused a value: {exc}") from exc
            except asyncpg.PostgresError as exc:
                self._give_back(conn)
                raise StoreError(f"PostgreSQL: {exc}") from exc
            except BaseException:
                # Cancelled in the middle of a statement: what the connection
                # is doing is unknown, so it is not used again.
                conn.terminate()
                raise
            self._give_back(conn)

    @contextmanager
    def _connecting(self) -> Iterator[None]:
        """asyncpg's errors while connecting, as onceonly's."""
        try:
            yield
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"PostgreSQL at {self.url}: {exc!r}") from exc
        except asyncpg.PostgresError as exc:
            raise StoreError(f"PostgreSQL: {exc}") from exc

    def _give_back(self, conn: asyncpg.Connection) -> None:
        if self._pool is None:  # closed meanwhile
            conn.terminate()
        else:
            self._inserters.append(conn)

    def _drop_lookup(self) -> None:
        conn, self._lookup = self._lookup, None
        if conn is not None:
            conn.terminate()

    @asynccontextmanager
    async def _acquire(self, pool: asyncpg.Pool) -> AsyncIterator[PoolConnectionProxy]:
        try:
            async with pool.acquire(timeout=self.connect_timeout) as conn:
                try:
                    yield conn
                except asyncpg.ReadOnlySQLTransactionError:
                    # Back in the pool it would reach the same read-only
                    # server for as long as the pool lives.
                    conn.terminate()
                    raise
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"PostgreSQL at {self.url}: {exc!r}") from exc
        except _REJECTED as exc:
            raise StoreRejected(f"PostgreSQL refused a value: {exc}") from exc
        except asyncpg.PostgresError as exc:
            raise StoreError(f"PostgreSQL: {exc}") from exc

    async def _ensure_pool(self) -> asyncpg.Pool:
        if self._pool is not None:
            return self._pool
        async with self._opening:
            if self._pool is not None:
                return self._pool
            with self._connecting():
                pool = await asyncpg.create_pool(
                    self.dsn,
                    min_size=1,
                    max_size=self.pool_size,
                    timeout=self.connect_timeout,
                    command_timeout=self.command_timeout,
                    # The default reset (RESET ALL, UNLISTEN *, ...) is a round
                    # trip per release; onceonly never leaves session state on a
                    # pooled connection (an open transaction is still rolled back).
                    reset=_no_session_state,
                    # Statements are prepared once per connection. A generic
                    # plan made while a table was still small (a hash join over
                    # a sequential scan) stays in use as the table grows, until
                    # autovacuum next analyzes it: measured 2.5x slower fresh
                    # Idempotency-Keys on a new database. Custom plans cost a
                    # re-plan per execution and never go stale (but see
                    # lookup_connection).
                    server_settings={"plan_cache_mode": "force_custom_plan"},
                )
            # The pool is published only once the schema is current, so no
            # caller can insert into a table that does not exist yet.
            try:
                if self.auto_migrate:
                    await self._migrate(pool)
            except BaseException:
                await pool.close()
                raise
            self._pool = pool
            return pool

    async def open(self) -> None:
        await self._ensure_pool()

    async def close(self) -> None:
        # The pool first: a batch that ends meanwhile closes its connection
        # instead of giving it back (see _give_back).
        pool, self._pool = self._pool, None
        inserters, self._inserters = self._inserters, []
        for conn in inserters:
            await conn.close(timeout=self.command_timeout)
        lookup, self._lookup = self._lookup, None
        if lookup is not None:
            await lookup.close(timeout=self.command_timeout)
        if pool is not None:
            await pool.close()

    async def migrate(self) -> list[int]:
        return await self._migrate(await self._ensure_pool())

    async def _migrate(self, pool: asyncpg.Pool) -> list[int]:
        async with self._acquire(pool) as conn:
            # Read-only when the schema is current: every process start
            # takes this path, and on a hot standby (a replica serving the
            # dashboard or `onceonly events`) the writing path cannot run.
            if await conn.fetchval(
                "SELECT to_regclass('onceonly_schema') IS NOT NULL"
            ) and await conn.fetchval(
                "SELECT coalesce(max(version), 0) >= $1 FROM onceonly_schema",
                migrations.latest("postgresql"),
            ):
                return []
        async with self._acquire(pool) as conn, conn.transaction():
            # Serialises concurrent starters; released at commit.
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
            await conn.execute(migrations.SCHEMA_TABLE["postgresql"])
            current = await conn.fetchval("SELECT coalesce(max(version), 0) FROM onceonly_schema")
            applied = []
            for migration in migrations.pending("postgresql", current):
                for statement in migration.statements:
                    await conn.execute(statement)
                await conn.execute(
                    "INSERT INTO onceonly_schema (version, description) VALUES ($1, $2)",
                    migration.version,
                    migration.description,
                )
                applied.append(migration.version)
            return applied

    async def schema_version(self) -> int:
        async with self._connection() as conn:
            if not await conn.fetchval("SELECT to_regclass('onceonly_schema') IS NOT NULL"):
                return 0
            return int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM onceonly_schema"))

    async def insert_events(self, events: Sequence[NewEvent]) -> list[Receipt]:
        unique, extra = collapse(events)
        if len(unique) > 1:
            # Rows locked in one order by every batch: two concurrent batches
            # holding the same keys wait for each other instead of deadlocking.
            unique.sort(key=lambda e: (e.provider, e.tenant, e.event_id))
        columns: tuple[list[Any], ...] = ([], [], [], [], [], [], [], [], [])
        for e in unique:
            columns[0].append(e.provider)
            columns[1].append(e.tenant)
            columns[2].append(e.event_id)
            columns[3].append(e.event_type)
            columns[4].append(e.body)
            columns[5].append(dumps_text(e.headers))
            columns[6].append(e.object_id)
            columns[7].append(e.occurred_at)
            columns[8].append(e.ordering_key)
        async with self._inserter() as conn:
            if extra:
                copies = [extra.get((e.provider, e.tenant, e.event_id), 0) for e in unique]
                rows = await conn.fetch(_INSERT_WITH_COPIES, *columns, copies)
            else:
                rows = await conn.fetch(_INSERT, *columns)
        returned = {
            (r["provider"], r["tenant"], r["event_id"]): (r["id"], r["duplicates"]) for r in rows
        }
        return receipts(events, returned, extra)

    async def list_events(
        self,
        *,
        provider: str | None = None,
        status: EventStatus | None = None,
        limit: int = 50,
        before_id: int | None = None,
        object_id: str | None = None,
        tenant: str | None = None,
    ) -> list[Event]:
        args: list[object] = [provider, status.value if status else None, before_id, limit]
        extra = ""
        # Each spelled out only when asked, in plain terms, so that even a
        # prepared statement's generic plan may use the partial indexes.
        if tenant is not None:
            args.append(tenant)
            extra += f" AND tenant = ${len(args)}" + (" AND tenant <> ''" if tenant else "")
        if object_id is not None:
            args.append(object_id)
            extra += f" AND object_id = ${len(args)}"
        async with self._connection() as conn:
            rows = await conn.fetch(
                f"SELECT {_COLUMNS} FROM onceonly_events"
                " WHERE ($1::text IS NULL OR provider = $1)"
                " AND ($2::text IS NULL OR status = $2)"
                " AND ($3::bigint IS NULL OR id < $3)"
                f"{extra}"
                " ORDER BY id DESC LIMIT $4",
                *args,
            )
        return [event_from_row(r) for r in rows]

    async def get_event(self, id: int) -> Event | None:
        async with self._connection() as conn:
            row = await conn.fetchrow(f"SELECT {_COLUMNS} FROM onceonly_events WHERE id = $1", id)
        return event_from_row(row) if row else None

    async def find_event(self, provider: str, event_id: str, tenant: str = "") -> Event | None:
        async with self._connection() as conn:
            row = await conn.fetchrow(
                f"SELECT {_COLUMNS} FROM onceonly_events"
                " WHERE provider = $1 AND tenant = $2 AND event_id = $3",
                provider,
                tenant,
                event_id,
            )
        return event_from_row(row) if row else None
