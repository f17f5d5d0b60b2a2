"""Cell values as a Brazilian spreadsheet writes them, parsed into Python values.

Every parser takes what a reader yields for one cell (text from a CSV; text,
numbers, dates or booleans from an XLSX) and returns the Python value, or
raises :class:`~onceonly.importer.errors.InvalidValue` with the reason a person
reads next to the line number. Empty cells never get here: they are NULL.

Numbers (``decimal="auto"``, the default): a comma anywhere means the
Brazilian way unless a dot comes after it, so ``1.234,56`` and ``1234,56`` are
1234.56 and ``1,234.56`` is too; a single dot alone is a decimal point
(``1234.56``, what programs write), several dots are thousands (``1.234.567``).
``R$`` and spaces (also the no-break spaces LibreOffice uses for thousands) are
ignored. ``decimal="comma"`` or ``"point"`` removes the guessing: then ``1.234``
is one thousand two hundred and thirty-four, or one point two three four.

Dates are day first (``31/12/2024``, also with ``-`` or ``.``) or ISO
(``2024-12-31``); a two-digit year is refused rather than guessed.
"""

from __future__ import annotations

import math
import re
from datetime import date, datetime, time
from decimal import Decimal, InvalidOperation
from typing import Literal

from .errors import InvalidValue

__all__ = [
    "DecimalMode",
    "parse_bool",
    "parse_date",
    "parse_datetime",
    "parse_decimal",
    "parse_integer",
    "parse_time",
    "to_text",
]

DecimalMode = Literal["auto", "comma", "point"]

_EXPONENT = r"(?:[eE][+-]?\d+)?"
# Thousands groups must be groups of three, so "1.23,4" is refused, not misread.
_COMMA_DECIMAL = re.compile(r"(?:\d{1,3}(?:\.\d{3})+|\d+)(?:,\d+)?" + _EXPONENT)
_POINT_DECIMAL = re.compile(r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?" + _EXPONENT)
# One separator with digits on both sides and nothing else: no guessing needed
# unless it could be a thousands separator (exactly three digits after it).
_PLAIN = re.compile(r"-?\d+(?:([.,])(?:\d{1,2}|\d{4,}))?")
_SEP = {"comma": ",", "point": "."}
_GROUPED = re.compile(r"-?\d{1,3}(?:\.\d{3})+,\d+")
_NUMBER_NOISE = str.maketrans("", "", " \t\u00a0\u202f")

_TRUE = frozenset({"true", "t", "1", "sim", "s", "yes", "y", "verdadeiro"})
_FALSE = frozenset({"false", "f", "0", "não", "nao", "n", "no", "falso"})

_DAY_FIRST = re.compile(r"(\d{1,2})([/.-])(\d{1,2})\2(\d{2,4})")
_YEAR_FIRST = re.compile(r"(\d{4})([/-])(\d{1,2})\2(\d{1,2})")
_MIDNIGHT = re.compile(r"(?:[ T]00:00(?::00(?:\.0+)?)?)?")
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2})(?:\.(\d{1,6}))?)?")


def _mode_for(text: str) -> DecimalMode:
    comma, dot = text.rfind(","), text.rfind(".")
    if comma >= 0 and dot >= 0:
        return "comma" if comma > dot else "point"
    if comma >= 0:
        return "point" if text.count(",") > 1 else "comma"
    if dot >= 0:
        return "comma" if text.count(".") > 1 else "point"
    return "point"


def parse_decimal(value: object, decimal: DecimalMode = "auto") -> Decimal:
    """A number cell as an exact :class:`~decimal.Decimal`."""
    if value.__class__ is str:
        return _decimal_text(value, decimal)
    if isinstance(value, bool):
        raise InvalidValue(f"{value!r} is not a number")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidValue(f"{value!r} is not a number")
        return Decimal(repr(value))  # the shortest repr: 0.1, not 0.1000000000000000055...
    if isinstance(value, Decimal):
        return value
    if isinstance(value, str):
        return _decimal_text(value, decimal)
    raise InvalidValue(f"{value!r} is not a number")


def _decimal_text(value: str, decimal: DecimalMode) -> Decimal:
    if (plain := _PLAIN.fullmatch(value)) and (
        decimal == "auto" or plain[1] in (None, _SEP[decimal])
    ):
        return Decimal(value.replace(",", "."))  # "1234", "-12,5", "0.25": the common case
    if decimal != "point" and _GROUPED.fullmatch(value):  # "1.234,56": the Brazilian way
        return Decimal(value.replace(".", "").replace(",", "."))
    text = value.translate(_NUMBER_NOISE)
    sign = ""
    if text and text[0] in "+-":
        sign, text = text[0], text[1:]
    if text.startswith("R$"):
        text = text[2:]
        if text and text[0] in "+-" and not sign:
            sign, text = text[0], text[1:]
    mode = _mode_for(text) if decimal == "auto" else decimal
    if mode == "comma":
        if not _COMMA_DECIMAL.fullmatch(text):
            raise InvalidValue(f"{value!r} is not a number")
        text = text.replace(".", "").replace(",", ".")
    else:
        if not _POINT_DECIMAL.fullmatch(text):
            raise InvalidValue(f"{value!r} is not a number")
        text = text.replace(",", "")
    try:
        return Decimal(sign + text)
    except InvalidOperation:  # pragma: no cover - the patterns above admit only numbers
        raise InvalidValue(f"{value!r} is not a number") from None


