"""The runtime dependencies of pyproject.toml pinned to their lower bounds.

Prints one requirement per line, ``name[extras]==floor``, for each entry of
``[project] dependencies`` (each must have a ``>=`` bound): what .ci/run
installs for its pass that holds the package to the versions it claims to
work with. ``--check`` instead fails unless each is installed at its floor.
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.version import Version

BOUND = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+(\[[^\]]*\])?)\s*>=\s*(?P<floor>[^,;\s]+)")


def floors(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    pinned = []
    for requirement in project["dependencies"]:
        match = BOUND.match(requirement)
        if match is None:
            sys.exit(f"{pyproject}: {requirement!r} has no >= lower bound")
        pinned.append(f"{match['name']}=={match['floor']}")
    return pinned


def check(pinned: list[str]) -> None:
    for requirement in pinned:
        name, floor = requirement.split("==")
        installed = version(name.split("[")[0])
        if Version(installed) != Version(floor):
            sys.exit(f"{name} {installed} is installed, not its floor {floor}")
    print(f"{len(pinned)} runtime dependencies at their floors")


if __name__ == "__main__":
    pinned = floors(Path(__file__).resolve().parents[1] / "pyproject.toml")
    if sys.argv[1:] == ["--check"]:
        check(pinned)
    else:
        print("\n".join(pinned))
