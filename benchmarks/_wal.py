"""PostgreSQL's write-ahead log as the benchmarks see it: what a run wrote,
and whether the server had to make new log files for it.

A commit waits until its WAL is on disk. The log is kept in segment files
(16 MB by default). When the writer moves on to the next segment and none is
ready, the server makes one then and there: with ``wal_init_zero`` (the
default) it writes the whole file with zeros and fsyncs it, holding the WAL
write lock, so every commit on the server waits meanwhile. A checkpoint turns
the segments it no longer needs into ready ones (it renames them ahead), as
many as the last checkpoints' WAL volume calls for, between ``min_wal_size``
and ``max_wal_size``. So a server under a steady load writes into recycled
segments, and only a new cluster, or a load above any it met, makes new ones.

Measured on a 2-core Intel VM (ext4): a 16 MB file of zeros took 12-42 ms to
write and 10-11 ms to fsync on an idle machine. Under ``receive.py``'s load for
60 s, the server made 49 segments (about one a second), the slowest batches
of deliveries took up to 175 ms to commit, and the p99 was 54 ms; the next
60 s, on the segments then recycled, made none and gave 6.3 ms.

:func:`prime` readies segments before a measurement, the way a steady load
does: it writes the WAL the measurement will need into a scratch table,
drops it and runs CHECKPOINT, which recycles those segments ahead.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from _harness import asyncpg_url

__all__ = [
    "Priming",
    "Sampler",
    "WalReport",
    "WalState",
    "WalUnknown",
    "Watch",
    "made_through",
    "needed_for",
    "prime",
    "read_state",
    "segments_made",
    "wal_state",
]

# One query, so that the position and the files are read at the same moment.
# A segment's name is its timeline then its number (24 hex digits); those
# past the one being written are ready, unused. pg_ls_waldir() needs a
# superuser or pg_monitor.
_STATE = """
SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint,
       count(*),
       count(*) FILTER (WHERE substr(name, 9) > substr(pg_walfile_name(pg_current_wal_lsn()), 9)),
       (SELECT setting::bigint FROM pg_settings WHERE name = 'wal_segment_size'),
       (SELECT setting::bigint * 1048576 FROM pg_settings WHERE name = 'max_wal_size')
