"""The command line's work inside ``manage.py``.

``manage.py onceonly_replay`` and ``onceonly_purge`` run the very functions
behind ``onceonly events replay`` and ``onceonly purge`` on the project's
application (:func:`~onceonly.contrib.django.get_app`), so the two print the
same thing and fail the same way. This module adapts the difference: the
command line prints to the process's streams and exits, a Django command
writes to its own streams (``call_command(..., stdout=...)``) and raises
:class:`~django.core.management.CommandError`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Callable
from datetime import timedelta

import click
from django.core.management import BaseCommand, CommandError

from ...._exceptions import ConfigurationError
from ....cli.options import fail_cleanly
from ....retention import duration

__all__ = ["batch_size", "duration_of", "option_help", "run"]


def run(command: BaseCommand, body: Callable[[], None]) -> None:
    """Run `body` (a command line's work) for `command`: its output to the
    command's streams, its known errors as the command line words them, and a
    failure (the command line's exit status) as a :class:`CommandError`."""
    out, err = io.StringIO(), io.StringIO()
    status = 0
    try:
        # The command line's consoles look up sys.stdout and sys.stderr when
        # they print, so they print here.
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            fail_cleanly(body)()
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except click.ClickException as exc:
        raise CommandError(exc.format_message(), returncode=exc.exit_code) from None
    finally:
        command.stdout.write(out.getvalue(), ending="")
    if status:
        # Django prints the message to stderr ("CommandError: ...") and exits
        # with the command line's status. The console wrapped it to its width:
        # one line again.
        message = " ".join(line.strip() for line in err.getvalue().splitlines() if line.strip())
        raise CommandError(message or f"failed (status {status})", returncode=status)
    command.stderr.write(err.getvalue(), ending="")


def option_help(command: click.Command, name: str) -> str:
    """The command line's help for its option `name`: one text for both."""
    for param in command.params:
        if param.name == name and isinstance(param, click.Option) and param.help:
            return param.help
    raise LookupError(f"{command.name} has no option {name!r}")


def duration_of(option: str) -> Callable[[str], timedelta]:
    """An argparse type: ``30d``, ``12h``, ``90m`` as a timedelta, for `option`."""

    def parse(value: str) -> timedelta:
        try:
            return duration(value, option)
        except ConfigurationError as exc:  # worded for the option already
            # argparse names the option itself.
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{option}: ")) from None

    return parse


def pause_seconds(value: str) -> float:
    """An argparse type: ``onceonly purge --pause``, 0 to MAX_PURGE_PAUSE seconds."""
    from ....retention import MAX_PURGE_PAUSE

    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    # `not` catches NaN, which no comparison admits.
    if not 0 <= seconds <= MAX_PURGE_PAUSE:
        raise argparse.ArgumentTypeError(f"{value} is not between 0 and {MAX_PURGE_PAUSE:g}")
    return seconds


def batch_size(value: str) -> int:
    """An argparse type: rows per transaction, 1 to 100000 as on the command line."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if not 1 <= n <= 100_000:
        raise argparse.ArgumentTypeError(f"{n} is not between 1 and 100000")
    return n
