"""What an import did: the report people read and scripts parse."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ImportProgress", "ImportReport", "Rejection"]

# The report lists this many rejected rows; the count is always exact, and
# --rejects FILE receives every one of them.
MAX_LISTED_REJECTIONS = 1000


@dataclass(frozen=True)
class Rejection:
    """A row that was not written: its line in the file (the sheet row for
    XLSX), the column at fault when there is one, the reason, and the cell."""

    line: int
    reason: str
    column: str | None = None
    value: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "line": self.line,
            "column": self.column,
            "reason": self.reason,
            "value": self.value,
        }


@dataclass(frozen=True)
class ImportProgress:
    """Passed to the ``on_progress`` callback after every batch. `done` and
    `total` are bytes for CSV and rows for XLSX (`total` None when unknown)."""

    rows: int
    inserted: int
    updated: int
    unchanged: int
    rejected: int
    done: int
    total: int | None


@dataclass(frozen=True)
class ImportReport:
    """The outcome of one import.

    Every row read is counted once: ``rows == inserted + updated + unchanged +
    rejected``. `unchanged` rows matched an existing row with the same values
    and were not written. `written` is False for a dry run, and for an
    all-or-nothing import that stopped: then the counts say what the database
    would have done, and nothing was kept. `stopped_at_line` is set when
    `max_errors` was exceeded: rows from that line on were not processed.
    """

    file: str
    table: str
    key: tuple[str, ...]
    format: str
    encoding: str | None
    delimiter: str | None
    sheet: str | None
    columns: dict[str, str]
    ignored_headers: tuple[str, ...]
    inserted: int
    updated: int
    unchanged: int
    rejected: int
    rejections: tuple[Rejection, ...] = field(default=())
    dry_run: bool = False
    written: bool = True
    stopped_at_line: int | None = None
    seconds: float = 0.0

    @property
    def rows(self) -> int:
        return self.inserted + self.updated + self.unchanged + self.rejected

    @property
    def completed(self) -> bool:
        """True when every row of the file was processed."""
        return self.stopped_at_line is None

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "table": self.table,
            "key": list(self.key),
            "format": self.format,
            "encoding": self.encoding,
            "delimiter": self.delimiter,
            "sheet": self.sheet,
            "columns": self.columns,
            "ignored_headers": list(self.ignored_headers),
            "rows": self.rows,
            "inserted": self.inserted,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "rejected": self.rejected,
            "rejections": [r.to_dict() for r in self.rejections],
            "rejections_listed": len(self.rejections),
            "dry_run": self.dry_run,
            "written": self.written,
            "completed": self.completed,
            "stopped_at_line": self.stopped_at_line,
            "seconds": round(self.seconds, 3),
            "rows_per_second": round(self.rows_per_second, 1),
        }
