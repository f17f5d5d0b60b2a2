"""Operator actions: replay events, read their attempt history.

The SQL is the work queue's (:class:`onceonly.store.work_queue.WorkQueue`);
this module keeps the names the CLI, the dashboard and users call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .events import EventStatus
from .store.engine import engine_kind_of
from .store.history import Attempt, EventHistory
from .store.work_queue import WorkQueue

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = ["DASHBOARD_REPLAYABLE", "REPLAYABLE", "Attempt", "attempts_of", "replay"]

#: What :func:`replay` (and ``onceonly events replay``) puts back in line: every
#: finished event. Pending and processing events are in line already. The work
#: queue's replay statement lists the same statuses (a test holds them equal).
REPLAYABLE = (EventStatus.FAILED, EventStatus.DEAD, EventStatus.PROCESSED)
#: The part of it the dashboard's Replay buttons offer (status values, as its
#: rows carry them): replaying a processed event runs its handler a second
#: time, which stays a deliberate command-line action (docs/dashboard.md).
DASHBOARD_REPLAYABLE = (EventStatus.FAILED.value, EventStatus.DEAD.value)


def replay(
    engine: sa.Engine, kind: str, *, id: int | None = None, status: EventStatus | None = None
) -> list[int]:
    """Put events back in line (status ``pending``, attempts reset); return their ids.

    Only finished events are replayed (failed, dead or processed): a pending or
    processing event is already in line. Replaying a processed event runs its
    handler again; effects already recorded are not called again. An event whose
    payload ``onceonly purge`` dropped is never replayed: asked for by `id`, it
    raises :class:`~onceonly.PayloadPurged`.
    """
    return WorkQueue(kind).replay(engine, id=id, status=status.value if status else None)


def attempts_of(engine: sa.Engine, event_pk: int) -> list[Attempt]:
    """The recorded attempts of one event, oldest first."""
    return EventHistory(engine_kind_of(engine)).attempts(engine, event_pk)
