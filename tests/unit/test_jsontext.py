"""The headers' JSON reads back as the standard library would have written it."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceonly import jsontext


def test_headers_read_back_the_same() -> None:
    headers = {"stripe-signature": "t=1,v1=ab", "user-agent": "caf\xe9 \u00ff"}
    assert json.loads(jsontext.dumps_text(headers)) == headers


def test_why_a_long_number_goes_to_json_loads() -> None:
    # A numeric id past 64 bits: json.loads keeps it exact, orjson does not.
    raw = b'{"id": 123456789012345678901234567890}'
    assert orjson.loads(raw)["id"] != 123456789012345678901234567890
    assert jsontext.loads(raw)["id"] == 123456789012345678901234567890


@pytest.mark.parametrize(
    "raw",
    [
        b'{"id": 18446744073709551616}',  # 2**64: orjson's float
        b'{"id": -9223372036854775809}',  # one past the signed range, 19 digits
        b'{"id": 9999999999999999999}',
        b'{"data": {"id": 123456789012345678901234567890}}',
        b'{"id": "1234567890123456789012"}',  # in a string: slower, same value
        b'{"id": 1, "id": 2}',  # the last one counts in both
        b'{"a": NaN, "b": Infinity, "c": -Infinity}',
        b'{"a": 1e400}',
        b'\xef\xbb\xbf{"id": "bom"}',
        '{"id": "utf-16"}'.encode("utf-16"),
        b'{"id": "\\ud800"}',  # a lone surrogate escape
        b'{"id": "\\ud83d\\ude00"}',
        b'{"id": -0, "f": -0.0, "e": 1E2, "g": 0.1}',
        b' \t\r\n{"id": "spaced"} \n',
        b"[1, 2]",
        b'"text"',
    ],
)
def test_loads_reads_what_json_loads_reads(raw: bytes) -> None:
    expected = json.loads(raw)
    got = jsontext.loads(raw)
    assert repr(got) == repr(expected)  # repr: NaN, -0.0 and int/float told apart


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b'{"id": 1,}',
        b"{'id': 1}",
        b'{"id": "\x01"}',  # a raw control character
        b'{"id": "\xff"}',  # not UTF-8
        b'{"id": 1} x',
        b"[" * 100_000 + b"]" * 100_000,
    ],
)
def test_loads_refuses_what_json_loads_refuses(raw: bytes) -> None:
    with pytest.raises((ValueError, UnicodeDecodeError, RecursionError)) as expected:
        json.loads(raw)
    with pytest.raises(expected.type):
        jsontext.loads(raw)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda children: st.lists(children) | st.dictionaries(st.text(), children),
        max_leaves=20,
    )
)
def test_loads_agrees_with_json_loads_on_any_document(value: object) -> None:
    raw = json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    try:
        expected = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        with pytest.raises((ValueError, UnicodeDecodeError)):
            jsontext.loads(raw)
        return
    assert repr(jsontext.loads(raw)) == repr(expected)


def test_dumps_reads_back_as_the_standard_librarys_and_takes_what_orjson_refuses() -> None:
    dumps = jsontext.dumps
    rows = [("client", "key-é", 3, True, None, [["content-type", "application/json"]])]
    assert json.loads(dumps(rows)) == json.loads(json.dumps(rows))
    # orjson refuses both; the standard library writes them, as before.
    assert dumps(["\udc80"]) == json.dumps(["\udc80"])
    assert dumps([2**70]) == json.dumps([2**70])
