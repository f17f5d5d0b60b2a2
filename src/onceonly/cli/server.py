"""``onceonly serve`` and ``onceonly worker``: the long-running processes."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

import click

from .._version import __version__
from .options import (
    LOG_FORMAT,
    LOG_LEVEL,
    app_options,
    configure_logging,
    duration_option,
    errors,
    fail_cleanly,
    load,
)

if TYPE_CHECKING:
    from ..asgi import ASGIApp
    from ..config import Onceonly
    from ..worker import Worker

__all__ = ["run_worker", "serve", "serve_process_app", "worker"]


#: How often (seconds) a thread holding the GIL is asked to hand it over.
SWITCH_INTERVAL_S = 0.0002

#: How ``serve --workers N`` hands its options to the processes uvicorn
#: spawns: they inherit the environment, and uvicorn only takes an import
#: string (:func:`serve_process_app`) as the app of several processes.
PROCESS_SPEC_ENV = "_ONCEONLY_SERVE_PROCESS"

SQLITE_ONE_PROCESS = (
    "--workers {n} needs PostgreSQL; this store is SQLite ({url}). SQLite allows one "
    "writer per database file, and serve's group commit already batches the inserts "
    "of every connection inside its one process: {n} processes would wait on each "
    "other for the file's lock (busy waits) instead of sharing a commit, so one "
    "process is both the fastest and the safest set-up on SQLite. For more cores, "
    "use PostgreSQL (--database-url postgresql://...)."
)


@click.command()
@app_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@LOG_LEVEL
@LOG_FORMAT
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
    "--workers",
    metavar="N",
    default=1,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Receiver processes sharing the port, each with its own event loop and "
    "connection pool; a process that dies is logged and replaced. PostgreSQL only "
    "(refused on SQLite, which has one writer per file: one process is fastest "
    "there). About one per core; not with --worker (run `onceonly worker`).",
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
@fail_cleanly
def serve(
    app_spec: str | None,
    database_url: str | None,
    host: str,
    port: int,
    log_level: str,
    log_format: str,
    access_log: bool,
    with_worker: bool,
    concurrency: int,
    with_metrics: bool | None,
    with_dashboard: bool,
    dashboard_path: str | None,
    workers: int = 1,
) -> None:
    """Run the webhook receiver: POST /webhooks/{provider}, GET /healthz.

    Creates or upgrades the tables on start. If the database is down, it starts
    anyway and answers 503 with Retry-After until the database is back. Also
    serves the dashboard at /dashboard (see docs/dashboard.md).

    With --workers N (PostgreSQL only), N processes answer on the same port and
    this one supervises them: SIGTERM or Ctrl-C stops them all cleanly.
    """
    import uvicorn

    from ..dashboard import for_serve
    from .protocol import ServeProtocol

    if workers > 1 and with_worker:
        # In the supervising process its metrics would be on no page, and in
        # one of the N it would stop and start with that process: a separate
        # `onceonly worker` is the set-up that has more than one process.
        raise click.UsageError(
            "--worker runs a worker inside a one-process server; with --workers, "
            "run `onceonly worker` as its own process instead."
        )
    changes: dict[str, Any] = {}
    if with_metrics is not None:
        changes["metrics"] = with_metrics
    if dashboard_path is not None:
        changes["dashboard_path"] = dashboard_path
    if not with_dashboard:
        changes["dashboard_path"] = None
    app = load(app_spec, database_url, **changes)
    if workers > 1 and app.engine_kind == "sqlite":
        raise click.UsageError(SQLITE_ONE_PROCESS.format(n=workers, url=app.store.url))
    if not app.providers:
        errors.print(
            "[yellow]warning:[/yellow] no provider configured: every delivery will get 404. "
            "Set ONCEONLY_STRIPE_SECRET (or another ONCEONLY_<PROVIDER>_SECRET) or use --app."
        )
    errors.print(
        f"onceonly {__version__}: database {app.store.url}, "
        f"providers: {', '.join(sorted(app.providers)) or 'none'}"
    )
    configure_logging(log_level, log_format)
    # JSON: uvicorn's own loggers go through the root handler too, instead of
    # its text configuration.
    log_config: dict[str, Any] = {"log_config": None} if log_format == "json" else {}
    # What every uvicorn.run below is given, one process or several.
    uvicorn_options: dict[str, Any] = {
        "host": host,
        "port": port,
        "log_level": log_level,
        "access_log": access_log,
        "lifespan": "on",
        "timeout_graceful_shutdown": 10,
        # Deliveries answered without an ASGI call (see .protocol), and each
        # answer's headers and body in one system call (see .transport).
        "http": ServeProtocol,
        **log_config,
    }
    if workers > 1:
        if app.settings.metrics:
            errors.print(
                f"[yellow]note:[/yellow] each of the {workers} processes counts its own "
                "metrics, and GET /metrics answers for whichever one takes the connection "
                "(docs/operations.md)."
            )
        # The processes build everything again from these options: nothing
        # built here (store, pool, loop) crosses into them.
        os.environ[PROCESS_SPEC_ENV] = json.dumps(
            {
                "app_spec": app_spec,
                "database_url": database_url,
                "changes": changes,
                "host": host,
                "port": port,
                "log_level": log_level,
                "log_format": log_format,
                # Each process stops when this one is gone (see .processes).
                "supervisor": os.getpid(),
            }
        )
        # uvicorn's supervisor binds the socket here and spawns the processes
        # (fresh interpreters: no fork of a live pool or loop); it replaces one
        # that dies, and SIGTERM/SIGINT here stops them all gracefully.
        from .processes import STARTUP_FAILURE, ServeProcesses

        config = uvicorn.Config(
            f"{__name__}:serve_process_app", factory=True, workers=workers, **uvicorn_options
        )
        supervisor = ServeProcesses(config, sockets=[config.bind_socket()])
        with contextlib.suppress(KeyboardInterrupt):
            supervisor.run()
        failed = supervisor.failed_to_start
        if failed:
            errors.print(
                f"[red]error:[/red] {len(failed)} of {workers} serve processes failed to start "
                f"(pid {', '.join(map(str, failed))}; the log above says why), so serve "
                "stopped them all: a replacement would fail the same way."
            )
            sys.exit(STARTUP_FAILURE)
        return
    server = for_serve(app, app.asgi(), host=host, port=port)

    # The event loop and the SQLite store's thread share the GIL. With
    # CPython's default 5 ms switch interval, the store's thread, coming back
    # from each SQLite call (which releases the GIL) while the loop is busy
    # answering, waits up to 5 ms for its turn, several times per commit:
    # under load the commit, not the CPU, set the pace. Measured on SQLite
    # (docs/benchmarks.md): the server used 57% of a core for 1,525
    # deliveries/s at the default, 95% for 2,502/s at 0.2 ms.
    sys.setswitchinterval(SWITCH_INTERVAL_S)

    def run_server() -> None:
        uvicorn.run(server, **uvicorn_options)

    if not with_worker:
        run_server()
        return
    from ..worker import running

    with running(app.worker(concurrency=concurrency)):
        run_server()


def serve_process_app() -> ASGIApp:
    """The app of one of ``serve --workers N``'s processes, built in that process.

    uvicorn calls it (an app factory) in each process it spawns, with the
    options the supervising ``serve`` left in the environment.
    """
    from ..dashboard import for_serve
    from .processes import STARTUP_FAILURE, stop_with_supervisor

    spec = json.loads(os.environ[PROCESS_SPEC_ENV])
    configure_logging(spec["log_level"], spec["log_format"])
    stop_with_supervisor(spec["supervisor"])
    # As in the one-process server (see there): the loop and the store's
    # threads share the GIL of this process.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        app = load(spec["app_spec"], spec["database_url"], **spec["changes"])
        return for_serve(app, app.asgi(), host=spec["host"], port=spec["port"])
    except Exception:
        # An error escaping here ends this process with status 1, which the
        # supervisor takes for a crash and answers with a replacement that
        # fails the same way, forever. uvicorn's start-up failure status
        # stops it instead (see .processes).
        logging.getLogger("onceonly.serve").exception("this serve process cannot start")
        sys.exit(STARTUP_FAILURE)


@click.command()
@app_options
@click.option(
    "--concurrency",
    default=4,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Events handled at once (threads).",
)
@LOG_LEVEL
@LOG_FORMAT
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
@click.option(
    "--reconcile",
    "reconcile_routes",
    multiple=True,
    metavar="PROVIDER",
    help="Also run `onceonly reconcile PROVIDER` every --reconcile-every (repeatable); "
    "one worker at a time does it, decided by the database.",
)
@click.option(
    "--reconcile-every",
    metavar="DURATION",
    default="15m",
    show_default=True,
    help="Period of --reconcile (each run looks back twice as far, at least 1h).",
)
@fail_cleanly
def worker(
    app_spec: str | None,
    database_url: str | None,
    concurrency: int,
    log_level: str,
    log_format: str = "text",
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    reconcile_routes: tuple[str, ...] = (),
    reconcile_every: str = "15m",
) -> None:
    """Process events: run each one's handler once, retry failures, then dead.

    Handlers come from the --app object (@app.handler(...)). Claims due events
    in batches; on PostgreSQL wakes on LISTEN/NOTIFY, otherwise polls every
    second. SIGTERM or Ctrl-C finishes the events being handled, gives back the
    rest, and exits. Run as many workers, on as many machines, as you like.
    """
    app = load(app_spec, database_url)
    every = duration_option(reconcile_every, "--reconcile-every")
    runner = app.worker(
        concurrency=concurrency,
        reconcile=reconcile_routes,
        reconcile_every=every.total_seconds() if reconcile_routes and every else None,
    )
    run_worker(
        app,
        runner,
        log_level=log_level,
        log_format=log_format,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        no_handler_hint="Pass --app module:attribute.",
    )


def run_worker(
    app: Onceonly,
    runner: Worker,
    *,
    log_level: str,
    log_format: str = "text",
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    no_handler_hint: str = "",
    until_idle: float | None = None,
) -> None:
    """Run `runner` in the foreground as ``onceonly worker`` does (also the
    Django app's ``manage.py onceonly_worker``): logging, the warnings, the
    metrics port, SIGTERM and Ctrl-C as a clean stop. With `until_idle`,
    return once nothing is due (at most that many seconds)."""
    configure_logging(log_level, log_format)
    # From here on SIGTERM means "stop cleanly", even while still starting up
    # (a deploy may stop a worker that has not claimed anything yet).
    runner.install_signals()
    if not len(app.handlers):
        errors.print(
            "[yellow]warning:[/yellow] no handler registered: events will be marked processed "
            f"as 'no handler registered'. {no_handler_hint}".rstrip()
        )
    # The tables are created or upgraded by run(), which waits for a database
    # that is down at start (like serve) instead of exiting.
    errors.print(f"onceonly worker: database {app.store.url}, concurrency {runner.concurrency}")
    if metrics_port is not None:
        app.metrics.serve(metrics_port, metrics_host)
        errors.print(f"metrics at http://{metrics_host}:{metrics_port}/metrics")
    if until_idle is not None:
        runner.run_until_idle(until_idle)
    else:
        runner.run(install_signals=False)
