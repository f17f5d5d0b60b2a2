"""The parts of a provider's folder, found beside its class.

A provider's verifier, API client and development profile sit side by side in
``onceonly/providers/<name>/`` (``verifier.py``, ``client.py``, ``profile.py``).
:func:`companion` finds one part from the class alone, so the registries of
clients and profiles list no provider: a folder with the part is enough.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from .base import Provider

__all__ = ["companion"]


def companion(cls: type[Provider], part: str) -> ModuleType | None:
    """Module `part` (``"client"``, ``"profile"``) of the package `cls` is
    defined in, or ``None`` when that package has none."""
    package = cls.__module__.rpartition(".")[0]
    if not package:
        return None
    name = f"{package}.{part}"
    try:
        found = importlib.util.find_spec(name)
    except ModuleNotFoundError:  # the package itself is not one (a bare module)
        return None
    return importlib.import_module(name) if found is not None else None
