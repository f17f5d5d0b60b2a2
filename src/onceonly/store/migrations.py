"""Versioned schema migrations, one list per engine.

A migration is applied once, in order, inside a transaction that also records
its version in ``onceonly_schema``; concurrent starters serialise on a lock
(an advisory lock on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite), so ten
receivers starting at once apply each migration exactly once. Never edit a
released migration: add the next one.

Partitioning note: the dedup key is ``UNIQUE (provider, tenant, event_id)``,
which already contains ``provider``; a deployment that outgrows one table can
partition by ``LIST (provider)`` with the primary key extended to
``(provider, id)`` without changing what is unique.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MIGRATIONS", "Migration"]

_STATUSES = "'pending', 'processing', 'processed', 'failed', 'dead'"
_NOW_SQLITE = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
# Times in Unix seconds: the dashboard compares them with its own clock, the
# same way on both engines.
_SESSIONS = """CREATE TABLE onceonly_dashboard_sessions (
    id TEXT PRIMARY KEY,
    created_at {seconds} NOT NULL,
    expires_at {seconds} NOT NULL,
    ended_at {seconds}
)"""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]
    #: SQLite only: the migration rebuilds a table that others reference, so
    #: it runs with ``foreign_keys`` off (dropping the old table would
    #: otherwise cascade to its attempts and effects) and checks them after.
    rebuilds: bool = False


SCHEMA_TABLE = {
    "sqlite": (
        "CREATE TABLE IF NOT EXISTS onceonly_schema ("
        " version INTEGER PRIMARY KEY,"
        " description TEXT NOT NULL,"
        " applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))"
    ),
    "postgresql": (
        "CREATE TABLE IF NOT EXISTS onceonly_schema ("
        " version INTEGER PRIMARY KEY,"
        " description TEXT NOT NULL,"
        " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
    ),
}

# The events table's columns up to SQLite's migration 7, in order: what the
# rebuild of migration 8 copies.
_EVENT_COLUMNS_7 = (
    "id, provider, event_id, event_type, body, headers, received_at, status, attempts,"
    " run_after, lease_owner, lease_expires_at, fence, processed_at, handler, last_error,"
    " duplicates, last_duplicate_at, payload_purged_at"
)
# The same on both engines: a search by the provider's object (a payment id)
# across events, and the ordered claim (the earliest unfinished event of a key).
_EVENTS_8_INDEXES = (
    "CREATE INDEX onceonly_events_object_idx ON onceonly_events (object_id)"
    " WHERE object_id IS NOT NULL",
    "CREATE INDEX onceonly_events_ordering_idx ON onceonly_events (ordering_key, occurred_at, id)"
    " WHERE ordering_key IS NOT NULL AND status IN ('pending', 'processing', 'failed')",
)

# The dashboard's activity chart reads each minute's processed events, latest
# duplicates and failed attempts by time (onceonly.store.activity). Partial
# where the column is mostly NULL, so a row costs an index entry only once it
# has the time. received_at gets none: the receiver's insert is the hot path,
# and the chart finds the window's first row by the id instead.
_ACTIVITY_INDEXES = (
    "CREATE INDEX onceonly_events_processed_idx ON onceonly_events (processed_at)"
    " WHERE processed_at IS NOT NULL",
    "CREATE INDEX onceonly_events_duplicate_idx ON onceonly_events (last_duplicate_at)"
    " WHERE last_duplicate_at IS NOT NULL",
    "CREATE INDEX onceonly_attempts_finished_idx ON onceonly_attempts (finished_at)",
)
# A tenant's events, newest first (the dashboard's and `events list
# --tenant`'s filter), without walking every other tenant's rows. Partial: a
# deployment without tenants has no entry in it and pays nothing per insert.
_TENANT_INDEX = (
    "CREATE INDEX onceonly_events_tenant_idx ON onceonly_events (tenant, id) WHERE tenant <> ''"
)

MIGRATIONS: dict[str, tuple[Migration, ...]] = {
    "sqlite": (
        Migration(
            1,
            "events inbox",
            (
                # AUTOINCREMENT: row ids are never reused, even after old rows
                # are purged, so an id in a log always means one event.
                f"""CREATE TABLE onceonly_events (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    provider TEXT NOT NULL,
                    event_id TEXT NOT NULL,
                    event_type TEXT,
                    body BLOB NOT NULL,
                    headers TEXT NOT NULL,
                    received_at TEXT NOT NULL
                        DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
                    status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ({_STATUSES})),
                    attempts INTEGER NOT NULL DEFAULT 0,
                    UNIQUE (provider, event_id)
                )""",
                "CREATE INDEX onceonly_events_status_idx ON onceonly_events (status, id)",
            ),
        ),
        Migration(
            2,
            "worker: leases, retries, attempts, effects, outbox, jobs",
            (
                # Times the worker compares are unix seconds (REAL): SQLite
                # cannot add a column with a non-constant default, and 0 reads
                # as "due now", which is what a freshly received event is.
                "ALTER TABLE onceonly_events ADD COLUMN run_after REAL NOT NULL DEFAULT 0",
                "ALTER TABLE onceonly_events ADD COLUMN lease_owner TEXT",
                "ALTER TABLE onceonly_events ADD COLUMN lease_expires_at REAL",
                "ALTER TABLE onceonly_events ADD COLUMN fence INTEGER NOT NULL DEFAULT 0",
                "ALTER TABLE onceonly_events ADD COLUMN processed_at TEXT",
                "ALTER TABLE onceonly_events ADD COLUMN handler TEXT",
                "ALTER TABLE onceonly_events ADD COLUMN last_error TEXT",
                "CREATE INDEX onceonly_events_ready_idx ON onceonly_events (run_after, id)"
                " WHERE status IN ('pending', 'failed')",
                "CREATE INDEX onceonly_events_leased_idx ON onceonly_events (lease_expires_at)"
                " WHERE status = 'processing'",
                f"""CREATE TABLE onceonly_attempts (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    event_pk INTEGER NOT NULL REFERENCES onceonly_events (id) ON DELETE CASCADE,
                    attempt INTEGER NOT NULL,
                    worker TEXT NOT NULL,
                    outcome TEXT NOT NULL,
                    error_type TEXT,
                    error_message TEXT,
                    traceback TEXT,
                    finished_at TEXT NOT NULL DEFAULT ({_NOW_SQLITE})
                )""",
                "CREATE INDEX onceonly_attempts_event_idx ON onceonly_attempts (event_pk, id)",
                f"""CREATE TABLE onceonly_effects (
                    event_pk INTEGER NOT NULL REFERENCES onceonly_events (id) ON DELETE CASCADE,
                    name TEXT NOT NULL,
                    key TEXT NOT NULL UNIQUE,
                    outcome TEXT NOT NULL,
                    recorded_at TEXT NOT NULL DEFAULT ({_NOW_SQLITE}),
                    PRIMARY KEY (event_pk, name)
                )""",
                f"""CREATE TABLE onceonly_outbox (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    event_pk INTEGER REFERENCES onceonly_events (id) ON DELETE CASCADE,
                    action TEXT NOT NULL,
                    payload TEXT NOT NULL,
                    status TEXT NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'sent', 'dead')),
                    attempts INTEGER NOT NULL DEFAULT 0,
                    available_at REAL NOT NULL DEFAULT 0,
                    last_error TEXT,
                    created_at TEXT NOT NULL DEFAULT ({_NOW_SQLITE}),
                    sent_at TEXT
                )""",
                "CREATE INDEX onceonly_outbox_due_idx ON onceonly_outbox (available_at)"
                " WHERE status = 'pending'",
                f"""CREATE TABLE onceonly_jobs (
                    key TEXT PRIMARY KEY,
                    status TEXT NOT NULL CHECK (status IN ('running', 'done', 'failed')),
                    owner TEXT,
                    fence INTEGER NOT NULL DEFAULT 1,
                    lease_expires_at REAL,
                    result TEXT,
                    error TEXT,
                    runs INTEGER NOT NULL DEFAULT 1,
                    started_at TEXT NOT NULL DEFAULT ({_NOW_SQLITE}),
                    finished_at TEXT
                )""",
            ),
        ),
        Migration(
            3,
            "Idempotency-Key records",
            (
                # Times are unix seconds from the application (REAL): the
                # middleware compares them with its own clock.
                """CREATE TABLE onceonly_idempotency_keys (
                    scope TEXT NOT NULL,
                    key TEXT NOT NULL,
                    fingerprint TEXT NOT NULL,
                    status TEXT NOT NULL CHECK (status IN ('running', 'done')),
                    fence INTEGER NOT NULL DEFAULT 1,
                    locked_until REAL,
                    expires_at REAL NOT NULL,
                    response_status INTEGER,
                    response_headers TEXT,
                    response_body BLOB,
                    chunked INTEGER NOT NULL DEFAULT 0,
                    created_at REAL NOT NULL,
                    completed_at REAL,
                    PRIMARY KEY (scope, key)
                )""",
                "CREATE INDEX onceonly_idempotency_keys_expiry_idx"
                " ON onceonly_idempotency_keys (expires_at)",
                """CREATE TABLE onceonly_idempotency_chunks (
                    scope TEXT NOT NULL,
                    key TEXT NOT NULL,
                    fence INTEGER NOT NULL,
                    seq INTEGER NOT NULL,
                    data BLOB NOT NULL,
                    PRIMARY KEY (scope, key, fence, seq),
                    FOREIGN KEY (scope, key) REFERENCES onceonly_idempotency_keys (scope, key)
                        ON DELETE CASCADE
                )""",
            ),
        ),
        Migration(
            4,
            "duplicates remembered; payload retention",
            (
                # Counted by the same INSERT ... ON CONFLICT DO UPDATE that
                # decides the duplicate: no second statement on the hot path.
                "ALTER TABLE onceonly_events ADD COLUMN duplicates INTEGER NOT NULL DEFAULT 0",
                "ALTER TABLE onceonly_events ADD COLUMN last_duplicate_at TEXT",
                # Set by `onceonly purge` when it drops body and headers: an
                # empty body then reads "purged", never "the sender sent nothing".
                "ALTER TABLE onceonly_events ADD COLUMN payload_purged_at TEXT",
            ),
        ),
        Migration(
            5,
            "outbox claims: owner, lease, fence",
            (
                # A row is claimed (by one runner) while lease_expires_at is in
                # the future; claims are single UPDATEs that the database decides.
                "ALTER TABLE onceonly_outbox ADD COLUMN owner TEXT",
                "ALTER TABLE onceonly_outbox ADD COLUMN lease_expires_at REAL",
                "ALTER TABLE onceonly_outbox ADD COLUMN fence INTEGER NOT NULL DEFAULT 0",
                # run_for() claims the rows of the events it just committed.
                "CREATE INDEX onceonly_outbox_event_idx ON onceonly_outbox (event_pk)"
                " WHERE status = 'pending'",
            ),
        ),
        Migration(
            6,
            "job guard: argument fingerprints, expiry of finished keys",
            (
                # NULL fingerprint: a key recorded before fingerprints, never refused.
                "ALTER TABLE onceonly_jobs ADD COLUMN fingerprint TEXT",
                # Unix seconds; NULL: remembered until purged by hand.
                "ALTER TABLE onceonly_jobs ADD COLUMN expires_at REAL",
                "CREATE INDEX onceonly_jobs_expiry_idx ON onceonly_jobs (expires_at)"
                " WHERE expires_at IS NOT NULL",
            ),
        ),
        Migration(7, "dashboard sessions", (_SESSIONS.format(seconds="REAL"),)),
        Migration(
            8,
            "tenants in the dedup key; object, creation time and ordering key of events",
            (
                # SQLite cannot change a table's UNIQUE constraint: the table is
                # rebuilt (the documented create-copy-drop-rename procedure),
                # with the new columns last, where ALTER TABLE would add them.
                f"""CREATE TABLE onceonly_events_rebuilt (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    provider TEXT NOT NULL,
                    event_id TEXT NOT NULL,
                    event_type TEXT,
                    body BLOB NOT NULL,
                    headers TEXT NOT NULL,
                    received_at TEXT NOT NULL DEFAULT ({_NOW_SQLITE}),
                    status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ({_STATUSES})),
                    attempts INTEGER NOT NULL DEFAULT 0,
                    run_after REAL NOT NULL DEFAULT 0,
                    lease_owner TEXT,
                    lease_expires_at REAL,
                    fence INTEGER NOT NULL DEFAULT 0,
                    processed_at TEXT,
                    handler TEXT,
                    last_error TEXT,
                    duplicates INTEGER NOT NULL DEFAULT 0,
                    last_duplicate_at TEXT,
                    payload_purged_at TEXT,
                    tenant TEXT NOT NULL DEFAULT '',
                    object_id TEXT,
                    occurred_at REAL,
                    ordering_key TEXT,
                    UNIQUE (provider, tenant, event_id)
                )""",
                f"INSERT INTO onceonly_events_rebuilt ({_EVENT_COLUMNS_7})"
                f" SELECT {_EVENT_COLUMNS_7} FROM onceonly_events",
                # AUTOINCREMENT's promise (an id is never reused) survives the
                # copy: the counter may be above max(id) after a purge.
                "DELETE FROM sqlite_sequence WHERE name = 'onceonly_events_rebuilt'",
                "INSERT INTO sqlite_sequence (name, seq) SELECT 'onceonly_events_rebuilt', seq"
                " FROM sqlite_sequence WHERE name = 'onceonly_events'",
                "DROP TABLE onceonly_events",
                "ALTER TABLE onceonly_events_rebuilt RENAME TO onceonly_events",
                "CREATE INDEX onceonly_events_status_idx ON onceonly_events (status, id)",
                "CREATE INDEX onceonly_events_ready_idx ON onceonly_events (run_after, id)"
                " WHERE status IN ('pending', 'failed')",
                "CREATE INDEX onceonly_events_leased_idx ON onceonly_events (lease_expires_at)"
                " WHERE status = 'processing'",
                *_EVENTS_8_INDEXES,
            ),
            rebuilds=True,
        ),
        Migration(9, "indexes for the dashboard's activity chart", _ACTIVITY_INDEXES),
        Migration(10, "events listed by tenant", (_TENANT_INDEX,)),
    ),
    "postgresql": (
        Migration(
            1,
            "events inbox",
            (
                f"""CREATE TABLE onceonly_events (
                    id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
                    provider TEXT NOT NULL,
                    event_id TEXT NOT NULL,
                    event_type TEXT,
                    body BYTEA NOT NULL,
                    headers JSONB NOT NULL,
                    received_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
                    status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ({_STATUSES})),
                    attempts INTEGER NOT NULL DEFAULT 0,
                    CONSTRAINT onceonly_events_provider_event_id_key UNIQUE (provider, event_id)
                )""",
                "CREATE INDEX onceonly_events_status_idx ON onceonly_events (status, id)",
            ),
        ),
        Migration(
            2,
            "worker: leases, retries, attempts, effects, outbox, jobs",
            (
                "ALTER TABLE onceonly_events"
                " ADD COLUMN run_after TIMESTAMPTZ NOT NULL DEFAULT '-infinity',"
                " ADD COLUMN lease_owner TEXT,"
                " ADD COLUMN lease_expires_at TIMESTAMPTZ,"
                " ADD COLUMN fence BIGINT NOT NULL DEFAULT 0,"
                " ADD COLUMN processed_at TIMESTAMPTZ,"
                " ADD COLUMN handler TEXT,"
                " ADD COLUMN last_error TEXT",
                "CREATE INDEX onceonly_events_ready_idx ON onceonly_events (run_after, id)"
                " WHERE status IN ('pending', 'failed')",
                "CREATE INDEX onceonly_events_leased_idx ON onceonly_events (lease_expires_at)"
                " WHERE status = 'processing'",
                """CREATE TABLE onceonly_attempts (
                    id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
                    event_pk BIGINT NOT NULL REFERENCES onceonly_events (id) ON DELETE CASCADE,
                    attempt INTEGER NOT NULL,
                    worker TEXT NOT NULL,
                    outcome TEXT NOT NULL,
                    error_type TEXT,
                    error_message TEXT,
                    traceback TEXT,
                    finished_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
                )""",
                "CREATE INDEX onceonly_attempts_event_idx ON onceonly_attempts (event_pk, id)",
                """CREATE TABLE onceonly_effects (
                    event_pk BIGINT NOT NULL REFERENCES onceonly_events (id) ON DELETE CASCADE,
                    name TEXT NOT NULL,
                    key TEXT NOT NULL UNIQUE,
                    outcome TEXT NOT NULL,
                    recorded_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
                    PRIMARY KEY (event_pk, name)
                )""",
                """CREATE TABLE onceonly_outbox (
                    id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
                    event_pk BIGINT REFERENCES onceonly_events (id) ON DELETE CASCADE,
                    action TEXT NOT NULL,
                    payload TEXT NOT NULL,
                    status TEXT NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'sent', 'dead')),
                    attempts INTEGER NOT NULL DEFAULT 0,
                    available_at TIMESTAMPTZ NOT NULL DEFAULT '-infinity',
                    last_error TEXT,
                    created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
                    sent_at TIMESTAMPTZ
                )""",
                "CREATE INDEX onceonly_outbox_due_idx ON onceonly_outbox (available_at)"
                " WHERE status = 'pending'",
                """CREATE TABLE onceonly_jobs (
                    key TEXT PRIMARY KEY,
                    status TEXT NOT NULL CHECK (status IN ('running', 'done', 'failed')),
                    owner TEXT,
                    fence BIGINT NOT NULL DEFAULT 1,
                    lease_expires_at TIMESTAMPTZ,
                    result TEXT,
                    error TEXT,
                    runs INTEGER NOT NULL DEFAULT 1,
                    started_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
                    finished_at TIMESTAMPTZ
                )""",
                # One NOTIFY per inserting statement (not per row): a batch of
                # 500 events wakes the workers once.
                """CREATE FUNCTION onceonly_notify() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    PERFORM pg_notify('onceonly_events', '');
                    RETURN NULL;
                END $$""",
                "CREATE TRIGGER onceonly_events_notify AFTER INSERT ON onceonly_events"
                " FOR EACH STATEMENT EXECUTE FUNCTION onceonly_notify()",
            ),
        ),
        Migration(
            3,
            "Idempotency-Key records",
            (
                """CREATE TABLE onceonly_idempotency_keys (
                    scope TEXT NOT NULL,
                    key TEXT NOT NULL,
                    fingerprint TEXT NOT NULL,
                    status TEXT NOT NULL CHECK (status IN ('running', 'done')),
                    fence BIGINT NOT NULL DEFAULT 1,
                    locked_until DOUBLE PRECISION,
                    expires_at DOUBLE PRECISION NOT NULL,
                    response_status INTEGER,
                    response_headers TEXT,
                    response_body BYTEA,
                    chunked BOOLEAN NOT NULL DEFAULT false,
                    created_at DOUBLE PRECISION NOT NULL,
                    completed_at DOUBLE PRECISION,
                    PRIMARY KEY (scope, key)
                )""",
                "CREATE INDEX onceonly_idempotency_keys_expiry_idx"
                " ON onceonly_idempotency_keys (expires_at)",
                """CREATE TABLE onceonly_idempotency_chunks (
                    scope TEXT NOT NULL,
                    key TEXT NOT NULL,
                    fence BIGINT NOT NULL,
                    seq INTEGER NOT NULL,
                    data BYTEA NOT NULL,
                    PRIMARY KEY (scope, key, fence, seq),
                    FOREIGN KEY (scope, key) REFERENCES onceonly_idempotency_keys (scope, key)
                        ON DELETE CASCADE
                )""",
            ),
        ),
        Migration(
            4,
            "duplicates remembered; payload retention",
            (
                # Constant defaults: PostgreSQL 11+ adds these columns without
                # rewriting the table.
                "ALTER TABLE onceonly_events"
                " ADD COLUMN duplicates INTEGER NOT NULL DEFAULT 0,"
                " ADD COLUMN last_duplicate_at TIMESTAMPTZ,"
                " ADD COLUMN payload_purged_at TIMESTAMPTZ",
            ),
        ),
        Migration(
            5,
            "outbox claims: owner, lease, fence",
            (
                "ALTER TABLE onceonly_outbox"
                " ADD COLUMN owner TEXT,"
                " ADD COLUMN lease_expires_at TIMESTAMPTZ,"
                " ADD COLUMN fence BIGINT NOT NULL DEFAULT 0",
                "CREATE INDEX onceonly_outbox_event_idx ON onceonly_outbox (event_pk)"
                " WHERE status = 'pending'",
            ),
        ),
        Migration(
            6,
            "job guard: argument fingerprints, expiry of finished keys",
            (
                "ALTER TABLE onceonly_jobs"
                " ADD COLUMN fingerprint TEXT,"
                " ADD COLUMN expires_at TIMESTAMPTZ",
                "CREATE INDEX onceonly_jobs_expiry_idx ON onceonly_jobs (expires_at)"
                " WHERE expires_at IS NOT NULL",
            ),
        ),
        Migration(7, "dashboard sessions", (_SESSIONS.format(seconds="DOUBLE PRECISION"),)),
        # SQLite keeps these records in the ``-effects`` file next to the main
        # one (a keyed task's transaction holds the main file's write lock):
        # see onceonly.store.job_effects, which creates that table.
        Migration(
            8,
            "effect records of keyed tasks",
            (
                """CREATE TABLE onceonly_job_effects (
                    job_key TEXT NOT NULL REFERENCES onceonly_jobs (key) ON DELETE CASCADE,
                    name TEXT NOT NULL,
                    key TEXT NOT NULL UNIQUE,
                    outcome TEXT NOT NULL,
                    recorded_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
                    PRIMARY KEY (job_key, name)
                )""",
            ),
        ),
        Migration(
            9,
            "tenants in the dedup key; object, creation time and ordering key of events",
            (
                # Constant defaults: no table rewrite. The new unique index is
                # built under the migration's lock (the table is locked while
                # it builds: run it where a pause of receipt is acceptable).
                "ALTER TABLE onceonly_events"
                " ADD COLUMN tenant TEXT NOT NULL DEFAULT '',"
                " ADD COLUMN object_id TEXT,"
                " ADD COLUMN occurred_at TIMESTAMPTZ,"
                " ADD COLUMN ordering_key TEXT",
                "ALTER TABLE onceonly_events"
                " DROP CONSTRAINT onceonly_events_provider_event_id_key,"
                " ADD CONSTRAINT onceonly_events_provider_tenant_event_id_key"
                " UNIQUE (provider, tenant, event_id)",
                *_EVENTS_8_INDEXES,
            ),
        ),
        Migration(10, "indexes for the dashboard's activity chart", _ACTIVITY_INDEXES),
        # Built under the migration's lock, like 9's; quick while no event
        # has a tenant, since the index holds only those that do.
        Migration(11, "events listed by tenant", (_TENANT_INDEX,)),
    ),
}


def pending(engine: str, applied: int) -> tuple[Migration, ...]:
    return tuple(m for m in MIGRATIONS[engine] if m.version > applied)


def latest(engine: str) -> int:
    return MIGRATIONS[engine][-1].version
