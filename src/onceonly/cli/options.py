"""What every ``onceonly`` command shares: ``--app``/``--database-url``,
loading the deployment, clean errors, the consoles and small helpers.

Command modules import this one, never each other; :mod:`onceonly.cli.main`
puts the commands together.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Awaitable, Callable, Coroutine
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar

import click
from rich.console import Console
from rich.markup import escape

from .._exceptions import ConfigurationError, OnceonlyError, StoreUnavailable
from ..config import Onceonly, load_app
from ..store import Store

__all__ = [
    "LOG_FORMAT",
    "LOG_LEVEL",
    "app_options",
    "configure_logging",
    "console",
    "duration_option",
    "errors",
    "fail_cleanly",
    "load",
    "with_store",
]

P = ParamSpec("P")
T = TypeVar("T")

console = Console()
errors = Console(stderr=True)


def app_options(fn: Callable[P, T]) -> Callable[P, T]:
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


def load(app_spec: str | None, database_url: str | None, **changes: Any) -> Onceonly:
    """The deployment of ``--app`` (or of the environment) with the command's
    options applied: as new settings, never by patching the loaded object,
    whose store or engine may already exist on the old values."""
    app = load_app(app_spec)
    if database_url:
        changes["database_url"] = database_url
    return app.replace(**changes) if changes else app


def fail_cleanly(fn: Callable[P, T]) -> Callable[P, T]:
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


def with_store(app: Onceonly, work: Callable[[Store], Awaitable[T]]) -> T:
    async def run() -> T:
        store = app.store
        try:
            return await work(store)
        finally:
            await store.close()

    coroutine: Coroutine[Any, Any, T] = run()
    return asyncio.run(coroutine)


LOG_LEVEL = click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
)


LOG_FORMAT = click.option(
    "--log-format",
    default="text",
    show_default=True,
    envvar="ONCEONLY_LOG_FORMAT",
    type=click.Choice(["text", "json"]),
    help="json: one JSON object per line, with each event's fields (event_pk, provider, "
    "event_id, event_type, attempt, worker) at the top level. [env: ONCEONLY_LOG_FORMAT]",
)


def configure_logging(level: str, log_format: str = "text") -> None:
    import logging

    if log_format != "json":
        logging.basicConfig(
            level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        return
    from ..logs import JsonFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler])


def duration_option(value: str | None, option: str) -> timedelta | None:
    from ..retention import duration

    if value is None:
        return None
    try:
        return duration(value, option)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None
