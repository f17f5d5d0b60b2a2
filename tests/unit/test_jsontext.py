"""The headers' JSON reads back as the standard library would have written it."""

from __future__ import annotations

import json

import orjson

from onceonly import jsontext


def test_headers_read_back_the_same() -> None:
    headers = {"stripe-signature": "t=1,v1=ab", "user-agent": "caf\xe9 \u00ff"}
    assert json.loads(jsontext.dumps_text(headers)) == headers


def test_why_bodies_are_not_parsed_with_orjson() -> None:
    # A numeric id past 64 bits: json.loads keeps it exact, orjson does not.
    raw = b'{"id": 123456789012345678901234567890}'
    assert json.loads(raw)["id"] == 123456789012345678901234567890
    assert orjson.loads(raw)["id"] != 123456789012345678901234567890
