"""Dashboard sign-ins that the server can end.

A login cookie used to be a fixed HMAC of the token: valid forever, on every
receiver, whatever logout did. Now each sign-in is a row in
``onceonly_dashboard_sessions`` with the time it was opened and the time it
expires; the cookie carries the session's random id and an HMAC of it (so a
forged id is refused before any query). A session is valid while its row says
so, on every receiver sharing the database: logout ends it there, and an
expired one is refused whatever the browser still sends.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

import sqlalchemy as sa

__all__ = ["SESSION_SECONDS", "Sessions"]

#: How long a sign-in lasts, from the login.
SESSION_SECONDS = 12 * 3600

_OPEN = sa.text(
    "INSERT INTO onceonly_dashboard_sessions (id, created_at, expires_at)"
    " VALUES (:id, :now, :expires)"
)
# Ended and expired sessions are kept a day, for whoever looks into a
# sign-in, then dropped by the next login.
_PRUNE = sa.text("DELETE FROM onceonly_dashboard_sessions WHERE expires_at < :before")
_VALID = sa.text(
    "SELECT 1 FROM onceonly_dashboard_sessions"
    " WHERE id = :id AND ended_at IS NULL AND expires_at > :now"
)
_END = sa.text(
    "UPDATE onceonly_dashboard_sessions SET ended_at = :now WHERE id = :id AND ended_at IS NULL"
)


class Sessions:
    """Open, check and end sign-ins in the onceonly database."""

    def __init__(
        self,
        engine: Callable[[], sa.Engine],
        *,
        lifetime: float = SESSION_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = engine
        self.lifetime = lifetime
        self._clock = clock

    def open(self) -> str:
        """A new session's id."""
        session_id = secrets.token_urlsafe(24)
        now = self._clock()
        with self._engine().begin() as conn:
            conn.execute(_PRUNE, {"before": now - 24 * 3600})
            conn.execute(_OPEN, {"id": session_id, "now": now, "expires": now + self.lifetime})
        return session_id

    def valid(self, session_id: str) -> bool:
        with self._engine().connect() as conn:
            found = conn.execute(_VALID, {"id": session_id, "now": self._clock()}).first()
        return found is not None

    def end(self, session_id: str) -> None:
        with self._engine().begin() as conn:
            conn.execute(_END, {"id": session_id, "now": self._clock()})
