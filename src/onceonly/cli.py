"""The ``onceonly`` command."""

from __future__ import annotations

import asyncio
import functools
import json
import sys
from collections.abc import Awaitable, Callable, Coroutine
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from . import __version__
from ._click import FORMAT as _FORMAT
from ._exceptions import ConfigurationError, OnceonlyError, StoreUnavailable
from .config import Onceonly, load_app
from .events import Event, EventStatus
from .store import Store

if TYPE_CHECKING:
    from .dashboard.redaction import Redactor

P = ParamSpec("P")
T = TypeVar("T")

console = Console()
errors = Console(stderr=True)


def _app_options(fn: Callable[P, T]) -> Callable[P, T]:
    """``--app`` and ``--database-url``, shared by every command that opens the store."""
    fn = click.option(
        "--database-url",
        envvar="ONCEONLY_DATABASE_URL",
        help="Database URL; wins over the --app object's. "
        "[env: ONCEONLY_DATABASE_URL; default: sqlite:///onceonly.db]",
    )(fn)
    return click.option(
        "--app",
        "app_spec",
        envvar="ONCEONLY_APP",
        metavar="MODULE:ATTRIBUTE",
        help="An onceonly.Onceonly object (or a function returning one) to configure "
        "providers and database in Python. [env: ONCEONLY_APP]",
    )(fn)


def _load(app_spec: str | None, database_url: str | None) -> Onceonly:
    app = load_app(app_spec)
    if database_url:
        app.database_url = database_url
    return app


