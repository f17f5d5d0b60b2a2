"""Reading what Brazilian exports really contain: any delimiter and encoding,
XLSX cells, line numbers a person can find, and cell values written the
Brazilian way. Files are built in memory (no I/O)."""

from __future__ import annotations

import codecs
import io
from collections.abc import Sequence
from datetime import date, datetime, time
from decimal import Decimal

import openpyxl  # type: ignore[import-untyped]
import pytest

from onceonly.importer import FileFormatError, InvalidValue
from onceonly.importer.readers import CHUNK, Sheet, open_sheet
from onceonly.importer.values import (
    parse_bool,
    parse_date,
    parse_datetime,
    parse_decimal,
    parse_integer,
    parse_time,
)


def sheet_of(data: bytes, **options: str) -> Sheet:
    return open_sheet(io.BytesIO(data), **options)


def rows_of(sheet: Sheet) -> list[tuple[int, list[object]]]:
    return [(line, list(cells)) for line, cells in sheet.rows]


# -- CSV delimiters -------------------------------------------------------------


@pytest.mark.parametrize("delimiter", [";", ",", "\t", "|"])
def test_the_delimiter_is_detected(delimiter: str) -> None:
    text = delimiter.join(["cpf", "nome", "valor"]) + "\n"
    text += delimiter.join(["123", "Ana", '"1,5"' if delimiter == "," else "1,5"]) + "\n"
    sheet = sheet_of(text.encode())
    assert sheet.delimiter == delimiter
    assert sheet.headers == ["cpf", "nome", "valor"]
    assert rows_of(sheet) == [(2, ["123", "Ana", "1,5"])]


def test_semicolons_win_over_decimal_commas() -> None:
    # Brazilian exports use ";" because "," is the decimal separator.
    data = b"nome;valor\nAna;1.234,56\nBia;7,5\n"
    sheet = sheet_of(data)
    assert sheet.delimiter == ";"
    assert rows_of(sheet) == [(2, ["Ana", "1.234,56"]), (3, ["Bia", "7,5"])]


@pytest.mark.parametrize(("given", "used"), [("tab", "\t"), ("\\t", "\t"), (";", ";")])
def test_a_delimiter_can_be_given(given: str, used: str) -> None:
    sheet = sheet_of(b"a;b\tc\n1;2\t3\n", delimiter=given)
    assert sheet.delimiter == used


def test_a_long_delimiter_is_refused() -> None:
    with pytest.raises(FileFormatError, match="one character"):
        sheet_of(b"a;b\n", delimiter=";;")


# -- CSV encodings --------------------------------------------------------------------


def test_utf8_with_a_bom_keeps_the_first_header_clean() -> None:
    sheet = sheet_of(codecs.BOM_UTF8 + "CPF;Nome\n1;João\n".encode())
    assert sheet.headers == ["CPF", "Nome"]
    assert rows_of(sheet) == [(2, ["1", "João"])]
    assert sheet.encoding == "utf-8"


def test_windows_latin1_exports_are_read_right() -> None:
    # Quotes and dashes are where Windows-1252 and ISO-8859-1 differ.
    street = "Rua \u201cA\u201d \u2013 5"
    sheet = sheet_of(f"CPF;Nome;Endereço\n1;Conceição;{street}\n".encode("cp1252"))
    assert sheet.headers == ["CPF", "Nome", "Endereço"]
    assert rows_of(sheet) == [(2, ["1", "Conceição", street])]
    assert sheet.encoding == "cp1252"


def test_bytes_windows_1252_leaves_undefined_fall_back_to_latin1() -> None:
    sheet = sheet_of(b"nome\nA\x81\xe9\n")
    assert rows_of(sheet) == [(2, ["A\x81é"])]
    assert sheet.encoding == "latin-1"


