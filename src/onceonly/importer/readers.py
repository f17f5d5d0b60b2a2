"""Streaming readers for CSV and XLSX, with the encoding and delimiter guessed
the way a Brazilian export needs.

Memory stays bounded whatever the file's size: CSV is decoded 1 MiB at a time,
XLSX is read with openpyxl's read-only (streaming) mode.

CSV encoding, unless given: a byte-order mark decides (UTF-8, UTF-16, as
Excel's "Unicode text" writes); otherwise the file is read as UTF-8 and, at the
first byte that is not UTF-8, the rest is read as Windows-1252 (what "latin-1"
exports from Windows really are; a byte Windows-1252 leaves undefined switches
to ISO-8859-1). Switching at that point is exact, not a guess about the part
already read: text with no accent is the same in all three, and one accented
letter in Windows-1252 is practically never valid UTF-8.

CSV delimiter, unless given: the one of ``;`` ``,`` tab ``|`` that splits the
first lines into the same number of fields as the header, most fields first.

Line numbers are the ones a text editor shows (a record whose quoted value
spans lines has the number of its first line), and sheet row numbers for XLSX.
Entirely blank lines and rows are skipped.
"""

from __future__ import annotations

import codecs
import csv
import io
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

from .errors import FileFormatError
from .values import to_text

__all__ = ["Sheet", "open_sheet"]

Source = str | os.PathLike[str] | IO[bytes]

CHUNK = 1 << 20
_SAMPLE_LINES = 50
_DELIMITERS = (";", ",", "\t", "|")
_DELIMITER_NAMES = {"tab": "\t", "\\t": "\t", "semicolon": ";", "comma": ",", "pipe": "|"}
# Read as UTF-8 until a byte says otherwise, then Windows-1252, then ISO-8859-1
# (which decodes every byte, so the chain always ends).
_AUTO_CHAIN = ("utf-8", "cp1252", "latin-1")
_ZIP = b"PK\x03\x04"
_OLE2 = b"\xd0\xcf\x11\xe0"


@dataclass
class Sheet:
    """An open CSV or XLSX: its header, and its rows as ``(line, cells)``.

    `cells` are strings for CSV; for XLSX, what the cell holds (str, int,
    float, bool, datetime, date, time) with None for an empty cell. `done` and
    `total` measure progress (bytes for CSV, rows for XLSX; `total` is None
    when unknown).
    """

    format: Literal["csv", "xlsx"]
    headers: list[str]
    header_line: int
    rows: Iterator[tuple[int, Sequence[object]]]
    delimiter: str | None = None
    sheet_name: str | None = None
    total: int | None = None
    done: int = 0
    _encoding: _Decoder | None = None
    _closers: tuple[Any, ...] = ()

    @property
    def encoding(self) -> str | None:
        """The encoding in use (it can move from utf-8 to cp1252 while reading)."""
        return self._encoding.name if self._encoding else None

    def close(self) -> None:
        for closer in self._closers:
            closer()

    def __enter__(self) -> Sheet:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def open_sheet(
    source: Source,
    *,
    encoding: str | None = None,
    delimiter: str | None = None,
    sheet: str | None = None,
) -> Sheet:
    """Open `source` (a path or a binary file object) as CSV or XLSX, chosen by
    its first bytes, not by its name."""
    stream, owned = _binary(source)
    try:
        magic = _head(stream)
        if magic == _OLE2:
            raise FileFormatError(
                f"{_name(source)} is an old Excel .xls file (or a password-protected "
                "workbook): save it as .xlsx or CSV"
            )
        if magic == _ZIP:
            return _open_xlsx(stream, owned, sheet, _name(source))
        if sheet is not None:
            raise FileFormatError(
                f"{_name(source)} is not an XLSX workbook: --sheet applies only to XLSX"
            )
        return _open_csv(stream, owned, encoding, delimiter, _name(source))
    except BaseException:
        if owned:
            stream.close()
        raise


def _name(source: Source) -> str:
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    return str(getattr(source, "name", "the file"))


def _binary(source: Source) -> tuple[IO[bytes], bool]:
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        try:
            return path.open("rb"), True
        except FileNotFoundError:
            raise FileFormatError(f"no such file: {path}") from None
        except IsADirectoryError:
            raise FileFormatError(f"{path} is a directory, not a file") from None
    if not source.seekable() and not hasattr(source, "peek"):
        # The first bytes are looked at before they are read (format, BOM).
        return io.BufferedReader(source), False  # type: ignore[type-var]
    return source, False


def _head(stream: IO[bytes]) -> bytes:
    """The first bytes, left unread."""
    if stream.seekable():
        position = stream.tell()
        data = stream.read(4)
        stream.seek(position)
        return data
    return bytes(stream.peek(4)[:4])  # type: ignore[attr-defined]


