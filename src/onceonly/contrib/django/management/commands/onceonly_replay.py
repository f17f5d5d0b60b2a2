"""``manage.py onceonly_replay``: ``onceonly events replay`` on the project's database."""

from __future__ import annotations

from typing import Any

from django.core.management import BaseCommand, CommandError, CommandParser

from .....cli.events import replay_and_report, replay_events
from ...conf import get_app
from ..console import option_help, run


class Command(BaseCommand):
    help = (
        f"{replay_events.help} Runs on the database of settings.ONCEONLY; "
        "a processed event given by REF runs its handler again."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "ref", nargs="?", metavar="REF", help="The event: its row id or PROVIDER:EVENT_ID."
        )
        parser.add_argument(
            "--status", choices=["failed", "dead"], help=option_help(replay_events, "status")
        )
        parser.add_argument("--tenant", default="", help=option_help(replay_events, "tenant"))
        parser.add_argument(
            "--format",
            dest="fmt",
            choices=["table", "json"],
            default="table",
            help=f"{option_help(replay_events, 'fmt')} (default: table)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        ref: str | None = options["ref"]
        status: str | None = options["status"]
        if (ref is None) == (status is None):
            raise CommandError("give either an event (REF) or --status, not both", returncode=2)
        tenant: str = options["tenant"]
        run(
            self,
            lambda: replay_and_report(get_app(), ref, status, options["fmt"], tenant=tenant),
        )
