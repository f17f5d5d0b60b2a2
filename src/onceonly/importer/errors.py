"""The importer's errors, under onceonly's one root.

::

    OnceonlyError
    ├── ConfigurationError
    │   └── ImportSetupError     file, table, key and options cannot work together
    │       └── FileFormatError  the file cannot be read as CSV or XLSX
    └── InvalidValue             one value that cannot be a key or fit a column
                                 (also a ValueError)

A bad *row* is not an exception an import raises: it is a rejection in the
report (`InvalidValue` carries its reason from the parsers to the report). The
normalising functions (``normalize_cpf``...) raise it directly.
"""

from __future__ import annotations

# The classes live in onceonly._exceptions, the one exceptions module; this
# module keeps their old import path.
from .._exceptions import FileFormatError, ImportSetupError, InvalidValue

__all__ = ["FileFormatError", "ImportSetupError", "InvalidValue"]
