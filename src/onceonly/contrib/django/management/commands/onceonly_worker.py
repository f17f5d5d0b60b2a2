"""``manage.py onceonly_worker``: ``onceonly worker`` on the project's settings."""

from __future__ import annotations

import os
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ....._exceptions import ConfigurationError
from .....cli.server import run_worker
from ...conf import database_alias, get_app
from ...transactions import DjangoTransactions


class Command(BaseCommand):
    help = (
        "Process received webhook events: run each one's handler once, inside "
        "transaction.atomic() on the database settings.ONCEONLY['DATABASE'] names, "
        "so its ORM writes commit with the event's processed mark. Failures retry "
        "with backoff, then become dead. Handlers come from each installed app's "
        "webhooks.py. SIGTERM or Ctrl-C finishes the events in hand, gives back the "
        "rest and exits. Run as many as you like, on as many machines."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--concurrency",
            type=int,
            default=4,
            metavar="N",
            help="Events handled at once: threads, each with its own database connection "
            "(default: 4).",
        )
        parser.add_argument(
            "--until-idle",
            action="store_true",
            help="Exit once no event is due (for scripts, cron and tests) instead of waiting "
            "for new ones.",
        )
        parser.add_argument(
            "--idle-timeout",
            type=float,
            default=600.0,
            metavar="SECONDS",
            help="With --until-idle, give up after this long even if events are still due "
            "(default: 600).",
        )
        parser.add_argument(
            "--log-level",
            default="info",
            choices=["critical", "error", "warning", "info", "debug"],
            help="Log level of onceonly's loggers (default: info).",
        )
        parser.add_argument(
            "--log-format",
            default=os.environ.get("ONCEONLY_LOG_FORMAT", "text"),
            choices=["text", "json"],
            help="json: one JSON object per line with each event's fields "
            "(default: text, or ONCEONLY_LOG_FORMAT).",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            metavar="PORT",
            help="Serve Prometheus metrics (GET /metrics) on this port (default: not served).",
        )
        parser.add_argument(
            "--metrics-host",
            default="127.0.0.1",
            metavar="HOST",
            help="Interface for --metrics-port (default: 127.0.0.1).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        concurrency: int = options["concurrency"]
        if not 1 <= concurrency <= 256:
            raise CommandError("--concurrency must be between 1 and 256")
        try:
            app = get_app()
            runner = app.worker(
                concurrency=concurrency, transactions=DjangoTransactions(database_alias())
            )
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        run_worker(
            app,
            runner,
            log_level=options["log_level"],
            log_format=options["log_format"],
            metrics_port=options["metrics_port"],
            metrics_host=options["metrics_host"],
            no_handler_hint="Register them with @handler in an installed app's webhooks.py.",
            until_idle=options["idle_timeout"] if options["until_idle"] else None,
        )