def test_a_first_accent_far_into_the_file_still_reads_right() -> None:
    # Past the first megabyte, plain ASCII; then one latin-1 name.
    filler = b"".join(b"%d;Ana\n" % i for i in range(CHUNK // 6))
    data = b"id;nome\n" + filler + "999999;Conceição\n".encode("cp1252")
    assert len(data) > CHUNK
    rows = rows_of(sheet_of(data))
    assert rows[-1][1] == ["999999", "Conceição"]
    assert rows[0] == (2, ["0", "Ana"])


def test_excel_unicode_text_utf16_is_read() -> None:
    data = codecs.BOM_UTF16_LE + "CPF\tNome\r\n1\tJoão\r\n".encode("utf-16-le")
    sheet = sheet_of(data)
    assert (sheet.delimiter, sheet.headers) == ("\t", ["CPF", "Nome"])
    assert rows_of(sheet) == [(2, ["1", "João"])]


def test_a_wrong_encoding_given_says_which_to_try() -> None:
    with pytest.raises(FileFormatError, match=r"not valid utf-8.*--encoding"):
        rows_of(sheet_of("nome\nJoão\n".encode("cp1252"), encoding="utf-8"))


def test_an_unknown_encoding_is_refused() -> None:
    with pytest.raises(FileFormatError, match="unknown encoding"):
        sheet_of(b"a\n1\n", encoding="klingon")


# -- CSV line numbers -----------------------------------------------------------------


def test_line_numbers_are_the_ones_an_editor_shows() -> None:
    data = (
        b"\r\n"  # a blank first line
        b"id;note\r\n"
        b'1;"two\r\nlines"\r\n'
        b"\r\n"
        b"2;plain\r\n"
        b";\r\n"  # only delimiters: blank too
        b"3;last"  # no final line end
    )
    sheet = sheet_of(data)
    assert sheet.header_line == 2
    assert rows_of(sheet) == [
        (3, ["1", "two\r\nlines"]),
        (6, ["2", "plain"]),
        (8, ["3", "last"]),
    ]


def test_progress_is_counted_in_bytes() -> None:
    data = b"a;b\n" + b"1;2\n" * 1000
    sheet = sheet_of(data)
    assert sheet.total == len(data)
    rows_of(sheet)
    assert sheet.done == len(data)


# -- what is not a CSV or XLSX ----------------------------------------------------------


def test_an_old_xls_is_refused_with_what_to_do() -> None:
    with pytest.raises(FileFormatError, match=r"\.xls.*save it as \.xlsx or CSV"):
        sheet_of(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 100)


def test_an_empty_file_is_refused() -> None:
    with pytest.raises(FileFormatError, match="no header row"):
        sheet_of(b"\r\n\r\n")


def test_a_broken_zip_is_not_a_workbook() -> None:
    with pytest.raises(FileFormatError, match="not a readable XLSX"):
        sheet_of(b"PK\x03\x04 not really a zip")


# -- XLSX -------------------------------------------------------------------------------


def workbook(*sheets: tuple[str, Sequence[Sequence[object]]]) -> bytes:
    book = openpyxl.Workbook()
    book.remove(book.active)
    for title, rows in sheets:
        sheet = book.create_sheet(title)
        for row in rows:
            sheet.append(list(row))
    buffer = io.BytesIO()
    book.save(buffer)
    return buffer.getvalue()


def test_xlsx_cells_keep_their_types_and_rows_their_numbers() -> None:
    data = workbook(
        (
            "Clientes",
            [
                ["CPF", "Nome", "Nascimento", "Ativo", "Limite"],
                [12345678909, "Ana", datetime(1980, 12, 31), True, 1234.5],
                [None, None, None, None, None],  # a blank row in between
                ["529.982.247-25", "Bia", None, False, 10],
            ],
        )
    )
    sheet = sheet_of(data)
    assert (sheet.format, sheet.sheet_name, sheet.delimiter) == ("xlsx", "Clientes", None)
    assert sheet.headers == ["CPF", "Nome", "Nascimento", "Ativo", "Limite"]
    assert rows_of(sheet) == [
        (2, [12345678909, "Ana", datetime(1980, 12, 31), True, 1234.5]),
        (4, ["529.982.247-25", "Bia", None, False, 10]),
    ]


def test_xlsx_sheet_by_name() -> None:
    data = workbook(("Resumo", [["x"], [1]]), ("Clientes", [["cpf"], ["1"]]))
    assert rows_of(sheet_of(data, sheet="Clientes")) == [(2, ["1"])]
    with pytest.raises(FileFormatError, match=r"no sheet 'Vendas'.*Resumo, Clientes"):
        sheet_of(data, sheet="Vendas")


def test_sheet_is_only_for_xlsx() -> None:
    with pytest.raises(FileFormatError, match="--sheet"):
        sheet_of(b"a\n1\n", sheet="Plan1")


# -- cell values ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("1234", "1234"),
        ("-12", "-12"),
        ("1234,56", "1234.56"),
        ("1.234,56", "1234.56"),
        ("1.234.567,8", "1234567.8"),
        ("1.234.567", "1234567"),
        ("1234.56", "1234.56"),  # what programs write
        ("1,234.56", "1234.56"),
        ("R$ 1.234,56", "1234.56"),
        ("-R$ 5,00", "-5.00"),
        ("R$ -5,00", "-5.00"),
        ("1\u00a0234,5", "1234.5"),  # LibreOffice's no-break space for thousands
        ("1,5E3", "1500"),
        (1234, "1234"),
        (0.1, "0.1"),
    ],
)
def test_numbers_written_the_brazilian_way_or_not(text: object, number: str) -> None:
    assert parse_decimal(text) == Decimal(number)


@pytest.mark.parametrize("text", ["abc", "1.23,4", "1,2,3,4", "12a", "--1", "", "R$"])
def test_what_is_not_a_number_is_refused(text: str) -> None:
    with pytest.raises(InvalidValue, match="is not a number"):
        parse_decimal(text)