def _fail_cleanly(fn: Callable[P, T]) -> Callable[P, T]:
    """Known errors become one red line and an exit code, not a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except ConfigurationError as exc:
            errors.print(f"[red]configuration error:[/red] {escape(str(exc))}")
            sys.exit(2)
        except StoreUnavailable as exc:
            errors.print(f"[red]database not reachable:[/red] {escape(str(exc))}")
            sys.exit(3)
        except OnceonlyError as exc:
            errors.print(f"[red]error:[/red] {escape(str(exc))}")
            sys.exit(1)

    return wrapper


def _with_store(app: Onceonly, work: Callable[[Store], Awaitable[T]]) -> T:
    async def run() -> T:
        store = app.store
        try:
            return await work(store)
        finally:
            await store.close()

    coroutine: Coroutine[Any, Any, T] = run()
    return asyncio.run(coroutine)


_LOG_LEVEL = click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="onceonly")
def main() -> None:
    """onceonly: make retried work take effect once.

    Receives webhooks at POST /webhooks/{provider}, verifies their signatures
    over the raw bytes, and stores each event once (the database decides, with
    a unique constraint), answering 200 only after the commit.

    \b
    Quick start:
      onceonly demo                                    # what it saves you from
      ONCEONLY_STRIPE_SECRET=whsec_... onceonly serve
      onceonly dev send stripe --secret whsec_...       # in another shell
      onceonly events list
    """


@main.command()
@_app_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@_LOG_LEVEL
@click.option(
    "--access-log/--no-access-log",
    default=False,
    show_default=True,
    help="Log every request (costs throughput).",
)
@click.option(
    "--worker/--no-worker",
    "with_worker",
    default=False,
    show_default=True,
    help="Also run a worker in this process (a one-process set-up).",
)
@click.option(
    "--concurrency",
    default=4,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Handler threads of the in-process worker.",
)
@click.option(
    "--metrics/--no-metrics",
    "with_metrics",
    default=None,
    help="Serve Prometheus metrics at GET /metrics (with --worker, the worker's too). "
    "[env: ONCEONLY_METRICS; default: on]",
)
@click.option(
    "--dashboard/--no-dashboard",
    "with_dashboard",
    default=True,
    show_default=True,
    help="Serve the operator dashboard. Without ONCEONLY_DASHBOARD_TOKEN it answers "
    "this machine only, and stays off when --host is not a loopback address.",
)
@click.option(
    "--dashboard-path",
    metavar="PATH",
    help="Where the dashboard lives. [env: ONCEONLY_DASHBOARD_PATH; default: /dashboard]",
)
@_fail_cleanly
def serve(
    app_spec: str | None,
    database_url: str | None,
    host: str,
    port: int,
    log_level: str,
    access_log: bool,
    with_worker: bool,
    concurrency: int,
    with_metrics: bool | None,
    with_dashboard: bool,
    dashboard_path: str | None,
) -> None:
    """Run the webhook receiver: POST /webhooks/{provider}, GET /healthz.

    Creates or upgrades the tables on start. If the database is down, it starts
    anyway and answers 503 with Retry-After until the database is back. Also
    serves the dashboard at /dashboard (see docs/dashboard.md).
    """
    import uvicorn

    from .config import _dashboard_path
    from .dashboard import for_serve

    app = _load(app_spec, database_url)
    if with_metrics is not None:
        app.metrics_enabled = with_metrics
    if dashboard_path is not None:
        app.dashboard_path = _dashboard_path(dashboard_path)
    if not with_dashboard:
        app.dashboard_path = None
    if not app.providers:
        errors.print(
            "[yellow]warning:[/yellow] no provider configured: every delivery will get 404. "
            "Set ONCEONLY_STRIPE_SECRET (or another ONCEONLY_<PROVIDER>_SECRET) or use --app."
        )
    errors.print(
        f"onceonly {__version__}: database {app.store.url}, "
        f"providers: {', '.join(sorted(app.providers)) or 'none'}"
    )
    _configure_logging(log_level)
    server = for_serve(app, app.asgi(), host=host, port=port)

    def run_server() -> None:
        uvicorn.run(
            server,
            host=host,
            port=port,
            log_level=log_level,
            access_log=access_log,
            lifespan="on",
            timeout_graceful_shutdown=10,
        )

    if not with_worker:
        run_server()
        return
    from .worker import running

    with running(app.worker(concurrency=concurrency)):
        run_server()


@main.command()
@_app_options
@click.option(
    "--concurrency",
    default=4,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Events handled at once (threads).",
)
@_LOG_LEVEL
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    help="Serve Prometheus metrics (GET /metrics) on this port. [default: not served]",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="Interface for --metrics-port.",
)
@_fail_cleanly
def worker(
    app_spec: str | None,
    database_url: str | None,
    concurrency: int,
    log_level: str,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
) -> None:
    """Process events: run each one's handler once, retry failures, then dead.

    Handlers come from the --app object (@app.handler(...)). Claims due events
    in batches; on PostgreSQL wakes on LISTEN/NOTIFY, otherwise polls every
    second. SIGTERM or Ctrl-C finishes the events being handled, gives back the
    rest, and exits. Run as many workers, on as many machines, as you like.
    """
    app = _load(app_spec, database_url)
    _configure_logging(log_level)
    runner = app.worker(concurrency=concurrency)
    # From here on SIGTERM means "stop cleanly", even while still starting up
    # (a deploy may stop a worker that has not claimed anything yet).
    runner.install_signals()
    if not len(app.handlers):
        errors.print(
            "[yellow]warning:[/yellow] no handler registered: events will be marked processed "
            "as 'no handler registered'. Pass --app module:attribute."
        )
    # The tables are created or upgraded by run(), which waits for a database
    # that is down at start (like serve) instead of exiting.
    errors.print(f"onceonly worker: database {app.store.url}, concurrency {concurrency}")
    if metrics_port is not None:
        app.metrics.serve(metrics_port, metrics_host)
        errors.print(f"metrics at http://{metrics_host}:{metrics_port}/metrics")
    runner.run(install_signals=False)


def _configure_logging(level: str) -> None:
    import logging

    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


@main.command()
@_app_options
@_fail_cleanly
def migrate(app_spec: str | None, database_url: str | None) -> None:
    """Create or upgrade onceonly's tables (all prefixed onceonly_)."""
    app = _load(app_spec, database_url)
    app.store.auto_migrate = False  # type: ignore[attr-defined]

    async def work(store: Store) -> tuple[list[int], int]:
        applied = await store.migrate()
        return applied, await store.schema_version()

    applied, version = _with_store(app, work)
    if applied:
        console.print(f"applied migrations {', '.join(map(str, applied))}; schema at {version}")
    else:
        console.print(f"schema already at version {version}; nothing to do")


@main.group()
def events() -> None:
    """See what arrived."""


