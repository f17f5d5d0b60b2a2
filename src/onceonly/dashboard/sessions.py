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
from typing import TYPE_CHECKING

from ..store.sessions import DashboardSessions

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = ["SESSION_SECONDS", "Sessions"]

#: How long a sign-in lasts, from the login.
SESSION_SECONDS = 12 * 3600
#: Ended and expired sessions are kept a day, for whoever looks into a
#: sign-in, then dropped by the next login.
KEEP_ENDED_SECONDS = 24 * 3600


class Sessions:
    """Open, check and end sign-ins in the onceonly database."""

    def __init__(
        self,
        engine: Callable[[], sa.Engine],
        *,
        kind: str,
        lifetime: float = SESSION_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = engine
        self._table = DashboardSessions(kind)
        self.lifetime = lifetime
        self._clock = clock

    def open(self) -> str:
        """A new session's id."""
        session_id = secrets.token_urlsafe(24)
        now = self._clock()
        self._table.open(
            self._engine(),
            session_id,
            now=now,
            expires=now + self.lifetime,
            prune_before=now - KEEP_ENDED_SECONDS,
        )
        return session_id

    def valid(self, session_id: str) -> bool:
        return self._table.valid(self._engine(), session_id, now=self._clock())

    def end(self, session_id: str) -> None:
        self._table.end(self._engine(), session_id, now=self._clock())
