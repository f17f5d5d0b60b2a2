"""A savepoint around each handler of a batch, opened only if it is needed.

Several events share one transaction (one commit for the batch), so each
handler's writes sit in a savepoint that its failure rolls back. The savepoint
is opened just before the handler's first statement, by a listener on the
connection's ``before_cursor_execute``: a handler that never touches the
database costs no round trip. One listener serves the whole batch.

Statements that reach the same driver connection without SQLAlchemy (a web
framework's ORM on a borrowed connection, see :mod:`onceonly.store.borrowed`)
open it through :meth:`HandlerSavepoints.of` and :meth:`HandlerSavepoints.before`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from .._exceptions import StoreError
from .errors import translated

__all__ = ["HandlerSavepoints"]


class HandlerSavepoints:
    """The savepoints of the handlers run on one connection, one at a time."""

    NAME = "onceonly_handler"
    _INFO_KEY = "onceonly.handler_savepoints"

    def __init__(self, connection: sa.Connection) -> None:
        self.connection = connection
        self._armed = False
        self._open = False
        event.listen(connection, "before_cursor_execute", self._before_statement)
        connection.info[self._INFO_KEY] = self

    @classmethod
    def of(cls, connection: sa.Connection) -> HandlerSavepoints | None:
        """The savepoints of the batch running on `connection`, if one is."""
        found: HandlerSavepoints | None = connection.info.get(cls._INFO_KEY)
        return found

    def _before_statement(self, conn: sa.Connection, cursor: Any, *args: Any) -> None:
        self.before(cursor.connection)

    def before(self, dbapi_connection: Any) -> None:
        """A statement of the running handler is about to run on
        `dbapi_connection` (this batch's driver connection): open its savepoint
        first if it is not open yet."""
        if self._armed and not self._open:
            # Straight on the driver connection: invisible to SQLAlchemy's
            # bookkeeping, and it does not re-enter this hook. A failure here
            # fails the handler's own statement, which its caller reports.
            dbapi_connection.execute(f"SAVEPOINT {self.NAME}")
            self._open = True

    def arm(self) -> None:
        """A handler starts now."""
        self._armed = True

    def finish(self, *, success: bool) -> bool:
        """The handler ended: keep its writes (True) or undo them (False).

        A handler that returned normally can still have to be undone: one that
        swallowed a database error leaves the savepoint unusable on PostgreSQL,
        and its release fails. Undoing that fails only when the transaction
        itself is lost: a StoreError, like every other error of our own SQL.
        """
        self._armed = False  # our own statements below open nothing
        if not self._open:
            return success
        if success:
            try:
                with translated("releasing a handler's savepoint"):
                    self.connection.exec_driver_sql(f"RELEASE SAVEPOINT {self.NAME}")
                self._open = False
                return True
            except StoreError:
                pass
        with translated("rolling back a handler's savepoint"):
            self.connection.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {self.NAME}")
            self.connection.exec_driver_sql(f"RELEASE SAVEPOINT {self.NAME}")
        self._open = False
        return False

    def close(self) -> None:
        """Remove the listener (the batch's handlers are done)."""
        event.remove(self.connection, "before_cursor_execute", self._before_statement)
        self.connection.info.pop(self._INFO_KEY, None)
