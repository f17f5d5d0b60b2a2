"""One import, from the first byte of the file to the report.

Two threads share the work, so parsing the next batch overlaps with the
database writing the last one: the reading thread parses and checks rows (a
bad row is rejected with its line and never reaches the database) and hands
batches over; the writing thread upserts each batch and, by default, commits
it, and does all the counting, in file order. At most two batches wait
between them, so memory stays bounded whatever the file's size.

A key seen twice in one batch closes the batch first, so every row reaches the
database in file order and the last occurrence of a key wins, with every row
counted once.

Interrupted anywhere (Ctrl-C, SIGKILL, a power cut), the committed batches are
a prefix of the file; running the same import again leaves the table exactly
as one uninterrupted run would (the committed rows come back "unchanged").
"""

from __future__ import annotations

import contextlib
import csv
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .._exceptions import ConfigurationError
from ..db import create_engine
from ..store.bulk import BulkUpserts
from .columns import Plan, plan_import, target_table
from .errors import InvalidValue
from .keys import KeyType
from .readers import Sheet, Source, open_sheet
from .report import MAX_LISTED_REJECTIONS, ImportProgress, ImportReport, Rejection
from .values import DecimalMode, to_text
from .writer import BatchResult, Writer

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_MAX_ERRORS", "Importer"]

DEFAULT_BATCH_SIZE = 5000
DEFAULT_MAX_ERRORS = 100