def _size(stream: IO[bytes]) -> int | None:
    if not stream.seekable():
        return None
    position = stream.tell()
    size = stream.seek(0, io.SEEK_END)
    stream.seek(position)
    return size - position


# -- CSV -----------------------------------------------------------------------


class _Decoder:
    """Bytes to text, incrementally, moving along an encoding chain at the
    first byte the current encoding cannot decode."""

    def __init__(self, stream: IO[bytes], chain: Sequence[str]) -> None:
        self.stream = stream
        self.chain = list(chain)
        self.name = self.chain[0]
        self._decoder = codecs.getincrementaldecoder(self.name)()
        self.consumed = 0

    def _decode(self, data: bytes, final: bool) -> str:
        while True:
            pending = self._decoder.getstate()[0]
            try:
                return self._decoder.decode(data, final)
            except UnicodeDecodeError as exc:
                if len(self.chain) == 1:
                    raise FileFormatError(
                        f"the file is not valid {self.name} (byte {exc.object[exc.start]:#04x} "
                        f"near byte {self.consumed - len(data) + exc.start}): "
                        "pass the right --encoding, e.g. latin-1 or cp1252"
                    ) from None
                self.chain.pop(0)
                self.name = self.chain[0]
                self._decoder = codecs.getincrementaldecoder(self.name)()
                data = pending + data

    def read(self) -> str | None:
        """The next piece of text, or None at the end."""
        data = self.stream.read(CHUNK)
        self.consumed += len(data)
        if not data:
            tail = self._decode(b"", True)
            return tail or None
        return self._decode(data, False)


def _pick_chain(head: bytes, encoding: str | None) -> tuple[list[str], int]:
    """The encodings to try, and how many BOM bytes to skip."""
    if head.startswith(codecs.BOM_UTF8) and (
        encoding is None or codecs.lookup(encoding).name == "utf-8"
    ):
        return ["utf-8"], len(codecs.BOM_UTF8)
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) and (
        encoding is None or codecs.lookup(encoding).name.startswith("utf-16")
    ):
        return ["utf-16"], 0  # the codec reads the mark to learn the byte order
    if encoding is None:
        return list(_AUTO_CHAIN), 0
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise FileFormatError(f"unknown encoding {encoding!r}") from None
    return [encoding], 0


def _text_blocks(decoder: _Decoder) -> Iterator[str]:
    """Decoded text in blocks that end at a line end, so no line is cut."""
    pending = ""
    while (text := decoder.read()) is not None:
        pending += text
        cut = pending.rfind("\n")
        if cut < 0:
            cut = pending.rfind("\r", 0, len(pending) - 1)  # old Mac line ends
        if cut >= 0:
            yield pending[: cut + 1]
            pending = pending[cut + 1 :]
    if pending:
        yield pending


def _lines(blocks: Iterable[str]) -> Iterator[str]:
    # StringIO with newline="" splits exactly as open(newline="") does, which
    # is what the csv module expects (quoted line breaks stay in their field).
    return itertools.chain.from_iterable(io.StringIO(block, newline="") for block in blocks)


def _sniff_delimiter(lines: list[str]) -> str:
    best, best_score = ",", (-1.0, 0)
    for candidate in _DELIMITERS:
        records = [r for r in csv.reader(lines, delimiter=candidate) if r]
        if not records:
            continue
        width = len(records[0])
        if width < 2:
            continue
        consistent = sum(len(r) == width for r in records) / len(records)
        score = (consistent, width)
        if score > best_score:
            best, best_score = candidate, score
    return best


def _delimiter(value: str) -> str:
    value = _DELIMITER_NAMES.get(value.lower(), value)
    if len(value) != 1:
        raise FileFormatError(f"the delimiter must be one character (or 'tab'), not {value!r}")
    return value


def _open_csv(
    stream: IO[bytes], owned: bool, encoding: str | None, delimiter: str | None, name: str
) -> Sheet:
    chain, skip = _pick_chain(_head(stream), encoding)
    stream.read(skip)
    total = _size(stream)
    decoder = _Decoder(stream, chain)
    lines = _lines(_text_blocks(decoder))
    sample = list(itertools.islice(lines, _SAMPLE_LINES))
    delim = _delimiter(delimiter) if delimiter else _sniff_delimiter(sample)
    reader = csv.reader(itertools.chain(sample, lines), delimiter=delim)

    def records() -> Iterator[tuple[int, Sequence[object]]]:
        start = 1
        try:
            for record in reader:
                if any(record):
                    sheet.done = decoder.consumed
                    yield start, record
                start = reader.line_num + 1
        except csv.Error as exc:
            raise FileFormatError(f"line {reader.line_num + 1}: {exc}") from None
        sheet.done = decoder.consumed

    sheet = Sheet(
        format="csv",
        headers=[],
        header_line=0,
        rows=iter(()),
        delimiter=delim,
        total=total,
        _encoding=decoder,
        _closers=(stream.close,) if owned else (),
    )
    rows = records()
    try:
        sheet.header_line, header = next(rows)
    except StopIteration:
        raise FileFormatError(f"{name} is empty: no header row") from None
    sheet.headers = [to_text(h).strip() for h in header]
    sheet.rows = rows
    return sheet