FROM pg_ls_waldir()
WHERE name ~ '^[0-9A-F]{24}$'
"""

_SCRATCH = "onceonly_bench_wal_prime"
# About 2 KB of WAL a row: under the size at which PostgreSQL compresses a
# row, so the WAL is as long as the text. md5 makes it vary, row to row.
_FILL = f"INSERT INTO {_SCRATCH} SELECT repeat(md5(g::text), 60) FROM generate_series(1, $1) AS g"
_ROWS_PER_FILL = 20_000  # about 40 MB of WAL


class WalUnknown(Exception):
    """The server would not tell (no pg_monitor role, no CHECKPOINT right)."""


@dataclass(frozen=True)
class WalState:
    lsn: int  # bytes of WAL written in the cluster's life, up to now
    segments: int  # segment files in pg_wal
    ready: int  # of those, the ones past the segment being written
    segment_bytes: int
    max_wal_bytes: int  # the most that checkpoints keep

    @property
    def ready_bytes(self) -> int:
        return self.ready * self.segment_bytes


@dataclass(frozen=True)
class Priming:
    """What :func:`prime` did: `written` bytes of WAL (0: enough were ready)."""

    needed: int
    written: int
    before: WalState
    after: WalState

    def describe(self) -> str:
        ready = f"{_mb(self.before.ready_bytes)} of segments ready"
        if not self.written:
            return f"{ready} for the {_mb(self.needed)} expected: none primed"
        text = (
            f"{ready} for the {_mb(self.needed)} expected: primed ({_mb(self.written)} "
            f"written, then CHECKPOINT), {_mb(self.after.ready_bytes)} ready"
        )
        if self.after.ready_bytes < self.needed:
            text += " (max_wal_size keeps no more)"
        return text


def _mb(size: int) -> str:
    return f"{size / 1e6:,.0f} MB"


async def _state(conn: Any) -> WalState:
    import asyncpg

    try:
        row = await conn.fetchrow(_STATE)
    except asyncpg.PostgresError as exc:
        raise WalUnknown(f"{type(exc).__name__}: {exc}") from exc
    return WalState(*(int(value) for value in row))


async def _connect(url: str) -> Any:
    import asyncpg

    try:
        return await asyncpg.connect(url, timeout=5)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        raise WalUnknown(repr(exc)) from exc


async def read_state(url: str) -> WalState:
    """The WAL position and segment files of the server at `url` (any of its
    databases), from inside an event loop. Raises :class:`WalUnknown` if the
    role may not read them."""
    conn = await _connect(url)
    try:
        return await _state(conn)
    finally:
        await conn.close()


def wal_state(url: str) -> WalState:
    """:func:`read_state` for code that runs no event loop."""
    return asyncio.run(read_state(url))


def prime(url: str, needed: int) -> Priming:
    """Have at least `needed` bytes of segments ready, as far as
    ``max_wal_size`` allows, without touching the server's settings.

    Writes about `needed` bytes of WAL into a scratch table of the database at
    `url` (the server makes the segments it lacks now, while nothing is
    measured), drops it, then CHECKPOINT: the segments before the checkpoint
    are recycled ahead, as many as a checkpoint cycle of that volume keeps.
    """

    async def run() -> Priming:
        import asyncpg

        conn = await _connect(url)
        try:
            before = await _state(conn)
            if before.ready_bytes >= needed:
                return Priming(needed, 0, before, before)
            # Checkpoints keep no more than max_wal_size: more would be lost.
            target = min(needed, before.max_wal_bytes)
            try:
                await conn.execute(f"DROP TABLE IF EXISTS {_SCRATCH}")
                await conn.execute(f"CREATE TABLE {_SCRATCH} (filler text)")
                while (await _state(conn)).lsn - before.lsn < target:
                    await conn.execute(_FILL, _ROWS_PER_FILL)
                await conn.execute(f"DROP TABLE {_SCRATCH}")
                written = (await _state(conn)).lsn - before.lsn
                await conn.execute("CHECKPOINT")
            except asyncpg.PostgresError as exc:
                raise WalUnknown(f"priming: {type(exc).__name__}: {exc}") from exc
            return Priming(needed, written, before, await _state(conn))
        finally:
            await conn.close()

    return asyncio.run(run())


def needed_for(written: int, seconds: float, duration: float, *, margin: float = 1.25) -> int:
    """The WAL a measurement of `duration` seconds will write, from `written`
    bytes in `seconds` of warm-up, with a margin: the server's rate varies."""
    if seconds <= 0:
        return 0
    return math.ceil(written / seconds * duration * margin)


def made_through(states: Sequence[WalState]) -> int:
    """How many segment files the server made across `states`, readings in
    time order: every rise of the file count from one reading to the next,
    added up. Still a lower bound: a checkpoint removes the files it no
    longer needs, all at its end, so files made between the same two
    readings as such a removal go uncounted. Readings close together
    (:class:`Sampler`) leave little room for that; two readings at the ends
    of a measurement leave it all."""
    return sum(max(0, b.segments - a.segments) for a, b in itertools.pairwise(states))


def segments_made(before: WalState, after: WalState) -> int:
    """:func:`made_through` two readings."""
    return made_through((before, after))


class Sampler:
    """Reads the WAL every `interval` seconds on a thread of its own, with one
    connection, from :meth:`start` to :meth:`stop`, for :func:`made_through`.

    A thread, so that a benchmark's own event loop (a load generator's) is
    not the one that waits on these queries. What the server refuses ends
    the sampling and is kept in `unknown`; the readings taken stand."""

    def __init__(self, url: str, *, interval: float = 0.1) -> None:
        self.url = url
        self.interval = interval
        #: (time.perf_counter() after the reading, the reading)
        self.samples: list[tuple[float, WalState]] = []
        self.unknown: str | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Sampler:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._poll()), name="wal-sampler", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops after one last reading."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def between(self, start: float, end: float) -> list[WalState]:
        """The readings taken from `start` to `end` (perf_counter), in order."""
        return [state for at, state in self.samples if start <= at <= end]

    async def _poll(self) -> None:
        try:
            conn = await _connect(self.url)
        except WalUnknown as exc:
            self.unknown = str(exc)
            return
        try:
            while True:
                last = self._stopping.is_set()
                self.samples.append((time.perf_counter(), await _state(conn)))
                if last:
                    return
                await asyncio.sleep(self.interval)
        except Exception as exc:  # the connection lost too: keep what was read
            self.unknown = f"{type(exc).__name__}: {exc}"
        finally:
            try:
                await conn.close(timeout=5)
            except Exception:  # already gone (a database dropped WITH (FORCE))
                conn.terminate()


