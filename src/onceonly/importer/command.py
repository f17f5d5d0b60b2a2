"""``onceonly import``: the importer from the shell.

The command shares ``--app``/``--database-url`` and the clean error handling
with every other command, from :mod:`onceonly.cli.options`;
:mod:`onceonly.cli.group` registers it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import click

from .._click import FORMAT as _FORMAT
from ..cli.options import app_options, console, errors, fail_cleanly, load

if TYPE_CHECKING:
    from rich.console import Console

    from .report import ImportProgress, ImportReport

__all__ = ["import_command"]

# Exit statuses a script can act on (2 and 3 are every command's: configuration
# error, database unreachable).
EXIT_REJECTED = 4
EXIT_STOPPED = 5
EXIT_INTERRUPTED = 130

_LISTED_IN_TEXT = 20

HELP = """Upsert a CSV or XLSX file into TABLE by a natural key.

Running the same import twice changes nothing the second time: rows are
written with INSERT ... ON CONFLICT (key) DO UPDATE, and a row whose values did
not change is not written at all. The key must be backed by a primary key,
unique constraint or unique index of TABLE.

\b
Example: customers keyed by CPF, from a Brazilian Excel export:
  onceonly import clientes.csv --table customers --key cpf --key-type cpf
  onceonly import clientes.csv --table customers --key cpf --key-type cpf \\
      --map "CPF/CNPJ=cpf" --map "Observações=" --dry-run --format json

