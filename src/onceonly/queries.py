"""Named SQL for the effect ledger, the outbox and the job guard.

(The work queue's statements are in :mod:`onceonly.store.work_queue`.)

One entry per engine. PostgreSQL computes times with ``now()`` on the server
(many machines, one clock); SQLite, which lives on one machine, gets ``:now``
in unix seconds from the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["QUERIES", "Queries"]


@dataclass(frozen=True, slots=True)
class Queries:
    find_effect: str
    record_effect: str
    stage: str
    #: Claim the due, unclaimed outbox rows of just-committed events (:pks).
    claim_outbox_of_events: str
    #: Claim up to :n due rows that nobody holds (or whose runner's lease expired).
    claim_outbox: str
    #: Sent: no fence check, since the send happened whoever holds the row now,
    #: and recording it is what stops a second send.
    mark_sent: str
    #: A failed send: only its claimant (:fence) records it and lets the row go.
    mark_outbox_failed: str
    extend_outbox_leases: str
    job_claim: str
    job_read: str
    job_takeover: str
    job_finish: str
    job_fail: str
    job_extend: str
    #: Delete finished keys whose memory expired.
    job_purge: str


_POSTGRES = Queries(
    find_effect="SELECT outcome FROM onceonly_effects WHERE event_pk = :event_pk AND name = :name",
    record_effect="""
        INSERT INTO onceonly_effects (event_pk, name, key, outcome)
        VALUES (:event_pk, :name, :key, :outcome) ON CONFLICT DO NOTHING
    """,
    stage="""
        INSERT INTO onceonly_outbox (event_pk, action, payload, available_at)
        VALUES (:event_pk, :action, :payload, now())
        RETURNING id
    """,
    # SKIP LOCKED: a row another runner is claiming right now is its, not ours;
    # a row it claimed and committed is re-checked (lease in the future): skipped.
    claim_outbox_of_events="""
        UPDATE onceonly_outbox o SET owner = :owner, fence = o.fence + 1,
            lease_expires_at = now() + make_interval(secs => :lease)
        WHERE o.id IN (
            SELECT id FROM onceonly_outbox
            WHERE event_pk = ANY(:pks) AND status = 'pending' AND available_at <= now()
                AND (lease_expires_at IS NULL OR lease_expires_at < now())
            ORDER BY id FOR UPDATE SKIP LOCKED)
        RETURNING o.id, o.action, o.payload, o.attempts, o.fence
    """,
    claim_outbox="""
        UPDATE onceonly_outbox o SET owner = :owner, fence = o.fence + 1,
            lease_expires_at = now() + make_interval(secs => :lease)
        WHERE o.id IN (
            SELECT id FROM onceonly_outbox
            WHERE status = 'pending' AND available_at <= now()
                AND (lease_expires_at IS NULL OR lease_expires_at < now())
            ORDER BY id LIMIT :n FOR UPDATE SKIP LOCKED)
        RETURNING o.id, o.action, o.payload, o.attempts, o.fence
    """,
    mark_sent="""
        UPDATE onceonly_outbox SET status = 'sent', sent_at = now(), attempts = attempts + 1,
            owner = NULL, lease_expires_at = NULL
        WHERE id = :id AND status = 'pending'
    """,
    mark_outbox_failed="""
        UPDATE onceonly_outbox SET attempts = attempts + 1, last_error = :error,
            status = CASE WHEN :dead THEN 'dead' ELSE 'pending' END,
            available_at = now() + make_interval(secs => :delay),
            owner = NULL, lease_expires_at = NULL
        WHERE id = :id AND fence = :fence AND status = 'pending'
    """,
    extend_outbox_leases="""
        UPDATE onceonly_outbox SET lease_expires_at = now() + make_interval(secs => :lease)
        WHERE id = ANY(:ids) AND owner = :owner AND status = 'pending'
    """,
    job_claim="""
        INSERT INTO onceonly_jobs (key, status, owner, lease_expires_at, fingerprint)
        VALUES (:key, 'running', :owner, now() + make_interval(secs => :lease), :fingerprint)
        ON CONFLICT (key) DO NOTHING RETURNING fence
    """,
    job_read="""
        SELECT status, fence, result, fingerprint, lease_expires_at < now() AS expired,
            coalesce(expires_at < now(), false) AS forgotten
        FROM onceonly_jobs WHERE key = :key
    """,
    # A finished key whose memory expired is taken like a new one.
    job_takeover="""
        UPDATE onceonly_jobs SET status = 'running', owner = :owner, fence = fence + 1,
            lease_expires_at = now() + make_interval(secs => :lease), runs = runs + 1,
            started_at = now(), error = NULL, fingerprint = :fingerprint, expires_at = NULL
        WHERE key = :key AND fence = :fence
            AND (status = 'failed' OR (status = 'running' AND lease_expires_at < now())
                 OR (status = 'done' AND expires_at < now()))
        RETURNING fence
    """,
    job_finish="""
        UPDATE onceonly_jobs SET status = 'done', result = :result, finished_at = now(),
            lease_expires_at = NULL,
            expires_at = now() + make_interval(secs => CAST(:ttl AS DOUBLE PRECISION))
        WHERE key = :key AND fence = :fence AND status = 'running'
    """,
    job_fail="""
        UPDATE onceonly_jobs SET status = 'failed', error = :error, finished_at = now(),
            lease_expires_at = NULL,
            expires_at = now() + make_interval(secs => CAST(:ttl AS DOUBLE PRECISION))
        WHERE key = :key AND fence = :fence AND status = 'running'
    """,
    job_extend="""
        UPDATE onceonly_jobs SET lease_expires_at = now() + make_interval(secs => :lease)
        WHERE key = :key AND fence = :fence AND status = 'running'
    """,
    job_purge="""
        DELETE FROM onceonly_jobs WHERE status IN ('done', 'failed') AND expires_at < now()
    """,
)

_SQLITE = Queries(
    find_effect=_POSTGRES.find_effect,
    record_effect=_POSTGRES.record_effect,
    stage="""
        INSERT INTO onceonly_outbox (event_pk, action, payload, available_at)
        VALUES (:event_pk, :action, :payload, :now)
        RETURNING id
    """,
    # One statement under the write lock: the read and the claim cannot be split
    # by another runner.
    claim_outbox_of_events="""
        UPDATE onceonly_outbox SET owner = :owner, fence = fence + 1,
            lease_expires_at = :now + :lease
        WHERE id IN (
            SELECT id FROM onceonly_outbox
            WHERE event_pk IN (SELECT value FROM json_each(:pks_json))
                AND status = 'pending' AND available_at <= :now
                AND (lease_expires_at IS NULL OR lease_expires_at < :now))
        RETURNING id, action, payload, attempts, fence
    """,
    claim_outbox="""
        UPDATE onceonly_outbox SET owner = :owner, fence = fence + 1,
            lease_expires_at = :now + :lease
        WHERE id IN (
            SELECT id FROM onceonly_outbox
            WHERE status = 'pending' AND available_at <= :now
                AND (lease_expires_at IS NULL OR lease_expires_at < :now)
            ORDER BY id LIMIT :n)
        RETURNING id, action, payload, attempts, fence
    """,
    mark_sent="""
        UPDATE onceonly_outbox SET status = 'sent', attempts = attempts + 1,
            sent_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), owner = NULL, lease_expires_at = NULL
        WHERE id = :id AND status = 'pending'
    """,
    mark_outbox_failed="""
        UPDATE onceonly_outbox SET attempts = attempts + 1, last_error = :error,
            status = CASE WHEN :dead THEN 'dead' ELSE 'pending' END,
            available_at = :now + :delay, owner = NULL, lease_expires_at = NULL
        WHERE id = :id AND fence = :fence AND status = 'pending'
    """,
    extend_outbox_leases="""
        UPDATE onceonly_outbox SET lease_expires_at = :now + :lease
        WHERE id IN (SELECT value FROM json_each(:ids_json))
            AND owner = :owner AND status = 'pending'
    """,
    job_claim="""
        INSERT INTO onceonly_jobs (key, status, owner, lease_expires_at, fingerprint)
        VALUES (:key, 'running', :owner, :now + :lease, :fingerprint)
        ON CONFLICT (key) DO NOTHING RETURNING fence
    """,
    job_read="""
        SELECT status, fence, result, fingerprint, lease_expires_at < :now AS expired,
            coalesce(expires_at < :now, 0) AS forgotten
        FROM onceonly_jobs WHERE key = :key
    """,
    job_takeover="""
        UPDATE onceonly_jobs SET status = 'running', owner = :owner, fence = fence + 1,
            lease_expires_at = :now + :lease, runs = runs + 1,
            started_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), error = NULL,
            fingerprint = :fingerprint, expires_at = NULL
        WHERE key = :key AND fence = :fence
            AND (status = 'failed' OR (status = 'running' AND lease_expires_at < :now)
                 OR (status = 'done' AND expires_at < :now))
        RETURNING fence
    """,
    job_finish="""
        UPDATE onceonly_jobs SET status = 'done', result = :result, lease_expires_at = NULL,
            finished_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), expires_at = :now + :ttl
        WHERE key = :key AND fence = :fence AND status = 'running'
    """,
    job_fail="""
        UPDATE onceonly_jobs SET status = 'failed', error = :error, lease_expires_at = NULL,
            finished_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), expires_at = :now + :ttl
        WHERE key = :key AND fence = :fence AND status = 'running'
    """,
    job_extend="""
        UPDATE onceonly_jobs SET lease_expires_at = :now + :lease
        WHERE key = :key AND fence = :fence AND status = 'running'
    """,
    job_purge="""
        DELETE FROM onceonly_jobs WHERE status IN ('done', 'failed') AND expires_at < :now
    """,
)

QUERIES = {"postgresql": _POSTGRES, "sqlite": _SQLITE}