@dataclass
class _Batch:
    """Rows for one upsert, and the rows rejected among them while reading:
    each rejection with the number of batch rows that come before it."""

    rows: list[tuple[object, ...]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    cells: list[Sequence[object]] = field(default_factory=list)
    rejections: list[tuple[int, Rejection, Sequence[object]]] = field(default_factory=list)
    text_lines: list[str] = field(default_factory=list)

    @property
    def text(self) -> str | None:
        return "\n".join(self.text_lines) + "\n" if self.text_lines else None


class Importer:
    """An import of one file into one table; :meth:`run` does it.

    Most callers want :func:`onceonly.importer.import_file`; this class is for
    those who need the counts while it runs (:meth:`progress`), for example
    to say how far an interrupted import got.
    """

    def __init__(
        self,
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
    ) -> None:
        if (database_url is None) == (engine is None):
            raise ConfigurationError("give either database_url or engine")
        if batch_size < 1:
            raise ConfigurationError("batch_size must be at least 1")
        if max_errors < 0:
            raise ConfigurationError("max_errors must be 0 or more")
        self.source = source
        self.table_name = table
        self.key = [k.strip() for k in key.split(",")] if isinstance(key, str) else list(key)
        self.database_url = database_url
        self.engine = engine
        self.key_types = key_types
        self.mapping = mapping
        self.encoding = encoding
        self.delimiter = delimiter
        self.sheet_name = sheet
        self.decimal: DecimalMode = decimal
        self.batch_size = batch_size
        self.max_errors = max_errors
        self.dry_run = dry_run
        self.all_or_nothing = all_or_nothing
        self.rejects_target = rejects
        self.on_progress = on_progress

        # Written by the writing thread only, in file order.
        self.inserted = self.updated = self.unchanged = self.rejected = 0
        self.committed_through_line = 0
        self.stopped_at_line: int | None = None
        self._rejections: list[Rejection] = []
        self._sheet: Sheet | None = None
        self._rejects: Any = None  # a csv writer, when rejected rows are kept

    # -- public --------------------------------------------------------------------

    def progress(self) -> ImportProgress:
        """The counts so far."""
        sheet = self._sheet
        return ImportProgress(
            rows=self.inserted + self.updated + self.unchanged + self.rejected,
            inserted=self.inserted,
            updated=self.updated,
            unchanged=self.unchanged,
            rejected=self.rejected,
            done=sheet.done if sheet else 0,
            total=sheet.total if sheet else None,
        )

    def run(self) -> ImportReport:
        """Import the file; returns the report (also when rows were rejected or
        `max_errors` stopped it). Raises :class:`ImportSetupError` before
        writing anything when file, table and key do not fit together."""
        started = time.perf_counter()
        engine = self.engine or create_engine(str(self.database_url), pool_size=1)
        try:
            with open_sheet(
                self.source, encoding=self.encoding, delimiter=self.delimiter, sheet=self.sheet_name
            ) as sheet:
                self._sheet = sheet
                upserts = BulkUpserts(engine)
                plan = self._plan(upserts, sheet)
                with self._rejects_file() as rejects_stream:
                    if rejects_stream is not None:
                        self._rejects = csv.writer(rejects_stream, delimiter=sheet.delimiter or ";")
                        self._rejects.writerow(["rejected_line", "rejected_reason", *sheet.headers])
                    written = self._write(upserts, sheet, plan)
        finally:
            if self.engine is None:
                engine.dispose()
        return ImportReport(
            file=_display(self.source),
            table=plan.table.display_name,
            key=tuple(plan.key),
            format=sheet.format,
            encoding=sheet.encoding,
            delimiter=sheet.delimiter,
            sheet=sheet.sheet_name,
            columns=plan.mapping,
            ignored_headers=tuple(plan.ignored_headers),
            inserted=self.inserted,
            updated=self.updated,
            unchanged=self.unchanged,
            rejected=self.rejected,
            rejections=tuple(self._rejections),
            dry_run=self.dry_run,
            written=written,
            stopped_at_line=self.stopped_at_line,
            seconds=time.perf_counter() - started,
        )

    # -- set-up --------------------------------------------------------------------

    def _plan(self, upserts: BulkUpserts, sheet: Sheet) -> Plan:
        return plan_import(
            sheet.headers,
            target_table(upserts.describe(self.table_name)),
            key=self.key,
            key_types=self.key_types,
            mapping=self.mapping,
            decimal=self.decimal,
        )

    def _rejects_file(self) -> Any:
        target = self.rejects_target
        if target is None:
            return contextlib.nullcontext(None)
        if isinstance(target, str | os.PathLike):
            # utf-8 with a BOM: Excel opens it with the accents right.
            return Path(target).open("w", encoding="utf-8-sig", newline="")
        return contextlib.nullcontext(target)

    def _write(self, upserts: BulkUpserts, sheet: Sheet, plan: Plan) -> bool:
        session = upserts.open(
            plan.table,
            plan.column_names,
            plan.key,
            commit_every_batch=not (self.dry_run or self.all_or_nothing),
        )
        writer = Writer(session)
        try:
            self._pump(sheet, plan, writer)
            keep = not self.dry_run and not (
                self.all_or_nothing and self.stopped_at_line is not None
            )
            if keep:
                writer.commit()
            else:
                writer.rollback()
            return keep
        finally:
            writer.close()

    # -- the reading thread --------------------------------------------------------

    def _pump(self, sheet: Sheet, plan: Plan, writer: Writer) -> None:
        """Read in this thread; write in another when the writer gains from it,
        else here, batch after batch."""
        if not writer.threaded:
            self._read(sheet, plan, writer, lambda batch: self._consume(batch, writer))
            return
        handoff: queue.Queue[_Batch | None] = queue.Queue(maxsize=2)
        failure: list[BaseException] = []
        done = threading.Event()

        def write_all() -> None:
            try:
                while (batch := handoff.get()) is not None:
                    if self.stopped_at_line is None and not done.is_set():
                        self._consume(batch, writer)
            except BaseException as exc:  # re-raised in the reading thread
                failure.append(exc)
                done.set()
                while handoff.get() is not None:  # let the reader finish putting
                    pass

        thread = threading.Thread(target=write_all, name="onceonly-import-writer", daemon=True)
        thread.start()

        def hand_over(batch: _Batch) -> None:
            while not done.is_set():
                try:
                    handoff.put(batch, timeout=0.1)
                    return
                except queue.Full:
                    continue

        try:
            self._read(sheet, plan, writer, hand_over, done.is_set)
        except BaseException:
            done.set()  # the writer finishes the batch it holds, then stops
            raise
        finally:
            handoff.put(None)
            thread.join()
        if failure:
            raise failure[0]

    def _read(
        self,
        sheet: Sheet,
        plan: Plan,
        writer: Writer,
        hand_over: Callable[[_Batch], None],
        failed: Callable[[], bool] = lambda: False,
    ) -> None:
        coercers = [(c.index, c.coerce) for c in plan.columns]
        row_text = writer.row_text
        width = plan.width
        key_positions = plan.key_positions
        single_key = key_positions[0] if len(key_positions) == 1 else None
        keep_cells = self._rejects is not None
        batch = _Batch()
        keys: set[object] = set()
        rejected_here = 0  # rejected while reading: a lower bound of the true count

        def flush() -> bool:
            """Hand the batch over; False when the import is to stop."""
            nonlocal batch
            hand_over(batch)
            batch = _Batch()
            keys.clear()
            return not failed() and self.stopped_at_line is None

        for line, cells in sheet.rows:
            rejection: Rejection | None = None
            if len(cells) != width:
                if len(cells) > width and any(not _blank(c) for c in cells[width:]):
                    reason = (
                        f"{len(cells)} fields, but the header has {width} "
                        "(a delimiter inside a value that is not quoted?)"
                    )
                    rejection = Rejection(line, reason)
                else:
                    cells = [*cells[:width], *([None] * (width - len(cells)))]  # noqa: PLW2901
            if rejection is None:
                try:
                    values = tuple([coerce(cells[i]) for i, coerce in coercers])
                except InvalidValue:
                    rejection = _invalid(line, cells, plan)
            if rejection is not None:
                batch.rejections.append((len(batch.rows), rejection, cells))
                rejected_here += 1
                if rejected_here > self.max_errors:
                    break  # certainly over the limit: the writer finds exactly where
            else:
                key = (
                    values[single_key]
                    if single_key is not None
                    else tuple(values[p] for p in key_positions)
                )
                # A key twice in one batch: what came before goes first, so the
                # database sees both in file order and the later one wins.
                if key in keys and not flush():
                    return
                keys.add(key)
                batch.rows.append(values)
                batch.lines.append(line)
                if row_text is not None:
                    batch.text_lines.append(row_text(values))
                if keep_cells:
                    batch.cells.append(cells)
            # Rejected rows count too: a file of bad rows still goes in bounded batches.
            if len(batch.rows) + len(batch.rejections) >= self.batch_size and not flush():
                return
        hand_over(batch)

    # -- the writing thread --------------------------------------------------------

    def _consume(self, batch: _Batch, writer: Writer) -> None:
        allowed = self.max_errors - self.rejected
        early = batch.rejections
        # Rows past the rejection that goes over the limit are never written.
        limit = early[allowed][0] if len(early) > allowed else len(batch.rows)
        rows = batch.rows[:limit]
        result = BatchResult()
        if rows:
            skipped_before: list[int] | None = None
            if early:
                skipped_before, n = [], 0
                for i in range(len(rows)):
                    while n < len(early) and early[n][0] <= i:
                        n += 1
                    skipped_before.append(n)
            text = batch.text if limit == len(batch.rows) else None
            result = writer.write(rows, allowed, skipped_before, text)
        self.inserted += result.inserted
        self.updated += result.updated
        self.unchanged += result.unchanged
        # Every rejection of this batch, in file order (one found while reading
        # at position p comes before row p), until one goes over the limit.
        events = [(p, 0, rejection, cells) for p, rejection, cells in early]
        for index, reason in result.rejected:
            cells = batch.cells[index] if batch.cells else ()
            events.append((index, 1, Rejection(batch.lines[index], reason), cells))
        events.sort(key=lambda e: (e[0], e[1]))
        for _, _, rejection, cells in events:
            self._record(rejection, cells)
            if self.rejected > self.max_errors:
                self.stopped_at_line = rejection.line
                break
        written = len(rows) if result.stopped_at is None else result.stopped_at
        if not self.dry_run and not self.all_or_nothing:
            writer.commit()
            if written:
                self.committed_through_line = batch.lines[written - 1]
        if self.on_progress is not None:
            self.on_progress(self.progress())

    def _record(self, rejection: Rejection, cells: Sequence[object]) -> None:
        self.rejected += 1
        if len(self._rejections) < MAX_LISTED_REJECTIONS:
            self._rejections.append(rejection)
        if self._rejects is not None:
            shown = [_inert("" if c is None else to_text(c)) for c in cells]
            self._rejects.writerow([rejection.line, _inert(rejection.reason), *shown])


#: What makes a spreadsheet program read a cell as a formula (OWASP's list).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _inert(text: str) -> str:
    """`text` as a spreadsheet will show it, never run it: the rejects file is
    opened by people in Excel or LibreOffice, and its cells came from the
    imported file (``=HYPERLINK(...)``, ``@SUM(1+1)``). A leading quote
    keeps such a cell text; a plain negative number is left alone, so the
    fixed file imports as it should."""
    if not text.startswith(_FORMULA_STARTS):
        return text
    if text[0] == "-" and text[1:].replace(".", "", 1).replace(",", "", 1).isdigit():
        return text
    return "'" + text


def _invalid(line: int, cells: Sequence[object], plan: Plan) -> Rejection:
    """The rejection for a row that failed to convert: its first bad cell."""
    for column in plan.columns:
        value = cells[column.index]
        try:
            column.coerce(value)
        except InvalidValue as exc:
            shown = None if value is None else to_text(value)
            return Rejection(line, str(exc), column.column, shown)
    return Rejection(line, "invalid row")  # pragma: no cover - a cell did fail


def _blank(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _display(source: Source) -> str:
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    name = getattr(source, "name", None)
    return str(name) if isinstance(name, str) else "<stream>"
