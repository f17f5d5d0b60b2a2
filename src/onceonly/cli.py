"""The ``onceonly`` command."""

from __future__ import annotations

import asyncio
import functools
import json
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import click
from rich.console import Console
from rich.table import Table

from . import __version__
from ._exceptions import ConfigurationError, OnceonlyError, StoreUnavailable
from .config import Onceonly, load_app
from .events import Event, EventStatus
from .store import Store

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
            errors.print(f"[red]configuration error:[/red] {exc}")
            sys.exit(2)
        except StoreUnavailable as exc:
            errors.print(f"[red]database not reachable:[/red] {exc}")
            sys.exit(3)
        except OnceonlyError as exc:
            errors.print(f"[red]error:[/red] {exc}")
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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="onceonly")
def main() -> None:
    """onceonly: make retried work take effect once.

    Receives webhooks at POST /webhooks/{provider}, verifies their signatures
    over the raw bytes, and stores each event once (the database decides, with
    a unique constraint), answering 200 only after the commit.

    \b
    Quick start:
      ONCEONLY_STRIPE_SECRET=whsec_... onceonly serve
      onceonly events list
    """


@main.command()
@_app_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
)
@click.option(
    "--access-log/--no-access-log",
    default=False,
    show_default=True,
    help="Log every request (costs throughput).",
)
@_fail_cleanly
def serve(
    app_spec: str | None,
    database_url: str | None,
    host: str,
    port: int,
    log_level: str,
    access_log: bool,
) -> None:
    """Run the webhook receiver: POST /webhooks/{provider}, GET /healthz.

    Creates or upgrades the tables on start. If the database is down, it starts
    anyway and answers 503 with Retry-After until the database is back.
    """
    import uvicorn

    app = _load(app_spec, database_url)
    if not app.providers:
        errors.print(
            "[yellow]warning:[/yellow] no provider configured: every delivery will get 404. "
            "Set ONCEONLY_STRIPE_SECRET (or another ONCEONLY_<PROVIDER>_SECRET) or use --app."
        )
    errors.print(
        f"onceonly {__version__}: database {app.store.url}, "
        f"providers: {', '.join(sorted(app.providers)) or 'none'}"
    )
    uvicorn.run(
        app.asgi(),
        host=host,
        port=port,
        log_level=log_level,
        access_log=access_log,
        lifespan="on",
        timeout_graceful_shutdown=10,
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


_FORMAT = click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="table for people, json for scripts.",
)


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
    table = Table("id", "provider", "event id", "type", "status", "attempts", "received at")
    for e in found:
        table.add_row(
            str(e.id),
            e.provider,
            e.event_id,
            e.event_type or "-",
            e.status.value,
            str(e.attempts),
            e.received_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
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
    app = _load(app_spec, database_url)
    provider, sep, event_id = ref.partition(":")
    if sep:
        found = _with_store(app, lambda store: store.find_event(provider, event_id))
    elif ref.isdigit():
        found = _with_store(app, lambda store: store.get_event(int(ref)))
    else:
        raise click.BadParameter("use a row id or PROVIDER:EVENT_ID", param_hint="REF")
    if found is None:
        errors.print(f"[red]no event {ref}[/red]")
        sys.exit(1)
    if fmt == "json":
        click.echo(json.dumps(found.to_dict(), indent=2))
        return
    _print_event(found)


def _print_event(e: Event) -> None:
    table = Table.grid(padding=(0, 2))
    for label, value in [
        ("id", str(e.id)),
        ("provider", e.provider),
        ("event id", e.event_id),
        ("type", e.event_type or "-"),
        ("status", e.status.value),
        ("attempts", str(e.attempts)),
        ("received at", e.received_at.isoformat()),
    ]:
        table.add_row(f"[bold]{label}[/bold]", value)
    console.print(table)
    console.print("[bold]headers[/bold]")
    for name, value in e.headers.items():
        console.print(f"  {name}: {value}", markup=False, highlight=False)
    console.print("[bold]body[/bold]")
    data = e.to_dict()
    if "body" in data:
        try:
            console.print_json(data["body"])
        except (ValueError, TypeError):
            console.print(data["body"], markup=False, highlight=False)
    else:
        console.print(f"(binary, base64) {data['body_base64']}", markup=False)


if __name__ == "__main__":
    main()
