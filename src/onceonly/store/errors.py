"""Driver errors in, onceonly's errors out: the one place that tells them apart.

Every repository in this package runs its statements inside :func:`translated`,
so what leaves ``store/`` is a :class:`~onceonly.StoreError`, never a
SQLAlchemy or driver exception:

- :class:`~onceonly.StoreUnavailable` when the database cannot be reached or
  will not take the work now (a cut connection, a pool that timed out, SQLite's
  "database is locked", a server that refuses writes after a failover): the
  caller waits and tries again;
- :class:`~onceonly.StoreError` for anything else the driver raised (a
  constraint, a syntax error): the caller records it, it is not an outage.

Code outside ``store/`` catches those two and nothing of the drivers'.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from .._exceptions import StoreError, StoreUnavailable

__all__ = ["is_unavailable", "translate", "translated"]

# Errors that say "not now" rather than "never": the connection, the pool or
# the server, not the statement.
_OUTAGES: tuple[type[BaseException], ...] = (
    sa.exc.OperationalError,
    sa.exc.InterfaceError,
    sa.exc.DisconnectionError,
    sa.exc.TimeoutError,
    OSError,
)


def is_unavailable(exc: BaseException) -> bool:
    """Whether a driver error means the database is away (try again later)."""
    if isinstance(exc, (StoreUnavailable, *_OUTAGES)):
        return True
    return isinstance(exc, sa.exc.DBAPIError) and bool(exc.connection_invalidated)


def translate(exc: BaseException, what: str) -> StoreError:
    """The onceonly error for a driver error raised while doing `what`."""
    if isinstance(exc, StoreError):
        return exc
    if is_unavailable(exc):
        return StoreUnavailable(f"{what}: the database is unavailable ({_reason(exc)})")
    return StoreError(f"{what}: {_reason(exc)}")


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Run a block of database work; a driver error leaves it as a StoreError.

    `what` names the work for the message ("claiming events"). onceonly's own
    errors and everything that is not a database error pass through untouched.
    """
    try:
        yield
    except StoreError:
        raise
    except (sa.exc.SQLAlchemyError, OSError) as exc:
        raise translate(exc, what) from exc


def _reason(exc: BaseException) -> str:
    # SQLAlchemy's message carries the statement and its parameters, which may
    # hold a payload: the driver's own message is enough to act on.
    original = getattr(exc, "orig", None)
    shown = original if original is not None else exc
    text = str(shown).strip().splitlines()
    return f"{type(shown).__name__}: {text[0]}" if text else type(shown).__name__
