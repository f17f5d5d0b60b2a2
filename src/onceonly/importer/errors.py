"""The importer's errors, under onceonly's one root.

::

    OnceonlyError
    └── ConfigurationError
        └── ImportSetupError     file, table, key and options cannot work together
            └── FileFormatError  the file cannot be read as CSV or XLSX

A bad *row* is not an exception the caller sees: it is a rejection in the
report (`InvalidValue` carries its reason from the parsers to the report).
"""

from __future__ import annotations

from .._exceptions import ConfigurationError

__all__ = ["FileFormatError", "ImportSetupError", "InvalidValue"]


class ImportSetupError(ConfigurationError):
    """The import cannot start: no such table, a key without a unique
    constraint, a header that maps nowhere, a NOT NULL column the file lacks."""


class FileFormatError(ImportSetupError):
    """The file is not a CSV or XLSX we can read (an old .xls, an unknown
    encoding, no header row)."""


class InvalidValue(ValueError):
    """One cell that cannot go into its column. The message is the reason a
    person reads next to the line number, so it names the problem, not the code."""
