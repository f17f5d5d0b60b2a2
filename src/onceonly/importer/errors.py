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

from .._exceptions import ConfigurationError, OnceonlyError

__all__ = ["FileFormatError", "ImportSetupError", "InvalidValue"]


class ImportSetupError(ConfigurationError):
    """The import cannot start: no such table, a key without a unique
    constraint, a header that maps nowhere, a NOT NULL column the file lacks."""


class FileFormatError(ImportSetupError):
    """The file is not a CSV or XLSX we can read (an old .xls, an unknown
    encoding, no header row)."""


class InvalidValue(OnceonlyError, ValueError):
    """One cell that cannot go into its column. The message is the reason a
    person reads next to the line number, so it names the problem, not the code."""
