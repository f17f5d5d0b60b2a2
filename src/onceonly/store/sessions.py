"""Dashboard sign-ins in ``onceonly_dashboard_sessions``: open, check, end, prune.

Times are unix seconds from the caller's clock on both engines (the table
stores them as numbers), so the statements are the same for both; they are
still kept per engine, like every repository's. What a session is (its id, its
lifetime, how long an ended one is kept) is :mod:`onceonly.dashboard.sessions`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from .engine import reading
from .errors import translated

__all__ = ["DashboardSessions"]


@dataclass(frozen=True, slots=True)
class _Statements:
    open: str
    #: Sessions that expired before :before.
    prune: str
    #: The session, if it is neither ended nor expired at :now.
    valid: str
    end: str


_POSTGRES = _Statements(
    open=(
        "INSERT INTO onceonly_dashboard_sessions (id, created_at, expires_at)"
        " VALUES (:id, :now, :expires)"
    ),
    prune="DELETE FROM onceonly_dashboard_sessions WHERE expires_at < :before",
    valid=(
        "SELECT 1 FROM onceonly_dashboard_sessions"
        " WHERE id = :id AND ended_at IS NULL AND expires_at > :now"
    ),
    end=(
        "UPDATE onceonly_dashboard_sessions SET ended_at = :now WHERE id = :id AND ended_at IS NULL"
    ),
)
_SQLITE = _POSTGRES


class DashboardSessions:
    """The session table's statements for one engine kind; each method runs
    in a short transaction of its own on the engine it is given."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._sql = _POSTGRES if kind == "postgresql" else _SQLITE

    def open(
        self, engine: sa.Engine, session_id: str, *, now: float, expires: float, prune_before: float
    ) -> None:
        """Record a new session, dropping in the same transaction those that
        expired before `prune_before`."""
        with translated("opening a dashboard session"), engine.begin() as conn:
            conn.execute(sa.text(self._sql.prune), {"before": prune_before})
            conn.execute(
                sa.text(self._sql.open), {"id": session_id, "now": now, "expires": expires}
            )

    def prune(self, engine: sa.Engine, *, before: float) -> int:
        """Drop the sessions that expired before `before`; how many went."""
        with translated("pruning dashboard sessions"), engine.begin() as conn:
            return int(conn.execute(sa.text(self._sql.prune), {"before": before}).rowcount)

    def valid(self, engine: sa.Engine, session_id: str, *, now: float) -> bool:
        """Whether the session is open at `now` (not ended, not expired)."""
        with translated("checking a dashboard session"), reading(engine) as conn:
            found = conn.execute(sa.text(self._sql.valid), {"id": session_id, "now": now}).first()
        return found is not None

    def end(self, engine: sa.Engine, session_id: str, *, now: float) -> bool:
        """End the session; False when it was already ended (or never was)."""
        with translated("ending a dashboard session"), engine.begin() as conn:
            ended = conn.execute(sa.text(self._sql.end), {"id": session_id, "now": now}).rowcount
        return bool(ended)
