"""SQLAlchemy engines for the worker, the effect ledger and the job guard.

The receive path talks to the drivers directly (it is the hot path); everything
that runs users' code uses a synchronous SQLAlchemy :class:`~sqlalchemy.Engine`
on the same database, so a handler can use SQLAlchemy Core and ORM on the very
connection whose transaction marks its event processed.

SQLite connections are set up like the store's (WAL, ``synchronous=FULL``,
``busy_timeout``) and every transaction starts with ``BEGIN IMMEDIATE``: it takes
the write lock up front, so two processes never deadlock upgrading a read
transaction to a write one (SQLite answers that case with an immediate "database
is locked", whatever the timeout).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy import event

from .errors import translated
from .sqlite import connect
from .url import DatabaseURL
from .write_lock import WriteLock

__all__ = [
    "create_engine",
    "engine_kind",
    "engine_kind_of",
    "one_statement",
    "reading",
    "transaction",
    "write_lock_of",
]

_write_locks: weakref.WeakKeyDictionary[sa.Engine, WriteLock] = weakref.WeakKeyDictionary()


def write_lock_of(engine: sa.Engine) -> WriteLock | None:
    """The SQLite write lock an engine from :func:`create_engine` takes; None
    for PostgreSQL (and engines made elsewhere)."""
    return _write_locks.get(engine)


def engine_kind(url: str) -> str:
    """``"sqlite"`` or ``"postgresql"`` for an onceonly database URL."""
    return DatabaseURL.parse(url).kind


def engine_kind_of(engine: sa.Engine) -> str:
    """``"sqlite"`` or ``"postgresql"`` for an engine (its dialect's name)."""
    return engine.dialect.name


def create_engine(url: str, *, pool_size: int = 10) -> sa.Engine:
    """A synchronous engine for `url` (an onceonly database URL). On SQLite its
    transactions take the write lock in turns with the receiver
    (:mod:`onceonly.store.write_lock`)."""
    parsed = DatabaseURL.parse(url)
    if parsed.kind == "postgresql":
        pg = sa.create_engine(
            "postgresql+psycopg://" + _hosts_as_query(parsed.rest),
            pool_size=pool_size,
            max_overflow=pool_size,
            pool_pre_ping=True,
        )
        sa.event.listen(pg, "handle_error", _demoted_is_disconnected)
        return pg
    path, busy_ms = parsed.path, parsed.busy_timeout_ms
    # Connections come from store.sqlite.connect, set up exactly like the
    # store's (pragmas, and no transaction of pysqlite's own: the "begin"
    # event below issues BEGIN IMMEDIATE instead).
    engine = sa.create_engine(
        # The URL only names the file (connections come from the creator).
        f"sqlite+pysqlite:///{path}",
        creator=lambda: connect(path, busy_ms),
        poolclass=sa.pool.QueuePool,
        pool_size=pool_size,
        max_overflow=pool_size,
    )

    write_lock = WriteLock.of(path)
    _write_locks[engine] = write_lock

    @event.listens_for(engine, "begin")
    def _begin(connection: sa.Connection) -> None:
        if connection.get_execution_options().get(_READ_ONLY):
            # A reader: WAL lets it read beside the writer, so it must not
            # queue for (and hold) the write lock the receiver needs.
            connection.exec_driver_sql("BEGIN")
            return
        # In turns, a waiting receiver first (store.write_lock). The tries go
        # straight to the driver, a tenth of the cost of SQLAlchemy's
        # execute; the last one through SQLAlchemy, which wraps its error.
        driver = connection.connection.dbapi_connection
        write_lock.begin(
            connection.exec_driver_sql,
            timeout=busy_ms / 1000,
            receiver=False,
            driver=driver.execute if driver is not None else None,
            turn=connection.info,
        )

    # However the transaction ends, the process's next thread may go. (These
    # fire just before the driver's COMMIT or ROLLBACK: a thread that tries
    # in that instant finds SQLite's lock still taken and tries again.)
    @event.listens_for(engine, "commit")
    @event.listens_for(engine, "rollback")
    def _end(connection: sa.Connection) -> None:
        write_lock.end(connection.info)

    @event.listens_for(engine, "checkin")
    def _checkin(_dbapi_connection: Any, record: Any) -> None:
        write_lock.end(record.info)

    return engine


#: Execution option of a connection that only reads (see :func:`reading`).
_READ_ONLY = "onceonly_read_only"


@contextmanager
def reading(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A connection for reads only. On SQLite its transactions start with a
    plain ``BEGIN``: in WAL mode a reader never blocks the writer, whereas the
    engine's usual ``BEGIN IMMEDIATE`` would hold the write lock for as long
    as the read takes (a purge scanning millions of rows, say), while every
    delivery waits. Writing through it is a bug: SQLite may then answer
    "database is locked" at once. On PostgreSQL it is an ordinary connection."""
    with engine.connect().execution_options(**{_READ_ONLY: True}) as conn:
        yield conn


@contextmanager
def transaction(engine: sa.Engine, what: str) -> Iterator[sa.Connection]:
    """``engine.begin()`` whose own failures leave as onceonly's errors.

    Opening the connection, BEGIN (on SQLite, the write lock), COMMIT and
    ROLLBACK are the transaction's, not any one statement's: a failed commit
    raises :class:`~onceonly.StoreUnavailable` or :class:`~onceonly.StoreError`
    like the statements inside, which run under ``translated`` themselves.
    What the block raises that is no database error passes through as it is.
    """
    with translated(what), engine.begin() as conn:
        yield conn


@contextmanager
def one_statement(engine: sa.Engine, what: str) -> Iterator[sa.Connection]:
    """:func:`transaction` for a block of a single writing statement.

    On PostgreSQL the connection is in autocommit: the statement is its own
    transaction, as atomic as in ``BEGIN``/``COMMIT`` and two round trips
    shorter (the worker claims a batch this way every few milliseconds). On
    SQLite it is :func:`transaction`, whose ``BEGIN IMMEDIATE`` takes the
    write lock in turns with the receiver. A block that runs two statements
    through it commits each on its own on PostgreSQL: that is a bug.
    """
    if engine.dialect.name != "postgresql":
        with transaction(engine, what) as conn:
            yield conn
        return
    with translated(what), engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        yield conn


# SQLSTATE of "cannot execute ... in a read-only transaction".
_READ_ONLY_SQL_TRANSACTION = "25006"


def _demoted_is_disconnected(context: sa.engine.ExceptionContext) -> sa.exc.OperationalError | None:
    """A server that refuses writes on a connection opened for writing was
    demoted or fenced in a failover: for the pool that connection is as good
    as cut. It is invalidated (its pool opens new ones, which find the new
    primary with ``target_session_attrs=read-write``) and the error becomes an
    :class:`~sqlalchemy.exc.OperationalError`, which :mod:`onceonly.store.errors`
    translates to :class:`~onceonly.StoreUnavailable` ("retry"), not a bug."""
    original = context.original_exception
    if getattr(original, "sqlstate", None) != _READ_ONLY_SQL_TRANSACTION:
        return None
    context.is_disconnect = True
    return sa.exc.OperationalError(
        context.statement, context.parameters, original, connection_invalidated=True
    )


def _hosts_as_query(rest: str) -> str:
    """libpq's multi-host form, ``user@h1:5432,h2:5432/db?...``, spelled the way
    SQLAlchemy takes it, ``user@/db?host=h1:5432&host=h2:5432&...``.

    A single host is left as it is. libpq (and asyncpg, on the receive path)
    take the first form directly; SQLAlchemy's URL parser reads everything
    after the first colon as a port. With ``target_session_attrs=read-write``
    every connection goes to whichever host is the primary now: after a
    failover, the pool's next connections find the promoted standby.
    """
    netloc, _, tail = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if "," not in hosts:
        return rest
    path, question, query = tail.partition("?")
    params = "&".join(f"host={quote(h, safe=':[]')}" for h in hosts.split(",") if h)
    return f"{userinfo}{at}/{path}?{params}" + (f"&{query}" if question and query else "")
