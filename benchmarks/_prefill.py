"""Events tables filled ahead of a measurement (cost_curve.py, purge_stall.py).

A prefilled table looks like one a shop has run for a while: mostly processed
events with bodies of about 1 KB (a Stripe event's size), a few dead and a few
failed ones waiting for a retry far in the future, received over the last
`span_days` days, oldest first. `pending` due events can be added after them
(the newest rows, as in life) for the claim and worker measurements.

Event ids are numbered (``evt_prefill_<n>``, ``evt_pending_<n>``: each sorts
next to the one before, so new rows land together at one end of the dedup
index) or, with ``ids="random"``, the head of an md5 digest (``evt_<hex>``:
new ids land all over the index, as UUIDs do; GitHub's and Shopify's delivery
ids are UUIDs), as long as the numbered id it replaces, so that a row takes
the same room either way: a longer id left room for one more new row in
every page of the prefill, where new rows then went instead of the table's
end (measured with pg_freespacemap: 1,209 bytes free per page against 63).
The digests are the same on both engines: of ``'prefill' || n`` and
``'pending' || n``. A PostgreSQL fill of random ids builds the dedup
index after the rows (dropped, then added again by its name): inserting 10M
random keys one by one into it would take much longer and leave the index no
more like a real one.

PostgreSQL fills with ``INSERT ... SELECT generate_series`` in slices of a
million rows (one transaction each), then VACUUM ANALYZE so the measurement
does not pay for the hint bits and the statistics. A filled database can be
kept as a template (``--cache-templates``) and copied with ``CREATE DATABASE
... TEMPLATE`` by later runs, which is much faster than filling again.
SQLite fills with executemany in transactions of 50,000 rows.

The tables are created by onceonly's own migrations (``create_store``): only
the columns every version has are written, the rest take their defaults.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from _harness import execute_sql, log, pg_url_for
from _pgio import DEDUP_INDEX

PG_SLICE = 1_000_000
SQLITE_SLICE = 50_000
#: One in DEAD_EVERY rows is dead, one in FAILED_EVERY (offset by one) failed.
DEAD_EVERY = 200
FAILED_EVERY = 200
PAD = 29  # md5 strings of 32 characters: a body of about 1 KB
IDS = ("sequential", "random")
HEADERS = '{"content-type":"application/json; charset=utf-8","stripe-signature":"t=0,v1=00"}'


@dataclass(frozen=True)
class Fill:
    """What to put in the table."""

    rows: int
    span_days: float = 60.0
    #: Newest first received this long ago (purge_stall.py makes all rows old).
    newest_age_days: float = 0.0
    pending: int = 0
    #: "sequential" (numbered ids) or "random" (heads of md5 digests); see the module.
    ids: str = "sequential"

    def __post_init__(self) -> None:
        if self.ids not in IDS:
            raise ValueError(f"ids must be one of {', '.join(IDS)}, not {self.ids!r}")

    @property
    def tag(self) -> str:
        tag = f"r{self.rows}_p{self.pending}_s{self.span_days:g}_n{self.newest_age_days:g}"
        # Numbered fills keep the names of templates cached before ids= existed.
        return tag if self.ids == "sequential" else f"{tag}_{self.ids}"

    def event_id(self, kind: str, n: int) -> str:
        """The id of the `n`-th row of `kind` ("prefill" or "pending"), as both
        engines' fills write it."""
        if self.ids == "random":
            digest = hashlib.md5(f"{kind}{n}".encode()).hexdigest()
            return "evt_" + digest[: len(kind) + 1 + len(str(n))]
        return f"evt_{kind}_{n}"

    def event_id_sql(self, kind: str, n: str) -> str:
        """PostgreSQL's expression of :meth:`event_id` for the bigint `n`."""
        if self.ids == "random":
            return f"'evt_' || left(md5('{kind}' || {n}), {len(kind) + 1} + length({n}::text))"
        return f"'evt_{kind}_' || {n}"

    @property
    def pending_ids(self) -> tuple[int, int]:
        """The rows' ids (the table's own) that the pending events take: they
        are inserted last, into a new table, one after the other."""
        return self.rows + 1, self.rows + self.pending

    def processed_count(self) -> int:
        """Rows of the prefill that end up `processed` (the purge's candidates)."""
        return sum(1 for g in range(1, self.rows + 1) if _status(g) == "processed")


def _status(g: int) -> str:
    if g % DEAD_EVERY == 0:
        return "dead"
    if g % FAILED_EVERY == 1:
        return "failed"
    return "processed"


