"""``python -m onceonly``: the ``onceonly`` command."""

from .cli.group import main

main(prog_name="onceonly")
