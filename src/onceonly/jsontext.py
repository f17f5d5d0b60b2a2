"""JSON on the hot paths.

The kept headers are encoded once per stored event; orjson does it about
twenty times faster than the standard library here (0.6 us against 13 us for
a Stripe delivery's headers). Bodies are still parsed with ``json.loads``:
orjson reads an integer past 64 bits as a float, where ``json.loads`` keeps
it exact, and a numeric event id must not change on its way in
(tests/unit/test_jsontext.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

__all__ = ["dumps_text"]


def dumps_text(value: Mapping[str, str]) -> str:
    """A mapping of text to text as compact JSON text (headers to store).

    Non-ASCII characters are written as themselves, not ``\\u`` escapes: both
    read back the same with any JSON parser."""
    return orjson.dumps(value).decode()