async def _migrate(url: str) -> None:
    from onceonly import create_store

    async with create_store(url) as store:
        await store.insert_events([])  # creates or upgrades the tables


# ---------------------------------------------------------------------------
# PostgreSQL

# {{event_id}}: Fill.event_id_sql("prefill", "g"), filled in by _pg_fill.
_PG_FILL = f"""
INSERT INTO onceonly_events
    (provider, event_id, event_type, body, headers, received_at, status, attempts,
     processed_at, handler, run_after, last_error)
SELECT
    'stripe',
    {{event_id}},
    'payment_intent.succeeded',
    convert_to(format(
        '{{{{"id":"%s","object":"event","type":"payment_intent.succeeded",'
        '"data":{{{{"object":{{{{"id":"pi_%s","amount":%s,"pad":"%s"}}}}}}}}}}}}',
        {{event_id}}, md5(g::text), g % 100000, repeat(md5(g::text), {PAD})), 'UTF8'),
    $4::jsonb,
    now() - make_interval(secs => $5::float8 + ($3::bigint - g) * $6::float8),
    CASE WHEN g % {DEAD_EVERY} = 0 THEN 'dead'
         WHEN g % {FAILED_EVERY} = 1 THEN 'failed'
         ELSE 'processed' END,
    CASE WHEN g % {DEAD_EVERY} = 0 THEN 10 ELSE 1 END,
    CASE WHEN g % {DEAD_EVERY} = 0 OR g % {FAILED_EVERY} = 1 THEN NULL
         ELSE now() - make_interval(secs => $5::float8 + ($3::bigint - g) * $6::float8) END,
    'bench',
    CASE WHEN g % {FAILED_EVERY} = 1 AND g % {DEAD_EVERY} <> 0
         THEN now() + interval '30 days' ELSE '-infinity' END,
    CASE WHEN g % {DEAD_EVERY} = 0 OR g % {FAILED_EVERY} = 1 THEN 'RuntimeError: bench' END
FROM generate_series($1::bigint, $2::bigint) AS g
"""

_PG_PENDING = """
INSERT INTO onceonly_events (provider, event_id, event_type, body, headers)
SELECT 'stripe', {event_id}, 'payment_intent.succeeded',
       convert_to('{{"id":"' || {event_id} || '"}}', 'UTF8'), '{{}}'::jsonb
FROM generate_series(1, $1::bigint) AS g
"""


async def _pg_fill(url: str, fill: Fill) -> None:
    import asyncpg

    await _migrate(url)
    step = fill.span_days * 86400 / max(1, fill.rows)
    newest = fill.newest_age_days * 86400
    conn = await asyncpg.connect(url)
    try:
        started = time.monotonic()
        scattered = fill.ids == "random" and fill.rows > 0
        if scattered:
            await conn.execute(f"ALTER TABLE onceonly_events DROP CONSTRAINT {DEDUP_INDEX}")
        sql = _PG_FILL.format(event_id=fill.event_id_sql("prefill", "g"))
        for lo in range(1, fill.rows + 1, PG_SLICE):
            hi = min(fill.rows, lo + PG_SLICE - 1)
            await conn.execute(sql, lo, hi, fill.rows, HEADERS, newest, step)
            log(f"  prefilled {hi:,} / {fill.rows:,} rows ({time.monotonic() - started:.0f} s)")
        if scattered:
            await conn.execute(
                f"ALTER TABLE onceonly_events ADD CONSTRAINT {DEDUP_INDEX}"
                " UNIQUE (provider, tenant, event_id)"
            )
            log(f"  dedup index built ({time.monotonic() - started:.0f} s)")
        if fill.pending:
            pending = _PG_PENDING.format(event_id=fill.event_id_sql("pending", "g"))
            await conn.execute(pending, fill.pending)
        await conn.execute("VACUUM (ANALYZE) onceonly_events")
        await conn.execute("CHECKPOINT")
    finally:
        await conn.close()


COMPLETE = "onceonly benchmark prefill, complete"


async def _pg_template_state(admin_url: str, database: str) -> str:
    """ "missing", "complete", or "partial" (a fill that was killed half-way)."""
    import asyncpg

    conn = await asyncpg.connect(admin_url, timeout=10)
    try:
        row = await conn.fetchrow(
            "SELECT shobj_description(oid, 'pg_database') AS note FROM pg_database"
            " WHERE datname = $1",
            database,
        )
    finally:
        await conn.close()
    if row is None:
        return "missing"
    return "complete" if row["note"] == COMPLETE else "partial"


async def _pg_admin(admin_url: str, *statements: str) -> None:
    await execute_sql(admin_url, statements, connect_timeout=10)


