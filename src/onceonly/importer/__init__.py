"""Idempotent spreadsheet import: upsert a CSV or XLSX into your own table by a
natural key, so running it twice changes nothing the second time.

::

    from onceonly.importer import import_file

    report = import_file(
        "clientes.csv",
        database_url="postgresql://app@db/app",
        table="customers",
        key="cpf",
        key_types={"cpf": "cpf"},      # 123.456.789-09 and 12345678909 are one customer
    )
    print(report.inserted, report.updated, report.unchanged, report.rejected)
    for r in report.rejections:
        print(r.line, r.reason)

The same from the shell: ``onceonly import clientes.csv --table customers
--key cpf --key-type cpf``. See docs/import.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING

from .errors import FileFormatError, ImportSetupError, InvalidValue
from .keys import KeyType, normalize_cnpj, normalize_code, normalize_cpf, normalize_key
from .pipeline import DEFAULT_BATCH_SIZE, DEFAULT_MAX_ERRORS, Importer
from .readers import Source
from .report import ImportProgress, ImportReport, Rejection
from .values import DecimalMode

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_MAX_ERRORS",
    "FileFormatError",
    "ImportProgress",
    "ImportReport",
    "ImportSetupError",
    "Importer",
    "InvalidValue",
    "KeyType",
    "Rejection",
    "import_file",
    "normalize_cnpj",
    "normalize_code",
    "normalize_cpf",
    "normalize_key",
]


def import_file(
    source: Source,
    *,
    table: str,
    key: Sequence[str] | str,
    database_url: str | None = None,
    engine: sa.Engine | None = None,
    key_types: Mapping[str, KeyType | str] | None = None,
    mapping: Mapping[str, str | None] | None = None,
    encoding: str | None = None,
    delimiter: str | None = None,
    sheet: str | None = None,
    decimal: DecimalMode = "auto",
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_errors: int = DEFAULT_MAX_ERRORS,
    dry_run: bool = False,
    all_or_nothing: bool = False,
    rejects: str | os.PathLike[str] | IO[str] | None = None,
    on_progress: Callable[[ImportProgress], None] | None = None,
) -> ImportReport:
    """Upsert the rows of `source` (a CSV or XLSX path, or a binary file
    object) into `table` by `key`, and report what happened.

    - `table`: an existing table (``name`` or ``schema.name``); `key`: its
      column(s), backed by a primary key, unique constraint or unique index.
    - `database_url` (an onceonly URL: ``sqlite:///file.db``,
      ``postgresql://...``) or an `engine` you already have.
    - `key_types`: per key column, ``"cpf"``, ``"cnpj"``, ``"code"`` or
      ``"raw"`` (the default).
    - `mapping`: header -> column, for headers whose name does not match the
      column's (matching ignores case, accents and punctuation); a header
      mapped to ``None`` or ``""`` is left out.
    - `encoding`, `delimiter`: CSV only, guessed when not given; `sheet`: XLSX
      only, the active sheet when not given. `decimal`: ``"auto"``,
      ``"comma"`` (1.234,56) or ``"point"`` (1,234.56).
    - `batch_size` rows per upsert and commit; `max_errors` rejected rows
      before the import stops (0: stop at the first).
    - `dry_run`: everything inside one transaction that is rolled back, so the
      report is the database's own verdict and nothing changes.
    - `all_or_nothing`: one transaction for the whole file; if `max_errors`
      stops the import, nothing is kept.
    - `rejects`: a path (or text stream) that receives every rejected row as
      CSV, with its line and reason, ready to fix and import again.
    - `on_progress`: called after every batch.

    Bad rows do not raise: they are in the report. Raises
    :class:`ImportSetupError` (a :class:`~onceonly.ConfigurationError`) before
    writing anything when the file, the table and the key do not fit together,
    and :class:`~onceonly.StoreUnavailable` when the database cannot be reached.
    """
    return Importer(
        source,
        table=table,
        key=key,
        database_url=database_url,
        engine=engine,
        key_types=key_types,
        mapping=mapping,
        encoding=encoding,
        delimiter=delimiter,
        sheet=sheet,
        decimal=decimal,
        batch_size=batch_size,
        max_errors=max_errors,
        dry_run=dry_run,
        all_or_nothing=all_or_nothing,
        rejects=rejects,
        on_progress=on_progress,
    ).run()
