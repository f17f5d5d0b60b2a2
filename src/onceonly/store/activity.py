"""Events per minute: what the dashboard's chart and ``/api/activity`` show.

Every figure is computed by the database, grouped by the minute it fell in
(Unix minutes, the same on both engines), over a bounded window ending with
the current minute:

- *received*, by ``received_at``. That column has no index (one more index
  on the receiver's hot insert is not worth a chart); the row id grows with
  ``received_at``, so the first row of the window is found by bisecting the
  primary key (about 20 index probes for a billion ids), and the count scans
  only the window's rows.
- *processed*, and the processing lag (``processed_at - received_at``: its
  median and its maximum) of the events processed in each minute, through the
  partial index on ``processed_at``. The median is the same statement on both
  engines (window functions), the one ``percentile_cont(0.5)`` would give.
- *duplicates*: events whose **latest** duplicate delivery fell in the
  minute, through the partial index on ``last_duplicate_at``. The hot path
  keeps one counter and one time per event, not a row per duplicate, so an
  event redelivered three times in a minute counts once there, and an earlier
  duplicate of it moves to the minute of the later one. An approximation,
  labelled so wherever it is shown.
- *failed*: attempt rows with a failure outcome, by ``finished_at`` (indexed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from .engine import reading
from .errors import translated
from .history import Moment

__all__ = ["MAX_MINUTES", "ActivityHistory", "MinuteActivity"]

#: The longest window served: a day of minutes.
MAX_MINUTES = 1440


@dataclass(frozen=True, slots=True)
class MinuteActivity:
    """What happened in one minute."""

    #: The minute, as Unix seconds divided by 60 (its start is ``minute * 60``).
    minute: int
    received: int
    processed: int
    #: Events whose latest duplicate delivery fell in this minute (see the module).
    duplicates: int
    failed: int
    #: Median and largest seconds from receipt to processing of the events
    #: processed in this minute; ``None`` when none was.
    lag_p50: float | None
    lag_max: float | None

    @property
    def start(self) -> datetime:
        return datetime.fromtimestamp(self.minute * 60, UTC)

    def to_dict(self) -> dict[str, Any]:
        return {
            "minute": self.start.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "received": self.received,
            "processed": self.processed,
            "duplicates": self.duplicates,
            "failed": self.failed,
            "lag_p50": self.lag_p50,
            "lag_max": self.lag_max,
        }


@dataclass(frozen=True, slots=True)
class _Statements:
    #: The first row at or after :id (a bisection probe).
    probe: str
    bounds: str
    received: str
    processed: str
    duplicates: str
    failed: str


def _statements(minute: str, lag: str) -> _Statements:
    """The named statements, given how the engine turns a time column into a
    Unix minute (``{}`` is the column) and how it spells the lag."""
    return _Statements(
        probe="SELECT id, received_at FROM onceonly_events WHERE id >= :id ORDER BY id LIMIT 1",
        bounds="SELECT min(id) AS low, max(id) AS high FROM onceonly_events",
        received=(
            f"SELECT {minute.format('received_at')} AS minute, count(*) AS n"
            " FROM onceonly_events WHERE id >= :first"
            " AND received_at >= :since AND received_at < :until GROUP BY 1"
        ),
        # The median: the middle row (odd count) or the mean of the middle
        # two (even), numbered per minute by lag.
        processed=(
            "SELECT minute, count(*) AS n, max(lag) AS lag_max,"
            " avg(CASE WHEN rn IN ((cnt + 1) / 2, (cnt + 2) / 2) THEN lag END) AS lag_p50"
            " FROM (SELECT minute, lag,"
            " row_number() OVER (PARTITION BY minute ORDER BY lag) AS rn,"
            " count(*) OVER (PARTITION BY minute) AS cnt"
            f" FROM (SELECT {minute.format('processed_at')} AS minute, {lag} AS lag"
            " FROM onceonly_events"
            " WHERE processed_at >= :since AND processed_at < :until) AS p) AS r"
            " GROUP BY minute"
        ),
        duplicates=(
            f"SELECT {minute.format('last_duplicate_at')} AS minute, count(*) AS n"
            " FROM onceonly_events"
            " WHERE last_duplicate_at >= :since AND last_duplicate_at < :until GROUP BY 1"
        ),
        failed=(
            f"SELECT {minute.format('finished_at')} AS minute, count(*) AS n"
            " FROM onceonly_attempts WHERE finished_at >= :since AND finished_at < :until"
            " AND outcome IN ('failed', 'dead') GROUP BY 1"
        ),
    )


_POSTGRES = _statements(
    "floor(extract(epoch FROM {}) / 60)::bigint",
    "extract(epoch FROM processed_at - received_at)::float8",
)
# strftime('%s') is whole seconds as text: exact, where julianday's float
# could put a time on a minute's boundary into the minute before.
_SQLITE = _statements(
    "CAST(strftime('%s', {}) AS INTEGER) / 60",
    "(julianday(processed_at) - julianday(received_at)) * 86400.0",
)


class ActivityHistory:
    """The per-minute statements for one engine kind (``"sqlite"`` or ``"postgresql"``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._sql = _POSTGRES if kind == "postgresql" else _SQLITE

    def per_minute(
        self, engine: sa.Engine, *, minutes: int = 60, now: float | None = None
    ) -> list[MinuteActivity]:
        """The last `minutes` minutes (1 to :data:`MAX_MINUTES`), the current
        one last; `now` (Unix seconds, default the clock) fixes the window."""
        if not 1 <= minutes <= MAX_MINUTES:
            raise ValueError(f"minutes must be from 1 to {MAX_MINUTES}, not {minutes}")
        current = int((time.time() if now is None else now) // 60)
        first_minute = current - minutes + 1
        window = {
            "since": self._moment(first_minute * 60),
            "until": self._moment((current + 1) * 60),
        }
        with translated("reading activity"), reading(engine) as conn:
            first = self._first_id(conn, window["since"])
            received = (
                {}
                if first is None
                else self._counts(conn, self._sql.received, {**window, "first": first})
            )
            processed = {
                int(row.minute): row for row in conn.execute(sa.text(self._sql.processed), window)
            }
            duplicates = self._counts(conn, self._sql.duplicates, window)
            failed = self._counts(conn, self._sql.failed, window)
        result = []
        for minute in range(first_minute, current + 1):
            done = processed.get(minute)
            result.append(
                MinuteActivity(
                    minute=minute,
                    received=received.get(minute, 0),
                    processed=int(done.n) if done is not None else 0,
                    duplicates=duplicates.get(minute, 0),
                    failed=failed.get(minute, 0),
                    lag_p50=_seconds(done.lag_p50) if done is not None else None,
                    lag_max=_seconds(done.lag_max) if done is not None else None,
                )
            )
        return result

    def _moment(self, unix: int) -> Moment:
        """A time as the engine stores it (SQLite: ISO text in UTC, which sorts)."""
        moment = datetime.fromtimestamp(unix, UTC)
        if self.kind == "postgresql":
            return moment
        return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")

    @staticmethod
    def _counts(conn: sa.Connection, sql: str, params: dict[str, Any]) -> dict[int, int]:
        return {int(row.minute): int(row.n) for row in conn.execute(sa.text(sql), params)}

    def _first_id(self, conn: sa.Connection, since: Moment) -> int | None:
        """The smallest row id received at or after `since` (``None``: none
        is), by bisection on the primary key: ids grow with receipt time."""
        bounds = conn.execute(sa.text(self._sql.bounds)).one()
        if bounds.high is None:
            return None
        low, high = int(bounds.low), int(bounds.high)
        last = conn.execute(sa.text(self._sql.probe), {"id": high}).one()
        if _before(last.received_at, since):
            return None
        # Invariant: the answer is in [low, high], and the row `high` qualifies.
        while low < high:
            middle = (low + high) // 2
            row = conn.execute(sa.text(self._sql.probe), {"id": middle}).one()
            if _before(row.received_at, since):
                low = int(row.id) + 1
            else:
                high = middle
        return low


def _before(stored: Moment, since: Moment) -> bool:
    # Both datetimes (PostgreSQL) or both ISO text in one format (SQLite).
    return bool(stored < since)  # type: ignore[operator]


def _seconds(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)
