"""The onceonly tables as SQLAlchemy :class:`~sqlalchemy.MetaData`, at the
latest migration, one description per engine.

:mod:`.migrations` stays the schema's source: SQL text, applied and versioned
by ``onceonly migrate``, which also makes what a ``MetaData`` cannot carry
(PostgreSQL's ``NOTIFY`` trigger and its function, the version rows in
``onceonly_schema``). This description is for tools that compare schemas,
Alembic's autogenerate above all: a project that lists it in its
``target_metadata`` sees onceonly's tables as known, not as tables to drop.
``tests/integration/store/test_schema_metadata.py`` reflects freshly migrated
databases and compares them with it using Alembic's own comparison, so a
migration added without its counterpart here fails the build.

It holds what autogenerate compares by default: tables, columns with their
types and nullability, primary, unique and foreign keys, indexes. Server
defaults are left out (keep ``compare_server_default`` off for these tables),
and the CHECKs are written down for the reader, as Alembic does not compare
them. So it is not a way to create the tables: ``create_all`` would make them
without their defaults, trigger or version rows.

Why one description per engine and not one with type variants: what SQLite
reports differs in more than types. A ``TEXT PRIMARY KEY`` there accepts NULL
(and is reflected so), its unique constraints have no names, and SQLAlchemy
does not read ``ON DELETE`` from a column's inline ``REFERENCES`` (the
database still cascades). A single ``MetaData`` would show a difference on one
engine or the other. On SQLite the effect ledger writes to a file of its own
(:mod:`.effects`); the ``onceonly_effects`` described here is the main file's,
which the migrations create.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from .._exceptions import ConfigurationError

__all__ = ["TABLE_PREFIX", "describe"]

#: Every onceonly table's name starts with this; no other table's should.
TABLE_PREFIX = "onceonly_"

_STATUSES = "'pending', 'processing', 'processed', 'failed', 'dead'"


@dataclass(frozen=True, slots=True)
class _Dialect:
    """How one engine spells what the migrations declare."""

    #: Row ids, fences: BIGINT on PostgreSQL, SQLite's (64-bit) INTEGER.
    bigint: sa.types.TypeEngine[Any]
    #: A moment the database records: ISO 8601 text on SQLite.
    stamp: sa.types.TypeEngine[Any]
    #: A moment the worker compares with its clock: unix seconds on SQLite.
    due: sa.types.TypeEngine[Any]
    #: Unix seconds on both engines.
    seconds: sa.types.TypeEngine[Any]
    headers: sa.types.TypeEngine[Any]
    flag: sa.types.TypeEngine[Any]
    #: A primary key declared without NOT NULL: SQLite lets it hold NULL.
    bare_key_nullable: bool
    #: Whether reflection reports the ``ON DELETE`` of an inline REFERENCES.
    inline_ondelete: bool
    #: Whether the database names the unique constraints the migrations declare.
    named_uniques: bool


_DIALECTS: dict[str, _Dialect] = {
    "sqlite": _Dialect(
        bigint=sa.Integer(),
        stamp=sa.Text(),
        due=sa.REAL(),
        seconds=sa.REAL(),
        headers=sa.Text(),
        flag=sa.Integer(),
        bare_key_nullable=True,
        inline_ondelete=False,
        named_uniques=False,
    ),
    "postgresql": _Dialect(
        bigint=sa.BigInteger(),
        stamp=postgresql.TIMESTAMP(timezone=True),
        due=postgresql.TIMESTAMP(timezone=True),
        seconds=postgresql.DOUBLE_PRECISION(),
        headers=postgresql.JSONB(),
        flag=sa.Boolean(create_constraint=False),
        bare_key_nullable=False,
        inline_ondelete=True,
        named_uniques=True,
    ),
}


def describe(kind: str) -> sa.MetaData:
    """A new ``MetaData`` holding every onceonly table as the migrations leave it
    on `kind` (``"sqlite"`` or ``"postgresql"``, as a dialect names itself)."""
    dialect = _DIALECTS.get(kind)
    if dialect is None:
        raise ConfigurationError(f"onceonly runs on 'sqlite' or 'postgresql', not {kind!r}")
    return _Builder(dialect, kind).build()


class _Builder:
    def __init__(self, d: _Dialect, kind: str) -> None:
        self.d = d
        self.kind = kind
        self.metadata = sa.MetaData()

    def build(self) -> sa.MetaData:
        self._schema()
        self._events()
        self._attempts()
        self._effects()
        self._outbox()
        self._jobs()
        if self.kind == "postgresql":
            # SQLite keeps keyed tasks' effect records in the ``-effects`` file.
            self._job_effects()
        self._idempotency()
        self._dashboard_sessions()
        return self.metadata

    # Helpers for what several tables share.

    def _bare_key(self, name: str, type_: sa.types.TypeEngine[Any]) -> sa.Column[object]:
        return sa.Column(
            name, type_, primary_key=True, autoincrement=False, nullable=self.d.bare_key_nullable
        )

    def _id(self) -> sa.Column[int]:
        # IDENTITY on PostgreSQL; AUTOINCREMENT on SQLite (the tables'
        # sqlite_autoincrement): ids are never reused after a purge.
        return sa.Column(
            "id",
            self.d.bigint,
            sa.Identity(always=False),
            primary_key=True,
            nullable=self.d.bare_key_nullable,
        )

    def _event_pk(self, *, nullable: bool = False, primary_key: bool = False) -> sa.Column[int]:
        ondelete = "CASCADE" if self.d.inline_ondelete else None
        return sa.Column(
            "event_pk",
            self.d.bigint,
            sa.ForeignKey("onceonly_events.id", ondelete=ondelete),
            nullable=nullable,
            primary_key=primary_key,
            autoincrement=False,
        )

    def _claim(self, owner: str) -> list[sa.Column[Any]]:
        # A lease: who holds the row, until when, and the fence that tells a
        # late holder's writes from the current one's (see onceonly.leases).
        return [
            sa.Column(owner, sa.Text),
            sa.Column("lease_expires_at", self.d.due),
            sa.Column("fence", self.d.bigint, nullable=False),
        ]

    def _unique(self, *columns: str, name: str) -> sa.UniqueConstraint:
        return sa.UniqueConstraint(*columns, name=name if self.d.named_uniques else None)

    @staticmethod
    def _partial(name: str, *columns: str, where: str) -> sa.Index:
        return sa.Index(
            name, *columns, sqlite_where=sa.text(where), postgresql_where=sa.text(where)
        )

    # The tables, in the order the migrations create them.

    def _schema(self) -> None:
        sa.Table(
            "onceonly_schema",
            self.metadata,
            self._bare_key("version", sa.Integer()),
            sa.Column("description", sa.Text, nullable=False),
            sa.Column("applied_at", self.d.stamp, nullable=False),
        )

    def _events(self) -> None:
        d = self.d
        sa.Table(
            "onceonly_events",
            self.metadata,
            self._id(),
            sa.Column("provider", sa.Text, nullable=False),
            sa.Column("event_id", sa.Text, nullable=False),
            sa.Column("event_type", sa.Text),
            sa.Column("body", sa.LargeBinary, nullable=False),
            sa.Column("headers", d.headers, nullable=False),
            sa.Column("received_at", d.stamp, nullable=False),
            sa.Column("status", sa.Text, nullable=False),
            sa.Column("attempts", sa.Integer, nullable=False),
            sa.Column("run_after", d.due, nullable=False),
            *self._claim("lease_owner"),
            sa.Column("processed_at", d.stamp),
            sa.Column("handler", sa.Text),
            sa.Column("last_error", sa.Text),
            sa.Column("duplicates", sa.Integer, nullable=False),
            sa.Column("last_duplicate_at", d.stamp),
            sa.Column("payload_purged_at", d.stamp),
            sa.Column("tenant", sa.Text, nullable=False),
            sa.Column("object_id", sa.Text),
            sa.Column("occurred_at", d.due),
            sa.Column("ordering_key", sa.Text),
            sa.CheckConstraint(f"status IN ({_STATUSES})"),
            # The dedup key (G2): the database decides what is a duplicate.
            self._unique(
                "provider",
                "tenant",
                "event_id",
                name="onceonly_events_provider_tenant_event_id_key",
            ),
            sa.Index("onceonly_events_status_idx", "status", "id"),
            self._partial(
                "onceonly_events_ready_idx",
                "run_after",
                "id",
                where="status IN ('pending', 'failed')",
            ),
            self._partial(
                "onceonly_events_leased_idx", "lease_expires_at", where="status = 'processing'"
            ),
            self._partial("onceonly_events_object_idx", "object_id", where="object_id IS NOT NULL"),
            self._partial(
                "onceonly_events_ordering_idx",
                "ordering_key",
                "occurred_at",
                "id",
                where="ordering_key IS NOT NULL AND status IN ('pending', 'processing', 'failed')",
            ),
            self._partial(
                "onceonly_events_processed_idx", "processed_at", where="processed_at IS NOT NULL"
            ),
            self._partial(
                "onceonly_events_duplicate_idx",
                "last_duplicate_at",
                where="last_duplicate_at IS NOT NULL",
            ),
            self._partial("onceonly_events_tenant_idx", "tenant", "id", where="tenant <> ''"),
            sqlite_autoincrement=True,
        )

    def _attempts(self) -> None:
        sa.Table(
            "onceonly_attempts",
            self.metadata,
            self._id(),
            self._event_pk(),
            sa.Column("attempt", sa.Integer, nullable=False),
            sa.Column("worker", sa.Text, nullable=False),
            sa.Column("outcome", sa.Text, nullable=False),
            sa.Column("error_type", sa.Text),
            sa.Column("error_message", sa.Text),
            sa.Column("traceback", sa.Text),
            sa.Column("finished_at", self.d.stamp, nullable=False),
            sa.Index("onceonly_attempts_event_idx", "event_pk", "id"),
            sa.Index("onceonly_attempts_finished_idx", "finished_at"),
            sqlite_autoincrement=True,
        )

    def _effects(self) -> None:
        sa.Table(
            "onceonly_effects",
            self.metadata,
            self._event_pk(primary_key=True),
            sa.Column("name", sa.Text, primary_key=True, nullable=False),
            sa.Column("key", sa.Text, nullable=False),
            sa.Column("outcome", sa.Text, nullable=False),
            sa.Column("recorded_at", self.d.stamp, nullable=False),
            # An effect's idempotency key is given to one call only.
            self._unique("key", name="onceonly_effects_key_key"),
        )

    def _outbox(self) -> None:
        d = self.d
        sa.Table(
            "onceonly_outbox",
            self.metadata,
            self._id(),
            self._event_pk(nullable=True),
            sa.Column("action", sa.Text, nullable=False),
            sa.Column("payload", sa.Text, nullable=False),
            sa.Column("status", sa.Text, nullable=False),
            sa.Column("attempts", sa.Integer, nullable=False),
            sa.Column("available_at", d.due, nullable=False),
            sa.Column("last_error", sa.Text),
            sa.Column("created_at", d.stamp, nullable=False),
            sa.Column("sent_at", d.stamp),
            *self._claim("owner"),
            sa.CheckConstraint("status IN ('pending', 'sent', 'dead')"),
            self._partial("onceonly_outbox_due_idx", "available_at", where="status = 'pending'"),
            self._partial("onceonly_outbox_event_idx", "event_pk", where="status = 'pending'"),
            sqlite_autoincrement=True,
        )

    def _jobs(self) -> None:
        d = self.d
        sa.Table(
            "onceonly_jobs",
            self.metadata,
            self._bare_key("key", sa.Text()),
            sa.Column("status", sa.Text, nullable=False),
            *self._claim("owner"),
            sa.Column("result", sa.Text),
            sa.Column("error", sa.Text),
            sa.Column("runs", sa.Integer, nullable=False),
            sa.Column("started_at", d.stamp, nullable=False),
            sa.Column("finished_at", d.stamp),
            sa.Column("fingerprint", sa.Text),
            sa.Column("expires_at", d.due),
            sa.CheckConstraint("status IN ('running', 'done', 'failed')"),
            self._partial("onceonly_jobs_expiry_idx", "expires_at", where="expires_at IS NOT NULL"),
        )

    def _job_effects(self) -> None:
        sa.Table(
            "onceonly_job_effects",
            self.metadata,
            sa.Column(
                "job_key",
                sa.Text,
                sa.ForeignKey("onceonly_jobs.key", ondelete="CASCADE"),
                primary_key=True,
                nullable=False,
            ),
            sa.Column("name", sa.Text, primary_key=True, nullable=False),
            sa.Column("key", sa.Text, nullable=False),
            sa.Column("outcome", sa.Text, nullable=False),
            sa.Column("recorded_at", self.d.stamp, nullable=False),
            # A task effect's idempotency key is given to one call only.
            self._unique("key", name="onceonly_job_effects_key_key"),
        )

    def _idempotency(self) -> None:
        d = self.d
        sa.Table(
            "onceonly_idempotency_keys",
            self.metadata,
            sa.Column("scope", sa.Text, primary_key=True, nullable=False),
            sa.Column("key", sa.Text, primary_key=True, nullable=False),
            sa.Column("fingerprint", sa.Text, nullable=False),
            sa.Column("status", sa.Text, nullable=False),
            sa.Column("fence", d.bigint, nullable=False),
            sa.Column("locked_until", d.seconds),
            sa.Column("expires_at", d.seconds, nullable=False),
            sa.Column("response_status", sa.Integer),
            sa.Column("response_headers", sa.Text),
            sa.Column("response_body", sa.LargeBinary),
            sa.Column("chunked", d.flag, nullable=False),
            sa.Column("created_at", d.seconds, nullable=False),
            sa.Column("completed_at", d.seconds),
            sa.CheckConstraint("status IN ('running', 'done')"),
            sa.Index("onceonly_idempotency_keys_expiry_idx", "expires_at"),
        )
        sa.Table(
            "onceonly_idempotency_chunks",
            self.metadata,
            sa.Column("scope", sa.Text, primary_key=True, nullable=False),
            sa.Column("key", sa.Text, primary_key=True, nullable=False),
            sa.Column("fence", d.bigint, primary_key=True, autoincrement=False, nullable=False),
            sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False, nullable=False),
            sa.Column("data", sa.LargeBinary, nullable=False),
            # A table-level FOREIGN KEY: SQLite's reflection reads this one's ON DELETE.
            sa.ForeignKeyConstraint(
                ["scope", "key"],
                ["onceonly_idempotency_keys.scope", "onceonly_idempotency_keys.key"],
                ondelete="CASCADE",
            ),
        )

    def _dashboard_sessions(self) -> None:
        d = self.d
        sa.Table(
            "onceonly_dashboard_sessions",
            self.metadata,
            self._bare_key("id", sa.Text()),
            sa.Column("created_at", d.seconds, nullable=False),
            sa.Column("expires_at", d.seconds, nullable=False),
            sa.Column("ended_at", d.seconds),
        )
