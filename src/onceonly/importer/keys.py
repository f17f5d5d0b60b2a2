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
_CPF_WEIGHTS_1 = tuple(range(10, 1, -1))
_CPF_WEIGHTS_2 = tuple(range(11, 1, -1))
_CNPJ_WEIGHTS_1 = (5, 4, 3, 2, 9, 8, 7, 6, 5, 4, 3, 2)
_CNPJ_WEIGHTS_2 = (6, *_CNPJ_WEIGHTS_1)
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


def _check_digit(values: list[int], weights: tuple[int, ...]) -> int:
    remainder = sum(v * w for v, w in zip(values, weights, strict=True)) % 11
    return 0 if remainder < 2 else 11 - remainder


def normalize_cpf(value: object) -> str:
    """The 11 digits of a CPF, or :class:`InvalidValue` saying why not."""
    text, numeric = _text(value)
    if not text:
        raise InvalidValue("empty CPF")
    digits = text.translate(_PUNCTUATION)
    if numeric or (digits.isdigit() and digits == text):
        digits = digits.zfill(11)
    if len(digits) != 11 or not digits.isascii() or not digits.isdigit():
        raise InvalidValue(f"invalid CPF {text!r}: a CPF has 11 digits")
    numbers = [ord(c) - 48 for c in digits]
    if digits == digits[0] * 11:
        raise InvalidValue(f"invalid CPF {text!r}: repeated digits")
    first = _check_digit(numbers[:9], _CPF_WEIGHTS_1)
    second = _check_digit([*numbers[:9], first], _CPF_WEIGHTS_2)
    if numbers[9] != first or numbers[10] != second:
        raise InvalidValue(f"invalid CPF {text!r}: check digits do not match")
    return digits


def normalize_cnpj(value: object) -> str:
    """The 14 characters of a CNPJ (digits, or alphanumeric since 2026), or
    :class:`InvalidValue` saying why not."""
    text, numeric = _text(value)
    if not text:
        raise InvalidValue("empty CNPJ")
    chars = text.translate(_PUNCTUATION).upper()
    if numeric or (chars.isdigit() and chars == text):
        chars = chars.zfill(14)
    if len(chars) != 14 or not set(chars) <= _ALNUM or not chars[12:].isdigit():
        raise InvalidValue(f"invalid CNPJ {text!r}: a CNPJ has 14 characters, the last two digits")
    if chars.isdigit() and chars == chars[0] * 14:
        raise InvalidValue(f"invalid CNPJ {text!r}: repeated digits")
    numbers = [ord(c) - 48 for c in chars]
    first = _check_digit(numbers[:12], _CNPJ_WEIGHTS_1)
    second = _check_digit([*numbers[:12], first], _CNPJ_WEIGHTS_2)
    if numbers[12] != first or numbers[13] != second:
        raise InvalidValue(f"invalid CNPJ {text!r}: check digits do not match")
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