# -- XLSX ----------------------------------------------------------------------


#: What an XLSX may unpack to. openpyxl streams the sheets' rows, but it
#: holds every shared string in memory: an 830 KB file whose strings unpack to
#: 340 MB took 1.95 GB and 148 s. Real exports of a few hundred thousand rows
#: stay well below these.
MAX_XLSX_UNPACKED = 512 * 1024 * 1024
MAX_SHARED_STRINGS_BYTES = 64 * 1024 * 1024
MAX_SHARED_STRINGS = 2_000_000


def _check_unpacked_size(stream: IO[bytes], name: str) -> None:
    """Refuse, from the zip's directory and before any XML is parsed, a
    workbook that would unpack to more than the limits above."""
    import re
    import zipfile

    start = stream.tell()
    try:
        with zipfile.ZipFile(stream) as archive:
            members = archive.infolist()
            unpacked = sum(m.file_size for m in members)
            if unpacked > MAX_XLSX_UNPACKED:
                raise FileFormatError(
                    f"{name} unpacks to {unpacked:,} bytes, over the "
                    f"{MAX_XLSX_UNPACKED:,}-byte limit for a workbook"
                )
            strings = next((m for m in members if m.filename == "xl/sharedStrings.xml"), None)
            if strings is None:
                return
            if strings.file_size > MAX_SHARED_STRINGS_BYTES:
                raise FileFormatError(
                    f"{name}'s shared strings unpack to {strings.file_size:,} bytes, over the "
                    f"{MAX_SHARED_STRINGS_BYTES:,}-byte limit (split the workbook, or export CSV)"
                )
            with archive.open(strings) as part:
                head = part.read(4096).decode("utf-8", "replace")
            declared = re.search(r'uniqueCount="(\d{1,12})"', head)
            if declared and int(declared[1]) > MAX_SHARED_STRINGS:
                raise FileFormatError(
                    f"{name} declares {int(declared[1]):,} shared strings, over the "
                    f"limit of {MAX_SHARED_STRINGS:,}"
                )
    finally:
        stream.seek(start)


def _open_xlsx(stream: IO[bytes], owned: bool, sheet: str | None, name: str) -> Sheet:
    import zipfile

    import openpyxl  # type: ignore[import-untyped]  # no stubs shipped

    if not stream.seekable():
        # A zip is read from its end: keep a non-seekable stream in a temporary file.
        spool = tempfile.SpooledTemporaryFile(max_size=64 * CHUNK)  # noqa: SIM115
        shutil.copyfileobj(stream, spool)
        spool.seek(0)
        if owned:
            stream.close()
        stream, owned = spool, True
    try:
        _check_unpacked_size(stream, name)
        workbook = openpyxl.load_workbook(stream, read_only=True, data_only=True)
    except (zipfile.BadZipFile, KeyError, OSError, ValueError) as exc:
        raise FileFormatError(f"{name} is not a readable XLSX workbook ({exc})") from None
    try:
        if sheet is None:
            worksheet = workbook.active or workbook.worksheets[0]
        elif sheet in workbook.sheetnames:
            worksheet = workbook[sheet]
        else:
            raise FileFormatError(
                f"{name} has no sheet {sheet!r}; its sheets are: {', '.join(workbook.sheetnames)}"
            )
        # The dimension in the file is a hint some writers get wrong; without
        # it openpyxl reads every row that is really there.
        estimate = worksheet.max_row
        worksheet.reset_dimensions()
        numbered = enumerate(worksheet.iter_rows(values_only=True), start=1)
        blank = ("", None)
        for header_line, header in numbered:  # noqa: B007  # used after the loop
            if any(v not in blank for v in header):
                break
        else:
            raise FileFormatError(f"{name}: sheet {worksheet.title!r} is empty: no header row")
    except BaseException:
        workbook.close()
        raise
    headers = [to_text(v).strip() if v is not None else "" for v in header]
    result = Sheet(
        format="xlsx",
        headers=headers,
        header_line=header_line,
        rows=iter(()),
        sheet_name=worksheet.title,
        total=estimate if isinstance(estimate, int) and estimate > 1 else None,
        _closers=(workbook.close, *((stream.close,) if owned else ())),
    )

    def rows() -> Iterator[tuple[int, Sequence[object]]]:
        for line, values in numbered:
            result.done = line
            if any(v not in blank for v in values):
                yield line, values

    result.rows = rows()
    return result
