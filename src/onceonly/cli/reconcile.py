"""``onceonly reconcile``: catch up on events whose deliveries never arrived."""

from __future__ import annotations

import asyncio
import json
import sys

import click
from rich.markup import escape
from rich.table import Table

from .._click import FORMAT as _FORMAT
from .._exceptions import ApiError, ConfigurationError
from ..reconcile import ReconcileReport, client_for, parse_since, reconcile_app
from .options import app_options, console, errors, fail_cleanly, load

__all__ = ["reconcile_command"]


@click.command("reconcile")
@click.argument("provider")
@app_options
@click.option(
    "--since",
    metavar="WHEN",
    help="Start of the window: a duration back from now (2h, 3d, 1w) or an ISO date "
    "or time (2026-12-01, 2026-12-01T10:00:00Z). [default: 3d; Stripe keeps 30 days "
    "of events, Asaas 14 days of undelivered ones]",
)
@click.option(
    "--id",
    "ids",
    multiple=True,
    metavar="ID",
    help="Check these objects only (repeatable): Stripe event ids, Asaas or Mercado Pago "
    "payment ids, PagBank order ids (PagBank's API lists nothing by time: required).",
)
@click.option(
    "--failed-only",
    is_flag=True,
    help="Stripe: list only events whose delivery failed or is pending "
    "(delivery_success=false). [default: every event in the window]",
)
@click.option("--dry-run", is_flag=True, help="Count what is missing; store nothing.")
@_FORMAT
@fail_cleanly
def reconcile_command(
    provider: str,
    app_spec: str | None,
    database_url: str | None,
    since: str | None,
    ids: tuple[str, ...],
    failed_only: bool,
    dry_run: bool,
    fmt: str,
) -> None:
    """Read what PROVIDER's API lists and put each item through the inbox.

    PROVIDER is a configured route (stripe, asaas, mercadopago, pagbank, or
    your own route of one of them) with an API client
    (ONCEONLY_<PROVIDER>_API_TOKEN). Each listed item is stored as an event
    exactly as a delivery would be: an item already delivered (or reconciled
    before) counts as already there, a new one is processed by the worker.
    Running it twice changes nothing. See docs/reconcile.md for how each
    provider's items become events.

    Exit status: 0 done, 1 the provider's API failed (what was stored before
    the failure stays; run it again), 2 configuration, 3 database unreachable.

    \b
    Examples:
      onceonly reconcile stripe                       # the last 3 days
      onceonly reconcile stripe --since 12h --failed-only
      onceonly reconcile asaas --since 2026-12-01 --dry-run --format json
      onceonly reconcile pagbank --id ORDE_1234 --id ORDE_5678
    """
    app = load(app_spec, database_url)
    client = client_for(app, provider)
    if not ids and not client.lists_by_time:
        raise ConfigurationError(
            f"{provider}'s API cannot list by time: pass the ids to check with --id"
        )
    start = parse_since(since, default=client.default_window)
    try:
        report = asyncio.run(
            reconcile_app(
                app, provider, since=start, ids=ids, failed_only=failed_only, dry_run=dry_run
            )
        )
    except ApiError as exc:
        errors.print(f"[red]{escape(provider)} API failed:[/red] {escape(str(exc))}")
        sys.exit(1)
    if fmt == "json":
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        _print(report)


def _print(report: ReconcileReport) -> None:
    title = f"reconcile {report.provider} since {report.since:%Y-%m-%d %H:%M:%S %Z}"
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("listed by the API", str(report.listed))
    table.add_row("would be new" if report.dry_run else "new (stored now)", str(report.new))
    table.add_row("already there", str(report.already))
    console.print(table)
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    if report.dry_run:
        console.print("dry run: nothing was stored")
    elif report.new:
        console.print(f"{report.new} event(s) stored; the worker processes them")
