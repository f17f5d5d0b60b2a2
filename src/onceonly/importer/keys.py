"""Natural keys that really are keys: CPF, CNPJ and codes.

A spreadsheet writes one customer many ways: ``123.456.789-09``,
``12345678909``, ``12345678909.0`` (a number cell), ``1234567890`` (a number
cell that lost its leading zero). Each key type turns every spelling of one
key into one value, and rejects values that cannot be a key at all, so the
unique constraint in the database sees one customer, not four.

- ``cpf``: 11 digits, check digits validated; dots, dashes, slashes and spaces
  dropped; a purely numeric value shorter than 11 digits is padded back with
  leading zeros (spreadsheets drop them), and must then still validate.
- ``cnpj``: 14 characters, check digits validated, punctuation dropped. Since
  July 2026 the Receita Federal also issues alphanumeric CNPJs (the first 12
  characters may be letters, IN RFB 2.229/2024); those keep their letters,
  upper-cased, and validate with the same modulus-11 rule (each character
  counts as its ASCII code minus 48, which is the classic rule for digits).
- ``code``: any external code, Unicode-normalised (NFC), trimmed and
  case-folded, so ``" ABC-01"`` and ``"abc-01"`` are one key.
- ``raw``: the value exactly as read (the column's type still applies).

CPFs made of one repeated digit (``111.111.111-11``) pass the modulus check
but are not issued; they are rejected like any invalid CPF.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from enum import StrEnum

from .errors import InvalidValue

__all__ = [
    "KeyType",
    "normalize_cnpj",
    "normalize_code",
    "normalize_cpf",
    "normalize_key",
]

# Separators people and exports put inside CPF/CNPJ numbers.
_PUNCTUATION = str.maketrans("", "", ".-/ \t\u00a0\u2010\u2011\u2012\u2013")
_ALNUM = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ")


class KeyType(StrEnum):
    """How a key column's values are normalised and validated."""

    CPF = "cpf"
    CNPJ = "cnpj"
    CODE = "code"
    RAW = "raw"


def _text(value: object) -> tuple[str, bool]:
    """The value as text, and whether it came from a number cell (whose
    leading zeros a spreadsheet has already thrown away)."""
    if isinstance(value, bool):
        raise InvalidValue(f"{value!r} is not a document number")
    if isinstance(value, int):
        return str(value), True
    if isinstance(value, float):
        if not value.is_integer():
            raise InvalidValue(f"{value!r} is not a document number")
        return str(int(value)), True
    if not isinstance(value, str):
        raise InvalidValue(f"{value!r} is not a document number")
    return value.strip(), False


def _check_digit(weighted_sum: int) -> int:
    remainder = weighted_sum % 11
    return 0 if remainder < 2 else 11 - remainder


def _document(value: object, size: int, label: str) -> tuple[str, str]:
    """The value without punctuation, upper-cased, padded when it came from a
    number; and the text as given, for messages."""
    if value.__class__ is str:
        text = value.strip()
        numeric = False
    else:
        text, numeric = _text(value)
    if not text:
        raise InvalidValue(f"empty {label}")
    chars = text.translate(_PUNCTUATION)
    if len(chars) < size and (numeric or chars == text) and chars.isdigit():
        chars = chars.zfill(size)
    return chars.upper(), text


# The check digits are modulus-11 sums written out: this runs once per row of
# files with millions of rows. Characters count as their ASCII code minus 48
# (digits 0-9, and letters from 17 in alphanumeric CNPJs), so each sum is the
# weighted sum of the codes less 48 times the sum of the weights.


def normalize_cpf(value: object) -> str:
    """The 11 digits of a CPF, or :class:`InvalidValue` saying why not."""
    digits = ""
    if value.__class__ is str:  # the usual spellings, without translate()'s cost
        text = value.strip()
        digits = text.replace(".", "").replace("-", "")
    if len(digits) != 11 or not digits.isascii() or not digits.isdigit():
        digits, text = _document(value, 11, "CPF")
    if len(digits) != 11 or not digits.isascii() or not digits.isdigit():
        raise InvalidValue(f"invalid CPF {text!r}: a CPF has 11 digits")
    d = digits.encode("ascii")
    first = _check_digit(
        d[0] * 10 + d[1] * 9 + d[2] * 8 + d[3] * 7 + d[4] * 6
        + d[5] * 5 + d[6] * 4 + d[7] * 3 + d[8] * 2 - 48 * 54
    )  # fmt: skip
    second = _check_digit(
        d[0] * 11 + d[1] * 10 + d[2] * 9 + d[3] * 8 + d[4] * 7
        + d[5] * 6 + d[6] * 5 + d[7] * 4 + d[8] * 3 - 48 * 63 + first * 2
    )  # fmt: skip
    if d[9] - 48 != first or d[10] - 48 != second:
        raise InvalidValue(f"invalid CPF {text!r}: check digits do not match")
    if digits.count(digits[0]) == 11:
        raise InvalidValue(f"invalid CPF {text!r}: repeated digits")
    return digits


def normalize_cnpj(value: object) -> str:
    """The 14 characters of a CNPJ (digits, or alphanumeric since 2026), or
    :class:`InvalidValue` saying why not."""
    chars, text = _document(value, 14, "CNPJ")
    if len(chars) != 14 or not set(chars) <= _ALNUM or not chars[12:].isdigit():
        raise InvalidValue(f"invalid CNPJ {text!r}: a CNPJ has 14 characters, the last two digits")
    c = chars.encode("ascii")
    first = _check_digit(
        c[0] * 5 + c[1] * 4 + c[2] * 3 + c[3] * 2 + c[4] * 9 + c[5] * 8
        + c[6] * 7 + c[7] * 6 + c[8] * 5 + c[9] * 4 + c[10] * 3 + c[11] * 2 - 48 * 58
    )  # fmt: skip
    second = _check_digit(
        c[0] * 6 + c[1] * 5 + c[2] * 4 + c[3] * 3 + c[4] * 2 + c[5] * 9 + c[6] * 8
        + c[7] * 7 + c[8] * 6 + c[9] * 5 + c[10] * 4 + c[11] * 3 - 48 * 62 + first * 2
    )  # fmt: skip
    if c[12] - 48 != first or c[13] - 48 != second:
        raise InvalidValue(f"invalid CNPJ {text!r}: check digits do not match")
    if chars.count(chars[0]) == 14:
        raise InvalidValue(f"invalid CNPJ {text!r}: repeated digits")
    return chars


def normalize_code(value: object) -> str:
    """A code trimmed and case-folded; empty is :class:`InvalidValue`."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # a number cell: "123", not "123.0"
    text = unicodedata.normalize("NFC", str(value)).strip().casefold()
    if not text:
        raise InvalidValue("empty code")
    return text


def _raw(value: object) -> object:
    return value


_NORMALIZERS: dict[KeyType, Callable[[object], object]] = {
    KeyType.CPF: normalize_cpf,
    KeyType.CNPJ: normalize_cnpj,
    KeyType.CODE: normalize_code,
    KeyType.RAW: _raw,
}


def normalize_key(key_type: KeyType | str, value: object) -> object:
    """`value` normalised as `key_type` (``cpf``, ``cnpj``, ``code`` or ``raw``)."""
    return _NORMALIZERS[KeyType(key_type)](value)


def normalizer(key_type: KeyType | str) -> Callable[[object], object]:
    """The normalising function for `key_type`, for calling once per row."""
    return _NORMALIZERS[KeyType(key_type)]
