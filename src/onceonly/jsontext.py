"""JSON on the hot paths.

The kept headers are encoded once per stored event; orjson does it about
twenty times faster than the standard library here (0.6 us against 13 us for
a Stripe delivery's headers). Bodies are parsed by orjson too (1.7 us against
8.1 us for the 479-byte Stripe event of benchmarks/receive.py), but only
where it reads what ``json.loads`` would: see :func:`loads`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson

__all__ = ["dumps", "dumps_text", "loads"]

# Every digit as "0": a run of 19 of them is a number orjson may not read
# exactly (it reads an integer outside 64 bits as a float; 19 digits with a
# minus sign are already past the signed range).
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 19


def loads(body: bytes) -> Any:
    """``json.loads(body)``: the same value, or the same error.

    orjson reads it where that is sure to give the same value: no run of 19
    digits or more anywhere in the body (a numeric event id must not change
    on its way in; a long run inside a string only costs the slower parser).
    Whatever orjson refuses goes to ``json.loads``, which decides: it also
    reads what orjson does not (``NaN``, a byte-order mark, UTF-16, a lone
    surrogate escape), and its errors are the ones callers have always seen.
    """
    # find(), not "in": bytes.__contains__ first tries its argument as an
    # int and builds a TypeError to find out it is not one.
    if body.translate(_DIGITS_AS_ZERO).find(_LONG_NUMBER) < 0:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return json.loads(body)


def dumps_text(value: Mapping[str, str]) -> str:
    """A mapping of text to text as compact JSON text (headers to store).

    Non-ASCII characters are written as themselves, not ``\\u`` escapes: both
    read back the same with any JSON parser."""
    return orjson.dumps(value).decode()


def dumps(value: Any) -> str:
    """``json.dumps(value)``, in the compact form, as fast as orjson writes it.

    What orjson refuses (a lone surrogate in a string, an integer past 64
    bits) goes to ``json.dumps``, so such a value is written as before and
    whatever reads it decides, as it did."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value)
