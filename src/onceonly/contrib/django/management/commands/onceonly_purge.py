"""``manage.py onceonly_purge``: ``onceonly purge`` on the project's database."""

from __future__ import annotations

from typing import Any

from django.core.management import BaseCommand, CommandParser

from .....cli.maintenance import purge_and_report, purge_command
from .....retention import DEFAULT_PURGE_BATCH
from ...conf import get_app
from ..console import batch_size, duration_of, option_help, pause_seconds, run


class Command(BaseCommand):
    help = f"{purge_command.help} Runs on the database of settings.ONCEONLY."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            metavar="DURATION",
            type=duration_of("--older-than"),
            help=option_help(purge_command, "older_than"),
        )
        parser.add_argument(
            "--keep-ids",
            metavar="DURATION",
            type=duration_of("--keep-ids"),
            help=option_help(purge_command, "keep_ids"),
        )
        parser.add_argument(
            "--dry-run", action="store_true", help=option_help(purge_command, "dry_run")
        )
        parser.add_argument(
            "--batch-size",
            type=batch_size,
            default=DEFAULT_PURGE_BATCH,
            help=f"{option_help(purge_command, 'batch_size')} (default: {DEFAULT_PURGE_BATCH})",
        )
        parser.add_argument(
            "--pause",
            metavar="SECONDS",
            type=pause_seconds,
            default=0.0,
            help=f"{option_help(purge_command, 'pause')} (default: 0)",
        )
        parser.add_argument(
            "--format",
            dest="fmt",
            choices=["table", "json"],
            default="table",
            help=f"{option_help(purge_command, 'fmt')} (default: table)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        run(
            self,
            lambda: purge_and_report(
                get_app(),
                older_than=options["older_than"],
                keep_ids=options["keep_ids"],
                dry_run=options["dry_run"],
                batch_size=options["batch_size"],
                pause=options["pause"],
                fmt=options["fmt"],
            ),
        )
