"""The ``onceonly`` group, with every command registered under its name."""

from __future__ import annotations

import click

from .._version import __version__
from ..demo.command import demo_command
from ..dev.cli import dev
from ..importer.command import import_command
from .events import events
from .maintenance import idempotency, migrate, purge_command
from .reconcile import reconcile_command
from .server import serve, worker

__all__ = ["main"]


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


main.add_command(serve, name="serve")
main.add_command(worker, name="worker")
main.add_command(migrate, name="migrate")
main.add_command(events, name="events")
main.add_command(idempotency, name="idempotency")
main.add_command(purge_command, name="purge")
main.add_command(reconcile_command, name="reconcile")
main.add_command(import_command, name="import")
main.add_command(demo_command, name="demo")
main.add_command(dev, name="dev")