def pg_prepare(admin_url: str, database: str, fill: Fill, *, template_prefix: str) -> str:
    """Database `database` (dropped first) holding `fill`, copied from a template
    database made (and filled) on first use; its URL. The template is left in
    place: drop it with pg_drop_template() unless it is to be cached."""
    template = pg_template_name(template_prefix, fill)
    state = asyncio.run(_pg_template_state(admin_url, template))
    if state != "complete":
        log(f"filling template database {template} ({fill.rows:,} rows)")
        asyncio.run(
            _pg_admin(
                admin_url,
                f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)',
                f'CREATE DATABASE "{template}"',
            )
        )
        try:
            asyncio.run(_pg_fill(pg_url_for(admin_url, template), fill))
            # Marked only once full: a fill killed half-way is never reused.
            asyncio.run(_pg_admin(admin_url, f"COMMENT ON DATABASE \"{template}\" IS '{COMPLETE}'"))
        except BaseException:
            asyncio.run(_pg_admin(admin_url, f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)'))
            raise
    else:
        log(f"reusing template database {template}")
    started = time.monotonic()
    asyncio.run(
        _pg_admin(
            admin_url,
            f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)',
            f'CREATE DATABASE "{database}" TEMPLATE "{template}"',
            # The copy goes through the WAL (PostgreSQL 15's default strategy):
            # flushed now, rather than by a checkpoint in the middle of the
            # first measurement.
            "CHECKPOINT",
        )
    )
    log(f"  copied {template} to {database} in {time.monotonic() - started:.1f} s")
    return pg_url_for(admin_url, database)


def pg_template_name(template_prefix: str, fill: Fill) -> str:
    return f"{template_prefix}_{fill.tag}"[:63]


def pg_drop_template(admin_url: str, template_prefix: str, fill: Fill) -> None:
    name = pg_template_name(template_prefix, fill)
    asyncio.run(_pg_admin(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


# ---------------------------------------------------------------------------
# SQLite

_SQLITE_FILL = """
INSERT INTO onceonly_events
    (provider, event_id, event_type, body, headers, received_at, status, attempts,
     processed_at, handler, run_after, last_error)
VALUES ('stripe', ?, 'payment_intent.succeeded', ?, ?, ?, ?, ?, ?, 'bench', ?, ?)
"""


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def sqlite_fill(path: str, fill: Fill) -> str:
    """A SQLite file at `path` holding `fill`; its URL."""
    url = f"sqlite:///{path}"
    asyncio.run(_migrate(url))
    now = datetime.now(UTC)
    step = timedelta(days=fill.span_days) / max(1, fill.rows)
    newest = timedelta(days=fill.newest_age_days)
    far = time.time() + 30 * 86400
    conn = sqlite3.connect(path)
    started = time.monotonic()
    try:
        for lo in range(1, fill.rows + 1, SQLITE_SLICE):
            hi = min(fill.rows, lo + SQLITE_SLICE - 1)
            rows = []
            for g in range(lo, hi + 1):
                digest = hashlib.md5(str(g).encode()).hexdigest()
                event_id = fill.event_id("prefill", g)
                body = (
                    f'{{"id":"{event_id}","object":"event",'
                    f'"type":"payment_intent.succeeded","data":{{"object":{{"id":"pi_{digest}",'
                    f'"amount":{g % 100000},"pad":"{digest * PAD}"}}}}}}'
                ).encode()
                status = _status(g)
                received = _iso(now - newest - (fill.rows - g) * step)
                rows.append(
                    (
                        event_id,
                        body,
                        HEADERS,
                        received,
                        status,
                        10 if status == "dead" else 1,
                        received if status == "processed" else None,
                        far if status == "failed" else 0.0,
                        None if status == "processed" else "RuntimeError: bench",
                    )
                )
            with conn:
                conn.executemany(_SQLITE_FILL, rows)
            if hi % 200_000 == 0 or hi == fill.rows:
                log(f"  prefilled {hi:,} / {fill.rows:,} rows ({time.monotonic() - started:.0f} s)")
        with conn:
            conn.executemany(
                "INSERT INTO onceonly_events (provider, event_id, event_type, body, headers)"
                " VALUES ('stripe', ?, 'payment_intent.succeeded', ?, '{}')",
                (
                    (event_id, f'{{"id":"{event_id}"}}'.encode())
                    for event_id in (
                        fill.event_id("pending", g) for g in range(1, fill.pending + 1)
                    )
                ),
            )
        conn.execute("ANALYZE")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return url
