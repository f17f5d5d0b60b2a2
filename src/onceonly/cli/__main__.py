"""``python -m onceonly.cli``: the ``onceonly`` command."""

from .group import main

main(prog_name="onceonly")
