"""LISTEN on PostgreSQL: a new event wakes the workers at once.

A trigger on ``onceonly_events`` (see :mod:`onceonly.store.migrations`) and
:meth:`WorkQueue.replay <onceonly.store.work_queue.WorkQueue.replay>` send a
NOTIFY on :data:`CHANNEL`. :class:`EventNotifications` holds one autocommit
psycopg connection listening on it, outside SQLAlchemy's pool (a LISTEN
connection is never returned to other work).

psycopg is imported on first use, so SQLite deployments never load it.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from .._exceptions import StoreError, StoreUnavailable
from .url import DatabaseURL

if TYPE_CHECKING:
    import psycopg

__all__ = ["CHANNEL", "EventNotifications"]

#: The channel new and replayed events are announced on.
CHANNEL = "onceonly_events"


class EventNotifications:
    """Waits for NOTIFYs on :data:`CHANNEL` of the PostgreSQL database at `url`.

    The connection is opened by the first :meth:`wait` and again by the first
    one after it was lost; a lost or unreachable connection raises
    :class:`~onceonly.StoreUnavailable` (the caller polls meanwhile and
    decides when to try again).
    """

    def __init__(self, url: str, *, connect_timeout: int = 5) -> None:
        self.dsn = DatabaseURL.parse(url).postgres_dsn
        self.connect_timeout = connect_timeout
        self._conn: psycopg.Connection | None = None

    def wait(self, timeout: float) -> bool:
        """Whether a notification came within `timeout` seconds."""
        import psycopg

        try:
            if self._conn is None:
                self._conn = psycopg.connect(
                    self.dsn, autocommit=True, connect_timeout=self.connect_timeout
                )
                self._conn.execute(f"LISTEN {CHANNEL}")
            return any(True for _ in self._conn.notifies(timeout=timeout, stop_after=1))
        except (psycopg.Error, OSError) as exc:
            self.close()
            raise _translate(exc) from exc

    def close(self) -> None:
        """Drop the connection (the next :meth:`wait` opens another)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            # A connection already cut has nothing left to close.
            with contextlib.suppress(Exception):
                conn.close()

    def __enter__(self) -> EventNotifications:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _translate(exc: BaseException) -> StoreError:
    import psycopg

    text = str(exc).strip().splitlines()
    reason = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | OSError):
        return StoreUnavailable(f"listening for new events: {reason}")
    return StoreError(f"listening for new events: {reason}")