def test_the_decimal_separator_can_be_fixed() -> None:
    assert parse_decimal("1.234") == Decimal("1.234")  # auto: a single dot is a point
    assert parse_decimal("1.234", "comma") == Decimal("1234")
    assert parse_decimal("1,234", "point") == Decimal("1234")
    with pytest.raises(InvalidValue):
        parse_decimal("1.5", "comma")


def test_integers() -> None:
    assert parse_integer("42") == 42
    assert parse_integer("1.234.567") == 1234567
    assert parse_integer(3.0) == 3
    with pytest.raises(InvalidValue, match="not a whole number"):
        parse_integer("2,5")


@pytest.mark.parametrize(
    "text", ["31/12/2024", "31-12-2024", "31.12.2024", "2024-12-31", "31/12/2024 00:00"]
)
def test_dates_day_first_or_iso(text: str) -> None:
    assert parse_date(text) == date(2024, 12, 31)


def test_dates_from_cells() -> None:
    assert parse_date(datetime(2024, 12, 31)) == date(2024, 12, 31)
    assert parse_date(date(2024, 12, 31)) == date(2024, 12, 31)
    with pytest.raises(InvalidValue, match="time of day"):
        parse_date(datetime(2024, 12, 31, 10, 30))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("31/02/2024", "not a valid date"),
        ("12/31/2024", "not a valid date"),  # month-first is not what Brazil writes
        ("31/12/24", "four digits"),
        ("ontem", "not a date"),
        ("31/12/2024 10:30", "time of day"),
    ],
)
def test_what_is_not_a_date_is_refused(text: str, reason: str) -> None:
    with pytest.raises(InvalidValue, match=reason):
        parse_date(text)


def test_dates_and_times() -> None:
    assert parse_datetime("31/12/2024 10:30") == datetime(2024, 12, 31, 10, 30)
    assert parse_datetime("31/12/2024 10:30:15") == datetime(2024, 12, 31, 10, 30, 15)
    assert parse_datetime("2024-12-31T10:30:00") == datetime(2024, 12, 31, 10, 30)
    assert parse_datetime("31/12/2024") == datetime(2024, 12, 31)
    assert parse_datetime("2024-12-31T10:30:00-03:00").utcoffset() is not None
    assert parse_time("08:05") == time(8, 5)
    with pytest.raises(InvalidValue, match="not a valid time"):
        parse_time("25:00")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("sim", True),
        ("Sim", True),
        ("S", True),
        ("true", True),
        ("1", True),
        ("não", False),
        ("NAO", False),
        ("n", False),
        ("false", False),
        ("0", False),
        (True, True),
        (0, False),
    ],
)
def test_yes_and_no(text: object, value: bool) -> None:
    assert parse_bool(text) is value


def test_what_is_not_yes_or_no_is_refused() -> None:
    with pytest.raises(InvalidValue, match="sim/não"):
        parse_bool("talvez")


def _workbook_with_shared_strings(xml_tail: bytes, repeat: int) -> bytes:
    """A valid XLSX whose xl/sharedStrings.xml is replaced by a large,
    highly compressible one (as a zip bomb is made)."""
    import zipfile

    book = openpyxl.Workbook()
    book.active.append(["cpf", "nome"])
    book.active.append(["123", "x"])
    plain = io.BytesIO()
    book.save(plain)
    out = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(plain.getvalue())) as source,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target,
    ):
        for item in source.infolist():
            if item.filename != "xl/sharedStrings.xml":
                target.writestr(item, source.read(item))
        head = (
            b'<?xml version="1.0" encoding="UTF-8"?><sst xmlns="http://schemas.openxmlformats'
            b'.org/spreadsheetml/2006/main" count="%d" uniqueCount="%d">' % (repeat, repeat)
        )
        target.writestr("xl/sharedStrings.xml", head + xml_tail * repeat + b"</sst>")
    return out.getvalue()


def test_an_xlsx_whose_shared_strings_unpack_past_the_limit_is_refused_before_parsing() -> None:
    import time

    # About 70 MB of shared strings in a file of well under 1 MB.
    bomb = _workbook_with_shared_strings(b"<si><t>" + b"a" * 100 + b"</t></si>", 600_000)
    assert len(bomb) < 1_000_000
    started = time.monotonic()
    with pytest.raises(FileFormatError, match="shared strings unpack to"):
        open_sheet(io.BytesIO(bomb))
    assert time.monotonic() - started < 5


def test_an_xlsx_declaring_millions_of_shared_strings_is_refused() -> None:
    many = _workbook_with_shared_strings(b"<si><t>a</t></si>", 2_500_000)
    with pytest.raises(FileFormatError, match="shared strings"):
        open_sheet(io.BytesIO(many))
