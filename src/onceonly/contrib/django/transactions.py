"""The worker's batches on Django's own connection, inside ``transaction.atomic``.

:class:`DjangoTransactions` is the worker's :class:`~onceonly.batch.Transactions`
under Django: each batch runs in ``transaction.atomic(using=alias)`` on the
worker thread's Django connection, and onceonly's repositories reach it through
a SQLAlchemy connection borrowed on the same driver connection
(:mod:`onceonly.store.borrowed`). So a handler's ORM writes, its ``ctx.stage``
rows and its event's ``processed`` mark commit together, or not at all.

Between batches the connection is checked as Django's request cycle does
(``close_if_unusable_or_obsolete``): ``CONN_MAX_AGE`` and broken connections
behave as in views.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from asgiref.sync import async_to_sync
from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction
from sqlalchemy import event

from ..._exceptions import ConfigurationError, StoreError, StoreUnavailable
from ...store.borrowed import BorrowedConnections
from ...store.savepoints import HandlerSavepoints

__all__ = ["DjangoTransactions"]

_RELEASE = f"RELEASE SAVEPOINT {HandlerSavepoints.NAME}"
_ROLLBACK = f"ROLLBACK TO SAVEPOINT {HandlerSavepoints.NAME}"


class DjangoTransactions:
    """Batches in Django's transactions on database `alias`."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        vendor = connections[alias].vendor
        if vendor not in ("sqlite", "postgresql"):
            raise ConfigurationError(
                f"DATABASES[{alias!r}] is {vendor}; onceonly needs SQLite or PostgreSQL"
            )
        if vendor == "sqlite":
            mode = str(
                connections[alias].settings_dict.get("OPTIONS", {}).get("transaction_mode", "")
            )
            if mode.upper() != "IMMEDIATE":
                # A deferred transaction that reads first and writes later
                # cannot wait for SQLite's write lock: it fails at once with
                # "database is locked" when a claim or a lease renewal holds it.
                raise ConfigurationError(
                    f"DATABASES[{alias!r}] is SQLite: set "
                    '"OPTIONS": {"transaction_mode": "IMMEDIATE"} (Django 5.1 or later) '
                    "so that the worker's transactions wait for the write lock"
                )
        self.borrowed = BorrowedConnections(vendor)

    @contextmanager
    def open(self, what: str) -> Iterator[sa.Connection]:
        django_connection = connections[self.alias]
        django_connection.close_if_unusable_or_obsolete()
        try:
            with _translated(what), transaction.atomic(using=self.alias):
                django_connection.ensure_connection()
                with (
                    self.borrowed.lend(django_connection.connection) as conn,
                    django_connection.execute_wrapper(_savepoint_first(conn)),
                ):
                    event.listen(conn, "before_cursor_execute", self._before_statement)
                    event.listen(conn, "after_cursor_execute", self._after_statement)
                    yield conn
        finally:
            django_connection.close_if_unusable_or_obsolete()

    def _before_statement(
        self, conn: sa.Connection, cursor: Any, statement: str, *args: Any
    ) -> None:
        if statement == _RELEASE and transaction.get_rollback(using=self.alias):
            # The handler returned, but one of its ORM statements failed and
            # it swallowed the error: Django would roll the whole batch back
            # at the end. Refusing the release makes the batch roll back this
            # handler's savepoint and count the attempt as failed, as
            # PostgreSQL itself does for an aborted savepoint.
            raise StoreError("the handler swallowed a database error of the ORM")

    def _after_statement(
        self, conn: sa.Connection, cursor: Any, statement: str, *args: Any
    ) -> None:
        if statement == _ROLLBACK:
            # A failed ORM statement of the handler marked Django's transaction
            # for rollback; the handler's savepoint undid it, so the batch's
            # other events may go on and commit.
            transaction.set_rollback(False, using=self.alias)

    def run_async(self, work: Coroutine[Any, Any, None]) -> None:
        # async_to_sync makes this thread the one that runs sync_to_async's
        # thread-sensitive calls, so the ORM's async methods (acreate, ...) run
        # here, on this connection, in this transaction.
        async def awaiting() -> None:
            await work

        async_to_sync(awaiting)()


def _savepoint_first(conn: sa.Connection) -> Callable[..., Any]:
    """Django's statements, like SQLAlchemy's, open the running handler's
    savepoint before they run (see HandlerSavepoints)."""

    def wrapper(
        execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]
    ) -> Any:
        savepoints = HandlerSavepoints.of(conn)
        if savepoints is not None:
            savepoints.before(context["connection"].connection)
        return execute(sql, params, many, context)

    return wrapper


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """Django's database errors (BEGIN, COMMIT) as onceonly's."""
    try:
        yield
    except StoreError:
        raise
    except (OperationalError, InterfaceError) as exc:
        raise StoreUnavailable(f"{what}: the database is unavailable ({exc})") from exc
    except DatabaseError as exc:
        raise StoreError(f"{what}: {exc}") from exc
