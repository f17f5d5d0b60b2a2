"""Operator actions: replay events, read their attempt history."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from ._exceptions import PayloadPurged
from .events import EventStatus
from .queries import QUERIES

__all__ = ["DASHBOARD_REPLAYABLE", "REPLAYABLE", "Attempt", "attempts_of", "replay"]

#: What :func:`replay` (and ``onceonly events replay``) puts back in line: every
#: finished event. Pending and processing events are in line already. The
#: replay statement in queries.py lists the same statuses (a test holds them equal).
REPLAYABLE = (EventStatus.FAILED, EventStatus.DEAD, EventStatus.PROCESSED)
#: The part of it the dashboard's Replay buttons offer (status values, as its
#: rows carry them): replaying a processed event runs its handler a second
#: time, which stays a deliberate command-line action (docs/dashboard.md).
DASHBOARD_REPLAYABLE = (EventStatus.FAILED.value, EventStatus.DEAD.value)


@dataclass(frozen=True, slots=True)
class Attempt:
    attempt: int
    worker: str
    outcome: str
    error_type: str | None
    error_message: str | None
    traceback: str | None
    finished_at: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "worker": self.worker,
            "outcome": self.outcome,
            "error_type": self.error_type,
            "error_message": self.error_message,
            "traceback": self.traceback,
            "finished_at": self.finished_at,
        }


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
    with engine.begin() as conn:
        ids = [
            int(row[0])
            for row in conn.execute(
                sa.text(QUERIES[kind].replay),
                {"id": id, "status": status.value if status else None},
            )
        ]
        if not ids and id is not None:
            purged = conn.execute(
                sa.text("SELECT payload_purged_at FROM onceonly_events WHERE id = :id"),
                {"id": id},
            ).scalar()
            if purged is not None:
                raise PayloadPurged(
                    f"event {id} cannot be replayed: its payload was purged at {purged}"
                )
        if ids and kind == "postgresql":
            conn.execute(sa.text("SELECT pg_notify('onceonly_events', '')"))
    return ids


def attempts_of(engine: sa.Engine, event_pk: int) -> list[Attempt]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT attempt, worker, outcome, error_type, error_message, traceback,"
                " finished_at FROM onceonly_attempts WHERE event_pk = :pk ORDER BY id"
            ),
            {"pk": event_pk},
        ).all()
    return [
        Attempt(
            attempt=row.attempt,
            worker=row.worker,
            outcome=row.outcome,
            error_type=row.error_type,
            error_message=row.error_message,
            traceback=row.traceback,
            finished_at=str(row.finished_at),
        )
        for row in rows
    ]
