"""The embedded default: one SQLite file in WAL mode with durable commits.

Database work runs on a dedicated thread holding one connection, so the event
loop does not wait for the disk. The receive path's inserts are the exception:
they have a connection of their own, and while commits are quick they run on
the loop itself, since handing them to a thread costs the loop more than the
commit does (see :class:`_RequestWrites`). ``synchronous=FULL`` makes each
commit reach the disk before it returns (in WAL mode ``NORMAL`` may lose the
last commits on power loss, which would break "no 2xx before the event is
durable").
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from .._exceptions import StoreError, StoreRejected, StoreUnavailable
from ..events import Event, EventStatus, NewEvent, Receipt
from ..jsontext import dumps_text
from . import migrations
from .base import Store, collapse, receipts
from .idempotency import KeyStore
from .idempotency_sqlite import SQLiteKeyStore
from .rows import event_columns, event_from_row
from .write_lock import WriteLock

__all__ = ["SQLiteStore", "configure", "connect", "wal_mode"]

T = TypeVar("T")

# One multi-row statement per batch (measured a few % faster than a statement
# per row); SQLite allows 32,766 parameters, nine per row (ten for a key that
# the batch holds more than once).
_NOW = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
_INSERT_HEAD = (
    "INSERT INTO onceonly_events"
    " (provider, tenant, event_id, event_type, body, headers, object_id, occurred_at,"
    " ordering_key, duplicates, last_duplicate_at) VALUES "
)
_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?, 0, NULL)"
_ROW_WITH_COPIES = f"(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {_NOW})"
_INSERT_TAIL = (
    " ON CONFLICT (provider, tenant, event_id) DO UPDATE SET"
    " duplicates = onceonly_events.duplicates + 1 + excluded.duplicates,"
    f" last_duplicate_at = {_NOW}"
)
# What the insert did, read back in the same transaction as one row of text
# ("n id duplicates" per event of the batch, n its place in it) rather than
# with RETURNING: sqlite3 lets go of the GIL and takes it back for every row a
# statement steps through, and taking it back from a busy event loop is most
# of the store thread's time (54% of its samples were that wait, 29% the
# fsync, with RETURNING, measured with py-spy --native under wrk at c32).
_FOUND_HEAD = "SELECT group_concat(b.column1 || ' ' || ev.id || ' ' || ev.duplicates) FROM (VALUES "
_FOUND_ROW = "(?, ?, ?, ?)"
_FOUND_TAIL = (
    ") AS b JOIN onceonly_events AS ev"
    " ON ev.provider = b.column2 AND ev.tenant = b.column3 AND ev.event_id = b.column4"
)
_ROWS_PER_STATEMENT = 3000
#: A COMMIT that took longer than this sends the next one to the commit
#: thread (see _RequestWrites): the event loop should not wait that long.
INLINE_COMMIT_SECONDS = 0.001
#: A batch whose bodies add up to more than this is written on the commit
#: thread: copying them into the database would hold the event loop up.
INLINE_BYTES = 256 * 1024
_COLUMNS = event_columns()

# Errors that mean "the database cannot take this now" rather than a bug:
# locked past busy_timeout, disk full, I/O error, file unopenable.
_UNAVAILABLE = (
    "locked",
    "busy",
    "disk i/o",
    "full",
    "unable to open",
    "readonly",
    "read-only",
)


def _translate(exc: sqlite3.Error) -> StoreError:
    message = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and any(
        word in message.lower() for word in _UNAVAILABLE
    ):
        return StoreUnavailable(f"SQLite: {message}")
    if isinstance(exc, sqlite3.DataError):  # "string or blob too big" and the like
        return StoreRejected(f"SQLite: {message}")
    return StoreError(f"SQLite: {message}")


def _raise_store_error(exc: BaseException) -> NoReturn:
    """Raise what a failed call gives its caller: sqlite3's errors as onceonly's,
    anything else as it is."""
    if isinstance(exc, sqlite3.Error):
        raise _translate(exc) from exc
    if isinstance(exc, UnicodeError | OverflowError):
        # Raised by sqlite3 while binding a value it cannot store (a lone
        # surrogate, an integer past 64 bits).
        raise StoreRejected(f"SQLite cannot store a value: {exc}") from exc
    raise exc


def wal_mode(conn: sqlite3.Connection, busy_timeout_ms: int) -> None:
    """``PRAGMA journal_mode = WAL``, waiting as ``busy_timeout`` would.

    Switching a new file to WAL takes an exclusive lock, and SQLite answers
    "database is locked" at once, without its busy handler, to a connection
    that asks while another one holds a lock (five processes starting on a
    new file at the same moment). The file is WAL once any of them succeeds.
    """
    deadline = time.monotonic() + busy_timeout_ms / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def configure(conn: sqlite3.Connection, busy_timeout_ms: int) -> None:
    """Set up a new connection the way every onceonly connection to the file is.

    ``busy_timeout`` first, so the switch to WAL waits like everything else;
    ``synchronous=FULL`` because in WAL mode ``NORMAL`` may lose the last
    commits on power loss; ``foreign_keys`` because SQLite leaves it off by
    default, and then ``ON DELETE CASCADE`` silently does nothing (purged
    Idempotency-Key records once left their response chunks behind).
    """
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    wal_mode(conn, busy_timeout_ms)
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")


def _as_is(value: bytes | None) -> bytes | None:
    return value


def _bind_without_lookups() -> None:
    """Bind ``bytes`` and ``None`` parameters without two failed attribute lookups each.

    sqlite3 binds int, float, str and bytearray values directly; any other
    value, ``bytes`` and ``None`` included, goes to its adapter registry, and
    when no adapter is registered for its type, sqlite3 looks for
    ``PrepareProtocol.__adapt__`` and the value's ``__conform__``: the first
    lookup raises an AttributeError, with its formatted message, and clears
    it. A delivery binds its body and two or three NULLs: counted with
    valgrind, that was about 2% of the receive path's instructions. With an
    adapter that returns the value as it is, sqlite3 finds it in one dict
    lookup and binds the same value as before. The registry belongs to the
    process: an adapter someone else registered for these types is kept.
    """
    for kind in (bytes, type(None)):
        if (kind, sqlite3.PrepareProtocol) not in sqlite3.adapters:
            sqlite3.register_adapter(kind, _as_is)


def connect(path: str, busy_timeout_ms: int) -> sqlite3.Connection:
    """The one way onceonly opens a SQLite file (the store, the SQLAlchemy
    engines, the dashboard's reader).

    ``isolation_level=None``: callers issue BEGIN/COMMIT themselves (the store
    one BEGIN IMMEDIATE per batch, the engines through the write lock), so
    pysqlite never opens a transaction behind their back.
    """
    _bind_without_lookups()
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_ms / 1000
    )
    try:
        configure(conn, busy_timeout_ms)
    except BaseException:
        conn.close()
        raise
    return conn


Returned = dict[tuple[str, str, str], tuple[int, int]]


def _write_rows(
    conn: sqlite3.Connection, unique: Sequence[NewEvent], extra: dict[Any, int]
) -> Returned:
    """Insert a batch's rows in the transaction open on `conn`: for each key,
    its row's id and duplicate count (a copy already stored gains one)."""
    returned: Returned = {}
    for start in range(0, len(unique), _ROWS_PER_STATEMENT):
        chunk = unique[start : start + _ROWS_PER_STATEMENT]
        params: list[object] = []
        keys: list[object] = []
        rows: list[str] = []
        for n, e in enumerate(chunk):
            params += (
                e.provider,
                e.tenant,
                e.event_id,
                e.event_type,
                e.body,
                dumps_text(e.headers),
                e.object_id,
                e.occurred_at.timestamp() if e.occurred_at is not None else None,
                e.ordering_key,
            )
            keys += (n, e.provider, e.tenant, e.event_id)
            copies = extra.get((e.provider, e.tenant, e.event_id)) if extra else None
            if copies:
                params.append(copies)
                rows.append(_ROW_WITH_COPIES)
            else:
                rows.append(_ROW)
        conn.execute(_INSERT_HEAD + ", ".join(rows) + _INSERT_TAIL, params)
        found_sql = _FOUND_HEAD + ", ".join([_FOUND_ROW] * len(chunk)) + _FOUND_TAIL
        (found,) = conn.execute(found_sql, keys).fetchone()
        for item in found.split(","):
            place, row_id, duplicates = item.split(" ")
            e = chunk[int(place)]
            returned[(e.provider, e.tenant, e.event_id)] = (int(row_id), int(duplicates))
    return returned


class _RequestWrites:
    """The writes a request waits for (deliveries, Idempotency-Key records):
    a connection of their own, and a thread of their own for what may wait.

    A batch's rows go in on the event loop, and so does its COMMIT while
    commits are quick (:data:`INLINE_COMMIT_SECONDS`, as on a local SSD):
    the loop then gives SQLite a few hundred microseconds per batch, and
    nothing else. On a thread the same work costs the loop more, because
    sqlite3 lets go of the GIL for each call and each row, and each time
    takes it back from the busy loop (docs/benchmarks.md has the A/B figures).
    A slow commit sends the next one to the thread, so that on a slow disk
    the loop keeps answering while the disk syncs; the one after that is
    judged by how long that one took. SQLite's own checkpoints, every 1000
    pages of WAL, run inside a COMMIT, so one in that many batches takes a
    few milliseconds longer wherever its commit runs.

    The write lock is only ever tried on the loop, never waited for: when
    another writer (a worker) holds it, the whole batch waits on the thread,
    with the receiver's priority (:mod:`.write_lock`); so does a batch of
    big bodies (:data:`INLINE_BYTES`), whose copying would hold the loop up.
    """

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store
        self._conn: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None
        # The thread's work for the last batch, while it may still be running.
        self._work: Future[Any] | None = None
        self._opening: Future[sqlite3.Connection] | None = None
        self._last_commit = 0.0  # seconds the last COMMIT took, wherever it ran

    async def write(self, fn: Callable[[sqlite3.Connection], T], *, inline: bool = True) -> T:
        """`fn(connection)` in a transaction begun ahead of the workers, then
        COMMIT; `fn`'s result once committed. `inline=False`: on the thread
        whatever happens (a batch whose copying would hold the loop up)."""
        conn = await self._connection()
        while self._work is not None and not self._work.done():
            # The thread still has the connection (a batch whose callers went
            # away, or a caller beside the group commit): wait until it is done.
            await asyncio.wait([asyncio.wrap_future(self._work)])
        store = self._store
        # From here to the COMMIT or the hand-over, nothing awaits: no other
        # batch can come in between.
        try:
            began = inline and store._write_lock.try_begin(
                conn.execute, busy_timeout_ms=store.busy_timeout_ms
            )
            if began:
                result = fn(conn)
        except BaseException as exc:
            if conn.in_transaction:
                conn.rollback()
            _raise_store_error(exc)
        if not began:
            # Another writer (a worker) holds the lock: all on the thread,
            # which waits for it with the receiver's priority.
            return await self._on_thread(self._write_waiting, conn, fn)
        if self._last_commit > INLINE_COMMIT_SECONDS:
            return await self._on_thread(self._commit, conn, result)
        return self._commit(conn, result)

    async def _on_thread(self, fn: Callable[..., T], *args: Any) -> T:
        assert self._executor is not None
        work = self._work = self._executor.submit(fn, *args)
        # Shielded: cancelling the callers must not cancel a COMMIT that has
        # not started yet, or the transaction would stay open.
        result: T = await asyncio.shield(asyncio.wrap_future(work))
        return result

    def _write_waiting(self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        """On the thread: `fn` and the COMMIT, once the write lock is ours."""
        try:
            self._store.begin(conn)
            result = fn(conn)
        except BaseException as exc:
            if conn.in_transaction:
                conn.rollback()
            _raise_store_error(exc)
        return self._commit(conn, result)

    def _commit(self, conn: sqlite3.Connection, result: T) -> T:
        """COMMIT (or roll back if that fails); then `result`."""
        started = time.perf_counter()
        try:
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.rollback()
            _raise_store_error(exc)
        finally:
            self._last_commit = time.perf_counter() - started
        return result

    async def _connection(self) -> sqlite3.Connection:
        """The connection, opened on the thread the first time (by one caller
        for all who ask meanwhile; after a failure, by the next one to ask)."""
        if self._conn is not None:
            return self._conn
        if self._opening is None:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="onceonly-sqlite-commit")
            self._opening = self._executor.submit(self._connect)
        opening = self._opening
        try:
            # Shielded: a caller going away does not call off the opening.
            conn = await asyncio.shield(asyncio.wrap_future(opening))
        except BaseException:
            if self._opening is opening and opening.done():
                self._opening = None  # the next caller tries again
            raise
        if self._opening is not opening:
            # close() ran meanwhile, and closed it.
            raise StoreUnavailable("SQLite: the store is closing")
        self._conn = conn
        return conn

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = self._store._connect()
            self._store._write_lock.prepare_receiver()
        except sqlite3.Error as exc:
            raise _translate(exc) from exc
        return conn

    async def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        # After whatever the thread still has to do: it runs in order.
        await asyncio.wrap_future(executor.submit(self._close_connection))
        executor.shutdown(wait=True)

    def _close_connection(self) -> None:
        conn, opening = self._conn, self._opening
        self._conn = self._opening = self._work = None
        if conn is None and opening is not None and opening.exception() is None:
            conn = opening.result()  # opened, and its caller has not resumed yet
        if conn is not None:
            conn.close()


class SQLiteStore(Store):
    engine = "sqlite"

    def __init__(
        self, path: str | Path, *, auto_migrate: bool = True, busy_timeout_ms: int = 5000
    ) -> None:
        self.path = str(path)
        self.url = f"sqlite:///{self.path}"
        self.auto_migrate = auto_migrate
        self.busy_timeout_ms = busy_timeout_ms
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._ready = False
        self._write_lock = WriteLock.of(self.path)
        self._key_store: KeyStore | None = None
        self._writes = _RequestWrites(self)

    # The dedicated thread.

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="onceonly-sqlite")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call, fn)

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            if self._conn is None:
                self._conn = self._connect()
            return fn(self._conn)
        except BaseException as exc:
            # Whatever went wrong, no transaction outlives the call: an open
            # one would hold the file's only write lock against every other
            # writer (workers, purge, import) until some later call ended it.
            if self._conn is not None and self._conn.in_transaction:
                self._conn.rollback()
            _raise_store_error(exc)

    def _connect(self) -> sqlite3.Connection:
        return connect(self.path, self.busy_timeout_ms)

    def begin(self, conn: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE`` on this store's connection, ahead of the workers
        (see :mod:`onceonly.store.write_lock`): for writers on the request path
        that share the store's thread (the Idempotency-Key records)."""
        self._write_lock.begin(conn.execute, timeout=self.busy_timeout_ms / 1000, receiver=True)

    async def run_in_connection(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(connection)`` on the store's thread, once the store is open:
        for the repositories of this package that share that thread. A
        transaction `fn` leaves open on failure is rolled back, and sqlite3's
        errors leave as :class:`~onceonly.StoreError` (the receive path's
        mapping)."""
        await self._ensure_open()
        return await self._run(fn)

    def call_in_connection(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """As :meth:`run_in_connection`, from code already running on the
        store's thread (inside a function given to it)."""
        return self._call(fn)

    def idempotency_keys(self) -> KeyStore:
        if self._key_store is None:
            self._key_store = SQLiteKeyStore(self)
        return self._key_store

    # Store.

    async def open(self) -> None:
        if self._ready:
            return
        await self._run(lambda conn: None)
        if self.auto_migrate:
            await self.migrate()
        self._ready = True

    async def close(self) -> None:
        await self._writes.close()
        if self._executor is None:
            return

        def shut(conn: sqlite3.Connection) -> None:
            conn.close()
            self._conn = None

        if self._conn is not None:
            await self._run(shut)
        self._executor.shutdown(wait=True)
        self._executor = None
        self._ready = False

    async def migrate(self) -> list[int]:
        def apply(conn: sqlite3.Connection) -> list[int]:
            # A table rebuild must not cascade the old table's drop to the rows
            # that reference it, and the pragma is ignored inside a
            # transaction: it is set before BEGIN, for every run, since which
            # migrations are pending is known only under the lock.
            conn.execute("PRAGMA foreign_keys = OFF")
            try:
                return migrate_locked(conn)
            finally:
                conn.execute("PRAGMA foreign_keys = ON")

        def migrate_locked(conn: sqlite3.Connection) -> list[int]:
            # BEGIN IMMEDIATE takes the write lock first, so two processes
            # migrating at once run one after the other.
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(migrations.SCHEMA_TABLE["sqlite"])
                (current,) = conn.execute(
                    "SELECT coalesce(max(version), 0) FROM onceonly_schema"
                ).fetchone()
                applied = []
                for migration in migrations.pending("sqlite", current):
                    for statement in migration.statements:
                        conn.execute(statement)
                    if migration.rebuilds and conn.execute("PRAGMA foreign_key_check").fetchone():
                        raise StoreError(
                            f"migration {migration.version} would leave rows pointing at"
                            " missing events; nothing was changed"
                        )
                    conn.execute(
                        "INSERT INTO onceonly_schema (version, description) VALUES (?, ?)",
                        (migration.version, migration.description),
                    )
                    applied.append(migration.version)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return applied

        return await self._run(apply)

    async def schema_version(self) -> int:
        def read(conn: sqlite3.Connection) -> int:
            exists = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'onceonly_schema'"
            ).fetchone()
            if not exists:
                return 0
            return int(
                conn.execute("SELECT coalesce(max(version), 0) FROM onceonly_schema").fetchone()[0]
            )

        return await self._run(read)

    async def _ensure_open(self) -> None:
        if not self._ready:
            await self.open()

    async def insert_events(self, events: Sequence[NewEvent]) -> list[Receipt]:
        await self._ensure_open()
        unique, extra = collapse(events)
        returned = await self.write_on_request_path(
            lambda conn: _write_rows(conn, unique, extra), size=sum(len(e.body) for e in unique)
        )
        return receipts(events, returned, extra)

    async def write_on_request_path(
        self, fn: Callable[[sqlite3.Connection], T], *, size: int = 0
    ) -> T:
        """`fn(connection)` in a transaction of its own, ahead of the workers,
        committed before this returns `fn`'s result: for the writes that a
        request waits for (deliveries, Idempotency-Key records). They run on
        the event loop while the write lock is free and commits are quick
        (see :class:`_RequestWrites`); `size`, the bytes `fn` copies into the
        database, sends them to a thread past :data:`INLINE_BYTES`."""
        await self._ensure_open()
        return await self._writes.write(fn, inline=size <= INLINE_BYTES)

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
        await self._ensure_open()
        where: list[str] = []
        params: list[object] = []
        if provider is not None:
            where.append("provider = ?")
            params.append(provider)
        if status is not None:
            where.append("status = ?")
            params.append(status.value)
        if before_id is not None:
            where.append("id < ?")
            params.append(before_id)
        if object_id is not None:
            where.append("object_id = ?")
            params.append(object_id)
        if tenant is not None:
            where.append("tenant = ?")
            params.append(tenant)
            if tenant:
                where.append("tenant <> ''")  # lets SQLite use the partial tenant index
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        sql = f"SELECT {_COLUMNS} FROM onceonly_events {clause} ORDER BY id DESC LIMIT ?"
        rows = await self._run(lambda conn: conn.execute(sql, (*params, limit)).fetchall())
        return [event_from_row(row) for row in rows]

    async def _one(self, sql: str, params: tuple[Any, ...]) -> Event | None:
        await self._ensure_open()
        row = await self._run(lambda conn: conn.execute(sql, params).fetchone())
        return event_from_row(row) if row else None

    async def get_event(self, id: int) -> Event | None:
        return await self._one(f"SELECT {_COLUMNS} FROM onceonly_events WHERE id = ?", (id,))

    async def find_event(self, provider: str, event_id: str, tenant: str = "") -> Event | None:
        return await self._one(
            f"SELECT {_COLUMNS} FROM onceonly_events"
            " WHERE provider = ? AND tenant = ? AND event_id = ?",
            (provider, tenant, event_id),
        )