def parse_integer(value: object, decimal: DecimalMode = "auto") -> int:
    """A whole number (``1.234`` is refused in auto mode: a decimal, not 1234)."""
    if value.__class__ is str and value.isascii() and value.isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    number = parse_decimal(value, decimal)
    if number != number.to_integral_value():
        raise InvalidValue(f"{value!r} is not a whole number")
    return int(number)


def parse_bool(value: object) -> bool:
    """``true/false``, ``sim/não``, ``s/n``, ``1/0``, ``yes/no`` (any case)."""
    if value.__class__ is str:
        word = value.strip().casefold()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().casefold()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise InvalidValue(f"{value!r} is not a yes/no value (sim/não, true/false, 1/0)")


def _make_date(year: int, month: int, day: int, original: object) -> date:
    try:
        return date(year, month, day)
    except ValueError:
        raise InvalidValue(f"{original!r} is not a valid date (day/month/year)") from None


def _split_date(text: str, original: object) -> tuple[date, str]:
    """The date at the start of `text` and what follows it."""
    if m := _YEAR_FIRST.match(text):
        day = _make_date(int(m[1]), int(m[3]), int(m[4]), original)
        return day, text[m.end() :]
    if m := _DAY_FIRST.match(text):
        if len(m[4]) != 4:
            raise InvalidValue(f"{original!r}: write the year with four digits")
        day = _make_date(int(m[4]), int(m[3]), int(m[1]), original)
        return day, text[m.end() :]
    raise InvalidValue(f"{original!r} is not a date (dd/mm/yyyy or yyyy-mm-dd)")


def parse_date(value: object) -> date:
    """``31/12/2024``, ``31-12-2024``, ``31.12.2024``, ``2024-12-31``; a date
    cell; a date-and-time cell only at midnight (otherwise a time would be lost)."""
    if value.__class__ is str:
        return _date_text(value)
    if isinstance(value, datetime):
        if value.time() != time(0):
            raise InvalidValue(f"{value.isoformat(' ')} has a time of day; the column is a date")
        return value.date()
    if isinstance(value, date):
        return value
    if not isinstance(value, str):
        raise InvalidValue(f"{value!r} is not a date")
    return _date_text(value)


def _date_text(value: str) -> date:
    text = value.strip()
    if len(text) == 10:
        # The two everyday shapes without a regular expression: this runs for
        # every date cell of every row.
        try:
            if text[2] == "/" == text[5] and text.isascii():
                return date(int(text[6:]), int(text[3:5]), int(text[:2]))
            if text[4] == "-" == text[7]:
                return date.fromisoformat(text)
        except ValueError:
            pass  # fall through for the precise reason
    day, rest = _split_date(text, value)
    if not _MIDNIGHT.fullmatch(rest):
        raise InvalidValue(f"{value!r} has a time of day; the column is a date")
    return day


def _clock(text: str, original: object) -> time:
    m = _CLOCK.fullmatch(text)
    if not m:
        raise InvalidValue(f"{original!r} is not a time (hh:mm or hh:mm:ss)")
    try:
        return time(int(m[1]), int(m[2]), int(m[3] or 0), int((m[4] or "0").ljust(6, "0")))
    except ValueError:
        raise InvalidValue(f"{original!r} is not a valid time") from None


def parse_datetime(value: object) -> datetime:
    """ISO 8601 (with an offset if any), ``dd/mm/yyyy hh:mm[:ss]``, or a date
    alone (midnight)."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day)
    if not isinstance(value, str):
        raise InvalidValue(f"{value!r} is not a date and time")
    text = value.strip()
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        pass
    day, rest = _split_date(text, value)
    rest = rest.strip().removeprefix("T")
    clock = _clock(rest, value) if rest else time(0)
    return datetime.combine(day, clock)


def parse_time(value: object) -> time:
    """``hh:mm`` or ``hh:mm:ss``; a time cell."""
    if isinstance(value, datetime):
        return value.time()
    if isinstance(value, time):
        return value
    if not isinstance(value, str):
        raise InvalidValue(f"{value!r} is not a time")
    return _clock(value.strip(), value)


def to_text(value: object) -> str:
    """Any cell as text, the way a person reads it in the sheet: a whole number
    cell without ``.0``, a date cell as ISO."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, datetime):
        return value.date().isoformat() if value.time() == time(0) else value.isoformat(" ")
    if isinstance(value, date | time):
        return value.isoformat()
    return str(value)