@events.command("list")
@_app_options
@click.option("--provider", help="Only this provider (route name).")
@click.option(
    "--status", type=click.Choice([s.value for s in EventStatus]), help="Only this status."
)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--before", "before_id", type=int, help="Only events with an id below this one.")
@_FORMAT
@_fail_cleanly
def list_events(
    app_spec: str | None,
    database_url: str | None,
    provider: str | None,
    status: str | None,
    limit: int,
    before_id: int | None,
    fmt: str,
) -> None:
    """List events, newest first."""
    app = _load(app_spec, database_url)
    found = _with_store(
        app,
        lambda store: store.list_events(
            provider=provider,
            status=EventStatus(status) if status else None,
            limit=limit,
            before_id=before_id,
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
    table = Table("id", "provider", "event id", "type", "status", "attempts", "received at")
    if with_errors:
        table.add_column("last error")
    for e in found:
        cells = [
            str(e.id),
            e.provider,
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


@events.command("show")
@_app_options
@click.argument("ref")
@_FORMAT
@_fail_cleanly
def show_event(app_spec: str | None, database_url: str | None, ref: str, fmt: str) -> None:
    """Show one event with its headers and body.

    REF is the row id shown by `events list`, or PROVIDER:EVENT_ID
    (for example stripe:evt_1N...).
    """
    from .dashboard.redaction import Redactor
    from .operations import attempts_of

    app = _load(app_spec, database_url)
    found = _find(app, ref)
    if found is None:
        errors.print(f"[red]no event {escape(ref)}[/red]")
        sys.exit(1)
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
@_app_options
@click.argument("ref", required=False)
@click.option(
    "--status", type=click.Choice(["failed", "dead"]), help="Replay every event with this status."
)
@_FORMAT
@_fail_cleanly
def replay_events(
    app_spec: str | None,
    database_url: str | None,
    ref: str | None,
    status: str | None,
    fmt: str,
) -> None:
    """Put events back in line: one (REF: row id or PROVIDER:EVENT_ID) or all
    with --status. Attempts start again from zero; recorded effects are not
    called again."""
    from .operations import replay

    if (ref is None) == (status is None):
        raise click.UsageError("give either an event (REF) or --status, not both")
    app = _load(app_spec, database_url)
    event_pk: int | None = None
    if ref is not None:
        found = _find(app, ref)
        if found is None:
            errors.print(f"[red]no event {escape(ref)}[/red]")
            sys.exit(1)
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


def _find(app: Onceonly, ref: str) -> Event | None:
    provider, sep, event_id = ref.partition(":")
    if sep:
        return _with_store(app, lambda store: store.find_event(provider, event_id))
    if ref.isdigit():
        return _with_store(app, lambda store: store.get_event(int(ref)))
    raise click.BadParameter("use a row id or PROVIDER:EVENT_ID", param_hint="REF")


@main.group()
def idempotency() -> None:
    """Idempotency-Key records of your API (see docs/idempotency.md)."""


@idempotency.command("purge")
@_app_options
@_FORMAT
@_fail_cleanly
def purge_keys(app_spec: str | None, database_url: str | None, fmt: str) -> None:
    """Delete expired Idempotency-Key records (run it from cron, say hourly).

    Expired records are already ignored by the middleware; purging only frees
    the space. Records still within their expiry are never touched.
    """
    import time

    from .idempotency.storage import key_store_for

    app = _load(app_spec, database_url)
    deleted = _with_store(app, lambda store: key_store_for(store).purge(now=time.time()))
    if fmt == "json":
        click.echo(json.dumps({"deleted": deleted}))
    else:
        console.print(f"deleted {deleted} expired Idempotency-Key record(s)")


def _duration_option(value: str | None, option: str) -> timedelta | None:
    from .retention import duration

    if value is None:
        return None
    try:
        return duration(value, option)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


@main.command("purge")
@_app_options
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
    default=1000,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="Rows per transaction.",
)
@_FORMAT
@_fail_cleanly
def purge_command(
    app_spec: str | None,
    database_url: str | None,
    older_than: str | None,
    keep_ids: str | None,
    dry_run: bool,
    batch_size: int,
    fmt: str,
) -> None:
    """Apply retention: drop old payloads, forget very old event ids, and delete
    expired Idempotency-Key records. Run it from cron (daily is plenty).

    Only processed events are touched: pending, failed and dead ones keep their
    payload (dead ones for replay). A resend of a purged event is still answered
    as a duplicate until --keep-ids has passed. See docs/operations.md.
    """
    from .retention import purge

    payloads = _duration_option(older_than, "--older-than")
    ids = _duration_option(keep_ids, "--keep-ids")
    app = _load(app_spec, database_url)
    report = purge(app, older_than=payloads, keep_ids=ids, dry_run=dry_run, batch_size=batch_size)
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


def _print_event(e: Event, redactor: Redactor) -> None:
    """The event as the dashboard shows it: credentials and the configured
    fields hidden, data printed as text (never as Rich markup)."""
    table = Table.grid(padding=(0, 2))
    for label, value in [
        ("id", str(e.id)),
        ("provider", e.provider),
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


from .importer.command import import_command  # noqa: E402

main.add_command(import_command, name="import")

from .demo.command import demo_command  # noqa: E402
from .dev.cli import dev  # noqa: E402

main.add_command(demo_command, name="demo")
main.add_command(dev, name="dev")


if __name__ == "__main__":
    main()
