"""The ``onceonly`` command: :data:`main` is the console script.

One module per command group (:mod:`.server`, :mod:`.events`,
:mod:`.maintenance`), the options and helpers they share in :mod:`.options`,
and :mod:`.group` puts them together; ``python -m onceonly.cli`` and
``python -m onceonly`` run it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .group import main

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    # Lazy on purpose: commands kept outside this package (onceonly import)
    # import .options, which imports this package first; importing .group here
    # at once would import those commands again while they are half-built.
    if name == "main":
        from .group import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
