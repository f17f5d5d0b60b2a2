"""What a handler may ask about its object's other events, inside its own
transaction: was a newer one already applied?

This is advice to the handler (skip an update older than the state already
written), not a dedup or claim decision, so a read is right here. Under order
per object (``docs/ordering.md``) it is also exact: the worker runs the events
of one key one at a time, so no other event of the object is being processed
while the handler asks, and every one processed before has committed.
"""

from __future__ import annotations

import sqlalchemy as sa

from ..events import Event
from .errors import translated

__all__ = ["newer_applied"]

# "Applied": processed by a handler. An event marked processed because no
# handler was registered for it changed nothing, so it supersedes nothing.
# onceonly_events_object_idx (object_id) finds the object's events.
_NEWER_APPLIED = """
    SELECT 1 FROM onceonly_events
    WHERE object_id = :object_id AND provider = :provider AND tenant = :tenant
        AND id <> :id AND status = 'processed' AND handler <> '(no handler registered)'
        AND occurred_at > :occurred_at
    LIMIT 1
"""


def newer_applied(conn: sa.Connection, event: Event) -> bool:
    """Whether an event about the same provider object as `event`, created
    strictly later, was already processed by a handler. False when `event`
    names no object or no creation time (nothing to compare with)."""
    if event.object_id is None or event.occurred_at is None:
        return False
    # The column is unix seconds (REAL) on SQLite, TIMESTAMPTZ on PostgreSQL.
    # A REAL read back as a datetime (microseconds) and turned into seconds
    # again can come back one float step off: half a microsecond more keeps
    # an event created in the same microsecond from counting as newer.
    occurred = (
        event.occurred_at.timestamp() + 5e-7 if conn.dialect.name == "sqlite" else event.occurred_at
    )
    with translated("reading the object's newer events"):
        row = conn.execute(
            sa.text(_NEWER_APPLIED),
            {
                "object_id": event.object_id,
                "provider": event.provider,
                "tenant": event.tenant,
                "id": event.id,
                "occurred_at": occurred,
            },
        ).first()
    return row is not None
