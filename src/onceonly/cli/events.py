"""``onceonly events``: list, show and replay what arrived."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TYPE_CHECKING, NoReturn

import click
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .._click import FORMAT as _FORMAT
from ..config import Onceonly
from ..events import Event, EventStatus
from .options import app_options, console, errors, fail_cleanly, load, with_store

if TYPE_CHECKING:
    from ..dashboard.redaction import Redactor

__all__ = ["events", "replay_and_report"]


@click.group()
def events() -> None:
    """See what arrived."""


@events.command("list")
@app_options
@click.option("--provider", help="Only this provider (route name).")
@click.option(
    "--tenant",
    help="Only this tenant's events (the merchant in /webhooks/PROVIDER/TENANT); "
    "'' for the events without one.",
)
@click.option(
    "--status", type=click.Choice([s.value for s in EventStatus]), help="Only this status."
)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--before", "before_id", type=int, help="Only events with an id below this one.")
@click.option(
    "--object-id",
    help="Only events about this provider object (a payment id), from every provider.",
)
@_FORMAT
@fail_cleanly
def list_events(
    app_spec: str | None,
    database_url: str | None,
    provider: str | None,
    tenant: str | None,
    status: str | None,
    limit: int,
    before_id: int | None,
    object_id: str | None,
    fmt: str,
) -> None:
    """List events, newest first."""
    app = load(app_spec, database_url)
    found = with_store(
        app,
        lambda store: store.list_events(
            provider=provider,
            status=EventStatus(status) if status else None,
            limit=limit,
            before_id=before_id,
            object_id=object_id,
            tenant=tenant,
        ),
    )
    if fmt == "json":
        click.echo(json.dumps([e.to_dict(include_body=False) for e in found], indent=2))
        return
    if not found:
        console.print("no events")
        return
    # The last error earns a column only when something failed.
    with_errors = any(e.last_error for e in found)
    # So does the tenant, in a deployment that has them.
    with_tenants = tenant is not None or any(e.tenant for e in found)
    columns = ["id", "provider", *(["tenant"] if with_tenants else []), "event id", "type"]
    table = Table(*columns, "status", "attempts", "received at")
    if with_errors:
        table.add_column("last error")
    for e in found:
        cells = [
            str(e.id),
            e.provider,
            *([e.tenant or "-"] if with_tenants else []),
            e.event_id,
            e.event_type or "-",
            e.status.value,
            str(e.attempts),
            e.received_at.strftime("%Y-%m-%d %H:%M:%S"),
        ]
        # Text, not str: an event type or error from the network is data,
        # never Rich markup ("[/bold]" would crash the table, "[link=...]"
        # would become a terminal hyperlink).
        table.add_row(*map(Text, cells), *([Text(e.last_error or "-")] if with_errors else []))
    console.print(table)


_TENANT = click.option(
    "--tenant",
    default="",
    help="The tenant PROVIDER:EVENT_ID belongs to (two merchants' events may share an id).",
)


@events.command("show")
@app_options
@click.argument("ref")
@_TENANT
@_FORMAT
@fail_cleanly
def show_event(
    app_spec: str | None, database_url: str | None, ref: str, tenant: str, fmt: str
) -> None:
    """Show one event with its headers and body.

    REF is the row id shown by `events list`, or PROVIDER:EVENT_ID
    (for example stripe:evt_1N...; with --tenant for a tenant's event).
    """
    from ..dashboard.redaction import Redactor
    from ..operations import attempts_of

    app = load(app_spec, database_url)
    found = _find(app, ref, tenant)
    if found is None:
        _not_found(app, ref, tenant)
    attempts = attempts_of(app.engine, found.id)
    redactor = Redactor(app.dashboard_redact)
    if fmt == "json":
        shown = {**found.to_dict(), "headers": redactor.header_values(found.headers)}
        if "body" in shown:
            body = redactor.body(found.body, found.headers.get("content-type"))
            if body.redacted:
                shown["body"] = body.text
        click.echo(
            json.dumps({**shown, "attempts_history": [a.to_dict() for a in attempts]}, indent=2)
        )
        return
    _print_event(found, redactor)
    if attempts:
        table = Table("attempt", "outcome", "worker", "error", "finished at")
        for a in attempts:
            error = f"{a.error_type}: {a.error_message}" if a.error_type else "-"
            table.add_row(
                *map(Text, (str(a.attempt), a.outcome, a.worker, error, str(a.finished_at)))
            )
        console.print(table)
        last = attempts[-1]
        if last.traceback:
            console.print("[bold]last traceback[/bold]")
            console.print(last.traceback, markup=False, highlight=False)


@events.command("replay")
@app_options
@click.argument("ref", required=False)
@click.option(
    "--status", type=click.Choice(["failed", "dead"]), help="Replay every event with this status."
)
@_TENANT
@_FORMAT
@fail_cleanly
def replay_events(
    app_spec: str | None,
    database_url: str | None,
    ref: str | None,
    status: str | None,
    tenant: str,
    fmt: str,
) -> None:
    """Put events back in line: one (REF: row id or PROVIDER:EVENT_ID, with
    --tenant for a tenant's event) or all with --status. Attempts start again
    from zero; recorded effects are not called again."""
    if (ref is None) == (status is None):
        raise click.UsageError("give either an event (REF) or --status, not both")
    replay_and_report(load(app_spec, database_url), ref, status, fmt, tenant=tenant)


def replay_and_report(
    app: Onceonly, ref: str | None, status: str | None, fmt: str, *, tenant: str = ""
) -> None:
    """What ``onceonly events replay`` does once its deployment is loaded (also
    ``manage.py onceonly_replay``): replay `ref` or every event in `status`,
    print what was replayed, exit 1 when `ref` is unknown or already in line."""
    from ..operations import replay

    event_pk: int | None = None
    if ref is not None:
        found = _find(app, ref, tenant)
        if found is None:
            _not_found(app, ref, tenant)
        event_pk = found.id
    else:
        asyncio.run(_open_and_close(app))
    ids = replay(
        app.engine, app.engine_kind, id=event_pk, status=EventStatus(status) if status else None
    )
    if fmt == "json":
        click.echo(json.dumps({"replayed": ids}))
    elif ref is not None and not ids:
        errors.print(
            f"[yellow]event {escape(ref)} is pending or processing: already in line[/yellow]"
        )
        sys.exit(1)
    else:
        console.print(f"replayed {len(ids)} event(s)")


async def _open_and_close(app: Onceonly) -> None:
    await app.store.open()
    await app.store.close()


def _find(app: Onceonly, ref: str, tenant: str = "") -> Event | None:
    provider, sep, event_id = ref.partition(":")
    if sep:
        # Exact: without --tenant, only the event without one (never another
        # merchant's event that happens to share the id).
        return with_store(app, lambda store: store.find_event(provider, event_id, tenant))
    if ref.isdigit():
        return with_store(app, lambda store: store.get_event(int(ref)))
    raise click.BadParameter("use a row id or PROVIDER:EVENT_ID", param_hint="REF")


def _not_found(app: Onceonly, ref: str, tenant: str) -> NoReturn:
    where = f" for tenant {escape(tenant)}" if tenant else ""
    hint = ""
    provider, sep, event_id = ref.partition(":")
    if sep:
        # Ambiguous, not absent: say which tenants have it, pick none.
        from ..store.history import EventHistory

        others = EventHistory(app.engine_kind).events(
            app.engine, provider=provider, event_id=event_id, limit=10
        )
        tenants = sorted({e.tenant for e in others if e.tenant != tenant})
        if tenants:
            names = ", ".join(repr(t) for t in tenants)
            hint = f"; tenants with that event: {escape(names)} (add --tenant)"
    errors.print(f"[red]no event {escape(ref)}{where}[/red]{hint}")
    sys.exit(1)


def _print_event(e: Event, redactor: Redactor) -> None:
    """The event as the dashboard shows it: credentials and the configured
    fields hidden, data printed as text (never as Rich markup)."""
    table = Table.grid(padding=(0, 2))
    for label, value in [
        ("id", str(e.id)),
        ("provider", e.provider),
        *([("tenant", e.tenant)] if e.tenant else []),
        ("event id", e.event_id),
        ("type", e.event_type or "-"),
        ("status", e.status.value),
        ("attempts", str(e.attempts)),
        ("received at", e.received_at.isoformat()),
        ("duplicates", str(e.duplicates)),
    ]:
        table.add_row(Text(label, style="bold"), Text(value))
    console.print(table)
    if e.payload_purged_at is not None:
        console.print(f"payload purged at {e.payload_purged_at.isoformat()} (onceonly purge)")
        return
    console.print("[bold]headers[/bold]")
    for header in redactor.headers(e.headers):
        console.print(f"  {header.name}: {header.value}", markup=False, highlight=False)
    console.print("[bold]body[/bold]")
    body = redactor.body(e.body, e.headers.get("content-type"))
    if body.kind == "binary":
        console.print(f"(binary, base64) {body.text}", markup=False, highlight=False)
    else:
        console.print(body.text, markup=False, highlight=False)
    if body.redacted:
        console.print(f"({body.redacted} value(s) hidden: ONCEONLY_DASHBOARD_REDACT)")