@dataclass
class WalReport:
    """One measurement's WAL, for a benchmark's report and its --json."""

    written_bytes: int | None = None  # while measured
    segments_made: int | None = None  # while measured, at least
    ready_bytes: int | None = None  # when the measurement began
    priming: str | None = None  # what prime() did, or why it did not run
    unknown: str | None = None  # why the rest is None

    def describe(self) -> str:
        if self.unknown is not None:
            return f"not known ({self.unknown})"
        if self.written_bytes is None or self.ready_bytes is None:
            return "not read"
        made = self.segments_made or 0
        text = (
            f"{_mb(self.written_bytes)} written while measured, "
            f"{_mb(self.ready_bytes)} of segments ready before; "
            + (
                f"{made} new segment(s) made meanwhile, each written and fsynced "
                "while commits waited"
                if made
                else "no new segment made"
            )
        )
        return f"{text}; {self.priming}" if self.priming else text

    def warning(self) -> str | None:
        if not self.segments_made:
            return None
        return (
            f"PostgreSQL made {self.segments_made} new WAL segment(s) while measured: "
            "commits waited for each, and the tail latency shows it"
        )


class Watch:
    """The WAL around one benchmark measurement: read before the warm-up,
    primed (if asked) between the warm-up and the measurement, read again at
    its end. Whatever the server refuses leaves the report "not known",
    never the benchmark stopped. With no `url` (a target that is not on
    PostgreSQL) it does nothing and reports nothing."""

    def __init__(self, url: str | None, *, priming: bool) -> None:
        self.url = url
        self.priming = priming
        self.report = WalReport()
        self._start: WalState | None = None
        self._before: WalState | None = None
        self._sampler: Sampler | None = None

    @classmethod
    def of(cls, database_url: str | None, *, priming: bool) -> Watch:
        """The watch for a target's database: a no-op unless it is on
        PostgreSQL (asyncpg's own URL for SQLAlchemy's)."""
        if database_url is None or not database_url.startswith(("postgresql", "postgres:")):
            return cls(None, priming=False)
        return cls(asyncpg_url(database_url), priming=priming)

    def _read(self) -> WalState | None:
        if self.url is None or self.report.unknown is not None:
            return None
        try:
            return wal_state(self.url)
        except WalUnknown as exc:
            self.report.unknown = str(exc)
            return None

    def warm_up_starts(self) -> None:
        self._start = self._read()

    def measurement_starts(self, warmed_up_s: float, duration_s: float) -> None:
        if self.url is None:
            return
        start = self._start
        if start is None:
            self.report.priming = "not primed: no warm-up to size it by" if self.priming else None
        elif self.priming:
            now = self._read()
            if now is not None:
                needed = needed_for(now.lsn - start.lsn, warmed_up_s, duration_s)
                try:
                    self.report.priming = prime(self.url, needed).describe()
                except WalUnknown as exc:
                    self.report.priming = f"not primed ({exc})"
        else:
            self.report.priming = "not primed (--no-wal-prime)"
        self._before = self._read()
        if self._before is not None and self.url is not None:
            self.report.ready_bytes = self._before.ready_bytes
            # Read all through the measurement: the two ends alone let a
            # checkpoint's removals hide the segments made (made_through).
            self._sampler = Sampler(self.url).start()

    def measurement_ends(self) -> WalReport | None:
        if self.url is None:
            return None
        sampled: list[WalState] = []
        if self._sampler is not None:
            self._sampler.stop()
            sampled = [state for _, state in self._sampler.samples]
        after = self._read()
        if self._before is not None and after is not None:
            self.report.written_bytes = after.lsn - self._before.lsn
            self.report.segments_made = made_through([self._before, *sampled, after])
        return self.report
