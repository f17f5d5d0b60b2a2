"""``onceonly migrate``, ``onceonly purge`` and ``onceonly idempotency``:
the schema and retention."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

import click
from rich.table import Table

from .._click import FORMAT as _FORMAT
from ..retention import DEFAULT_PURGE_BATCH, MAX_PURGE_PAUSE
from ..store import create_store
from .options import app_options, console, duration_option, fail_cleanly, load, with_store

if TYPE_CHECKING:
    from datetime import timedelta

    from ..config import Onceonly

__all__ = ["idempotency", "migrate", "purge_and_report", "purge_command"]


@click.command()
@app_options
@fail_cleanly
def migrate(app_spec: str | None, database_url: str | None) -> None:
    """Create or upgrade onceonly's tables (all prefixed onceonly_)."""
    app = load(app_spec, database_url)
    # A store of its own that does not migrate on open: this command reports
    # what it applied itself (the app's store would apply it on open, silently).
    store = create_store(app.database_url, auto_migrate=False)

    async def run() -> tuple[list[int], int]:
        try:
            applied = await store.migrate()
            return applied, await store.schema_version()
        finally:
            await store.close()

    applied, version = asyncio.run(run())
    if applied:
        console.print(f"applied migrations {', '.join(map(str, applied))}; schema at {version}")
    else:
        console.print(f"schema already at version {version}; nothing to do")


@click.group()
def idempotency() -> None:
    """Idempotency-Key records of your API (see docs/idempotency.md)."""


@idempotency.command("purge")
@app_options
@_FORMAT
@fail_cleanly
def purge_keys(app_spec: str | None, database_url: str | None, fmt: str) -> None:
    """Delete expired Idempotency-Key records (run it from cron, say hourly).

    Expired records are already ignored by the middleware; purging only frees
    the space. Records still within their expiry are never touched.
    """
    import time

    app = load(app_spec, database_url)
    deleted = with_store(app, lambda store: store.idempotency_keys().purge(now=time.time()))
    if fmt == "json":
        click.echo(json.dumps({"deleted": deleted}))
    else:
        console.print(f"deleted {deleted} expired Idempotency-Key record(s)")


@click.command("purge")
@app_options
@click.option(
    "--older-than",
    metavar="DURATION",
    help="Drop body and headers of processed events received longer ago than this "
    "(30d, 12h, 90m). [env: ONCEONLY_RETENTION_PAYLOADS; default: 30d]",
)
@click.option(
    "--keep-ids",
    metavar="DURATION",
    help="Delete processed events (their dedup memory) only past this age; at least "
    "--older-than. [env: ONCEONLY_RETENTION_IDS; default: 400d]",
)
@click.option("--dry-run", is_flag=True, help="Count what would go; change nothing.")
@click.option(
    "--batch-size",
    default=DEFAULT_PURGE_BATCH,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="Rows per transaction.",
)
@click.option(
    "--pause",
    metavar="SECONDS",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0, MAX_PURGE_PAUSE),
    help="Wait this long after each batch, so that receivers and workers on the same "
    "database meet fewer of the purge's writes: 0.014 made a purge of 1M payloads take "
    "twice as long and cut the receiver's p99 during it by half or more "
    "(docs/operations.md).",
)
@_FORMAT
@fail_cleanly
def purge_command(
    app_spec: str | None,
    database_url: str | None,
    older_than: str | None,
    keep_ids: str | None,
    dry_run: bool,
    batch_size: int,
    pause: float,
    fmt: str,
) -> None:
    """Apply retention: drop old payloads, forget very old event ids, and delete
    expired Idempotency-Key records. Run it from cron (daily is plenty).

    Only processed events are touched: pending, failed and dead ones keep their
    payload (dead ones for replay). A resend of a purged event is still answered
    as a duplicate until --keep-ids has passed. See docs/operations.md.
    """
    payloads = duration_option(older_than, "--older-than")
    ids = duration_option(keep_ids, "--keep-ids")
    app = load(app_spec, database_url)
    purge_and_report(
        app,
        older_than=payloads,
        keep_ids=ids,
        dry_run=dry_run,
        batch_size=batch_size,
        pause=pause,
        fmt=fmt,
    )


def purge_and_report(
    app: Onceonly,
    *,
    older_than: timedelta | None,
    keep_ids: timedelta | None,
    dry_run: bool,
    batch_size: int,
    fmt: str,
    pause: float = 0.0,
) -> None:
    """What ``onceonly purge`` does once its deployment is loaded (also
    ``manage.py onceonly_purge``): purge, then print the report."""
    from ..retention import purge

    report = purge(
        app,
        older_than=older_than,
        keep_ids=keep_ids,
        dry_run=dry_run,
        batch_size=batch_size,
        pause=pause,
    )
    if fmt == "json":
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    table = Table("", "would go" if dry_run else "purged")
    table.add_row(
        f"payloads of processed events received before {report.payload_cutoff:%Y-%m-%d %H:%M}",
        str(report.payloads_dropped),
    )
    table.add_row(
        f"processed events received before {report.ids_cutoff:%Y-%m-%d %H:%M}",
        str(report.events_deleted),
    )
    table.add_row("attempt records", str(report.attempts_deleted))
    table.add_row("effect records", str(report.effects_deleted))
    table.add_row("outbox rows (sent or dead)", str(report.outbox_deleted))
    table.add_row("expired Idempotency-Key records", str(report.idempotency_keys_deleted))
    table.add_row("expired job guard keys", str(report.jobs_deleted))
    console.print(table)
    if dry_run:
        console.print("dry run: nothing was changed")
