"""Command-line options shared by every onceonly command group.

A module of its own, so that ``cli`` and the groups it registers (``dev``,
``demo``) can share them without importing each other.
"""

from __future__ import annotations

import click

__all__ = ["FORMAT"]

#: ``--format table|json``: every listing command has a form for scripts.
FORMAT = click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="table for people, json for scripts.",
)