Headers match columns ignoring case, accents and punctuation ("Data de
Nascimento" fills data_de_nascimento); --map HEADER=COLUMN says otherwise, and
--map HEADER= leaves a header out. Other headers are ignored (and listed).
CSV encoding (UTF-8, BOM, latin-1/cp1252) and delimiter (; , tab |) are
detected. Values are converted to each column's type: 1.234,56 and 1234.56,
dd/mm/yyyy and yyyy-mm-dd, sim/não, true/false.

A bad row (invalid CPF, missing key, wrong type, refused by the database) is
reported with its line and reason and never written. Good rows are committed
every --batch-size rows: an interrupted import can simply be run again. Within
the file, the last row with a given key wins.

\b
Exit status: 0 every row imported; 4 some rows rejected; 5 stopped by
--max-errors; 2 bad options, file, table or key; 3 database unreachable;
130 interrupted.
"""


def _pairs(values: Sequence[str]) -> list[tuple[str | None, str]]:
    """``A=B`` or ``B`` items, also comma-separated within one value."""
    items: list[tuple[str | None, str]] = []
    for value in values:
        for item in value.split(","):
            if not item.strip():
                continue
            name, sep, target = item.rpartition("=")
            items.append((name.strip(), target.strip()) if sep else (None, item.strip()))
    return items


def _key_types(key: list[str], values: Sequence[str]) -> dict[str, str]:
    result: dict[str, str] = {}
    positional = [t for name, t in _pairs(values) if name is None]
    if len(positional) > len(key):
        raise click.BadParameter(
            f"{len(positional)} key types for {len(key)} key column(s) ({', '.join(key)}); "
            "use COLUMN=TYPE to be explicit",
            param_hint="--key-type",
        )
    result.update(zip(key, positional, strict=False))
    result.update({name: t for name, t in _pairs(values) if name is not None})
    return result


def _mapping(values: Sequence[str]) -> dict[str, str | None]:
    result: dict[str, str | None] = {}
    for value in values:
        header, sep, column = value.rpartition("=")
        if not sep or not header.strip():
            raise click.BadParameter(
                f"{value!r}: write HEADER=COLUMN, or HEADER= to leave it out", param_hint="--map"
            )
        result[header.strip()] = column.strip() or None
    return result


def _build() -> click.Command:
    @click.command("import", help=HELP, short_help="Upsert a CSV/XLSX file into a table by a key.")
    @app_options
    @click.argument("file", type=click.Path(dir_okay=False, allow_dash=False))
    @click.option("--table", required=True, help="Target table (NAME or SCHEMA.NAME); must exist.")
    @click.option(
        "--key",
        required=True,
        metavar="COLUMN[,COLUMN]",
        help="Key column(s), backed by a unique constraint or index.",
    )
    @click.option(
        "--key-type",
        "key_type_values",
        multiple=True,
        metavar="[COLUMN=]TYPE",
        help="cpf, cnpj (check digits validated, punctuation ignored), code (trimmed, "
        "case-folded) or raw (default), per key column in --key order or as COLUMN=TYPE.",
    )
    @click.option(
        "--map",
        "map_values",
        multiple=True,
        metavar="HEADER=COLUMN",
        help="Put HEADER's values in COLUMN; HEADER= leaves it out. Repeatable.",
    )
    @click.option(
        "--encoding", help="CSV encoding (e.g. latin-1, cp1252, utf-8). [default: detect]"
    )
    @click.option(
        "--delimiter", help="CSV delimiter: ';', ',', tab, '|' or any character. [default: detect]"
    )
    @click.option("--sheet", help="XLSX sheet name. [default: the active sheet]")
    @click.option(
        "--decimal",
        type=click.Choice(["auto", "comma", "point"]),
        default="auto",
        show_default=True,
        help="Decimal separator: comma (1.234,56), point (1,234.56), or auto per value.",
    )
    @click.option(
        "--batch-size",
        default=5000,
        show_default=True,
        type=click.IntRange(1, 1_000_000),
        help="Rows per upsert and commit.",
    )
    @click.option(
        "--max-errors",
        default=100,
        show_default=True,
        type=click.IntRange(0),
        help="Rejected rows tolerated before stopping (0: stop at the first).",
    )
    @click.option(
        "--dry-run",
        is_flag=True,
        help="Run everything in a transaction that is rolled back: the report, nothing written.",
    )
    @click.option(
        "--all-or-nothing",
        is_flag=True,
        help="One transaction for the whole file: if --max-errors stops it, nothing is kept.",
    )
    @click.option(
        "--rejects",
        type=click.Path(dir_okay=False, writable=True),
        help="Write every rejected row to this CSV, with its line and reason.",
    )
    @click.option(
        "--progress/--no-progress",
        default=None,
        help="Progress bar on stderr. [default: when stderr is a terminal]",
    )
    @click.option("--quiet", "-q", is_flag=True, help="No progress and no text report.")
    @_FORMAT
    @fail_cleanly
    def import_command(
        app_spec: str | None,
        database_url: str | None,
        file: str,
        table: str,
        key: str,
        key_type_values: tuple[str, ...],
        map_values: tuple[str, ...],
        encoding: str | None,
        delimiter: str | None,
        sheet: str | None,
        decimal: str,
        batch_size: int,
        max_errors: int,
        dry_run: bool,
        all_or_nothing: bool,
        rejects: str | None,
        progress: bool | None,
        quiet: bool,
        fmt: str,
    ) -> None:
        from .pipeline import Importer

        keys = [k.strip() for k in key.split(",") if k.strip()]
        importer = Importer(
            file,
            table=table,
            key=keys,
            database_url=load(app_spec, database_url).database_url,
            key_types=_key_types(keys, key_type_values),
            mapping=_mapping(map_values),
            encoding=encoding,
            delimiter=delimiter,
            sheet=sheet,
            decimal=decimal,  # type: ignore[arg-type]  # click.Choice checked it
            batch_size=batch_size,
            max_errors=max_errors,
            dry_run=dry_run,
            all_or_nothing=all_or_nothing,
            rejects=rejects,
        )
        show_progress = (not quiet) and (sys.stderr.isatty() if progress is None else progress)
        try:
            with _ProgressBar(errors, show_progress, file) as on_progress:
                importer.on_progress = on_progress
                report = importer.run()
        except KeyboardInterrupt:
            _interrupted(errors, importer, dry_run or all_or_nothing)
            sys.exit(EXIT_INTERRUPTED)
        if fmt == "json":
            click.echo(json.dumps(report.to_dict(), ensure_ascii=False, indent=2))
        elif not quiet:
            _print_report(report)
        if report.ignored_headers and not quiet and fmt != "json":
            errors.print(
                "[yellow]ignored headers[/yellow] (no column of that name; --map to use them): "
                + ", ".join(report.ignored_headers),
                markup=True,
                highlight=False,
            )
        if not report.completed:
            sys.exit(EXIT_STOPPED)
        if report.rejected:
            sys.exit(EXIT_REJECTED)

    return import_command


class _ProgressBar:
    """A rich progress bar fed by the importer's per-batch callback."""

    def __init__(self, console: Console, enabled: bool, label: str) -> None:
        self.console = console
        self.enabled = enabled
        self.label = label
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self) -> Callable[[ImportProgress], None] | None:
        if not self.enabled:
            return None
        from rich.progress import (
            BarColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[rows]:>10,} rows"),
            TextColumn("{task.fields[rate]:>8,.0f} rows/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        self.bar.start()
        self.task = self.bar.add_task(self.label, total=None, rows=0, rate=0.0)
        self.started = self.bar.get_time()
        return self.update

    def update(self, progress: ImportProgress) -> None:
        elapsed = max(self.bar.get_time() - self.started, 1e-9)
        self.bar.update(
            self.task,
            completed=progress.done,
            total=progress.total,
            rows=progress.rows,
            rate=progress.rows / elapsed,
        )

    def __exit__(self, *_: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def _interrupted(console: Console, importer: Any, nothing_kept: bool) -> None:
    done = importer.progress()
    if nothing_kept:
        console.print("[yellow]interrupted:[/yellow] nothing was written.")
        return
    through = importer.committed_through_line
    console.print(
        f"[yellow]interrupted:[/yellow] {done.rows:,} rows processed, committed through "
        f"line {through:,}. Run the same command again to finish: rows already in the "
        "table will count as unchanged.",
        highlight=False,
    )


def _print_report(report: ImportReport) -> None:
    from rich.table import Table

    where = [report.format]
    if report.encoding:
        where.append(report.encoding)
    if report.delimiter:
        where.append(f"delimiter {report.delimiter!r}")
    if report.sheet:
        where.append(f"sheet {report.sheet!r}")
    title = f"{report.file} → {report.table} (key {', '.join(report.key)}; {', '.join(where)})"
    console.print(title, highlight=False)
    counts = Table(show_header=False)
    counts.add_column(style="bold")
    counts.add_column(justify="right")
    for label, value in [
        ("inserted", report.inserted),
        ("updated", report.updated),
        ("unchanged", report.unchanged),
        ("rejected", report.rejected),
        ("rows", report.rows),
    ]:
        counts.add_row(label, f"{value:,}")
    console.print(counts)
    if report.rejections:
        table = Table("line", "column", "reason", title="rejected rows", title_justify="left")
        for r in report.rejections[:_LISTED_IN_TEXT]:
            table.add_row(str(r.line), r.column or "-", r.reason)
        console.print(table, highlight=False)
        if report.rejected > _LISTED_IN_TEXT:
            console.print(
                f"... and {report.rejected - _LISTED_IN_TEXT:,} more: "
                "--rejects FILE keeps every one, --format json lists them."
            )
    seconds = f"{report.seconds:.2f}" if report.seconds < 10 else f"{report.seconds:,.0f}"
    console.print(
        f"{report.rows:,} rows in {seconds} s ({report.rows_per_second:,.0f} rows/s)",
        highlight=False,
    )
    if report.stopped_at_line is not None:
        kept = "nothing was kept" if not report.written else "rows before it are committed"
        console.print(
            f"[red]stopped at line {report.stopped_at_line:,}[/red]: more than the "
            f"--max-errors allowed were rejected; {kept}.",
            highlight=False,
        )
    if report.dry_run:
        console.print("[yellow]dry run:[/yellow] nothing was written.")


import_command = _build()
